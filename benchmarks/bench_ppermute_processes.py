"""The ppermute benchmark across processes: two processes of one host under
jax.distributed swap blocks with jax_tma.ppermute, GPU to GPU, in each layout
the machine has — both on one GPU (`shared`; again under an MPS daemon of the
benchmark's own, `shared_mps`, where one starts) and one GPU each (`per_gpu`,
against lax.ppermute over NCCL) — beside the copy ceiling and the host time
of one call.

    python benchmarks/run.py ppermute_processes [--out-dir DIR] [--sizes-mib 1 16 ...]
    python benchmarks/run.py multi [--out-dir DIR]   # with the two-GPU ppermute benchmark

run.py's process only spawns the workers (this module run as a script, one
process each) and never runs a jax op itself: the workers need the GPUs'
memory, so run.py runs this op before any other and its own process
preallocates none (harness.Benchmark.own_processes). It is not in `run.py
all`, the one-GPU suite. Each worker times its own calls as
harness.Session does (its own profiler trace); the two make the same calls
in the same order, since every case is a collective that meets across them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

import processes
import references
from bench_ppermute import PPERMUTES, chained, ring, topology
from harness import MIB, WALL_CALLS, Benchmark, Session, rotate, rotate_all
from processes import barrier as _barrier, clean as _clean, global_input, local_block

OP = "ppermute_processes"
BYTES = ("per direction: the block bytes each process's device sends per op (the two swap "
         "blocks, both directions at once), not read + write; cudaMemcpyAsync's GB/s counts the "
         "same block bytes once, though it reads and writes them")
FULL = [1 / 16, 1, 16, 64, 256, 1024]  # MiB per device
SMOKE = [1 / 64, 1 / 16]
PERM = ring(2)  # the two processes swap blocks
HOST_BLOCK = 64 << 10  # bytes per device of the un-chained call whose host time is measured
ROUNDS = 10
# Each worker's share of its GPU's memory (XLA_PYTHON_CLIENT_MEM_FRACTION):
# two share one GPU in the shared layouts.
MEM_FRACTION = 0.4
# How long a layout's workers may take, start to last result: a worker that
# hangs (a GPU fault, an MPS server that never comes) ends the layout.
LAYOUT_TIMEOUT_S = 150
# A pause after each traced call (processes.WorkerSession): the GPU
# time-slices two processes' contexts, which can idle a process's stream
# between two kernels of a call.
_CALL_GAP_S = 0.02
# Blocks a worker holds at once besides the wall clock's outputs: two inputs,
# a chain's two in flight, its output, the check's reference.
_BLOCKS_HELD = 6
_WALL_BYTES = 4 << 30  # the outputs of one wall-clock sample, at most
_SHARED_CASES = ["auto", "pull", "push"]  # NCCL refuses two ranks on one GPU


# ---- the worker processes ---------------------------------------------------


def _check(s: Session, label: str, f: Callable[[jax.Array], jax.Array], mesh: Mesh, seed: int,
           words: int, chain: int) -> None:
    """f's output for the input of `seed`, bit for bit on this process's
    devices: each holds the block that `chain` permutations bring to it,
    made again from the seed (NCCL is no reference on one GPU)."""
    devices = list(mesh.devices.flat)
    source = {dst: src for src, dst in PERM}
    for shard in f(global_input(mesh, seed, (words,))).addressable_shards:
        position = devices.index(shard.device)
        for _ in range(chain):
            position = source[position]
        s.check(f"{label} (device {devices.index(shard.device)})", shard.data,
                local_block(shard.device, seed, position, (words,)))


def _wall_calls(block: int) -> int:
    """Calls per wall-clock sample: WALL_CALLS, fewer where their outputs
    would pass _WALL_BYTES."""
    return max(2, min(WALL_CALLS, _WALL_BYTES // block))


def _sweep_row(s: Session, mesh: Mesh, spec: dict[str, Any], mib: float) -> dict[str, Any]:
    """One block size: each case checked (one permutation, then the chained
    program), then timed, interleaved; on worker 0 the ceiling too."""
    block, chain = int(mib * MIB), spec["chain"]
    words, seeds = block // 4, (block, block + 1)
    rounds = 2 if s.smoke else ROUNDS
    fns = {name: chained(PPERMUTES[name], mesh, PERM, chain) for name in spec["cases"]}
    for name, f in fns.items():
        _check(s, f"{name} {block} B", chained(PPERMUTES[name], mesh, PERM, 1), mesh, seeds[0],
               words, 1)
        _check(s, f"{name} {block} B, {chain} chained", f, mesh, seeds[0], words, chain)
    inputs = [(global_input(mesh, seed, (words,)),) for seed in seeds]
    timed = s.time(rotate_all(fns, inputs), rounds, rep=2, wall_calls=_wall_calls(block))
    row = {"block_bytes": block, "cases": _clean(timed["cases"]), "protocol": timed["protocol"]}
    # The ceiling on worker 0's GPU alone: worker 1 waits at the barrier, so
    # that no work of its own shares the GPU meanwhile.
    _barrier(f"memcpy {block}")
    if jax.process_index() == 0:
        local = [(x.addressable_shards[0].data,) for (x,) in inputs]
        s.check(f"memcpy {block} B", s.refs.memcpy(*local[0]), local[0][0])
        ceiling = s.time({"memcpy": rotate(s.refs.memcpy, local)}, rounds, rep=2,
                         wall_calls=_wall_calls(block))
        row["memcpy"] = _clean(ceiling["cases"])["memcpy"]
        row["memcpy_protocol"] = ceiling["protocol"]
    _barrier(f"memcpy {block} done")
    s.log(f"{spec['layout']} {mib:g} MiB, span µs per program: " + ", ".join(
        f"{name} {'no trace' if t['span_us'] is None else round(t['span_us'], 1)}"
        for name, t in row["cases"].items()))
    return row


def _host_time(s: Session, mesh: Mesh, names: Sequence[str]) -> dict[str, Any]:
    """The three clocks of one un-chained call of HOST_BLOCK blocks, the wall
    clock dispatching calls without waiting (the host's time per call where
    the GPU's is shorter)."""
    words, seeds = HOST_BLOCK // 4, (1, 2)
    fns = {name: chained(PPERMUTES[name], mesh, PERM, 1) for name in names}
    for name, f in fns.items():
        _check(s, f"{name} {HOST_BLOCK} B, host time", f, mesh, seeds[0], words, 1)
    inputs = [(global_input(mesh, seed, (words,)),) for seed in seeds]
    timed = s.time(rotate_all(fns, inputs), 2 if s.smoke else ROUNDS, rep=2)
    return {"block_bytes": HOST_BLOCK, "cases": _clean(timed["cases"]),
            "protocol": timed["protocol"]}


def worker(spec: dict[str, Any]) -> None:
    """One worker process: under jax.distributed where the layout has
    several, a mesh over every process's devices; the block sizes
    spec["sizes_mib"] of spec["cases"], then the host time of
    spec["host_cases"]; what it measured as JSON in spec["out"]."""
    processes.initialize(spec)
    s = processes.WorkerSession(spec["smoke"], references.load(spec["smoke"]))
    s.call_gap_s = _CALL_GAP_S
    mesh = Mesh(np.array(jax.devices()), ("i",))
    s.log(f"{spec['layout']}: process {jax.process_index()} of {jax.process_count()}, "
          f"mesh {list(mesh.devices.flat)}")
    with processes.Lowerings().watching() as lowerings:
        rows = [_sweep_row(s, mesh, spec, mib) for mib in spec["sizes_mib"]]
        host = _host_time(s, mesh, spec["host_cases"])
    with open(spec["out"], "w") as f:
        json.dump({"devices": [d.device_kind for d in mesh.devices.flat], "rows": rows,
                   "host_time": host, "checked": s.checked, "untraced": s.untraced,
                   "lowerings": list(lowerings.seen)}, f)


# ---- run.py's process -------------------------------------------------------


def _over(x: float | None, n: int) -> float | None:
    return None if x is None else x / n


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def _row(ours: dict[str, Any], peer: dict[str, Any], chain: int,
         copies_per_gpu: int) -> dict[str, Any]:
    """A block size's numbers per op: worker 0's clocks (its programs chain
    `chain` permutations; the ceiling is one copy a call), worker 1's busy
    time beside them, GB/s by span, and the ratios by span. Against the
    ceiling, an op moves `copies_per_gpu` blocks through one GPU's memory
    (2 where both processes share it: each copies one block, at once)."""
    block = ours["block_bytes"]
    row: dict[str, Any] = {"block_mib": block / MIB, "protocol": ours["protocol"],
                           "memcpy_protocol": ours["memcpy_protocol"]}
    per_call = [(name, t, chain) for name, t in ours["cases"].items()]
    for name, t, n in per_call + [("memcpy", ours["memcpy"], 1)]:
        row[f"{name}_us"] = _over(t["span_us"], n)
        row[f"{name}_busy_us"] = _over(t["busy_us"], n)
        row[f"{name}_wall_us"] = _over(t.get("wall_us"), n)
        row[f"{name}_gbps"] = _ratio(block / 1e3, row[f"{name}_us"])
    for name, _, n in per_call:
        row[f"{name}_peer_busy_us"] = _over(peer["cases"][name]["busy_us"], n)
    row["copies_per_gpu"] = copies_per_gpu
    row["auto_vs_memcpy"] = _ratio(_over(row["memcpy_us"], 1 / copies_per_gpu), row["auto_us"])
    if "nccl" in ours["cases"]:
        row["auto_vs_nccl"] = _ratio(row["nccl_us"], row["auto_us"])
    return row


def _layout(s: Session, name: str, gpus: Sequence[str | None], spec: dict[str, Any],
            extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """One layout's workers run, their checks counted, their rows made: an
    op moves two blocks through one GPU's memory unless each worker has a
    GPU of its own (spec["own_gpu"])."""
    s.log(f"{OP}: layout {name}, " + ("on the CPU" if s.smoke else "CUDA_VISIBLE_DEVICES "
                                        + ", ".join(g or "unset" for g in gpus)))
    workers = processes.run_workers(s, OP, __file__, name, gpus, spec, extra_env or {},
                                    timeout_s=LAYOUT_TIMEOUT_S, fraction=MEM_FRACTION)
    for pid, w in enumerate(workers):
        s.checked.extend(f"{name} process {pid}: {label}" for label in w["checked"])
    return {"devices": workers[0]["devices"], "cuda_visible_devices": list(gpus),
            "rows": [_row(ours, peer, spec["chain"], 1 if spec.get("own_gpu") else 2)
                     for ours, peer in zip(workers[0]["rows"], workers[-1]["rows"])],
            "host_time": workers[0]["host_time"], "lowerings": workers[0]["lowerings"],
            "untraced": {pid: w["untraced"] for pid, w in enumerate(workers) if w["untraced"]}}


def _mps_control(env: dict[str, str], *args: str, command: str | None = None) -> str | None:
    """Runs nvidia-cuda-mps-control with `args` (and `command` on its stdin):
    None where it exits 0, else what went wrong."""
    try:
        done = subprocess.run(["nvidia-cuda-mps-control", *args], input=command, env=env,
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if done.returncode == 0:
        return None
    return (f"`nvidia-cuda-mps-control {' '.join(args) or command!r}` exited {done.returncode}: "
            f"{(done.stderr or done.stdout).strip()[-300:]}")


def _mps_start(env: dict[str, str]) -> str | None:
    """Starts the control daemon and waits up to 10 s for it to answer:
    None, or why it did not start."""
    failure = _mps_control(env, "-d")
    if failure is None:
        for _ in range(20):
            failure = _mps_control(env, command="get_server_list\n")
            if failure is None:
                break
            time.sleep(0.5)
    return failure


@contextlib.contextmanager
def _mps_daemon(gpu: str) -> Iterator[tuple[dict[str, str] | None, str]]:
    """An MPS control daemon of this benchmark's own for `gpu`, in a private
    folder (the machine's daemon, clocks and compute mode untouched): yields
    the workers' MPS environment, or None and why none started; quits it on
    leaving."""
    if shutil.which("nvidia-cuda-mps-control") is None:
        yield None, "not run: nvidia-cuda-mps-control is not on PATH"
        return
    with tempfile.TemporaryDirectory(prefix="jax_tma_mps_") as d:
        dirs = {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(d, "pipe"),
                "CUDA_MPS_LOG_DIRECTORY": os.path.join(d, "log")}
        for path in dirs.values():
            os.makedirs(path)
        # The daemon's CUDA_VISIBLE_DEVICES picks the GPU; its clients see
        # only that one (and must not name it again: MPS renumbers).
        env = dict(os.environ, **dirs, CUDA_VISIBLE_DEVICES=gpu)
        try:
            failure = _mps_start(env)
            yield (dirs, "ran") if failure is None else (None, f"not run: {failure}")
        finally:
            _mps_control(env, command="quit\n")


def bench_ppermute_processes(s: Session, sizes_mib: Sequence[float] | None = None,
                             chain: int = 8) -> dict[str, Any]:
    """jax_tma.ppermute (auto, TMA bulk pull and push) between two worker
    processes swapping blocks, in each layout: `chain` permutations per
    program, each case checked bit for bit against blocks made again from
    the seed, then timed interleaved; the ceiling cudaMemcpyAsync of the
    same bytes on worker 0's GPU; lax.ppermute (NCCL) with a GPU each; the
    host time of one un-chained call, also in one process over two GPUs."""
    gpus = [] if s.smoke else processes.visible_gpus()
    if not s.smoke and not gpus:
        raise RuntimeError(f"{OP}: no GPU visible (nvidia-smi -L, CUDA_VISIBLE_DEVICES)")
    totals = [m[0] for g in gpus[:2] if (m := processes.memory_mib(g))]
    sizes, left_out = processes.fitting(sizes_mib or (SMOKE if s.smoke else FULL),
                                        min(totals) if totals else None, MEM_FRACTION,
                                        lambda block: block * (_BLOCKS_HELD + _wall_calls(block)))
    spec = {"smoke": s.smoke, "chain": chain, "sizes_mib": sizes, "cases": _SHARED_CASES,
            "host_cases": ["auto"]}
    result: dict[str, Any] = {
        "op": OP, "bytes_convention": BYTES, "chain": chain, "perm": PERM,
        "mem_fraction": MEM_FRACTION, "sizes_left_out": left_out,
        "clocks": "worker 0's clocks of its own GPU activity (harness.Session: span, busy, "
                  "wall per call), per op; *_peer_busy_us: worker 1's busy time",
        "layouts": {}, "not_run": {}, "in_process_host_time": None, "topology": None}
    one = [gpus[0]] * 2 if gpus else [None, None]
    if gpus:
        processes.check_free(OP, gpus[0], 2, MEM_FRACTION)
    result["layouts"]["shared"] = _layout(s, "shared", one, spec)
    if len(gpus) >= 2:
        for gpu in gpus[:2]:
            processes.check_free(OP, gpu, 1, MEM_FRACTION)
        both = {**spec, "cases": [*_SHARED_CASES, "nccl"], "host_cases": ["auto", "nccl"]}
        result["layouts"]["per_gpu"] = _layout(s, "per_gpu", [",".join(gpus[:2])] * 2,
                                               {**both, "own_gpu": True})
        result["in_process_host_time"] = _layout(s, "in_process", [",".join(gpus[:2])],
                                                 {**both, "sizes_mib": []})["host_time"]
        result["topology"] = topology()
    else:
        result["not_run"]["per_gpu"] = ("a smoke run (the CPU)" if s.smoke else
                                        f"{len(gpus)} GPU visible (it needs 2)")
    if s.smoke:
        result["mps"] = "not run: a smoke run (the CPU)"
        return result
    # MPS is optional: whatever goes wrong with it is recorded, not raised.
    with _mps_daemon(gpus[0]) as (mps_env, status):
        result["mps"] = status
        if mps_env is not None:
            try:
                processes.check_free(OP, gpus[0], 2, MEM_FRACTION)
                result["layouts"]["shared_mps"] = _layout(s, "shared_mps", [None, None], spec,
                                                          mps_env)
            except RuntimeError as e:
                result["mps"] = "failed: its workers did not finish (`mps_detail` says why)"
                result["mps_detail"] = str(e)
            else:
                result["mps_detail"] = "the control daemon's log ends: " + processes.tail(
                    os.path.join(mps_env["CUDA_MPS_LOG_DIRECTORY"], "control.log"), 8)
    return result


BENCHMARKS = {OP: Benchmark(lambda s, args: bench_ppermute_processes(s, args.sizes_mib),
                            budget_s=300, in_all=False, own_processes=True,
                            group="multi")}


if __name__ == "__main__":
    processes.worker_main(worker)
