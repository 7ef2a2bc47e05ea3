"""jax_tma.im2col / col2im on the CPU: random 1D/2D/3D geometries against the
NumPy reference (bit-exact, both patch orders, every dtype), against
lax.conv_general_dilated_patches and lax.conv_general_dilated, gradients
against XLA's (float8 too), vmap folding, the linear transpose, shard_map,
Explicit mesh types, shape-polymorphic export, disable_jit, and every error."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_tma
from families.im2col import (IM2COL_EMPTY_CASES, IM2COL_EMPTY_IDS, col2im_reference,
                             im2col_reference, most_patches_per_pixel, raw_im2col)
from ops_table import FLOAT_DTYPES, pad_fill
from reference import (ALL_DTYPES, assert_bits_equal, assert_no_collectives, cpu_device, cpu_mesh,
                       random_array)

SUMMABLE = [d for d in ALL_DTYPES if d.name in (
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
    "bfloat16", "float32", "float64", "complex64", "complex128")]
# Floats the handlers cannot add: col2im sums them in float32.
NARROW_FLOATS = [d for d in ALL_DTYPES if d not in SUMMABLE and jnp.issubdtype(d, jnp.floating)]
SPECS = {1: ("NWC", "WIO", "NWC"), 2: ("NHWC", "HWIO", "NHWC"), 3: ("NDHWC", "DHWIO", "NDHWC")}
TARGETS = ("jax_tma_im2col",)


def on_cpu(a):
    return jax.device_put(a, cpu_device())


def col2im_want(p, input_shape, kernel, strides, pads, dilation, order="tap_major"):
    """col2im_reference for every dtype jax_tma.col2im takes: the floats the
    handlers cannot add summed in float32 and rounded once, sub-byte
    integers summed in 8 bits and wrapped to their width, NaN results as
    jnp's NaN (np.nan's bits; float8_e5m2's 0x7F where NumPy writes 0x7E)."""
    p = np.asarray(p)
    if p.dtype in SUMMABLE:
        return col2im_reference(p, input_shape, kernel, strides, pads, dilation, order)
    floating = jnp.issubdtype(p.dtype, jnp.floating)
    wide = np.float32 if floating else np.int8 if jnp.issubdtype(p.dtype, jnp.signedinteger) \
        else np.uint8
    acc = col2im_reference(p.astype(wide), input_shape, kernel, strides, pads, dilation, order)
    with np.errstate(over="ignore", invalid="ignore"):
        out = acc.astype(p.dtype)
    if floating:
        out[np.isnan(out)] = np.nan
        if out.dtype.name == "float8_e5m2":
            out.view(np.uint8)[np.isnan(out)] = 0x7F
    return out


def random_geometry(rng, r):
    """x shape, kernel, strides, dilation and explicit padding (asymmetric,
    sometimes larger than the kernel) for which the output is non-empty."""
    while True:
        spatial = tuple(int(v) for v in rng.integers(1, 9 if r < 3 else 6, r))
        kernel = tuple(int(v) for v in rng.integers(1, 4, r))
        strides = tuple(int(v) for v in rng.integers(1, 4, r))
        dilation = tuple(int(v) for v in rng.integers(1, 3, r))
        pads = tuple((int(rng.integers(0, 5)), int(rng.integers(0, 5))) for _ in range(r))
        if all(d * (k - 1) + 1 <= s + lo + hi for s, k, d, (lo, hi)
               in zip(spatial, kernel, dilation, pads)):
            shape = (int(rng.integers(1, 4)),) + spatial + (int(rng.integers(1, 6)),)
            return shape, kernel, strides, dilation, pads


@pytest.mark.parametrize("trial", range(30))
def test_random_geometries_match_numpy(rng, trial):
    r = 1 + trial % 3
    shape, kernel, strides, dilation, pads = random_geometry(rng, r)
    dtype = ALL_DTYPES[int(rng.integers(len(ALL_DTYPES)))]
    order = ("tap_major", "channel_major")[trial % 2]
    x = random_array(rng, shape, dtype)
    got = jax_tma.im2col(on_cpu(x), kernel, strides=strides, padding=pads, dilation=dilation,
                         order=order)
    assert_bits_equal(got, im2col_reference(x, kernel, strides, pads, dilation, order, fill=0))


@pytest.mark.parametrize("trial", range(24))
def test_random_col2im_matches_numpy(rng, trial):
    r = 1 + trial % 3
    shape, kernel, strides, dilation, pads = random_geometry(rng, r)
    dtype = SUMMABLE[int(rng.integers(len(SUMMABLE)))]
    order = ("tap_major", "channel_major")[trial % 2]
    out = tuple((s + lo + hi - d * (k - 1) - 1) // st + 1 for s, k, st, (lo, hi), d
                in zip(shape[1:-1], kernel, strides, pads, dilation))
    p = random_array(rng, (shape[0],) + out + (math.prod(kernel) * shape[-1],), dtype)
    got = jax_tma.col2im(on_cpu(p), shape, kernel, strides=strides, padding=pads,
                         dilation=dilation, order=order)
    assert_bits_equal(got, col2im_reference(p, shape, kernel, strides, pads, dilation, order))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype(rng, dtype):
    x = random_array(rng, (2, 5, 6, 3), dtype)
    got = jax_tma.im2col(on_cpu(x), (3, 2), strides=(2, 1), padding=((2, 1), (0, 3)))
    assert_bits_equal(got, im2col_reference(x, (3, 2), (2, 1), ((2, 1), (0, 3)), (1, 1),
                                            fill=0))


@pytest.mark.parametrize("r", [1, 2, 3])
@pytest.mark.parametrize("padding", ["VALID", "SAME", "SAME_LOWER", "same_lower", "explicit"])
def test_matches_conv_general_dilated_patches(rng, r, padding):
    shape = (2,) + (7, 6, 5)[:r] + (3,)
    kernel, strides, dilation = (3, 2, 2)[:r], (2, 1, 2)[:r], (1, 2, 1)[:r]
    pad = [(1, 3), (0, 2), (2, 0)][:r] if padding == "explicit" else padding
    x = on_cpu(jnp.asarray(rng.standard_normal(shape), jnp.float32))
    want = lax.conv_general_dilated_patches(
        x, kernel, strides, pad, rhs_dilation=dilation, dimension_numbers=SPECS[r],
        precision=lax.Precision.HIGHEST)
    got = jax_tma.im2col(x, kernel, strides=strides, padding=pad, dilation=dilation,
                         order="channel_major")
    np.testing.assert_array_equal(got, want)


def test_same_lower_puts_the_odd_pad_low(rng):
    """padding="SAME_LOWER" is lax's (conv_general_dilated_patches takes
    it): the output size of "SAME", an odd excess padded on the low side."""
    x = random_array(rng, (2, 6, 3), np.float32)
    # a kernel of 3 at stride 2 over 6 pixels: 3 output pixels, 1 padded one
    assert lax.padtype_to_pads((6,), (3,), (2,), "SAME_LOWER") == [(1, 0)]
    got = jax_tma.im2col(on_cpu(x), 3, strides=2, padding="SAME_LOWER")
    assert_bits_equal(got, im2col_reference(x, (3,), (2,), ((1, 0),), (1,), fill=0))
    p = random_array(rng, got.shape, np.float32)
    assert_bits_equal(jax_tma.col2im(on_cpu(p), x.shape, 3, strides=2, padding="SAME_LOWER"),
                      col2im_reference(p, x.shape, (3,), (2,), ((1, 0),), (1,)))


def test_tma_refuses_channel_major_on_every_platform():
    """order="channel_major" has no TMA path on any GPU, so method="tma"
    refuses it at trace time everywhere, and the handlers (exported HLO
    reaches them without Python) with the same words, the CPU's included:
    code tried on a laptop runs on a GPU."""
    x = jnp.ones((2, 5, 4), jnp.float32)
    with pytest.raises(ValueError) as python:
        jax_tma.im2col(x, 2, order="channel_major", method="tma")
    with pytest.raises(jax.errors.JaxRuntimeError) as handler:
        _raw(x, (2, 4, 8), kernel=np.full(1, 2, np.int64), channel_major=True, method="tma")
    assert str(python.value) in str(handler.value)
    # tap-major runs on the CPU, and channel-major with the other methods
    _raw(x, (2, 4, 8), kernel=np.full(1, 2, np.int64), method="tma")
    for method in ("auto", "simt"):
        jax_tma.im2col(x, 2, order="channel_major", method=method)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "complex64",
                                   "complex128", "float8_e4m3fn"])
def test_col2im_sums_start_from_negative_zero(dtype):
    """A float sum starts from -0.0, IEEE's additive identity: a pixel whose
    patch entries are all -0.0 is -0.0 (as XLA's grad of a lone slice gives
    the cotangent's -0.0 back), one that no patch reads is +0.0 (jnp's
    zeros)."""
    x = jnp.ones((1, 5, 1), dtype)
    # kernel 2 at stride 2 over 5 pixels: pixels 0..3 read once, pixel 4 never
    p = -jnp.zeros((1, 2, 2), dtype)
    got = np.asarray(jax_tma.col2im(p, x.shape, 2, strides=2)).reshape(-1)
    grad = jax.vjp(lambda a: jax_tma.im2col(a, 2, strides=2), x)[1](p)[0]
    signs = np.signbit(got.real.astype(np.float64))
    assert (got == 0).all() and signs.tolist() == [True] * 4 + [False], got
    if got.dtype.kind == "c":
        assert np.signbit(got.imag).tolist() == [True] * 4 + [False]
    assert_bits_equal(grad, got.reshape(x.shape))
    # the same entries through a lone slice: XLA's grad has the same bits
    want = jax.vjp(lambda a: a[:, :4], x)[1](p.reshape(1, 4, 1))[0]
    assert_bits_equal(got.reshape(x.shape), want)


@pytest.mark.parametrize("r", [1, 2, 3])
def test_patches_times_weights_is_the_convolution(rng, r):
    shape = (3,) + (9, 8, 6)[:r] + (4,)
    kernel, strides, dilation = (3, 3, 2)[:r], (1, 2, 1)[:r], (2, 1, 1)[:r]
    pads = ((3, 1), (0, 2), (1, 1))[:r]
    x = on_cpu(jnp.asarray(rng.standard_normal(shape), jnp.float32))
    w = on_cpu(jnp.asarray(rng.standard_normal(kernel + (4, 5)), jnp.float32))
    want = lax.conv_general_dilated(x, w, strides, pads, rhs_dilation=dilation,
                                    dimension_numbers=SPECS[r],
                                    precision=lax.Precision.HIGHEST)
    p = jax_tma.im2col(x, kernel, strides=strides, padding=pads, dilation=dilation)
    got = jnp.matmul(p, w.reshape(-1, 5), precision=lax.Precision.HIGHEST)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order", ["tap_major", "channel_major"])
@pytest.mark.parametrize("r", [1, 2, 3])
def test_grad_matches_xla(rng, r, order):
    shape = (2,) + (8, 7, 5)[:r] + (3,)
    kernel, strides, dilation = (3, 2, 3)[:r], (2, 1, 1)[:r], (1, 2, 1)[:r]
    pads = ((2, 4), (1, 0), (0, 3))[:r]
    x = on_cpu(jnp.asarray(rng.standard_normal(shape), jnp.float32))
    p_shape = jax.eval_shape(lambda a: jax_tma.im2col(a, kernel, strides=strides,
                                                      padding=pads, dilation=dilation), x).shape
    w = on_cpu(jnp.asarray(rng.standard_normal(p_shape), jnp.float32))
    k = math.prod(kernel)

    def ours(a):
        return (jax_tma.im2col(a, kernel, strides=strides, padding=pads, dilation=dilation,
                               order=order) * w).sum()

    def xla(a):
        p = lax.conv_general_dilated_patches(a, kernel, strides, pads, rhs_dilation=dilation,
                                             dimension_numbers=SPECS[r],
                                             precision=lax.Precision.HIGHEST)
        if order == "tap_major":  # (C, K) -> (K, C)
            p = jnp.swapaxes(p.reshape(p.shape[:-1] + (3, k)), -1, -2).reshape(p.shape)
        return (p * w).sum()

    want = jax.grad(xla)(x)
    np.testing.assert_allclose(jax.grad(ours)(x), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jax.jit(jax.grad(ours))(x), want, rtol=1e-5, atol=1e-5)


def test_col2im_is_the_grad_of_im2col(rng):
    """im2col's VJP adds every patch element back onto its pixel: bit for bit
    the NumPy col2im (special values included), and close to XLA's VJP of
    lax.conv_general_dilated_patches (which sums in another order)."""
    x = on_cpu(jnp.asarray(rng.standard_normal((2, 6, 5, 3)), jnp.float32))
    kernel, strides, dilation = (3, 3), (2, 1), (1, 2)
    pads = lax.padtype_to_pads((6, 5), (3, 5), strides, "SAME")  # dilated kernel (3, 5)
    geo = dict(strides=strides, padding="SAME", dilation=dilation)
    pulls = {}
    for order in ("tap_major", "channel_major"):
        y, pulls[order] = jax.vjp(functools.partial(jax_tma.im2col, kernel_size=kernel,
                                                    order=order, **geo), x)
        ct = random_array(rng, y.shape, np.float32)
        assert_bits_equal(pulls[order](on_cpu(ct))[0],
                          col2im_reference(ct, x.shape, kernel, strides, pads, dilation, order))
    ct = on_cpu(jnp.asarray(rng.standard_normal(y.shape), jnp.float32))
    want = jax.vjp(lambda a: _lax_patches(a, kernel, strides, dilation, "SAME"), x)[1](ct)[0]
    np.testing.assert_allclose(pulls["channel_major"](ct)[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order", ["tap_major", "channel_major"])
def test_linear_transpose_and_its_transpose(rng, order):
    """im2col's transpose is col2im and col2im's is im2col: against NumPy bit
    for bit (special values included), and against XLA's transpose of
    lax.conv_general_dilated_patches."""
    geo = dict(kernel_size=3, strides=2, padding=((4, 1),), dilation=2, order=order)
    ref = dict(kernel=(3,), strides=(2,), pads=((4, 1),), dilation=(2,), order=order)
    x = random_array(rng, (2, 7, 3), np.float64)
    f = functools.partial(jax_tma.im2col, **geo)
    ct = random_array(rng, f(on_cpu(x)).shape, np.float64)
    transpose = jax.linear_transpose(f, on_cpu(x))
    (t,) = transpose(on_cpu(ct))
    assert_bits_equal(t, col2im_reference(ct, x.shape, **ref))
    (tt,) = jax.linear_transpose(lambda c: transpose(c)[0], on_cpu(ct))(on_cpu(x))
    assert_bits_equal(tt, im2col_reference(x, **ref))
    # The JVP of col2im is col2im; its transpose is im2col.
    g = functools.partial(jax_tma.col2im, input_shape=x.shape, **geo)
    _, tangent = jax.jvp(g, (on_cpu(ct),), (on_cpu(ct),))
    assert_bits_equal(tangent, col2im_reference(ct, x.shape, **ref))
    (gt,) = jax.linear_transpose(g, on_cpu(ct))(on_cpu(x))
    assert_bits_equal(gt, im2col_reference(x, **ref))
    if order == "channel_major":  # lax's patch order; finite values (XLA sums in another order)
        xf = on_cpu(jnp.asarray(rng.standard_normal(x.shape)))
        cf = on_cpu(jnp.asarray(rng.standard_normal(ct.shape)))
        lax_f = functools.partial(_lax_patches, kernel=3, strides=2, dilation=2,
                                  padding=((4, 1),))
        np.testing.assert_allclose(jax.linear_transpose(f, xf)(cf)[0],
                                   jax.linear_transpose(lax_f, xf)(cf)[0],
                                   rtol=1e-12, atol=1e-12)


def test_vmap_folds_into_the_batch(rng):
    xs = random_array(rng, (4, 2, 6, 5, 3), np.float32)
    f = jax.vmap(lambda a: jax_tma.im2col(a, (2, 3), padding="SAME"), in_axes=1, out_axes=1)
    want = np.stack([im2col_reference(xs[:, i], (2, 3), (1, 1), ((0, 1), (1, 1)), (1, 1))
                     for i in range(2)], axis=1)
    assert_bits_equal(f(on_cpu(xs)), want)
    names = [e.primitive.name for e in jax.make_jaxpr(f)(xs).jaxpr.eqns]
    assert names.count("jax_tma_im2col") == 1 and "while" not in names, names
    g = jax.vmap(jax.vmap(lambda p: jax_tma.col2im(p, (2, 6, 5, 3), (2, 3), padding="SAME")))
    ps = random_array(rng, (2, 3, 2, 6, 5, 18), np.int32)
    want = np.stack([np.stack([col2im_reference(ps[a, b], (2, 6, 5, 3), (2, 3), (1, 1),
                                                ((0, 1), (1, 1)), (1, 1)) for b in range(3)])
                     for a in range(2)])
    assert_bits_equal(g(on_cpu(ps)), want)


def test_same_padding_and_int_arguments(rng):
    x = random_array(rng, (1, 5, 4, 2), np.int16)
    got = jax_tma.im2col(on_cpu(x), 3, strides=2, padding="same", dilation=1)
    # lax's SAME for (5, 4), k=3, s=2: out (3, 2), padding ((1, 1), (0, 1))
    assert got.shape == (1, 3, 2, 18)
    assert_bits_equal(got, im2col_reference(x, (3, 3), (2, 2), ((1, 1), (0, 1)), (1, 1)))


def test_padding_larger_than_the_kernel_and_empty_batch(rng):
    x = random_array(rng, (2, 3, 4), np.uint8)
    got = jax_tma.im2col(on_cpu(x), 2, padding=((5, 7),))
    assert_bits_equal(got, im2col_reference(x, (2,), (1,), ((5, 7),), (1,)))
    assert np.asarray(got)[:, :4].max() == 0 and np.asarray(got)[:, -6:].max() == 0
    empty = np.zeros((0, 4, 4, 2), np.float32)
    assert jax_tma.im2col(on_cpu(empty), 2).shape == (0, 3, 3, 8)
    assert jax_tma.col2im(on_cpu(np.zeros((0, 3, 3, 8), np.float32)), empty.shape,
                          2).shape == empty.shape


# ---- empty results: a dilated kernel larger than the padded input ----

EMPTY_CASES = IM2COL_EMPTY_CASES
EMPTY_IDS = IM2COL_EMPTY_IDS


def _as_tuple(v, r):
    return (v,) * r if isinstance(v, int) else tuple(v)


def _lax_patches(x, kernel, strides, dilation, padding):
    r = x.ndim - 2
    return lax.conv_general_dilated_patches(
        x, _as_tuple(kernel, r), _as_tuple(strides, r), padding,
        rhs_dilation=_as_tuple(dilation, r), dimension_numbers=SPECS[x.ndim - 2],
        precision=lax.Precision.HIGHEST)


@pytest.mark.parametrize("shape,kernel,strides,dilation,padding,want_shape", EMPTY_CASES,
                         ids=EMPTY_IDS)
def test_empty_results_match_lax(rng, shape, kernel, strides, dilation, padding, want_shape):
    x = on_cpu(jnp.asarray(rng.standard_normal(shape), jnp.float32))
    want = _lax_patches(x, kernel, strides, dilation, padding)
    assert want.shape == want_shape
    geo = dict(strides=strides, padding=padding, dilation=dilation)
    got = jax_tma.im2col(x, kernel, order="channel_major", **geo)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    jitted = jax.jit(lambda a: jax_tma.im2col(a, kernel, **geo))(x)
    assert jitted.shape == want_shape
    # every patch order, every dtype family, and vmap (folded into N) agree
    for dtype in (np.uint8, np.int64, jnp.bfloat16, np.complex64):
        xd = random_array(rng, shape, dtype)
        for order in ("tap_major", "channel_major"):
            got = jax_tma.im2col(on_cpu(xd), kernel, order=order, **geo)
            assert got.shape == want_shape and got.dtype == xd.dtype
            if padding != "SAME":  # the NumPy reference agrees (explicit padding only)
                r = len(shape) - 2
                pads = ((0, 0),) * r if padding == "VALID" else padding
                assert_bits_equal(got, im2col_reference(
                    xd, _as_tuple(kernel, r), _as_tuple(strides, r), pads,
                    _as_tuple(dilation, r), order))
    xs = random_array(rng, (3,) + shape, np.float32)
    ys = jax.vmap(lambda a: jax_tma.im2col(a, kernel, **geo))(on_cpu(xs))
    assert ys.shape == (3,) + want_shape


@functools.cache
def _col2im_into_donated(input_shape, kernel, geo):
    def f(p, poison):
        return jax_tma.col2im(p, input_shape, kernel, **dict(geo))
    return jax.jit(f, donate_argnums=1, keep_unused=True)


@pytest.mark.parametrize("shape,kernel,strides,dilation,padding,want_shape", EMPTY_CASES,
                         ids=EMPTY_IDS)
def test_col2im_of_an_empty_patch_matrix_is_zeros(rng, shape, kernel, strides, dilation,
                                                  padding, want_shape):
    geo = dict(strides=strides, padding=padding, dilation=dilation)
    for dtype, order in [(np.float32, "tap_major"), (np.int32, "channel_major"),
                         (jnp.bfloat16, "tap_major"), (np.complex128, "channel_major")]:
        p = np.zeros(want_shape, dtype)
        got = jax_tma.col2im(on_cpu(p), shape, kernel, order=order, **geo)
        assert_bits_equal(got, np.zeros(shape, dtype))
        # Into a donated, poisoned buffer: the handler itself writes the zeros.
        g = tuple(sorted(dict(geo, order=order).items()))
        f = _col2im_into_donated(shape, kernel, g)
        poison = on_cpu(jnp.array(random_array(rng, shape, dtype), copy=True))
        assert "input_output_alias" in f.lower(on_cpu(p), poison).compile().as_text()
        got = f(on_cpu(p), poison)
        assert poison.is_deleted() or math.prod(shape) == 0  # donated
        assert_bits_equal(got, np.zeros(shape, dtype))
    if padding != "SAME":  # the NumPy reference agrees (explicit padding only)
        r = len(shape) - 2
        pads = ((0, 0),) * r if padding == "VALID" else padding
        assert_bits_equal(col2im_reference(np.zeros(want_shape, np.float32), shape,
                                           _as_tuple(kernel, r), _as_tuple(strides, r), pads,
                                           _as_tuple(dilation, r)),
                          np.zeros(shape, np.float32))


@pytest.mark.parametrize("shape,kernel,strides,dilation,padding,want_shape", EMPTY_CASES,
                         ids=EMPTY_IDS)
def test_grad_through_empty_results_matches_lax(rng, shape, kernel, strides, dilation,
                                                padding, want_shape):
    geo = dict(strides=strides, padding=padding, dilation=dilation)
    x = on_cpu(jnp.asarray(rng.standard_normal(shape), jnp.float32))
    w = on_cpu(jnp.zeros(want_shape, jnp.float32))

    def ours(a):
        return (jax_tma.im2col(a, kernel, order="channel_major", **geo) * w).sum()

    def xla(a):
        return (_lax_patches(a, kernel, strides, dilation, padding) * w).sum()

    want = jax.grad(xla)(x)
    assert want.shape == shape
    for f in (jax.grad(ours), jax.jit(jax.grad(ours))):
        assert_bits_equal(f(x), np.asarray(want))
    xs = on_cpu(jnp.asarray(rng.standard_normal((2,) + shape), jnp.float32))
    assert_bits_equal(jax.jit(jax.vmap(jax.grad(ours)))(xs), np.zeros((2,) + shape, np.float32))
    # im2col's VJP is col2im (of an empty cotangent: zeros) and col2im's is im2col.
    y, pull = jax.vjp(lambda a: jax_tma.im2col(a, kernel, **geo), x)
    assert y.shape == want_shape
    assert_bits_equal(pull(w)[0], np.zeros(shape, np.float32))

    def back(p):
        return (jax_tma.col2im(p, shape, kernel, **geo) * x).sum()

    g = jax.jit(jax.grad(back))(w)
    assert g.shape == want_shape
    (t,) = jax.linear_transpose(lambda a: jax_tma.im2col(a, kernel, **geo), x)(w)
    assert_bits_equal(t, np.zeros(shape, np.float32))


def test_empty_input_with_padding_reads_only_zeros(rng):
    # An empty spatial dim of x whose padding fits the kernel: non-empty
    # patches, all padding (lax agrees), and their col2im is empty.
    x = on_cpu(jnp.zeros((2, 0, 4, 3), jnp.float32))
    want = _lax_patches(x, (2, 2), 1, 1, ((1, 1), (0, 0)))
    got = jax_tma.im2col(x, 2, padding=((1, 1), (0, 0)), order="channel_major")
    assert got.shape == want.shape == (2, 1, 3, 12)
    np.testing.assert_array_equal(got, want)
    p = on_cpu(jnp.asarray(rng.standard_normal(got.shape), jnp.float32))
    assert jax_tma.col2im(p, x.shape, 2, padding=((1, 1), (0, 0))).shape == x.shape


# ---- narrow dtypes: col2im sums in float32 (floats) or 8 bits (sub-byte ints) ----

@pytest.mark.parametrize("dtype", [d for d in ALL_DTYPES if d != np.bool_], ids=str)
def test_col2im_every_dtype(rng, dtype):
    """Overlapping patches (special values included) summed in float32 for
    the floats the handlers cannot add, rounded once, NaN as np.nan's bits."""
    geo = dict(strides=(1, 2), padding=((1, 2), (2, 0)), dilation=(2, 1))
    ref = dict(strides=(1, 2), pads=((1, 2), (2, 0)), dilation=(2, 1))
    p_shape = jax.eval_shape(lambda a: jax_tma.im2col(a, (2, 3), **geo),
                             jax.ShapeDtypeStruct((2, 5, 6, 3), np.float32)).shape
    p = random_array(rng, p_shape, dtype)
    for order in ("tap_major", "channel_major"):
        got = jax_tma.col2im(on_cpu(p), (2, 5, 6, 3), (2, 3), order=order, **geo)
        assert_bits_equal(got, col2im_want(p, (2, 5, 6, 3), (2, 3), order=order, **ref))


@pytest.mark.parametrize("dtype", NARROW_FLOATS, ids=str)
def test_grad_of_narrow_floats_sums_in_float32(rng, dtype):
    """grad and vjp through im2col on float8 (and float4) inputs: col2im of
    the cotangent, summed in float32 and rounded once; jit and vmap agree."""
    x = random_array(rng, (2, 6, 5, 3), dtype)
    geo = dict(strides=(2, 1), padding="SAME", dilation=(1, 2))
    pads = lax.padtype_to_pads((6, 5), (3, 5), (2, 1), "SAME")  # dilated kernel (3, 5)
    f = functools.partial(jax_tma.im2col, kernel_size=3, **geo)
    y, pull = jax.vjp(f, on_cpu(x))
    ct = random_array(rng, y.shape, dtype)
    want = col2im_want(ct, x.shape, (3, 3), (2, 1), pads, (1, 2))
    assert_bits_equal(pull(on_cpu(ct))[0], want)
    # w an argument: XLA's constant folding converts a negative float32 to
    # float8_e8m0fnu as its magnitude, where its run time writes NaN.
    w = on_cpu(random_array(rng, y.shape, np.float32, finite=True))
    g = jax.jit(jax.grad(lambda a, v: (f(a).astype(np.float32) * v).sum()))(on_cpu(x), w)
    assert_bits_equal(g, col2im_want(np.asarray(w).astype(dtype), x.shape, (3, 3), (2, 1), pads,
                                     (1, 2)))
    vg = jax.vmap(lambda a, c: jax.vjp(f, a)[1](c)[0])(on_cpu(x[:, None]), on_cpu(ct[:, None]))
    assert_bits_equal(vg[:, 0], want)


@pytest.mark.parametrize("dtype", ["float8_e8m0fnu", "float8_e5m2", "float8_e4m3fn",
                                   "bfloat16", "int4", "float4_e2m1fn"])
def test_padding_is_jnps_zero(rng, dtype):
    """Padded pixels hold what jnp.pad writes for 0 in x's dtype
    (float8_e8m0fnu, without a zero: its NaN 0xFF; float8_e5m2: 0x00)."""
    dtype = jnp.dtype(dtype)
    # finite: XLA's CPU pad of float8_e5m2 rewrites NaN payloads
    x = random_array(rng, (2, 4, 3, 2), dtype, finite=True)
    pads = ((2, 1), (0, 3))
    got = jax_tma.im2col(on_cpu(x), (2, 3), padding=pads)
    padded = np.array(jax.jit(lambda a: jnp.pad(a, ((0, 0), *pads, (0, 0))))(on_cpu(x)))
    # x's own elements as they are: XLA's CPU pad may flush bfloat16
    # subnormals (it did on the GPU machine's host CPU, jax 0.11.2)
    padded[:, 2:6, 0:3] = x
    assert_bits_equal(got, jax_tma.im2col(on_cpu(padded), (2, 3)))
    x = random_array(rng, (2, 4, 3, 2), dtype)
    got = jax_tma.im2col(on_cpu(x), (2, 3), padding=pads)
    assert_bits_equal(got, im2col_reference(x, (2, 3), (1, 1), pads, (1, 1), fill=0))
    zero = np.asarray(0).astype(dtype)
    assert_bits_equal(np.asarray(got)[:, :2, 0, :2], np.full((2, 2, 2), zero))
    assert_bits_equal(jax.jit(lambda a: jax_tma.im2col(a, (2, 3), padding=pads))(on_cpu(x)), got)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_padding_of_every_float_dtype_on_the_default_device(rng, dtype):
    x = random_array(rng, (2, 4, 3, 2), dtype)
    pads = ((2, 1), (1, 2))
    y = jax.jit(lambda a: jax_tma.im2col(a, (2, 2), padding=pads))(x)
    inside = im2col_reference(np.ones(x.shape, bool), (2, 2), (1, 1), pads, (1, 1))
    want = im2col_reference(x, (2, 2), (1, 1), pads, (1, 1))
    want[~inside] = pad_fill(0, dtype)[0]  # jnp.pad's zero, not the reference's conversion
    assert_bits_equal(y, want)


def test_disable_jit(rng):
    """Eager calls under jax.disable_jit() (im2col, col2im and their grads)
    give the jitted results bit for bit. (Python scalars are taken as jnp
    takes them: rank 0, an error naming the rank, as for lax's patches.)"""
    x = on_cpu(random_array(rng, (2, 5, 4, 3), np.float32))
    geo = dict(strides=(2, 1), padding=((1, 0), (2, 1)))
    p = jax_tma.im2col(x, (2, 3), **geo)
    ct = on_cpu(random_array(rng, p.shape, np.float32))
    want_g = jax.jit(lambda a, c: jax.vjp(lambda b: jax_tma.im2col(b, (2, 3), **geo), a)[1](c))
    with jax.disable_jit():
        assert_bits_equal(jax_tma.im2col(x, (2, 3), **geo), p)
        assert_bits_equal(jax_tma.col2im(ct, x.shape, (2, 3), **geo),
                          jax.jit(lambda c: jax_tma.col2im(c, x.shape, (2, 3), **geo))(ct))
        g = jax.vjp(lambda b: jax_tma.im2col(b, (2, 3), **geo), x)[1](ct)
    assert_bits_equal(g[0], want_g(x, ct)[0])


# ---- shard_map, Explicit mesh axes, shape-polymorphic export ----

def _lax_tap_major(a, kernel, **geo):
    """lax.conv_general_dilated_patches in im2col's default (tap, channel) order."""
    p = _lax_patches(a, kernel, geo["strides"], geo["dilation"], geo["padding"])
    k = math.prod(_as_tuple(kernel, a.ndim - 2))
    return jnp.swapaxes(p.reshape(p.shape[:-1] + (a.shape[-1], k)), -1, -2).reshape(p.shape)


def test_grad_inside_shard_map_with_checks(rng):
    """grad of im2col and col2im inside shard_map (varying-axes checks on)
    gives the unsharded grads bit for bit and lax's within rounding; a
    varying result under out_specs=P() is refused as lax's is."""
    mesh = cpu_mesh((8,), ("i",))
    x = rng.standard_normal((8, 6, 5, 3)).astype(np.float32)
    geo = dict(strides=(2, 1), padding=((1, 1), (0, 2)), dilation=(1, 2))
    ours = functools.partial(jax_tma.im2col, kernel_size=(3, 2), **geo)
    ref = functools.partial(_lax_tap_major, kernel=(3, 2), **geo)

    def grad_in_shard_map(fn, a):
        loss = lambda b: (fn(b) ** 2).sum()  # noqa: E731
        return jax.jit(jax.shard_map(jax.grad(loss), mesh=mesh, in_specs=P("i"),
                                     out_specs=P("i")))(a)

    g = grad_in_shard_map(ours, x)
    assert_bits_equal(g, jax.grad(lambda b: (ours(b) ** 2).sum())(x))
    np.testing.assert_allclose(g, grad_in_shard_map(ref, x), rtol=1e-5, atol=1e-5)
    p = ours(x)
    back = functools.partial(jax_tma.col2im, input_shape=(1,) + x.shape[1:], kernel_size=(3, 2),
                             **geo)
    assert_bits_equal(grad_in_shard_map(back, p),
                      jax.grad(lambda c: (jax_tma.col2im(c, x.shape, (3, 2), **geo) ** 2)
                               .sum())(p))
    for fn in (ours, ref):
        f = jax.shard_map(fn, mesh=mesh, in_specs=P("i"), out_specs=P())
        with pytest.raises(ValueError, match="out_specs"):
            f(x)


def _explicit_mesh():
    return cpu_mesh((2, 4), ("a", "b"), AxisType.Explicit)


@pytest.mark.parametrize("spec", [P("a"), P(("a", "b")), P(None, "a"), P("b", "a")], ids=str)
def test_explicit_mesh_types_match_lax(rng, spec):
    """On an Explicit mesh im2col, col2im and the grad are typed as
    lax.conv_general_dilated_patches and its grad are: N keeps its axes, a
    split spatial dim keeps them where the output divides among them."""
    host = rng.standard_normal((8, 8, 8, 4)).astype(np.float32)
    geo = dict(strides=1, padding="VALID", dilation=1)
    mesh = _explicit_mesh()
    with jax.set_mesh(mesh):
        x = jax.device_put(host, NamedSharding(mesh, spec))
        y = jax.jit(lambda a: jax_tma.im2col(a, 3, **geo))(x)
        want = jax.jit(lambda a: _lax_tap_major(a, 3, **geo))(x)
        back = jax.jit(lambda c: jax_tma.col2im(c, host.shape, 3, **geo))(y)
        g = jax.jit(jax.grad(lambda a: (jax_tma.im2col(a, 3, **geo) ** 2).sum()))(x)
        want_g = jax.jit(jax.grad(lambda a: (_lax_tap_major(a, 3, **geo) ** 2).sum()))(x)
    assert jax.typeof(y).sharding.spec == jax.typeof(want).sharding.spec
    assert y.sharding.is_equivalent_to(want.sharding, 4)
    assert jax.typeof(back).sharding.spec == jax.typeof(g).sharding.spec \
        == jax.typeof(want_g).sharding.spec
    assert g.sharding.is_equivalent_to(x.sharding, 4)
    assert_bits_equal(y, im2col_reference(host, (3, 3), (1, 1), ((0, 0), (0, 0)), (1, 1)))
    assert_bits_equal(g, jax.grad(lambda a: (jax_tma.im2col(a, 3, **geo) ** 2).sum())(
        on_cpu(host)))
    np.testing.assert_allclose(g, want_g, rtol=1e-5, atol=1e-5)


def test_explicit_mesh_dims_that_cannot_stay_split():
    """A split channel dim (lax refuses it too) and a split spatial dim
    whose output does not divide among its devices (as lax) are errors that
    name the dim, the axes and the types."""
    mesh = _explicit_mesh()
    with jax.set_mesh(mesh):
        x = jax.device_put(np.ones((8, 8, 8, 4), np.float32), NamedSharding(mesh, P("a", None,
                                                                                      None, "b")))
        with pytest.raises(ValueError, match=r"^jax_tma\.im2col: x's channel dim is split along "
                           r"mesh axes 'b' \(x: float32\[8@a,8,8,4@b\]\), but a patch row holds "
                           r"every channel of its taps, so that dim must be whole; reshard x to "
                           r"P\('a', None, None, None\) first"):
            jax_tma.im2col(x, 3)
        x = jax.device_put(np.ones((8, 8, 8, 4), np.float32), NamedSharding(mesh, P(None, "b")))
        with pytest.raises(ValueError, match=r"^jax_tma\.im2col: x's dim 1 is split along mesh "
                           r"axes 'b' \(4 parts\), but the result's dim 1 has 6 elements, not a "
                           r"multiple of 4 \(x: float32\[8,8@b,8,4\]\); reshard that dim of x "
                           r"whole first"):
            jax_tma.im2col(x, 3)
        p = jax.device_put(np.ones((8, 6, 6, 36), np.float32),
                           NamedSharding(mesh, P(None, None, None, "b")))
        with pytest.raises(ValueError, match=r"^jax_tma\.col2im: patches's taps x channels dim "
                           r"is split along mesh axes 'b'"):
            jax_tma.col2im(p, (8, 8, 8, 4), 3)


def _export(f, shape, dtype, **jit_args):
    from jax import export
    exp = export.export(jax.jit(f, **jit_args), platforms=("cpu",), disabled_checks=[
        export.DisabledSafetyCheck.custom_call(t) for t in TARGETS])(
        jax.ShapeDtypeStruct(export.symbolic_shape(shape), dtype))
    return export.deserialize(exp.serialize())


def test_export_with_a_symbolic_batch(rng):
    """jax.export with a symbolic N: im2col, col2im (input_shape naming N)
    and the grad, serialized, deserialized and called at two batch sizes,
    also with N split over 8 devices; symbolic spatial or channel dims are
    an error naming the rule."""
    pytest.importorskip("flatbuffers")
    geo = dict(strides=2, padding="SAME", dilation=(1, 2))
    fwd = _export(lambda a: jax_tma.im2col(a, 3, **geo), "b, 8, 7, 4", jnp.bfloat16)
    split = NamedSharding(cpu_mesh((8,), ("i",)), P("i"))
    # out_shardings: XLA's CPU all-gather of bf16 (into a replicated result)
    # goes through float32, which rewrites NaN payloads.
    fwd_split = _export(lambda a: jax_tma.im2col(a, 3, **geo), "8*b, 8, 7, 4", jnp.bfloat16,
                        in_shardings=split, out_shardings=split)
    back = _export(lambda c: jax_tma.col2im(c, (c.shape[0], 8, 7, 4), 3, **geo),
                   "b, 4, 4, 36", jnp.float32)
    grad = _export(jax.grad(lambda a: (jax_tma.im2col(a, 3, **geo) ** 2).sum()), "b, 8, 7, 4",
                   jnp.float32)
    assert str(fwd.out_avals[0].shape) == "(b, 4, 4, 36)"
    for n in (1, 3):
        x = on_cpu(random_array(rng, (n, 8, 7, 4), jnp.bfloat16))
        assert_bits_equal(fwd.call(x), jax_tma.im2col(x, 3, **geo))
        xs = random_array(rng, (8 * n, 8, 7, 4), jnp.bfloat16)
        ys = fwd_split.call(jax.device_put(xs, split))
        assert ys.sharding.is_equivalent_to(split, 4)
        assert_bits_equal(ys, jax_tma.im2col(on_cpu(xs), 3, **geo))
        p = on_cpu(random_array(rng, (n, 4, 4, 36), np.float32))
        assert_bits_equal(back.call(p), jax_tma.col2im(p, (n, 8, 7, 4), 3, **geo))
        xf = on_cpu(random_array(rng, (n, 8, 7, 4), np.float32, finite=True))
        assert_bits_equal(grad.call(xf), jax.grad(
            lambda a: (jax_tma.im2col(a, 3, **geo) ** 2).sum())(xf))
    with pytest.raises(TypeError, match=r"^jax_tma\.im2col: only the batch dim N may be "
                       r"symbolic: the spatial dims and C set the patch geometry at trace time "
                       r"and must be ints, got x\.shape=\(b, h, 7, 4\)"):
        _export(lambda a: jax_tma.im2col(a, 3), "b, h, 7, 4", jnp.float32)
    with pytest.raises(TypeError, match=r"^jax_tma\.col2im: only the batch dim N may be "
                       r"symbolic: .* got x\.shape=\(b, 8, 7, b\)"):
        _export(lambda c: jax_tma.col2im(c, (c.shape[0], 8, 7, c.shape[0]), 3), "b, 6, 5, 9",
                jnp.float32)


# ---- errors ----

def test_errors_name_the_op_rule_and_values():
    x = jnp.ones((2, 5, 6, 3))
    p = jnp.ones((2, 3, 4, 12))
    cases = [
        (TypeError, r"im2col: x must be an array", lambda: jax_tma.im2col([1.0], 1)),
        (ValueError, r"im2col: x must have rank 3, 4 or 5 \(NWC, NHWC or NDHWC\), got rank 2 "
                     r"\(x.shape=\(5, 6\)\)", lambda: jax_tma.im2col(jnp.ones((5, 6)), 1)),
        (ValueError, r"im2col: x must have rank 3, 4 or 5 .* got rank 6",
         lambda: jax_tma.im2col(jnp.ones((1,) * 6), 1)),
        (ValueError, r"im2col: kernel_size has 3 entries but x has 2 spatial dims",
         lambda: jax_tma.im2col(x, (1, 1, 1))),
        (ValueError, r"im2col: kernel_size\[1\] = 0 is below 1",
         lambda: jax_tma.im2col(x, (1, 0))),
        (ValueError, r"im2col: strides\[0\] = -1 is below 1 \(strides=\(-1, 1\)\)",
         lambda: jax_tma.im2col(x, 2, strides=(-1, 1))),
        (ValueError, r"im2col: dilation\[0\] = 0 is below 1",
         lambda: jax_tma.im2col(x, 2, dilation=0)),
        (TypeError, r"im2col: strides\[1\] must be an int, got 1.5",
         lambda: jax_tma.im2col(x, 2, strides=(1, 1.5))),
        (TypeError, r"im2col: kernel_size must be an int or a sequence of 2 ints, got '3'",
         lambda: jax_tma.im2col(x, "3")),
        (ValueError, r"im2col: a patch row has prod\(kernel_size\) \* C = "
                     r"4611686014132420609 \* 3 entries, over 2\^63 - 1 \(kernel_size="
                     r"\(2147483647, 2147483647\), x.shape=\(2, 5, 6, 3\)\)",
         lambda: jax_tma.im2col(x, 2**31 - 1)),
        (ValueError, r"col2im: a patch row has prod\(kernel_size\) \* C = "
                     r"4611686014132420609 \* 3 entries, over 2\^63 - 1",
         lambda: jax_tma.col2im(p, x.shape, 2**31 - 1)),
        (ValueError, r"im2col: padding must be 'VALID', 'SAME', 'SAME_LOWER' or 2 \(low, "
                     r"high\) pairs, got 'FULL'", lambda: jax_tma.im2col(x, 2, padding="FULL")),
        (ValueError, r"im2col: method='tma' cannot run this im2col: order='channel_major' has "
                     r"no TMA path \(the hardware moves whole channel runs; use "
                     r"order='tap_major'\)$",
         lambda: jax_tma.im2col(x, 2, order="channel_major", method="tma")),
        (ValueError, r"im2col: padding must be .* got \(\(1, 1\),\)",
         lambda: jax_tma.im2col(x, 2, padding=((1, 1),))),
        (ValueError, r"im2col: padding\[1\] must be a \(low, high\) pair of ints, got \(1, 2, 3\)",
         lambda: jax_tma.im2col(x, 2, padding=((1, 1), (1, 2, 3)))),
        (ValueError, r"im2col: padding\[0\] = \(-1, 0\) is negative",
         lambda: jax_tma.im2col(x, 2, padding=((-1, 0), (0, 0)))),
        (ValueError, r"im2col: padding\[1\] = \(0, 2147483648\) is over 2\^31 - 1$",
         lambda: jax_tma.im2col(x, 2, padding=((0, 0), (0, 2**31)))),
        (ValueError, r"im2col: order must be one of 'tap_major', 'channel_major', got 'hwc'",
         lambda: jax_tma.im2col(x, 2, order="hwc")),
        (ValueError, r"im2col: method must be one of 'auto', 'tma', 'simt', got 'bulk'",
         lambda: jax_tma.im2col(x, 2, method="bulk")),
        (TypeError, r"col2im: patches must be an array", lambda: jax_tma.col2im([1], x.shape, 2)),
        (ValueError, r"col2im: patches.shape=\(\) but im2col of input_shape=\(2, 5, 6, 3\) "
                     r"gives \(2, 4, 5, 12\)", lambda: jax_tma.col2im(1.0, x.shape, 2)),
        (ValueError, r"im2col: x must have rank 3, 4 or 5 .* got rank 0 \(x.shape=\(\)\)",
         lambda: jax_tma.im2col(2.0, 1)),
        (TypeError, r"col2im: input_shape must be a sequence of ints >= 0, got 5",
         lambda: jax_tma.col2im(p, 5, 2)),
        (ValueError, r"col2im: patches.shape=\(2, 3, 4, 12\) but im2col of "
                     r"input_shape=\(2, 5, 6, 3\) gives \(2, 4, 5, 12\)",
         lambda: jax_tma.col2im(p, x.shape, 2)),
        (TypeError, r"col2im: patches of dtype bool cannot be summed",
         lambda: jax_tma.col2im(jnp.ones((2, 4, 5, 12), bool), x.shape, 2)),
        (ValueError, r"col2im: method must be 'auto' or 'simt', got 'tma'",
         lambda: jax_tma.col2im(p, x.shape, 2, method="tma")),
        (ValueError, r"col2im: x must have rank 3, 4 or 5",
         lambda: jax_tma.col2im(p, (2, 3), 2)),
    ]
    for exc, pattern, call in cases:
        with pytest.raises(exc, match=r"^jax_tma\." + pattern):
            call()


def _raw(x, out_shape, **attrs):
    return raw_im2col(x, out_shape, jax.devices("cpu")[0], **attrs)


def test_handler_revalidates():
    x = jnp.ones((2, 5, 3), jnp.float32)
    one = np.ones(1, np.int64)
    with pytest.raises(Exception, match=r"jax_tma\.im2col: method must be one of 'auto', 'tma', "
                                        r"'simt', got 'fast'"):
        _raw(x, (2, 5, 3), method="fast")
    with pytest.raises(Exception, match=r"jax_tma\.im2col: kernel, strides and dilation must "
                                        r"lie in \[1, 2\^31 - 1\]; dim 0 has kernel 1, "
                                        r"strides 0"):
        _raw(x, (2, 5, 3), strides=np.zeros(1, np.int64))
    with pytest.raises(Exception, match=r"jax_tma\.im2col: padding \(-1, 0\) of dim 0 is "
                                        r"outside \[0, 2\^31 - 1\]"):
        _raw(x, (2, 5, 3), pad_lo=-one)
    with pytest.raises(Exception, match=r"jax_tma\.im2col: patches dim 1 is 1 but spatial "
                                        r"dim 0 gives 0 output pixels \(input 5 \+ padding "
                                        r"\(0, 0\), dilated kernel 9, stride 1\)"):
        _raw(x, (2, 1, 27), kernel=9 * one)
    with pytest.raises(Exception, match=r"jax_tma\.im2col: patches dim 1 is 4 but spatial "
                                        r"dim 0 gives 5 output pixels"):
        _raw(x, (2, 4, 3))
    big = np.full(3, 2**31 - 1, np.int64)
    with pytest.raises(Exception, match=r"jax_tma\.im2col: the kernel has over 2\^63 - 1 taps "
                                        r"\(kernel\[2\] = 2147483647 after "
                                        r"4611686014132420609 taps"):
        _raw(jnp.ones((1, 1, 1, 1, 1)), (1, 0, 0, 0, 1), kernel=big)
    with pytest.raises(Exception, match=r"jax_tma\.col2im: a patch row has over 2\^63 - 1 "
                                        r"columns \(4611686014132420609 taps x 3 channels\)"):
        _raw(jnp.ones((1, 0, 0, 1)), (1, 1, 1, 3), kernel=big[:2], transpose=True)
    with pytest.raises(Exception, match=r"jax_tma\.im2col: x has rank 2"):
        _raw(jnp.ones((5, 3)), (5, 3), kernel=np.ones(0, np.int64))
    with pytest.raises(Exception, match=r"jax_tma\.im2col: strides has 2 entries but x has 1"):
        _raw(x, (2, 5, 3), strides=np.ones(2, np.int64))
    with pytest.raises(Exception, match=r"jax_tma\.col2im: element type pred cannot be summed"):
        _raw(jnp.ones((2, 5, 3), bool), (2, 5, 3), transpose=True)


def test_handler_accepts_empty_output_dims(rng):
    # The raw target (no Python checks): an output dim of 0 where the dilated
    # kernel is larger than the padded input.
    x = on_cpu(jnp.asarray(rng.standard_normal((2, 4, 3)), jnp.float32))
    five = np.full(1, 5, np.int64)
    # An invalid method fails in the handler: empty calls do reach it.
    with pytest.raises(Exception, match=r"jax_tma\.im2col: method must be one of 'auto', 'tma', "
                                        r"'simt', got 'fast'"):
        _raw(x, (2, 0, 15), kernel=five, method="fast")
    assert _raw(x, (2, 0, 15), kernel=five).shape == (2, 0, 15)
    for order in (False, True):
        got = _raw(jnp.zeros((2, 0, 15), jnp.float32), (2, 4, 3), kernel=five,
                   channel_major=order, transpose=True)
        assert_bits_equal(got, np.zeros((2, 4, 3), np.float32))
    # 3D, one dim empty, padded and dilated
    x3 = on_cpu(jnp.asarray(rng.standard_normal((1, 5, 4, 5, 2)), jnp.float32))
    geo = dict(kernel=np.array([2, 3, 2]), dilation=np.array([1, 2, 1]),
               pad_lo=np.array([1, 0, 0]), pad_hi=np.array([0, 0, 1]))
    assert _raw(x3, (1, 5, 0, 5, 24), **geo).shape == (1, 5, 0, 5, 24)
    assert_bits_equal(_raw(jnp.ones((1, 5, 0, 5, 24), jnp.float32), x3.shape, transpose=True,
                           **geo), np.zeros(x3.shape, np.float32))


# ---- sharded over 8 host devices: no collectives for the dims the op splits ----

@pytest.mark.parametrize("spec", [P("x", None, None, None), P(("a", "b"), None, None, None)],
                         ids=str)
def test_sharding_of_the_batch_without_collectives(rng, spec):
    mesh = cpu_mesh((8,), ("x",)) if spec[0] == "x" else cpu_mesh((2, 4), ("a", "b"))
    host = random_array(rng, (16, 7, 6, 3), np.float32)
    x = jax.device_put(host, NamedSharding(mesh, spec))
    geo = dict(strides=(2, 1), padding=((1, 2), (0, 1)), dilation=(1, 2))
    f = jax.jit(lambda a: jax_tma.im2col(a, (3, 2), **geo))
    assert_no_collectives(f.lower(x).compile().as_text())
    y = f(x)
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, spec), 4)
    want = im2col_reference(host, (3, 2), (2, 1), ((1, 2), (0, 1)), (1, 2))
    assert_bits_equal(y, want)
    # the gradient (col2im) splits the same way
    g = jax.jit(lambda p: jax_tma.col2im(p, host.shape, (3, 2), **geo))
    assert_no_collectives(g.lower(y).compile().as_text())
    assert_bits_equal(g(y), col2im_reference(want, host.shape, (3, 2), (2, 1),
                                             ((1, 2), (0, 1)), (1, 2)))
    v = jax.jit(jax.grad(lambda a: (jax_tma.im2col(a, (3, 2), **geo) ** 2).sum()))
    assert_no_collectives(v.lower(x).compile().as_text())


def test_im2col_under_shard_map(rng):
    mesh = cpu_mesh((8,), ("x",))
    host = random_array(rng, (8, 5, 4), jnp.bfloat16)
    x = jax.device_put(host, NamedSharding(mesh, P("x")))
    f = jax.jit(jax.shard_map(lambda a: jax_tma.im2col(a, 3, padding="SAME"), mesh=mesh,
                              in_specs=P("x"), out_specs=P("x")))
    assert_no_collectives(f.lower(x).compile().as_text())
    assert_bits_equal(f(x), im2col_reference(host, (3,), (1,), ((1, 1),), (1,)))


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_most_patches_per_pixel_counts_col2ims_terms(rng, rank):
    # The mode tests' geometries keep it at EXACT_TERMS or fewer: col2im of
    # ones counts each pixel's terms.
    spatial = tuple(int(n) for n in rng.integers(3, 7, rank))
    kernel = tuple(int(k) for k in rng.integers(1, 4, rank))
    strides = tuple(int(s) for s in rng.integers(1, 3, rank))
    dilation = tuple(int(d) for d in rng.integers(1, 3, rank))
    pads = tuple((int(lo), int(hi)) for lo, hi in rng.integers(0, 3, (rank, 2)))
    x = np.ones((1,) + spatial + (1,), np.float32)
    p = im2col_reference(x, kernel, strides, pads, dilation, "tap_major", fill=0)
    terms = col2im_reference(np.ones_like(p), x.shape, kernel, strides, pads, dilation,
                             "tap_major")
    assert most_patches_per_pixel(spatial, kernel, strides, pads, dilation) == terms.max()
