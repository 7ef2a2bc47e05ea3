"""Where a benchmark result came from, recorded by the code that measured it:
the checkout's commit and whether its tree was clean, the installed jax_tma
(and whether its Python sources are the tree's), jax and jaxlib, the devices
with driver and clocks (nvidia-smi), the date and the command line.

A checkout copied to a machine without its .git (the GPU machine) carries
benchmarks/tree_stamp.json instead (git-ignored: bring it along), written by
`python benchmarks/run.py stamp` where git is: the commit, the dirty files
then, and the SHA-256 of every tracked file, checked again where the
benchmarks run.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAMP = os.path.join(ROOT, "benchmarks", "tree_stamp.json")
# The benchmarks' outputs (and the stamp) do not make the tree dirty.
_OUTPUTS = ("benchmarks/results/", "benchmarks/tree_stamp.json")
_SMI_FIELDS = ("index", "name", "driver_version", "pci.bus_id", "memory.total", "clocks.sm",
               "clocks.mem", "clocks.max.sm", "clocks.max.mem", "power.limit",
               "temperature.gpu")


class DirtyTree(RuntimeError):
    """The results would not be those of the commit they name."""


def command_output(*cmd: str) -> str | None:
    """stdout of `cmd`, or None where it is missing or fails."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _sha256(path: str) -> str:
    try:
        with open(os.path.join(ROOT, path), "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return "missing"


def _git_state() -> tuple[str, list[str]] | None:
    """(commit, dirty paths) of the checkout, or None without git."""
    commit = command_output("git", "rev-parse", "HEAD")
    status = command_output("git", "status", "--porcelain", "--untracked-files=normal")
    if commit is None or status is None:
        return None
    dirty = [line[3:] for line in status.splitlines() if not line[3:].startswith(_OUTPUTS)]
    return commit.strip(), dirty


def make_stamp() -> str:
    """Writes benchmarks/tree_stamp.json for a copy of this tree without .git;
    returns its path."""
    state = _git_state()
    if state is None:
        raise RuntimeError("benchmarks/run.py stamp: needs a git checkout")
    files = [p for p in (command_output("git", "ls-files", "-z") or "").split("\0")
             if p and not p.startswith(_OUTPUTS)]
    with open(STAMP, "w") as f:
        json.dump({"commit": state[0], "dirty_files": state[1],
                   "files": {p: _sha256(p) for p in files}}, f, indent=0)
    return STAMP


def tree_state() -> dict[str, Any]:
    """The commit this tree is, the files that make it differ from that
    commit, and how that was found out."""
    # The stamp first: a copy of the tree may sit in a git repository of its
    # own (the GPU machine's does), whose state says nothing about ours. Every
    # file is hashed, so a stale stamp shows as changed files.
    if os.path.exists(STAMP):
        with open(STAMP) as f:
            stamp = json.load(f)
        changed = [p for p, h in stamp["files"].items() if _sha256(p) != h]
        return {"commit": stamp["commit"], "dirty_files": stamp["dirty_files"] + changed,
                "from": "benchmarks/tree_stamp.json, every tracked file's SHA-256 checked"}
    state = _git_state()
    if state is not None:
        return {"commit": state[0], "dirty_files": state[1], "from": "git"}
    return {"commit": None, "from": None,
            "dirty_files": ["(no git checkout here and no benchmarks/tree_stamp.json: run "
                            "`python benchmarks/run.py stamp` in the checkout and bring the "
                            "file along; git ignores it)"]}


def _installed_jax_tma() -> dict[str, Any]:
    """Where jax_tma is imported from, and whether its Python sources are
    this tree's (the compiled module is the build's: gpu_check.sh builds it
    from the same tree)."""
    import jax_tma

    installed = os.path.dirname(os.path.abspath(jax_tma.__file__))
    tree = os.path.join(ROOT, "jax_tma")
    names = sorted(n for n in os.listdir(tree) if n.endswith(".py"))
    # os.path.join(ROOT, p) is p itself for an absolute p.
    same = all(_sha256(os.path.join("jax_tma", n)) == _sha256(os.path.join(installed, n))
               for n in names)
    return {"file": jax_tma.__file__, "python_matches_tree": same,
            "build_info": jax_tma.build_info()}


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "jax": jax.__version__}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name == "jaxlib" or name.startswith("jax-cuda"):
            out[name] = dist.version
    return out


def nvidia_smi() -> list[dict[str, str]] | None:
    """One dict per GPU from nvidia-smi (names as its --query-gpu fields),
    or None without nvidia-smi."""
    text = command_output("nvidia-smi", f"--query-gpu={','.join(_SMI_FIELDS)}",
                "--format=csv,noheader")
    if text is None:
        return None
    return [dict(zip(_SMI_FIELDS, (v.strip() for v in line.split(",")), strict=True))
            for line in text.strip().splitlines()]


def device_tag(devices: Sequence[jax.Device]) -> str:
    """A file-name tag of the devices: 'h100-80gb-hbm3', '2x-h200', 'cpu'."""
    kind = devices[0].device_kind.lower().replace("nvidia", "")
    slug = "-".join("".join(c if c.isalnum() else " " for c in kind).split())
    return (f"{len(devices)}x-" if len(devices) > 1 else "") + (slug or "unknown")


def collect(devices: Sequence[jax.Device], allow_dirty: bool) -> dict[str, Any]:
    """The provenance of a result measured on `devices`, now. Raises
    DirtyTree where the tree differs from its commit (or the installed
    jax_tma from the tree), unless `allow_dirty`, which records it."""
    tree = tree_state()
    installed = _installed_jax_tma()
    reasons = list(tree["dirty_files"])
    if not installed["python_matches_tree"]:
        reasons.append(f"the installed jax_tma ({installed['file']}) has other Python sources "
                       f"than this tree's jax_tma/")
    if reasons and not allow_dirty:
        raise DirtyTree("results must come from a committed tree (or pass --allow-dirty, which "
                        "marks them dirty): " + "; ".join(reasons[:10]))
    return {
        "commit": tree["commit"],
        "dirty": bool(reasons),
        "dirty_reasons": reasons[:50],
        "tree_from": tree["from"],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "devices": [d.device_kind for d in devices],
        "device_tag": device_tag(devices),
        "nvidia_smi": nvidia_smi(),
        "versions": _versions(),
        "jax_tma": installed,
        # Which install of jax_tma ran, as the caller names it (gpu_check.sh:
        # "source build ..." or "wheel ..."); None where not named.
        "install": os.environ.get("JAX_TMA_INSTALL"),
        "command": [os.path.basename(sys.executable)] + sys.argv,
    }
