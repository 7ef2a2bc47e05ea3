"""How the host-cost benchmark's results read (bench_host_cost.py writes
them): the `host-cost` section, a row per op with its µs per call and its
gap over the minimal FFI kernel under each flag setting."""

from __future__ import annotations

from typing import Any

from tables import num_text

# The family whose code these results measure (report.py's staleness): None,
# every family's (each op's handler is timed).
FAMILY = None

_SETTINGS = {"default": "default flags",
             "command_buffers": "command buffers forced"}


def render_host_cost(r: dict[str, Any]) -> str:
    settings = [name for name in _SETTINGS if name in r["settings"]]
    minimal = r["minimal"]
    head = ["op", "launches"]
    for name in settings:
        head += [f"{_SETTINGS[name]}: wall µs", "gap µs", "met", "span µs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    first = r["settings"][settings[0]]["cases"]
    for case in first:
        c = r["settings"][settings[0]]["cases"][case]
        row = [f"{case} (minimal)" if case == minimal else case, num_text(c["launches"], 2)]
        for name in settings:
            c = r["settings"][name]["cases"][case]
            row += [f"{c['wall_us']:.2f}", "—" if case == minimal else f"{c['gap_us']:+.2f}",
                    "—" if case == minimal else ("yes" if c["target_met"] else "no"),
                    num_text(c.get("span_us"), 2)]
        lines.append("| " + " | ".join(row) + " |")
    flags = "; ".join(f"{_SETTINGS[n]}: `XLA_FLAGS={r['settings'][n]['xla_flags']}`"
                      for n in settings)
    lines += ["", f"Per call, in a jitted chain of {r['chain_ops']} calls on "
              f"{r['bytes'] >> 10} KiB of {r['dtype']}, each on the previous call's output: "
              f"the wall clock (calls dispatched without waiting, one sync; the median of "
              f"{r['settings'][settings[0]]['protocol']['wall']['samples']} samples, the cases "
              f"in turns) and the GPU span; the gap is the wall clock's over the minimal FFI "
              f"kernel's ({r['cases_described'][minimal]}), target ≤ {r['target_gap_us']:g} µs. "
              f"Launches: GPU activities per call in a profiler trace under the default flags. "
              f"Where the span reaches the wall clock, the GPU, not the host, bounds the "
              f"chain. One worker process per setting ({flags})."]
    return "\n".join(lines)


RENDERERS = {"host-cost": render_host_cost}
WRITTEN_BY = {"host-cost": "`python benchmarks/run.py host-cost --out-dir benchmarks/results`"}
