"""The benchmarks' timing harness: a Session that times interleaved cases
from a jax.profiler trace, checks every case's output bit for bit before it
is timed, prints progress, and writes each result JSON with its provenance.

Three clocks. Every call of every case runs under ``jax.profiler``, inside a
host annotation of its own, and is reduced to two numbers from the GPU
activities that start within its annotation: its *span* (first GPU activity
to last, idle gaps inside the call included: for jax_tma's ops the host's
tensor-map encoding shows there) and its *busy* time (the union of its GPU
activities); each case reports the median of both over its counted calls.
Then, outside the trace, the *wall* clock a user's step sees: WALL_CALLS
calls of a case dispatched without waiting, one sync after the last, the
time over the calls; the median of WALL_SAMPLES such samples, the cases
taking turns. Below about 100 µs a call the wall clock measures Python
dispatch rather than the GPU (tables.WALL_MIN_US). Bandwidth counts what
each benchmark's `bytes_convention` says. A smoke session (``run.py
--smoke``) runs the same code on the CPU with a wall clock per call in place
of the trace: it tests the code path and measures nothing.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import glob
import itertools
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import jax
import jax.numpy as jnp

MIB = 1 << 20
# The wall clock: calls dispatched per sample, and samples (median taken).
WALL_CALLS = 20
WALL_SAMPLES = 5
# The host annotation around each traced call.
CALL_ANNOTATION = "jax_tma_bench_call"
# A traced activity: a tuple whose first item is its start in ns.
_E = TypeVar("_E", bound=tuple)


def _profile(trace_dir: str) -> Any:
    """The jax.profiler trace written under `trace_dir`."""
    from jax.profiler import ProfileData

    paths = glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)
    if not paths:
        raise RuntimeError(f"no profile written under {trace_dir}")
    return ProfileData.from_file(paths[0])


class _Activity(NamedTuple):
    start_ns: int
    end_ns: int
    gpu: str  # the trace's plane, "/device:GPU:0"
    stream: str
    name: str


def _activities(trace_dir: str) -> list[_Activity]:
    """Every GPU activity in the trace (kernels, copies, memsets), time-sorted."""
    out = []
    for plane in _profile(trace_dir).planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            # "Stream #N(...)" lines hold the activities themselves; other
            # lines (XLA Ops, XLA Modules, ...) are annotations over them.
            if line.name.startswith("Stream"):
                out.extend(_Activity(int(e.start_ns), int(e.start_ns + e.duration_ns),
                                     plane.name, line.name, e.name) for e in line.events)
    return sorted(out)


def _stream_events(trace_dir: str) -> dict[tuple[str, str], list[tuple[int, int]]]:
    """(start_ns, end_ns) of every GPU activity in the trace, by (GPU, stream)."""
    events: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for a in _activities(trace_dir):
        events.setdefault((a.gpu, a.stream), []).append((a.start_ns, a.end_ns))
    return events


def _device_events(trace_dir: str) -> list[tuple[int, int]]:
    """(start_ns, end_ns) of every GPU activity in the trace."""
    return sorted(e for events in _stream_events(trace_dir).values() for e in events)


def _call_windows(trace_dir: str) -> list[tuple[int, int]]:
    """(start_ns, end_ns) of every host annotation named CALL_ANNOTATION in
    the trace, time-sorted (the host's and the GPUs' clocks are one timeline
    there)."""
    return sorted((int(e.start_ns), int(e.start_ns + e.duration_ns))
                  for plane in _profile(trace_dir).planes if plane.name.startswith("/host:")
                  for line in plane.lines for e in line.events if e.name == CALL_ANNOTATION)


def _busy_ns(events: list[tuple[int, int]]) -> int:
    """The union of activity intervals, time-sorted."""
    busy, reach = 0, events[0][0] if events else 0
    for start, stop in events:
        busy += max(0, stop - max(start, reach))
        reach = max(reach, stop)
    return busy


def _span_busy(group: list[tuple[int, int]]) -> tuple[float, float]:
    """A call's (span, busy) in seconds from its time-sorted activities:
    first activity to last, and the union of its activity intervals (the
    span less idle gaps inside the call)."""
    return (max(e for _, e in group) - group[0][0]) * 1e-9, _busy_ns(group) * 1e-9


def _launch_gap(group: Sequence[tuple]) -> float | None:
    """How far apart, in seconds, the GPUs of a call began their first
    activities (each (start ns, end ns, GPU, ...); None where the call's
    activities name one GPU or none): a floor under an exchange's span,
    which waits for the last GPU to arrive."""
    first: dict[str, int] = {}
    for a in group:
        if len(a) > 2:
            first[a[2]] = min(first.get(a[2], a[0]), a[0])
    return (max(first.values()) - min(first.values())) * 1e-9 if len(first) > 1 else None


def _split_runs(events: list[tuple[int, int]], runs: int) -> list[tuple[float, float]]:
    """Splits time-sorted activities into `runs` calls at the runs-1 largest
    idle gaps (for calls kept apart by a pause far longer than any idle gap
    inside one: processes.WorkerSession); each call's (span, busy)."""
    if len(events) < runs:
        raise RuntimeError(f"trace has {len(events)} GPU activities for {runs} calls")
    gaps = []
    end = events[0][1]
    for i in range(1, len(events)):
        gaps.append((events[i][0] - end, i))
        end = max(end, events[i][1])
    cuts = sorted(i for _, i in sorted(gaps, reverse=True)[: runs - 1])
    return [_span_busy(events[lo:hi]) for lo, hi in zip([0] + cuts, cuts + [len(events)])]


def _by_call(events: Sequence[_E], windows: list[tuple[int, int]]) -> list[list[_E]]:
    """The time-sorted activities (each starting with its start ns) that
    start inside each host window (windows time-sorted, apart), a list a
    window; activities outside every window (an untimed `before`) are left
    out. A call's own idle gaps cannot move its activities into another
    call, whatever their length."""
    starts = [s for s, _ in windows]
    groups: list[list[_E]] = [[] for _ in windows]
    for event in events:
        i = bisect.bisect_right(starts, event[0]) - 1
        if i >= 0 and event[0] <= windows[i][1]:
            groups[i].append(event)
    empty = [i for i, g in enumerate(groups) if not g]
    if empty:
        raise RuntimeError(f"{len(empty)} of {len(windows)} traced calls have no GPU activity "
                           f"inside their window (the first: call {empty[0]})")
    return groups


def _split_calls(events: Sequence[tuple],
                 windows: list[tuple[int, int]]) -> list[tuple[float, float, float | None]]:
    """Each call's (span, busy, launch gap) from the time-sorted activities
    (start ns, end ns[, GPU, ...]) inside its host window (_by_call)."""
    return [(*_span_busy([(a[0], a[1]) for a in g]), _launch_gap(g))
            for g in _by_call(events, windows)]


def _wall_clock(cases: dict[str, Callable[[], Any]], calls: int,
                samples: int) -> dict[str, float]:
    """Median µs per call of each case over `samples` samples, each `calls`
    calls dispatched back to back and one sync after the last (the time a
    program that dispatches a step after another sees). The cases take
    turns, one sample each; every sample starts on an idle device (the
    previous one ended with a sync)."""
    runs: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(samples):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            for _ in range(calls - 1):
                fn()
            jax.block_until_ready(fn())
            runs[name].append((time.perf_counter() - t0) / calls)
    return {name: statistics.median(v) * 1e6 for name, v in runs.items()}


def _case_medians(plan: Sequence[str], runs: Sequence[tuple],
                  rep: int) -> dict[str, dict[str, float]]:
    """Median span and busy µs of each case, `plan` naming the case of each
    run (span, busy[, launch gap]) in turns of `rep`; with rep > 1 the first
    run of every turn is left out. The launch gap's median too where every
    counted run of the case has one (_launch_gap)."""
    samples: dict[str, list[tuple]] = {}
    for i, (name, run) in enumerate(zip(plan, runs, strict=True)):
        samples.setdefault(name, [])
        if rep == 1 or i % rep:
            samples[name].append(run)
    out = {}
    for name, x in samples.items():
        out[name] = {"span_us": statistics.median(r[0] for r in x) * 1e6,
                     "busy_us": statistics.median(r[1] for r in x) * 1e6}
        gaps = [r[2] if len(r) > 2 else None for r in x]
        if gaps and None not in gaps:
            out[name]["launch_gap_us"] = statistics.median(gaps) * 1e6
    return out


def median_launch_gaps(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Of runs ({"cases": {name: clocks}} each, Session.time's), the median
    over the runs of each case's launch gap µs, for the cases that have one
    in every run (traced on more than one GPU by this process)."""
    names = runs[0]["cases"] if runs else {}
    gaps = {name: [r["cases"][name].get("launch_gap_us") for r in runs] for name in names}
    return {name: statistics.median(g) for name, g in gaps.items() if g and None not in g}


def rotate(fn: Callable[..., Any], inputs: Sequence[tuple]) -> Callable[[], Any]:
    """A call of `fn` on the next argument tuple of `inputs` each time."""
    return rotate_all({"fn": fn}, inputs)["fn"]


def every_gpu(on_cpu: int) -> list[jax.Device]:
    """Every GPU JAX sees; without one (a smoke run), its first `on_cpu`
    devices."""
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    return gpus or jax.devices()[:on_cpu]


def rotate_all(fns: dict[str, Callable[..., Any]],
               inputs: Sequence[tuple]) -> dict[str, Callable[[], Any]]:
    """Zero-argument calls of each of `fns` that share one turn through
    `inputs`: every call takes the next argument tuple, whichever case makes
    it, so that no case finds in L2 the inputs the case before it just read
    (cases with turns of their own would read the same ones in step)."""
    turn = itertools.cycle(inputs)
    return {name: (lambda fn=fn: fn(*next(turn))) for name, fn in fns.items()}


def _bits(x: jax.Array) -> jax.Array:
    """x viewed as unsigned integers of its element width (bool as uint8)."""
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint8)
    width = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[x.dtype.itemsize]
    return jax.lax.bitcast_convert_type(x, width)


@jax.jit
def _mismatches(a: jax.Array, b: jax.Array) -> jax.Array:
    """How many elements of a and b differ in their bits, and the first."""
    ne = (_bits(a) != _bits(b)).ravel()
    return jnp.stack([ne.sum(), jnp.argmax(ne)])


class Session:
    """One benchmark run: the timing protocol, the output checks, progress
    lines and the time budget of the op being run.

    `smoke`: the CPU code-path test (wall clock, tiny sizes); `refs`: the
    reference targets (references.load)."""

    def __init__(self, smoke: bool, refs: Any):
        self.smoke = smoke
        self.refs = refs
        self.checked: list[str] = []
        self.differs: dict[str, str] = {}
        self._start = time.monotonic()

    @property
    def timing_method(self) -> str:
        if self.smoke:
            return "smoke: wall clock per call on the CPU, not a measurement"
        return ("jax.profiler trace; per call the span (first GPU activity to last) and the "
                "busy time (union of GPU activities), median over the counted calls; cases "
                "interleaved (each result's `protocol` gives rounds, calls per turn and what "
                "ran untimed before each call); then, outside the trace, the wall clock: "
                "`wall.calls` calls dispatched without waiting and one sync, time per call, "
                "median of `wall.samples`, cases in turns")

    def log(self, message: str) -> None:
        print(f"[{time.monotonic() - self._start:6.1f} s] {message}", flush=True)

    def time(self, cases: dict[str, Callable[[], Any]], rounds: int, rep: int = 1,
             before: Callable[[], Any] | None = None,
             before_name: str | None = None, wall: bool = True,
             wall_calls: int = WALL_CALLS) -> dict[str, Any]:
        """Median span, busy and wall µs per call of each zero-argument case.

        The cases take turns: each round runs every case `rep` times in a row,
        so that slow drift (clocks, temperature) hits every case alike. With
        rep > 1 the first call of each turn, which pays for what the previous
        case left in L2, is not counted. `before`, if given, runs (untimed)
        ahead of every call, e.g. to set the L2 state; such cases have no wall
        clock (it would time `before` too), nor do those of `wall=False`
        (cases that wait for the device inside each call). `wall_calls`:
        calls dispatched per wall-clock sample (fewer where so many outputs
        would not fit in memory at once). Returns {"cases": {name: {"span_us",
        "busy_us"[, "wall_us"]}}, "protocol": {...}}."""
        for fn in cases.values():
            jax.block_until_ready(fn())
        plan = [name for _ in range(rounds) for name in cases for _ in range(rep)]
        if self.smoke:
            runs = []
            for name in plan:
                if before is not None:
                    jax.block_until_ready(before())
                self._before_call()
                t0 = time.perf_counter()
                jax.block_until_ready(cases[name]())
                runs.append((time.perf_counter() - t0,) * 2)
        else:
            runs = self._trace(cases, plan, before)
        medians = _case_medians(plan, runs, rep)
        protocol = {"rounds": rounds, "calls_per_turn": rep,
                    "counted_calls_per_case": rounds * (rep - 1 if rep > 1 else 1),
                    "untimed_before_each_call": before_name if before else None,
                    "wall": None}
        if wall and before is None:
            calls = 2 if self.smoke else max(2, wall_calls)
            samples = 2 if self.smoke else WALL_SAMPLES
            for name, us in _wall_clock(cases, calls, samples).items():
                medians[name]["wall_us"] = us
            protocol["wall"] = {"calls": calls, "samples": samples}
        return {"cases": medians, "protocol": protocol}

    def _before_call(self) -> None:
        """Runs right before each timed call (after its untimed `before`):
        nothing here; the processes' session aligns their launches."""

    @staticmethod
    def _trace(cases, plan, before) -> list[tuple[float, float, float | None]]:
        with tempfile.TemporaryDirectory() as d:
            jax.profiler.start_trace(d)
            for name in plan:
                if before is not None:
                    jax.block_until_ready(before())
                with jax.profiler.TraceAnnotation(CALL_ANNOTATION):
                    jax.block_until_ready(cases[name]())
            jax.profiler.stop_trace()
            activities, windows = _activities(d), _call_windows(d)
        if len(windows) != len(plan):
            raise RuntimeError(f"trace has {len(windows)} call annotations for {len(plan)} calls")
        return _split_calls(activities, windows)

    def streams(self, fn: Callable[[], Any], calls: int) -> dict[str, float]:
        """The GPU busy µs per call of each stream that `calls` traced calls
        of `fn` kept busy, by "GPU stream" name; none on the CPU."""
        jax.block_until_ready(fn())
        if self.smoke:
            return {}
        with tempfile.TemporaryDirectory() as d:
            jax.profiler.start_trace(d)
            for _ in range(calls):
                jax.block_until_ready(fn())
            jax.profiler.stop_trace()
            by_stream = _stream_events(d)
        return {f"{plane.removeprefix('/device:')} {line}": _busy_ns(sorted(e)) / 1e3 / calls
                for (plane, line), e in sorted(by_stream.items())}

    def timeline(self, fn: Callable[[], Any], calls: int) -> dict[str, Any] | None:
        """One call of `fn`, activity by activity: of `calls` traced calls,
        each in its host window, the one of median span; its span, when the
        host window opened, and each GPU activity's GPU, stream, name, start
        and end, in µs from the call's first activity (time-sorted). None on
        the CPU."""
        jax.block_until_ready(fn())
        if self.smoke:
            return None
        with tempfile.TemporaryDirectory() as d:
            traced = self._start_timeline_trace(d)
            for _ in range(calls):
                with jax.profiler.TraceAnnotation(CALL_ANNOTATION):
                    jax.block_until_ready(fn())
            if not traced:
                return None
            jax.profiler.stop_trace()
            activities, windows = _activities(d), _call_windows(d)
        groups = _by_call(activities, windows)
        if not groups:
            return None
        spans = [max(a.end_ns for a in g) - g[0].start_ns for g in groups]
        i = sorted(range(len(groups)), key=spans.__getitem__)[len(groups) // 2]
        t0 = groups[i][0].start_ns
        return {"span_us": spans[i] / 1e3, "host_window_us": (windows[i][0] - t0) / 1e3,
                "activities": [{"gpu": a.gpu.removeprefix("/device:"), "stream": a.stream,
                                "name": a.name, "start_us": (a.start_ns - t0) / 1e3,
                                "end_us": (a.end_ns - t0) / 1e3} for a in groups[i]]}

    def _start_timeline_trace(self, directory: str) -> bool:
        """Starts the profiler's trace of Session.timeline into `directory`."""
        jax.profiler.start_trace(directory)
        return True

    def check(self, name: str, got: Any, want: Any, *, comparator: bool = False) -> None:
        """Checks a case's output against the reference formulation, bit for
        bit (as unsigned integers of the element width). A jax_tma case or a
        reference kernel that differs is an error; an XLA comparator whose
        arithmetic differs (`comparator`) is recorded in the result."""
        got, want = jax.tree.leaves(got), jax.tree.leaves(want)
        problem = None
        for g, w in zip(got, want, strict=True):
            if g.shape != w.shape or g.dtype != w.dtype:
                problem = f"got {g.dtype}{list(g.shape)}, want {w.dtype}{list(w.shape)}"
                break
            if g.size:
                count, first = (int(v) for v in _mismatches(g, w))
                if count:
                    problem = f"{count} of {g.size} elements differ, the first at flat index {first}"
                    break
        if problem is None:
            self.checked.append(name)
        elif comparator:
            self.differs[name] = problem
            self.log(f"note: comparator {name} differs from the reference: {problem}")
        else:
            raise AssertionError(f"benchmark case {name}: output is not bit-exact: {problem}")


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """An op of benchmarks/run.py. Each bench_*.py module lists its own in
    BENCHMARKS ({op: Benchmark}); run.py collects them, naming none."""
    # The result of one run: (session, run.py's arguments) -> result dict.
    run: Callable[[Session, argparse.Namespace], dict[str, Any]]
    budget_s: float          # what it should take on one H100 (all of them: under 10 minutes)
    in_all: bool = True      # whether `run.py all` runs it
    devices: int = 1         # the devices it measures across (more: skipped in `all` without)
    every_device: bool = False  # across every GPU there is (at least `devices`; CPU: `devices`)
    not_in_smoke: str = ""   # why a smoke run (the CPU) cannot run it
    timing_method: str = ""  # how it is timed, where not by the session (e.g. "ncu")
    # It runs its cases in processes of its own, which need the GPUs' memory:
    # run.py runs it first and its own process preallocates none
    # (XLA_PYTHON_CLIENT_PREALLOCATE=false).
    own_processes: bool = False
    # The group whose name runs it with the group's other ops (`run.py NAME`):
    # "multi" (what gpu_check.sh's multi stage measures on two GPUs), "ncu"
    # (its ncu stage).
    group: str = ""
    # `run.py <op>-once`: each variant run once, untimed, for a profiler to
    # watch (ncu); returns the variants' labels, in order.
    once: Callable[[], list[str]] | None = None
