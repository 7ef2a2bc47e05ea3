"""The ppermute benchmark (two GPUs): jax_tma.ppermute's TMA and SIMT
transports against lax.ppermute (NCCL) and the link's ceiling
(cudaMemcpyPeerAsync of the same bytes, every ring pair at once), with the
GPUs' link topology.

    python benchmarks/run.py ppermute [--out-dir DIR] [--sizes-mib 1 4 ...]
"""

from __future__ import annotations

import functools
import re
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_tma
import provenance
from harness import MIB, Benchmark, Session, every_gpu, rotate_all

OP = "ppermute"
BYTES = ("per direction: the block bytes each GPU sends per op (what crosses the link each "
         "way; every GPU sends its block to the next around a ring, all at once: on two GPUs "
         "they swap blocks, both directions at once), not read + write")
FULL = [1 / 16, 1, 4, 16, 64, 256, 1024]  # MiB per GPU
SMOKE = [1 / 64, 1 / 16]
CEILING = ("cudaMemcpyPeerAsync of the block bytes from each GPU to the next around the ring, "
           "every pair at once (on two GPUs both directions), each pair on a stream of its "
           "source, its copies queued back to back behind a held stream and timed by CUDA "
           "events (µs per copy: the slowest pair's); `one_way`: the first pair alone; median "
           "of the samples; measured in the same run, after each size's timing")
# The ceiling's samples, and the copies each queues per pair: enough that a
# sample lasts milliseconds, at most 200 (the host queues them behind a held
# stream, which the device's queue must hold).
CEILING_SAMPLES = 5
CEILING_COPY_BYTES = 2 << 30


def ceiling_iters(block: int) -> int:
    return max(4, min(200, CEILING_COPY_BYTES // block))


def ring(n: int) -> list[tuple[int, int]]:
    """Each of n devices to the next (on two, a swap)."""
    return [(i, (i + 1) % n) for i in range(n)]

# The permutations timed, by case name: jax_tma's methods and directions, and
# lax.ppermute (NCCL on GPUs).
PPERMUTES: dict[str, Callable[..., jax.Array]] = {
    "pull": functools.partial(jax_tma.ppermute, method="tma", direction="pull"),
    "push": functools.partial(jax_tma.ppermute, method="tma", direction="push"),
    "simt_pull": functools.partial(jax_tma.ppermute, method="simt", direction="pull"),
    "auto": jax_tma.ppermute,
    "nccl": jax.lax.ppermute,
}


def topology() -> dict[str, Any] | None:
    """`nvidia-smi topo -m` as printed, and the GPU0-GPU1 entry of its
    matrix (e.g. 'NV18'); None without nvidia-smi."""
    text = provenance.command_output("nvidia-smi", "topo", "-m")
    if text is None:
        return None
    link = None
    for line in text.splitlines():
        cells = re.sub(r"\x1b\[[0-9;]*m", "", line).split()
        if cells[:1] == ["GPU0"] and len(cells) > 2:
            link = cells[2]  # GPU0's row, GPU1's column
    return {"nvidia_smi_topo_m": text, "gpu0_gpu1": link}


def peer_ceiling(s: Session, devices: Sequence[jax.Device], perm: Sequence[tuple[int, int]],
                 block: int) -> dict[str, Any]:
    """The link's ceiling at `block` bytes (CEILING): {"ring", "one_way"},
    each {"us" (the slowest pair's µs per copy), "gbps" (per direction),
    "us_per_copy" and "peer_access" per pair, "back_to_back" (every sample's
    copies queued before the stream's hold ended)}, with "pairs" (device
    ordinals), "iters" and "samples"; or {"not_measured": why}."""
    if s.refs.peer_copy is None:
        return {"not_measured": "the benchmarks' module _jax_tma_bench has no peer_copy (built "
                                "before it had one): rebuild it with JAX_TMA_BENCH=ON"}
    if len(devices) < 2:
        return {"not_measured": f"{len(devices)} device: a peer copy needs two"}
    ids = [d.id if d.local_hardware_id is None else d.local_hardware_id for d in devices]
    pairs = [(ids[a], ids[b]) for a, b in perm]
    iters, samples = ceiling_iters(block), 2 if s.smoke else CEILING_SAMPLES
    out: dict[str, Any] = {"pairs": pairs, "iters": iters, "samples": samples}
    for name, chosen in (("ring", pairs), ("one_way", pairs[:1])):
        runs = [s.refs.peer_copy(chosen, block, iters) for _ in range(samples)]
        us = [statistics.median(r["us_per_copy"][k] for r in runs) for k in range(len(chosen))]
        out[name] = {"us": max(us), "gbps": block / max(us) / 1e3, "us_per_copy": us,
                     "peer_access": runs[0]["peer_access"],
                     "back_to_back": all(r["queue_us"] <= r["hold_us"] for r in runs)}
    return out


def chained(pp: Callable[..., jax.Array], mesh: Mesh, perm: Sequence[tuple[int, int]],
            chain: int) -> Callable[[jax.Array], jax.Array]:
    """One jitted program over `mesh` (axis "i", blocks sharded along it)
    that applies `pp(block, "i", perm)` `chain` times in a row, so that the
    costs of a call (dispatch, launch) spread over `chain` permutations."""
    def body(b):
        for _ in range(chain):
            b = pp(b, "i", perm)
        return b
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))


def bench_ppermute(s: Session, sizes_mib: Sequence[float] | None = None,
                   chain: int = 8) -> dict[str, Any]:
    """jax_tma.ppermute (TMA bulk pull and push, SIMT pull, auto) against
    lax.ppermute (NCCL) on every GPU (two devices on the CPU), each sending its block to the next
    around a ring (two swap blocks, both directions at once), interleaved,
    each checked bit for bit against NCCL's first. Each jitted program
    chains `chain` permutations; the time per op is the program's span (or
    busy time) over every GPU, over `chain`. After each size's timing, the
    link's ceiling at that size (peer_ceiling)."""
    devices = every_gpu(2)
    mesh = Mesh(np.array(devices), ("i",))
    perm = ring(len(devices))
    impls = {name: chained(pp, mesh, perm, chain) for name, pp in PPERMUTES.items()}
    rows = []
    for mib in sizes_mib or (SMOKE if s.smoke else FULL):
        block = int(mib * MIB)
        inputs = [(jax.device_put(jax.random.bits(k, (len(devices) * block // 4,), jnp.uint32),
                                  NamedSharding(mesh, P("i"))),)
                  for k in jax.random.split(jax.random.key(block), 2)]
        want = impls["nccl"](*inputs[0])
        for name, f in impls.items():
            if name != "nccl":
                s.check(f"{name} {block} B", f(*inputs[0]), want)
        del want
        timed = s.time(rotate_all(impls, inputs),
                       2 if s.smoke else 10, rep=2)
        row: dict[str, Any] = {"block_mib": mib, "protocol": timed["protocol"]}
        for name, t in timed["cases"].items():
            row[f"{name}_us"] = t["span_us"] / chain
            row[f"{name}_busy_us"] = t["busy_us"] / chain
            row[f"{name}_gbps"] = block / row[f"{name}_us"] / 1e3
        for name in impls:
            row[f"{name}_vs_nccl"] = row["nccl_us"] / row[f"{name}_us"]
        del inputs
        row["ceiling"] = peer_ceiling(s, devices, perm, block)
        if "ring" in row["ceiling"]:
            row["ceiling_gbps"] = row["ceiling"]["ring"]["gbps"]
            for name in impls:
                row[f"{name}_vs_ceiling"] = row["ceiling"]["ring"]["us"] / row[f"{name}_us"]
        rows.append(row)
        s.log(f"ppermute {mib:g} MiB per device, GB/s per direction: " + ", ".join(
            f"{name} {row[name + '_gbps']:.1f}" for name in impls)
            + (f", cudaMemcpyPeerAsync {row['ceiling_gbps']:.1f}" if "ceiling_gbps" in row
               else f"; no ceiling: {row['ceiling']['not_measured']}"))
    return {"op": OP, "bytes_convention": BYTES, "rows": rows, "chain": chain, "perm": perm,
            "ceiling": CEILING, "topology": topology()}


BENCHMARKS = {"ppermute": Benchmark(lambda s, args: bench_ppermute(s, args.sizes_mib),
                                    budget_s=120, devices=2, every_device=True, group="multi")}
