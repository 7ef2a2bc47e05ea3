"""What the benchmarks that run in processes of their own share (one host,
under jax.distributed): run.py's side, which spawns the workers and never
runs a jax op itself (a worker's GPUs, their memory, its environment, its
log), and the workers' side (jax.distributed, a Session that keeps the
processes' calls apart in their traces, meetings through the key-value
store, blocks made again from a seed on any device).

A benchmark module that uses it is its own worker script: run_workers
starts `python -P MODULE --worker SPEC` per process, and the module ends
with `processes.worker_main(worker)` under `if __name__ == "__main__"`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import provenance
from harness import MIB, Session, _device_events, _split_runs

_BARRIER_TIMEOUT_MS = 120_000
# How far ahead of now process 0 sets the moment of the workers' next
# launch: more than a read of the key-value store takes.
_LAUNCH_LEAD_S = 0.005


# ---- the worker processes ---------------------------------------------------


class WorkerSession(Session):
    """A Session in one of the processes: a pause of `call_gap_s` after each
    traced call, far longer than any idle gap inside one (where the GPU
    time-slices two processes' contexts, a process's stream can idle between
    two kernels of a call), so that the trace is cut into calls at its
    largest gaps. Where the profiler gives no trace (or one without an
    activity per call), the calls are made all the same, so that the
    processes' collectives stay in step, and their span and busy time are
    NaN (null in the result; `untraced` says why).

    Every timed call starts at one moment in every worker (_before_call):
    after the pause, each one's wake-up (time.sleep's, 0.05-0.3 ms late)
    would otherwise set the processes' launches apart by as much, which a
    collective's span then holds; in a training step the processes launch
    as soon as the step before returns."""

    untraced: str | None = None
    call_gap_s = 0.02
    _launches = 0

    def _before_call(self) -> None:
        """Waits for the moment process 0 names for this launch, _LAUNCH_LEAD_S
        ahead on the host's monotonic clock (one clock for every process of
        the host), through jax.distributed's key-value store; sleeps to 1 ms
        before it, then spins."""
        if jax.process_count() == 1:
            return
        client = _client()
        key = f"launch/{self._launches}"
        self._launches += 1
        if jax.process_index() == 0:
            client.key_value_set(key, repr(time.monotonic() + _LAUNCH_LEAD_S))
        at = float(client.blocking_key_value_get(key, _BARRIER_TIMEOUT_MS))
        while (left := at - time.monotonic()) > 0.001:
            time.sleep(left - 0.001)
        while time.monotonic() < at:
            pass

    def timeline(self, fn: Callable[[], Any], calls: int) -> dict[str, Any] | None:
        """Session.timeline of this process's own GPU (`own_gpu`: a process
        traces its own alone, so its trace cannot show how the GPUs'
        activities line up); every worker makes the same calls, traced or
        not, so that the processes stay in step. None where the profiler
        gives no trace."""
        t = super().timeline(fn, calls)
        return None if t is None else dict(t, own_gpu=True)

    def _start_timeline_trace(self, directory: str) -> bool:
        try:
            jax.profiler.start_trace(directory)
        except Exception as e:  # noqa: BLE001 (whatever the profiler raises)
            self.untraced = f"the profiler did not start: {e}"
            return False
        return True

    def _trace(self, cases, plan, before) -> list[tuple[float, float]]:
        with tempfile.TemporaryDirectory() as d:
            try:
                jax.profiler.start_trace(d)
                traced = True
            except Exception as e:  # noqa: BLE001 (whatever the profiler raises)
                self.untraced, traced = f"the profiler did not start: {e}", False
            for name in plan:
                if before is not None:
                    jax.block_until_ready(before())
                self._before_call()
                jax.block_until_ready(cases[name]())
                time.sleep(self.call_gap_s)
            if traced:
                jax.profiler.stop_trace()
                stride = 1 if before is None else 2
                try:
                    return _split_runs(_device_events(d), stride * len(plan))[stride - 1::stride]
                except Exception as e:  # noqa: BLE001 (no profile, or one we cannot read)
                    self.untraced = f"the trace gave no clocks: {e}"
        return [(math.nan, math.nan)] * len(plan)


def initialize(spec: dict[str, Any]) -> None:
    """jax.distributed for a worker of spec["processes"] (none for one):
    spec["own_gpu"]: every GPU visible, this process's the one of its index
    (as jax.distributed gives each process of a host its own)."""
    if spec["processes"] > 1:
        own = [spec["pid"]] if spec.get("own_gpu") else None
        jax.distributed.initialize(f"localhost:{spec['port']}", num_processes=spec["processes"],
                                   process_id=spec["pid"], initialization_timeout=60,
                                   local_device_ids=own)


def _client():
    from jax._src import distributed

    return distributed.global_state.client


def barrier(name: str) -> None:
    """Every process meets here, through jax.distributed's key-value store
    (not a collective: NCCL refuses two ranks on one GPU)."""
    _client().wait_at_barrier(name, _BARRIER_TIMEOUT_MS)


def agree(name: str, mine: str | None) -> dict[int, str]:
    """Every process's `mine` (None: nothing to tell) under `name`, by
    process, None left out; without jax.distributed (one process) this
    one's. What each process saw of a case (a failure), so that all drop
    it alike and their collectives stay in step."""
    if jax.process_count() == 1:
        return {} if mine is None else {0: mine}
    client = _client()
    client.key_value_set(f"agree/{name}/{jax.process_index()}", json.dumps(mine))
    told = {pid: json.loads(client.blocking_key_value_get(f"agree/{name}/{pid}",
                                                          _BARRIER_TIMEOUT_MS))
            for pid in range(jax.process_count())}
    return {pid: x for pid, x in told.items() if x is not None}


class Lowerings(logging.Handler):
    """What jax_tma's debug log says of each collective it lowers: its
    transport and why, without the call site (the same for every case);
    `with_op`: each line starts with the op ("jax_tma.ppermute: ...")."""

    def __init__(self, with_op: bool = False) -> None:
        super().__init__(logging.DEBUG)
        self.with_op = with_op
        self.seen: dict[str, None] = {}

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        what = message.split(": ", 1)[-1]
        if self.with_op:
            what = f"{message.split(' ', 1)[0]}: {what}"
        self.seen[what] = None

    @contextlib.contextmanager
    def watching(self):
        """This handler on the "jax_tma" logger at DEBUG level meanwhile."""
        log = logging.getLogger("jax_tma")
        level = log.level
        log.addHandler(self)
        log.setLevel(logging.DEBUG)
        try:
            yield self
        finally:
            log.removeHandler(self)
            log.setLevel(level)


def _bits_dtype(dtype: Any) -> Any:
    return {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[jnp.dtype(dtype).itemsize]


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _block(key: jax.Array, position: int, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    bits = jax.random.bits(jax.random.fold_in(key, position), shape, _bits_dtype(dtype))
    return bits if bits.dtype == jnp.dtype(dtype) else jax.lax.bitcast_convert_type(bits, dtype)


def local_block(device: jax.Device, seed: int, position: int, shape: Sequence[int],
                dtype: Any = jnp.uint32) -> jax.Array:
    """The block of mesh position `position` under `seed` (random bits of
    `dtype`), made on `device`: every process can make any position's
    block."""
    return _block(jax.device_put(jax.random.key(seed), device), position, tuple(shape),
                  jnp.dtype(dtype))


def global_input(mesh: Mesh, seed: int, shape: Sequence[int],
                 dtype: Any = jnp.uint32) -> jax.Array:
    """Every position's block of `shape` under `seed`, one after another
    along dim 0, sharded over `mesh` (its one axis "i"); each process makes
    its own devices' blocks."""
    devices = list(mesh.devices.flat)
    shards = [local_block(d, seed, devices.index(d), shape, dtype) for d in mesh.local_devices]
    return jax.make_array_from_single_device_arrays(
        (len(devices) * shape[0], *shape[1:]), NamedSharding(mesh, P("i")), shards)


def clean(cases: dict[str, dict[str, float]]) -> dict[str, dict[str, float | None]]:
    """The clocks of each case, NaN (no trace) as None."""
    return {name: {k: None if math.isnan(v) else v for k, v in t.items()}
            for name, t in cases.items()}


def worker_main(worker: Callable[[dict[str, Any]], None]) -> None:
    """A worker script's main: `worker` of the spec that follows --worker;
    on any failure the traceback, and an exit without jax.distributed's
    shutdown (which would wait for the peer)."""
    try:
        if sys.argv[1:2] != ["--worker"] or len(sys.argv) != 3:
            raise SystemExit(f"usage: {sys.argv[0]} --worker SPEC (run_workers starts it)")
        worker(json.loads(sys.argv[2]))
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)


# ---- run.py's process -------------------------------------------------------


def visible_gpus() -> list[str]:
    """The GPUs run.py may use, as CUDA_VISIBLE_DEVICES names them (else
    nvidia-smi's indices), found without CUDA."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip()]
    text = provenance.command_output("nvidia-smi", "-L") or ""
    return [str(i) for i, _ in enumerate(x for x in text.splitlines() if x.startswith("GPU "))]


def memory_mib(gpu: str) -> tuple[float, float] | None:
    """(total, free) MiB of `gpu` by nvidia-smi, or None where it cannot tell."""
    text = provenance.command_output("nvidia-smi", "-i", gpu, "--query-gpu=memory.total,"
                                     "memory.free", "--format=csv,noheader,nounits")
    try:
        total, free = (float(v) for v in (text or "").split(","))
    except ValueError:
        return None
    return total, free


def fitting(sizes_mib: Sequence[float], total_mib: float | None, fraction: float,
            need: Callable[[int], int], what: str = "blocks") -> tuple[list[float], dict[str, str]]:
    """The sizes whose `need(bytes)` fits a worker's `fraction` of a GPU of
    `total_mib` (None: not known, every size), and why each other one is
    left out; each size once (barriers are named by it)."""
    keep, left_out = [], {}
    for mib in dict.fromkeys(sizes_mib):
        held = need(int(mib * MIB))
        if total_mib is None or held <= fraction * total_mib * MIB:
            keep.append(mib)
        else:
            left_out[f"{mib:g} MiB"] = (f"a worker would hold about {held / MIB:.0f} MiB of "
                                        f"{what}, more than its {fraction:g} of "
                                        f"{total_mib:.0f} MiB")
    return keep, left_out


def check_free(op: str, gpu: str, workers: int, fraction: float) -> None:
    """Raises RuntimeError where `gpu` lacks the memory of `workers` workers
    of `fraction` of it each."""
    memory = memory_mib(gpu)
    if memory is None:
        return
    total, free = memory
    need = workers * fraction * total
    if free < need:
        raise RuntimeError(
            f"{op}: GPU {gpu} has {free:.0f} MiB free, and its {workers} worker(s) take "
            f"{need:.0f} MiB ({fraction:g} of {total:.0f} MiB each): another process holds "
            f"the rest")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def tail(path: str, lines: int) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as e:
        return f"({e})"


def _worker_env(smoke: bool, gpus: str | None, extra: dict[str, str],
                fraction: float) -> dict[str, str]:
    """A worker's environment: the benchmarks' folder on its path, its
    platform, its GPUs (None: CUDA_VISIBLE_DEVICES unset) and memory share."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, **extra, PYTHONPATH=os.pathsep.join(
        filter(None, [here, os.environ.get("PYTHONPATH")])))
    if smoke:  # one host device per process
        env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
        return env
    env.update(JAX_PLATFORMS="cuda", XLA_PYTHON_CLIENT_MEM_FRACTION=str(fraction))
    # Its share preallocated as XLA's pool (VMM allocations, what the
    # transport maps), whatever run.py's own process does.
    env.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # as gpu_check.sh runs NCCL
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    return env


def run_workers(s: Session, op: str, script: str, layout: str, gpus: Sequence[str | None],
                spec: dict[str, Any], extra_env: dict[str, str], *, timeout_s: float,
                fraction: float) -> list[dict[str, Any]]:
    """One worker (`script --worker SPEC`) per entry of `gpus` (its
    CUDA_VISIBLE_DEVICES), under jax.distributed where there are several,
    each given `fraction` of its GPU's memory; returns what each wrote to
    its spec["out"]. A worker that fails, or workers past `timeout_s`, raise
    RuntimeError with their last lines (the others are ended)."""
    port = _free_port()
    with (tempfile.TemporaryDirectory(prefix="jax_tma_bench_") as d,
          contextlib.ExitStack() as stack):
        procs, logs, outs = [], [], []
        try:
            for pid, gpu in enumerate(gpus):
                logs.append(os.path.join(d, f"worker{pid}.log"))
                outs.append(os.path.join(d, f"worker{pid}.json"))
                arg = json.dumps({**spec, "layout": layout, "pid": pid, "processes": len(gpus),
                                  "port": port, "out": outs[-1]})
                procs.append(subprocess.Popen(
                    [sys.executable, "-P", os.path.abspath(script), "--worker", arg],
                    env=_worker_env(s.smoke, gpu, extra_env, fraction),
                    stdout=stack.enter_context(open(logs[-1], "w")), stderr=subprocess.STDOUT))
            deadline = time.monotonic() + timeout_s
            while True:  # until all are done, one fails, or the time is up
                codes = [p.poll() for p in procs]
                if None not in codes or any(codes) or time.monotonic() > deadline:
                    break
                time.sleep(0.25)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if codes != [0] * len(procs):
            what = "failed" if any(codes) else f"still ran after {timeout_s:g} s"
            raise RuntimeError(f"{op} {layout}: workers {what}: " + "; ".join(
                f"worker {i} {'was ended' if c is None else f'exited {c}'}, its last lines:\n"
                f"{tail(log, 25)}" for i, (c, log) in enumerate(zip(codes, logs))))
        print(f"{layout}: worker 0's log:\n{tail(logs[0], 200)}", flush=True)
        results = []
        for out in outs:
            with open(out) as f:
                results.append(json.load(f))
        return results
