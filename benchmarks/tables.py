"""What the renderers of benchmark results share: report.py's generic
sections and each bench_<name>.py's render_<name>.py. The registry entries a
render module lists besides its RENDERERS (Headline, Plot), and the text of
times, ratios and sizes that every table uses. Standard library only, as
report.py: rendering needs neither jax nor jax_tma.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

MIB = 1 << 20
# The wall clock (N calls dispatched, one sync) is shown for cases of at
# least this busy time: below it, it measures Python dispatch.
WALL_MIN_US = 100.0
# The clocks are defined in the README's "How every benchmark measures".
WALL_NOTE = (f"busy / span / wall µs per call (the wall clock from {WALL_MIN_US:g} µs of busy "
             f"time)")
UNRECORDED = "not recorded"


@dataclasses.dataclass(frozen=True)
class Headline:
    """A row of the README's table of ops (report.render_headline)."""
    rank: float               # the table's rows go by rank, those of every render module
                              # (a row between two others: 3.5 between 3 and 4)
    op: str                   # the op, linked to its page docs/ops/<page>.md
    what: str                 # what it does
    result: str               # the result (op) its number is drawn from
    number: Callable[[dict[str, Any]], str]  # that number, from the result
    page: str = ""            # the op's page, where not docs/ops/<op>.md
    no_result: str = "no result at this commit"  # the number's cell without the result


@dataclasses.dataclass(frozen=True)
class Plot:
    """A figure of one result (report.py --plots)."""
    result: str               # the result (op) it draws
    file: str                 # its PNG file's name
    draw: Callable[[Any, dict[str, Any]], None]  # (matplotlib Axes, the result)


def wall_shown(*times: dict[str, float | None]) -> bool:
    """Whether these cases' wall clocks mean something: measured (a missing
    clock may be absent or None), and every case takes at least WALL_MIN_US
    of GPU busy time."""
    return all(t.get("wall_us") is not None and t.get("busy_us") is not None
               and t["busy_us"] >= WALL_MIN_US for t in times)


def num_text(x: float | None, digits: int = 1, suffix: str = "") -> str:
    """x with `digits` decimals and `suffix`, or a dash where it is missing."""
    return "—" if x is None else f"{x:.{digits}f}{suffix}"


def clocks_text(t: dict[str, float | None]) -> str:
    """busy / span / wall / loop µs (us_text's, and the loop clock; a missing
    clock as a dash), then / loop busy where the result has that clock."""
    wall = t["wall_us"] if wall_shown(t) else None
    clocks = [t["busy_us"], t["span_us"], wall, t.get("loop_us")]
    if "loop_busy_us" in t:
        clocks.append(t["loop_busy_us"])
    return " / ".join(num_text(x) for x in clocks)


def clock_names(r: dict[str, Any]) -> str:
    """The clocks of a result's cells (clocks_text's): loop busy too where
    the result has that clock (its rule, `loop_busy_rule`)."""
    return "busy / span / wall / loop" + (" / loop busy" if "loop_busy_rule" in r else "")


def loop_busy_text(r: dict[str, Any]) -> str:
    """"; the loop busy: <its rule>" where the result has that clock, else ""."""
    return f"; the loop busy: {r['loop_busy_rule']}" if "loop_busy_rule" in r else ""


def ratio_clocks_text(ratio: dict[str, float | None], *times: dict[str, float | None]) -> str:
    """busy / span / wall / loop of a ratio of two cases (`times`: theirs), the
    wall where wall_shown(*times); then / loop busy where the result has it."""
    wall = ratio["wall"] if wall_shown(*times) else None
    clocks = [ratio["busy"], ratio["span"], wall, ratio.get("loop")]
    if "loop_busy" in ratio:
        clocks.append(ratio["loop_busy"])
    return " / ".join(num_text(x, 2) for x in clocks)


def us_text(t: dict[str, float]) -> str:
    """busy / span / wall µs (the wall clock from WALL_MIN_US of busy time)."""
    wall = f"{t['wall_us']:.1f}" if wall_shown(t) else "—"
    return f"{t['busy_us']:.1f} / {t['span_us']:.1f} / {wall}"


def ratio_text(times: dict[str, dict[str, float]], a: str, b: str, clock: str) -> str:
    """b's time ÷ a's by `clock` ("busy_us", "span_us", "wall_us"), or "—"
    where either is missing (or, for the wall clock, not shown)."""
    if a not in times or b not in times or clock not in times[a] or clock not in times[b]:
        return "—"
    if clock == "wall_us" and not wall_shown(times[a], times[b]):
        return "—"
    return f"{times[b][clock] / times[a][clock]:.2f}"


def target_met(row: dict[str, Any], comparator: str, ratio: float) -> bool:
    """Whether `auto` reaches `ratio` × the comparator's speed by busy time
    and by span alike (a faster-than claim needs both clocks)."""
    t = row["times"]
    return all(t[comparator][k] / t["auto"][k] >= ratio for k in ("busy_us", "span_us"))


def range_text(values: list[float], fmt: str = "{:.3f}") -> str:
    """The values' lowest–highest, or one value where both print alike."""
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else \
        f"{fmt.format(lo)}–{fmt.format(hi)}"


def behind_text(ratios: list[float], versus: str) -> str:
    """How many of the cases jax_tma loses to `versus` (ratios: its time ÷
    jax_tma's), with their range: "below XLA in all 12 cases, 0.79–1.00×"."""
    behind = sum(v < 1 for v in ratios)
    count = "all" if behind == len(ratios) else f"{behind} of"
    return (f"below {versus} in {count} {len(ratios)} case{'s' * (len(ratios) != 1)}, "
            f"{range_text(ratios, '{:.2f}')}×")


def size_text(nbytes: float) -> str:
    """nbytes in its largest binary unit that it reaches: 128 B, 32 KiB, 1 GiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def mark(met: bool) -> str:
    return "✓" if met else "✗"


def bare_case(row: dict[str, Any]) -> str:
    """The case's text without its dtype where it qualifies a noun ("random
    bfloat16 pages"): the tables give the dtype a column."""
    dtype = row.get("dtype")
    return row["case"].replace(f" {dtype} ", " ") if dtype else row["case"]


def tbps_headline(tbps: float, versus: str, case: str) -> str:
    """A headline number: "1.23 TB/s, <versus>: <case>"."""
    return f"{tbps:.2f} TB/s, {versus}: {case}"


def _install(r: dict[str, Any]) -> str:
    """How the measured jax_tma was installed, as its result records it."""
    prov = r.get("provenance") or {}
    if prov.get("install"):
        return prov["install"]
    path = (prov.get("jax_tma") or {}).get("file", "")
    return "source build (gpu_check.sh)" if "jax_tma_source" in path else UNRECORDED


def build_cells(r: dict[str, Any]) -> list[str]:
    """The build a result measured: its install, CUDA architectures, FFI API
    and CUDA runtime, as table cells."""
    info = ((r.get("provenance") or {}).get("jax_tma") or {}).get("build_info") or {}
    api = info.get("ffi_api_version")
    runtime = info.get("cuda_runtime_version")
    return [_install(r), f"`{info.get('cuda_archs') or '?'}`",
            ".".join(map(str, api)) if api else "?",
            f"{runtime // 1000}.{runtime % 1000 // 10}" if runtime else "?"]


def short_name(name: str) -> str:
    """An activity's name without its return type, namespaces, template
    arguments and parameters: `void ns::Kernel<8>(Params)` -> `Kernel` (an
    anonymous namespace's parentheses are not parameters)."""
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "").split("(")[0]
    depth, out = 0, []
    for ch in name:
        depth += ch == "<"
        if depth == 0:
            out.append(ch)
        depth -= ch == ">"
    return "".join(out).rsplit("::", 1)[-1]


def timeline_lines(timelines: dict[str, Any] | None, labels: dict[str, str],
                   where: str = "") -> list[str]:
    """One call of each case that has a timeline (harness.Session.timeline),
    activity by activity a GPU: name start–end, in µs from the call's first
    GPU activity; `where` follows each case's label (a size, say)."""
    lines = []
    for case, t in (timelines or {}).items():
        by_gpu: dict[str, list[str]] = {}
        for a in t["activities"]:
            by_gpu.setdefault(a["gpu"], []).append(
                f"{short_name(a['name'])} {a['start_us']:.1f}–{a['end_us']:.1f}")
        gpus = (" on this process's own GPU (a process traces its own alone)"
                if t.get("own_gpu") else "")
        lines += ["", f"One call of {labels[case]}{where}, of median span ({t['span_us']:.1f} µs) "
                      f"of its traced calls, activity by activity{gpus} (µs from the call's "
                      f"first GPU activity; the host's call began at "
                      f"{t['host_window_us']:.1f}):", ""]
        lines += [f"- {gpu}: " + ", ".join(items) for gpu, items in sorted(by_gpu.items())]
    return lines
