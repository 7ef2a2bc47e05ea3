"""Renders the benchmark tables of the README and the documentation site from
the result JSON files, so that every published number comes from a file that
benchmarks/run.py wrote.

    python benchmarks/report.py            # rewrite the bench sections of README.md and docs/
    python benchmarks/report.py --check    # exit 1 if a page differs from the results,
                                           # or the code changed after the results' commit
    python benchmarks/report.py --plots benchmarks/plots   # also plots (needs matplotlib)
    python benchmarks/report.py --merge A.json B.json      # one result of two calls' sizes

The pages (README.md and every docs/ page that has one) hold sections
between `<!-- bench:OP -->` and `<!-- /bench:OP -->`: one op's tables (the
op pages of docs/ops/), or a section drawn from several results (DERIVED:
the README's headline table, docs/benchmarks.md's build);
everything between them is this script's output. The results must be one
file per op, clean and not smoke runs, and the code that
a result measures (comments and docstrings aside) must be, at the result's
own commit, the checkout's,
its working tree's (an uncommitted change counts, so does a new source file
git does not track yet, and a copy whose git HEAD
lags its files is judged by its files): its op family's (runs_through), the
shared core's (the build's settings too), and its benchmark module's (the
kernels' self-tests: the sanitizer's); a
file written before results recorded their provenance is rendered as such.

What an op's section, headline row and plot say comes from the
render_<name>.py module of the bench_<name>.py that writes the op's result
(_render_modules). This script renders what is no op family's: the build
measured (with the one case timed on the wheel beside the same case of the
source build), the wheel's case and the compute-sanitizer runs.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import functools
import glob
import importlib
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from tables import Headline, Plot, build_cells, mark

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
README = os.path.join(ROOT, "README.md")
# Code changes after the results' commit that leave every measured program as
# it was, each with why (see check_fresh), relative to the checkout's root.
UNMEASURED = "benchmarks/unmeasured_changes.json"
# The code the results measure: a change to its code (comments, docstrings
# and layout aside) after the results' commit makes stale the results that
# run through it (changed_since), (git pathspecs, from the checkout's root).
# The build's settings are code too: CMakeLists.txt, and pyproject.toml's
# build tables (code_of). The kernels' self-tests (SELFTESTS) are the
# sanitizer result's code alone.
# This script and the modules it renders with (tables.py, render_*.py) only
# render results, and --check compares their rendering with the committed
# README, so they are not watched.
SELFTESTS = "tests/cuda"
WATCHED = ("ffi", "jax_tma", "benchmarks/*.py", "benchmarks/ffi", "CMakeLists.txt",
           "pyproject.toml", SELFTESTS,
           ":(exclude)benchmarks/report.py", ":(exclude)benchmarks/tables.py",
           ":(exclude)benchmarks/render_*.py")
# The result whose code SELFTESTS is (no family's: _owners).
SANITIZER = "sanitizer"
# pyproject.toml's tables that set how the extension is compiled (the build
# requirements: jaxlib's FFI headers, nanobind; scikit-build's CMake
# defines, ABI and build options); its dependencies and test settings are no
# code of a result.
PYPROJECT_BUILD = ("build-system", "tool.scikit-build")
# The untracked files that are sources (a new file not yet added to git is
# code of the checkout); others (a build's module, an editor's file) are not.
_SOURCE_FILE = re.compile(r"\.(py|c|cc|cpp|cu|cuh|h|hpp|inc|map|cmake|toml)$|(^|/)CMakeLists\.txt$")
_SECTION = re.compile(r"(<!-- bench:(?P<op>[\w@.-]+) -->\n)(?P<body>.*?)(<!-- /bench:(?P=op) -->)",
                      re.S)


def load_results(results_dir: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """op -> (path relative to the checkout, result) of every JSON file in
    `results_dir`: one result per op and GPU kind. The first file of an op
    (by name) is the op's, rendered by its `bench:<op>` sections; another
    GPU's is `<op>@<its GPUs>` (the middle of the file's name:
    copy_h200_2026-11-28.json is copy@h200), rendered by `bench:<op>@<GPUs>`
    sections. Two files of one op and GPU kind are an error."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for path in sorted(glob.glob(os.path.join(results_dir, "*.json"))):
        with open(path) as f:
            result = json.load(f)
        rel = os.path.relpath(path, ROOT)
        op = result["op"]
        key = op if op not in out else f"{op}@{_gpus_of(rel, op)}"
        if key in out or (key != op and _gpus_of(out[op][0], op) == _gpus_of(rel, op)):
            raise ValueError(f"two results for {key}: {out.get(key, out[op])[0]} and {rel} "
                             f"(keep one)")
        out[key] = (rel, result)
    return out


def write_result(result: dict[str, Any], out_dir: str) -> str:
    """Writes `result` as <op>_<devices>_<date>.json under `out_dir`,
    replacing the op's earlier result files of the same devices there (those
    of other GPUs stay: benchmarks/report.py renders each); returns the path."""
    os.makedirs(out_dir, exist_ok=True)
    prov = result["provenance"]
    name = f"{result['op']}_{prov['device_tag']}_{prov['date'][:10]}.json"
    # The op's own files, by the op they record: a name's prefix would also
    # take those of an op that extends it (ppermute_processes for ppermute).
    for old in glob.glob(os.path.join(out_dir, f"{result['op']}_{prov['device_tag']}_*.json")):
        with open(old) as f:
            recorded = json.load(f).get("op")
        if recorded == result["op"] and os.path.basename(old) != name:
            os.remove(old)
            print(f"removed the earlier result {old}", file=sys.stderr)
    path = os.path.join(out_dir, name)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    return path


def merge_results(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One result of the rows of `parts`: results of one op, commit and GPUs,
    each of other sizes, measured in several calls (a device call has a time
    limit; the largest sizes take one of their own). Every other field must
    agree but the lists and tables of what was checked, failed or left out,
    which are joined, and the seconds, which add up; the provenance is the
    first part's, with each part's date, command, install and seconds under
    `calls`.
    Raises ValueError on anything else that differs, on a size measured
    twice, and on a smoke run's or a dirty tree's result."""
    if len(parts) < 2:
        raise ValueError("merge: give two results or more")
    first = parts[0]
    joined = {"rows", "checked_bit_exact", "not_run", "comparator_differs", "sizes_left_out",
              "untraced", "elapsed_s", "provenance"}
    for part in parts:
        prov = part.get("provenance")
        if prov is None or "rows" not in part:
            raise ValueError(f"merge: the {part.get('op')} result has no provenance or no rows")
        if prov["dirty"] or part.get("smoke"):
            raise ValueError(f"merge: the {part['op']} result of {prov['date']} is a "
                             f"{'smoke run' if part.get('smoke') else 'dirty tree'}'s")
        for key in ("commit", "device_tag", "versions"):
            if prov.get(key) != first["provenance"].get(key):
                raise ValueError(f"merge: provenance.{key} differs: {prov.get(key)!r} vs "
                                 f"{first['provenance'].get(key)!r}")
        for key in sorted((set(part) | set(first)) - joined):
            if part.get(key) != first.get(key):
                raise ValueError(f"merge: the results' {key!r} differ")
    rows: dict[Any, dict[str, Any]] = {}
    for part in parts:
        for row in part["rows"]:
            if row["buffer_bytes"] in rows:
                raise ValueError(f"merge: {row['buffer_bytes']} bytes are measured twice")
            rows[row["buffer_bytes"]] = row
    merged = dict(first, rows=[rows[size] for size in sorted(rows)])
    merged["checked_bit_exact"] = [x for p in parts for x in p.get("checked_bit_exact", [])]
    for key in ("not_run", "comparator_differs", "sizes_left_out", "untraced"):
        if any(key in p for p in parts):
            merged[key] = {k: v for p in parts for k, v in (p.get(key) or {}).items()}
    merged["elapsed_s"] = round(sum(p["elapsed_s"] for p in parts), 1)
    merged["provenance"] = dict(first["provenance"], calls=[
        {"date": p["provenance"]["date"], "command": p["provenance"]["command"],
         "install": p["provenance"].get("install"), "elapsed_s": p["elapsed_s"]}
        for p in parts])
    return merged


def _gpus_of(path: str, op: str) -> str:
    """The GPUs part of a result file's name (<op>_<GPUs>_<date>.json)."""
    name = os.path.basename(path)[:-len(".json")]
    return name[len(op) + 1:].rpartition("_")[0]


def base_op(key: str) -> str:
    """The op of a results key (`copy@h200` -> `copy`)."""
    return key.partition("@")[0]


def check_results(results: dict[str, tuple[str, dict[str, Any]]],
                  allow_dirty: bool = False) -> None:
    """Raises ValueError unless the results are publishable: clean and not
    smoke runs. They may be of several commits, each judged against its own
    (check_fresh)."""
    for path, r in results.values():
        prov = r.get("provenance")
        if prov is None:
            continue
        if (prov["dirty"] or r.get("smoke")) and not allow_dirty:
            raise ValueError(f"{path}: a {'smoke run' if r.get('smoke') else 'dirty tree'}'s "
                             f"result cannot be published")


class StaleResults(ValueError):
    """The results are not those of the checkout's code (or that cannot be told)."""


def _git_out(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


_C_COMMENT = re.compile(r'//[^\n]*|/\*.*?\*/|("(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\')',
                        re.S)
_CMAKE_COMMENT = re.compile(r'#\[(=*)\[.*?\]\1\]|#[^\n]*|("(?:\\.|[^"\\])*")', re.S)


def code_of(path: str, text: str) -> str:
    """`text` of the file at `path` as far as it runs: Python as its syntax
    tree without docstrings, C/C++/CUDA and CMake without comments, all with
    runs of white space as one space; pyproject.toml as its build tables
    (PYPROJECT_BUILD); other files as they are."""
    if path.endswith("pyproject.toml"):
        try:
            toml = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            return text
        build = {}
        for name in PYPROJECT_BUILD:
            table = toml
            for key in name.split("."):
                table = table.get(key, {}) if isinstance(table, dict) else {}
            build[name] = table
        return json.dumps(build, sort_keys=True)
    if path.endswith(".py"):
        try:
            tree = ast.parse(text)
        except SyntaxError:
            return text
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                  ast.AsyncFunctionDef)) and body
                    and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                node.body = body[1:] or [ast.Pass()]
        return ast.dump(tree)
    if path.endswith((".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp")):
        text = _C_COMMENT.sub(lambda m: m.group(1) or " ", text)
    elif path.endswith(("CMakeLists.txt", ".cmake")):
        text = _CMAKE_COMMENT.sub(lambda m: m.group(2) or " ", text)
    else:
        return text
    return " ".join(text.split())


# ---- whose code a result measures: its family's and the shared core's ---------

# The family list, each family's manifest line, and where sources include
# the header of a family or of a layer (a folder of ffi/ that is no family:
# cuda/, peer/).
_FAMILY_LINE = re.compile(r'^#include "([a-z0-9_]+)/manifest\.inc"\n', re.M)
_FAMILY_INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z0-9_]+)/', re.M)
FAMILY_LIST = "ffi/families.inc"
PACKAGE_INIT = "jax_tma/__init__.py"
# The shared core's own sources, whose includes make a layer shared core too
# (module.cc includes cuda/handlers.h).
CORE_SOURCES = ("ffi", "benchmarks/ffi")


def _read(path: str) -> str | None:
    full = os.path.join(ROOT, path)
    if not os.path.exists(full):
        return None
    with open(full, encoding="utf-8", errors="replace") as f:
        return f.read()


# What a run of this script reads of the checkout (the families, their
# modules, the folders' includes), read once per public call: changed_since
# asks for each changed path's owners, which walk every family's sources.
# The tests edit their checkouts between calls, so nothing is kept past one.
_memo: dict | None = None


def _memoized(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        if _memo is None:
            return fn(*args)
        key = (fn.__name__, ROOT, args)
        if key not in _memo:
            _memo[key] = fn(*args)
        return _memo[key]
    return wrapper


def _reads_once(fn):
    """`fn` with what it reads of the checkout read once (_memoized)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        global _memo
        if _memo is not None:
            return fn(*args, **kwargs)
        _memo = {}
        try:
            return fn(*args, **kwargs)
        finally:
            _memo = None
    return wrapper


@_memoized
def families() -> list[str]:
    """The op families of the checkout's ffi/families.inc (none without it)."""
    return _FAMILY_LINE.findall(_read(FAMILY_LIST) or "")


@_memoized
def family_modules(family: str) -> tuple[str, ...]:
    """The files of the jax_tma modules that the family's test descriptor
    (tests/families/<family>.py) names in MODULES, read from its text (this
    script runs without jax)."""
    text = _read(f"tests/families/{family}.py")
    for node in ast.parse(text or "").body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "MODULES"
                                                for t in node.targets):
            return tuple(m.replace(".", "/") + ".py" for m in ast.literal_eval(node.value))
    return ()


def family_of(op: str) -> str | None:
    """The family whose code an op's result measures: the FAMILY of the
    render module that renders it, else the module's name (render_<family>);
    None for every family's: the sections this script renders (the
    sanitizer's: every family's kernels) and a render module's FAMILY None
    (host-cost: every family's handlers)."""
    for module in _MODULES:
        if op in module.RENDERERS:
            return getattr(module, "FAMILY", module.__name__.removeprefix("render_"))
    return None


@_memoized
def _imported_modules(path: str) -> set[str]:
    """The files of the jax_tma modules that the module at `path` imports."""
    out = set()
    for node in ast.walk(ast.parse(_read(path) or "")):
        if isinstance(node, ast.ImportFrom) and node.module == "jax_tma":
            out |= {f"jax_tma/{a.name}.py" for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jax_tma."):
            out.add(node.module.replace(".", "/") + ".py")
    return out


@_memoized
def layers() -> set[str]:
    """The layers of shared sources: the folders of the checkout's ffi/
    that are no family (cuda/, peer/)."""
    ffi = os.path.join(ROOT, "ffi")
    known = families()
    return {d for d in (os.listdir(ffi) if os.path.isdir(ffi) else ())
            if os.path.isdir(os.path.join(ffi, d)) and d not in known}


@_memoized
def _included(folder: str, walk: bool = True) -> set[str]:
    """The folders of ffi/ whose headers the sources of `folder` (from the
    checkout's root; walk False: its own files, not its subfolders')
    include, by the first part of the quoted path ("peer/peer_link.h")."""
    out: set[str] = set()
    for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
        for name in files:
            with open(os.path.join(dirpath, name), encoding="utf-8", errors="replace") as src:
                out |= set(_FAMILY_INCLUDE.findall(src.read()))
        if not walk:
            break
    return out


@_memoized
def _reach(family: str) -> tuple[set[str], set[str]]:
    """The families and the layers that `family` runs through (runs_through)."""
    known, shared = families(), layers()
    owner = {m: f for f in known for m in family_modules(f)}
    out, through, todo = set(), set(), [family]
    while todo:
        f = todo.pop()
        if f in out or f in through:
            continue
        (out if f in known else through).add(f)
        todo += [g for g in _included(f"ffi/{f}") if g in known or g in shared]
        todo += [owner[m] for mine in family_modules(f) for m in _imported_modules(mine)
                 if m in owner]
    return out, through


def runs_through(family: str) -> set[str]:
    """The family and those it runs through, transitively: the families
    whose headers its sources include (ppermute's copies are copy's
    kernels), directly or through a layer's (ffi/peer/'s kernels run copy's
    pipeline), and those whose modules its modules import (copy's tiled
    method is window's primitive)."""
    return _reach(family)[0]


@_memoized
def _owners(path: str) -> set[str]:
    """The families whose code `path` is (none: the shared core; SANITIZER:
    the kernels' self-tests, the sanitizer result's alone): ffi/<family>/,
    a layer's ffi/<layer>/ that the shared core's own sources do not include
    (the families that run through it: ffi/peer/ is ppermute's), the modules
    a family's descriptor names, the bench_<name>.py of a family's results."""
    known = families()
    parts = path.split("/")
    if path.startswith(SELFTESTS + "/"):
        return {SANITIZER}
    if parts[0] == "ffi" and len(parts) > 2 and parts[1] in known:
        return {parts[1]}
    if parts[0] == "ffi" and len(parts) > 2 and parts[1] in layers():
        if any(parts[1] in _included(core, False) for core in CORE_SOURCES):
            return set()
        return {f for f in known if parts[1] in _reach(f)[1]}
    owners = {f for f in known if path in family_modules(f)}
    bench = re.fullmatch(r"benchmarks/bench_(\w+)\.py", path)
    if bench:
        owners |= {family_of(op) for m in _MODULES if m.__name__ == f"render_{bench[1]}"
                   for op in m.RENDERERS}
    return owners


def _family_view(path: str, text: str, kept: set[str] | None) -> str:
    """The lists that name every family (the manifest lines of
    ffi/families.inc, the imports and __all__ of jax_tma/__init__.py) as
    far as the families `kept` go: another family's line changes none of
    their programs. Other files, and every family (kept None), as they are."""
    if kept is None:
        return text
    if path == FAMILY_LIST:
        return _FAMILY_LINE.sub(lambda m: m[0] if m[1] in kept else "", text)
    if path != PACKAGE_INIT:
        return text
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    others = {m for f in families() if f not in kept for m in family_modules(f)} - {
        m for f in kept for m in family_modules(f)}
    dropped: set[str] = set()
    body = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and \
                f"{(node.module or '').replace('.', '/')}.py" in others:
            dropped |= {a.asname or a.name for a in node.names}
            continue
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.Tuple)) and \
                any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            node.value.elts = [e for e in node.value.elts
                               if not (isinstance(e, ast.Constant) and e.value in dropped)]
        body.append(node)
    tree.body = body
    return ast.unparse(tree)


@_reads_once
def changed_since(commit: str, family: str | None = None) -> list[str] | None:
    """The WATCHED paths whose code (code_of) differs between `commit` and
    the working tree of the checkout at ROOT, as far as the results of
    `family` run through them (the shared core and runs_through(family);
    None: every family's, the sanitizer's); None where git or that commit
    is not there. The working tree's files count, committed or not, and so
    does a source file that git does not track yet (not one it ignores). A
    file moved is a change at both paths (no rename detection: each path's
    code is judged on its own)."""
    names = _git_out("diff", "--name-only", "--no-renames", commit, "--", *WATCHED)
    new = _git_out("ls-files", "--others", "--exclude-standard", "--", *WATCHED)
    if names is None or new is None:
        return None
    kept = None if family is None else runs_through(family)
    changed = []
    for path in names.split() + [p for p in new.split() if _SOURCE_FILE.search(p)]:
        owners = _owners(path)
        if kept is not None and owners and not owners & kept:
            continue
        if not same_code(path, commit, kept):
            changed.append(path)
    return changed


def load_unmeasured() -> dict[str, list[dict[str, Any]]]:
    """The code changes made after each results' commit and not measured,
    each with why it should not move the numbers and what was checked
    instead: {results' commit: [{"path", "code_at" (a commit with the code
    that was not measured), "why"}]}, from UNMEASURED of the checkout at ROOT
    ({"results": [{"commit", "changes"}]}); none where the file is absent."""
    path = os.path.join(ROOT, UNMEASURED)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {entry["commit"]: entry["changes"] for entry in json.load(f)["results"]}


def same_code(path: str, commit: str, kept: set[str] | None = None) -> bool:
    """Whether `path` has the same code (code_of) at `commit` as in the
    working tree, as far as the families `kept` go (_family_view; None:
    all); a file absent from both has (a file moved away, recorded as
    unmeasured at the commit that moved it)."""
    old = _git_out("show", f"{commit}:{path}")
    try:
        with open(os.path.join(ROOT, path), errors="surrogateescape") as f:
            new = f.read()
    except OSError:
        new = None
    if old is None or new is None:
        return old is None and new is None
    view = None if kept is None else frozenset(kept)
    return _view_code(path, old, view) == _view_code(path, new, view)


@_memoized
def _view_code(path: str, text: str, kept: frozenset[str] | None) -> str:
    """code_of the view of `text` that the families `kept` run through
    (_family_view): the working tree's text recurs for every results'
    commit, and most files' committed text for many."""
    return code_of(path, _family_view(path, text, kept))


def record_unmeasured(results: dict[str, tuple[str, dict[str, Any]]], path: str,
                      why: str) -> None:
    """Adds (or renews) `path`'s entry in UNMEASURED under each results'
    commit whose code of it differs from the code committed at HEAD: `why`
    says why no measured program does. A renewed entry for a later change
    keeps the earlier reason before it. Ledgers of commits no results are of
    are dropped."""
    commits = _commits(results)
    if not same_code(path, "HEAD"):
        raise StaleResults(f"{path}: commit its change first (the entry names the commit that "
                           f"holds its code)")
    differ = [c for c in commits if path in (changed_since(c) or [])]
    if not differ:
        raise StaleResults(f"{path}: its code is that of the results' commit "
                           f"{', '.join(c[:10] for c in commits)}")
    listed = load_unmeasured()
    head = _git_out("rev-parse", "HEAD").strip()
    ledgers = []
    for commit in commits:
        changes = [c for c in listed.get(commit, []) if c["path"] != path or commit not in differ]
        if commit in differ:
            earlier = [c for c in listed.get(commit, []) if c["path"] == path
                       and c["code_at"] != head]
            reason = f"{earlier[0]['why']} Later ({head[:7]}): {why}" if earlier else why
            changes.append({"path": path, "code_at": head, "why": reason})
        if changes:
            ledgers.append({"commit": commit, "changes": changes})
    with open(os.path.join(ROOT, UNMEASURED), "w") as f:
        json.dump({"results": ledgers}, f, indent=1)
        f.write("\n")


@_reads_once
def check_fresh(results: dict[str, tuple[str, dict[str, Any]]]) -> None:
    """Raises StaleResults unless the code each result measures (its
    family's, the shared core's: changed_since) is the same at the result's
    commit as in the working tree, but for the changes that UNMEASURED lists
    with their code as it is there (any later change to such a file makes the
    results stale again; an entry for other results, or for a file whose
    code did not change, is an error too). Results of several commits are
    each judged against their own, with UNMEASURED's ledger of that commit."""
    listed = load_unmeasured()
    commits = _commits(results)
    for commit in listed:
        if commit not in commits:
            raise StaleResults(f"{UNMEASURED} lists changes after {str(commit)[:10]}, but no "
                               f"results are of that commit: take them out")
    missing = unchecked(results)
    if missing:
        raise StaleResults(f"cannot tell whether these results match the code: "
                           f"{'; '.join(missing)}")
    for commit in commits:
        changed = changed_since(commit)
        entries = listed.get(commit, [])
        leftover = [c["path"] for c in entries if c["path"] not in changed]
        if leftover:
            raise StaleResults(f"{UNMEASURED} lists {', '.join(leftover)}, whose code is that of "
                               f"{commit[:10]}: take the entries out")
        excused = {c["path"] for c in entries if same_code(c["path"], c["code_at"])}
        stale, why = [], []
        for path, r in results.values():
            if (r.get("provenance") or {}).get("commit") != commit:
                continue
            own = [p for p in changed_since(commit, family_of(r["op"])) if p not in excused]
            if own:
                stale.append(path)
                why += [p for p in own if p not in why]
        if stale:
            raise StaleResults(
                f"the results of {commit[:10]} ({', '.join(stale)}) are stale: "
                f"{', '.join(why[:12])}{' ...' if len(why) > 12 else ''} changed since; "
                f"run the benchmarks again (scripts/gpu_check.sh bench) and benchmarks/report.py")


def unchecked(results: dict[str, tuple[str, dict[str, Any]]]) -> list[str]:
    """What check_fresh cannot judge here: one line for each results' commit
    that the checkout's history lacks (no git, a copy without .git, a
    shallow clone), naming the commit and the result files left unchecked."""
    have_git = _git_out("rev-parse", "--git-dir") is not None
    return [f"{commit[:10]} ({', '.join(paths)}): "
            f"{'the commit is not in the history here' if have_git else 'no git history here'}"
            for commit, paths in _commits(results).items()
            if _git_out("cat-file", "-e", f"{commit}^{{commit}}") is None]


def _commits(results: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for path, r in results.values():
        if r.get("provenance") and r["provenance"].get("commit"):
            out.setdefault(r["provenance"]["commit"], []).append(path)
    return out


def _unmeasured_note(commit: str) -> str:
    """"; N code files changed since ..." for the results of `commit`, or ""."""
    count = len(load_unmeasured().get(commit, []))
    return (f"; {count} code file{'s' if count > 1 else ''} changed since and not measured "
            f"again (which, why, and what was checked instead: `{UNMEASURED}`)" if count else "")


def _provenance_line(path: str, r: dict[str, Any]) -> str:
    prov = r.get("provenance")
    if prov is None:  # written before results recorded their provenance
        count = len(r.get("build", {}).get("gpus", []))
        devices = (f"{count} × " if count > 1 else "") + r.get("device", "?")
        return (f"{devices}, {r.get('date', '?')}, jax {r.get('jax', '?')}; the file records no "
                f"commit, driver or clocks (`{path}`)")
    smi = prov.get("nvidia_smi") or []
    count = len(prov["devices"])
    devices = (f"{count} × " if count > 1 else "") + prov["devices"][0]
    driver = f", driver {smi[0]['driver_version']}" if smi else ""
    clocks = (f", max clocks SM {smi[0]['clocks.max.sm']} / memory {smi[0]['clocks.max.mem']}"
              if smi else "")
    flags = "".join([" **(dirty tree)**" if prov["dirty"] else "",
                     " **(smoke run: measures nothing)**" if r.get("smoke") else ""])
    v = prov["versions"]
    return (f"{devices}{driver}{clocks}; commit {str(prov['commit'])[:10]}, "
            f"{prov['date'][:10]}, jax {v.get('jax')}, jaxlib {v.get('jaxlib', '?')}{flags} "
            f"(`{path}`){_unmeasured_note(prov['commit'])}")


def render_build(results: dict[str, tuple[str, dict[str, Any]]]) -> str | None:
    """Which build of jax_tma the results measured; None without results
    (the `wheel` section sets a case timed on the wheel beside it)."""
    measured = [r for op, (_, r) in results.items() if op not in ("wheel", "sanitizer")]
    if not measured:
        return None
    builds = {tuple(build_cells(r)) for r in measured}
    lines = ["The build these results measured (each result file records its own, "
             "`provenance.jax_tma.build_info`):", "",
             "| install | CUDA architectures | FFI API | CUDA runtime |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in sorted(builds)]
    lines += ["", "Blackwell: the wheels compile `sm_100a`, but no test, sanitizer run or "
                  "benchmark here has run on a Blackwell GPU; every published number is from "
                  "the GPU its provenance line names."]
    return "\n".join(lines)


def render_sanitizer(r: dict[str, Any]) -> str:
    tools = ("memcheck", "racecheck", "synccheck")
    lines = [f"compute-sanitizer ({r.get('compute_sanitizer', '?')}) on the kernels' "
             f"standalone self-tests (`tests/cuda/*_selftest.cu`, built with "
             f"{r.get('nvcc', 'nvcc')} for `sm_90a`), as `scripts/gpu_check.sh sanitize` ran "
             f"them; each cell is the tool's summary line (✓: exit status 0):", "",
             "| self-test | plain run | " + " | ".join(tools) + " |", "|---|---|---|---|---|"]
    for prog, runs in r["programs"].items():
        cells = []
        for tool in ("run",) + tools:
            x = runs.get(tool)
            if x is None:
                cells.append("not run")
                continue
            summary = x["summary"] or f"exit status {x['rc']}"
            args = f" (`{x['args']}`)" if x.get("args") else ""
            cells.append(f"{mark(x['rc'] == 0)} {summary}{args}")
        lines.append(f"| {prog} | " + " | ".join(cells) + " |")
    probe = r.get("synccheck_cluster_probe")
    if probe:
        lines += ["", f"synccheck's own limit: `tests/cuda/synccheck_cluster_probe.cu` (one "
                      f"`cp.async.bulk` per CTA into its own shared memory between two cluster "
                      f"barriers) at cluster size {probe['cluster']}: "
                      f"{'passes' if probe['rc'] == 0 else 'faults under synccheck'} "
                      f"(`{probe['summary']}`); the self-tests ran synccheck on "
                      f"clusters of up to {r.get('largest_synccheck_cluster', '?')}."]
    return "\n".join(lines)


def render_versions(results: dict[str, tuple[str, dict[str, Any]]]) -> str | None:
    """Which jax, jaxlib and Python the GPU results ran on, and on which
    GPUs (from their provenance); None without results that record it."""
    runs = [r["provenance"] for _, r in results.values() if r.get("provenance")]
    if not runs:
        return None

    def each(values) -> str:
        values = sorted(set(values))
        return " and ".join(values) if len(values) < 3 else \
            ", ".join(values[:-1]) + " and " + values[-1]

    return (f"Every result in `benchmarks/results/` (the benchmarks, compute-sanitizer) ran "
            f"with jax {each(str(p['versions'].get('jax')) for p in runs)}, jaxlib "
            f"{each(str(p['versions'].get('jaxlib', '?')) for p in runs)} and Python "
            f"{each(str(p['versions'].get('python', '?')) for p in runs)}, on "
            f"{each(p['devices'][0] for p in runs)}.")


def render_headline(results: dict[str, tuple[str, dict[str, Any]]]) -> str:
    """The README's table of ops, one headline number each from the results,
    and where and how they were measured."""
    lines = ["| op | what it does | `auto`, on the GPU below |", "|---|---|---|"]
    used = []
    for row in HEADLINES:
        if row.result in results:
            used.append(results[row.result][1])
            number = row.number(results[row.result][1])
        else:
            number = row.no_result
        lines.append(f"| [`{row.op}`](docs/ops/{row.page or row.op}.md) | {row.what} | "
                     f"{number} |")
    where = sorted({(prov["devices"][0], prov["date"][:10], str(prov["commit"]),
                     prov["versions"].get("jax")) for r in used
                    if (prov := r.get("provenance"))})
    lines += ["", "Measured on " + "; ".join(
        f"{device}, {date}, commit {commit[:10]}, jax {jax}{_unmeasured_note(commit)}"
        for device, date, commit, jax in where)
        + ". Bandwidth counts every byte read plus every byte written; a ratio is the other "
          "formulation's time ÷ jax_tma's (above 1, jax_tma is faster), by GPU busy time "
          "(the union of a call's GPU activity) unless it says span (first to last GPU "
          "activity of a call)."]
    return "\n".join(lines)


def _render_modules() -> list[ModuleType]:
    """The render_<name>.py modules next to this script, alphabetically: each
    renders the results that bench_<name>.py writes. A module lists RENDERERS
    ({op: its section's text from the op's result}, for every op its bench
    module writes that this script does not render itself) and, where it has
    them, DERIVED ({section: its text from all the results, None where what
    it draws from is missing}), HEADLINES (tables.Headline: its rows of the
    README's table of ops), PLOTS (tables.Plot) and WRITTEN_BY ({op: the
    command that writes its result, for a section without one, where not
    `run.py all`})."""
    here = os.path.dirname(os.path.abspath(__file__))
    return [importlib.import_module(os.path.basename(path)[:-len(".py")])
            for path in sorted(glob.glob(os.path.join(here, "render_*.py")))]


def _merged(name: str, own: dict[str, Any]) -> dict[str, Any]:
    """The render modules' dicts called `name`, and `own`: a key in two of
    them is an error."""
    out = dict(own)
    for module in _MODULES:
        for key, value in getattr(module, name, {}).items():
            if key in out:
                raise RuntimeError(f"benchmarks/{module.__name__}.py: {name} {key!r} is taken")
            out[key] = value
    return out


_MODULES = _render_modules()
# Each op's section: the render modules', the wheel's case (one case timed on
# another install, on the pages inside the build section) and the sanitizer's.
RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = _merged(
    "RENDERERS", {"sanitizer": render_sanitizer})
# Sections drawn from several results (None: nothing to draw from).
DERIVED: dict[str, Callable[[dict[str, tuple[str, dict[str, Any]]]], str | None]] = _merged(
    "DERIVED", {"build": render_build, "headline": render_headline,
                "versions": render_versions})
HEADLINES: list[Headline] = sorted((row for module in _MODULES
                                    for row in getattr(module, "HEADLINES", ())),
                                   key=lambda row: row.rank)
PLOTS: list[Plot] = [p for module in _MODULES for p in getattr(module, "PLOTS", ())]
# What writes each op's result, for the sections that have none yet (where
# not `run.py all`).
_WRITTEN_BY: dict[str, str] = _merged(
    "WRITTEN_BY", {"sanitizer": "`scripts/gpu_check.sh sanitize` (its `bench_sanitize.tgz`)"})


def render(r: dict[str, Any], path: str | None = None) -> str:
    """One op's README section: where it was measured, then its tables."""
    text = RENDERERS[r["op"]](r)
    if path is not None:
        text = _provenance_line(path, r) + "\n\n" + text
    differs = r.get("comparator_differs") or {}
    if differs:
        text += ("\n\nComparators (XLA formulations, Pallas kernels) whose output differs from "
                 "the bit-exact reference (timed all the same): ") + "; ".join(
            f"{k}: {v}" for k, v in differs.items())
    return text


def render_sections(text: str, results: dict[str, tuple[str, dict[str, Any]]]) -> str:
    """`text` (a page) with every bench section rewritten from `results`."""
    def section(m: re.Match) -> str:
        op = m["op"]
        if op in DERIVED:
            body = DERIVED[op](results) or f"No results at this commit to draw `{op}` from."
        elif base_op(op) not in RENDERERS:
            raise ValueError(f"section bench:{op}: no such benchmark")
        elif op in results:
            body = render(results[op][1], results[op][0])
        else:
            body = (f"No `{op}` result at this commit: "
                    + _WRITTEN_BY.get(base_op(op), "`python benchmarks/run.py all --out-dir "
                                                   "benchmarks/results`") + " writes it.")
        return f"{m.group(1)}{body}\n{m.group(4)}"
    return _SECTION.sub(section, text)


def pages(readme: str, docs: str) -> list[str]:
    """The pages report.py renders: the README and every page under `docs`
    that holds a bench section."""
    found = []
    for path in sorted(glob.glob(os.path.join(docs, "**", "*.md"), recursive=True)):
        with open(path) as f:
            if _SECTION.search(f.read()):
                found.append(path)
    return [readme, *found]


def plot(results: dict[str, tuple[str, dict[str, Any]]], out_dir: str) -> list[str]:
    """The render modules' PLOTS of the results at hand, as PNG files in
    `out_dir` (none without matplotlib); returns their paths."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report.py: no matplotlib, no plots", file=sys.stderr)
        return []
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for p in PLOTS:
        if p.result in results:
            fig, ax = plt.subplots(figsize=(7, 4))
            p.draw(ax, results[p.result][1])
            paths.append(os.path.join(out_dir, p.file))
            fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
    return paths


@_reads_once
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/report.py")
    parser.add_argument("--results", default=RESULTS, help="the result JSON files' folder")
    parser.add_argument("--readme", default=README)
    parser.add_argument("--docs", help="the documentation site's sources, whose pages with "
                                       "bench sections are rendered too (default: docs/ of "
                                       "the checkout)")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a page's sections differ from the "
                             "results or the measured code changed after their commit")
    parser.add_argument("--allow-stale", action="store_true",
                        help="with --check: do not compare the results' commit with the checkout's code")
    parser.add_argument("--plots", metavar="DIR", help="also write plots here")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="render dirty-tree and smoke results too")
    parser.add_argument("--unmeasured", metavar="PATH",
                        help=f"record in {UNMEASURED} that the committed code of PATH was not measured "
                             f"(with --why: why no measured program differs)")
    parser.add_argument("--why", help="with --unmeasured: the reason")
    parser.add_argument("--merge", metavar="FILE", nargs="+",
                        help="write into --results one result of these results of one op, "
                             "commit and GPUs, each of other sizes (merge_results)")
    args = parser.parse_args(argv)
    if args.merge:
        parts = []
        for path in args.merge:
            with open(path) as f:
                parts.append(json.load(f))
        try:
            print(f"wrote {write_result(merge_results(parts), args.results)}")
        except ValueError as e:
            print(f"benchmarks/report.py: {e}", file=sys.stderr)
            return 2
        return 0
    results = load_results(args.results)
    if args.unmeasured:
        if not args.why:
            parser.error("--unmeasured needs --why")
        record_unmeasured(results, args.unmeasured, args.why)
        return 0
    check_results(results, args.allow_dirty)
    rendered = {}
    for path in pages(args.readme, args.docs or os.path.join(ROOT, "docs")):
        with open(path) as f:
            old = f.read()
        rendered[path] = old, render_sections(old, results)
    try:
        check_fresh(results)
        stale = None
    except StaleResults as e:
        stale = str(e)
    if args.check:
        failed = 0
        for path, (old, new) in rendered.items():
            if new != old:
                sys.stdout.writelines(difflib.unified_diff(
                    old.splitlines(True), new.splitlines(True), path, "rendered"))
                print(f"{path}: the benchmark sections differ from {args.results}: run "
                      f"python benchmarks/report.py", file=sys.stderr)
                failed = 1
        if stale and not args.allow_stale:
            print(f"benchmarks/report.py: {stale}", file=sys.stderr)
            failed = 1
        elif stale:  # allowed, and said all the same: what was not checked, or is stale
            print(f"benchmarks/report.py: warning (--allow-stale): {stale}", file=sys.stderr)
        return failed
    if stale:
        print(f"benchmarks/report.py: warning: {stale}", file=sys.stderr)
    for path, (old, new) in rendered.items():
        if new != old:
            with open(path, "w") as f:
                f.write(new)
            print(f"rewrote the benchmark sections of {path}")
    for path in plot(results, args.plots) if args.plots else []:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
