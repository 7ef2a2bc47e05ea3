"""The im2col benchmark: jax_tma.im2col and col2im against XLA's patches,
the slice-and-concatenate formulation, their gradients and the copy ceiling.

    python benchmarks/run.py im2col [--out results.json]
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

import jax_tma
from harness import time_device
from references import ffi_reference, register


def _slice_concat_im2col(x: jax.Array, kernel: Sequence[int]) -> jax.Array:
    """The XLA formulation of a stride-1 SAME im2col (tap-major): pad once,
    then concatenate one shifted slice per kernel tap."""
    spatial = x.shape[1:-1]
    pads = [((k - 1) // 2, k - 1 - (k - 1) // 2) for k in kernel]
    xp = jnp.pad(x, ((0, 0), *pads, (0, 0)))
    taps = [xp[(slice(None),) + tuple(slice(o, o + n) for o, n in zip(tap, spatial))]
            for tap in itertools.product(*(range(k) for k in kernel))]
    return jnp.concatenate(taps, axis=-1)


def bench_im2col() -> dict[str, Any]:
    """jax_tma.im2col (auto, forced TMA, SIMT) against XLA's
    conv_general_dilated_patches and the slice-and-concatenate formulation,
    and col2im against XLA's gradients of both, with the copy ceiling
    (cudaMemcpyAsync of the same bytes) from the same run. Bytes: the input
    read once plus the patch matrix written once (col2im: the reverse)."""
    register()
    memcpy = ffi_reference("jax_tma_bench_memcpy")
    cases = [((64, 56, 56, 64), jnp.bfloat16), ((32, 28, 28, 256), jnp.bfloat16),
             ((16, 224, 224, 4), jnp.float32)]
    rows = []
    for shape, dtype in cases:
        kernel = (3,) * (len(shape) - 2)
        key = jax.random.key(len(rows))
        inputs = [(jax.random.normal(k, shape, jnp.float32).astype(dtype),)
                  for k in jax.random.split(key, 2)]
        x = inputs[0][0]
        out_shape = jax.eval_shape(lambda a: _slice_concat_im2col(a, kernel), x).shape
        itemsize = jnp.dtype(dtype).itemsize
        nbytes = (math.prod(shape) + math.prod(out_shape)) * itemsize
        dims = {4: ("NHWC", "HWIO", "NHWC")}[len(shape)]
        im2col = {m: jax.jit(functools.partial(jax_tma.im2col, kernel_size=kernel,
                                               padding="SAME", method=m))
                  for m in ("auto", "tma", "simt")}
        xla_patches = jax.jit(lambda a: jax.lax.conv_general_dilated_patches(
            a, kernel, (1,) * len(kernel), "SAME", dimension_numbers=dims))
        xla_concat = jax.jit(lambda a: _slice_concat_im2col(a, kernel))
        times = {}
        for name, fn in [*(("im2col_" + m, f) for m, f in im2col.items()),
                         ("xla_patches", xla_patches), ("xla_slice_concat", xla_concat)]:
            times[name] = time_device(fn, inputs, 10, busy=True)
        # col2im: the patch matrix in, x out, against XLA's transposes.
        cts = [(jax.random.normal(k, out_shape, jnp.float32).astype(dtype),)
               for k in jax.random.split(jax.random.fold_in(key, 1), 2)]
        col2im = jax.jit(functools.partial(jax_tma.col2im, input_shape=shape,
                                           kernel_size=kernel, padding="SAME"))
        grad_concat = jax.jit(lambda c: jax.linear_transpose(
            lambda a: _slice_concat_im2col(a, kernel), x)(c)[0])
        grad_patches = jax.jit(lambda c: jax.linear_transpose(
            lambda a: jax.lax.conv_general_dilated_patches(
                a, kernel, (1,) * len(kernel), "SAME", dimension_numbers=dims), x)(c)[0])
        for name, fn in [("col2im", col2im), ("xla_grad_slice_concat", grad_concat),
                         ("xla_grad_patches", grad_patches)]:
            times[name] = time_device(fn, cts, 10, busy=True)
        del cts
        ceiling_in = jax.random.bits(key, (nbytes // 8,), jnp.uint32)  # nbytes/2 copied
        times["memcpy"] = time_device(memcpy, [(ceiling_in,)], 10, busy=True)
        del ceiling_in, inputs
        row: dict[str, Any] = {"shape": list(shape), "dtype": jnp.dtype(dtype).name,
                               "kernel": list(kernel), "padding": "SAME", "bytes": nbytes}
        for name, t in times.items():
            row[name + "_us"] = t * 1e6
            row[name + "_tbps"] = nbytes / t / 1e12
        t_auto = times["im2col_auto"]
        row["auto_vs_xla_patches"] = times["xla_patches"] / t_auto
        row["auto_vs_xla_slice_concat"] = times["xla_slice_concat"] / t_auto
        row["auto_vs_ceiling"] = times["memcpy"] / t_auto
        row["col2im_vs_xla_grad_slice_concat"] = times["xla_grad_slice_concat"] / times["col2im"]
        row["col2im_vs_xla_grad_patches"] = times["xla_grad_patches"] / times["col2im"]
        rows.append(row)
        print(f"{shape} {row['dtype']}: auto {t_auto * 1e3:.4f} ms "
              f"(tma {times['im2col_tma'] * 1e3:.4f}, simt {times['im2col_simt'] * 1e3:.4f}), "
              f"XLA patches {times['xla_patches'] * 1e3:.4f} ms "
              f"({row['auto_vs_xla_patches']:.1f}x), slice-concat "
              f"{times['xla_slice_concat'] * 1e3:.4f} ms ({row['auto_vs_xla_slice_concat']:.2f}x), "
              f"{row['im2col_auto_tbps']:.3f} TB/s = {row['auto_vs_ceiling']:.2f}x memcpy "
              f"{row['memcpy_tbps']:.3f} TB/s; col2im {times['col2im'] * 1e3:.4f} ms vs XLA grad "
              f"{row['col2im_vs_xla_grad_slice_concat']:.2f}x (slice-concat), "
              f"{row['col2im_vs_xla_grad_patches']:.1f}x (patches)", flush=True)
    return {"rows": rows}


def im2col_table(result: dict[str, Any]) -> str:
    lines = ["| input | jax_tma auto ms (TB/s) | tma ms | simt ms | XLA patches ms | "
             "XLA slice-concat ms | auto vs patches | auto vs slice-concat | auto vs copy "
             "ceiling | col2im ms | col2im vs XLA grad (slice-concat / patches) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        ms = {k[:-3]: v / 1e3 for k, v in r.items() if k.endswith("_us")}
        lines.append(
            f"| {tuple(r['shape'])} {r['dtype']} 3x3 SAME | {ms['im2col_auto']:.4f} "
            f"({r['im2col_auto_tbps']:.2f}) | {ms['im2col_tma']:.4f} | {ms['im2col_simt']:.4f} | "
            f"{ms['xla_patches']:.3f} | {ms['xla_slice_concat']:.4f} | "
            f"{r['auto_vs_xla_patches']:.1f}x | {r['auto_vs_xla_slice_concat']:.2f}x | "
            f"{r['auto_vs_ceiling']:.2f}x | {ms['col2im']:.4f} | "
            f"{r['col2im_vs_xla_grad_slice_concat']:.2f}x / {r['col2im_vs_xla_grad_patches']:.1f}x |")
    return "\n".join(lines)
