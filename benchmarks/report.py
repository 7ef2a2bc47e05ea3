"""Renders the README's benchmark tables from the result JSON files, so that
every published number comes from a file that benchmarks/run.py wrote.

    python benchmarks/report.py            # rewrite README.md's bench sections
    python benchmarks/report.py --check    # exit 1 if README.md differs from the results
    python benchmarks/report.py --plots benchmarks/plots   # also plots (needs matplotlib)

The README holds one section per op between `<!-- bench:OP -->` and
`<!-- /bench:OP -->`; everything between them is this script's output. The
results must be one file per op, from one commit, clean and not smoke runs;
a file written before results recorded their provenance is rendered as such.
"""

from __future__ import annotations

import argparse
import difflib
import glob
import json
import os
import re
import sys
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
README = os.path.join(ROOT, "README.md")
MIB = 1 << 20
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
            f"(`{path}`)")


def _us(t: dict[str, float]) -> str:
    return f"{t['busy_us']:.1f} / {t['span_us']:.1f}"


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
    head = ["size", "auto", "bulk", "simt", "seed-style TMA", "XLA `jnp.copy`",
            "cudaMemcpyAsync", "auto vs XLA, repeated",
            "after a write: auto vs XLA (bulk vs cudaMemcpyAsync)"]
    lines = ["TB/s by span in the repeated regime (vs cudaMemcpyAsync in parentheses), then "
             "`auto` vs XLA in both regimes:", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in r["rows"]:
        rep, after = row["repeat"], row["after_write"]
        cells = [size_text(row["bytes"])]
        cells += [f"{rep[c]['tbps']:.2f} ({rep[c]['vs_memcpy']:.3f}×)" for c in cases]
        cells.append(f"{rep['auto']['vs_xla']:.3f}×")
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
    lines += ["", f"{chain['bulk']['ops']} chained 1 KiB copies inside one `jit`: "
                  f"{chain['bulk']['us_per_op']:.2f} µs per op (bulk), "
                  f"{chain['simt']['us_per_op']:.2f} µs per op (simt), by span."]
    rep = [row["repeat"]["auto"]["vs_xla"] for row in r["rows"]]
    after = [row["after_write"]["auto"]["vs_xla"] for row in r["rows"]]
    lines += ["", f"`auto` vs XLA over these sizes: {_range(rep)}× repeated, "
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
    lines = ["GPU busy / span µs per call; TB/s and ratios by busy time:", "",
             "| case | auto hands the handler | auto | tma | simt | XLA | copy ceiling | "
             "auto TB/s | vs XLA: auto / tma / simt | auto vs ceiling |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        t = row["times"]
        cell = {m: _us(t[m]) if m in t else "—" for m in ("auto", "tma", "simt")}
        vs = " / ".join(f"{row['vs_xla'][m]:.2f}" if m in t else "—"
                        for m in ("auto", "tma", "simt"))
        lines.append(f"| {row['case']} | `method=\"{row['auto_lowered_method']}\"` | "
                     f"{cell['auto']} | {cell['tma']} | {cell['simt']} | {_us(t['xla'])} | "
                     f"{_us(t['memcpy'])} | {row['busy_tbps']['auto']:.2f} | {vs} | "
                     f"{row['vs_ceiling']['auto']:.2f} |")
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
    lines = ["GPU busy / span µs per call; TB/s and ratios by busy time:", "",
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
    lines = ["GPU busy / span µs per call (TB/s by busy time):", "",
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


def _mark(met: bool) -> str:
    return "✓" if met else "✗"


def render_gather(r: dict[str, Any]) -> str:
    cols = ("auto", "tma", "simt", "deterministic", "xla", "xla_hinted", "memcpy")
    lines = ["GPU busy / span µs per call; TB/s and ratios by busy time; issue 18's target for "
             "`auto`, met (✓) or not (✗):", "",
             "| case | auto | tma | simt | deterministic | XLA | XLA hinted | copy ceiling | "
             "auto TB/s | auto vs ceiling | auto vs XLA / hinted | target |",
             "|" + "---|" * 12]
    for row in r["rows"]:
        t, vs = row["times"], row["vs"]["auto"]
        cells = [row["case"]] + [_us(t[k]) if k in t else "—" for k in cols]
        cells += [f"{row['busy_tbps']['auto']:.2f}", f"{vs['memcpy']:.2f}",
                  " / ".join(f"{vs[k]:.2f}" if k in vs else "—" for k in ("xla", "xla_hinted")),
                  ", ".join(f"≥ {v:g}× {_GATHER_LABELS[c]} {_mark(row['targets_met'][c])}"
                            for c, v in row["targets"].items())]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "XLA formulations:"]
    lines += [f"- {kind}: " + "; ".join(f"{_GATHER_LABELS[k]} `{code}`" for k, code in f.items())
              for kind, f in r["xla_formulations"].items()]
    lines += [f"- {row['case'].split(':')[0]}, auto: both pools as the tables of one "
              f"`jax_tma.scatter` and one `jax_tma.gather`; with a call per pool instead: "
              f"{_us(row['times']['per_pool'])} µs busy / span "
              f"({row['vs']['per_pool']['xla_hinted']:.2f}× XLA hinted)" for row in r["rows"] if "per_pool" in row["times"]]
    c = r["chained_tiny_gathers"]
    g, m = c["per_op"]["gather"], c["per_op"]["minimal_ffi"]
    lines += ["", f"{c['ops']} chained gathers of one {size_text(c['bytes'])} page in one "
                  f"`jit`: {g['span_us']:.2f} µs per call by span ({g['busy_us']:.2f} busy); "
                  f"{c['minimal_ffi']} of the same page (a minimal FFI kernel) chained alike: "
                  f"{m['span_us']:.2f} µs ({m['busy_us']:.2f}); the gather costs "
                  f"{c['gap_us']:+.2f} µs per call more (target ≤ {c['target_gap_us']:g} µs "
                  f"{_mark(c['target_met'])})."]
    others = [f"`method='{k[len('gather_'):]}'` {v['span_us']:.2f} µs ({v['busy_us']:.2f})"
              for k, v in c["per_op"].items() if k.startswith("gather_")]
    if others:
        lines[-1] += " The other methods, chained alike: " + ", ".join(others) + "."
    if "small_gathers" in r:
        lines += ["", "Small gathers, GPU busy µs per call (the profiler's clock ticks every "
                      "32 ns):", "",
                  "| case | auto | tma | simt | XLA | XLA hinted | copy ceiling | auto vs XLA / "
                  "hinted |", "|" + "---|" * (len(_GATHER_SWEEP) + 2)]
        for row in r["small_gathers"]:
            busy = {k: row["times"][k]["busy_us"] for k in _GATHER_SWEEP}
            lines.append(f"| {row['case']} | " + " | ".join(f"{busy[k]:.2f}" for k in _GATHER_SWEEP)
                         + f" | {busy['xla'] / busy['auto']:.2f} / "
                           f"{busy['xla_hinted'] / busy['auto']:.2f} |")
    sweep = r["sweep"]
    lines += ["", f"GB/s by busy time against slab size, each case gathering "
                  f"{size_text(sweep['gathered_bytes'])} of random distinct slabs of a "
                  f"{size_text(sweep['table_bytes'])} table:", "",
              "| slab | auto | tma | simt | XLA | XLA hinted | copy ceiling | auto vs XLA / "
              "hinted |", "|" + "---|" * 8]
    for row in sweep["rows"]:
        gbps, vs = row["busy_tbps"], row["vs"]["auto"]
        lines.append(f"| {size_text(row['slab_bytes'])} | "
                     + " | ".join(f"{gbps[k] * 1e3:.0f}" for k in _GATHER_SWEEP)
                     + f" | {vs['xla']:.2f} / {vs['xla_hinted']:.2f} |")
    return "\n".join(lines)


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "copy": render_copy, "tune-bulk": render_tune_bulk, "window": render_window,
    "im2col": render_im2col, "broadcast": render_broadcast,
    "broadcast-ncu": render_broadcast_ncu, "ppermute": render_ppermute, "gather": render_gather}


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


def render_readme(text: str, results: dict[str, tuple[str, dict[str, Any]]]) -> str:
    """`text` with every bench section rewritten from `results`."""
    def section(m: re.Match) -> str:
        op = m["op"]
        if op not in RENDERERS:
            raise ValueError(f"README section bench:{op}: no such benchmark")
        body = (render(results[op][1], results[op][0]) if op in results else
                f"No `{op}` result at this commit: `python benchmarks/run.py all --out-dir "
                f"benchmarks/results` writes it.")
        return f"{m.group(1)}{body}\n{m.group(4)}"
    return _SECTION.sub(section, text)


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
        rows = results["copy"][1]["rows"]
        fig, ax = plt.subplots(figsize=(7, 4))
        for case in rows[0]["repeat"]:
            ax.plot([row["bytes"] / MIB for row in rows],
                    [row["repeat"][case]["tbps"] for row in rows], marker="o", label=case)
        ax.set(xscale="log", xlabel="MiB copied", ylabel="TB/s (read + write, by span)",
               title="jax_tma.copy, repeated calls")
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
                     f"table, {r['provenance']['devices'][0]}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        paths.append(os.path.join(out_dir, "gather_gbps.png"))
        fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/report.py")
    parser.add_argument("--results", default=RESULTS, help="the result JSON files' folder")
    parser.add_argument("--readme", default=README)
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if the README's sections differ")
    parser.add_argument("--plots", metavar="DIR", help="also write plots here")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="render dirty-tree and smoke results too")
    parser.add_argument("--allow-mixed-commits", action="store_true")
    args = parser.parse_args(argv)
    results = load_results(args.results)
    check_results(results, args.allow_dirty, args.allow_mixed_commits)
    with open(args.readme) as f:
        old = f.read()
    new = render_readme(old, results)
    if args.check:
        if new != old:
            sys.stdout.writelines(difflib.unified_diff(
                old.splitlines(True), new.splitlines(True), args.readme, "rendered"))
            print(f"{args.readme}: the benchmark sections differ from {args.results}: run "
                  f"python benchmarks/report.py", file=sys.stderr)
            return 1
        return 0
    if new != old:
        with open(args.readme, "w") as f:
            f.write(new)
        print(f"rewrote the benchmark sections of {args.readme}")
    for path in plot(results, args.plots) if args.plots else []:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
