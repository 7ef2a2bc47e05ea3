"""The ppermute benchmark (two GPUs): jax_tma.ppermute's TMA and SIMT
transports against lax.ppermute (NCCL).

    python benchmarks/run.py ppermute [--out results.json] [--sizes-mib 1 4 ...]
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

import jax_tma
from harness import MIB, time_device
from jax_tma import _ffi


def bench_ppermute(sizes_mib: Sequence[int], chain: int = 8) -> dict[str, Any]:
    """jax_tma.ppermute (TMA bulk pull and push, SIMT pull, auto) against
    lax.ppermute (NCCL) on the first two GPUs, swapping blocks (both
    directions at once); GB/s per direction.
    Each jitted program chains `chain` permutations; the time per op is the
    program's device span (both GPUs) over `chain`. Bandwidth: block bytes
    per op, which is what crosses the link in each direction."""
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    _ffi.register()
    mesh = Mesh(np.array(jax.devices("cuda")[:2]), ("i",))
    perm = [(0, 1), (1, 0)]

    def chained(pp):
        def body(b):
            for _ in range(chain):
                b = pp(b, "i", perm)
            return b
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))

    impls = {
        "pull": chained(functools.partial(jax_tma.ppermute, method="bulk", direction="pull")),
        "push": chained(functools.partial(jax_tma.ppermute, method="bulk", direction="push")),
        "simt_pull": chained(functools.partial(jax_tma.ppermute, method="simt", direction="pull")),
        "auto": chained(jax_tma.ppermute),
        "nccl": chained(jax.lax.ppermute),
    }
    rows = []
    for mib in sizes_mib:
        block = mib * MIB
        x = jax.device_put(jax.random.bits(jax.random.key(mib), (2 * block // 4,), jnp.uint32),
                           NamedSharding(mesh, P("i")))
        want = np.asarray(impls["nccl"](x))
        row: dict[str, Any] = {"block_mib": mib}
        for name, f in impls.items():
            np.testing.assert_array_equal(np.asarray(f(x)), want)
            t = time_device(f, [(x,)], 10) / chain
            row[f"{name}_us"] = t * 1e6
            row[f"{name}_gbps"] = block / t / 1e9
        for name in impls:
            row[f"{name}_vs_nccl"] = row["nccl_us"] / row[f"{name}_us"]
        rows.append(row)
        print(f"{mib} MiB per device, GB/s per direction: " + ", ".join(
            f"{name} {row[name + '_gbps']:.1f} ({row[name + '_vs_nccl']:.2f}x NCCL)"
            for name in impls), flush=True)
    return {"rows": rows, "chain": chain, "perm": perm}


def ppermute_table(result: dict[str, Any]) -> str:
    lines = ["| block per GPU | pull (TMA bulk) | push (TMA bulk) | pull (SIMT) | auto | "
             "lax.ppermute (NCCL) | auto vs NCCL |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['block_mib']} MiB | {r['pull_gbps']:.1f} | {r['push_gbps']:.1f} | "
                     f"{r['simt_pull_gbps']:.1f} | {r['auto_gbps']:.1f} | {r['nccl_gbps']:.1f} | "
                     f"{r['auto_vs_nccl']:.2f}x |")
    return "\n".join(lines)
