"""The all_to_all benchmark (two GPUs, bf16): jax_tma.all_to_all against
lax.all_to_all (NCCL), lax.ragged_all_to_all and the same exchange composed
from jax_tma.ppermute (n - 1 shifts and a local copy), and
jax_tma.ragged_all_to_all where this jax_tma has it (equal slices, and one
skewed case beside lax.ragged_all_to_all's); beside them the link's ceiling,
a jax_tma.ppermute that pushes the bytes that leave each GPU to one peer.
`all_to_all`: one process drives both GPUs; `all_to_all_processes`: one
process per GPU under jax.distributed (processes.py's workers, with this
module as their script).

On the GPU machine, with jax_tma and the benchmarks' extension built there
(run.py needs _jax_tma_bench on a GPU: JAX_TMA_CUDA=ON JAX_TMA_BENCH=ON, as
scripts/gpu_check.sh builds it, its folders on PYTHONPATH) and, where the
copy has no .git, benchmarks/tree_stamp.json from `python benchmarks/run.py
stamp` carried along:

    python benchmarks/bench_all_to_all.py --out-dir $OUT              # one process, 2 GPUs
    python benchmarks/bench_all_to_all.py --processes --out-dir $OUT  # one process per GPU
    python benchmarks/bench_all_to_all.py --quick --out-dir $OUT      # 64 KiB-128 MiB, 1 run
    python benchmarks/run.py a2a --out-dir benchmarks/results        # both, one JSON each

(run.py's other options too: --smoke, --allow-dirty, --sizes-mib; --quick
with --processes.) Each size: every case is called once on the same input
and its output on each device compared bit for bit (as unsigned integers)
with a NumPy reference made from the same seeded blocks, lax.all_to_all's
too; a jax_tma case that differs fails the benchmark, a lax one that differs
is recorded (harness.Session.check's comparators), and a case that raises
(lax.ragged_all_to_all across processes) is recorded as failed and left out.
Then REPETITIONS timed runs (harness.Session.time: the cases take turns
within each), each giving every case's busy time, span and wall clock; a
time is the median over the runs, a ratio the median of the runs' ratios.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # run as a script under `python -P`
    sys.path.insert(0, _HERE)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jax_tma  # noqa: E402
import processes  # noqa: E402
from bench_ppermute import topology  # noqa: E402
from harness import (MIB, Benchmark, Session, every_gpu, median_launch_gaps,  # noqa: E402
                     rotate_all)

OP = "all_to_all"
OP_PROCESSES = "all_to_all_processes"
MIN_DEVICES = 2  # it runs on every GPU there is, at least these
DTYPE = jnp.bfloat16
# Elements per row: 8 KiB rows, a token of a 4096-wide bf16 activation. The
# ragged cases' slices are whole rows.
ROW = 4096
FULL = [1 / 16, 1, 16, 128, 512, 1024]  # MiB of buffer per GPU
QUICK = [1 / 16, 1, 16, 128]
SMOKE = [1 / 16, 1 / 4]
REPETITIONS = 3  # timed runs per size (--quick: one)
ROUNDS = 5       # turns per run, two calls each (the first not counted)
# The wall clock: calls dispatched per sample, fewer from LARGE_BYTES (their
# outputs in flight at once).
WALL_CALLS, WALL_CALLS_LARGE, LARGE_BYTES = 100, 20, 16 * MIB
# The loop clock, below LARGE_BYTES (where a call's own wall clock measures
# its dispatch): one jitted program of LOOP_CALLS chained calls, per call.
LOOP_CALLS, LOOP_RUNS = 100, 3
# At these sizes, one traced call of each TIMELINE_CASES case, activity by
# activity on every GPU (in one process) or on a process's own (one process
# per GPU): Session.timeline, the one of median span of TIMELINE_CALLS. At
# 16 MiB across processes a single call's span has run past its busy time.
TIMELINE_MIB = (16,)
TIMELINE_CASES = ("jax_tma", "nccl")
TIMELINE_CALLS = 5
# The skewed ragged case: each device sends this share of its rows to the
# next device and splits the rest evenly over the others and itself.
HEAVY = 3 / 4
POISON = 0x7FC5  # the bits of the ragged cases' output buffers before a call (a NaN)
BYTES = ("per GPU: the bytes that leave each GPU per call, (n-1)/n of its buffer (in the "
         f"skewed ragged cases those of the GPU that sends the most, {HEAVY:g} of its buffer "
         "on two GPUs), not read + write; the ceiling pushes the same (n-1)/n to one peer")
# loop_busy_us: the GPU busy time per call in the loop program (a traced run
# of it), where a single call's busy time and span also measure how far apart
# the GPUs' launches were and the loop's wall clock may be the host's.
CLOCKS = ("busy_us", "span_us", "wall_us", "loop_us", "loop_busy_us")
# The cases, in the order they take turns. `ragged*`: jax_tma's, timed where
# jax_tma has ragged_all_to_all.
CASES = ("jax_tma", "nccl", "composed", "ragged", "lax_ragged", "ragged_skewed",
         "lax_ragged_skewed", "ceiling", "launch")
# `launch` (one process only): no exchange, one kernel a GPU (each flips a
# bit of every element of its block), so its span is how far apart a
# program's launches on the GPUs begin, plus a kernel; no exchange's single
# call can span less. It sends nothing, so it has no GB/s and no ratios.
_NO_BYTES = ("launch",)
_EQUAL = ("jax_tma", "composed", "ragged", "lax_ragged")  # lax.all_to_all's result
_SKEWED = ("ragged_skewed", "lax_ragged_skewed")
_LAX_RAGGED = ("lax_ragged", "lax_ragged_skewed")
# XLA's: an output that differs from the NumPy reference is recorded
# (harness.Session.check's comparators; XLA:CPU's all-to-all of bf16 drops
# NaN payloads), where jax_tma's fails the benchmark.
_LAX = ("nccl", *_LAX_RAGGED)
# Ratios besides every case's against NCCL and against the ceiling.
PAIRS = (("jax_tma", "composed"), ("ragged", "lax_ragged"), ("ragged", "jax_tma"),
         ("ragged_skewed", "lax_ragged_skewed"))
# The process mode: each worker's share of its own GPU, how long the workers
# may take, the pause after each traced call (processes.WorkerSession: no
# other process shares a GPU here), the buffers a worker holds at once
# besides the wall clock's outputs.
MEM_FRACTION = 0.75
LAYOUT_TIMEOUT_S = 480
CALL_GAP_S = 0.005
_BUFFERS_HELD = 14


def has_ragged() -> bool:
    return hasattr(jax_tma, "ragged_all_to_all")


def wall_calls(buffer: int) -> int:
    return WALL_CALLS if buffer < LARGE_BYTES else WALL_CALLS_LARGE


# ---- the exchanges ------------------------------------------------------------


def composed(b: jax.Array, n: int) -> jax.Array:
    """all_to_all(b, "i", 0, 0, tiled=True) from jax_tma.ppermute: the chunk
    that stays, and n - 1 shifts, shift k sending each device's chunk for
    the device k positions on; the chunks put in the senders' order. The
    bits move as unsigned ints: XLA:CPU's gather of bf16 (jax 0.10.2) drops
    NaN payloads."""
    me = lax.axis_index("i")
    dtype = b.dtype
    b = lax.bitcast_convert_type(b, jnp.dtype(f"uint{8 * dtype.itemsize}"))
    chunks = b.reshape(n, b.shape[0] // n, *b.shape[1:])
    parts = [chunks[me]]
    for k in range(1, n):
        parts.append(jax_tma.ppermute(chunks[(me + k) % n], "i",
                                      [(i, (i + k) % n) for i in range(n)]))
    # parts[k] came from position me - k: slot s holds parts[(me - s) % n].
    order = (me - jnp.arange(n)) % n
    out = jnp.take(jnp.stack(parts), order, axis=0, mode="clip").reshape(b.shape)
    return lax.bitcast_convert_type(out, dtype)


def _programs(mesh: Mesh, calls: int = 1) -> dict[str, Callable[..., jax.Array]]:
    """The jitted exchanges over `mesh` (axis "i", blocks along dim 0): the
    all_to_alls of a buffer, the ceiling's push of its block to the next
    device, and the ragged ones (operand, output, input_offsets, send_sizes,
    output_offsets, recv_sizes; the output donated). Each program makes
    `calls` calls, each of the one before's result (the ragged ones': its
    output)."""
    n = mesh.devices.size

    def spmd(f, args=1, **jit):
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("i"),) * args,
                                     out_specs=P("i")), **jit)

    def chained(f):
        def program(b):
            for _ in range(calls):
                b = f(b)
            return b
        return spmd(program)

    def ragged(fn):
        def program(b, o, *indices):
            for _ in range(calls):
                o = fn(b, o, *indices, axis_name="i")
            return o
        return spmd(program, 6, donate_argnums=1)

    out = {"jax_tma": chained(lambda b: jax_tma.all_to_all(b, "i", 0, 0, tiled=True)),
           "nccl": chained(lambda b: lax.all_to_all(b, "i", 0, 0, tiled=True)),
           "composed": chained(functools.partial(composed, n=n)),
           "lax_ragged": ragged(lax.ragged_all_to_all),
           "ceiling": chained(lambda b: jax_tma.ppermute(
               b, "i", [(i, (i + 1) % n) for i in range(n)], direction="push"))}
    if has_ragged():
        out["ragged"] = ragged(jax_tma.ragged_all_to_all)
    if jax.process_count() == 1:
        out["launch"] = chained(flip)
    return out


def flip(b: jax.Array) -> jax.Array:
    """`b` with the lowest bit of every element flipped: one XLA kernel, no
    exchange (the `launch` case)."""
    bits = lax.bitcast_convert_type(b, jnp.uint16)
    return lax.bitcast_convert_type(bits ^ jnp.uint16(1), b.dtype)


class _InPlace:
    """A ragged case: each call donates the output buffer and keeps the
    result as the next call's (every call writes the same rows, so each
    returns the same), as a program that owns its buffer does."""

    def __init__(self, fn: Callable[..., jax.Array], output: jax.Array,
                 offsets: Sequence[jax.Array]):
        self.fn, self.output, self.offsets = fn, output, tuple(offsets)

    def __call__(self, x: jax.Array, _ceiling_x: jax.Array) -> jax.Array:
        self.output = self.fn(x, self.output, *self.offsets)
        return self.output


# ---- the ragged plans and the NumPy references ---------------------------------


def equal_sizes(n: int, rows: int) -> np.ndarray:
    """sizes[i, j]: the rows device i sends device j, buffer/n each."""
    return np.full((n, n), rows // n, np.int64)


def skewed_sizes(n: int, rows: int) -> np.ndarray:
    """HEAVY of each device's rows to the next device, the rest split as
    evenly as rows allow over the others and itself, the odd rows to those
    nearest after the next (each device receives `rows` in all)."""
    sizes = np.zeros((n, n), np.int64)
    for i in range(n):
        heavy = int(rows * HEAVY)
        others = [(i + 1 + k) % n for k in range(1, n)]
        base, extra = divmod(rows - heavy, len(others))
        sizes[i, (i + 1) % n] = heavy
        for k, j in enumerate(others):
            sizes[i, j] = base + (k < extra)
    return sizes


def ragged_operands(sizes: np.ndarray) -> tuple[np.ndarray, ...]:
    """(input_offsets, send_sizes, output_offsets, recv_sizes), row i the
    arrays of device i, for senders' slices one after another in each
    operand and receivers' in the senders' order in each output."""
    input_offsets = np.cumsum(sizes, axis=1) - sizes
    output_offsets = np.cumsum(sizes, axis=0) - sizes  # where i's slice lands in j's output
    return input_offsets, sizes, output_offsets, sizes.T


def output_rows(sizes: np.ndarray) -> int:
    """The rows of a ragged case's output buffer: the most any device receives."""
    return int(sizes.sum(axis=0).max())


def all_to_all_reference(blocks: Sequence[np.ndarray], position: int) -> np.ndarray:
    """What position `position` holds after all_to_all(.., 0, 0, tiled=True)
    of the positions' `blocks`: chunk `position` of each, in order."""
    c = blocks[0].shape[0] // len(blocks)
    return np.concatenate([b[position * c:(position + 1) * c] for b in blocks])


def ragged_reference(blocks: Sequence[np.ndarray], sizes: np.ndarray, position: int,
                     output: np.ndarray) -> np.ndarray:
    """What position `position`'s `output` holds after the ragged exchange of
    `sizes` (ragged_operands) of the positions' `blocks`, as
    lax.ragged_all_to_all's documentation states it."""
    input_offsets, _, output_offsets, _ = ragged_operands(sizes)
    out = output.copy()
    for s, block in enumerate(blocks):
        size, src, dst = sizes[s, position], input_offsets[s, position], \
            output_offsets[s, position]
        out[dst:dst + size] = block[src:src + size]
    return out


# ---- one size -------------------------------------------------------------------


def _failure(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:500]


def _told(told: dict[int, str]) -> str:
    """What the processes said of a case (processes.agree), each text once
    with the processes that said it (none named in one process)."""
    if jax.process_count() == 1:
        return "; ".join(told.values())
    by_text: dict[str, list[str]] = {}
    for pid, text in told.items():
        by_text.setdefault(text, []).append(str(pid))
    return "; ".join(f"process{'es' if len(p) > 1 else ''} {', '.join(p)}: {text}"
                     for text, p in by_text.items())


def _sharded(mesh: Mesh, per_device: Sequence[np.ndarray]) -> jax.Array:
    """Host arrays, one per position, as one array sharded along dim 0."""
    whole = np.concatenate(per_device)
    return jax.make_array_from_callback(whole.shape, NamedSharding(mesh, P("i")),
                                        lambda index: whole[index])


def _filled(mesh: Mesh, rows: int) -> jax.Array:
    """A ragged case's output buffer: `rows` of POISON bits per device."""
    n = mesh.devices.size
    fill = jax.jit(lambda: lax.bitcast_convert_type(jnp.full((n * rows, ROW), POISON,
                                                             jnp.uint16), DTYPE),
                   out_shardings=NamedSharding(mesh, P("i")))
    return fill()


def measure(s: Session, mesh: Mesh, mib: float, repetitions: int) -> dict[str, Any]:
    """One buffer size per GPU: the cases made, called once and checked (on
    this process's devices; the processes agree on the cases that raised),
    then timed `repetitions` times. The clocks as measured here, per run."""
    n, buffer = mesh.devices.size, int(mib * MIB)
    rows = buffer // (ROW * jnp.dtype(DTYPE).itemsize)
    if rows == 0 or rows % n:
        raise ValueError(f"{OP}: {mib:g} MiB per GPU is {rows} rows of {ROW} "
                         f"{jnp.dtype(DTYPE).name}, not a multiple of the {n} devices")
    # Two inputs to take turns through, and two of the ceiling's (its block,
    # (n-1)/n of the buffer); small seeds (jax.random.key takes 32 bits).
    base = buffer % 1_000_003
    seeds, ceiling_seeds = (base, base + 1), (base + 2, base + 3)
    ceiling_rows = rows * (n - 1) // n
    row_bytes = ROW * jnp.dtype(DTYPE).itemsize
    inputs = [(processes.global_input(mesh, seed, (rows, ROW), DTYPE),
               processes.global_input(mesh, ceiling_seed, (ceiling_rows, ROW), DTYPE))
              for seed, ceiling_seed in zip(seeds, ceiling_seeds)]
    plans = {"equal": equal_sizes(n, rows), "skewed": skewed_sizes(n, rows)}
    operands = {plan: [_sharded(mesh, [a.astype(np.int32) for a in arrays])
                       for arrays in ragged_operands(plans[plan])] for plan in plans}

    def make(programs):
        cases: dict[str, Callable[..., jax.Array]] = {
            "jax_tma": lambda x, cx: programs["jax_tma"](x),
            "nccl": lambda x, cx: programs["nccl"](x),
            "composed": lambda x, cx: programs["composed"](x),
            "ceiling": lambda x, cx: programs["ceiling"](cx)}
        if "launch" in programs:
            cases["launch"] = lambda x, cx: programs["launch"](x)
        for plan, suffix in (("equal", ""), ("skewed", "_skewed")):
            for name in ("lax_ragged", "ragged"):
                if name in programs:  # each its own output buffer
                    cases[name + suffix] = _InPlace(
                        programs[name], _filled(mesh, output_rows(plans[plan])),
                        operands[plan])
        return {name: cases[name] for name in CASES if name in cases}

    cases = make(_programs(mesh))
    sent = {name: 0 if name in _NO_BYTES else (n - 1) * (rows // n) * row_bytes
            for name in cases}
    for name in set(_SKEWED) & set(cases):
        sent[name] = int(max(rows - plans["skewed"][i, i] for i in range(n))) * row_bytes
    failed = _check(s, mesh, mib, cases, inputs[0], plans, seeds[0], ceiling_seeds[0])
    timed = {name: fn for name, fn in cases.items() if name not in failed}
    loops = {}
    if buffer < LARGE_BYTES:  # compiled and run once before any is timed
        loops = {name: fn for name, fn in make(_programs(mesh, LOOP_CALLS)).items()
                 if name in timed}
        for fn in loops.values():
            jax.block_until_ready(fn(*inputs[0]))
    runs = []
    for r in range(repetitions):
        t = s.time(rotate_all(timed, inputs), 2 if s.smoke else ROUNDS, rep=2,
                   wall_calls=wall_calls(buffer))
        runs.append({"cases": processes.clean(t["cases"]), "protocol": t["protocol"]})
        steady = processes.clean(s.time({name: functools.partial(fn, *inputs[r % 2])
                                         for name, fn in loops.items()}, 1, wall=False)["cases"]
                                 ) if loops else {}
        for name, c in runs[-1]["cases"].items():
            c["loop_us"] = _loop_us(loops[name], inputs[r % 2]) if name in loops else None
            busy = steady.get(name, {}).get("busy_us")
            c["loop_busy_us"] = None if busy is None else busy / LOOP_CALLS
        s.log(f"{OP} {mib:g} MiB per GPU, run {r + 1} of {repetitions}, span µs: " + ", ".join(
            f"{name} {'—' if c['span_us'] is None else round(c['span_us'], 1)}"
            for name, c in runs[-1]["cases"].items()))
    timelines = {}
    if mib in TIMELINE_MIB:
        for name in TIMELINE_CASES:
            t = s.timeline(functools.partial(timed[name], *inputs[0]),
                           TIMELINE_CALLS) if name in timed else None
            if t is not None:
                timelines[name] = t
    return {"buffer_bytes": buffer, "rows_per_gpu": rows, "row_bytes": row_bytes,
            "ceiling_rows_per_gpu": ceiling_rows, "sent_bytes": sent,
            "skewed_sizes": plans["skewed"].tolist(), "wall_calls": wall_calls(buffer),
            "failed": failed, "runs": runs, "timeline": timelines}


def _loop_us(program: Callable[..., jax.Array], inputs: tuple[jax.Array, jax.Array]) -> float:
    """µs per call of a program of LOOP_CALLS chained calls: the fastest of
    LOOP_RUNS runs (the host's jitter adds, never subtracts)."""
    best = float("inf")
    for _ in range(LOOP_RUNS):
        start = time.perf_counter()
        jax.block_until_ready(program(*inputs))
        best = min(best, time.perf_counter() - start)
    return best * 1e6 / LOOP_CALLS


def _check(s: Session, mesh: Mesh, mib: float, cases: dict[str, Callable[..., jax.Array]],
           first: tuple[jax.Array, jax.Array], plans: dict[str, np.ndarray], seed: int,
           ceiling_seed: int) -> dict[str, str]:
    """Calls each case once on `first` and checks its output on each of this
    process's devices against the NumPy reference, bit for bit; returns
    {case: why} of those that raised (on any process)."""
    devices = list(mesh.devices.flat)
    n, home = len(devices), mesh.local_devices[0]
    rows, ceiling_rows = first[0].shape[0] // n, first[1].shape[0] // n

    def host(seed_, shape):
        return [np.asarray(processes.local_block(home, seed_, p, shape, DTYPE)).view(np.uint16)
                for p in range(n)]

    blocks = host(seed, (rows, ROW))
    ceiling_blocks = host(ceiling_seed, (ceiling_rows, ROW))
    on_device: dict[tuple[str, int], jax.Array] = {}

    def reference(kind: str, p: int) -> jax.Array:
        """The NumPy reference of `kind` for position p, on its device."""
        if (kind, p) not in on_device:
            if kind == "all_to_all":
                want = all_to_all_reference(blocks, p)
            elif kind == "ceiling":
                want = ceiling_blocks[(p - 1) % n]
            elif kind == "launch":
                want = blocks[p] ^ np.uint16(1)
            else:
                poison = np.full((output_rows(plans[kind]), ROW), POISON, np.uint16)
                want = ragged_reference(blocks, plans[kind], p, poison)
            on_device[kind, p] = jax.device_put(want.view(DTYPE), devices[p])
        return on_device[kind, p]

    # lax.ragged_all_to_all last: across processes it raises.
    order = [c for c in cases if c not in _LAX_RAGGED] + [c for c in cases if c in _LAX_RAGGED]
    failed: dict[str, str] = {}
    size = f"{mib:g} MiB"
    for name in order:
        try:
            out = jax.block_until_ready(cases[name](*first))
            mine = None
        except Exception as e:  # noqa: BLE001 (whatever the case raised: recorded)
            out, mine = None, _failure(e)
        told = processes.agree(f"{OP} {size} {name}", mine)
        if told:
            failed[name] = _told(told)
            s.log(f"{OP} {size}: {name} failed, left out: {failed[name]}")
            continue
        kind = ("all_to_all" if name in ("nccl", *_EQUAL) else
                name if name in ("ceiling", "launch") else "skewed")
        for shard in out.addressable_shards:
            p = devices.index(shard.device)
            s.check(f"{name} {size}: device {p}", shard.data, reference(kind, p),
                    comparator=name in _LAX)
        del out
    return failed


# ---- the results -------------------------------------------------------------------


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _gbps(nbytes: int, us: float | None) -> float | None:
    return None if not us else nbytes / us / 1e3


def summarize(runs: Sequence[dict[str, Any]], sent: dict[str, int]) -> dict[str, Any]:
    """Each case's median clocks over the runs and its GB/s per GPU by each
    (sent bytes over the median time), and the ratios: every case's GB/s
    against NCCL's and the ceiling's and those of PAIRS, "a_vs_b" = a's GB/s
    ÷ b's (b's time ÷ a's where they send the same bytes), by each clock,
    the median of the runs' ratios."""
    names = list(runs[0]["cases"]) if runs else []
    times = {v: {c: _median([r["cases"][v].get(c) for r in runs]) for c in CLOCKS}
             for v in names}
    gbps = {v: {c.removesuffix("_us"): _gbps(sent[v], t[c]) for c in CLOCKS}
            for v, t in times.items() if v not in _NO_BYTES}
    pairs = [(v, b) for b in ("nccl", "ceiling") for v in names
             if v != b and v not in _NO_BYTES] + list(PAIRS)
    ratios = {}
    for a, b in pairs:
        if a not in names or b not in names:
            continue
        per_run = {c: [] for c in CLOCKS}
        for r in runs:
            for c in CLOCKS:
                ta, tb = r["cases"][a].get(c), r["cases"][b].get(c)
                if ta and tb:
                    per_run[c].append((sent[a] / ta) / (sent[b] / tb))
        ratios[f"{a}_vs_{b}"] = {c.removesuffix("_us"): _median(v) for c, v in per_run.items()}
    return {"times": times, "gbps": gbps, "ratios": ratios,
            "launch_gap_us": median_launch_gaps(runs)}


def _row(raw: dict[str, Any], peer: dict[str, Any] | None = None) -> dict[str, Any]:
    row = {k: v for k, v in raw.items()}
    row["buffer_mib"] = raw["buffer_bytes"] / MIB
    row.update(summarize(raw["runs"], raw["sent_bytes"]))
    if peer is not None:  # the other process's busy time beside
        row["peer_busy_us"] = {v: _median([r["cases"][v]["busy_us"] for r in peer["runs"]])
                               for v in peer["runs"][0]["cases"]} if peer["runs"] else {}
    return row


def _sizes(s: Session, sizes_mib: Sequence[float] | None, quick: bool) -> list[float]:
    return list(sizes_mib or (SMOKE if s.smoke else QUICK if quick else FULL))


def _common(quick: bool, repetitions: int, ragged: bool, one_process: bool) -> dict[str, Any]:
    not_run = {} if ragged else {name: "this jax_tma has no ragged_all_to_all"
                                 for name in ("ragged", "ragged_skewed")}
    if not one_process:
        not_run["launch"] = ("one process per GPU: each process traces its own GPU, so no "
                             "launches apart to measure")
    return {"bytes_convention": BYTES, "dtype": jnp.dtype(DTYPE).name, "row_elements": ROW,
            "exchange": "split_axis=0, concat_axis=0, tiled=True", "quick": quick,
            "repetitions": repetitions, "heavy_share": HEAVY, "cases": list(CASES),
            "not_run": not_run,
            "ratio_method": "each run times every case in turns; a ratio is the median over "
                            "the runs of that run's ratio; times are the median over the runs",
            "wall_calls_rule": f"{WALL_CALLS} calls per wall-clock sample below "
                               f"{LARGE_BYTES // MIB} MiB, {WALL_CALLS_LARGE} from there",
            "loop_rule": f"below {LARGE_BYTES // MIB} MiB, one jitted program of {LOOP_CALLS} "
                         f"chained calls (each of the one before's result), per call, the "
                         f"fastest of {LOOP_RUNS} runs",
            "loop_busy_rule": f"the GPU busy time per call of one traced run of the loop "
                              f"program (the union of its GPUs' activity, ÷ {LOOP_CALLS})"}


def bench_all_to_all(s: Session, sizes_mib: Sequence[float] | None = None,
                     quick: bool = False) -> dict[str, Any]:
    """One process driving every GPU (MIN_DEVICES devices on the CPU):
    every size measured."""
    devices = every_gpu(MIN_DEVICES)
    if len(devices) < MIN_DEVICES:
        raise RuntimeError(f"{OP}: needs {MIN_DEVICES} devices, has {len(devices)}")
    mesh = Mesh(np.array(devices), ("i",))
    repetitions = 1 if quick else REPETITIONS
    # As scripts/gpu_check.sh runs NCCL (and the process mode's workers):
    # NVLink multicast off. NCCL reads it when its first communicator starts.
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    with processes.Lowerings(with_op=True).watching() as lowerings:
        rows = [_row(measure(s, mesh, mib, repetitions))
                for mib in _sizes(s, sizes_mib, quick)]
    return {"op": OP, **_common(quick, repetitions, has_ragged(), True), "n": len(devices),
            "devices": [d.device_kind for d in devices], "rows": rows,
            "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"),
            "lowerings": list(lowerings.seen), "topology": topology()}


def worker(spec: dict[str, Any]) -> None:
    """One process of all_to_all_processes: its GPU, the mesh over every
    process's, every size of spec["sizes_mib"]; what it measured, as JSON in
    spec["out"]."""
    processes.initialize(spec)
    s = processes.WorkerSession(spec["smoke"], None)
    s.call_gap_s = CALL_GAP_S
    mesh = Mesh(np.array(jax.devices()), ("i",))
    s.log(f"{spec['layout']}: process {jax.process_index()} of {jax.process_count()}, "
          f"mesh {list(mesh.devices.flat)}")
    with processes.Lowerings(with_op=True).watching() as lowerings:
        rows = [measure(s, mesh, mib, spec["repetitions"])
                for mib in spec["sizes_mib"]]
    with open(spec["out"], "w") as f:
        json.dump({"devices": [d.device_kind for d in mesh.devices.flat], "rows": rows,
                   "checked": s.checked, "differs": s.differs, "untraced": s.untraced,
                   "lowerings": list(lowerings.seen), "has_ragged": has_ragged()}, f)


def bench_all_to_all_processes(s: Session, sizes_mib: Sequence[float] | None = None,
                               quick: bool = False) -> dict[str, Any]:
    """A worker process per GPU (every GPU visible, each process given its
    own by jax.distributed's local_device_ids; MIN_DEVICES on the CPU):
    every size measured; worker 0's clocks, the last one's busy time
    beside."""
    gpus = [] if s.smoke else processes.visible_gpus()
    if not s.smoke and len(gpus) < MIN_DEVICES:
        raise RuntimeError(f"{OP_PROCESSES}: {len(gpus)} GPU(s) visible, it needs "
                           f"{MIN_DEVICES} (nvidia-smi -L, CUDA_VISIBLE_DEVICES)")
    n = len(gpus) or MIN_DEVICES
    totals = [m[0] for g in gpus if (m := processes.memory_mib(g))]
    sizes, left_out = processes.fitting(
        _sizes(s, sizes_mib, quick), min(totals) if totals else None, MEM_FRACTION,
        lambda b: b * (_BUFFERS_HELD + wall_calls(b)), "buffers")
    for gpu in gpus:
        processes.check_free(OP_PROCESSES, gpu, 1, MEM_FRACTION)
    repetitions = 1 if quick else REPETITIONS
    spec = {"smoke": s.smoke, "sizes_mib": sizes, "repetitions": repetitions,
            "own_gpu": True}
    visible = [",".join(gpus)] * n if gpus else [None] * n
    s.log(f"{OP_PROCESSES}: {n} processes, " + ("on the CPU" if s.smoke else
                                                      f"CUDA_VISIBLE_DEVICES {visible[0]}"))
    workers = processes.run_workers(s, OP_PROCESSES, __file__, "per_gpu", visible, spec, {},
                                    timeout_s=LAYOUT_TIMEOUT_S, fraction=MEM_FRACTION)
    for pid, w in enumerate(workers):
        s.checked.extend(f"process {pid}: {label}" for label in w["checked"])
        s.differs.update({f"process {pid}: {label}": why for label, why in w["differs"].items()})
    ragged = all(w["has_ragged"] for w in workers)
    return {"op": OP_PROCESSES, **_common(quick, repetitions, ragged, False), "n": n,
            "devices": workers[0]["devices"], "processes": n,
            "cuda_visible_devices": visible, "mem_fraction": MEM_FRACTION,
            "sizes_left_out": left_out,
            "clocks": "worker 0's clocks of its own GPU's activity (harness.Session: busy, span, "
                      "wall per call); peer_busy_us: the other worker's busy time",
            "rows": [_row(ours, peer) for ours, peer in zip(workers[0]["rows"],
                                                            workers[-1]["rows"])],
            "lowerings": workers[0]["lowerings"],
            "untraced": {pid: w["untraced"] for pid, w in enumerate(workers) if w["untraced"]},
            "topology": None if s.smoke else topology()}


def _quick(args: Any) -> bool:
    return bool(getattr(args, "quick", False))


BENCHMARKS = {
    OP: Benchmark(lambda s, args: bench_all_to_all(s, args.sizes_mib, _quick(args)),
                  budget_s=240, in_all=False, devices=MIN_DEVICES, every_device=True,
                  group="a2a"),
    OP_PROCESSES: Benchmark(
        lambda s, args: bench_all_to_all_processes(s, args.sizes_mib, _quick(args)),
        budget_s=240, in_all=False, devices=MIN_DEVICES, every_device=True,
        own_processes=True, group="a2a"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """This module as run.py's command line for its ops: `--processes` picks
    all_to_all_processes, every other argument is run.py's."""
    argv = list(sys.argv[1:] if argv is None else argv)
    op = OP_PROCESSES if "--processes" in argv else OP
    import run

    return run.main([op, *(a for a in argv if a != "--processes")])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        processes.worker_main(worker)
    else:
        sys.exit(main())
