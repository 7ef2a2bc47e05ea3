"""The im2col benchmark: jax_tma.im2col and col2im against the
slice-and-concatenate formulation, XLA's patches, their gradients and the
copy ceiling; then the convolution a CNN user runs, jax_tma.im2col and a
GEMM against lax.conv_general_dilated (cuDNN) and slice-and-concatenate with
the same GEMM.

    python benchmarks/run.py im2col [--out-dir DIR]
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
from harness import Benchmark, Session, rotate, rotate_all

OP = "im2col"
BYTES = ("read + write: im2col reads the input once and writes the patch matrix once; "
         "col2im reads the patch matrix once and writes the input once")
# Activations in bf16 (and one of them in f32 too: XLA's convolution-based
# patches change with the element type, jax_tma's copies do not); the
# 4-channel image in f32.
FULL = [((64, 56, 56, 64), "bfloat16"), ((32, 28, 28, 256), "bfloat16"),
        ((32, 28, 28, 256), "float32"), ((16, 224, 224, 4), "float32")]
SMOKE = [((2, 8, 8, 16), "bfloat16"), ((2, 8, 8, 16), "float32")]
# The convolutions, 3×3 SAME, stride 1: (input, dtype, output channels), each
# activation in bf16 and f32 (cuDNN's kernels and XLA's GEMMs change with
# the element type), and the 4-channel image's first layer.
CONV_FULL = [((64, 56, 56, 64), "bfloat16", 64), ((64, 56, 56, 64), "float32", 64),
             ((32, 28, 28, 256), "bfloat16", 256), ((32, 28, 28, 256), "float32", 256),
             ((16, 224, 224, 4), "float32", 64)]
CONV_SMOKE = [((2, 8, 8, 16), "bfloat16", 16), ((2, 8, 8, 16), "float32", 16)]
CONV_NOTE = ("each output checked against lax.conv_general_dilated at precision HIGHEST in "
             "float32 (exact here: small integers), to within `tolerance` × its largest "
             "magnitude (a bf16 output rounds); the timed forms run at the default precision "
             "and return the input's dtype")
# The largest error allowed, as a fraction of the reference's largest
# magnitude: a bf16 output rounds to 8 significant bits; f32 sums of small
# integers are exact, but cuDNN may pick a transform (Winograd, FFT) that is
# not.
CONV_TOLERANCE = {"bfloat16": 2.0 ** -7, "float32": 1e-4}


def _slice_concat_im2col(x: jax.Array, kernel: Sequence[int]) -> jax.Array:
    """The XLA formulation of a stride-1 SAME im2col (tap-major): pad once,
    then concatenate one shifted slice per kernel tap."""
    spatial = x.shape[1:-1]
    pads = [((k - 1) // 2, k - 1 - (k - 1) // 2) for k in kernel]
    xp = jnp.pad(x, ((0, 0), *pads, (0, 0)))
    taps = [xp[(slice(None),) + tuple(slice(o, o + n) for o, n in zip(tap, spatial))]
            for tap in itertools.product(*(range(k) for k in kernel))]
    return jnp.concatenate(taps, axis=-1)


def _small_ints(key: jax.Array, shape, dtype, count: int) -> list[tuple[jax.Array]]:
    """`count` arrays of integers in [-8, 8): every sum of a few of them is
    exact in any order, so the col2im sums and XLA's convolution-based
    patches compare bit for bit; the data moved costs the same."""
    return [(jax.random.randint(k, shape, -8, 8).astype(dtype),)
            for k in jax.random.split(key, count)]


def _to_tap_major(p: jax.Array, channels: int) -> jax.Array:
    """conv_general_dilated_patches' (channel, taps) order as (taps, channel)."""
    return p.reshape(*p.shape[:-1], channels, -1).swapaxes(-1, -2).reshape(p.shape)


def _to_channel_major(p: jax.Array, channels: int) -> jax.Array:
    """A (taps, channel) patch matrix in conv_general_dilated_patches' order."""
    return p.reshape(*p.shape[:-1], -1, channels).swapaxes(-1, -2).reshape(p.shape)


def bench_im2col(s: Session) -> dict[str, Any]:
    """Per input: im2col (auto, tma, simt), XLA's conv_general_dilated_patches
    and slice-and-concatenate, and the copy ceiling, interleaved; then col2im
    against XLA's transposes of both formulations and the ceiling,
    interleaved. Every case is checked first against the slice-and-concat
    formulation (the patches reordered from channel-major)."""
    rows = []
    for shape, dtype_name in SMOKE if s.smoke else FULL:
        dtype = jnp.dtype(dtype_name)
        kernel = (3,) * (len(shape) - 2)
        key = jax.random.key(len(rows))
        inputs = _small_ints(key, shape, dtype, 2)
        x = inputs[0][0]
        concat = jax.jit(lambda a: _slice_concat_im2col(a, kernel))
        out_shape = jax.eval_shape(concat, x).shape
        nbytes = (math.prod(shape) + math.prod(out_shape)) * dtype.itemsize
        dims = ("NHWC", "HWIO", "NHWC")
        ceiling_in = jax.random.bits(key, (nbytes // 8,), jnp.uint32)  # nbytes/2 copied
        s.check(f"{shape} memcpy ceiling", s.refs.memcpy(ceiling_in), ceiling_in)

        def patches(a):
            return jax.lax.conv_general_dilated_patches(a, kernel, (1,) * len(kernel), "SAME",
                                                        dimension_numbers=dims)

        forward = {f"im2col_{m}": jax.jit(functools.partial(
            jax_tma.im2col, kernel_size=kernel, padding="SAME", method=m))
            for m in ("auto", "tma", "simt")}
        want = concat(x)
        for name, fn in forward.items():
            s.check(f"{shape} {name}", fn(x), want)
        s.check(f"{shape} xla_patches", jax.jit(lambda a: _to_tap_major(patches(a), shape[-1]))(x), want,
                comparator=True)
        forward["xla_patches"] = jax.jit(patches)
        forward["xla_slice_concat"] = concat
        cases = rotate_all(forward, inputs)
        cases["memcpy"] = rotate(s.refs.memcpy, [(ceiling_in,)])
        fwd = s.time(cases, 4 if s.smoke else 10, rep=2)

        # col2im: the patch matrix in, x out, against XLA's transposes.
        cts = _small_ints(jax.random.fold_in(key, 1), out_shape, dtype, 2)
        backward = {
            "col2im": jax.jit(functools.partial(jax_tma.col2im, input_shape=shape,
                                                kernel_size=kernel, padding="SAME")),
            "xla_grad_slice_concat": jax.jit(lambda c: jax.linear_transpose(concat, x)(c)[0]),
            "xla_grad_patches": jax.jit(lambda c: jax.linear_transpose(patches, x)(c)[0]),
        }
        ct = cts[0][0]
        want = backward["xla_grad_slice_concat"](ct)
        s.check(f"{shape} col2im", backward["col2im"](ct), want)
        s.check(f"{shape} xla_grad_patches", backward["xla_grad_patches"](
            _to_channel_major(ct, shape[-1])), want, comparator=True)
        cases = rotate_all(backward, cts)
        cases["memcpy"] = rotate(s.refs.memcpy, [(ceiling_in,)])
        bwd = s.time(cases, 4 if s.smoke else 10, rep=2)
        del inputs, cts, ceiling_in, want

        times = {**fwd["cases"], **{k: v for k, v in bwd["cases"].items() if k != "memcpy"}}
        times["memcpy_col2im_run"] = bwd["cases"]["memcpy"]
        row: dict[str, Any] = {
            "shape": list(shape), "dtype": dtype.name, "kernel": list(kernel),
            "padding": "SAME", "bytes": nbytes, "times": times,
            "protocol": {"im2col": fwd["protocol"], "col2im": bwd["protocol"]},
            "busy_tbps": {k: nbytes / v["busy_us"] / 1e6 for k, v in times.items()},
        }
        busy = {k: v["busy_us"] for k, v in times.items()}
        row["im2col_vs"] = {k: busy[k] / busy["im2col_auto"]
                            for k in ("xla_patches", "xla_slice_concat", "memcpy")}
        row["col2im_vs"] = {k: busy[k] / busy["col2im"]
                            for k in ("xla_grad_patches", "xla_grad_slice_concat",
                                      "memcpy_col2im_run")}
        rows.append(row)
        s.log(f"im2col {shape} {dtype.name}: " + ", ".join(
            f"{k} {v:.1f} µs" for k, v in busy.items()))
    return {"op": OP, "bytes_convention": BYTES, "rows": rows, **bench_conv(s)}


def _gemm(patches: jax.Array, w: jax.Array) -> jax.Array:
    """The convolution from its patch matrix (N, H, W, taps × C) and HWIO
    weights: one matrix product, the output in NHWC."""
    out = jnp.dot(patches.reshape(-1, patches.shape[-1]), w.reshape(-1, w.shape[-1]))
    return out.reshape(*patches.shape[:-1], w.shape[-1])


def bench_conv(s: Session) -> dict[str, Any]:
    """Per convolution (3×3 SAME, stride 1, HWIO weights): jax_tma.im2col
    then a GEMM, slice-and-concatenate then the same GEMM (XLA may fuse the
    two), lax.conv_general_dilated (cuDNN on a GPU), and the GEMM alone on a
    patch matrix made beforehand (what the im2col costs on top of it),
    interleaved, every output checked first (CONV_NOTE)."""
    rows = []
    for shape, dtype_name, channels_out in CONV_SMOKE if s.smoke else CONV_FULL:
        dtype = jnp.dtype(dtype_name)
        kernel = (3,) * (len(shape) - 2)
        dims = ("NHWC", "HWIO", "NHWC")
        key = jax.random.key(100 + len(rows))
        inputs = _small_ints(key, shape, dtype, 2)
        w = jax.random.randint(jax.random.fold_in(key, 1), (*kernel, shape[-1], channels_out),
                               -8, 8).astype(dtype)

        def conv(a, b, precision=None):
            return jax.lax.conv_general_dilated(a, b, (1,) * len(kernel), "SAME",
                                                dimension_numbers=dims, precision=precision)

        fns = {"im2col_gemm": jax.jit(lambda a, b: _gemm(
                   jax_tma.im2col(a, kernel, padding="SAME"), b)),
               "slice_concat_gemm": jax.jit(lambda a, b: _gemm(_slice_concat_im2col(a, kernel),
                                                               b)),
               "xla_conv": jax.jit(conv)}
        x = inputs[0][0]
        want = jax.jit(lambda a, b: conv(a.astype(jnp.float32), b.astype(jnp.float32),
                                         jax.lax.Precision.HIGHEST))(x, w)
        patches = [(jax.jit(lambda a: _slice_concat_im2col(a, kernel))(a), w) for (a,) in inputs]
        gemm = jax.jit(_gemm)
        errors = {name: _conv_error(f"{shape} {dtype.name} conv: {name}", got, want,
                                    CONV_TOLERANCE[dtype.name])
                  for name, got in [*((k, fn(x, w)) for k, fn in fns.items()),
                                    ("gemm", gemm(*patches[0]))]}
        cases = rotate_all(fns, [(a, w) for (a,) in inputs])
        cases["gemm"] = rotate(gemm, patches)
        timed = s.time(cases, 4 if s.smoke else 10, rep=2)
        del inputs, patches, want
        times = timed["cases"]
        flops = 2 * math.prod(shape[:-1]) * math.prod(kernel) * shape[-1] * channels_out
        busy = {k: v["busy_us"] for k, v in times.items()}
        rows.append({
            "shape": list(shape), "dtype": dtype.name, "kernel": list(kernel), "padding": "SAME",
            "channels_out": channels_out, "flops": flops, "times": times,
            "protocol": timed["protocol"], "max_error": errors,
            "tflops": {k: flops / v / 1e6 for k, v in busy.items()},
            "im2col_gemm_vs": {k: busy[k] / busy["im2col_gemm"]
                               for k in ("xla_conv", "slice_concat_gemm", "gemm")}})
        s.log(f"im2col conv {shape} {dtype.name} -> {channels_out}: " + ", ".join(
            f"{k} {v:.1f} µs" for k, v in busy.items()))
    return {"conv": {"rows": rows, "checked": CONV_NOTE, "tolerance": CONV_TOLERANCE,
                     "forms": {"im2col_gemm": "jnp.dot(jax_tma.im2col(x, (3, 3), "
                                              "padding='SAME').reshape(-1, 9 * C), "
                                              "w.reshape(9 * C, O))",
                               "slice_concat_gemm": "the same jnp.dot of the slice-and-"
                                                    "concatenate patches",
                               "xla_conv": "lax.conv_general_dilated(x, w, (1, 1), 'SAME', "
                                           "dimension_numbers=('NHWC', 'HWIO', 'NHWC'))",
                               "gemm": "the jnp.dot alone, on patches made beforehand"}}}


def _conv_error(label: str, got: jax.Array, want: jax.Array, tolerance: float) -> float:
    """|got - want|'s largest element ÷ |want|'s largest (want: float32, at
    least 1); an AssertionError above `tolerance`."""
    if got.shape != want.shape:
        raise AssertionError(f"benchmark case {label}: shape {got.shape}, want {want.shape}")
    err = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want)) /
                jnp.maximum(jnp.max(jnp.abs(want)), 1.0))
    if not err <= tolerance:
        raise AssertionError(f"benchmark case {label}: error {err:.3g} of the largest output, "
                             f"above the tolerance {tolerance:.3g}")
    return err


BENCHMARKS = {"im2col": Benchmark(lambda s, args: bench_im2col(s), budget_s=90)}
