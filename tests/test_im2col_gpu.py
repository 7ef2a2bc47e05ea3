"""jax_tma.im2col / col2im on a CUDA GPU: random 1D/2D/3D geometries (every
method that can run them) into poisoned outputs against the NumPy reference,
bit-exact; col2im bit-identical to the CPU handler; grad against XLA; the
forced-TMA errors; empty patch matrices (a dilated kernel larger than the
padded input) through the ops and the raw target."""

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_tma
from paths import run_on_path
from families.im2col import IM2COL_EMPTY_CASES, IM2COL_EMPTY_IDS, im2col_reference, raw_im2col
from reference import ALL_DTYPES, assert_bits_equal, cpu_device, random_array

pytestmark = pytest.mark.gpu
POISON = 0xA5
BYTE_DTYPES = [d for d in ALL_DTYPES if d.name not in ("int2", "uint2", "int4", "uint4",
                                                       "float4_e2m1fn")]
SUMMABLE = [d for d in ALL_DTYPES if d.name in (
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
    "bfloat16", "float32", "float64", "complex64", "complex128")]


@functools.cache
def _into_donated(op, kernel, geo):
    def f(a, poison):
        return op(a, kernel, **dict(geo))
    return jax.jit(f, donate_argnums=1, keep_unused=True)


def poisoned(op, a, out_shape, kernel, device, path, **geo):
    """Runs `op` into a donated, poisoned output buffer (checked to be
    written in place), so unwritten elements would show, and checks that the
    handler took `path` ("im2col.tma" or "im2col.simt")."""
    f = _into_donated(op, kernel, tuple(sorted(geo.items())))
    poison = jax.device_put(
        np.full(math.prod(out_shape) * a.dtype.itemsize, POISON, np.uint8)
        .view(a.dtype).reshape(out_shape), device)
    ad = jax.device_put(a, device)
    hlo = f.lower(ad, poison).compile().as_text()
    assert "input_output_alias" in hlo and not re.search(r"\bcopy(-start)?\(", hlo)
    ptr = poison.unsafe_buffer_pointer()
    y = run_on_path(path, f, ad, poison)
    assert y.unsafe_buffer_pointer() == ptr
    return y


def _geometry(rng, r, tma_friendly, dtype):
    while True:
        spatial = tuple(int(v) for v in rng.integers(1, 24 if r < 3 else 9, r))
        kernel = tuple(int(v) for v in rng.integers(1, 4, r))
        strides = tuple(int(v) for v in rng.integers(1, 4, r))
        dilation = tuple(int(v) for v in rng.integers(1, 3, r))
        pads = tuple((int(rng.integers(0, 4)), int(rng.integers(0, 4))) for _ in range(r))
        if all(d * (k - 1) + 1 <= s + lo + hi for s, k, d, (lo, hi)
               in zip(spatial, kernel, dilation, pads)):
            break
    unit = max(1, 16 // np.dtype(dtype).itemsize) if tma_friendly else 1
    c = unit * int(rng.integers(1, 6))
    return (int(rng.integers(1, 4)),) + spatial + (c,), kernel, strides, dilation, pads


def _out_shape(shape, kernel, strides, dilation, pads):
    out = tuple((s + lo + hi - d * (k - 1) - 1) // st + 1 for s, k, st, d, (lo, hi)
                in zip(shape[1:-1], kernel, strides, dilation, pads))
    return (shape[0],) + out + (math.prod(kernel) * shape[-1],)


@pytest.mark.parametrize("trial", range(30))
def test_random_im2col(gpu, rng, trial):
    r = 1 + trial % 3
    dtype = BYTE_DTYPES[int(rng.integers(len(BYTE_DTYPES)))]
    shape, kernel, strides, dilation, pads = _geometry(rng, r, trial % 2 == 0, dtype)
    order = "channel_major" if trial % 5 == 4 else "tap_major"
    x = random_array(rng, shape, dtype)
    got = poisoned(jax_tma.im2col, x, _out_shape(shape, kernel, strides, dilation, pads),
                   kernel, gpu, "im2col.simt", strides=strides, padding=pads, dilation=dilation,
                   order=order)
    assert_bits_equal(got, im2col_reference(x, kernel, strides, pads, dilation, order, fill=0))


@pytest.mark.parametrize("trial", range(15))
def test_forced_tma_on_friendly_geometries(gpu, rng, trial):
    r = 1 + trial % 3
    dtype = BYTE_DTYPES[int(rng.integers(len(BYTE_DTYPES)))]
    shape, kernel, strides, dilation, pads = _geometry(rng, r, True, dtype)
    x = random_array(rng, shape, dtype)
    got = poisoned(jax_tma.im2col, x, _out_shape(shape, kernel, strides, dilation, pads),
                   kernel, gpu, "im2col.tma", strides=strides, padding=pads, dilation=dilation,
                   method="tma")
    assert_bits_equal(got, im2col_reference(x, kernel, strides, pads, dilation, fill=0))


@pytest.mark.parametrize("shape,kernel,pads", [
    ((4, 56, 56, 64), (3, 3), ((1, 1), (1, 1))),
    ((2, 28, 28, 256), (3, 3), ((1, 1), (1, 1))),
    ((2, 30, 31, 4), (3, 3), ((1, 1), (1, 1))),
    ((3, 9, 10, 11, 8), (3, 3, 3), ((1, 1), (2, 0), (0, 2))),
    ((5, 300, 24), (7,), ((6, 0),)),
    ((2, 40, 33, 16), (5, 5), ((9, 4), (0, 11))),   # padding larger than the kernel
])
def test_conv_shapes_every_method(gpu, rng, shape, kernel, pads):
    x = random_array(rng, shape, jnp.bfloat16)
    want = im2col_reference(x, kernel, (1,) * len(kernel), pads, (1,) * len(kernel))
    tma_ok = shape[-1] * x.dtype.itemsize % 16 == 0  # else forced TMA names the rule
    for method in ("auto", "tma", "simt") if tma_ok else ("auto", "simt"):
        path = "im2col.tma" if method == "tma" else "im2col.simt"  # auto takes SIMT
        got = poisoned(jax_tma.im2col, x, want.shape, kernel, gpu, path, padding=pads,
                       method=method)
        assert_bits_equal(got, want)


# The staged SIMT kernel (a pixel's channels an odd number of 16-B units) where a tile is
# shorter than a row (ffi/im2col/im2col_plan.h, PlanStagedIm2col): 656 B a pixel stages 8
# pixels of each of 3 rows, tiles of 6 of 40; 176 B at stride 2 and dilation 2, tiles of 14 of
# 31; one pixel's rows that do not fit (4 KiB + 16 B a pixel), which the flat kernel takes.
@pytest.mark.parametrize("shape,dtype,kernel,strides,dilation,pads", [
    ((1, 6, 40, 328), jnp.bfloat16, (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1))),
    ((2, 5, 61, 44), jnp.float32, (3, 3), (1, 2), (1, 2), ((1, 1), (2, 2))),
    ((1, 3, 7, 1028), jnp.float32, (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1))),
])
def test_staged_tiles(gpu, rng, shape, dtype, kernel, strides, dilation, pads):
    x = random_array(rng, shape, dtype)
    got = poisoned(jax_tma.im2col, x, _out_shape(shape, kernel, strides, dilation, pads),
                   kernel, gpu, "im2col.simt", strides=strides, padding=pads, dilation=dilation)
    assert_bits_equal(got, im2col_reference(x, kernel, strides, pads, dilation, fill=0))


@pytest.mark.parametrize("trial", range(12))
def test_random_col2im_matches_the_cpu_handler(gpu, rng, trial):
    r = 1 + trial % 3
    dtype = SUMMABLE[int(rng.integers(len(SUMMABLE)))]
    shape, kernel, strides, dilation, pads = _geometry(rng, r, trial % 2 == 0, dtype)
    order = "channel_major" if trial % 4 == 3 else "tap_major"
    p = random_array(rng, _out_shape(shape, kernel, strides, dilation, pads), dtype)
    geo = dict(strides=strides, padding=pads, dilation=dilation, order=order)
    got = poisoned(lambda a, k, **kw: jax_tma.col2im(a, shape, k, **kw), p, shape, kernel, gpu,
                   "im2col.simt", **geo)
    want = jax_tma.col2im(jax.device_put(p, cpu_device()), shape, kernel, **geo)
    assert_bits_equal(got, want)


def test_grad_on_gpu_matches_xla(gpu, rng):
    x = jax.device_put(rng.standard_normal((4, 20, 18, 16)).astype(np.float32), gpu)
    geo = dict(strides=(2, 1), padding=((2, 1), (1, 3)), dilation=(1, 2))
    y = jax_tma.im2col(x, (3, 3), **geo)
    w = jax.device_put(rng.standard_normal(y.shape).astype(np.float32), gpu)
    k = 9

    def ours(a):
        return (jax_tma.im2col(a, (3, 3), **geo) * w).sum()

    def xla(a):
        p = lax.conv_general_dilated_patches(a, (3, 3), (2, 1), ((2, 1), (1, 3)),
                                             rhs_dilation=(1, 2),
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                             precision=lax.Precision.HIGHEST)
        p = jnp.swapaxes(p.reshape(p.shape[:-1] + (16, k)), -1, -2).reshape(p.shape)
        return (p * w).sum()

    np.testing.assert_allclose(jax.jit(jax.grad(ours))(x), jax.jit(jax.grad(xla))(x),
                               rtol=1e-5, atol=1e-5)


def test_matmul_of_patches_is_the_convolution(gpu, rng):
    x = jax.device_put(rng.standard_normal((8, 16, 16, 32)).astype(np.float32), gpu)
    w = jax.device_put(rng.standard_normal((3, 3, 32, 24)).astype(np.float32), gpu)
    hi = lax.Precision.HIGHEST
    want = lax.conv_general_dilated(x, w, (1, 1), "SAME", precision=hi,
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"))
    got = jnp.matmul(jax_tma.im2col(x, 3, padding="SAME"), w.reshape(-1, 24), precision=hi)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,kwargs,pattern", [
    ((2, 8, 8, 3), dict(), r"a pixel's channels \(3 x 4 B = 12 B\) are not a multiple of 16 B"),
    ((2, 40, 8, 4), dict(strides=(9, 1)),
     r"strides\[0\] = 9 is over the hardware's traversal-stride limit 8"),
    ((2, 8, 8, 4), dict(order="channel_major"), r"order='channel_major' has no TMA path"),
    ((1, 8, 8, 4), dict(padding=((130, 0), (0, 0))),
     r"padding low 130 of spatial dim 0 is over the hardware's pixel-box corner limit 128 "
     r"for a rank-4 input"),
    ((1, 6, 6, 6, 4), dict(padding=((0, 0), (0, 0), (0, 20))),
     r"padding high 20 minus the kernel's dilated extent 2 along spatial dim 2 \(18\) is "
     r"outside the hardware's pixel-box corner range \[-16, 15\] for a rank-5 input"),
])
def test_forced_tma_names_the_rule(gpu, rng, shape, kwargs, pattern):
    host = random_array(rng, shape, np.float32)
    x = jax.device_put(host, gpu)
    with pytest.raises(Exception, match=r"jax_tma\.im2col: method='tma' cannot run this "
                                        r"im2col: " + pattern):
        jax.block_until_ready(jax_tma.im2col(x, 3, method="tma", **kwargs))
    # auto takes the SIMT kernel instead, with the same result
    r = len(shape) - 2
    want = im2col_reference(host, (3,) * r, kwargs.get("strides", (1,) * r),
                            kwargs.get("padding", ((0, 0),) * r), (1,) * r,
                            kwargs.get("order", "tap_major"))
    assert_bits_equal(jax_tma.im2col(x, 3, **kwargs), want)


# ---- empty results: a dilated kernel larger than the padded input ----

SPECS = {1: ("NWC", "WIO", "NWC"), 2: ("NHWC", "HWIO", "NHWC"), 3: ("NDHWC", "DHWIO", "NDHWC")}


def _per_dim(v, r):
    return (v,) * r if isinstance(v, int) else tuple(v)


@pytest.mark.parametrize("shape,kernel,strides,dilation,padding,want_shape",
                         IM2COL_EMPTY_CASES, ids=IM2COL_EMPTY_IDS)
def test_empty_results_on_gpu(gpu, rng, shape, kernel, strides, dilation, padding, want_shape):
    r = len(shape) - 2
    geo = dict(strides=strides, padding=padding, dilation=dilation)
    x = jax.device_put(rng.standard_normal(shape).astype(np.float32), gpu)
    want = lax.conv_general_dilated_patches(
        x, _per_dim(kernel, r), _per_dim(strides, r), padding,
        rhs_dilation=_per_dim(dilation, r), dimension_numbers=SPECS[r],
        precision=lax.Precision.HIGHEST)
    assert want.shape == want_shape
    for method in ("auto", "simt"):
        got = jax_tma.im2col(x, kernel, order="channel_major", method=method, **geo)
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    for method in ("auto", "tma", "simt"):
        got = jax.jit(lambda a, m=method: jax_tma.im2col(a, kernel, method=m, **geo))(x)
        assert got.shape == want_shape and got.devices() == {gpu}
    # col2im of the empty patch matrix: zeros over a poisoned output
    if math.prod(shape):
        for dtype in (np.float32, jnp.bfloat16, np.complex64, np.int8):
            for order in ("tap_major", "channel_major"):
                p = np.zeros(want_shape, dtype)
                got = poisoned(lambda a, k, **kw: jax_tma.col2im(a, shape, k, **kw), p, shape,
                               kernel, gpu, "im2col.simt", order=order, **geo)
                assert_bits_equal(got, np.zeros(shape, dtype))
    # grad (im2col's VJP is col2im), under jit and vmap
    w = jax.device_put(np.zeros(want_shape, np.float32), gpu)

    def loss(a):
        return (jax_tma.im2col(a, kernel, **geo) * w).sum()

    assert_bits_equal(jax.jit(jax.grad(loss))(x), np.zeros(shape, np.float32))
    xs = jax.device_put(rng.standard_normal((2,) + shape).astype(np.float32), gpu)
    assert_bits_equal(jax.jit(jax.vmap(jax.grad(loss)))(xs), np.zeros((2,) + shape, np.float32))
    g = jax.jit(jax.grad(lambda p: (jax_tma.col2im(p, shape, kernel, **geo) * x).sum()))(w)
    assert g.shape == want_shape


def test_cuda_handler_accepts_empty_output_dims(gpu, rng):
    # The raw target: no empty grid is launched (that would be a launch
    # error), col2im writes zeros.
    x = random_array(rng, (2, 5, 4, 5, 8), np.float32)
    geo = dict(kernel=np.array([2, 3, 2]), dilation=np.array([1, 2, 1]),
               pad_lo=np.array([1, 0, 0]), pad_hi=np.array([0, 0, 1]))
    with pytest.raises(Exception, match=r"jax_tma\.im2col: method must be one of 'auto', 'tma', "
                                        r"'simt', got 'fast'"):
        raw_im2col(x, (2, 5, 0, 5, 96), gpu, method="fast", **geo)  # the handler is reached
    for method in ("auto", "tma", "simt"):
        assert raw_im2col(x, (2, 5, 0, 5, 96), gpu, method=method, **geo).shape == (2, 5, 0, 5, 96)
    assert raw_im2col(x, (2, 5, 0, 5, 96), gpu, channel_major=True, **geo).shape == (2, 5, 0, 5, 96)
    for order in (False, True):
        got = raw_im2col(np.ones((2, 5, 0, 5, 96), np.float32), x.shape, gpu, transpose=True,
                       channel_major=order, **geo)
        assert_bits_equal(got, np.zeros(x.shape, np.float32))
    # empty input with padding that fits the kernel: patches of padding only
    assert_bits_equal(raw_im2col(np.ones((2, 0, 8), np.float32), (2, 1, 16), gpu,
                               kernel=np.array([2]), pad_lo=np.array([1]),
                               pad_hi=np.array([1])), np.zeros((2, 1, 16), np.float32))
