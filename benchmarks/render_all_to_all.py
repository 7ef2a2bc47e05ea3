"""How the all_to_all benchmark's results read (bench_all_to_all.py writes
them, on two GPUs): the `all_to_all` section (one process driving both
GPUs), the `all_to_all_processes` section (one process per GPU) and the
README's headline row, which report.py collects from RENDERERS, HEADLINES
and WRITTEN_BY."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from tables import (MIB, WALL_MIN_US, Headline, clock_names, clocks_text, loop_busy_text,
                    num_text, range_text, ratio_clocks_text, size_text, timeline_lines)

# The family whose code these results measure (report.py's staleness):
# all_to_all runs on ppermute's transport, and is of its family.
FAMILY = "ppermute"

LABELS = {
    "jax_tma": "`jax_tma.all_to_all`",
    "nccl": "`lax.all_to_all` (NCCL)",
    "composed": "`jax_tma.ppermute` × (n−1) + local copy",
    "ragged": "`jax_tma.ragged_all_to_all`",
    "lax_ragged": "`lax.ragged_all_to_all`",
    "ragged_skewed": "`jax_tma.ragged_all_to_all`, skewed",
    "lax_ragged_skewed": "`lax.ragged_all_to_all`, skewed",
    "ceiling": "ceiling: one push to one peer",
    "launch": "no exchange: one kernel a GPU",
}
# The ratio columns, where a result has them: (key, heading).
RATIOS = (
    ("jax_tma_vs_nccl", "`jax_tma` vs NCCL"),
    ("jax_tma_vs_ceiling", "`jax_tma` vs the ceiling"),
    ("jax_tma_vs_composed", "`jax_tma` vs composed"),
    ("nccl_vs_ceiling", "NCCL vs the ceiling"),
    ("ragged_vs_lax_ragged", "ragged vs `lax.ragged_all_to_all`"),
    ("ragged_vs_jax_tma", "ragged vs `jax_tma.all_to_all`"),
    ("ragged_skewed_vs_lax_ragged_skewed", "skewed: ragged vs `lax.ragged_all_to_all`"),
    ("lax_ragged_vs_nccl", "`lax.ragged_all_to_all` vs NCCL"),
)
_MODES = {
    "all_to_all": "one process drives every GPU",
    "all_to_all_processes": "one process per GPU under `jax.distributed` (every GPU visible, "
                            "each process given its own with `local_device_ids`); worker 0's "
                            "clocks of its own GPU",
}


def _cases(r: dict[str, Any]) -> list[str]:
    """The cases of the result's rows (measured or failed), in its order."""
    seen = {c for row in r["rows"] for c in [*row["times"], *row["failed"]]}
    return [c for c in r["cases"] if c in seen]


def _ratio_cell(row: dict[str, Any], key: str) -> str:
    """busy / span / wall / loop (/ loop busy) of a ratio, the wall where both
    cases' busy time reaches WALL_MIN_US."""
    ratio = row["ratios"].get(key)
    if ratio is None:
        return "—"
    a, b = key.split("_vs_")
    return ratio_clocks_text(ratio, row["times"][a], row["times"][b])


def _failures(r: dict[str, Any]) -> list[str]:
    """One line per case that failed, with the sizes and why."""
    why: dict[str, dict[str, list[str]]] = {}
    for row in r["rows"]:
        for case, text in row["failed"].items():
            why.setdefault(case, {}).setdefault(text, []).append(size_text(row["buffer_bytes"]))
    return [f"{LABELS[case]} failed ({', '.join(sizes)}): {text}" for case, texts in why.items()
            for text, sizes in texts.items()]


def _loop_rule(r: dict[str, Any]) -> str:
    return r.get("loop_rule", "not measured")


def render_all_to_all(r: dict[str, Any]) -> str:
    cases = _cases(r)
    moving = [c for c in cases if any(c in row["gbps"] or c in row["failed"] for row in r["rows"])]
    devices = ", ".join(dict.fromkeys(r["devices"]))
    row_kib = r["row_elements"] * 2 / 1024
    lines = [
        f"{r['n']} × {devices}, {_MODES[r['op']]}. {r['dtype']} rows of {row_kib:g} KiB, "
        f"`{r['exchange']}`; the ragged cases send buffer/n rows to each device, and in the "
        f"skewed ones each device sends {r['heavy_share']:g} of its rows to the next and splits "
        f"the rest evenly over the others and itself. **GB/s per GPU over the bytes that leave "
        f"each GPU**, (n−1)/n of its buffer (skewed: those of the GPU that sends the most), by "
        f"span; the ceiling is a `jax_tma.ppermute` that pushes those bytes to one peer. "
        + (f"The case \"{LABELS['launch']}\" (in the µs table only) flips a bit of every "
           f"element on each GPU and exchanges nothing: its span is how far apart the "
           f"program's launches on the GPUs began, plus a kernel, a floor under any "
           f"exchange's single call. "
           if "launch" in cases else "") +
        f"{r['repetitions']} interleaved run(s) per size, every case's time the median over "
        f"them and every ratio the median of the runs' ratios; each case checked bit for bit "
        f"first.", "",
        "| buffer per GPU | " + " | ".join(LABELS[c] for c in moving) + " |",
        "|---|" + "---|" * len(moving)]
    for row in r["rows"]:
        cells = ["failed" if c in row["failed"] else num_text(row["gbps"].get(c, {}).get("span"))
                 for c in moving]
        lines.append(f"| {size_text(row['buffer_bytes'])} | " + " | ".join(cells) + " |")
    ratios = [(k, h) for k, h in RATIOS if any(k in row["ratios"] for row in r["rows"])]
    if ratios:
        lines += ["", f"Ratios, {clock_names(r)} (the wall from {WALL_MIN_US:g} µs of busy "
                      f"time; the loop {_loop_rule(r)}{loop_busy_text(r)}): *A vs B* is A's "
                      f"GB/s ÷ B's, B's time ÷ A's where both send the same bytes (above 1, A "
                      f"is faster):",
                  "",
                  "| buffer per GPU | " + " | ".join(h for _, h in ratios) + " |",
                  "|---|" + "---|" * len(ratios)]
        for row in r["rows"]:
            lines.append(f"| {size_text(row['buffer_bytes'])} | "
                         + " | ".join(_ratio_cell(row, k) for k, _ in ratios) + " |")
    lines += ["", f"µs per call, {clock_names(r)} (the wall clock: "
                  f"{r['wall_calls_rule']}, shown from {WALL_MIN_US:g} µs of busy time; "
                  f"the loop {_loop_rule(r)}{loop_busy_text(r)}):", "",
              "| buffer per GPU | " + " | ".join(LABELS[c] for c in cases) + " |",
              "|---|" + "---|" * len(cases)]
    for row in r["rows"]:
        cells = ["failed" if c in row["failed"] else
                 clocks_text(row["times"][c]) if c in row["times"] else "—" for c in cases]
        lines.append(f"| {size_text(row['buffer_bytes'])} | " + " | ".join(cells) + " |")
    for row in r["rows"]:
        lines += timeline_lines(row.get("timeline"), LABELS,
                                f" of {size_text(row['buffer_bytes'])} per GPU")
    notes = _failures(r)
    notes += [f"{LABELS[c]} not run: {why}" for c, why in r["not_run"].items()]
    fallbacks = [x for x in r["lowerings"] if ": lax." in x]
    notes += [f"lowered to `lax` here, not measured as jax_tma's: {x}" for x in fallbacks]
    notes += [f"{size} left out: {why}" for size, why in r.get("sizes_left_out", {}).items()]
    notes += [f"no profiler clocks in process {pid}: {why}"
              for pid, why in (r.get("untraced") or {}).items()]
    if notes:
        lines += [""] + [f"- {note}" for note in notes]
    return "\n".join(lines)


def _headline(r: dict[str, Any]) -> str:
    row = r["rows"][-1]
    if "jax_tma" not in row["gbps"]:
        return f"failed: {row['failed'].get('jax_tma', 'not measured')}"
    text = f"{num_text(row['gbps']['jax_tma']['span'])} GB/s per GPU"
    for key, what in (("jax_tma_vs_nccl", "`lax.all_to_all` (NCCL)"),
                      ("jax_tma_vs_ceiling", "the one-peer ceiling")):
        if key in row["ratios"]:
            text += f", {num_text(row['ratios'][key]['span'], 2)}× {what}"
    return f"{text}, by span: {size_text(row['buffer_bytes'])} per GPU, bf16, in one process"


# Issue 42's targets: from this size a single call's clocks count (below
# it, the loop clock: a call's wall clock measures dispatch), and the GB/s
# target, a fraction of what NVLink 4 carries per direction in practice.
LARGE_BYTES = 16 * MIB
LINK_GBPS = 370
LINK_TARGET = 0.9
LINK_TARGET_FROM = 128 * MIB
# all_to_all against NCCL: at least NCCL_TARGET at every size, and at least
# SMALL_TARGET up to SMALL_TARGET_UPTO, on the clocks SMALL_CLOCKS agree on
# below LARGE_BYTES.
NCCL_TARGET = 1.0
SMALL_TARGET = 1.5
SMALL_TARGET_UPTO = 1 * MIB
SMALL_CLOCKS = ("busy", "span", "loop")
_CLOCK_WORDS = {"busy": "busy time", "span": "span", "loop": "the loop clock"}
# ragged_all_to_all with equal slices: at least this fraction of all_to_all's GB/s.
RAGGED_TARGET = 0.9
# ragged_all_to_all from LARGE_BYTES, in one process: at least this many
# times lax.ragged_all_to_all.
LAX_RAGGED_TARGET = 50


def _ratios(rows: list[dict[str, Any]], key: str, clocks: tuple[str, ...]) -> list[float]:
    return [row["ratios"][key][c] for row in rows if key in row["ratios"] for c in clocks
            if row["ratios"][key].get(c) is not None]


def _span(rows: list[dict[str, Any]], case: str) -> list[float]:
    return [row["gbps"][case]["span"] for row in rows if case in row["gbps"]]


def _and(values: list[str]) -> str:
    return values[0] if len(values) == 1 else ", ".join(values[:-1]) + " and " + values[-1]


def _range(values: list[float], digits: int = 2) -> str:
    return range_text(values, f"{{:.{digits}f}}") if values else "—"


def _small_verdicts(rows: list[dict[str, Any]]) -> str:
    """Each small size's all_to_all-vs-NCCL ratios on SMALL_CLOCKS and which
    of the targets they all reach ("—" where a clock is missing)."""
    parts = []
    for row in rows:
        ratios = row["ratios"].get("jax_tma_vs_nccl", {})
        values = [ratios.get(clock) for clock in SMALL_CLOCKS]
        text = (f"{size_text(row['buffer_bytes'])} "
                + " / ".join("—" if v is None else f"{v:.2f}" for v in values) + "×")
        if None not in values:
            low = min(values)
            target = SMALL_TARGET if row["buffer_bytes"] <= SMALL_TARGET_UPTO else NCCL_TARGET
            if low >= target:
                text += f" (≥ {target:.1f}×: met)"
            elif target > NCCL_TARGET and low >= NCCL_TARGET:
                text += f" (≥ {NCCL_TARGET:.1f}×, not {target:.1f}×)"
            else:
                text += f" (not ≥ {NCCL_TARGET:.1f}×)"
        parts.append(text)
    return _and(parts)


def _launch_floor(rows: list[dict[str, Any]]) -> str:
    """What the `launch` case (no exchange, one kernel a GPU) says of the
    small sizes in one process: its span is a floor under any exchange's
    single call, so NCCL's span over it bounds any exchange's ratio by span."""
    rows = [row for row in rows if {"launch", "nccl"} <= row["times"].keys()]
    if not rows:
        return ""
    spans = [row["times"]["launch"]["span_us"] for row in rows]
    bounds = [row["times"]["nccl"]["span_us"] / span for row, span in zip(rows, spans)]
    text = (f" A program of one kernel a GPU and no exchange, timed in the same runs, spans "
            f"{_and([f'{v:.1f}' for v in spans])} µs (its GPUs' launches apart, plus the "
            f"kernel): no exchange's single call spans less, so none can be more than "
            f"{_and([f'{v:.2f}' for v in bounds])}× NCCL by span at "
            f"{_and([size_text(row['buffer_bytes']) for row in rows])}.")
    small = [b for row, b in zip(rows, bounds) if row["buffer_bytes"] <= SMALL_TARGET_UPTO]
    if small and max(small) < SMALL_TARGET:
        text += (f" The {SMALL_TARGET:.1f}× target by span (and so by every clock together) in "
                 f"one process is above that floor, which PjRt's launches set, not the "
                 f"exchange: the loop clock, where the GPUs run in step, is the clock that "
                 f"measures the exchange there.")
    return text


def _two_handshakes(loop_ceiling: str) -> str:
    """Why PeerScatter's small calls trail NCCL (the 2 x H100 results')."""
    return ("A call costs two cross-GPU handshakes in a row (each device publishes its output "
            "and waits for its destinations' before copying, then signals them when done): its "
            f"floor is the one-peer ceiling's own loop time, {loop_ceiling} µs in one process, "
            "while NCCL's all-to-all lands data and flag together in buffers registered "
            "beforehand.")


def _inbox(loop_ceiling: str) -> str:
    """Why the clocks part below 16 MiB once the inbox exchange runs there."""
    return ("Up to 4 MiB a call is one kernel and one crossing of the link (the inbox "
            "exchange). A single call's busy time and span also hold its wait for the other "
            "GPU's launch, as NCCL's do. The loop clock, where the GPUs run in step, bounds "
            "the exchange's cost from above: at 1 MiB and below the host's dispatch of the "
            "calls sets it, not the GPU (a profile of these loops: benchmarks/TUNING.md); the "
            "loop busy clock, where a result has it, is the GPU's share.")


def render_targets(results: dict[str, tuple[str, dict[str, Any]]], suffix: str = "",
                   small_why: Callable[[str], str] = _two_handshakes) -> str | None:
    """The all_to_all page's account of issue 42's targets, every number from
    the two results of GPUs `suffix` (one process, one process per GPU;
    "@2x-h200": those keys of report.py's), `small_why` saying why the small
    sizes stand where they do; None without both."""
    keys = (f"all_to_all{suffix}", f"all_to_all_processes{suffix}")
    if not all(k in results for k in keys):
        return None
    one, procs = results[keys[0]][1], results[keys[1]][1]
    prov = one.get("provenance") or {}
    big = {name: [row for row in r["rows"] if row["buffer_bytes"] >= LARGE_BYTES]
           for name, r in (("one", one), ("procs", procs))}
    small = {name: [row for row in r["rows"] if row["buffer_bytes"] < LARGE_BYTES]
             for name, r in (("one", one), ("procs", procs))}
    clocks = ("busy", "span", "wall")
    first = size_text(big["one"][0]["buffer_bytes"]) if big["one"] else "?"
    lines = [f"From the two result files above ({one['n']} × {one['devices'][0]}, "
             f"{str(prov.get('date', '?'))[:10]}, {str(prov.get('commit', '?'))[:7]}; a ratio "
             f"holds where busy time, span and, below {size_text(LARGE_BYTES)}, the loop clock "
             f"agree):", ""]
    text = (f"- **From {first}**, `all_to_all` is "
            f"{_range(_ratios(big['one'], 'jax_tma_vs_nccl', clocks))}× NCCL in one process and "
            f"{_range(_ratios(big['procs'], 'jax_tma_vs_nccl', clocks))}× across processes, by "
            f"busy time, span and wall clock, and at the link's one-peer ceiling measured beside "
            f"it ({_range(_ratios(big['one'], 'jax_tma_vs_ceiling', ('busy',)))}× in one "
            f"process; {_range(_ratios(big['procs'], 'jax_tma_vs_ceiling', ('busy',)))}× across "
            f"processes, by busy time).")
    at = {name: next((row for row in big[name] if row["buffer_bytes"] >= LINK_TARGET_FROM), None)
          for name in big}
    if at["one"] and at["procs"] and "ceiling" in at["one"]["gbps"]:
        target = LINK_TARGET * LINK_GBPS
        ceilings = [at[n]["gbps"]["ceiling"]["span"] for n in ("one", "procs")]
        later = [row for n in big for row in big[n]
                 if row["buffer_bytes"] > at["one"]["buffer_bytes"]]
        text += (f" The target of {LINK_TARGET:g} × {LINK_GBPS} GB/s = {target:.0f} GB/s from "
                 f"{size_text(LINK_TARGET_FROM)}: at {size_text(at['one']['buffer_bytes'])} the "
                 f"ceiling is itself {ceilings[0]:.0f} GB/s (one process) and {ceilings[1]:.0f} "
                 f"GB/s (processes), {'below' if max(ceilings) < target else 'not all below'} "
                 f"it, and the exchange reaches {at['one']['gbps']['jax_tma']['span']:.0f} and "
                 f"{at['procs']['gbps']['jax_tma']['span']:.0f} GB/s there")
        if later:
            text += (f", and {_range(_span(later, 'jax_tma'), 0)} GB/s from "
                     f"{size_text(min(row['buffer_bytes'] for row in later))}")
        text += " (by span)."
    lines.append(text)
    if small["one"]:
        sizes = _and([size_text(row["buffer_bytes"]) for row in small["one"]])
        losing = all(row["ratios"]["jax_tma_vs_nccl"]["span"] < 1 for row in small["one"])
        head = f"At {sizes} it does not beat NCCL." if losing else f"At {sizes}:"

        def each(rows, key, clock, suffix="×", digits=2):
            return _and([f"{row['ratios'][key][clock]:.{digits}f}" for row in rows]) + suffix

        def loop_us(rows, case):
            return _and([f"{row['times'][case]['loop_us']:.1f}" for row in rows])

        def gaps(case):
            return _and([f"{row['launch_gap_us'][case]:.1f}" for row in small["one"]])

        launch = ""
        if all({"jax_tma", "nccl"} <= row.get("launch_gap_us", {}).keys() for row in small["one"]):
            launch = (f" A single call's GPUs began their first kernels {gaps('jax_tma')} µs "
                      f"apart ({gaps('nccl')} for NCCL's; medians), a wait that each op's span "
                      f"and busy time hold.")
        launch += _launch_floor(small["one"])
        lines.append(
            f"- **{head}** Against NCCL, by {' / '.join(_CLOCK_WORDS[c] for c in SMALL_CLOCKS)} (the "
            f"targets: ≥ {NCCL_TARGET:.1f}× at every size, ≥ {SMALL_TARGET:.1f}× up to "
            f"{size_text(SMALL_TARGET_UPTO)}): in one process {_small_verdicts(small['one'])}; "
            f"across processes {_small_verdicts(small['procs'])}. In one process the loop "
            f"clock is {loop_us(small['one'], 'jax_tma')} µs a call, against "
            f"{loop_us(small['one'], 'nccl')} µs.{launch} "
            + small_why(loop_us(small["one"], "ceiling")))
    ragged_big = _ratios(big["one"], "ragged_vs_lax_ragged", ("busy", "span"))
    if ragged_big:
        below = _ratios(small["one"], "ragged_vs_lax_ragged", ("busy", "span", "loop"))
        lax_fails = all("lax_ragged" in row["failed"] for row in procs["rows"])
        equal = _ratios(big["one"] + big["procs"], "ragged_vs_jax_tma", ("busy", "span"))
        loop = _ratios(small["one"] + small["procs"], "ragged_vs_jax_tma", ("loop",))
        text = (f"- **ragged_all_to_all** is {_range(ragged_big, 0)}× `lax.ragged_all_to_all` "
                f"from {first} in one process, by busy time and span"
                + (f" (and {_range(below, 1)}× below, by busy time, span and the loop clock)"
                   if below else "")
                + (", runs across processes where lax's raises" if lax_fails else "")
                + f", and with equal slices keeps {_range(equal)}× `all_to_all`'s GB/s from "
                  f"{first} (busy time and span)")
        if loop:
            text += (f"; below {first} the loop clock gives {_range(loop)}× (the target is "
                     f"{RAGGED_TARGET:g}×)")
            busy = [(row["ratios"]["ragged_vs_jax_tma"]["busy"], row["buffer_bytes"])
                    for row in small["procs"] if "ragged_vs_jax_tma" in row["ratios"]]
            worst = min(busy) if busy else None
            if worst and worst[0] < RAGGED_TARGET:
                text += (f", but across processes busy time ({worst[0]:.2f}× at "
                         f"{size_text(worst[1])}) does not agree")
        text += "."
        # The GB/s that LAX_RAGGED_TARGET times lax's would take: where every
        # size asks for more than the link carries, the target is beyond it.
        asks = [(LAX_RAGGED_TARGET * row["gbps"]["lax_ragged"]["span"],
                 row["gbps"]["ceiling"]["span"]) for row in big["one"]
                if {"lax_ragged", "ceiling"} <= row["gbps"].keys()
                and row["gbps"]["lax_ragged"]["span"]]
        if asks and all(need > LINK_GBPS for need, _ in asks):
            text += (f" The target of {LAX_RAGGED_TARGET}× `lax.ragged_all_to_all` from {first} "
                     f"asks for {_range([a for a, _ in asks], 0)} GB/s here, above the "
                     f"{LINK_GBPS} GB/s that NVLink carries a direction in practice (the "
                     f"one-peer push beside it: {_range([c for _, c in asks], 0)} GB/s): a "
                     f"target beyond the link, so the measured ratio is the answer.")
        lines.append(text)
    return "\n".join(lines)


RENDERERS = {"all_to_all": render_all_to_all, "all_to_all_processes": render_all_to_all}
DERIVED = {"all_to_all-targets": render_targets,
           "all_to_all-targets@2x-h200": functools.partial(render_targets, suffix="@2x-h200",
                                                          small_why=_inbox),
           "all_to_all-targets@4x-h200": functools.partial(render_targets, suffix="@4x-h200",
                                                          small_why=_inbox)}
HEADLINES = (Headline(8, "all_to_all", "each device's chunk `j` to device `j`, GPU to GPU",
                      "all_to_all", _headline,
                      no_result="no result at this commit (it needs two GPUs)"),)
# The commands that write the results (they are not in `run.py all`).
WRITTEN_BY = {
    "all_to_all": "`python benchmarks/run.py all_to_all --out-dir benchmarks/results` (two "
                  "GPUs; not in `all`; `run.py a2a` runs it with `all_to_all_processes`)",
    "all_to_all_processes": "`python benchmarks/run.py all_to_all_processes --out-dir "
                            "benchmarks/results` (two GPUs; not in `all`; `run.py a2a` runs "
                            "it with `all_to_all`)",
}
