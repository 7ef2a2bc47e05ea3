"""Renders the benchmark tables of the README and the documentation site from
the result JSON files, so that every published number comes from a file that
benchmarks/run.py wrote.

    python benchmarks/report.py            # rewrite the bench sections of README.md and docs/
    python benchmarks/report.py --check    # exit 1 if a page differs from the results,
                                           # or the code changed after the results' commit
    python benchmarks/report.py --plots benchmarks/plots   # also plots (needs matplotlib)

The pages (README.md and every docs/ page that has one) hold sections
between `<!-- bench:OP -->` and `<!-- /bench:OP -->`: one op's tables (the
op pages of docs/ops/), or a section drawn from several results (DERIVED:
the README's headline table, docs/benchmarks.md's build);
everything between them is this script's output. The results must be one
file per op, from one commit, clean and not smoke runs, and that commit's
measured code (WATCHED, comments and docstrings aside) must be HEAD's; a file written before results
recorded their provenance is rendered as such.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import glob
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
README = os.path.join(ROOT, "README.md")
MIB = 1 << 20
# The wall clock (N calls dispatched, one sync) is shown for cases of at
# least this busy time: below it, it measures Python dispatch.
WALL_MIN_US = 100.0
# What L2 holds on an H100 (50 MiB): calls that rotate through less read
# their data from L2 (the tables say "L2-warm").
L2_BYTES = 50 * MIB
# Code changes after the results' commit that leave every measured program as
# it was, each with why (see check_fresh), relative to the checkout's root.
UNMEASURED = "benchmarks/unmeasured_changes.json"
# The code a result measures: a change to its code (comments, docstrings and
# layout aside) after the results' commit makes them stale (git pathspecs,
# from the checkout's root). This script only renders results, and --check
# compares its rendering with the committed README, so it is not watched.
WATCHED = ("ffi", "jax_tma", "benchmarks/*.py", "benchmarks/ffi", "CMakeLists.txt",
           ":(exclude)benchmarks/report.py")
_SECTION = re.compile(r"(<!-- bench:(?P<op>[\w-]+) -->\n)(?P<body>.*?)(<!-- /bench:(?P=op) -->)",
                      re.S)


def load_results(results_dir: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """op -> (path relative to the checkout, result) of every JSON file in
    `results_dir`; two files of one op are an error."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for path in sorted(glob.glob(os.path.join(results_dir, "*.json"))):
        with open(path) as f:
            result = json.load(f)
        rel = os.path.relpath(path, ROOT)
        op = result["op"]
        if op in out:
            raise ValueError(f"two results for {op}: {out[op][0]} and {rel} (keep one)")
        out[op] = (rel, result)
    return out


def check_results(results: dict[str, tuple[str, dict[str, Any]]], allow_dirty: bool = False,
                  allow_mixed: bool = False) -> None:
    """Raises ValueError unless the results are publishable: clean, not
    smoke runs, and (those that record one) all of one commit."""
    commits = {}
    for path, r in results.values():
        prov = r.get("provenance")
        if prov is None:
            continue
        if (prov["dirty"] or r.get("smoke")) and not allow_dirty:
            raise ValueError(f"{path}: a {'smoke run' if r.get('smoke') else 'dirty tree'}'s "
                             f"result cannot be published")
        commits.setdefault(prov["commit"], []).append(path)
    if len(commits) > 1 and not allow_mixed:
        raise ValueError(f"results of several commits: {commits}")


class StaleResults(ValueError):
    """The results are not those of the code at HEAD (or that cannot be told)."""


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
    runs of white space as one space; other files as they are."""
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


def changed_since(commit: str) -> list[str] | None:
    """The WATCHED paths whose code (code_of) differs between `commit` and
    HEAD of the checkout at ROOT; None where git or that commit is not
    there."""
    names = _git_out("diff", "--name-only", commit, "HEAD", "--", *WATCHED)
    if names is None:
        return None
    changed = []
    for path in names.split():
        if not same_code(path, commit):
            changed.append(path)
    return changed


def load_unmeasured() -> dict[str, Any]:
    """The code changes made after the results' commit and not measured,
    each with why it should not move the numbers and what was checked instead: {"commit":
    the results' commit, "changes": [{"path", "code_at" (a commit with the
    code that was not measured), "why"}]}, from UNMEASURED of the checkout at ROOT; none
    where the file is absent."""
    path = os.path.join(ROOT, UNMEASURED)
    if not os.path.exists(path):
        return {"commit": None, "changes": []}
    with open(path) as f:
        return json.load(f)


def same_code(path: str, commit: str) -> bool:
    """Whether `path` has the same code (code_of) at `commit` as at HEAD."""
    old, new = _git_out("show", f"{commit}:{path}"), _git_out("show", f"HEAD:{path}")
    return old is not None and new is not None and code_of(path, old) == code_of(path, new)


def record_unmeasured(results: dict[str, tuple[str, dict[str, Any]]], path: str,
                      why: str) -> None:
    """Adds (or renews) `path`'s entry in UNMEASURED: HEAD's code of it
    differs from that of the results' commit, and `why` says why no measured
    program does."""
    (commit,) = _commits(results)
    if path not in (changed_since(commit) or []):
        raise StaleResults(f"{path}: its code is that of the results' commit {commit[:10]}")
    listed = load_unmeasured()
    changes = [c for c in listed["changes"] if c["path"] != path and listed["commit"] == commit]
    changes.append({"path": path, "code_at": _git_out("rev-parse", "HEAD").strip(), "why": why})
    with open(os.path.join(ROOT, UNMEASURED), "w") as f:
        json.dump({"commit": commit, "changes": changes}, f, indent=1)
        f.write("\n")


def check_fresh(results: dict[str, tuple[str, dict[str, Any]]]) -> None:
    """Raises StaleResults unless the measured code (WATCHED) is the same at
    every result's commit as at HEAD, but for the changes that UNMEASURED
    lists with their code as it is at HEAD (any later change to such a file
    makes the results stale again; an entry for other results, or for a
    file whose code did not change, is an error too)."""
    listed = load_unmeasured()
    for commit, paths in _commits(results).items():
        changed = changed_since(commit)
        if changed is None:
            raise StaleResults(f"cannot tell whether the results of {commit[:10]} ({paths[0]}, "
                               f"...) match the code: git or that commit is missing here")
        entries = listed["changes"]
        if entries and listed["commit"] != commit:
            raise StaleResults(f"{UNMEASURED} lists changes after {str(listed['commit'])[:10]}, "
                               f"but the results are of {commit[:10]}: take them out")
        leftover = [c["path"] for c in entries if c["path"] not in changed]
        if leftover:
            raise StaleResults(f"{UNMEASURED} lists {', '.join(leftover)}, whose code is that of "
                               f"{commit[:10]}: take the entries out")
        excused = {c["path"] for c in entries if same_code(c["path"], c["code_at"])}
        changed = [p for p in changed if p not in excused]
        if changed:
            raise StaleResults(
                f"the results of {commit[:10]} ({', '.join(paths)}) are stale: "
                f"{', '.join(changed[:12])}{' ...' if len(changed) > 12 else ''} changed since; "
                f"run the benchmarks again (scripts/gpu_check.sh bench) and benchmarks/report.py")


def _commits(results: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for path, r in results.values():
        if r.get("provenance") and r["provenance"].get("commit"):
            out.setdefault(r["provenance"]["commit"], []).append(path)
    return out


def _unmeasured_note(commit: str) -> str:
    """"; N code files changed since ..." for the results of `commit`, or ""."""
    listed = load_unmeasured()
    count = len(listed["changes"]) if listed["commit"] == commit else 0
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


def _wall_shown(*times: dict[str, float]) -> bool:
    """Whether these cases' wall clocks mean something: measured, and every
    case takes at least WALL_MIN_US of GPU busy time."""
    return all("wall_us" in t and t["busy_us"] >= WALL_MIN_US for t in times)


def _us(t: dict[str, float]) -> str:
    """busy / span / wall µs (the wall clock from WALL_MIN_US of busy time)."""
    wall = f"{t['wall_us']:.1f}" if _wall_shown(t) else "—"
    return f"{t['busy_us']:.1f} / {t['span_us']:.1f} / {wall}"


def _ratio(times: dict[str, dict[str, float]], a: str, b: str, clock: str) -> str:
    """b's time ÷ a's by `clock` ("busy_us", "span_us", "wall_us"), or "—"
    where either is missing (or, for the wall clock, not shown)."""
    if a not in times or b not in times or clock not in times[a] or clock not in times[b]:
        return "—"
    if clock == "wall_us" and not _wall_shown(times[a], times[b]):
        return "—"
    return f"{times[b][clock] / times[a][clock]:.2f}"


def target_met(row: dict[str, Any], comparator: str, ratio: float) -> bool:
    """Whether `auto` reaches `ratio` × the comparator's speed by busy time
    and by span alike (a faster-than claim needs both clocks)."""
    t = row["times"]
    return all(t[comparator][k] / t["auto"][k] >= ratio for k in ("busy_us", "span_us"))


# The clocks are defined in the README's "How every benchmark measures".
WALL_NOTE = (f"busy / span / wall µs per call (the wall clock from {WALL_MIN_US:g} µs of busy "
             f"time)")


def _range(values: list[float], fmt: str = "{:.3f}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else \
        f"{fmt.format(lo)}–{fmt.format(hi)}"


def size_text(nbytes: float) -> str:
    """nbytes in its largest binary unit that it reaches: 128 B, 32 KiB, 1 GiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def render_copy(r: dict[str, Any]) -> str:
    cases = ("auto", "bulk", "simt", "seed_tma", "xla_copy", "memcpy")
    head = ["size", "dtype", "inputs rotated", "auto", "bulk", "simt", "seed-style TMA",
            "XLA `jnp.copy`", "cudaMemcpyAsync", "auto vs XLA, repeated: span / wall",
            "after a write: auto vs XLA (bulk vs cudaMemcpyAsync), span"]
    lines = [f"TB/s by span in the repeated regime (vs cudaMemcpyAsync in parentheses), then "
             f"`auto` vs XLA in both regimes (the wall clock from {WALL_MIN_US:g} µs of busy "
             f"time):", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in r["rows"]:
        rep, after = row["repeat"], row["after_write"]
        cells = [size_text(row["bytes"]), row.get("dtype", "uint32"),
                 f"{row['inputs']} ({size_text(row['inputs'] * row['bytes'])})"]
        cells += [f"{rep[c]['tbps']:.2f} ({rep[c]['vs_memcpy']:.3f}×)" for c in cases]
        wall = _ratio(rep, "auto", "xla_copy", "wall_us")
        cells.append(f"{rep['auto']['vs_xla']:.3f}× / {wall}{'×' if wall != '—' else ''}")
        cells.append(f"{after['auto']['vs_xla']:.3f}× ({after['bulk']['vs_memcpy']:.3f}×)")
        lines.append("| " + " | ".join(cells) + " |")
    bounded = [row for row in r["rows"] if "serial_bound" in row]
    if bounded:
        lines += ["", "| size | read-only TB/s | write-only TB/s | serial bound "
                  "2n/(t_read+t_write) TB/s | bulk TB/s ÷ bound | seed-style ÷ bound | "
                  "cudaMemcpyAsync ÷ bound |", "|---|---|---|---|---|---|---|"]
        for row in bounded:
            b = row["serial_bound"]
            lines.append(f"| {size_text(row['bytes'])} | {b['read_tbps']:.2f} | "
                         f"{b['write_tbps']:.2f} | {b['copy_tbps']:.2f} | "
                         f"{b['bulk_fraction']:.3f} | {b['seed_tma_fraction']:.3f} | "
                         f"{b['memcpy_fraction']:.3f} |")
    chain = r["chained_tiny_copies"]
    lines += ["", f"{chain['bulk']['ops']} chained 1 KiB copies inside one `jit` (L2-warm: "
                  f"the same 1 KiB every call): {chain['bulk']['us_per_op']:.2f} µs per op "
                  f"(bulk), {chain['simt']['us_per_op']:.2f} µs per op (simt), by span."]
    rep = [row["repeat"]["auto"]["vs_xla"] for row in r["rows"]]
    after = [row["after_write"]["auto"]["vs_xla"] for row in r["rows"]]
    lines += ["", f"`auto` vs XLA over these sizes, by span: {_range(rep)}× repeated, "
                  f"{_range(after)}× after a write."]
    if bounded:
        lines[-1] += (f" From {size_text(bounded[0]['bytes'])} up `bulk` runs at "
                      f"{_range([row['repeat']['bulk']['vs_memcpy'] for row in bounded])}× "
                      f"cudaMemcpyAsync, "
                      f"{_range([row['repeat']['bulk']['vs_xla'] for row in bounded])}× XLA and "
                      f"{_range([row['serial_bound']['bulk_fraction'] for row in bounded])} of "
                      f"the serial bound.")
    return "\n".join(lines)


def render_tune_bulk(r: dict[str, Any]) -> str:
    lines = ["| size | shapes swept | best shape | best TB/s | shipped shape (schedule) | "
             "its rank | shipped ÷ best time |", "|---|---|---|---|---|---|---|"]
    for e in r["summary"]:
        lines.append(f"| {size_text(e['bytes'])} | {e['shapes']} | {e['best']} | "
                     f"{e['best_tbps']:.3f} | {e['shipped']} ({e['shipped_schedule']}) | "
                     f"{e['shipped_rank']} | {1 / e['shipped_vs_best']:.3f}× |")
    return "\n".join(lines)


def render_window(r: dict[str, Any]) -> str:
    # Results before the planner chose auto's kernel recorded the method that
    # Python handed the handler instead of the path that ran.
    paths = all("auto_path" in row for row in r["rows"])
    lines = [f"GPU {WALL_NOTE}; TB/s and ratios by busy time (auto vs XLA by span and wall "
             f"too):", "",
             f"| case | {'auto ran' if paths else 'auto hands the handler'} | auto | tma | "
             "simt | XLA | copy ceiling | "
             "auto TB/s | vs XLA, busy: auto / tma / simt | auto vs XLA: span / wall | "
             "auto vs ceiling |", "|" + "---|" * 11]
    for row in r["rows"]:
        t = row["times"]
        cell = {m: _us(t[m]) if m in t else "—" for m in ("auto", "tma", "simt")}
        vs = " / ".join(f"{row['vs_xla'][m]:.2f}" if m in t else "—"
                        for m in ("auto", "tma", "simt"))
        ran = (f"`{row['auto_path']}`" if paths
               else f"`method=\"{row['auto_lowered_method']}\"`")
        lines.append(f"| {row['case']} | {ran} | "
                     f"{cell['auto']} | {cell['tma']} | {cell['simt']} | {_us(t['xla'])} | "
                     f"{_us(t['memcpy'])} | {row['busy_tbps']['auto']:.2f} | {vs} | "
                     f"{_ratio(t, 'auto', 'xla', 'span_us')} / "
                     f"{_ratio(t, 'auto', 'xla', 'wall_us')} | {row['vs_ceiling']['auto']:.2f} |")
    return "\n".join(lines)


def _im2col_rows(r: dict[str, Any], ours: tuple[str, ...], xla: tuple[str, ...],
                 ceiling: str, vs: str) -> list[str]:
    """Table rows: input, µs of `ours`, `xla` and `ceiling`, TB/s of ours[0],
    then its ratios to `xla` and to the ceiling (row[vs])."""
    out = []
    for row in r["rows"]:
        t = row["times"]
        cells = [f"{tuple(row['shape'])} {row['dtype']}"]
        cells += [_us(t[k]) for k in (*ours, *xla, ceiling)]
        cells += [f"{row['busy_tbps'][ours[0]]:.2f}",
                  " / ".join(f"{row[vs][k]:.2f}" for k in xla), f"{row[vs][ceiling]:.2f}"]
        out.append("| " + " | ".join(cells) + " |")
    return out


def render_im2col(r: dict[str, Any]) -> str:
    lines = [f"GPU {WALL_NOTE}; TB/s and ratios by busy time:", "",
             "| input (3×3 SAME) | auto | tma | simt | XLA patches | XLA slice-concat | "
             "copy ceiling | auto TB/s | auto vs XLA: patches / slice-concat | "
             "auto vs ceiling |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines += _im2col_rows(r, ("im2col_auto", "im2col_tma", "im2col_simt"),
                          ("xla_patches", "xla_slice_concat"), "memcpy", "im2col_vs")
    lines += ["", "| input | col2im | XLA grad of patches | XLA grad of slice-concat | "
              "copy ceiling | col2im TB/s | col2im vs XLA: grad of patches / of "
              "slice-concat | col2im vs ceiling |", "|---|---|---|---|---|---|---|---|"]
    lines += _im2col_rows(r, ("col2im",), ("xla_grad_patches", "xla_grad_slice_concat"),
                          "memcpy_col2im_run", "col2im_vs")
    return "\n".join(lines)


def render_broadcast(r: dict[str, Any]) -> str:
    rows = r["rows"]
    labels = list(rows[0]["times"])
    lines = [f"GPU {WALL_NOTE} (TB/s by busy time); ratios by busy time:", "",
             "| method | " + " | ".join(row["case"] for row in rows) + " |",
             "|---|" + "---|" * len(rows)]
    for label in labels:
        lines.append(f"| {label} | " + " | ".join(
            f"{_us(row['times'][label])} ({row['busy_tbps'][label]:.2f})" for row in rows) + " |")
    lines.append("| fastest jax_tma method (vs XLA) | " + " | ".join(
        f"{row['best']} ({row['best_vs_xla']:.2f}×)" for row in rows) + " |")
    lines.append("| auto: vs XLA, and vs the fastest | " + " | ".join(
        f"{row['auto_vs_xla']:.2f}×, {row['auto_vs_best']:.3f}" for row in rows) + " |")
    push = r["dsmem_push"]
    lines += ["", f"SM-to-SM push of the dsmem path ({push['input']} in, n = 1; "
                  f"{push['bytes_convention']}):", "",
              "| cluster size | " + " | ".join(str(p["cluster_size"]) for p in push["rows"]) + " |",
              "|---|" + "---|" * len(push["rows"]),
              "| push TB/s | " + " | ".join(f"{p['push_tbps']:.2f}" for p in push["rows"]) + " |",
              "| busy / span µs | " + " | ".join(_us(p) for p in push["rows"]) + " |"]
    return "\n".join(lines)


def _kernel_name(demangled: str) -> str:
    """'void ns::(anonymous namespace)::Kernel<T>(args)' -> 'Kernel'."""
    base = re.split(r"[<(]", demangled.replace("(anonymous namespace)", ""), maxsplit=1)[0]
    return (base.split("::")[-1].split() or [demangled])[-1]


def render_broadcast_ncu(r: dict[str, Any]) -> str:
    lines = [f"{r['case']}: x is {r['x_bytes'] / 1e6:.2f} MB, the output "
             f"{r['out_bytes'] / 1e6:.2f} MB; `{' '.join(r['command'])}` "
             f"({', '.join(r['ncu_version'])}):", "",
             "| method | DRAM read MB | read ÷ x | DRAM write MB | kernel µs (ncu) | kernels |",
             "|---|---|---|---|---|---|"]
    for row in r["rows"]:
        kernels = "; ".join(sorted({_kernel_name(k) for k in row["kernels"]}))
        lines.append(f"| {row['method']} | {row['dram_read_bytes'] / 1e6:.2f} | "
                     f"{row['read_over_x']:.3f} | {row['dram_write_bytes'] / 1e6:.2f} | "
                     f"{row['kernel_us']:.1f} | {kernels} |")
    return "\n".join(lines)


def render_ppermute(r: dict[str, Any]) -> str:
    # Only what bench_ppermute.topology() recorded (an older file's text
    # was added by hand).
    topo = r.get("topology")
    link = topo.get("gpu0_gpu1") if isinstance(topo, dict) else None
    lines = [f"GB/s per direction by span, {r['chain']} permutations chained per program, "
             f"`perm={r['perm']}`; GPU0–GPU1 link: {link or 'not recorded'}:", "",
             "| block per GPU | push (TMA bulk) | pull (TMA bulk) | pull (SIMT) | auto | "
             "lax.ppermute (NCCL) | auto vs NCCL |", "|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        lines.append(f"| {row['block_mib']:g} MiB | {row['push_gbps']:.1f} | "
                     f"{row['pull_gbps']:.1f} | {row['simt_pull_gbps']:.1f} | "
                     f"{row['auto_gbps']:.1f} | {row['nccl_gbps']:.1f} | "
                     f"{row['auto_vs_nccl']:.2f}× |")
    return "\n".join(lines)


_GATHER_LABELS = {"memcpy": "ceiling", "xla": "XLA", "xla_hinted": "XLA hinted"}
# The sweep's cases and their labels in the plot.
_GATHER_SWEEP = {"auto": "jax_tma.gather", "tma": "jax_tma.gather(method='tma')",
                 "simt": "jax_tma.gather(method='simt')", "xla": "XLA jnp.take",
                 "xla_hinted": "XLA x.at[i].get, hinted",
                 "memcpy": "cudaMemcpyAsync (copy ceiling)"}
_GATHER_TARGET_TEXT = {"pages": "gather of pages", "set": "in-place page set",
                       "rows 512": "gather of 512 B rows", "rows 128": "gather of 128 B rows",
                       "add": "row scatter-add", "decode": "paged decode step"}


def _dtype_order(dtypes: list[str], use: str | None) -> list[str]:
    """The use case's dtype first, the uint32 control last."""
    return sorted(dict.fromkeys(dtypes), key=lambda d: (d != use, d == "uint32", d))
_UNRECORDED = "not recorded"


def _mark(met: bool) -> str:
    return "✓" if met else "✗"


def _gather_key(row: dict[str, Any]) -> str:
    """The row's case key (results written before rows recorded theirs: from
    the case's kind and text)."""
    if "key" in row:
        return row["key"]
    kind = row.get("kind", "")
    if kind in ("scatter set", "scatter add", "decode step"):
        return {"scatter set": "set", "scatter add": "add", "decode step": "decode"}[kind]
    m = re.search(r"rows of (\d+) B", row["case"])
    return f"rows {m.group(1)}" if m else "pages"


def _bare_case(row: dict[str, Any]) -> str:
    """The case's text without its dtype where it qualifies a noun ("random
    bfloat16 pages"): the tables give the dtype a column."""
    dtype = row.get("dtype")
    return row["case"].replace(f" {dtype} ", " ") if dtype else row["case"]


def _ratios(t: dict[str, dict[str, float]], comps: tuple[str, ...], clock: str) -> str:
    return " / ".join(_ratio(t, "auto", c, clock) for c in comps)


def gather_targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 18's targets that the gather result's rows carry, judged by
    target_met: [{"target", "case", "dtype", "comparator", "ratio", "busy",
    "span", "wall" (None unless shown), "met", "bound"}], where "bound" is
    the highest ratio to the comparator that a call at the copy ceiling
    would reach (by busy time; None where the row has no ceiling)."""
    out = []
    for row in r["rows"]:
        t = row["times"]
        for comp, ratio in row.get("targets", {}).items():
            wall = _ratio(t, "auto", comp, "wall_us")
            out.append({"target": f"{_GATHER_TARGET_TEXT.get(_gather_key(row), row['case'])}: "
                                  f"`auto` ≥ {ratio:g}× {_GATHER_LABELS[comp]}",
                        "case": _bare_case(row), "dtype": row.get("dtype", _UNRECORDED),
                        "comparator": comp, "ratio": ratio,
                        "busy": t[comp]["busy_us"] / t["auto"]["busy_us"],
                        "span": t[comp]["span_us"] / t["auto"]["span_us"],
                        "wall": None if wall == "—" else float(wall),
                        "met": target_met(row, comp, ratio),
                        "bound": (t[comp]["busy_us"] / t["memcpy"]["busy_us"]
                                  if "memcpy" in t else None)})
    return out


def _render_gather_targets(r: dict[str, Any]) -> list[str]:
    lines = ["Issue 18's targets, judged at the dtype of their use case (the row scatter-add at "
             "float32 too): a target is met where `auto` reaches it by busy time and by span "
             f"alike; the wall clock is given from {WALL_MIN_US:g} µs. \"At the ceiling\" is "
             f"the ratio a call moving its bytes at the copy ceiling (`cudaMemcpyAsync` of the "
             f"same bytes, same run) would reach: a target above it is above the hardware's "
             f"limit.", "",
             "| target | case | dtype | clock | measured | at the ceiling | met |",
             "|---|---|---|---|---|---|---|"]
    for t in gather_targets(r):
        wall = f", wall {t['wall']:.2f}×" if t["wall"] is not None else ""
        bound = "—" if t["bound"] is None else f"{t['bound']:.2f}×"
        beyond = (" (above the ceiling)" if not t["met"] and t["bound"] is not None
                  and t["bound"] < t["ratio"] else "")
        lines.append(f"| {t['target']} | {t['case']} | {t['dtype']} | busy and span | "
                     f"{t['busy']:.2f}× busy, {t['span']:.2f}× span{wall} | {bound} | "
                     f"{_mark(t['met'])}{beyond} |")
    c = r["chained_tiny_gathers"]
    lines.append(f"| chained tiny gathers: ≤ {c['target_gap_us']:g} µs per call over a minimal "
                 f"FFI kernel | {c['ops']} chained gathers of one {size_text(c['bytes'])} page "
                 f"(L2-warm) | {c.get('dtype', 'uint32')} | span | {c['gap_us']:+.2f} µs | — | "
                 f"{_mark(c['target_met'])} |")
    return lines


def _rotation(row: dict[str, Any]) -> str:
    """How many index sets a gather row's calls rotate through, and the slab
    bytes they read together ("L2-warm" below L2's size)."""
    sets = row.get("inputs", 1)
    read = sets * row["bytes"] // 2
    return f"{sets} ({size_text(read)}{': L2-warm' if read < L2_BYTES else ''})"


def render_gather(r: dict[str, Any]) -> str:
    cols = ("auto", "tma", "simt", "deterministic", "xla", "xla_hinted", "memcpy")
    comps = ("xla", "xla_hinted", "memcpy")
    lines = _render_gather_targets(r)
    lines += ["", f"GPU {WALL_NOTE}; ratios of `auto` to XLA, XLA hinted and the copy ceiling "
                  f"(their time ÷ auto's) by each clock:", "",
              "| case | dtype | auto | tma | simt | deterministic | XLA | XLA hinted | "
              "copy ceiling | auto TB/s (busy) | auto vs XLA / hinted / ceiling: busy | span | "
              "wall |", "|" + "---|" * 13]
    for row in r["rows"]:
        t = row["times"]
        cells = [_bare_case(row), row.get("dtype", _UNRECORDED)]
        cells += [_us(t[k]) if k in t else "—" for k in cols]
        cells += [f"{row['busy_tbps']['auto']:.2f}"]
        cells += [_ratios(t, comps, clock) for clock in ("busy_us", "span_us", "wall_us")]
        lines.append("| " + " | ".join(cells) + " |")
    dtypes = _dtype_order([row["dtype"] for row in r["rows"] if "dtype" in row],
                          r.get("use_dtype"))
    keyed: dict[str, dict[str, dict[str, Any]]] = {}
    for row in r["rows"]:
        if "dtype" in row:
            keyed.setdefault(_gather_key(row), {})[row["dtype"]] = row
    if len(dtypes) > 1:
        lines += ["", "The dtype's effect: each case's speed as a fraction of the copy ceiling "
                      "(ceiling time ÷ the case's, busy) at each dtype, XLA / XLA hinted / "
                      "`auto`:", "",
                  "| case | " + " | ".join(dtypes) + " |", "|---|" + "---|" * len(dtypes)]
        for key, rows in keyed.items():
            cells = []
            for d in dtypes:
                if d not in rows:
                    cells.append("—")
                    continue
                t = rows[d]["times"]
                cells.append(" / ".join(_ratio(t, k, "memcpy", "busy_us")
                                        for k in ("xla", "xla_hinted", "auto")))
            lines.append(f"| {_GATHER_TARGET_TEXT.get(key, key)} | " + " | ".join(cells) + " |")
    lines += ["", "XLA formulations:"]
    lines += [f"- {kind}: " + "; ".join(f"{_GATHER_LABELS[k]} `{code}`" for k, code in f.items())
              for kind, f in r["xla_formulations"].items()]
    for row in r["rows"]:
        for name, why in row.get("xla_rejects", {}).items():
            lines.append(f"- {_bare_case(row)} ({row.get('dtype')}): XLA rejects "
                         f"{_GATHER_LABELS[name]}: `{why}`")
        if "per_pool" in row["times"]:
            lines.append(f"- {row['case'].split(':')[0]}, auto: both pools as the tables of one "
                         f"`jax_tma.scatter` and one `jax_tma.gather`; with a call per pool "
                         f"instead: {_us(row['times']['per_pool'])} µs "
                         f"({_ratio(row['times'], 'per_pool', 'xla_hinted', 'busy_us')}× XLA "
                         f"hinted by busy time)")
        if "xla_gather_kernels" in row:
            n = row["xla_gather_kernels"]
            lines.append(f"- {row['case'].split(':')[0]}: XLA's compiled step gathers K and V "
                         f"in {n['xla']} kernel{'s' * (n['xla'] != 1)} (hinted: "
                         f"{n['xla_hinted']}), counted in its optimized HLO")
    c = r["chained_tiny_gathers"]
    g, m = c["per_op"]["gather"], c["per_op"]["minimal_ffi"]
    lines += ["", f"{c['ops']} chained gathers of one {size_text(c['bytes'])} page in one "
                  f"`jit` (L2-warm: every call moves the same page): {g['span_us']:.2f} µs per "
                  f"call by span ({g['busy_us']:.2f} busy); {c['minimal_ffi']} of the same page "
                  f"(a minimal FFI kernel) chained alike: {m['span_us']:.2f} µs "
                  f"({m['busy_us']:.2f}); the gather costs {c['gap_us']:+.2f} µs per call more "
                  f"(target ≤ {c['target_gap_us']:g} µs {_mark(c['target_met'])})."]
    others = [f"`method='{k[len('gather_'):]}'` {v['span_us']:.2f} µs ({v['busy_us']:.2f})"
              for k, v in c["per_op"].items() if k.startswith("gather_")]
    if others:
        lines[-1] += " The other methods, chained alike: " + ", ".join(others) + "."
    if "small_gathers" in r:
        lines += ["", "Small gathers, GPU busy µs per call (the profiler's clock ticks every "
                      "32 ns); the calls of a case rotate through index sets of distinct rows "
                      "(count, and the slab bytes they read together; a copy ceiling's inputs "
                      "rotate alike):", "",
                  "| case | dtype | index sets | auto | tma | simt | XLA | XLA hinted | "
                  "copy ceiling | auto vs XLA / hinted: busy | span |", "|" + "---|" * 11]
        for row in r["small_gathers"]:
            t = row["times"]
            lines.append(f"| {_bare_case(row)} | {row.get('dtype', _UNRECORDED)} | "
                         f"{_rotation(row)} | "
                         + " | ".join(f"{t[k]['busy_us']:.2f}" if k in t else "—"
                                      for k in _GATHER_SWEEP)
                         + f" | {_ratios(t, ('xla', 'xla_hinted'), 'busy_us')} | "
                           f"{_ratios(t, ('xla', 'xla_hinted'), 'span_us')} |")
    sweep = r["sweep"]
    lines += ["", f"GB/s by busy time against slab size, each case gathering "
                  f"{size_text(sweep['gathered_bytes'])} of random distinct slabs of a "
                  f"{size_text(sweep['table_bytes'])} {sweep.get('dtype', 'uint32')} table:", "",
              "| slab | auto | tma | simt | XLA | XLA hinted | copy ceiling | auto vs XLA / "
              "hinted: busy | span |", "|" + "---|" * 9]
    for row in sweep["rows"]:
        gbps, t = row["busy_tbps"], row["times"]
        lines.append(f"| {size_text(row['slab_bytes'])} | "
                     + " | ".join(f"{gbps[k] * 1e3:.0f}" for k in _GATHER_SWEEP)
                     + f" | {_ratios(t, ('xla', 'xla_hinted'), 'busy_us')} | "
                       f"{_ratios(t, ('xla', 'xla_hinted'), 'span_us')} |")
    return "\n".join(lines)


def _find(rows: list[dict[str, Any]], key: str, dtype: str | None = None) -> dict | None:
    return next((row for row in rows if _gather_key(row) == key
                 and (dtype is None or row.get("dtype") == dtype)), None)


def render_gather_limits(results: dict[str, tuple[str, dict[str, Any]]]) -> str | None:
    """The README's limits bullet on gather's speed, every number from the
    gather result; None without one."""
    if "gather" not in results:
        return None
    r = results["gather"][1]
    use = r.get("use_dtype")
    device = (r.get("provenance") or {}).get("devices", ["?"])[0]

    def vs(row, comp, clock="busy_us"):
        return _ratio(row["times"], "auto", comp, clock) if row else "—"

    rows, parts = r["rows"], []
    sweep = r["sweep"]["rows"]
    sweep_dtype = r["sweep"].get("dtype", "uint32")
    parts.append(f"over the slab sweep ({sweep_dtype}) `auto` runs at "
                 f"{_range([row['vs']['auto']['xla'] for row in sweep], '{:.2f}')}× "
                 f"`jnp.take` and "
                 f"{_range([row['vs']['auto']['xla_hinted'] for row in sweep], '{:.2f}')}× its "
                 f"hinted form")
    fits = [x for x in (_find(rows, "rows 128", use), _find(rows, "rows 512", use)) if x]
    pages = _find(rows, "pages", use)
    if fits and pages:
        parts.append(f"{use or 'its'} rows of 128–512 B at "
                     f"{_range([x['vs']['auto']['memcpy'] for x in fits], '{:.2f}')}× the copy "
                     f"ceiling, pages at {vs(pages, 'memcpy')}× and {vs(pages, 'xla')}× "
                     f"`jnp.take`")
    page_set = _find(rows, "set", use)
    if page_set:
        parts.append(f"the in-place page set at {vs(page_set, 'xla')}× XLA's `.at[].set` and "
                     f"{vs(page_set, 'xla_hinted')}× its hinted form")
    small = {(_gather_key(x).split()[-1], x.get("dtype")): x for x in r.get("small_gathers", [])}
    for count in ("64", "1024"):
        x = small.get((count, use)) or small.get((count, None))
        if x:
            t = x["times"]
            parts.append(f"a gather of {int(count):,} rows of 2 KiB ({x.get('dtype', 'uint32')}, "
                         f"index sets rotated: {_rotation(x)}) takes {t['auto']['busy_us']:.2f} "
                         f"µs against XLA's {t['xla']['busy_us']:.2f}")
    c = r["chained_tiny_gathers"]
    parts.append(f"one {size_text(c['bytes'])} page chained {c['ops']} times costs "
                 f"{c['gap_us']:+.2f} µs per call over a minimal FFI kernel (by span, L2-warm)")
    decode = _find(rows, "decode")
    if decode:
        text = (f"the paged decode step ({decode.get('dtype', 'bfloat16')} pools) runs at "
                f"{vs(decode, 'xla_hinted')}× its hinted XLA form with K and V as the tables of "
                f"one call")
        if "per_pool" in decode["times"]:
            text += (f", {_ratio(decode['times'], 'per_pool', 'xla_hinted', 'busy_us')}× with "
                     f"a call per pool")
        if "xla_gather_kernels" in decode:
            n = decode["xla_gather_kernels"]["xla_hinted"]
            text += f" (XLA's hinted step gathers both pools in {n} kernel{'s' * (n != 1)})"
        parts.append(text)
    adds = [x for x in rows if _gather_key(x) == "add"]
    if adds:
        parts.append("the row scatter-add runs at " + ", ".join(
            f"{vs(x, 'xla')}× XLA's " + (f"in {x['dtype']}" if "dtype" in x else
                                         f"({x['case']})") for x in adds))
    return (f"- `gather`/`scatter` speed ({device}, GPU busy time, the gather results above; "
            f"ratios are XLA's time ÷ `auto`'s): " + "; ".join(parts) + ". `auto` moves slabs "
            f"of up to 4 KiB and gathers of up to 64 MiB with a thread per 16-byte vector, the "
            f"layout of XLA's own gather kernel, in 32-bit arithmetic where the table allows.")


def render_wheel(r: dict[str, Any]) -> str:
    row = r["rows"][0]
    t = row["times"]
    return (f"{_bare_case(row)} ({row.get('dtype')}), {WALL_NOTE}: `auto` {_us(t['auto'])}, "
            f"XLA `jnp.take` {_us(t['xla'])}, copy ceiling {_us(t['memcpy'])}.")


def _install(r: dict[str, Any]) -> str:
    prov = r.get("provenance") or {}
    if prov.get("install"):
        return prov["install"]
    path = (prov.get("jax_tma") or {}).get("file", "")
    return "source build (gpu_check.sh)" if "jax_tma_source" in path else _UNRECORDED


def _build_cells(r: dict[str, Any]) -> list[str]:
    info = ((r.get("provenance") or {}).get("jax_tma") or {}).get("build_info") or {}
    api = info.get("ffi_api_version")
    runtime = info.get("cuda_runtime_version")
    return [_install(r), f"`{info.get('cuda_archs') or '?'}`",
            ".".join(map(str, api)) if api else "?",
            f"{runtime // 1000}.{runtime % 1000 // 10}" if runtime else "?"]


def render_build(results: dict[str, tuple[str, dict[str, Any]]]) -> str | None:
    """Which build of jax_tma the results measured, and the one case timed
    on the wheel beside it; None without results."""
    measured = [r for op, (_, r) in results.items() if op not in ("wheel", "sanitizer")]
    if not measured:
        return None
    builds = {tuple(_build_cells(r)) for r in measured}
    lines = ["The build these results measured (each result file records its own, "
             "`provenance.jax_tma.build_info`):", "",
             "| install | CUDA architectures | FFI API | CUDA runtime |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in sorted(builds)]
    lines += ["", "Blackwell: the wheels compile `sm_100a`, but no test, sanitizer run or "
                  "benchmark here has run on a Blackwell GPU; every published number is from "
                  "the GPU its provenance line names."]
    wheel = results.get("wheel")
    gather = results.get("gather")
    if wheel is None:
        lines += ["", "No wheel timing at this commit: `scripts/gpu_check.sh bench` times one "
                      "case on the `cp312-abi3` wheel too (`benchmarks/run.py wheel`)."]
        return "\n".join(lines)
    wrow = wheel[1]["rows"][0]
    same = next((row for row in (gather[1]["rows"] if gather else [])
                 if row["case"] == wrow["case"]), None)
    lines += ["", f"One case on the wheel as well, in a run of its own on the same GPU "
                  f"(`{wheel[0]}`), {WALL_NOTE}:", "",
              "| install | CUDA architectures | FFI API | case | `auto` | XLA `jnp.take` | "
              "copy ceiling | auto vs XLA: busy / span |", "|---|---|---|---|---|---|---|---|"]
    for r, row in ((gather[1] if gather else None, same), (wheel[1], wrow)):
        if r is None or row is None:
            continue
        t = row["times"]
        lines.append("| " + " | ".join(_build_cells(r)[:3]) + f" | {_bare_case(row)} "
                     f"({row.get('dtype')}) | {_us(t['auto'])} | {_us(t['xla'])} | "
                     f"{_us(t['memcpy'])} | {_ratio(t, 'auto', 'xla', 'busy_us')} / "
                     f"{_ratio(t, 'auto', 'xla', 'span_us')} |")
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
            cells.append(f"{_mark(x['rc'] == 0)} {summary}{args}")
        lines.append(f"| {prog} | " + " | ".join(cells) + " |")
    probe = r.get("synccheck_cluster_probe")
    if probe:
        lines += ["", f"synccheck's own limit: `tests/cuda/synccheck_cluster_probe.cu` (one "
                      f"`cp.async.bulk` per CTA into its own shared memory between two cluster "
                      f"barriers) at cluster size {probe['cluster']}: "
                      f"{'passes' if probe['rc'] == 0 else 'faults under synccheck'} "
                      f"(`{probe['summary']}`); the broadcast self-test ran synccheck on "
                      f"clusters of up to {r.get('largest_synccheck_cluster', '?')}."]
    return "\n".join(lines)


def _copy_headline(r: dict[str, Any]) -> str:
    row = max((row for row in r["rows"] if row.get("dtype", "uint32") == "uint32"),
              key=lambda row: row["bytes"])
    auto = row["repeat"]["auto"]
    return (f"{auto['tbps']:.2f} TB/s copying {size_text(row['bytes'])}, "
            f"{auto['vs_memcpy']:.2f}× `cudaMemcpyAsync`, {auto['vs_xla']:.2f}× `jnp.copy` "
            f"(by span)")


def _headline(tbps: float, versus: str, case: str) -> str:
    return f"{tbps:.2f} TB/s, {versus}: {case}"


def _window_headline(r: dict[str, Any]) -> str:
    row = r["rows"][0]
    return _headline(row["busy_tbps"]["auto"], f"{row['vs_xla']['auto']:.2f}× XLA", row["case"])


def _im2col_headline(r: dict[str, Any]) -> str:
    row = r["rows"][0]
    vs = row["im2col_vs"]
    return _headline(row["busy_tbps"]["im2col_auto"],
                     f"{vs['xla_patches']:.2f}× `lax.conv_general_dilated_patches`, "
                     f"{vs['xla_slice_concat']:.2f}× slice-and-concatenate",
                     f"3×3 SAME patches of {tuple(row['shape'])} {row['dtype']}")


def _broadcast_headline(r: dict[str, Any]) -> str:
    row = r["rows"][0]
    return _headline(row["busy_tbps"]["auto"], f"{row['auto_vs_xla']:.2f}× `jnp.broadcast_to`",
                     row["case"])


def _slab_headline(key: str, xla: str) -> Callable[[dict[str, Any]], str]:
    def headline(r: dict[str, Any]) -> str:
        row = _find(r["rows"], key, r.get("use_dtype")) or _find(r["rows"], key)
        pages = _find(r["rows"], "pages", row.get("dtype"))
        t = row["times"]
        # The in-place case names "those pages" of the gather case before it.
        case = re.sub(r"those [\d,]+ pages", _bare_case(pages).split(" ", 1)[1],
                      _bare_case(row)) if pages else _bare_case(row)
        return _headline(row["busy_tbps"]["auto"],
                         f"{_ratio(t, 'auto', 'xla', 'busy_us')}× {xla}, "
                         f"{_ratio(t, 'auto', 'memcpy', 'busy_us')}× the copy ceiling",
                         f"{case} ({row.get('dtype', 'uint32')})")
    return headline


def _ppermute_headline(r: dict[str, Any]) -> str:
    row = r["rows"][-1]
    return (f"{row['auto_gbps']:.1f} GB/s per direction, {row['auto_vs_nccl']:.2f}× "
            f"`lax.ppermute` (NCCL), by span: {row['block_mib']:g} MiB blocks")


# The README's table of ops: (op, what it does, the result its headline is
# drawn from, the headline of that result).
_HEADLINES = (
    ("copy", "a new buffer equal to `x`, bit for bit", "copy", _copy_headline),
    ("window", "a strided box at any (traced) start; out of bounds reads a fill", "window",
     _window_headline),
    ("im2col", "convolution patches, GEMM-ready (`col2im`: their transpose)", "im2col",
     _im2col_headline),
    ("broadcast", "`n` materialised replicas, each input tile read once", "broadcast",
     _broadcast_headline),
    ("gather", "whole slabs (rows, pages) picked by index", "gather",
     _slab_headline("pages", "`jnp.take`")),
    ("scatter", "slabs set or added by index, in place", "gather",
     _slab_headline("set", "`x.at[i].set`")),
    ("ppermute", "each device's block to its peer, GPU to GPU", "ppermute", _ppermute_headline),
)
_OP_PAGE = {"scatter": "gather", "col2im": "im2col"}


def render_headline(results: dict[str, tuple[str, dict[str, Any]]]) -> str:
    """The README's table of ops, one headline number each from the results,
    and where and how they were measured."""
    lines = ["| op | what it does | `auto`, on the GPU below |", "|---|---|---|"]
    used = []
    for op, what, source, headline in _HEADLINES:
        if source in results:
            used.append(results[source][1])
            number = headline(results[source][1])
        else:
            number = "no result at this commit" + (" (it needs two GPUs)"
                                                   if op == "ppermute" else "")
        lines.append(f"| [`{op}`](docs/ops/{_OP_PAGE.get(op, op)}.md) | {what} | {number} |")
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


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "copy": render_copy, "tune-bulk": render_tune_bulk, "window": render_window,
    "im2col": render_im2col, "broadcast": render_broadcast,
    "broadcast-ncu": render_broadcast_ncu, "ppermute": render_ppermute, "gather": render_gather,
    "wheel": render_wheel, "sanitizer": render_sanitizer}
# Sections drawn from several results (None: nothing to draw from).
DERIVED: dict[str, Callable[[dict[str, tuple[str, dict[str, Any]]]], str | None]] = {
    "build": render_build, "gather-limits": render_gather_limits, "headline": render_headline}
# What writes each op's result, for the sections that have none yet.
_WRITTEN_BY = {"sanitizer": "`scripts/gpu_check.sh sanitize` (its `bench_sanitize.tgz`)",
               "wheel": "`scripts/gpu_check.sh bench` (`benchmarks/run.py wheel` against the "
                        "wheel)"}


def render(r: dict[str, Any], path: str | None = None) -> str:
    """One op's README section: where it was measured, then its tables."""
    text = RENDERERS[r["op"]](r)
    if path is not None:
        text = _provenance_line(path, r) + "\n\n" + text
    differs = r.get("comparator_differs") or {}
    if differs:
        text += ("\n\nXLA comparators whose output differs from the bit-exact reference "
                 "(timed all the same): ") + "; ".join(
            f"{k}: {v}" for k, v in differs.items())
    return text


def render_sections(text: str, results: dict[str, tuple[str, dict[str, Any]]]) -> str:
    """`text` (a page) with every bench section rewritten from `results`."""
    def section(m: re.Match) -> str:
        op = m["op"]
        if op in DERIVED:
            body = DERIVED[op](results) or f"No results at this commit to draw `{op}` from."
        elif op not in RENDERERS:
            raise ValueError(f"section bench:{op}: no such benchmark")
        elif op in results:
            body = render(results[op][1], results[op][0])
        else:
            body = (f"No `{op}` result at this commit: "
                    + _WRITTEN_BY.get(op, "`python benchmarks/run.py all --out-dir "
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
    """Copy TB/s over size, broadcast TB/s per method and gather GB/s over
    slab size, as PNG files in `out_dir` (none without matplotlib); returns
    their paths."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report.py: no matplotlib, no plots", file=sys.stderr)
        return []
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    if "copy" in results:
        # The sizes of one dtype (the uint32 sweep; the bf16 row is a point
        # of comparison in the table).
        rows = [row for row in results["copy"][1]["rows"] if row.get("dtype", "uint32") == "uint32"]
        fig, ax = plt.subplots(figsize=(7, 4))
        for case in rows[0]["repeat"]:
            ax.plot([row["bytes"] / MIB for row in rows],
                    [row["repeat"][case]["tbps"] for row in rows], marker="o", label=case)
        ax.set(xscale="log", xlabel="MiB copied", ylabel="TB/s (read + write, by span)",
               title="jax_tma.copy of uint32 arrays, repeated calls")
        ax.legend()
        paths.append(os.path.join(out_dir, "copy_tbps.png"))
        fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
    if "broadcast" in results:
        row = results["broadcast"][1]["rows"][0]
        fig, ax = plt.subplots(figsize=(7, 4))
        labels = list(row["busy_tbps"])
        ax.bar(labels, [row["busy_tbps"][k] for k in labels])
        ax.set(ylabel="TB/s (read + write, by busy time)", title=row["case"])
        ax.tick_params(axis="x", rotation=60)
        paths.append(os.path.join(out_dir, "broadcast_tbps.png"))
        fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
    if "gather" in results:
        r = results["gather"][1]
        rows = r["sweep"]["rows"]
        sizes = [row["slab_bytes"] for row in rows]
        fig, ax = plt.subplots(figsize=(7, 4))
        for case, label in _GATHER_SWEEP.items():
            ax.plot(sizes, [row["busy_tbps"][case] * 1e3 for row in rows], marker="o",
                    linestyle="--" if case == "memcpy" else "-", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [size_text(b) for b in sizes], rotation=45)
        ax.set(xlabel="slab size", ylabel="GB/s (read + write, by busy time)",
               title=f"gather of random slabs of a {size_text(r['sweep']['table_bytes'])} "
                     f"{r['sweep'].get('dtype', 'uint32')} table, "
                     f"{r['provenance']['devices'][0]}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        paths.append(os.path.join(out_dir, "gather_gbps.png"))
        fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
    return paths


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
                        help="with --check: do not compare the results' commit with HEAD")
    parser.add_argument("--plots", metavar="DIR", help="also write plots here")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="render dirty-tree and smoke results too")
    parser.add_argument("--allow-mixed-commits", action="store_true")
    parser.add_argument("--unmeasured", metavar="PATH",
                        help=f"record in {UNMEASURED} that HEAD's code of PATH was not measured "
                             f"(with --why: why no measured program differs)")
    parser.add_argument("--why", help="with --unmeasured: the reason")
    args = parser.parse_args(argv)
    results = load_results(args.results)
    if args.unmeasured:
        if not args.why:
            parser.error("--unmeasured needs --why")
        record_unmeasured(results, args.unmeasured, args.why)
        return 0
    check_results(results, args.allow_dirty, args.allow_mixed_commits)
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
