"""How the MoE benchmark's results read (bench_moe.py writes them, on two
GPUs): the `moe` section (one process driving every GPU), the
`moe_processes` section (one process per GPU), the account of issue 43's
targets and the README's headline row, which report.py collects from
RENDERERS, DERIVED, HEADLINES and WRITTEN_BY."""

from __future__ import annotations

import functools
from typing import Any

from tables import (WALL_MIN_US, Headline, clock_names, clocks_text, loop_busy_text, num_text,
                    ratio_clocks_text, timeline_lines)

# The family whose code these results measure (report.py's staleness): the
# MoE ops are compositions of ppermute's exchanges, and of its family.
FAMILY = "ppermute"

LABELS = {
    "dispatch": "`moe_dispatch`",
    "combine": "`moe_combine`",
    "pair": "`moe_dispatch` + `moe_combine`",
    "a2a": "`jax_tma.all_to_all` of n·T rows",
    "dense_dispatch": "dense `lax.all_to_all`: dispatch",
    "dense_combine": "dense `lax.all_to_all`: combine",
    "dense_pair": "dense `lax.all_to_all`: both",
    "lax_dispatch": "`lax.ragged_all_to_all` route: dispatch",
    "lax_combine": "`lax.ragged_all_to_all` route: combine",
    "lax_pair": "`lax.ragged_all_to_all` route: both",
}
# The ratio columns: (key, heading).
RATIOS = (
    ("dispatch_vs_lax_dispatch", "dispatch vs the `lax.ragged_all_to_all` route"),
    ("combine_vs_lax_combine", "combine vs the `lax.ragged_all_to_all` route"),
    ("pair_vs_lax_pair", "both vs the `lax.ragged_all_to_all` route"),
    ("dispatch_vs_dense_dispatch", "dispatch vs dense"),
    ("combine_vs_dense_combine", "combine vs dense"),
    ("pair_vs_dense_pair", "both vs dense"),
    ("dispatch_vs_a2a", "dispatch vs `jax_tma.all_to_all` of the same bytes"),
)
_MODES = {
    "moe": "one process drives every GPU",
    "moe_processes": "one process per GPU under `jax.distributed` (every GPU visible, each "
                     "process given its own with `local_device_ids`); worker 0's clocks of its "
                     "own GPU",
}
# Issue 43's targets, at DeepEP's shape (the row "deepep"), counted as
# DeepEP counts: GB/s per GPU of dispatch and combine, and DeepEP's own
# (its tests' tuned dispatch and combine on 8 × H100, NVLink); the speed-up
# over the lax.ragged_all_to_all route in one process; at the decode shape,
# the dispatch's span at most this many times one jax_tma.all_to_all's of
# the same bytes.
DISPATCH_GBPS, COMBINE_GBPS = 300, 280
DEEPEP_GBPS = {"dispatch": 329, "combine": 287}
LAX_SPEEDUP = 50
DECODE_SPAN = 2


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.1f} MB"


def _ratio_cell(row: dict[str, Any], key: str) -> str:
    ratio = row["ratios"].get(key)
    if ratio is None:
        return "—"
    a, b = key.split("_vs_")
    return ratio_clocks_text(ratio, row["times"][a], row["times"][b])


def _shape_text(row: dict[str, Any]) -> str:
    local = row["experts"] // row["n"]
    pairs = sum(row["recv_pairs"]) / row["n"]
    link = sum(row["link_pairs"]) / row["n"]
    return (f"**{row['what']}** ({row['tokens']} tokens of {row['hidden']} per GPU, "
            f"{row['experts']} experts, {local} per GPU): a GPU receives {pairs:.0f} token "
            f"copies ({_mb(row['deepep_bytes']['dispatch'])}), {link:.0f} of them from the "
            f"other GPU{'s' * (row['n'] > 2)}; the dense route's capacity is "
            f"{row['capacity']} rows per expert ({row['capacity_factor']:.2f}× the mean).")


def _cases(r: dict[str, Any], row: dict[str, Any]) -> list[str]:
    return [c for c in r["cases"] if c in row["times"] or c in row["failed"]]


def render_moe(r: dict[str, Any]) -> str:
    devices = ", ".join(dict.fromkeys(r["devices"]))
    lines = [
        f"{r['n']} × {devices}, {_MODES[r['op']]}. {r['dtype']} tokens, each token's top-k "
        f"experts by random scores (as DeepEP's tests route), a fixed seed, nothing dropped. "
        f"**GB/s per GPU as DeepEP counts them**: the bytes of the tokens a GPU receives, one "
        f"copy per token and destination device (its own included), the mean over the GPUs, "
        f"by span (the pair counts them twice, the all_to_all every row it receives). "
        f"NVLink: what a GPU receives from the other in each formulation's own rows. The "
        f"lax routes: a sort by expert, the counts exchanged, `lax.ragged_all_to_all` and a "
        f"permute into expert order, and back (k rows a token); dense: every choice in its "
        f"expert's padded slots, one `lax.all_to_all` each way. {r['repetitions']} interleaved "
        f"run(s) of the fast cases, the `lax.ragged_all_to_all` route once "
        f"({r['sparse_rounds']} calls); every case checked bit for bit first. µs per call: "
        f"{clock_names(r)} (the wall clock: {r['wall_calls_rule']}, shown from "
        f"{WALL_MIN_US:g} µs of busy time; the loop {r['loop_rule']}{loop_busy_text(r)})."]
    for row in r["rows"]:
        lines += ["", _shape_text(row), "",
                  "| case | µs per call | GB/s per GPU (DeepEP's count) | NVLink per GPU | "
                  "NVLink GB/s |", "|---|---|---|---|---|"]
        for c in _cases(r, row):
            if c in row["failed"]:
                lines.append(f"| {LABELS[c]} | failed | — | — | — |")
                continue
            lines.append(f"| {LABELS[c]} | {clocks_text(row['times'][c])} | "
                         f"{num_text(row['deepep_gbps'][c]['span'])} | "
                         f"{_mb(row['link_bytes'][c])} | {num_text(row['link_gbps'][c]['span'])} |")
        lines += timeline_lines(row.get("timeline"), LABELS)
    ratios = [(k, h) for k, h in RATIOS if any(k in row["ratios"] for row in r["rows"])]
    if ratios:
        lines += ["", f"Ratios, {clock_names(r)}: *A vs B* is B's time ÷ A's (above 1, A "
                      f"is faster), of the median times:", "",
                  "| shape | " + " | ".join(h for _, h in ratios) + " |",
                  "|---|" + "---|" * len(ratios)]
        for row in r["rows"]:
            lines.append(f"| {row['shape']} | "
                         + " | ".join(_ratio_cell(row, k) for k, _ in ratios) + " |")
    notes = _failures(r)
    notes += [f"lowered to `lax` here, not measured as jax_tma's: {x}"
              for x in r["lowerings"] if ": lax." in x]
    notes += [f"no profiler clocks in process {pid}: {why}"
              for pid, why in (r.get("untraced") or {}).items()]
    if notes:
        lines += [""] + [f"- {note}" for note in notes]
    return "\n".join(lines)


def _failures(r: dict[str, Any]) -> list[str]:
    """One line per case that failed, with the shapes and why."""
    why: dict[str, dict[str, list[str]]] = {}
    for row in r["rows"]:
        for case, text in row["failed"].items():
            why.setdefault(case, {}).setdefault(text, []).append(row["shape"])
    return [f"{LABELS[case]} failed ({', '.join(shapes)}): {text}"
            for case, texts in why.items() for text, shapes in texts.items()]


def _find(r: dict[str, Any], shape: str) -> dict[str, Any] | None:
    return next((row for row in r["rows"] if row["shape"] == shape), None)


def _gbps(row: dict[str, Any] | None, case: str, clock: str) -> float | None:
    if row is None or case not in row["deepep_gbps"]:
        return None
    return row["deepep_gbps"][case][clock]


def _met(values: list[float | None], at_least: float) -> str:
    known = [v for v in values if v is not None]
    return "✓" if known and len(known) == len(values) and min(known) >= at_least else "✗"


def render_targets(results: dict[str, tuple[str, dict[str, Any]]],
                   suffix: str = "") -> str | None:
    """moe's page's account of issue 43's targets, every number from the
    results of GPUs `suffix` (report.py's keys: "" or "@4x-h200"; one
    process, and one process per GPU beside where there is one); None
    without the one-process result."""
    if f"moe{suffix}" not in results:
        return None
    one = results[f"moe{suffix}"][1]
    procs = results.get(f"moe_processes{suffix}", (None, None))[1]
    prov = one.get("provenance") or {}
    def where(mode: str, r: dict[str, Any]) -> str:
        commit = str((r.get("provenance") or {}).get("commit", "?"))[:7]
        return f"{mode}, {r['n']} × {r['devices'][0]} ({commit})"

    modes = [(where("one process", one), one)] + (
        [(where("one process per GPU", procs), procs)] if procs else [])
    lines = [f"From the result file(s) above ({str(prov.get('date', '?'))[:10]}); a "
             f"target is met where busy time and span both reach it:", "",
             "| target | mode | measured (busy / span) | met |", "|---|---|---|---|"]
    for case, target in (("dispatch", DISPATCH_GBPS), ("combine", COMBINE_GBPS)):
        for mode, r in modes:
            row = _find(r, "deepep")
            values = [_gbps(row, case, c) for c in ("busy", "span")]
            lines.append(f"| {case} ≥ {target} GB/s per GPU at DeepEP's shape, DeepEP's count "
                         f"(DeepEP: {DEEPEP_GBPS[case]} on 8 × H100) | {mode} | "
                         f"{' / '.join(num_text(v) for v in values)} GB/s | "
                         f"{_met(values, target)} |")
    for shape in ("deepep", "deepep_256"):
        row = _find(one, shape)
        for case in ("dispatch", "combine"):
            ratio = (row or {}).get("ratios", {}).get(f"{case}_vs_lax_{case}")
            values = [ratio.get(c) if ratio else None for c in ("busy", "span")]
            lines.append(f"| {case} ≥ {LAX_SPEEDUP}× the `lax.ragged_all_to_all` route "
                         f"({shape}) | {modes[0][0]} | "
                         f"{' / '.join(num_text(v, 1) for v in values)}× | "
                         f"{_met(values, LAX_SPEEDUP)} |")
    for mode, r in modes:
        row = _find(r, "decode")
        ratio = (row or {}).get("ratios", {}).get("dispatch_vs_a2a")
        # dispatch_vs_a2a is the all_to_all's time ÷ the dispatch's: the
        # dispatch within DECODE_SPAN× where it is at least 1/DECODE_SPAN.
        values = [1 / ratio[c] if ratio and ratio.get(c) else None for c in ("busy", "span")]
        met = "✓" if values[1] is not None and values[1] <= DECODE_SPAN else "✗"
        times = (row or {}).get("times", {})
        gaps = (row or {}).get("launch_gap_us", {})
        spans = ", ".join(f"{LABELS[c]} {num_text(times[c]['span_us'])} µs by span, "
                          f"{num_text(times[c].get('loop_us'))} by the loop clock"
                          + (f", its GPUs' launches {num_text(gaps[c])} µs apart" if c in gaps
                             else "")
                          for c in ("dispatch", "a2a") if c in times)
        lines.append(f"| decode dispatch's span ≤ {DECODE_SPAN}× one `jax_tma.all_to_all` of "
                     f"the same bytes | {mode} | {' / '.join(num_text(v, 2) for v in values)}× "
                     f"({spans}) | {met} |")
    return "\n".join(lines)


def _headline(r: dict[str, Any]) -> str:
    row = _find(r, "deepep")
    if row is None or "dispatch" not in row["deepep_gbps"]:
        return f"failed: {(row or {}).get('failed', {}).get('dispatch', 'not measured')}"
    text = (f"dispatch {num_text(_gbps(row, 'dispatch', 'span'))}, combine "
            f"{num_text(_gbps(row, 'combine', 'span'))} GB/s per GPU as DeepEP counts, by span")
    ratio = row["ratios"].get("dispatch_vs_lax_dispatch")
    if ratio and ratio.get("span"):
        text += f"; dispatch {ratio['span']:.1f}× the `lax.ragged_all_to_all` route"
    return (f"{text}: DeepEP's shape ({row['tokens']} tokens of {row['hidden']} bf16, top-"
            f"{row['k']} of {row['experts']} experts) on {row['n']} GPUs, in one process")


RENDERERS = {"moe": render_moe, "moe_processes": render_moe}
DERIVED = {"moe-targets": render_targets,
           "moe-targets@4x-h200": functools.partial(render_targets, suffix="@4x-h200")}
HEADLINES = (Headline(9, "moe_dispatch", "tokens to their experts' devices, grouped by "
                      "expert, and home as weighted sums (`moe_combine`)", "moe", _headline,
                      page="moe", no_result="no result at this commit (it needs two GPUs)"),)
# The commands that write the results (they are not in `run.py all`).
WRITTEN_BY = {
    "moe": "`python benchmarks/run.py moe --out-dir benchmarks/results` (two GPUs; not in "
           "`all`; `run.py ep` runs it with `moe_processes`)",
    "moe_processes": "`python benchmarks/run.py moe_processes --out-dir benchmarks/results` "
                     "(two GPUs; not in `all`; `run.py ep` runs it with `moe`)",
}
