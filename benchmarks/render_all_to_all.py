"""How the all_to_all benchmark's results read (bench_all_to_all.py writes
them, on two GPUs): the `all_to_all` section (one process driving both
GPUs), the `all_to_all_processes` section (one process per GPU) and the
README's headline row, which report.py collects from RENDERERS, HEADLINES
and WRITTEN_BY."""

from __future__ import annotations

from typing import Any

from tables import WALL_MIN_US, Headline, size_text

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
    "all_to_all": "one process drives both GPUs",
    "all_to_all_processes": "one process per GPU under `jax.distributed` (every GPU visible, "
                            "each process given its own with `local_device_ids`); worker 0's "
                            "clocks of its own GPU",
}


def _num(x: float | None, digits: int = 1, suffix: str = "") -> str:
    return "—" if x is None else f"{x:.{digits}f}{suffix}"


def _cases(r: dict[str, Any]) -> list[str]:
    """The cases of the result's rows (measured or failed), in its order."""
    seen = {c for row in r["rows"] for c in [*row["times"], *row["failed"]]}
    return [c for c in r["cases"] if c in seen]


def _wall_shown(*times: dict[str, float | None]) -> bool:
    """Whether these cases' wall clocks mean something (tables.wall_shown,
    where a clock may be missing: None)."""
    return all(t.get("wall_us") is not None and t.get("busy_us") is not None
               and t["busy_us"] >= WALL_MIN_US for t in times)


def _us_cell(t: dict[str, float | None]) -> str:
    """busy / span / wall / loop µs (tables.us_text, a missing clock as a
    dash)."""
    wall = t["wall_us"] if _wall_shown(t) else None
    return " / ".join(_num(x) for x in (t["busy_us"], t["span_us"], wall, t.get("loop_us")))


def _ratio_cell(row: dict[str, Any], key: str) -> str:
    """busy / span / wall / loop of a ratio, the wall where both cases' busy
    time reaches WALL_MIN_US."""
    ratio = row["ratios"].get(key)
    if ratio is None:
        return "—"
    a, b = key.split("_vs_")
    wall = ratio["wall"] if _wall_shown(row["times"][a], row["times"][b]) else None
    return " / ".join(_num(x, 2) for x in (ratio["busy"], ratio["span"], wall,
                                            ratio.get("loop")))


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
    devices = ", ".join(dict.fromkeys(r["devices"]))
    row_kib = r["row_elements"] * 2 / 1024
    lines = [
        f"{r['n']} × {devices}, {_MODES[r['op']]}. {r['dtype']} rows of {row_kib:g} KiB, "
        f"`{r['exchange']}`; the ragged cases send buffer/n rows to each device, and in the "
        f"skewed ones each device sends {r['heavy_share']:g} of its rows to the next and splits "
        f"the rest evenly over the others and itself. **GB/s per GPU over the bytes that leave "
        f"each GPU**, (n−1)/n of its buffer (skewed: those of the GPU that sends the most), by "
        f"span; the ceiling is a `jax_tma.ppermute` that pushes those bytes to one peer. "
        f"{r['repetitions']} interleaved run(s) per size, every case's time the median over "
        f"them and every ratio the median of the runs' ratios; each case checked bit for bit "
        f"first.", "",
        "| buffer per GPU | " + " | ".join(LABELS[c] for c in cases) + " |",
        "|---|" + "---|" * len(cases)]
    for row in r["rows"]:
        cells = ["failed" if c in row["failed"] else _num(row["gbps"].get(c, {}).get("span"))
                 for c in cases]
        lines.append(f"| {size_text(row['buffer_bytes'])} | " + " | ".join(cells) + " |")
    ratios = [(k, h) for k, h in RATIOS if any(k in row["ratios"] for row in r["rows"])]
    if ratios:
        lines += ["", f"Ratios, busy / span / wall / loop (the wall from {WALL_MIN_US:g} µs "
                      f"of busy time; the loop {_loop_rule(r)}): *A vs B* is A's GB/s ÷ B's, "
                      f"B's time ÷ A's where both send the same bytes (above 1, A is faster):",
                  "",
                  "| buffer per GPU | " + " | ".join(h for _, h in ratios) + " |",
                  "|---|" + "---|" * len(ratios)]
        for row in r["rows"]:
            lines.append(f"| {size_text(row['buffer_bytes'])} | "
                         + " | ".join(_ratio_cell(row, k) for k, _ in ratios) + " |")
    lines += ["", f"µs per call, busy / span / wall / loop (the wall clock: "
                  f"{r['wall_calls_rule']}, shown from {WALL_MIN_US:g} µs of busy time; the "
                  f"loop {_loop_rule(r)}):", "",
              "| buffer per GPU | " + " | ".join(LABELS[c] for c in cases) + " |",
              "|---|" + "---|" * len(cases)]
    for row in r["rows"]:
        cells = ["failed" if c in row["failed"] else
                 _us_cell(row["times"][c]) if c in row["times"] else "—" for c in cases]
        lines.append(f"| {size_text(row['buffer_bytes'])} | " + " | ".join(cells) + " |")
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
    text = f"{_num(row['gbps']['jax_tma']['span'])} GB/s per GPU"
    for key, what in (("jax_tma_vs_nccl", "`lax.all_to_all` (NCCL)"),
                      ("jax_tma_vs_ceiling", "the one-peer ceiling")):
        if key in row["ratios"]:
            text += f", {_num(row['ratios'][key]['span'], 2)}× {what}"
    return f"{text}, by span: {size_text(row['buffer_bytes'])} per GPU, bf16, in one process"


RENDERERS = {"all_to_all": render_all_to_all, "all_to_all_processes": render_all_to_all}
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
