"""The broadcast benchmark: every jax_tma.broadcast method and cluster size
against XLA's materialised broadcast_to and the copy ceiling, the dsmem
path's SM-to-SM push bandwidth, and a run of every variant once for ncu.

    python benchmarks/run.py broadcast [--out results.json]
    python benchmarks/run.py broadcast-once   # each method once, for ncu
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

import jax_tma
from harness import time_device
from jax_tma import _ffi
from references import ffi_reference, register


BROADCAST_CASES = (
    # name, x shape, axis, n
    ("8 replicas of 4096^2 bf16 (axis=0)", (4096, 4096), 0, 8),
    ("8 replicas of each row of 4096^2 bf16 (axis=1)", (4096, 4096), 1, 8),
    ("GQA repeat K/V heads: (4, 4096, 8, 128) bf16 x4 (axis=3)", (4, 4096, 8, 128), 3, 4),
)


def broadcast_methods() -> list[tuple[str, str, int | None]]:
    """(label, method, cluster_size) of every broadcast variant."""
    out = [("auto", "auto", None), ("store", "store", None), ("simt", "simt", None)]
    for method in ("multicast", "dsmem"):
        out += [(f"{method}/{c}", method, c) for c in (2, 4, 8, 16)]
    return out


def _broadcast_fn(n: int, axis: int, method: str, cluster_size: int | None):
    return jax.jit(functools.partial(jax_tma.broadcast, n=n, axis=axis, method=method,
                                     cluster_size=cluster_size))


def _xla_broadcast(shape: tuple[int, ...], n: int, axis: int):
    out = tuple(shape[:axis]) + (n,) + tuple(shape[axis:])
    return jax.jit(lambda x: jnp.broadcast_to(jnp.expand_dims(x, axis), out))


def bench_broadcast() -> dict[str, Any]:
    """Every broadcast method and cluster size against XLA's materialised
    jnp.broadcast_to and the copy ceiling (cudaMemcpyAsync of the same bytes),
    in one run. Bytes: the input read once plus the output written once.
    Then the dsmem path's SM-to-SM push bandwidth: n=1 (one store per tile,
    cluster - 1 pushes of it), pushed bytes over the kernel's time."""
    register()
    memcpy = ffi_reference("jax_tma_bench_memcpy")
    key = jax.random.key(11)
    rows = []
    for name, shape, axis, n in BROADCAST_CASES:
        x = jax.random.bits(key, shape, jnp.uint16).view(jnp.bfloat16)
        in_bytes = x.size * 2
        nbytes = in_bytes * (n + 1)
        row: dict[str, Any] = {"case": name, "shape": shape, "axis": axis, "n": n,
                               "bytes": nbytes, "us": {}}
        for label, method, cluster in broadcast_methods():
            row["us"][label] = time_device(_broadcast_fn(n, axis, method, cluster), [(x,)], 20,
                                           busy=True) * 1e6
        row["us"]["xla"] = time_device(_xla_broadcast(shape, n, axis), [(x,)], 20,
                                       busy=True) * 1e6
        ceiling_in = jax.random.bits(key, (nbytes // 8,), jnp.uint32)  # nbytes/2 copied
        row["us"]["memcpy"] = time_device(memcpy, [(ceiling_in,)], 20, busy=True) * 1e6
        del ceiling_in
        row["tbps"] = {k: nbytes / v / 1e6 for k, v in row["us"].items()}
        ours = [k for k, _, _ in broadcast_methods() if k != "auto"]
        row["best"] = min(ours, key=lambda k: row["us"][k])
        row["best_vs_xla"] = row["us"]["xla"] / row["us"][row["best"]]
        row["auto_vs_best"] = row["us"][row["best"]] / row["us"]["auto"]
        rows.append(row)
        print(f"{name}: " + ", ".join(f"{k} {v:.1f} us ({row['tbps'][k]:.2f} TB/s)"
                                      for k, v in row["us"].items()), flush=True)
        print(f"  best {row['best']} {row['best_vs_xla']:.2f}x XLA; auto at "
              f"{row['auto_vs_best']:.3f} of best", flush=True)
    x = jax.random.bits(key, (4096, 4096), jnp.uint16).view(jnp.bfloat16)
    push = []
    for cluster in (2, 4, 8, 16):
        seconds = time_device(_broadcast_fn(1, 0, "dsmem", cluster), [(x,)], 20, busy=True)
        pushed = x.size * 2 * (cluster - 1)
        push.append({"cluster_size": cluster, "us": seconds * 1e6, "pushed_bytes": pushed,
                     "push_tbps": pushed / seconds / 1e12})
        print(f"dsmem push, cluster {cluster}: {pushed / seconds / 1e12:.2f} TB/s "
              f"({seconds * 1e6:.1f} us)", flush=True)
    return {"rows": rows, "dsmem_push": push}


def broadcast_once() -> None:
    """Runs every broadcast variant and XLA's broadcast_to once on the first
    case, in the order printed: the kernels an ncu run sees, in order."""
    _ffi.register()
    name, shape, axis, n = BROADCAST_CASES[0]
    x = jax.random.bits(jax.random.key(3), shape, jnp.uint16).view(jnp.bfloat16)
    variants = [(label, _broadcast_fn(n, axis, m, c)) for label, m, c in broadcast_methods()]
    variants.append(("xla", _xla_broadcast(shape, n, axis)))
    for label, fn in variants:
        jax.block_until_ready(fn(x))
        print(f"ran {label} ({name})", flush=True)


def broadcast_table(result: dict[str, Any]) -> str:
    labels = [k for k, _, _ in broadcast_methods()] + ["xla", "memcpy"]
    lines = ["| case | " + " | ".join(labels) + " | best ÷ XLA time | auto vs best |",
             "|" + "---|" * (len(labels) + 3)]
    for r in result["rows"]:
        cells = [f"{r['us'][k]:.1f} µs ({r['tbps'][k]:.2f})" for k in labels]
        lines.append(f"| {r['case']} | " + " | ".join(cells) +
                     f" | {r['best']} {r['best_vs_xla']:.2f}× | {r['auto_vs_best']:.3f} |")
    lines.append("")
    lines.append("| dsmem cluster size | 2 | 4 | 8 | 16 |")
    lines.append("|---|---|---|---|---|")
    lines.append("| SM-to-SM push TB/s (n=1, 32 MiB input) | " +
                 " | ".join(f"{p['push_tbps']:.2f}" for p in result["dsmem_push"]) + " |")
    return "\n".join(lines)
