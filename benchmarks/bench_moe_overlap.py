"""Whether an MoE dispatch runs beside independent work (issue 43's
`num_sms`): jax_tma.moe_dispatch at DeepEP's shape and a GEMM that does not
depend on it (this device's T tokens times an H × H bf16 matrix, as the
experts of the micro-batch before would be), in one jitted shard_map
program over every GPU there is, one process, bf16. One GPU is enough: what
is measured is whether XLA runs the two side by side on a GPU's streams and
SMs (on one, the dispatch's exchanges and pull stay within it; on two, they
cross the link).

    python benchmarks/run.py moe_overlap --out-dir benchmarks/results

The cases, one program a step each:
  gemm, dispatch      each alone;
  serial              both, as a user writes them: XLA runs its program on
                      one stream, one after the other;
  stream              both, the GEMM under jax's compute_on("gpu_stream:1")
                      (XLA runs it on a stream of its own, the dispatch on
                      the main one);
  stream_sms<m>       as stream, the dispatch with num_sms=m for each m of
                      BUDGETS: its copies hold at most m SMs, the GEMM the
                      rest;
  stream_no_graphs    as stream, compiled with XLA's command buffers off
                      (NO_GRAPHS): a command buffer is one CUDA graph
                      launched on one stream, whose kernels a trace puts on
                      that stream;
  stream_no_graphs_lhs
                      as stream_no_graphs, with XLA's latency-hiding
                      scheduler (LHS), which may move the GEMM's async done
                      past the dispatch.
Every case's output is checked bit for bit against serial's (the GEMM's
products and sums are of small integers, exact in float32 in any order;
the dispatch's received rows). Then REPETITIONS timed runs
(harness.Session.time: the cases take turns within each). What a case hid
is span(gemm) + span(dispatch) − its span: 0 where the two ran one after
the other, the shorter one's span where it ran entirely beside the other.
Last, a trace of the STREAM_CASES gives each one's GPU busy time by stream:
which streams XLA ran them on.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # run as a script under `python -P`
    sys.path.insert(0, _HERE)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental.compute_on import compute_on  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jax_tma  # noqa: E402
from bench_all_to_all import _failure  # noqa: E402
from bench_moe import (DTYPE, MIN_DEVICES, SEED, SHAPES, SMOKE_SHAPES, Shape, _global,  # noqa: E402
                       routing, timed_runs, tokens)
from bench_ppermute import topology  # noqa: E402
from harness import Benchmark, Session, every_gpu  # noqa: E402

OP = "moe_overlap"
# The SM budgets of the stream_sms cases (an H100 or H200 has 132 SMs);
# on the CPU (a smoke run) one, the least two devices take.
BUDGETS = (16, 32, 66)
SMOKE_BUDGETS = (MIN_DEVICES,)
GEMM_STREAM = "gpu_stream:1"
REPETITIONS = 3  # timed runs (--quick: one), of bench_moe's ROUNDS turns
WALL_CALLS = 10  # calls per wall-clock sample (each holds its dropless recv)
STREAM_CALLS = 3  # traced calls of the STREAM_CASES for their busy time by stream
STREAM_CASES = ("serial", "stream", "stream_no_graphs", "stream_no_graphs_lhs")
# XLA's compile options of stream_no_graphs: no run of commands is long
# enough to become a command buffer; of stream_no_graphs_lhs, also the
# latency-hiding scheduler.
NO_GRAPHS = {"xla_gpu_graph_min_graph_size": 1_000_000}
LHS = {**NO_GRAPHS, "xla_gpu_enable_latency_hiding_scheduler": True}


def gemm(a: jax.Array, w: jax.Array) -> jax.Array:
    """The independent work: a @ w, summed in float32, in bf16."""
    return jnp.dot(a, w, preferred_element_type=jnp.float32).astype(DTYPE)


def case_names(budgets: tuple[int, ...]) -> tuple[str, ...]:
    return (("gemm", "dispatch", "serial", "stream") + tuple(f"stream_sms{m}" for m in budgets)
            + ("stream_no_graphs", "stream_no_graphs_lhs"))


def _compiled_with(fn: Any, options: dict[str, Any]) -> Callable[..., Any]:
    """`fn` (jitted) compiled with XLA's compile `options` at its first
    call's arguments, then that executable for every call."""
    executable: list[Any] = []

    def call(*args: Any) -> Any:
        if not executable:
            executable.append(fn.lower(*args).compile(compiler_options=options))
        return executable[0](*args)

    return call


def programs(mesh: Mesh, shape: Shape, budgets: tuple[int, ...]
             ) -> dict[str, Callable[..., Any]]:
    """Each case as a jitted program of (x, ids, a, w): x, ids and a this
    device's rows, w on every device. Outputs: (recv, group sizes) of the
    dispatch, the GEMM's product, or both."""
    on_stream = compute_on(compute_type=GEMM_STREAM,
                           out_memory_spaces=jax.memory.Space.Device)(gemm)

    def dispatch(x, ids, num_sms=None):
        recv, plan = jax_tma.moe_dispatch(x, ids, num_experts=shape.experts, axis_name="i",
                                          num_sms=num_sms)
        return recv, plan.group_sizes

    bodies: dict[str, Callable[..., Any]] = {
        "gemm": lambda x, ids, a, w: gemm(a, w),
        "dispatch": lambda x, ids, a, w: dispatch(x, ids),
        "serial": lambda x, ids, a, w: (dispatch(x, ids), gemm(a, w)),
        "stream": lambda x, ids, a, w: (dispatch(x, ids), on_stream(a, w)),
    }
    for m in budgets:
        bodies[f"stream_sms{m}"] = lambda x, ids, a, w, m=m: (dispatch(x, ids, m),
                                                               on_stream(a, w))
    specs = (P("i"), P("i"), P("i"), P())
    jitted = {name: jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P("i")))
              for name, body in bodies.items()}
    return {**jitted, "stream_no_graphs": _compiled_with(jitted["stream"], NO_GRAPHS),
            "stream_no_graphs_lhs": _compiled_with(jitted["stream"], LHS)}


def _matrix(mesh: Mesh, shape: Shape) -> jax.Array:
    """w: H × H of -1, 0 and 1 in bf16, on every device (with tokens of at
    most 4 in magnitude every sum of the GEMM is an integer below 2**24)."""
    rng = np.random.default_rng([SEED, shape.hidden])
    w = rng.integers(-1, 2, (shape.hidden, shape.hidden), dtype=np.int8).astype(jnp.bfloat16)
    return jax.device_put(w, NamedSharding(mesh, P()))


def _defined(name: str, out: Any, n: int) -> tuple[jax.Array, ...]:
    """What case `name`'s output defines: the dispatch's received rows
    (those past them are unspecified: zeros here) and group sizes, then the
    GEMM's product."""
    if name == "gemm":
        return (out,)
    (recv, sizes), product = (out, None) if name == "dispatch" else out
    rows = recv.reshape(n, -1, recv.shape[1])
    total = sizes.reshape(n, -1).sum(axis=1)
    kept = jnp.arange(rows.shape[1])[None, :, None] < total[:, None, None]
    received = (jnp.where(kept, rows, jnp.zeros((), rows.dtype)), sizes)
    return received if product is None else received + (product,)


def _check(s: Session, cases: dict[str, Callable[..., Any]], args: tuple,
           n: int) -> dict[str, str]:
    """Every case once, what it defines against serial's, bit for bit;
    returns {case: why} of those that raised (XLA may refuse the stream
    annotation: the result says so, and the others are timed)."""
    want = _defined("serial", cases["serial"](*args), n)
    failed = {}
    for name, fn in cases.items():
        try:
            got = _defined(name, fn(*args), n)
        except Exception as e:  # noqa: BLE001 (whatever the case raised: recorded)
            failed[name] = _failure(e)
            s.log(f"{OP}: {name} failed, left out: {failed[name]}")
            continue
        s.check(name, got, want[2:] if name == "gemm" else want[:2] if name == "dispatch"
                else want)
    return failed


def measure(s: Session, mesh: Mesh, shape: Shape, budgets: tuple[int, ...],
            repetitions: int) -> dict[str, Any]:
    """One shape: the inputs made, every case checked, then timed."""
    n = mesh.devices.size
    ids_host = [routing(shape, p) for p in range(n)]
    ids = _global(mesh, lambda d, p: jax.device_put(ids_host[p], d))
    w = _matrix(mesh, shape)
    turns = [(_global(mesh, lambda d, p, seed=seed: tokens(d, shape, seed, p)), ids,
              _global(mesh, lambda d, p, seed=seed: tokens(d, shape, seed + 7, p)), w)
             for seed in (SEED, SEED + 1)]
    cases = programs(mesh, shape, budgets)
    failed = _check(s, cases, turns[0], n)
    timed = {name: fn for name, fn in cases.items() if name not in failed}
    runs = timed_runs(s, f"{OP} {shape.name}", timed, turns, repetitions, WALL_CALLS)
    annotated = None
    if "stream" in timed:
        lowered = cases["stream"].lower(*turns[0]).compile().as_text()
        annotated = f'_xla_stream_annotation="{GEMM_STREAM.split(":")[1]}"' in lowered
    streams = {name: s.streams(functools.partial(cases[name], *turns[0]), STREAM_CALLS)
               for name in STREAM_CASES if name in timed}
    return {"shape": shape.name, "what": shape.what, "tokens": shape.tokens,
            "hidden": shape.hidden, "k": shape.k, "experts": shape.experts, "n": n,
            "gemm": f"({shape.tokens}, {shape.hidden}) @ ({shape.hidden}, {shape.hidden}) "
                    f"bf16, summed in float32, per device",
            "budgets": list(budgets), "failed": failed, "runs": runs, "streams": streams,
            "gemm_on_its_stream": annotated}


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    """Each case's clocks (the median over the runs) and, for the cases
    that hold both, what they hid by each clock: alone(gemm) + alone
    (dispatch) − theirs, in µs and as a fraction of the shorter alone."""
    names = list(raw["runs"][0]["cases"]) if raw["runs"] else []
    times = {name: {c: _median([r["cases"][name].get(c) for r in raw["runs"]])
                    for c in ("busy_us", "span_us", "wall_us")} for name in names}
    hid = {}
    for name in names:
        if name in ("gemm", "dispatch") or "gemm" not in times or "dispatch" not in times:
            continue
        hid[name] = {}
        for c in ("span_us", "wall_us"):
            alone = [times["gemm"][c], times["dispatch"][c]]
            if None in alone or times[name][c] is None:
                hid[name][c.removesuffix("_us")] = None
                continue
            us = sum(alone) - times[name][c]
            hid[name][c.removesuffix("_us")] = {"us": us, "of_shorter": us / min(alone)}
    return {"times": times, "hid": hid}


def bench_moe_overlap(s: Session, quick: bool = False) -> dict[str, Any]:
    """Every GPU (MIN_DEVICES devices on the CPU, so that the exchanges
    cross devices there), DeepEP's shape."""
    devices = every_gpu(MIN_DEVICES)
    mesh = Mesh(np.array(devices), ("i",))
    repetitions = 1 if quick else REPETITIONS
    budgets = SMOKE_BUDGETS if s.smoke else BUDGETS
    shape = SMOKE_SHAPES[0] if s.smoke else SHAPES[0]
    raw = measure(s, mesh, shape, budgets, repetitions)
    return {"op": OP, "dtype": jnp.dtype(DTYPE).name, "quick": quick,
            "repetitions": repetitions, "cases": list(case_names(budgets)),
            "gemm_stream": GEMM_STREAM, "n": len(devices),
            "devices": [d.device_kind for d in devices], "rows": [{**raw, **summarize(raw)}],
            "hid_rule": "alone(gemm) + alone(dispatch) − the case's time, by span and by "
                           "wall clock, of the median times; of_shorter: ÷ the shorter alone",
            "topology": topology()}


BENCHMARKS = {
    OP: Benchmark(lambda s, args: bench_moe_overlap(s, bool(getattr(args, "quick", False))),
                  budget_s=120, in_all=False, devices=1, every_device=True),
}


if __name__ == "__main__":
    import run

    sys.exit(run.main([OP, *sys.argv[1:]]))
