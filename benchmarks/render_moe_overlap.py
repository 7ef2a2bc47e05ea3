"""How the overlap benchmark's results read (bench_moe_overlap.py writes
them, on every GPU there is): the `moe_overlap` section of docs/ops/moe.md, which
report.py collects from RENDERERS and WRITTEN_BY."""

from __future__ import annotations

from typing import Any

from tables import num_text, wall_shown

# The family whose code these results measure (report.py's staleness): the
# MoE ops are compositions of ppermute's exchanges, and of its family.
FAMILY = "ppermute"

_LABELS = {
    "gemm": "the GEMM alone",
    "dispatch": "`moe_dispatch` alone",
    "serial": "both, one program, as a user writes it",
    "stream": "both, the GEMM under `compute_on(\"gpu_stream:1\")`",
    "stream_no_graphs": "both, the GEMM under `compute_on(\"gpu_stream:1\")`, XLA's command "
                        "buffers off",
    "stream_no_graphs_lhs": "as above, with XLA's latency-hiding scheduler",
}


def _label(case: str) -> str:
    if case.startswith("stream_sms"):
        return f"as above, `num_sms={case.removeprefix('stream_sms')}`"
    return _LABELS[case]


def _hidden_text(hidden: dict[str, Any] | None, clock: str) -> str:
    h = (hidden or {}).get(clock)
    if h is None:
        return "—"
    return f"{h['us']:.1f} µs ({100 * h['of_shorter']:.0f} %)"


def render_moe_overlap(r: dict[str, Any]) -> str:
    devices = ", ".join(dict.fromkeys(r["devices"]))
    lines = []
    for row in r["rows"]:
        where = {True: "keeps its stream annotation in XLA's compiled program",
                 False: "loses its stream annotation in XLA's compiled program",
                 None: "did not run (the table says why)"}[row["gemm_on_its_stream"]]
        lines += [
            (f"{r['n']} × {devices}, one process, {r['dtype']}: `moe_dispatch` at {row['what']} "
             f"({row['tokens']} tokens of {row['hidden']} per GPU) and an independent GEMM, "
             f"{row['gemm']}, in one jitted program a step; under `compute_on` the GEMM "
             f"{where}. {r['repetitions']} interleaved run(s), every case checked bit for bit "
             f"against the serial one first. µs per step: busy / span / wall (the wall clock "
             f"where the busy time is 100 µs at least). Hidden: {r['hid_rule']}."), "",
            "| case | busy / span / wall µs | hidden, by span | hidden, by wall |",
            "|---|---|---|---|"]
        for case in r["cases"]:
            t = row["times"].get(case)
            if t is None:
                why = row["failed"].get(case)
                lines.append(f"| {_label(case)} | {'failed: ' + why if why else 'not measured'} "
                             f"| — | — |")
                continue
            wall = t["wall_us"] if wall_shown(t) else None
            clocks = " / ".join(num_text(x) for x in (t["busy_us"], t["span_us"], wall))
            hidden = row["hid"].get(case)
            lines.append(f"| {_label(case)} | {clocks} | {_hidden_text(hidden, 'span')} | "
                         f"{_hidden_text(hidden, 'wall')} |")
        for case, streams in row["streams"].items():
            if streams:
                label = _label(case)
                lines += ["", f"{label[:1].upper()}{label[1:]}: GPU busy µs per step by stream "
                              f"(a trace of {len(streams)} stream(s)): " + ", ".join(
                                  f"{name} {us:.1f}" for name, us in streams.items()) + "."]
    return "\n".join(lines)


RENDERERS = {"moe_overlap": render_moe_overlap}
WRITTEN_BY = {
    "moe_overlap": "`python benchmarks/run.py moe_overlap --out-dir benchmarks/results` (every "
                   "GPU there is, one at least; not in `all`)",
}
