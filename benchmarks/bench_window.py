"""The window benchmark: jax_tma.window (auto and SIMT) against the XLA
formulation of each case and the copy ceiling.

    python benchmarks/run.py window [--out results.json]
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

import jax_tma
from harness import time_device
from references import ffi_reference, register


def bench_window() -> dict[str, Any]:
    """jax_tma.window against the XLA formulation of each case, with the copy
    ceiling (cudaMemcpyAsync of the same bytes) from the same run. Bytes:
    every output element written once plus the input elements it reads."""
    register()
    f32 = 4
    n = 8192
    key = jax.random.key(7)
    x = jax.random.normal(key, (n, n), jnp.float32)
    i, j = jnp.int32(1234), jnp.int32(2345)
    cases = [
        ("window 4096^2 at a traced offset of 8192^2 f32 vs lax.dynamic_slice",
         lambda m: jax.jit(lambda x, i, j: jax_tma.window(x, (i, j), (4096, 4096), method=m)),
         jax.jit(lambda x, i, j: jax.lax.dynamic_slice(x, (i, j), (4096, 4096))),
         (x, i, j), 2 * 4096 * 4096 * f32),
        ("the same at a 16-B aligned offset (1234, 2344)",
         lambda m: jax.jit(lambda x, i, j: jax_tma.window(x, (i, j), (4096, 4096), method=m)),
         jax.jit(lambda x, i, j: jax.lax.dynamic_slice(x, (i, j), (4096, 4096))),
         (x, i, jnp.int32(2344)), 2 * 4096 * 4096 * f32),
        ("x[::2, ::2] of 8192^2 f32 vs XLA strided slice",
         lambda m: jax.jit(lambda x: jax_tma.window(x, (0, 0), (4096, 4096), strides=(2, 2),
                                                    method=m)),
         jax.jit(lambda x: x[::2, ::2]),
         (x,), 2 * 4096 * 4096 * f32),
        ("pad 8192^2 -> 8320^2 f32 (negative start) vs jnp.pad",
         lambda m: jax.jit(lambda x: jax_tma.window(x, (-64, -64), (8320, 8320), method=m)),
         jax.jit(lambda x: jnp.pad(x, 64)),
         (x,), (n * n + 8320 * 8320) * f32),
        ("copy(method='tiled') vs copy(method='bulk'), 8192^2 f32",
         lambda m: jax.jit(functools.partial(jax_tma.copy, method="tiled" if m == "auto" else m)),
         jax.jit(functools.partial(jax_tma.copy, method="bulk")),
         (x,), 2 * n * n * f32),
    ]
    memcpy = ffi_reference("jax_tma_bench_memcpy")
    rows = []
    for name, ours, xla, args, nbytes in cases:
        # GPU busy time: in a two-op program (start assembled from traced
        # scalars, then the window) the GPU idles while the host encodes the
        # tensor maps; larger programs hide that behind asynchronous dispatch.
        t_ours = time_device(ours("auto"), [args], 20, busy=True)
        t_simt = time_device(ours("simt"), [args], 20, busy=True)
        t_xla = time_device(xla, [args], 20, busy=True)
        ceiling_in = jax.random.bits(key, (nbytes // 8,), jnp.uint32)  # nbytes/2 copied
        t_copy = time_device(memcpy, [(ceiling_in,)], 20, busy=True)
        t_span = time_device(ours("auto"), [args], 20)
        row = {
            "case": name, "bytes": nbytes,
            "jax_tma_us": t_ours * 1e6, "jax_tma_span_us": t_span * 1e6,
            "simt_us": t_simt * 1e6, "xla_us": t_xla * 1e6,
            "memcpy_us": t_copy * 1e6,
            "jax_tma_tbps": nbytes / t_ours / 1e12, "simt_tbps": nbytes / t_simt / 1e12,
            "xla_tbps": nbytes / t_xla / 1e12, "memcpy_tbps": nbytes / t_copy / 1e12,
        }
        row["vs_xla"] = t_xla / t_ours
        row["vs_ceiling"] = t_copy / t_ours
        rows.append(row)
        print(f"{name}: jax_tma {row['jax_tma_tbps']:.3f} TB/s (simt {row['simt_tbps']:.3f}), "
              f"XLA {row['xla_tbps']:.3f} TB/s ({row['vs_xla']:.2f}x), ceiling "
              f"{row['memcpy_tbps']:.3f} TB/s ({row['vs_ceiling']:.2f}x)", flush=True)
    return {"rows": rows}


def window_table(result: dict[str, Any]) -> str:
    lines = ["| case | jax_tma auto TB/s | (span) | jax_tma simt TB/s | XLA TB/s | auto vs XLA | "
             "auto vs copy ceiling |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        span = r["bytes"] / r["jax_tma_span_us"] / 1e6
        lines.append(f"| {r['case']} | {r['jax_tma_tbps']:.3f} | {span:.3f} | "
                     f"{r['simt_tbps']:.3f} | {r['xla_tbps']:.3f} | {r['vs_xla']:.2f}x | "
                     f"{r['vs_ceiling']:.2f}x |")
    return "\n".join(lines)
