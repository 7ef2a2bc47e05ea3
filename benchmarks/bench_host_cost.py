"""The host cost of one call (issue 45): each op in a jitted chain of tiny
calls, each taking the previous call's output, against the minimal FFI
kernel of the benchmarks' extension chained alike, under XLA's default
flags and with command buffers forced on. The wall clock per call (calls
dispatched without waiting, one sync) is what the host spends per op once
the GPU keeps up; the target is a gap of at most 0.1 µs per call over the
minimal kernel with the same number of kernel launches (every case here
launches one: `launches` counts them in a profiler trace).

    python benchmarks/run.py host-cost [--out-dir DIR]

XLA reads its flags once, when the backend starts: run.py's process only
spawns one worker per flag setting (this module run as a script,
processes.run_workers), each with XLA_FLAGS of its own and nothing else
of run.py's XLA_FLAGS. XLA:CPU accepts the GPU flags, so a smoke run
(`--smoke`) runs the same settings and code path and measures nothing.

What each op does per call beyond the minimal kernel (which decodes its
two buffers, reads the cached device facts and launches):
benchmarks/TUNING.md, "Per-call host cost".
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import jax_tma
import processes
import references
from harness import Benchmark, Session, _device_events

OP = "host-cost"
TARGET_GAP_US = 0.1
# The flag settings, each in a worker process of its own: XLA_FLAGS exactly.
SETTINGS = {
    "default": "",
    "command_buffers": ("--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL "
                        "--xla_gpu_graph_min_graph_size=1"),
}
MINIMAL = "minimal_ffi"
# Calls per jitted chain, bytes of each call's input (uint32), rounds.
FULL = {"chain_ops": 128, "bytes": 8 << 10, "rounds": 10}
SMOKE = {"chain_ops": 4, "bytes": 4 << 10, "rounds": 2}
# Each worker's share of its GPU's memory (the chains are tiny).
MEM_FRACTION = 0.1
SETTING_TIMEOUT_S = 240
CASES = {
    "copy": "jax_tma.copy, method='auto' (the SIMT copy)",
    "copy_tma": "jax_tma.copy, method='tma' (the TMA bulk copy)",
    "copy_simt": "jax_tma.copy, method='simt'",
    "window_traced": "jax_tma.window at a traced start, method='auto' (SIMT's vector form: "
                     "the start read from device memory)",
    "window_static": "jax_tma.window at a static start 0, method='auto' (SIMT's vector form: "
                     "the start a kernel parameter)",
    "gather": "jax_tma.gather of one row at a device index, method='auto'",
    "im2col": "jax_tma.im2col, kernel size 1, method='auto' (the SIMT kernel)",
    "broadcast": "jax_tma.broadcast, n=1, method='auto' (the TMA store kernel: three tensor "
                 "maps)",
    MINIMAL: "the benchmarks' minimal FFI kernel (the seed-style TMA copy: one launch of one "
             "32-thread CTA)",
}


# ---- the worker processes ---------------------------------------------------


def _chained(op: Callable[..., jax.Array], ops: int) -> Callable[..., jax.Array]:
    """`ops` calls of op in one jit, each on the previous call's output; the
    chain's other arguments go to every call."""
    def fn(a, *rest):
        for _ in range(ops):
            a = op(a, *rest)
        return a
    return jax.jit(fn)


def _cases(s: Session, ops: int, nbytes: int) -> dict[str, tuple[Callable, tuple]]:
    """Each case's chain and its arguments; every call returns its input."""
    words = nbytes // 4
    x = jax.random.bits(jax.random.key(45), (words,), jnp.uint32)
    rows = x.reshape(1, words)
    image = x.reshape(1, words // 32, 32)  # NWC
    start = jnp.zeros((), jnp.int32)
    index = jnp.zeros((1,), jnp.int32)
    full = (words,)
    ops_of = {
        "copy": (lambda a: jax_tma.copy(a), (x,)),
        "copy_tma": (lambda a: jax_tma.copy(a, method="tma"), (x,)),
        "copy_simt": (lambda a: jax_tma.copy(a, method="simt"), (x,)),
        "window_traced": (lambda a, s0: jax_tma.window(a, (s0,), full), (x, start)),
        "window_static": (lambda a: jax_tma.window(a, (0,), full), (x,)),
        "gather": (lambda a, i: jax_tma.gather(a, i), (rows, index)),
        "im2col": (lambda a: jax_tma.im2col(a, 1), (image,)),
        "broadcast": (lambda a: jax_tma.broadcast(a, 1).reshape(a.shape), (x,)),
        MINIMAL: (s.refs.seed_copy, (x,)),
    }
    return {name: (_chained(op, ops), args) for name, (op, args) in ops_of.items()}


def _launches(fn: Callable, args: tuple, ops: int) -> float:
    """GPU activities per call of the chain's one traced run."""
    jax.block_until_ready(fn(*args))
    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d)
        jax.block_until_ready(fn(*args))
        jax.profiler.stop_trace()
        return len(_device_events(d)) / ops


def worker(spec: dict[str, Any]) -> None:
    """One flag setting: XLA_FLAGS set before the backend starts, every
    case's chain checked (it returns its input, bit for bit), its GPU
    activities per call counted (not in a smoke run), then the cases timed
    interleaved; per call, in spec["out"]."""
    os.environ["XLA_FLAGS"] = spec["xla_flags"]
    s = Session(spec["smoke"], references.load(spec["smoke"]))
    ops = spec["chain_ops"]
    cases = _cases(s, ops, spec["bytes"])
    for name, (fn, args) in cases.items():
        s.check(f"{spec['layout']}: {ops} chained {name}", fn(*args), args[0])
    launches = {name: None if s.smoke else _launches(fn, args, ops)
                for name, (fn, args) in cases.items()}
    timed = s.time({name: functools.partial(fn, *args) for name, (fn, args) in cases.items()},
                   spec["rounds"])
    per_call = {name: {k: v / ops for k, v in t.items()} for name, t in timed["cases"].items()}
    with open(spec["out"], "w") as f:
        json.dump({"device": jax.devices()[0].device_kind, "checked": s.checked,
                   "launches": launches, "per_call": per_call,
                   "protocol": timed["protocol"]}, f)


# ---- run.py's process -------------------------------------------------------


def _setting(s: Session, name: str, gpu: str | None, p: dict[str, Any]) -> dict[str, Any]:
    """One flag setting's worker run; each case's µs per call and its gap
    over the minimal kernel, by the wall clock."""
    spec = {"smoke": s.smoke, "xla_flags": SETTINGS[name], **p}
    (w,) = processes.run_workers(s, OP, __file__, name, [gpu], spec, {},
                                 timeout_s=SETTING_TIMEOUT_S, fraction=MEM_FRACTION)
    s.checked.extend(w["checked"])
    minimal = w["per_call"][MINIMAL]["wall_us"]
    cases = {}
    for case, t in w["per_call"].items():
        gap = t["wall_us"] - minimal
        cases[case] = {**t, "launches": w["launches"][case], "gap_us": gap,
                       "target_met": gap <= TARGET_GAP_US}
    s.log(f"{OP} {name}: µs per call over the minimal kernel's {minimal:.2f}: " + ", ".join(
        f"{case} {c['gap_us']:+.2f}" for case, c in cases.items() if case != MINIMAL))
    return {"xla_flags": SETTINGS[name], "device": w["device"], "cases": cases,
            "protocol": w["protocol"]}


def bench_host_cost(s: Session) -> dict[str, Any]:
    """Every case under each flag setting, in a worker process per setting."""
    p = SMOKE if s.smoke else FULL
    gpu = None
    if not s.smoke:
        gpus = processes.visible_gpus()
        if not gpus:
            raise RuntimeError(f"{OP}: no GPU visible (nvidia-smi -L, CUDA_VISIBLE_DEVICES)")
        gpu = gpus[0]
        processes.check_free(OP, gpu, 1, MEM_FRACTION)
    return {"op": OP, "chain_ops": p["chain_ops"], "bytes": p["bytes"], "dtype": "uint32",
            "rounds": p["rounds"], "cases_described": CASES, "minimal": MINIMAL,
            "target_gap_us": TARGET_GAP_US, "clock": "wall_us per call: the chain's wall "
            "clock (harness.Session) over its calls; span_us and busy_us likewise",
            "settings": {name: _setting(s, name, gpu, p) for name in SETTINGS}}


# Not in `all`: its workers need run.py's process to hold no GPU memory
# (own_processes), which `all`'s other ops are measured with.
BENCHMARKS = {OP: Benchmark(lambda s, args: bench_host_cost(s), budget_s=120, in_all=False,
                            own_processes=True)}


if __name__ == "__main__":
    processes.worker_main(worker)
