"""jax_tma.window on the CPU: random geometries against the NumPy reference
(bit-exact), out-of-bounds and degenerate boxes, jit with traced starts,
vmap with batched x and/or start, the transpose and AD, and every error."""

import functools
import os
import re
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_tma

from families.window import window_expect, window_reference
from ops_table import COMPLEX_FILLS, FLOAT_DTYPES, check_fills
from reference import (ALL_DTYPES, assert_bits_equal, assert_no_collectives, collectives_in,
                       cpu_device, cpu_mesh, random_array, use_mesh)

FLOATS = [d for d in ALL_DTYPES if jnp.issubdtype(d, jnp.inexact)
          and d.name not in ("float4_e2m1fn",)]
UNKNOWN = -2**63  # a static_start entry of a traced start (the handlers' kUnknownStart)



def on_cpu(a):
    return jax.device_put(a, cpu_device())


def random_geometry(rng, rank):
    x_shape = tuple(int(v) for v in rng.integers(0 if rng.random() < 0.05 else 1, 9, rank))
    shape = tuple(int(v) for v in rng.integers(1, 7, rank))
    strides = tuple(int(v) for v in rng.integers(1, 11, rank))
    start = tuple(int(rng.integers(-12, max(d, 1) + 12)) for d in x_shape)
    return x_shape, start, shape, strides


@pytest.mark.parametrize("trial", range(40))
def test_random_windows_match_numpy(rng, trial):
    rank = int(rng.integers(1, 7))
    x_shape, start, shape, strides = random_geometry(rng, rank)
    dtype = ALL_DTYPES[int(rng.integers(len(ALL_DTYPES)))]
    nan = bool(rng.random() < 0.4) and dtype in FLOATS
    x = random_array(rng, x_shape, dtype)
    want = window_reference(x, start, shape, strides, fill_nan=nan)
    got = jax_tma.window(on_cpu(x), start, shape, strides=strides,
                         fill="nan" if nan else 0)
    assert_bits_equal(got, want)
    traced = jax.jit(lambda a, s: jax_tma.window(a, list(s), shape, strides=strides,
                                                 fill="nan" if nan else 0))
    assert_bits_equal(traced(on_cpu(x), tuple(jnp.int32(v) for v in start)), want)


def _bound_rank(f, *args):
    """The spatial rank of the jax_tma_window call(s) `f` lowers to: the
    length of each call's strides attribute."""
    text = jax.jit(f).lower(*args).as_text()
    return [int(n) for n in re.findall(r"strides = dense<[^>]*> : tensor<(\d+)xi64>", text)]


@pytest.mark.parametrize("x64", [True, False])
@pytest.mark.parametrize("trial", range(12))
def test_dims_the_box_covers_merge(rng, trial, x64):
    """Inner dims the box takes in full fold into the dim outside them (up
    to rank 8 here), with static and traced starts, same result."""
    rank = int(rng.integers(2, 9))
    x_shape, start, shape, strides = (list(v) for v in random_geometry(rng, rank))
    for d in range(rank):
        x_shape[d] = min(x_shape[d], 4) or 1
        if rng.random() < 0.6:
            start[d], shape[d], strides[d] = 0, x_shape[d], 1
        elif rng.random() < 0.5:
            strides[d] = 1
    x = random_array(rng, x_shape, np.float32)
    want = window_reference(x, start, shape, strides)
    with jax.enable_x64(x64):
        got = jax_tma.window(on_cpu(x), start, shape, strides=strides)
        traced = jax.jit(lambda a, *s: jax_tma.window(a, s, shape, strides=strides))
        got_traced = traced(on_cpu(x), *(np.int32(v) for v in start))
    assert_bits_equal(got, want)
    assert_bits_equal(got_traced, want)


def test_merging_reaches_rank_five():
    x = np.zeros((2, 3, 2, 2, 2, 4, 8), np.float32)
    full = (0,) * 6

    def f(a):
        return jax_tma.window(a, (1,) + full, (1,) + x.shape[1:])

    assert _bound_rank(f, x) == [1]
    # A traced start merges too, clamped first so that its scaled value
    # stays within int32, with or without x64.
    g = lambda a, i: jax_tma.window(a, (1, i) + full[1:], (1, 2) + x.shape[2:])  # noqa: E731
    assert _bound_rank(g, x, np.int32(1)) == [2]
    with jax.enable_x64(False):
        assert _bound_rank(g, x, np.int32(1)) == [2]
    # A strided dim takes nothing in: its inner neighbour stays apart.
    h = lambda a: jax_tma.window(a, full + (0,), x.shape[:5] + (2, 8), strides=(1,) * 5 + (2, 1))  # noqa: E731
    assert _bound_rank(h, x) == [2]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype(rng, dtype):
    x = random_array(rng, (7, 9), dtype)
    assert_bits_equal(jax_tma.window(on_cpu(x), (-2, 3), (5, 8), strides=(2, 1)),
                      window_reference(x, (-2, 3), (5, 8), (2, 1)))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_nan_fill_bits(rng, dtype):
    x = random_array(rng, (4, 6), dtype)
    got = jax_tma.window(on_cpu(x), (2, 4), (4, 4), fill="nan")
    assert_bits_equal(got, window_reference(x, (2, 4), (4, 4), fill_nan=True))


WINDOW_FILLS = [0, 0.0, -0.0, float("nan"), "nan", np.float32(-0.0), ml_dtypes.bfloat16(-0.0),
                jnp.array(0.0), jnp.array(-0.0), jnp.array(float("nan"))]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_every_fill_of_every_float_dtype_as_jnp_pad_writes_it(rng, dtype):
    """On the default device: -0.0 stays negative, NaN is float8_e5m2's
    0x7F, 0 is float8_e8m0fnu's 0xFF; complex fills of two different halves
    too."""
    x = random_array(rng, (5, 6), dtype)
    start, shape, strides = (-2, 3), (6, 4), (1, 2)  # over three edges

    def win(a, fill):
        return jax_tma.window(a, start, shape, strides=strides, fill=fill)

    fills = WINDOW_FILLS + (COMPLEX_FILLS if np.dtype(dtype).kind == "c" else [])
    check_fills(win, x, fills, lambda f: window_expect(x, start, shape, strides, f))


def test_fully_out_of_bounds_and_zero_size_x(rng):
    x = random_array(rng, (5, 5), np.float32)
    assert_bits_equal(jax_tma.window(on_cpu(x), (100, -100), (3, 4)),
                      np.zeros((3, 4), np.float32))
    got = jax_tma.window(on_cpu(x), (-10, 0), (2, 2), fill="nan")
    assert np.isnan(np.asarray(got)).all()
    empty = np.zeros((0, 4), np.int16)
    assert_bits_equal(jax_tma.window(on_cpu(empty), (0, 0), (2, 3)), np.zeros((2, 3), np.int16))


def test_matches_lax_formulations(rng):
    x = on_cpu(jnp.asarray(rng.standard_normal((16, 12)), jnp.float32))
    s = jnp.int32(5)
    np.testing.assert_array_equal(
        jax.jit(lambda x, s: jax_tma.window(x, (s, 2), (4, 6)))(x, s),
        lax.dynamic_slice(x, (5, 2), (4, 6)))
    np.testing.assert_array_equal(jax_tma.window(x, (1, 0), (8, 4), strides=(2, 3)),
                                  x[1::2, ::3][:8, :4])
    np.testing.assert_array_equal(jax_tma.window(x, (-2, -3), (20, 18)),
                                  jnp.pad(x, ((2, 2), (3, 3))))


def test_start_forms(rng):
    x = on_cpu(jnp.arange(30.0).reshape(5, 6))
    want = np.asarray(x)[1:3, 2:5]
    for start in [(1, 2), [np.int64(1), 2], jnp.array([1, 2]), np.array([1, 2], np.int32)]:
        np.testing.assert_array_equal(jax_tma.window(x, start, (2, 3)), want)
    f = jax.jit(lambda x, s: jax_tma.window(x, s, (2, 3)))
    np.testing.assert_array_equal(f(x, jnp.array([1, 2])), want)


def test_in_a_fori_loop(rng):
    x = on_cpu(jnp.asarray(rng.standard_normal((10, 4)), jnp.float32))

    def body(i, acc):
        return acc + jax_tma.window(x, (i, 0), (2, 4))

    got = jax.jit(lambda: lax.fori_loop(0, 9, body, jnp.zeros((2, 4), jnp.float32)))()
    want = sum(np.asarray(x)[i:i + 2] for i in range(9))
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_vmap_batched_x_start_and_both(rng):
    xs = random_array(rng, (3, 6, 7), np.float32)
    starts = np.array([[0, 1], [-2, 3], [4, 5]], np.int32)
    one = lambda x, s: jax_tma.window(x, s, (3, 4), strides=(2, 1))  # noqa: E731
    for in_axes in [(0, None), (None, 0), (0, 0)]:
        f = jax.vmap(one, in_axes=in_axes)
        got = f(on_cpu(xs) if in_axes[0] == 0 else on_cpu(xs[0]),
                starts if in_axes[1] == 0 else starts[0])
        want = np.stack([
            window_reference(xs[i] if in_axes[0] == 0 else xs[0],
                             starts[i] if in_axes[1] == 0 else starts[0], (3, 4), (2, 1))
            for i in range(3)])
        assert_bits_equal(got, want)
        names = [e.primitive.name for e in jax.make_jaxpr(f)(
            xs if in_axes[0] == 0 else xs[0],
            starts if in_axes[1] == 0 else starts[0]).jaxpr.eqns]
        assert names.count("jax_tma_window") == 1 and "while" not in names, names


def test_nested_vmap(rng):
    xs = random_array(rng, (2, 3, 5, 6), np.int32)
    starts = rng.integers(-3, 6, (3, 2)).astype(np.int32)
    f = jax.vmap(jax.vmap(lambda x, s: jax_tma.window(x, s, (2, 3)), in_axes=(0, 0)),
                 in_axes=(0, None))
    want = np.stack([np.stack([window_reference(xs[a, b], starts[b], (2, 3))
                               for b in range(3)]) for a in range(2)])
    assert_bits_equal(f(on_cpu(xs), starts), want)


def test_grad_scatters_into_zeros(rng):
    x = on_cpu(jnp.asarray(rng.standard_normal((6, 7)), jnp.float32))
    w = jnp.asarray(rng.standard_normal((4, 4)), jnp.float32)

    def f(x):
        return (jax_tma.window(x, (-1, 2), (4, 4), strides=(2, 2), fill="nan") * w
                ).sum(where=~jnp.isnan(jax_tma.window(x, (-1, 2), (4, 4), strides=(2, 2),
                                                        fill="nan")))

    def g(x):  # the same through XLA: pad, then strided slice
        xp = jnp.pad(x, ((1, 4), (0, 2)))
        return (xp[0:8:2, 2:10:2] * w).sum()

    np.testing.assert_allclose(jax.grad(f)(x), jax.grad(g)(x), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(jax.grad(f))(x), jax.grad(g)(x), rtol=1e-6)


def test_vjp_of_vmapped_start_sums_over_the_batch(rng):
    x = on_cpu(jnp.asarray(rng.standard_normal((8,)), jnp.float32))
    starts = jnp.array([0, 2, 5], jnp.int32)
    f = lambda x: jax.vmap(lambda s: jax_tma.window(x, (s,), (4,)))(starts)  # noqa: E731
    y, pull = jax.vjp(f, x)
    ct = jnp.asarray(rng.standard_normal(y.shape), jnp.float32)
    want = np.zeros(8, np.float32)
    for i, s in enumerate([0, 2, 5]):
        for k in range(4):
            if s + k < 8:
                want[s + k] += ct[i, k]
    np.testing.assert_allclose(pull(ct)[0], want, rtol=1e-6)


def test_linear_transpose_and_its_transpose(rng):
    """The transpose scatters the cotangent into zeros shaped like x, bit for
    bit as NumPy and XLA's transpose of pad + strided slice do; its own
    transpose is the window again. Special values included: nothing adds."""
    x = random_array(rng, (5, 6), np.float32)
    ct = random_array(rng, (3, 5), np.float32)
    f = functools.partial(jax_tma.window, start=(1, -2), shape=(3, 5), strides=(1, 2))

    def xla(a):  # rows 1..3; columns -2, 0, 2, 4, 6 of a 6-column x
        return jnp.pad(a, ((0, 0), (2, 1)))[1:4, 0:9:2]

    want = np.zeros((5, 6), np.float32)
    want[1:4, 0:6:2] = ct[:, 1:4]  # window columns 1..3 land on x columns 0, 2, 4
    (t,) = jax.linear_transpose(f, on_cpu(x))(on_cpu(ct))
    assert_bits_equal(t, want)
    assert_bits_equal(t, jax.vjp(xla, on_cpu(x))[1](on_cpu(ct))[0])
    (tt,) = jax.linear_transpose(lambda c: jax.linear_transpose(f, on_cpu(x))(c)[0],
                                 on_cpu(ct))(on_cpu(x))
    assert_bits_equal(tt, window_reference(x, (1, -2), (3, 5), (1, 2)))
    assert_bits_equal(tt, xla(on_cpu(x)))


# ---- errors ----

def test_errors_name_the_op_rule_and_values():
    x = jnp.ones((4, 5))
    cases = [
        (TypeError, r"x must be an array", lambda: jax_tma.window([1], (0,), (1,))),
        (ValueError, r"x must have rank >= 1", lambda: jax_tma.window(jnp.float32(1), (), ())),
        (ValueError, r"start has 3 entries but x has rank 2 \(x.shape=\(4, 5\)\)",
         lambda: jax_tma.window(x, (0, 0, 0), (1, 1))),
        (ValueError, r"shape has 1 entries but x has rank 2",
         lambda: jax_tma.window(x, (0, 0), (1,))),
        (ValueError, r"strides has 3 entries but x has rank 2",
         lambda: jax_tma.window(x, (0, 0), (1, 1), strides=(1, 1, 1))),
        (TypeError, r"start\[1\] must be an integer scalar, got 1.5",
         lambda: jax_tma.window(x, (0, 1.5), (1, 1))),
        (TypeError, r"start must be integers, got dtype float32",
         lambda: jax_tma.window(x, jnp.zeros(2, jnp.float32), (1, 1))),
        (ValueError, r"shape\[1\] = 0 is below 1", lambda: jax_tma.window(x, (0, 0), (1, 0))),
        (ValueError, r"shape\[0\] = -3 is below 1", lambda: jax_tma.window(x, (0, 0), (-3, 1))),
        (ValueError, r"strides\[0\] = 0 is below 1",
         lambda: jax_tma.window(x, (0, 0), (1, 1), strides=(0, 1))),
        (ValueError, r"shape\[0\] = 2147483648 is over 2\^31 - 1",
         lambda: jax_tma.window(x, (0, 0), (2**31, 1))),
        (ValueError, r"fill must be a number or 'nan', got 'inf'",
         lambda: jax_tma.window(x, (0, 0), (1, 1), fill="inf")),
        (TypeError, r"fill must be a scalar number, got \[0, 0\]",
         lambda: jax_tma.window(x, (0, 0), (1, 1), fill=[0, 0])),
        (TypeError, r"fill must be a number, got b'1'",
         lambda: jax_tma.window(x, (0, 0), (1, 1), fill=b"1")),
        (TypeError, r"fill must be a concrete scalar .* got a traced value",
         lambda: jax.jit(lambda f: jax_tma.window(x, (0, 0), (1, 1), fill=f))(1.0)),
        (TypeError, r"a complex fill \(1\+1j\) needs a complex x, x has dtype float64",
         lambda: jax_tma.window(x, (0, 0), (1, 1), fill=1 + 1j)),
        (ValueError, r"start \(-3000000000, 0\) needs int64; enable jax_enable_x64",
         lambda: _without_x64(lambda: jax_tma.window(x, (-3_000_000_000, 0), (2**31 - 1, 1),
                                                     strides=(2, 1)))),
        (ValueError, r"fill=NaN needs a floating dtype, x has dtype int32",
         lambda: jax_tma.window(x.astype(jnp.int32), (0, 0), (1, 1), fill="nan")),
        (ValueError, r"method must be one of 'auto', 'tma', 'simt', got 'bulk'",
         lambda: jax_tma.window(x, (0, 0), (1, 1), method="bulk")),
        (TypeError, r"shape must be a sequence of 2 ints, got 3",
         lambda: jax_tma.window(x, (0, 0), 3)),
    ]
    for exc, pattern, call in cases:
        with pytest.raises(exc, match=r"^jax_tma\.window: " + pattern):
            call()


def _without_x64(f):
    with jax.enable_x64(False):
        return f()


def _raw_window(x, start, out_shape, device=None, **attrs):
    """The target called directly (on the CPU unless `device` is given);
    `start` is one array or a tuple of per-dim start operands. A side effect
    keeps XLA from dropping a call whose output has no elements."""
    jax_tma._ffi.register()
    device = device or cpu_device()
    call = jax.ffi.ffi_call("jax_tma_window", jax.ShapeDtypeStruct(out_shape, x.dtype),
                            has_side_effect=True)
    base = dict(strides=np.ones(len(out_shape), np.int64), fill=np.zeros(2, np.int64),
                transpose=False, method="auto")
    base.update(attrs)
    base.setdefault("static_start", np.full(len(base["strides"]), UNKNOWN, np.int64))
    starts = start if isinstance(start, tuple) else (start,)
    put = functools.partial(jax.device_put, device=device)
    return jax.block_until_ready(
        jax.jit(lambda a, *s: call(a, *s, **base))(put(x), *map(put, starts)))


def test_handler_revalidates():
    x = jnp.ones((4, 5), jnp.float32)
    s = jnp.zeros(2, jnp.int32)
    with pytest.raises(Exception, match=r"jax_tma\.window: strides\[1\] = 0 is outside"):
        _raw_window(x, s, (2, 2), strides=np.array([1, 0], np.int64))
    with pytest.raises(Exception, match=r"jax_tma\.window: start has 3 entries; expected 2"):
        _raw_window(x, jnp.zeros(3, jnp.int32), (2, 2))
    with pytest.raises(Exception, match=r"jax_tma\.window: start must be s32 or s64, got f32"):
        _raw_window(x, jnp.zeros(2, jnp.float32), (2, 2))
    with pytest.raises(Exception, match=r"jax_tma\.window: method must be one of 'auto', 'tma', "
                                        r"'simt', got 'fast'"):
        _raw_window(x, s, (2, 2), method="fast")
    with pytest.raises(Exception, match=r"jax_tma\.window: input rank 2 is neither 3 nor 4"):
        _raw_window(x, jnp.zeros(3, jnp.int32), (1, 2, 2, 2),
                    strides=np.ones(3, np.int64))
    # One start operand per dim (what the lowering passes for unbatched starts).
    one = jnp.zeros((), jnp.int32)
    with pytest.raises(Exception, match=r"jax_tma\.window: got 3 start operands; expected 1 "
                                        r"\(an array\) or 2 \(one scalar per dim\)"):
        _raw_window(x, (one, one, one), (2, 2))
    with pytest.raises(Exception, match=r"jax_tma\.window: start operands mix s32 and s64"):
        _raw_window(x, (one, jnp.zeros((), jnp.int64)), (2, 2))
    with pytest.raises(Exception, match=r"jax_tma\.window: start operand 1 has 2 elements; "
                                        r"one per dim expected"):
        _raw_window(x, (one, jnp.zeros(2, jnp.int32)), (2, 2))


# (name, x shape, start shape, output shape, attributes, the handler's error):
# the geometry rules of DecodeWindow (window_common.h), which the CPU and
# CUDA handlers share; Python never binds such a call.
HANDLER_GEOMETRY_ERRORS = [
    ("no-spatial-dims", (4, 5), (2,), (4, 5), dict(strides=np.ones(0, np.int64)),
     r"spatial rank 0 is outside \[1, 16\]"),
    ("rank-17", (4, 5), (2,), (4, 5), dict(strides=np.ones(17, np.int64)),
     r"spatial rank 17 is outside \[1, 16\]"),
    ("output-below-window-rank", (4, 5), (2,), (5,), dict(strides=np.ones(2, np.int64)),
     r"output rank 1 is below the window rank 2"),
    ("batch-dim-mismatch", (3, 4, 5), (2,), (2, 4, 5), dict(strides=np.ones(2, np.int64)),
     r"input dim 0 = 3 differs from output dim 0 = 2 \(batch dims\)"),
    # 2^31 x 0 elements: the rule fires and nothing is allocated
    ("window-dim-over-int32", (4, 5), (2,), (2**31, 0), {},
     r"window dim 0 = 2147483648 is over 2\^31 - 1"),
    ("inner-window-dim-over-int32", (4, 5), (2,), (0, 2**31 + 5), {},
     r"window dim 1 = 2147483653 is over 2\^31 - 1"),
    ("transpose-fill-not-zero", (4, 5), (2,), (4, 5),
     dict(transpose=True, fill=np.array([0x7FC000007FC00000] * 2, np.int64)),
     r"the transpose fills with zeros only"),
    ("fill-words", (4, 5), (2,), (2, 2), dict(fill=np.zeros(3, np.int64)),
     r"fill holds 3 int64 words; expected 2 per output, 2 in all"),
    ("fill-not-one-element", (4, 5), (2,), (2, 2), dict(fill=np.array([1, 1], np.int64)),
     r"fill is not one 4-byte element repeated to 16 bytes \(words 1, 1\)"),
    ("transpose-unbatched-cotangent", (4, 5), (3, 2), (3, 4, 5),
     dict(transpose=True, strides=np.ones(2, np.int64)),
     r"the transpose needs a batched cotangent"),
    ("static-start-entries", (4, 5), (2,), (2, 2), dict(static_start=np.zeros(3, np.int64)),
     r"static_start has 3 entries; expected 2 \(one per dim, -9223372036854775808 where "
     r"traced\)"),
    ("static-start-of-batched-starts", (4, 5), (3, 2), (3, 2, 2),
     dict(strides=np.ones(2, np.int64), static_start=np.array([1, UNKNOWN], np.int64)),
     r"static_start\[0\] = 1 is known, but the starts are batched \(one set per batch "
     r"entry\)"),
]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("x_shape, start_shape, out_shape, attrs, match",
                         [c[1:] for c in HANDLER_GEOMETRY_ERRORS],
                         ids=[c[0] for c in HANDLER_GEOMETRY_ERRORS])
def test_handler_rejects_bad_geometry(rng, device, x_shape, start_shape, out_shape, attrs, match):
    x = random_array(rng, x_shape, np.float32)
    start = np.zeros(start_shape, np.int32)
    with pytest.raises(Exception, match=r"jax_tma\.window: " + match):
        _raw_window(x, start, out_shape, device=jax.devices(device)[0], **attrs)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("shape", [(4, 8), (3, 5)])  # whole 16-B rows (the vector form), not
def test_handler_reads_a_static_start_in_place_of_the_operand(rng, device, shape):
    """Where static_start gives every start, those are the starts (kernel
    parameters on the GPU), not the operands'; where any is unknown, all are
    the operands' (the entries then only steer auto's kernel choice)."""
    x = random_array(rng, (9, 12), np.float32)
    dev = jax.devices(device)[0]
    ops = (jnp.int32(0), jnp.int32(-2))
    for static, start in [((2, 3), (2, 3)), ((UNKNOWN, 3), (0, -2)), ((2, UNKNOWN), (0, -2))]:
        got = _raw_window(x, ops, shape, device=dev, static_start=np.array(static, np.int64))
        assert_bits_equal(got, window_reference(x, start, shape))


def test_handler_accepts_the_geometry_next_to_each_rule(rng):
    """The valid neighbours of the cases above run: rank 16, a batched
    input and output, a transpose with a batched cotangent."""
    x = random_array(rng, (1,) * 15 + (2,), np.float32)
    got = _raw_window(x, np.zeros(16, np.int32), (1,) * 15 + (3,),
                      strides=np.ones(16, np.int64))
    assert_bits_equal(got, window_reference(x, (0,) * 16, (1,) * 15 + (3,)))
    xs = random_array(rng, (3, 4, 5), np.float32)
    got = _raw_window(xs, np.array([1, -1], np.int32), (3, 2, 3), strides=np.ones(2, np.int64))
    assert_bits_equal(got, np.stack([window_reference(a, (1, -1), (2, 3)) for a in xs]))
    ct = random_array(rng, (3, 2, 3), np.float32)
    got = _raw_window(ct, np.array([[0, 1], [1, 0], [3, 3]], np.int32), (3, 4, 5),
                      strides=np.ones(2, np.int64), transpose=True)
    want = np.zeros((3, 4, 5), np.float32)
    for b, (i, j) in enumerate([(0, 1), (1, 0), (3, 3)]):
        box = want[b, i:i + 2, j:j + 3]
        box[...] = ct[b, :box.shape[0], :box.shape[1]]
    assert_bits_equal(got, want)


_EMPTY_INNER_DIM = """
import sys
import jax, numpy as np, jax_tma
jax_tma._ffi.register()
dev = jax.devices(sys.argv[1])[0]
# a window; a transpose (whose output dims may exceed 2^31 - 1); a transpose into an x
# whose innermost dim is 0
for transpose, x_shape, out_shape in [(False, (2, 3), (4, 0)), (True, (0, 2), (2**31, 0)),
                                      (True, (2, 3), (4, 0))]:
    call = jax.ffi.ffi_call("jax_tma_window", jax.ShapeDtypeStruct(out_shape, np.float32),
                            has_side_effect=True)
    f = jax.jit(lambda a, s: call(a, s, strides=np.ones(2, np.int64), fill=np.zeros(2, np.int64),
                                  transpose=transpose, method="auto",
                                  static_start=np.full(2, -2**63, np.int64)))
    y = f(jax.device_put(np.zeros(x_shape, np.float32), dev),
          jax.device_put(np.zeros(2, np.int32), dev))
    print(jax.block_until_ready(y).shape)
"""


@pytest.mark.parametrize("device", [
    pytest.param("cpu"),
    pytest.param("cuda", marks=pytest.mark.gpu)])
def test_handler_with_an_empty_innermost_output_dim(tmp_path, device):
    """An output whose innermost dim is 0 has nothing to write: the handler
    returns. Python never binds such a call (XLA drops a pure call with an
    empty result), but a side-effecting one in exported HLO reaches the
    handler. In a subprocess: a crash there must not take the test run down."""
    path = [os.path.dirname(os.path.dirname(jax_tma.__file__)), os.environ.get("PYTHONPATH")]
    # No preallocation: this test's own process may hold most of the GPU.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p),
               XLA_PYTHON_CLIENT_PREALLOCATE="false")
    done = subprocess.run([sys.executable, "-c", _EMPTY_INNER_DIM, device], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"exit status {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.split("\n")[:3] == ["(4, 0)", "(2147483648, 0)", "(4, 0)"], done.stdout


def test_traced_starts_reach_the_call_as_scalars():
    """No kernel stacks traced starts: each is its own operand of the call,
    and the split form computes what the one-array form does."""
    x = random_array(np.random.default_rng(3), (9, 11), np.float32)
    f = jax.jit(lambda a, i, j: jax_tma.window(a, (i, j), (4, 5)))
    text = f.lower(on_cpu(x), 2, -1).compile().as_text()
    operands = re.search(r"custom-call\(([^)]*)\)", text).group(1).split(",")
    assert len(operands) == 3 and "concatenate" not in text and "fusion" not in text
    split = _raw_window(x, (jnp.int32(2), jnp.int32(-1)), (4, 5))
    whole = _raw_window(x, jnp.array([2, -1], jnp.int32), (4, 5))
    assert_bits_equal(split, window_reference(x, (2, -1), (4, 5)))
    assert_bits_equal(whole, split)


@pytest.mark.parametrize("start, dtype, static", [
    ((3, 4), jnp.float32, "dense<[3, 4]> : tensor<2xi64>"),
    ((3, 1), jnp.float32, "dense<[3, 1]> : tensor<2xi64>"),
    ((0, 8), jnp.bfloat16, "dense<[0, 8]> : tensor<2xi64>"),
    ((1, 0), jnp.float32, "dense<64> : tensor<1xi64>"),  # whole rows fold: 1 * 64 elements
])
def test_the_call_carries_the_static_starts(start, dtype, static):
    """The handlers read a static start from the call (a kernel parameter on
    the GPU), and auto's choice is the CUDA planner's (InnerStartAligned,
    tested in tests/cpp/test_window_plan.cc): the call carries the method as
    given and each (merged) dim's start where it is static, the "unknown"
    value where it is traced."""
    x = jnp.zeros((32, 64), dtype)
    full = (31, 64) if start[1] == 0 else (8, 8)
    text = jax.jit(lambda a: jax_tma.window(a, start, full)).lower(x).as_text()
    assert 'method = "auto"' in text and f"static_start = {static}" in text
    traced = jax.jit(lambda a, s: jax_tma.window(a, (3, s), (8, 8))).lower(x, 4).as_text()
    assert jax_tma._ffi.rules()["window.unknown_start"] == UNKNOWN
    assert f"static_start = dense<[3, {UNKNOWN}]> : tensor<2xi64>" in traced
    batched = jax.jit(jax.vmap(lambda a, s: jax_tma.window(a, (3, s), (8, 8)), (None, 0)))
    assert (f"static_start = dense<{UNKNOWN}> : tensor<2xi64>"
            in batched.lower(x, jnp.arange(2)).as_text())


START_DTYPES = ["int4", "uint4", "int8", "uint8", "int16", "uint16", "int32", "uint32",
                "int64", "uint64"]


@pytest.mark.parametrize("dtype", START_DTYPES)
def test_starts_of_every_integer_dtype(rng, dtype):
    """A start of any integer dtype, traced or as one array, reads what its
    value says; unsigned values past int32 (past every dim) read fill rather
    than wrapping into the array."""
    dtype = jnp.dtype(dtype)
    x = random_array(rng, (6, 9), np.float32)
    info = jnp.iinfo(dtype)
    values = sorted({int(info.min), int(info.max), 0, 1, -1 if info.min < 0 else 2,
                     min(int(info.max), 7)})
    f = jax.jit(lambda a, i, j: jax_tma.window(a, (i, j), (3, 4)))
    g = jax.jit(lambda a, s: jax_tma.window(a, s, (3, 4)))
    for v in values:
        want = window_reference(x, (v, 1), (3, 4))
        assert_bits_equal(f(on_cpu(x), jnp.asarray(v, dtype), jnp.asarray(1, dtype)), want)
        assert_bits_equal(g(on_cpu(x), jnp.asarray([v, 1], dtype)), want)


def test_unsigned_start_past_int32_reads_fill_without_x64(rng):
    x = random_array(rng, (4, 4), np.float32)
    with jax.enable_x64(False):
        f = jax.jit(lambda a, s: jax_tma.window(a, (s, 0), (2, 2)))
        got = f(on_cpu(x), jnp.uint32(2**32 - 1))
    assert_bits_equal(got, np.zeros((2, 2), np.float32))


def test_huge_static_starts_clamp_exactly(rng):
    """Static starts far outside x (int64 values) give the all-fill box; a
    dim that merges keeps the rest of the box exact."""
    x = random_array(rng, (5, 3, 4), np.float32)
    for start in [(2**62, 0, 0), (-(2**62), 0, 0), (1, 2**40, 0), (1, 0, -(2**40))]:
        got = jax_tma.window(on_cpu(x), start, (3, 3, 4))
        assert_bits_equal(got, window_reference(x, start, (3, 3, 4)))


@pytest.mark.parametrize("dtype, fill", [
    (np.float32, -0.0), (np.float32, 2.5), (np.float32, float("inf")), (np.int32, -7),
    (np.uint8, 255), (np.float32, 2**70), ("bfloat16", -0.0), ("float8_e5m2", float("nan")),
    ("float8_e4m3fnuz", float("nan")),
    ("float8_e8m0fnu", 0), ("float8_e4m3fn", 1e9), (np.complex64, 1 - 2j),
    (np.complex64, float("nan")), (np.bool_, True), ("int4", -3),
])
def test_fill_is_converted_as_jnp_pad_converts_it(rng, dtype, fill):
    """Out-of-bounds elements hold exactly the bits jnp.pad writes for the
    same constant (-0.0 stays negative, float8_e8m0fnu's 0 is 0xFF, a NaN of
    float8_e5m2 is 0x7F)."""
    dtype = jnp.dtype(dtype)
    # finite: XLA's pad rewrites the NaN payloads of float8 inputs
    x = random_array(rng, (3, 4), dtype, finite=True)
    got = jax_tma.window(on_cpu(x), (-1, 2), (3, 4), fill=fill)
    if fill == 2**70:  # jnp.pad refuses an int past int64
        want = window_reference(x, (-1, 2), (3, 4), fill=float(fill))
    else:
        want = jnp.pad(jnp.asarray(x), ((1, 0), (0, 2)), constant_values=fill)[:3, 2:6]
        assert_bits_equal(jax_tma.window(on_cpu(x), (-1, 2), (3, 4), fill=jnp.asarray(fill)),
                          want)
    assert_bits_equal(got, want)


@pytest.mark.parametrize("x64", [False, True])
def test_a_numpy_start_array_is_static_and_raises_no_warning(rng, x64):
    """A NumPy start array (int64, NumPy's default) is read as the static
    ints it holds, as lax.dynamic_slice reads it: no int64-truncation
    warning without x64 (warnings are errors here), the static innermost
    start on the call, and a start past int32 refused as a static sequence
    is."""
    x = random_array(rng, (5, 32), np.float32)
    start = np.array([-1, 8])
    fn = lambda a: jax_tma.window(a, start, (3, 8))  # noqa: E731
    with jax.enable_x64(x64), warnings.catch_warnings():
        warnings.simplefilter("error")
        got = fn(on_cpu(x))
        got_jit = jax.jit(fn)(on_cpu(x))
        text = jax.jit(fn).lower(x).as_text()
        ref = lax.dynamic_slice(on_cpu(x), np.array([0, 8]), (3, 8))  # silent too
    assert "static_start = dense<[-1, 8]> : tensor<2xi64>" in text
    assert_bits_equal(got, window_reference(x, (-1, 8), (3, 8)))
    assert_bits_equal(got_jit, got)
    assert_bits_equal(ref, x[:3, 8:16])
    if not x64:
        with jax.enable_x64(False), pytest.raises(
                ValueError, match=r"start \(-3000000000, 0\) needs int64; enable jax_enable_x64"):
            jax_tma.window(x, np.array([-3_000_000_000, 0]), (2**31 - 1, 1), strides=(2, 1))


def test_python_scalars_and_disable_jit(rng):
    x = random_array(rng, (5, 6), np.float32)
    want = window_reference(x, (-1, 2), (3, 3))
    with jax.disable_jit():
        assert_bits_equal(jax_tma.window(on_cpu(x), (-1, 2), (3, 3)), want)
        assert_bits_equal(jax_tma.window(on_cpu(x), (jnp.int32(-1), 2), (3, 3)), want)
        g = jax.grad(lambda a: jax_tma.window(a, (-1, 2), (3, 3)).sum())(on_cpu(x))
    assert_bits_equal(g, jax.grad(lambda a: jnp.pad(a, ((1, 0), (0, 0)))[:3, 2:5].sum())(x))
    with pytest.raises(TypeError, match=r"x must be an array .* or a scalar, got list"):
        jax_tma.window([1.0, 2.0], (1,), (2,))


@pytest.mark.parametrize("start, shape, want_spec", [
    ((0, 0, 1), (8, 16, 2), ("a", "b", None)),    # the sharded dims are taken whole
    ((1, 2, 0), (4, 4, 4), ("a", "b", None)),     # crops that still divide
    ((0, 2, 0), (8, 3, 4), ("a", None, None)),    # 3 rows do not divide over b
    ((-2, 0, 0), (12, 16, 4), ("a", "b", None)),  # a pad
])
def test_explicit_mesh_keeps_sharding_where_the_box_divides(rng, start, shape, want_spec):
    """On an Explicit mesh the result and the grad have the types jax gives
    lax.dynamic_slice (x's sharding where the box's extent divides among a
    dim's devices; unsharded where not); the dims are not merged by a
    reshape that Explicit sharding refuses."""
    from jax.sharding import NamedSharding, PartitionSpec as P
    host = random_array(rng, (8, 16, 4), np.float32)
    mesh = cpu_mesh((4, 2), ("a", "b"), AxisType.Explicit)
    with use_mesh(mesh):
        x = jax.device_put(host, NamedSharding(mesh, P("a", "b")))
        y = jax.jit(lambda a: jax_tma.window(a, start, shape))(x)
        g = jax.jit(jax.grad(lambda a: (jax_tma.window(a, start, shape) ** 2).sum()))(x)
    assert tuple(jax.typeof(y).sharding.spec) == want_spec
    assert tuple(g.sharding.spec)[:2] == ("a", "b")
    assert_bits_equal(y, window_reference(host, start, shape))
    want_g = jax.grad(lambda a: (jax_tma.window(a, start, shape) ** 2).sum())(on_cpu(host))
    assert_bits_equal(g, want_g)


def test_grad_inside_shard_map_with_checks(rng):
    """window in shard_map (varying-axes checks on): a replicated x with a
    varying start, and a varying x with a replicated start, both give jax's
    dynamic_slice grads; a varying result under out_specs=P() is refused as
    for lax.dynamic_slice."""
    from jax.sharding import PartitionSpec as P
    mesh = cpu_mesh((8,), ("i",))
    x = jax.device_put(random_array(rng, (8, 4), np.float32),
                       jax.sharding.NamedSharding(mesh, P()))

    def grads(slice_fn, x_spec, s_spec):
        f = jax.shard_map(lambda b, s: slice_fn(b, s[0]), mesh=mesh, in_specs=(x_spec, s_spec),
                          out_specs=P("i"))
        return jax.jit(jax.grad(lambda a: (f(a, jnp.arange(8) % 3) ** 2).sum()))(x)

    ours = lambda b, s: jax_tma.window(b, (s, 0), (1, 4))  # noqa: E731
    ref = lambda b, s: lax.dynamic_slice(b, (jnp.minimum(s, b.shape[0] - 1), 0), (1, 4))  # noqa: E731
    assert_bits_equal(grads(ours, P(), P("i")), grads(ref, P(), P("i")))
    assert_bits_equal(grads(ours, P("i"), P()), grads(lambda b, s: ref(b, 0 * s), P("i"), P()))
    for fn in (ours, ref):
        f = jax.shard_map(lambda b: fn(b, 0), mesh=mesh, in_specs=P("i"), out_specs=P())
        with pytest.raises(ValueError, match="out_specs"):
            f(x)


def test_export_with_symbolic_dims(rng):
    """jax.export with a symbolic dim of x (and a traced start), serialized,
    deserialized and called at two sizes."""
    pytest.importorskip("flatbuffers")
    from jax import export
    f = jax.jit(lambda a, s: jax_tma.window(a, (s, 1), (3, 2), fill=-0.0))
    exp = export.export(f, platforms=("cpu",),
                        disabled_checks=[export.DisabledSafetyCheck.custom_call("jax_tma_window")])(
        jax.ShapeDtypeStruct(export.symbolic_shape("n, 4"), jnp.float32),
        jax.ShapeDtypeStruct((), jnp.int32))
    call = export.deserialize(exp.serialize()).call
    for n in (2, 7):
        x = random_array(rng, (n, 4), np.float32)
        assert_bits_equal(call(on_cpu(x), np.int32(n - 2)),
                          window_reference(x, (n - 2, 1), (3, 2), fill=-0.0))


# ---- sharded over 8 host devices: no collectives for the dims the op splits ----

@pytest.mark.parametrize("spec", [P("x", None, None), P(("a", "b"), None, None)], ids=str)
def test_sharding_of_batch_dims_without_collectives(rng, spec):
    mesh = cpu_mesh((8,), ("x",)) if spec[0] == "x" else cpu_mesh((2, 4), ("a", "b"))
    host = random_array(rng, (16, 12, 10), np.float32)
    x = jax.device_put(host, NamedSharding(mesh, spec))
    # vmapped over the leading dim, and the same as a fully covered leading dim
    for f in (jax.jit(jax.vmap(lambda a: jax_tma.window(a, (-1, 3), (5, 9), strides=(2, 1)))),
              jax.jit(lambda a: jax_tma.window(a, (0, -1, 3), (16, 5, 9), strides=(1, 2, 1)))):
        assert_no_collectives(f.lower(x).compile().as_text())
        want = np.stack([window_reference(h, (-1, 3), (5, 9), (2, 1)) for h in host])
        assert_bits_equal(f(x), want)


@pytest.mark.parametrize("spec, start, shape", [
    (P(None, None, "a"), (0, 0, 0), (8, 16, 4)),   # the whole x, split along its last dim
    (P(None, "a", None), (2, 0, 1), (3, 16, 2)),   # a whole middle dim between crops
    (P("b", None, "a"), (0, -1, 0), (8, 5, 4)),    # whole outer and inner dims around a pad
    (P(None, ("a", "b"), None), (5, 0, 0), (2, 16, 4)),  # whole inner dims that fold
], ids=str)
def test_dims_the_box_takes_whole_keep_their_sharding(rng, spec, start, shape):
    """Every dim the box takes whole (static start 0, the whole extent,
    stride 1), wherever it lies, keeps its sharding in the result and in the
    grad, with no collective, as lax.dynamic_slice keeps it: each device
    windows its own shard of those dims."""
    mesh = cpu_mesh((4, 2), ("a", "b"))
    host = random_array(rng, (8, 16, 4), np.float32)
    x = jax.device_put(host, NamedSharding(mesh, spec))
    fn = lambda a: jax_tma.window(a, start, shape)  # noqa: E731
    f = jax.jit(fn)
    assert_no_collectives(f.lower(x).compile().as_text())
    y = f(x)
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, spec), 3), y.sharding
    assert_bits_equal(y, window_reference(host, start, shape))
    if min(start) >= 0:  # lax.dynamic_slice, where it can say the same, keeps it too
        ds = jax.jit(lambda a: lax.dynamic_slice(a, start, shape))
        assert_no_collectives(ds.lower(x).compile().as_text())
        assert ds(x).sharding.is_equivalent_to(y.sharding, 3)
    ct_host = random_array(rng, shape, np.float32)
    ct = jax.device_put(ct_host, NamedSharding(mesh, spec))
    vjp = jax.jit(lambda a, c: jax.vjp(fn, a)[1](c)[0])
    assert_no_collectives(vjp.lower(x, ct).compile().as_text())
    g = vjp(x, ct)
    assert g.sharding.is_equivalent_to(NamedSharding(mesh, spec), 3), g.sharding
    assert_bits_equal(g, jax.vjp(fn, on_cpu(host))[1](on_cpu(ct_host))[0])


def test_sharding_of_a_split_spatial_dim_replicates_it(rng):
    # A box that does not cover a sharded dim in full needs that dim's data
    # from every device: XLA gathers it (and the result is still exact).
    mesh = cpu_mesh((8,), ("x",))
    host = random_array(rng, (16, 12), np.float32)
    x = jax.device_put(host, NamedSharding(mesh, P("x", None)))
    f = jax.jit(lambda a: jax_tma.window(a, (3, 1), (6, 6)))
    found = collectives_in(f.lower(x).compile().as_text())
    assert any(c.startswith("all-gather") for c in found), found
    assert_bits_equal(f(x), window_reference(host, (3, 1), (6, 6)))
