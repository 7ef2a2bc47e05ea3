"""The benchmarks' timing harness: device time per call from a jax.profiler
trace, cases interleaved and reduced to medians, and the result JSON with
what was measured, where and how.

Times device work, not Python dispatch: each case runs under
``jax.profiler`` and its duration is the span of its GPU activity (kernels
and memcpys, read from the trace) per call; the median over calls is
reported (copy: the cases take turns, see time_cases). Bandwidth counts
every byte read plus every byte written.
"""

from __future__ import annotations

import datetime
import glob
import json
import statistics
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import jax

import jax_tma

MIB = 1 << 20


def _device_events(trace_dir: str) -> list[tuple[int, int]]:
    """(start_ns, end_ns) of every GPU activity in the trace."""
    from jax.profiler import ProfileData

    paths = glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)
    if not paths:
        raise RuntimeError(f"no profile written under {trace_dir}")
    events = []
    for plane in ProfileData.from_file(paths[0]).planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            # "Stream #N(...)" lines hold the activities themselves; other
            # lines (XLA Ops, XLA Modules, ...) are annotations over them.
            if not line.name.startswith("Stream"):
                continue
            for e in line.events:
                events.append((int(e.start_ns), int(e.start_ns + e.duration_ns)))
    return sorted(events)


def _split_runs(events: list[tuple[int, int]], runs: int, busy: bool) -> list[float]:
    """Splits time-sorted activities into `runs` calls at the runs-1 largest
    idle gaps (calls are separated by a host round trip); returns each
    call's device span, or with `busy` the time its GPU was busy (the span
    less idle gaps inside the call), in seconds."""
    if len(events) < runs:
        raise RuntimeError(f"trace has {len(events)} GPU activities for {runs} calls")
    gaps = []
    end = events[0][1]
    for i in range(1, len(events)):
        gaps.append((events[i][0] - end, i))
        end = max(end, events[i][1])
    cuts = sorted(i for _, i in sorted(gaps, reverse=True)[: runs - 1])
    out = []
    for lo, hi in zip([0] + cuts, cuts + [len(events)]):
        group = events[lo:hi]
        if not busy:
            out.append((max(e for _, e in group) - group[0][0]) * 1e-9)
            continue
        total, reach = 0, group[0][0]
        for start, stop in group:  # union of the activity intervals
            total += max(0, stop - max(start, reach))
            reach = max(reach, stop)
        out.append(total * 1e-9)
    return out


def time_cases(cases: dict[str, Callable[..., Any]], inputs: Sequence[tuple], rounds: int,
               rep: int = 1, busy: bool = False,
               before: Callable[[], Any] | None = None) -> dict[str, float]:
    """Median device seconds per call of each case: the span of its GPU
    activity, or with `busy` only the time the GPU was busy.

    The cases take turns: each round runs every case `rep` times in a row,
    cycling through `inputs`, so that slow drift (clocks, temperature) hits
    every case alike. With rep > 1 the first call of each turn, which pays
    for what the previous case left in L2, is not counted. `before`, if
    given, runs (untimed) ahead of every call, e.g. to set the L2 state."""
    for fn in cases.values():
        for args in inputs:
            jax.block_until_ready(fn(*args))
    plan = [name for _ in range(rounds) for name in cases for _ in range(rep)]
    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d)
        for i, name in enumerate(plan):
            if before is not None:
                jax.block_until_ready(before())
            jax.block_until_ready(cases[name](*inputs[i % len(inputs)]))
        jax.profiler.stop_trace()
        events = _device_events(d)
    stride = 1 if before is None else 2
    return _case_medians(plan, _split_runs(events, stride * len(plan), busy)[stride - 1::stride],
                         rep)


def _case_medians(plan: Sequence[str], runs: Sequence[float], rep: int) -> dict[str, float]:
    """Median of each case's runs, `plan` naming the case of each run in
    turns of `rep`; with rep > 1 the first run of every turn is left out."""
    samples: dict[str, list[float]] = {}
    for i, (name, seconds) in enumerate(zip(plan, runs, strict=True)):
        samples.setdefault(name, [])
        if rep == 1 or i % rep:
            samples[name].append(seconds)
    return {name: statistics.median(x) for name, x in samples.items()}


def time_device(fn: Callable[..., Any], inputs: Sequence[tuple], calls: int,
                busy: bool = False) -> float:
    """Median device seconds per call of `fn` over `calls` calls, cycling
    through `inputs` (see time_cases)."""
    return time_cases({"": fn}, inputs, calls, busy=busy)[""]


def stamp(result: dict[str, Any], op: str, device: jax.Device) -> dict[str, Any]:
    """Adds what was measured, where and how to a benchmark's result."""
    result.update(
        op=op,
        device=device.device_kind,
        date=datetime.date.today().isoformat(),
        jax=jax.__version__,
        build=jax_tma.build_info(),
        bytes_convention=("read + write (every byte read once plus every byte written once); "
                          "the copy bench's read-only and write-only rates count one direction"),
        timing=("median per call from a jax.profiler trace: device span (copy: cases "
                "interleaved, 4 calls per turn, the first not counted; ppermute, "
                "over both GPUs, divided by the ops chained in the program); "
                "GPU busy time, span also recorded (window, broadcast); GPU busy time (im2col)"),
    )
    return result


def write_json(result: dict[str, Any], path: str | None) -> None:
    """Writes `result` to `path` as JSON (nothing without a path)."""
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
