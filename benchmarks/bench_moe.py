"""The MoE benchmark (two GPUs, bf16): jax_tma.moe_dispatch and
jax_tma.moe_combine, alone and as a pair, at DeepEP's shapes and a decode
step, against the two routes a user writes in lax (a sort, the counts
exchanged, lax.ragged_all_to_all and a permute, both ways; and a dense
lax.all_to_all of capacity-padded buffers) and against one
jax_tma.all_to_all of the same bytes. `moe`: one process drives every GPU;
`moe_processes`: one process per GPU under jax.distributed
(processes.py's workers, with this module as their script).

On the GPU machine, with jax_tma built there (as for bench_all_to_all.py:
run.py needs _jax_tma_bench on a GPU) and, where the copy has no .git,
benchmarks/tree_stamp.json from `python benchmarks/run.py stamp`:

    python benchmarks/bench_moe.py --out-dir $OUT              # one process, every GPU
    python benchmarks/bench_moe.py --processes --out-dir $OUT  # one process per GPU
    python benchmarks/run.py ep --out-dir benchmarks/results   # both, one JSON each

(run.py's other options too: --smoke, --allow-dirty, --quick: one timed
run instead of REPETITIONS.) Each shape: the routing is made on the host
from a fixed seed (each token's top k of E experts by scores |N(0, 1)| + 1,
as DeepEP's tests make it), the tokens are small integers in bf16 and the
weights powers of two, so that every sum of every route is exact and every
route's result is bit for bit the same. Every case is called once and its
output on each device compared bit for bit with a reference made on one
device from every position's inputs, made again from their seeds (the
contract of moe_dispatch: rows expert-major, then (source, token, choice));
a jax_tma case that differs fails the benchmark, a lax route's is recorded,
and a case that raises (lax.ragged_all_to_all across processes) is recorded
as failed and left out. Then REPETITIONS timed runs of the fast cases
(harness.Session.time: they take turns within each) and one sparse run of
the lax.ragged_all_to_all route (tens of ms a call at DeepEP's shape); at
the decode shape also a jitted loop of LOOP_CALLS calls of each case.
"""

from __future__ import annotations

import dataclasses
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
# What a case raised, and what the processes told of it: as all_to_all's benchmark says it.
from bench_all_to_all import _failure, _told  # noqa: E402
from bench_ppermute import topology  # noqa: E402
from harness import (Benchmark, Session, every_gpu, median_launch_gaps,  # noqa: E402
                     rotate_all)

OP = "moe"
OP_PROCESSES = "moe_processes"
MIN_DEVICES = 2  # it runs on every GPU there is, at least these
DTYPE = jnp.bfloat16
SEED = 43  # the routing's and the tokens' (each position folds in its own)


@dataclasses.dataclass(frozen=True)
class Shape:
    """A case of the benchmark: T tokens of H elements per device, each with
    k choices of E experts."""
    name: str
    tokens: int
    hidden: int
    k: int
    experts: int
    loop: bool  # also timed in a jitted loop of LOOP_CALLS calls
    what: str

    def local(self, n: int) -> int:
        return self.experts // n


SHAPES = (
    Shape("deepep", 4096, 7168, 8, 32, False, "DeepEP's shape: top-8 of 32 experts"),
    Shape("deepep_256", 4096, 7168, 8, 256, False,
          "DeepEP's test routing: top-8 of 256 experts"),
    Shape("decode", 128, 7168, 8, 32, True, "a decode step: top-8 of 32 experts"),
)
# The same code paths at tiny sizes (the CPU: --smoke); deepep_256 differs
# from deepep in its numbers alone, and each shape compiles every case again.
SMOKE_SHAPES = (
    Shape("deepep", 16, 128, 8, 32, False, SHAPES[0].what),
    Shape("decode", 4, 128, 8, 32, True, SHAPES[2].what),
)
REPETITIONS = 3  # timed runs of the fast cases per shape (--quick: one)
ROUNDS = 5       # turns per run, two calls each (the first not counted)
# The lax.ragged_all_to_all route: one run of SPARSE_ROUNDS calls per case,
# no wall clock (a call takes tens of ms at DeepEP's shape, where the wall
# clock is its span).
SPARSE_ROUNDS = 3
# The wall clock: calls dispatched per sample (every dispatch's output in
# flight at once: 0.94 GB of dropless recv per GPU at DeepEP's shape).
WALL_CALLS, WALL_CALLS_LARGE = 100, 10
LOOP_CALLS, LOOP_RUNS = 100, 3  # the loop clock: calls per program, runs (fastest kept)
# The tokens: integers in [-TOKEN_MAX, TOKEN_MAX]; the weights: WEIGHTS; the
# experts add (e mod 5) - 2 to their rows. Every product and every sum, in
# any order, is exact in bf16 (8 choices of |w·y| <= 6 in steps of 1/4).
TOKEN_MAX = 4
WEIGHTS = (0.25, 0.5, 1.0)
BYTES = ("per GPU, as DeepEP counts them: the bytes of the tokens a GPU receives, one copy "
         "per (token, destination device), its own included, the mean over the GPUs; "
         "dispatch and combine each count them once, the pair twice; the all_to_all of the "
         "same bytes counts every row it receives. NVLink bytes: what each GPU receives "
         "from the others in each case's own formulation (rows and the metadata it sends)")
# loop_busy_us: the GPU busy time per call of a traced run of the loop
# program (bench_all_to_all's).
CLOCKS = ("busy_us", "span_us", "wall_us", "loop_us", "loop_busy_us")
# The cases, in the order they take turns.
CASES = ("dispatch", "combine", "pair", "a2a", "dense_dispatch", "dense_combine", "dense_pair",
         "lax_dispatch", "lax_combine", "lax_pair")
OURS = ("dispatch", "combine", "pair", "a2a")  # jax_tma's: a difference fails the benchmark
SPARSE = ("lax_dispatch", "lax_combine", "lax_pair")
# The ratios (a_vs_b: b's time ÷ a's, above 1 a is faster).
PAIRS = (("dispatch", "lax_dispatch"), ("combine", "lax_combine"), ("pair", "lax_pair"),
         ("dispatch", "dense_dispatch"), ("combine", "dense_combine"), ("pair", "dense_pair"),
         ("dispatch", "a2a"))
# At a loop shape: one call of each of these, activity by activity on every
# GPU (in one process) or on a process's own (one process per GPU):
# Session.timeline, the median span of TIMELINE_CALLS traced calls, to show
# where a single call's span goes.
TIMELINE_CASES = ("dispatch", "a2a")
TIMELINE_CALLS = 5
# The process mode: each worker's share of its GPU, how long the workers may
# take, the pause after each traced call (processes.WorkerSession).
MEM_FRACTION = 0.75
LAYOUT_TIMEOUT_S = 480
CALL_GAP_S = 0.005
# lax.ragged_all_to_all, which the lax route calls (a test puts
# jax_tma.ragged_all_to_all, its bit-exact twin, in its place where XLA
# has none: the CPU).
lax_ragged_all_to_all = lax.ragged_all_to_all
_I32 = jnp.int32


# ---- the routes ----------------------------------------------------------------


def _exclusive(a: jax.Array, axis: int = 0) -> jax.Array:
    return jnp.cumsum(a, axis, dtype=_I32) - a


def _per_expert(flat: jax.Array, experts: int) -> jax.Array:
    return jnp.zeros(experts, _I32).at[flat].add(1)


def _ranks(flat: jax.Array, experts: int) -> tuple[jax.Array, jax.Array]:
    """The stable sort of the choices by expert, and each choice's rank among
    its expert's (in (token, choice) order)."""
    order = jnp.argsort(flat, stable=True).astype(_I32)
    start = _exclusive(_per_expert(flat, experts))
    rank = jnp.zeros(flat.shape[0], _I32).at[order].set(
        jnp.arange(flat.shape[0], dtype=_I32) - start[flat[order]])
    return order, rank


def _segment_rows(sizes: jax.Array, rows: int) -> tuple[jax.Array, jax.Array]:
    """For each of `rows` rows laid out as the segments `sizes` one after
    another: its segment (len(sizes) past the last) and its place in it."""
    ends = jnp.cumsum(sizes, dtype=_I32)
    at = jnp.arange(rows, dtype=_I32)
    segment = jnp.searchsorted(ends, at, side="right").astype(_I32)
    last = jnp.minimum(segment, sizes.shape[0] - 1)
    return segment, at - (ends[last] - sizes[last])


def expert_major(here: jax.Array, rows: int) -> jax.Array:
    """`here` (n, L): the rows this device received from each source for each
    local expert, source-major as lax.ragged_all_to_all lands them (each
    source's in expert order). For each of `rows` rows of the expert-major
    layout (expert, then source), the received row that fills it; `rows`
    where none does."""
    n, local = here.shape
    segment, within = _segment_rows(here.T.reshape(-1), rows)  # segments (expert, source)
    last = jnp.minimum(segment, n * local - 1)
    start = _exclusive(here.reshape(-1)).reshape(n, local)
    return jnp.where(segment < n * local, start[last % n, last // n] + within, rows)


def source_major(here: jax.Array, rows: int) -> jax.Array:
    """expert_major's inverse: for each received row (source-major), its row
    of the expert-major layout; `rows` past the received total."""
    n, local = here.shape
    segment, within = _segment_rows(here.reshape(-1), rows)  # segments (source, expert)
    last = jnp.minimum(segment, n * local - 1)
    start = _exclusive(here.T.reshape(-1)).reshape(local, n)
    return jnp.where(segment < n * local, start[last % local, last // local] + within, rows)


def _take(a: jax.Array, index: jax.Array) -> jax.Array:
    return jnp.take(a, index, axis=0, mode="fill", fill_value=0)


def _weighted(rows: jax.Array, w: jax.Array, dtype) -> jax.Array:
    """Each token's sum over its k rows (T·k, H) times their weights, in
    float32, as `dtype`."""
    tokens, k = w.shape
    return jnp.sum(rows.reshape(tokens, k, -1).astype(jnp.float32) * w[:, :, None],
                   axis=1).astype(dtype)


def lax_dispatch(x: jax.Array, ids: jax.Array, *, experts: int) -> tuple[jax.Array, Any]:
    """The lax.ragged_all_to_all route a user writes, inside shard_map over
    "i": the (token, choice) pairs sorted by expert, one row each; every
    device's count per expert (all_gather: the sender needs the offsets in
    its receivers' buffers); the exchange into a buffer of n·T·k rows; the
    rows permuted expert-major on the receiver: moe_dispatch's recv. Returns
    (recv, (order, counts)) for lax_combine."""
    n, me = lax.axis_size("i"), lax.axis_index("i")
    tokens, k = ids.shape
    local = experts // n
    flat = ids.reshape(-1).astype(_I32)
    order = jnp.argsort(flat, stable=True).astype(_I32)
    counts = lax.all_gather(_per_expert(flat, experts), "i")  # [source, expert]
    sizes = counts.reshape(n, n, local).sum(2, dtype=_I32)  # [source, destination]
    rows = n * tokens * k
    got = lax_ragged_all_to_all(
        jnp.take(x, order // k, axis=0), jnp.zeros((rows, x.shape[1]), x.dtype),
        _exclusive(sizes[me]), sizes[me], _exclusive(sizes, 0)[me], sizes[:, me],
        axis_name="i")
    here = lax.dynamic_slice_in_dim(counts, me * local, local, axis=1)
    return _take(got, expert_major(here, rows)), (order, counts)


def lax_combine(y: jax.Array, state: Any, w: jax.Array) -> jax.Array:
    """The reverse route: y's rows in the received order, the exchange home
    (k rows a token), unsorted, each token's weighted sum in float32."""
    order, counts = state
    n, me = lax.axis_size("i"), lax.axis_index("i")
    tokens, k = w.shape
    local = counts.shape[1] // n
    sizes = counts.reshape(n, n, local).sum(2, dtype=_I32)
    here = lax.dynamic_slice_in_dim(counts, me * local, local, axis=1)
    back = _take(y, source_major(here, y.shape[0]))
    home = lax_ragged_all_to_all(
        back, jnp.zeros((tokens * k, y.shape[1]), y.dtype), _exclusive(sizes[:, me]),
        sizes[:, me], _exclusive(sizes, 1)[:, me], sizes[me], axis_name="i")
    unsorted = jnp.zeros(tokens * k, _I32).at[order].set(jnp.arange(tokens * k, dtype=_I32))
    return _weighted(jnp.take(home, unsorted, axis=0), w, y.dtype)


def dense_dispatch(x: jax.Array, ids: jax.Array, *, experts: int,
                   capacity: int) -> tuple[jax.Array, jax.Array]:
    """The dense route: each choice's row scattered into its expert's
    `capacity` slots of an (E·capacity, H) buffer (zeros where unused), one
    lax.all_to_all of it: every device gets (n, E/n, capacity) rows, source,
    expert, slot. Returns (recv, each choice's slot) for dense_combine."""
    tokens, k = ids.shape
    flat = ids.reshape(-1).astype(_I32)
    _, rank = _ranks(flat, experts)
    slot = jnp.where(rank < capacity, flat * capacity + rank, experts * capacity)
    buffer = jnp.zeros((experts * capacity, x.shape[1]), x.dtype).at[slot].set(
        jnp.repeat(x, k, axis=0), mode="drop")
    return lax.all_to_all(buffer, "i", 0, 0, tiled=True), slot


def dense_combine(y: jax.Array, slot: jax.Array, w: jax.Array) -> jax.Array:
    """Its reverse: the slots home (one lax.all_to_all), each choice's row
    taken from its slot, each token's weighted sum in float32."""
    back = lax.all_to_all(y, "i", 0, 0, tiled=True)
    return _weighted(_take(back, slot), w, y.dtype)


def _shift(e: jax.Array) -> jax.Array:
    """What expert e adds to its rows: (e mod 5) - 2."""
    return (e % 5 - 2).astype(jnp.float32)


def _experts(recv: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """The experts' outputs in recv's layout (expert-major, packed): each
    row plus its expert's shift."""
    local = group_sizes.shape[0]
    segment, _ = _segment_rows(group_sizes, recv.shape[0])
    expert = lax.axis_index("i") * local + segment
    return (recv.astype(jnp.float32) + _shift(expert)[:, None]).astype(recv.dtype)


def _dense_experts(recv: jax.Array, *, experts: int, capacity: int) -> jax.Array:
    """The same in the dense layout (source, local expert, slot)."""
    local = experts // lax.axis_size("i")
    row = jnp.arange(recv.shape[0], dtype=_I32)
    expert = lax.axis_index("i") * local + row // capacity % local
    return (recv.astype(jnp.float32) + _shift(expert)[:, None]).astype(recv.dtype)


def _touched(args: tuple, out: Any) -> tuple:
    """The loop clock's chain: `args` for the next call, made to wait for
    `out` (its first element replaces args[0]'s where it is NaN, which it
    never is, and adds to ids' first where it is NaN: the routing is no
    loop invariant that XLA could hoist)."""
    v = jax.tree.leaves(out)[0].reshape(-1)[0]
    never = v != v
    first = args[0]
    new = [first.at[0, 0].set(jnp.where(never, v.astype(first.dtype), first[0, 0]))]
    for a in args[1:]:
        if isinstance(a, jax.Array) and a.ndim == 2 and jnp.issubdtype(a.dtype, jnp.integer):
            a = a.at[0, 0].add(never.astype(a.dtype))
        new.append(a)
    return tuple(new)


def programs(mesh: Mesh, shape: Shape, capacity: int,
             loop: bool = False) -> dict[str, Callable[..., Any]]:
    """The jitted cases over `mesh` (axis "i", every argument split along
    dim 0), each one call; `loop`: each a program of LOOP_CALLS calls in a
    fori_loop, each call's arguments waiting for the one before's result
    (_touched), returning the last arguments' first."""
    experts = shape.experts

    def dispatch(x, ids):
        return jax_tma.moe_dispatch(x, ids, num_experts=experts, axis_name="i")

    def pair(x, ids, w):
        recv, plan = dispatch(x, ids)
        return jax_tma.moe_combine(recv, plan, w)

    dense = functools.partial(dense_dispatch, experts=experts, capacity=capacity)
    lax_route = functools.partial(lax_dispatch, experts=experts)

    def dense_pair(x, ids, w):
        return dense_combine(*dense(x, ids), w)

    def lax_pair(x, ids, w):
        recv, state = lax_route(x, ids)
        return lax_combine(recv, state, w)

    bodies = {"dispatch": dispatch, "combine": jax_tma.moe_combine, "pair": pair,
              "a2a": lambda b: jax_tma.all_to_all(b, "i", 0, 0, tiled=True),
              "dense_dispatch": dense, "dense_combine": dense_combine, "dense_pair": dense_pair,
              "lax_dispatch": lax_route, "lax_combine": lax_combine, "lax_pair": lax_pair}

    def spmd(f):
        if loop:
            def f(*args, body=f):
                return lax.fori_loop(0, LOOP_CALLS, lambda _, a: _touched(a, body(*a)), args)[0]
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P("i")))

    return {name: spmd(bodies[name]) for name in CASES}


def _helpers(mesh: Mesh, shape: Shape, capacity: int) -> dict[str, Callable[..., Any]]:
    """The untimed programs: the experts of each layout, the all_to_all's
    buffer (each device's tokens n times)."""
    n = mesh.devices.size

    def spmd(f):
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P("i")))

    return {"experts": spmd(_experts),
            "dense_experts": spmd(functools.partial(_dense_experts, experts=shape.experts,
                                                    capacity=capacity)),
            "a2a_buffer": spmd(lambda x: jnp.tile(x, (n, 1)))}


# ---- the inputs, the routing's counts and the references ----------------------------


def routing(shape: Shape, position: int) -> np.ndarray:
    """Position `position`'s expert ids (T, k) int32: each token's top k of
    E by scores |N(0, 1)| + 1 (DeepEP's tests: k distinct experts, each
    subset alike likely)."""
    rng = np.random.default_rng([SEED, shape.experts, shape.tokens, position])
    scores = np.abs(rng.standard_normal((shape.tokens, shape.experts))) + 1
    return np.argsort(-scores, axis=1, kind="stable")[:, :shape.k].astype(np.int32)


def weights(shape: Shape, seed: int, position: int) -> np.ndarray:
    rng = np.random.default_rng([seed, position])
    return rng.choice(np.array(WEIGHTS, np.float32), (shape.tokens, shape.k))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _tokens(key: jax.Array, position: int, shape: tuple[int, int]) -> jax.Array:
    values = jax.random.randint(jax.random.fold_in(key, position), shape, -TOKEN_MAX,
                                TOKEN_MAX + 1, jnp.int32)
    return values.astype(DTYPE)


def tokens(device: jax.Device, shape: Shape, seed: int, position: int) -> jax.Array:
    """Position `position`'s tokens (T, H) under `seed`, made on `device`:
    any process can make any position's."""
    key = jax.device_put(jax.random.key(seed), device)
    return _tokens(key, position, (shape.tokens, shape.hidden))


def _global(mesh: Mesh, block: Callable[[jax.Device, int], jax.Array]) -> jax.Array:
    """Every position's block (block(device, position)), along dim 0, over
    `mesh`; each process makes its own devices'."""
    devices = list(mesh.devices.flat)
    shards = [block(d, devices.index(d)) for d in mesh.local_devices]
    whole = (len(devices) * shards[0].shape[0],) + shards[0].shape[1:]
    return jax.make_array_from_single_device_arrays(whole, NamedSharding(mesh, P("i")), shards)


def counts(shape: Shape, ids: Sequence[np.ndarray]) -> dict[str, Any]:
    """What the routing `ids` (one (T, k) per position) sends: per
    destination device, the (token, device) pairs and the choices it
    receives, all and from the other devices; the dense route's capacity
    (the most choices of one source for one expert: nothing dropped)."""
    n = len(ids)
    local = shape.local(n)
    pairs, pairs_in, choices, choices_in = (np.zeros(n, np.int64) for _ in range(4))
    capacity = 0
    for s, a in enumerate(ids):
        device = a // local
        capacity = max(capacity, int(np.bincount(a.reshape(-1), minlength=shape.experts).max()))
        for d in range(n):
            has = int(np.any(device == d, axis=1).sum())
            many = int((device == d).sum())
            pairs[d] += has
            choices[d] += many
            if s != d:
                pairs_in[d] += has
                choices_in[d] += many
    return {"recv_pairs": pairs.tolist(), "link_pairs": pairs_in.tolist(),
            "recv_choices": choices.tolist(), "link_choices": choices_in.tolist(),
            "capacity": capacity}


def nbytes(shape: Shape, n: int, c: dict[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    """Per GPU, the mean over the GPUs: each case's bytes as DeepEP counts
    them, and the bytes it receives over NVLink (BYTES)."""
    row = shape.hidden * jnp.dtype(DTYPE).itemsize
    token = float(np.mean(c["recv_pairs"])) * row
    pairs, choices = float(np.mean(c["link_pairs"])), float(np.mean(c["link_choices"]))
    wire = -(-(row + 4 * shape.k) // 16) * 16  # moe_dispatch's row: the token, its slots
    dense = (n - 1) * shape.local(n) * c["capacity"] * row
    deepep = {case: 2 * token if case.endswith("pair") else token for case in CASES}
    deepep["a2a"] = n * shape.tokens * row
    link = {"dispatch": pairs * wire, "combine": pairs * (4 * shape.k + row),
            "a2a": (n - 1) * shape.tokens * row, "dense_dispatch": dense, "dense_combine": dense,
            "lax_dispatch": choices * row, "lax_combine": choices * row}
    for route in ("", "dense_", "lax_"):
        link[f"{route}pair"] = link[f"{route}dispatch"] + link[f"{route}combine"]
    return deepep, link


@functools.partial(jax.jit, static_argnums=(2, 3))
def reference_recv(xs: jax.Array, ids: jax.Array, position: int,
                   local: int) -> tuple[jax.Array, jax.Array]:
    """moe_dispatch's contract for `position` from every position's tokens
    (n, T, H) and ids (n, T, k): the rows of its experts' choices, expert by
    expert, each in (source, token, choice) order, zeros past them (n·T·k
    rows); and its group sizes."""
    n, tokens, k = ids.shape
    flat = ids.reshape(-1)
    mine = flat // local == position
    order = jnp.argsort(jnp.where(mine, flat, n * local), stable=True)
    rows = xs.reshape(n * tokens, -1)[order // k]
    recv = jnp.where((jnp.arange(flat.shape[0]) < mine.sum())[:, None], rows, 0).astype(xs.dtype)
    sizes = jnp.zeros(n * local, _I32).at[flat].add(1)
    return recv, lax.dynamic_slice_in_dim(sizes, position * local, local)


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def reference_dense(xs: jax.Array, ids: jax.Array, position: int, local: int,
                    capacity: int) -> jax.Array:
    """dense_dispatch's buffer at `position`: for each source, local expert
    and slot, the row of that expert's choice of that rank, in (token,
    choice) order; zeros in the slots unused (choices past `capacity`
    dropped)."""
    n, tokens, k = ids.shape
    out = jnp.zeros((n * local * capacity, xs.shape[2]), xs.dtype)
    for s in range(n):
        flat = ids[s].reshape(-1)
        _, rank = _ranks(flat, n * local)
        at = jnp.where((flat // local == position) & (rank < capacity),
                       (s * local + flat - position * local) * capacity + rank, out.shape[0])
        out = out.at[at].set(jnp.repeat(xs[s], k, axis=0), mode="drop")
    return out


@jax.jit
def reference_combine(x: jax.Array, ids: jax.Array, w: jax.Array) -> jax.Array:
    """moe_combine of the experts' outputs (_experts) for one position's
    tokens: Σ_j w[t, j]·(x[t] + shift(ids[t, j])), exact in any order."""
    y = (x[:, None, :].astype(jnp.float32) + _shift(ids)[:, :, None]).astype(x.dtype)
    return jnp.sum(y.astype(jnp.float32) * w[:, :, None], axis=1).astype(x.dtype)


@jax.jit
def reference_pair(x: jax.Array, w: jax.Array) -> jax.Array:
    """The pair's result (the experts the identity): x[t]·Σ_j w[t, j]."""
    return (x.astype(jnp.float32) * jnp.sum(w, axis=1)[:, None]).astype(x.dtype)


# ---- one shape ----------------------------------------------------------------------


@dataclasses.dataclass
class _Inputs:
    """One input set of a shape, and what the cases that continue a
    dispatch take: its plan or state, and the experts' outputs."""
    x: jax.Array
    w: jax.Array
    a2a: jax.Array
    plan: Any = None
    y: jax.Array | None = None
    slot: jax.Array | None = None
    y_dense: jax.Array | None = None
    lax_state: Any = None


def _cases(run: dict[str, Callable[..., Any]], ids: jax.Array) -> dict[str, Callable[..., Any]]:
    """Each case as a call of one input set (_Inputs)."""
    return {"dispatch": lambda i: run["dispatch"](i.x, ids),
            "combine": lambda i: run["combine"](i.y, i.plan, i.w),
            "pair": lambda i: run["pair"](i.x, ids, i.w),
            "a2a": lambda i: run["a2a"](i.a2a),
            "dense_dispatch": lambda i: run["dense_dispatch"](i.x, ids),
            "dense_combine": lambda i: run["dense_combine"](i.y_dense, i.slot, i.w),
            "dense_pair": lambda i: run["dense_pair"](i.x, ids, i.w),
            "lax_dispatch": lambda i: run["lax_dispatch"](i.x, ids),
            "lax_combine": lambda i: run["lax_combine"](i.y, i.lax_state, i.w),
            "lax_pair": lambda i: run["lax_pair"](i.x, ids, i.w)}


def _continued(case: str, out: Any, inputs: _Inputs, helpers: dict[str, Callable]) -> None:
    """What a dispatch's output gives the cases after it (its combine's)."""
    if case == "dispatch":
        recv, inputs.plan = out
        inputs.y = helpers["experts"](recv, inputs.plan.group_sizes)
    elif case == "dense_dispatch":
        recv, inputs.slot = out
        inputs.y_dense = helpers["dense_experts"](recv)
    elif case == "lax_dispatch":
        inputs.lax_state = out[1]


# A combine takes its dispatch's output: where that fails, so does it.
_AFTER = {"combine": "dispatch", "dense_combine": "dense_dispatch",
          "lax_combine": "lax_dispatch"}


def measure(s: Session, mesh: Mesh, shape: Shape, repetitions: int) -> dict[str, Any]:
    """One shape: the inputs made, every case called once and checked on
    this process's devices (the processes agree on the cases that raised),
    then the fast cases timed `repetitions` times and the sparse ones once;
    at a loop shape, the loop clock. The clocks as measured here."""
    n = mesh.devices.size
    if shape.experts % n:
        raise ValueError(f"{OP}: {shape.experts} experts do not split over {n} devices")
    ids_host = [routing(shape, p) for p in range(n)]
    c = counts(shape, ids_host)
    ids = _global(mesh, lambda d, p: jax.device_put(ids_host[p], d))
    seeds = (SEED, SEED + 1)  # two input sets to take turns through
    helpers = _helpers(mesh, shape, c["capacity"])
    inputs = []
    for seed in seeds:
        x = _global(mesh, lambda d, p, seed=seed: tokens(d, shape, seed, p))
        inputs.append(_Inputs(x=x, w=_global(mesh, lambda d, p, seed=seed: jax.device_put(
            weights(shape, seed, p), d)), a2a=helpers["a2a_buffer"](x)))
    run = programs(mesh, shape, c["capacity"])
    cases = _cases(run, ids)
    failed = _check(s, mesh, shape, cases, inputs, ids_host, c["capacity"], helpers)
    timed = {name: fn for name, fn in cases.items() if name not in failed}
    fast = {name: fn for name, fn in timed.items() if name not in SPARSE}
    sparse = {name: fn for name, fn in timed.items() if name in SPARSE}
    turns = [(i,) for i in inputs]
    wall_calls = WALL_CALLS if shape.loop else WALL_CALLS_LARGE
    runs = timed_runs(s, f"{OP} {shape.name}", fast, turns, repetitions, wall_calls)
    sparse_run = None
    if sparse:
        t = s.time(rotate_all(sparse, turns), SPARSE_ROUNDS, rep=1, wall=False)
        sparse_run = {"cases": processes.clean(t["cases"]), "protocol": t["protocol"]}
        s.log(f"{OP} {shape.name}, the sparse run, span µs: " + ", ".join(
            f"{name} {'—' if v['span_us'] is None else round(v['span_us'], 1)}"
            for name, v in sparse_run["cases"].items()))
    loops, loop_busy = (_loops(s, mesh, shape, c["capacity"], ids, inputs[0], timed)
                        if shape.loop else ({}, {}))
    timelines = {}
    if shape.loop:
        for name in TIMELINE_CASES:
            t = s.timeline(functools.partial(fast[name], inputs[0]),
                           TIMELINE_CALLS) if name in fast else None
            if t is not None:
                timelines[name] = t
    deepep, link = nbytes(shape, n, c)
    return {"shape": shape.name, "what": shape.what, "tokens": shape.tokens,
            "hidden": shape.hidden, "k": shape.k, "experts": shape.experts, "n": n,
            **c, "capacity_factor": c["capacity"] / (shape.tokens * shape.k / shape.experts),
            "wall_calls": wall_calls, "deepep_bytes": deepep, "link_bytes": link,
            "failed": failed, "runs": runs, "sparse_run": sparse_run, "loop_us": loops,
            "loop_busy_us": loop_busy, "timeline": timelines}


def timed_runs(s: Session, label: str, cases: dict[str, Callable[..., Any]],
               turns: Sequence[tuple], repetitions: int, wall_calls: int
               ) -> list[dict[str, Any]]:
    """`repetitions` runs of Session.time of `cases`, which take turns
    through the argument tuples `turns`: each run's clocks and protocol,
    its spans logged under `label`."""
    runs = []
    for r in range(repetitions):
        t = s.time(rotate_all(cases, turns), 2 if s.smoke else ROUNDS, rep=2,
                   wall_calls=wall_calls)
        runs.append({"cases": processes.clean(t["cases"]), "protocol": t["protocol"]})
        s.log(f"{label}, run {r + 1} of {repetitions}, span µs: " + ", ".join(
            f"{name} {'—' if v['span_us'] is None else round(v['span_us'], 1)}"
            for name, v in runs[-1]["cases"].items()))
    return runs


def _loops(s: Session, mesh: Mesh, shape: Shape, capacity: int, ids: jax.Array,
           first: _Inputs, timed: dict[str, Any]
           ) -> tuple[dict[str, float], dict[str, float | None]]:
    """µs per call of each case in a program of LOOP_CALLS chained calls: the
    fastest of LOOP_RUNS runs (the host's jitter adds, never subtracts); and
    the GPU busy time per call of one traced run of each."""
    cases = _cases(programs(mesh, shape, capacity, loop=True), ids)
    out = {}
    for name in timed:
        jax.block_until_ready(cases[name](first))  # compiled, and run once
        best = float("inf")
        for _ in range(LOOP_RUNS):
            start = time.perf_counter()
            jax.block_until_ready(cases[name](first))
            best = min(best, time.perf_counter() - start)
        out[name] = best * 1e6 / LOOP_CALLS
    # A trace of each alone: a fori_loop's iterations may wait for the host
    # as long as two programs do, so one trace could not be cut into them.
    busy = {}
    for name in timed:
        t = processes.clean(s.time({name: functools.partial(cases[name], first)}, 1,
                                   wall=False)["cases"])[name]
        busy[name] = None if t["busy_us"] is None else t["busy_us"] / LOOP_CALLS
    s.log(f"{OP} {shape.name}, loop µs per call: " + ", ".join(
        f"{name} {us:.1f}" for name, us in out.items()))
    return out, busy


def _check(s: Session, mesh: Mesh, shape: Shape, cases: dict[str, Callable[..., Any]],
           inputs: Sequence[_Inputs], ids_host: Sequence[np.ndarray], capacity: int,
           helpers: dict[str, Callable]) -> dict[str, str]:
    """Calls each case once (a dispatch on every input set: its output feeds
    its combine's, _continued) and checks its output of the first input set
    on each of this process's devices against the references, bit for bit;
    returns {case: why} of those that raised (on any process)."""
    devices = list(mesh.devices.flat)
    n, home = len(devices), mesh.local_devices[0]
    local = shape.local(n)
    ids_home = jax.device_put(np.stack(ids_host), home)
    xs = jnp.stack([tokens(home, shape, SEED, p) for p in range(n)])
    w = [jax.device_put(weights(shape, SEED, p), home) for p in range(n)]
    want: dict[tuple[str, int], jax.Array] = {}

    def reference(kind: str, p: int) -> jax.Array:
        """The reference of `kind` for position p, on its device."""
        if (kind, p) not in want:
            if kind in ("recv", "group_sizes"):
                recv, sizes = reference_recv(xs, ids_home, p, local)
                got = {"recv": recv, "group_sizes": sizes}
            elif kind == "dense":
                got = {kind: reference_dense(xs, ids_home, p, local, capacity)}
            elif kind == "combine":
                got = {kind: reference_combine(xs[p], ids_home[p], w[p])}
            elif kind == "pair":
                got = {kind: reference_pair(xs[p], w[p])}
            else:  # the all_to_all of each device's tokens n times: every position's
                got = {kind: xs.reshape(n * shape.tokens, -1)}
            for key, value in got.items():
                want[key, p] = jax.device_put(value, devices[p])
        return want[kind, p]

    def shards(a: jax.Array) -> dict[int, jax.Array]:
        return {devices.index(x.device): x.data for x in a.addressable_shards}

    # The lax.ragged_all_to_all route last: across processes it raises.
    order = [c for c in cases if c not in SPARSE] + [c for c in cases if c in SPARSE]
    failed: dict[str, str] = {}
    for name in order:
        outs, problem = [], None
        if _AFTER.get(name) in failed:
            problem = f"its dispatch ({_AFTER[name]}) failed"
        else:
            try:
                # A dispatch on every input set (its combine takes each), the others on one.
                for i in inputs if name in _AFTER.values() else inputs[:1]:
                    outs.append(jax.block_until_ready(cases[name](i)))
                    _continued(name, outs[-1], i, helpers)
            except Exception as e:  # noqa: BLE001 (whatever the case raised: recorded)
                problem = _failure(e)
        told = processes.agree(f"{OP} {shape.name} {name}", problem)
        if told:
            failed[name] = _told(told)
            s.log(f"{OP} {shape.name}: {name} failed, left out: {failed[name]}")
            continue
        out = outs[0]
        label = f"{name} {shape.name}"
        comparator = name not in OURS
        if name.endswith("dispatch"):
            recv = out[0]
            kind = "dense" if name == "dense_dispatch" else "recv"
            for p, got in shards(recv).items():
                if kind == "recv":  # rows past the received are unspecified: zeros here
                    received = jnp.arange(got.shape[0]) < jnp.sum(reference("group_sizes", p))
                    got = jnp.where(received[:, None], got, jnp.zeros((), got.dtype))
                s.check(f"{label}: device {p}", got, reference(kind, p), comparator=comparator)
            if name == "dispatch":
                for p, got in shards(out[1].group_sizes).items():
                    s.check(f"{label} group sizes: device {p}", got, reference("group_sizes", p))
        else:
            kind = ("combine" if name.endswith("combine") else "pair" if name.endswith("pair")
                    else "a2a")
            for p, got in shards(out).items():
                s.check(f"{label}: device {p}", got, reference(kind, p), comparator=comparator)
        del outs, out
    return failed


# ---- the results ----------------------------------------------------------------------


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _gbps(nbytes: float, us: float | None) -> float | None:
    return None if not us else nbytes / us / 1e3


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    """Each case's clocks (the median over the runs of the fast cases; the
    sparse run's for the lax.ragged_all_to_all route; the loop clock), its
    GB/s as DeepEP counts (deepep_gbps) and over NVLink (link_gbps) by each,
    and the ratios of PAIRS: "a_vs_b" = b's time ÷ a's by each clock, of
    the median times."""
    runs = raw["runs"]
    times: dict[str, dict[str, float | None]] = {}
    for name in (runs[0]["cases"] if runs else {}):
        times[name] = {c: _median([r["cases"][name].get(c) for r in runs]) for c in CLOCKS[:3]}
    for name, t in ((raw["sparse_run"] or {}).get("cases") or {}).items():
        times[name] = {c: t.get(c) for c in CLOCKS[:3]}
    for name, t in times.items():
        t["loop_us"] = raw["loop_us"].get(name)
        t["loop_busy_us"] = raw["loop_busy_us"].get(name)
    gbps = {kind: {v: {c.removesuffix("_us"): _gbps(raw[f"{kind}_bytes"][v], t[c])
                       for c in CLOCKS} for v, t in times.items()}
            for kind in ("deepep", "link")}
    ratios = {}
    for a, b in PAIRS:
        if a in times and b in times:
            ratios[f"{a}_vs_{b}"] = {
                c.removesuffix("_us"): (times[b][c] / times[a][c]
                                        if times[a][c] and times[b][c] else None)
                for c in CLOCKS}
    return {"times": times, "deepep_gbps": gbps["deepep"], "link_gbps": gbps["link"],
            "ratios": ratios, "launch_gap_us": median_launch_gaps(runs)}


def _row(raw: dict[str, Any], peer: dict[str, Any] | None = None) -> dict[str, Any]:
    row = dict(raw)
    row.update(summarize(raw))
    if peer is not None:  # the other process's busy time beside
        row["peer_busy_us"] = {v: t["busy_us"] for v, t in summarize(peer)["times"].items()}
    return row


def _shapes(s: Session) -> tuple[Shape, ...]:
    return SMOKE_SHAPES if s.smoke else SHAPES


def _common(quick: bool, repetitions: int) -> dict[str, Any]:
    return {"bytes_convention": BYTES, "dtype": jnp.dtype(DTYPE).name, "quick": quick,
            "repetitions": repetitions, "cases": list(CASES), "sparse_cases": list(SPARSE),
            "sparse_rounds": SPARSE_ROUNDS, "weights": list(WEIGHTS), "token_max": TOKEN_MAX,
            "ratio_method": "a ratio is of the median times (the fast cases: the median over "
                            "the runs; the sparse ones: their one run)",
            "wall_calls_rule": f"{WALL_CALLS} calls per wall-clock sample at the decode "
                               f"shape, {WALL_CALLS_LARGE} at DeepEP's",
            "loop_rule": f"at the decode shape, one jitted program of {LOOP_CALLS} calls in a "
                         f"fori_loop, each call's arguments waiting for the result before "
                         f"(the routing too), per call, the fastest of {LOOP_RUNS} runs",
            "loop_busy_rule": f"at the decode shape, the GPU busy time per call of one traced "
                              f"run of the loop program (the union of its GPUs' activity, ÷ "
                              f"{LOOP_CALLS})",
            "capacity_rule": "the dense route's capacity per expert: the most choices one "
                             "device makes of one expert (nothing dropped)"}


def bench_moe(s: Session, quick: bool = False) -> dict[str, Any]:
    """One process driving every GPU (MIN_DEVICES devices on the CPU): every
    shape measured."""
    devices = every_gpu(MIN_DEVICES)
    if len(devices) < MIN_DEVICES:
        raise RuntimeError(f"{OP}: needs {MIN_DEVICES} devices, has {len(devices)}")
    mesh = Mesh(np.array(devices), ("i",))
    repetitions = 1 if quick else REPETITIONS
    # As scripts/gpu_check.sh runs NCCL (and the process mode's workers):
    # NVLink multicast off. NCCL reads it when its first communicator starts.
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    with processes.Lowerings(with_op=True).watching() as lowerings:
        rows = [_row(measure(s, mesh, shape, repetitions)) for shape in _shapes(s)]
    return {"op": OP, **_common(quick, repetitions), "n": len(devices),
            "devices": [d.device_kind for d in devices], "rows": rows,
            "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"),
            "lowerings": list(lowerings.seen), "topology": topology()}


def worker(spec: dict[str, Any]) -> None:
    """One process of moe_processes: its GPU, the mesh over every process's,
    every shape; what it measured, as JSON in spec["out"]."""
    processes.initialize(spec)
    s = processes.WorkerSession(spec["smoke"], None)
    s.call_gap_s = CALL_GAP_S
    mesh = Mesh(np.array(jax.devices()), ("i",))
    s.log(f"{spec['layout']}: process {jax.process_index()} of {jax.process_count()}, "
          f"mesh {list(mesh.devices.flat)}")
    with processes.Lowerings(with_op=True).watching() as lowerings:
        rows = [measure(s, mesh, shape, spec["repetitions"]) for shape in _shapes(s)]
    with open(spec["out"], "w") as f:
        json.dump({"devices": [d.device_kind for d in mesh.devices.flat], "rows": rows,
                   "checked": s.checked, "differs": s.differs, "untraced": s.untraced,
                   "lowerings": list(lowerings.seen)}, f)


def bench_moe_processes(s: Session, quick: bool = False) -> dict[str, Any]:
    """A worker process per GPU (every GPU visible, each process given its
    own by jax.distributed's local_device_ids; MIN_DEVICES on the CPU):
    every shape measured; worker 0's clocks, the last one's busy time
    beside."""
    gpus = [] if s.smoke else processes.visible_gpus()
    if not s.smoke and len(gpus) < MIN_DEVICES:
        raise RuntimeError(f"{OP_PROCESSES}: {len(gpus)} GPU(s) visible, it needs "
                           f"{MIN_DEVICES} (nvidia-smi -L, CUDA_VISIBLE_DEVICES)")
    n = len(gpus) or MIN_DEVICES
    for gpu in gpus:
        processes.check_free(OP_PROCESSES, gpu, 1, MEM_FRACTION)
    repetitions = 1 if quick else REPETITIONS
    spec = {"smoke": s.smoke, "repetitions": repetitions, "own_gpu": True}
    visible = [",".join(gpus)] * n if gpus else [None] * n
    s.log(f"{OP_PROCESSES}: {n} processes, " + ("on the CPU" if s.smoke else
                                                      f"CUDA_VISIBLE_DEVICES {visible[0]}"))
    workers = processes.run_workers(s, OP_PROCESSES, __file__, "per_gpu", visible, spec, {},
                                    timeout_s=LAYOUT_TIMEOUT_S, fraction=MEM_FRACTION)
    for pid, w in enumerate(workers):
        s.checked.extend(f"process {pid}: {label}" for label in w["checked"])
        s.differs.update({f"process {pid}: {label}": why for label, why in w["differs"].items()})
    return {"op": OP_PROCESSES, **_common(quick, repetitions), "n": n,
            "devices": workers[0]["devices"], "processes": n,
            "cuda_visible_devices": visible, "mem_fraction": MEM_FRACTION,
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
    OP: Benchmark(lambda s, args: bench_moe(s, _quick(args)), budget_s=240, in_all=False,
                  devices=MIN_DEVICES, every_device=True, group="ep"),
    OP_PROCESSES: Benchmark(lambda s, args: bench_moe_processes(s, _quick(args)), budget_s=240,
                            in_all=False, devices=MIN_DEVICES, every_device=True,
                            own_processes=True, group="ep"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """This module as run.py's command line for its ops: `--processes` picks
    moe_processes, every other argument is run.py's."""
    argv = list(sys.argv[1:] if argv is None else argv)
    op = OP_PROCESSES if "--processes" in argv else OP
    import run

    return run.main([op, *(a for a in argv if a != "--processes")])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        processes.worker_main(worker)
    else:
        sys.exit(main())
