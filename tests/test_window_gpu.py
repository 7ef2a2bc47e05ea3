"""jax_tma.window on a CUDA GPU: random geometries (every method that can run
them) into poisoned outputs against the NumPy reference, bit-exact, NaN fill
bits included, each checked to run the kernel its method claims (auto takes
SIMT: its vector form measured ahead of the TMA tiled kernel wherever both run;
tma the tiled kernel where its rules hold); grad; the forced-TMA errors."""

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_tma
from paths import run_on_path
from families.window import window_reference
from reference import ALL_DTYPES, assert_bits_equal, random_array

pytestmark = pytest.mark.gpu
POISON = 0xA5
FLOATS = [d for d in ALL_DTYPES if jnp.issubdtype(d, jnp.inexact) and d.itemsize >= 1
          and d.name != "float4_e2m1fn"]
BYTE_DTYPES = [d for d in ALL_DTYPES if d.name not in ("int2", "uint2", "int4", "uint4",
                                                       "float4_e2m1fn")]




@functools.cache
def _window_into_donated(start_len, shape, strides, fill, method):
    def f(x, start, poison):
        return jax_tma.window(x, [start[i] for i in range(start_len)], shape,
                              strides=strides, fill=fill, method=method)
    return jax.jit(f, donate_argnums=2, keep_unused=True)


def _into_poison(f, x, start_args, shape, device, path):
    """f(x, *start_args, poison) into a donated, poisoned output buffer
    (checked to be written in place, so unwritten elements would show), after
    checking that the handler ran `path`."""
    poison = jax.device_put(
        np.full(int(np.prod(shape)) * x.dtype.itemsize, POISON, np.uint8)
        .view(x.dtype).reshape(shape), device)
    xd = jax.device_put(x, device)
    hlo = f.lower(xd, *start_args, poison).compile().as_text()
    assert "input_output_alias" in hlo and not re.search(r"\bcopy(-start)?\(", hlo)
    ptr = poison.unsafe_buffer_pointer()
    y = run_on_path(path, f, xd, *start_args, poison)
    assert y.unsafe_buffer_pointer() == ptr
    return y


def window_poisoned(x, start, shape, strides, fill, method, device):
    """The window at a traced `start` into a poisoned output; a traced start
    takes the SIMT kernel under auto (its alignment is unknown at trace time)."""
    f = _window_into_donated(len(start), tuple(shape), tuple(strides), fill, method)
    s = jax.device_put(np.asarray(start, np.int32), device)
    path = "window.tiled" if method == "tma" else "window.simt"
    return _into_poison(f, x, (s,), shape, device, path)


def window_static_poisoned(x, start, shape, strides, fill, device, path, method="auto"):
    """The window at a static `start` under `method` into a poisoned output,
    checked to run `path`: the handler's own choice. A fresh jit, so that its
    first execution reaches the handler."""
    f = jax.jit(lambda a, poison: jax_tma.window(a, start, shape, strides=strides, fill=fill,
                                                 method=method),
                donate_argnums=1, keep_unused=True)
    return _into_poison(f, x, (), shape, device, path)


# The most elements a random input or window may have: the NumPy reference
# of a rank-6 draw of full size took over a minute, the GPU a millisecond.
_MAX_ELEMENTS = 1 << 21


def _geometry(rng, rank, tma_friendly):
    """A random (x_shape, start, shape, strides) of `rank` dims, redrawn
    until x and the window hold at most _MAX_ELEMENTS elements each."""
    while True:
        x_shape, start, shape, strides = _draw_geometry(rng, rank, tma_friendly)
        if max(math.prod(x_shape), math.prod(shape)) <= _MAX_ELEMENTS:
            return x_shape, start, shape, strides


def _draw_geometry(rng, rank, tma_friendly):
    if tma_friendly:
        # inner dims a multiple of 16 bytes for every dtype; strides <= 8,
        # innermost stride 1: the tensor-map rules hold.
        x_shape = tuple(int(v) for v in rng.integers(1, 40, rank - 1)) + (16 * int(rng.integers(1, 9)),)
        shape = tuple(int(v) for v in rng.integers(1, 30, rank - 1)) + (16 * int(rng.integers(1, 5)),)
        strides = tuple(int(v) for v in rng.integers(1, 9, rank - 1)) + (1,)
    else:
        x_shape = tuple(int(v) for v in rng.integers(1, 30, rank))
        shape = tuple(int(v) for v in rng.integers(1, 20, rank))
        strides = tuple(int(v) for v in rng.integers(1, 11, rank))
    start = tuple(int(rng.integers(-20, d + 20)) for d in x_shape)
    return x_shape, start, shape, strides


@pytest.mark.parametrize("method", ["auto", "simt"])
@pytest.mark.parametrize("trial", range(12))
def test_random_windows(gpu, rng, method, trial):
    rank = int(rng.integers(1, 7))
    x_shape, start, shape, strides = _geometry(rng, rank, tma_friendly=rng.random() < 0.5)
    dtype = BYTE_DTYPES[int(rng.integers(len(BYTE_DTYPES)))]
    nan = dtype in FLOATS and rng.random() < 0.4
    x = random_array(rng, x_shape, dtype)
    got = window_poisoned(x, start, shape, strides, "nan" if nan else 0, method, gpu)
    assert_bits_equal(got, window_reference(x, start, shape, strides, fill_nan=nan))


@pytest.mark.parametrize("dtype", BYTE_DTYPES, ids=str)
def test_every_dtype(gpu, rng, dtype):
    x = random_array(rng, (37, 64), dtype)
    for method in ("auto", "simt", "tma"):
        got = window_poisoned(x, (-3, 16), (40, 64), (1, 1), 0, method, gpu)
        assert_bits_equal(got, window_reference(x, (-3, 16), (40, 64)))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_nan_fill_bits(gpu, rng, dtype):
    x = random_array(rng, (24, 64), dtype)
    for method in ("auto", "simt", "tma"):
        got = window_poisoned(x, (10, 32), (32, 64), (1, 1), "nan", method, gpu)
        assert_bits_equal(got, window_reference(x, (10, 32), (32, 64), fill_nan=True))


VECTOR_DTYPES = [next(d for d in BYTE_DTYPES if d.itemsize == w) for w in (1, 2, 4, 8)]


@pytest.mark.parametrize("dtype", VECTOR_DTYPES, ids=str)
def test_simt_rows_at_every_alignment(gpu, rng, dtype):
    """The SIMT kernel's contiguous spans at every source offset modulo 16 B
    (aligned vectors, or vectors shifted into place) and output rows of
    every alignment (scalar heads and tails), lengths around the vector
    boundaries; rows that hang over both edges. Innermost strides 1 and 2
    (the vector form takes rows of whole vectors at both)."""
    x = random_array(rng, (5, 400), dtype)
    per = 16 // dtype.itemsize
    for step in (1, 2):
        for width in (1, per - 1, per, per + 1, 3 * per + 1, 333, 400 // step):
            for col in list(range(-1, 2 * per + 1)) + [400 - step * width,
                                                       401 - step * width]:
                got = window_poisoned(x, (1, col), (3, width), (1, step), 0, "simt", gpu)
                assert_bits_equal(got, window_reference(x, (1, col), (3, width), (1, step)))


@pytest.mark.parametrize("dtype", VECTOR_DTYPES, ids=str)
def test_simt_rows_of_several_runs(gpu, rng, dtype):
    """Rows longer than the 4 KiB a warp of the SIMT kernel copies per item,
    so that each row is several items and the last one a part: at vector-
    aligned and unaligned starts, and hanging over the input's end."""
    width = 3 * 4096 // dtype.itemsize + 37
    x = random_array(rng, (4, width + 50), dtype)
    for col in (0, 1, 16 // dtype.itemsize, 60):
        got = window_poisoned(x, (1, col), (3, width), (1, 1), 0, "simt", gpu)
        assert_bits_equal(got, window_reference(x, (1, col), (3, width)))


# (x shape, dtype, start, window shape, strides, fill): static starts whose
# innermost offset is a multiple of 16 B, where the tiled kernel's rules hold
# (and SIMT's vector form runs: output rows of whole 16-B vectors).
STATIC_TILED = [
    ((40, 96), np.float32, (3, 4), (16, 32), (1, 1), 0),
    ((40, 96), np.float32, (30, 80), (16, 32), (1, 1), 0),          # over both far edges
    ((64, 128), jnp.bfloat16, (-5, -8), (80, 64), (1, 1), 0),       # before both near edges
    ((24, 64), np.float32, (10, 32), (32, 64), (1, 1), "nan"),      # NaN fill patched in
    ((8, 40, 64), np.uint8, (1, -2, 16), (4, 10, 32), (2, 3, 1), 0),  # outer strides
    ((1000,), np.float64, (-6,), (1024,), (1,), 0),
    ((6, 20, 16), np.complex128, (0, 3, 2), (6, 8, 8), (1, 2, 1), 0),
]


@pytest.mark.parametrize("x_shape,dtype,start,shape,strides,fill", STATIC_TILED,
                         ids=[str(c[2]) for c in STATIC_TILED])
def test_static_aligned_starts_take_simt_under_auto_and_the_tiled_kernel_under_tma(
        gpu, rng, x_shape, dtype, start, shape, strides, fill):
    x = random_array(rng, x_shape, dtype)
    want = window_reference(x, start, shape, strides, fill_nan=fill == "nan")
    for method, path in (("auto", "window.simt"), ("tma", "window.tiled")):
        got = window_static_poisoned(x, start, shape, strides, fill, gpu, path, method)
        assert_bits_equal(got, want)


# Static starts where auto must take the SIMT kernel: an innermost start off
# 16 B (Python's choice), or an aligned start that the tiled kernel's rules
# still reject (the handler's choice).
STATIC_SIMT = [
    ((40, 96), np.float32, (3, 5), (16, 32), (1, 1)),       # inner start 20 B
    ((40, 96), np.float32, (3, 4), (16, 5), (1, 1)),        # output rows of 20 B
    ((40, 96), np.float32, (3, 4), (16, 32), (1, 2)),       # innermost stride 2
    ((200, 64), np.float32, (0, 16), (16, 32), (9, 1)),     # element stride over 8
    ((40, 25), np.uint8, (3, 0), (16, 16), (1, 1)),         # x rows of 25 B
]


@pytest.mark.parametrize("x_shape,dtype,start,shape,strides", STATIC_SIMT,
                         ids=["inner-start", "output-row", "inner-stride", "stride-9", "x-row"])
def test_auto_with_static_starts_falls_back_to_simt(gpu, rng, x_shape, dtype, start, shape,
                                                     strides):
    x = random_array(rng, x_shape, dtype)
    got = window_static_poisoned(x, start, shape, strides, 0, gpu, "window.simt")
    assert_bits_equal(got, window_reference(x, start, shape, strides))


def test_large_window_and_traced_start(gpu, rng):
    x = jax.device_put(jax.random.normal(jax.random.key(1), (4096, 4096), jnp.float32), gpu)
    f = jax.jit(lambda x, i, j: jax_tma.window(x, (i, j), (2048, 1024)))
    got = f(x, jnp.int32(1000), jnp.int32(3000))
    want = jax.lax.dynamic_slice(jnp.pad(x, ((0, 0), (0, 1024))), (1000, 3000), (2048, 1024))
    assert bool(jnp.array_equal(got, want))


def test_grad_on_gpu(gpu, rng):
    x = jax.device_put(rng.standard_normal((64, 48)).astype(np.float32), gpu)
    w = jax.device_put(rng.standard_normal((20, 16)).astype(np.float32), gpu)
    f = lambda x: (jax_tma.window(x, (-4, 8), (20, 16), strides=(3, 2)) * w).sum()  # noqa: E731
    g = lambda x: (jnp.pad(x, ((4, 0), (0, 0)))[0:60:3, 8:40:2] * w).sum()  # noqa: E731
    np.testing.assert_array_equal(jax.jit(jax.grad(f))(x), jax.jit(jax.grad(g))(x))


def test_vmap_batched_start_on_gpu(gpu, rng):
    x = random_array(rng, (50, 32), np.float32)
    starts = rng.integers(-10, 50, (7, 2)).astype(np.int32)
    f = jax.jit(jax.vmap(lambda s: jax_tma.window(jax.device_put(x, gpu), s, (9, 16)),
                         in_axes=0))
    want = np.stack([window_reference(x, s, (9, 16)) for s in starts])
    assert_bits_equal(f(jax.device_put(starts, gpu)), want)


@pytest.mark.parametrize("trial", range(10))
def test_forced_tma_on_friendly_geometries(gpu, rng, trial):
    rank = int(rng.integers(1, 5))
    x_shape, start, shape, strides = _geometry(rng, rank, tma_friendly=True)
    x_shape = tuple(max(d, s) for d, s in zip(x_shape, strides))  # element stride <= dim
    dtype = BYTE_DTYPES[int(rng.integers(len(BYTE_DTYPES)))]
    nan = dtype in FLOATS and rng.random() < 0.5
    x = random_array(rng, x_shape, dtype)
    got = window_poisoned(x, start, shape, strides, "nan" if nan else 0, "tma", gpu)
    assert_bits_equal(got, window_reference(x, start, shape, strides, fill_nan=nan))


@pytest.mark.parametrize("start", [(0, 0), (3, 1), (-5, -3), (7, 13), (40, 100)])
def test_forced_tma_unaligned_and_out_of_bounds_starts(gpu, rng, start):
    for dtype in (np.uint8, np.float16, np.float32, np.complex128):
        x = random_array(rng, (33, 48), dtype)
        got = window_poisoned(x, start, (20, 32), (1, 1), 0, "tma", gpu)
        assert_bits_equal(got, window_reference(x, start, (20, 32)))


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(shape=(4, 8), strides=(1, 2)), r"the innermost stride must be 1 for TMA \(got 2\)"),
    (dict(shape=(2, 8), strides=(9, 1)), r"strides\[0\] = 9 is over the hardware's 8"),
])
def test_forced_tma_names_the_rule(gpu, kwargs, pattern):
    x = jax.device_put(jnp.ones((64, 64), jnp.float32), gpu)
    with pytest.raises(Exception, match=r"jax_tma\.window: method='tma' cannot run this "
                                        r"window: " + pattern):
        jax.block_until_ready(jax_tma.window(x, (0, 0), method="tma", **kwargs))


def test_forced_tma_rank_over_five(gpu):
    # No dim merges: the only dim taken in full sits inside a strided one.
    x = jax.device_put(jnp.ones((2, 2, 2, 2, 4, 16), jnp.float32), gpu)
    with pytest.raises(Exception, match=r"rank 6 is over the hardware's 5"):
        jax.block_until_ready(jax_tma.window(x, (1, 1, 1, 1, 0, 0), (1, 1, 1, 1, 2, 16),
                                             strides=(1, 1, 1, 1, 2, 1), method="tma"))


def test_forced_tma_rank_seven_merges_to_five(gpu, rng):
    # Static zero starts on the three inner dims, taken whole: they fold into
    # dim 3 and the tensor map has rank 4 (a traced start could not fold).
    x = random_array(rng, (3, 4, 5, 6, 2, 3, 16), np.float32)
    start, shape = (-1, 1, 2, 3, 0, 0, 0), (4, 2, 2, 4, 2, 3, 16)
    f = jax.jit(lambda a, poison: jax_tma.window(a, start, shape, method="tma"),
                donate_argnums=1, keep_unused=True)
    poison = jax.device_put(np.full(shape, np.nan, np.float32), gpu)
    got = f(jax.device_put(x, gpu), poison)
    assert_bits_equal(got, window_reference(x, start, shape, (1,) * 7))


@pytest.mark.parametrize("dtype", BYTE_DTYPES, ids=str)
def test_tiled_copy(gpu, rng, dtype):
    for shape in [(16,), (17, 64), (3, 5, 32), (1 << 20,), (3, 1000, 16)]:
        x = random_array(rng, shape, dtype)
        y = run_on_path("window.tiled", jax.jit(functools.partial(jax_tma.copy, method="tiled")),
                        jax.device_put(x, gpu))
        assert_bits_equal(y, x)


def test_tiled_copy_names_the_rule(gpu):
    # 3 float32 values: no row of whole 16-byte multiples exists.
    x = jax.device_put(jnp.ones(3, jnp.float32), gpu)
    with pytest.raises(Exception, match=r"method='tma' cannot run this window: .*"
                                        r"not a multiple of 16"):
        jax.block_until_ready(jax_tma.copy(x, method="tiled"))


# Fills of any bits, on both kernels: the tiled kernel patches the hardware's
# zero fill where the fill is not +0 (-0.0 included); complex128's two halves
# differ (the tiled kernel moves it as two 8-byte elements).
FILLS = [(np.float32, -0.0), ("bfloat16", 2.5), ("float8_e8m0fnu", 0), (np.int16, -7),
         (np.complex64, 1 - 2j), (np.complex128, 1.5 - 2j), (np.float64, -0.0),
         ("float8_e5m2", float("nan"))]


@pytest.mark.parametrize("method, path", [("tma", "window.tiled"), ("simt", "window.simt")])
@pytest.mark.parametrize("dtype, fill", FILLS, ids=[f"{d}-{f}" for d, f in FILLS])
def test_fills_of_any_bits(gpu, rng, dtype, fill, method, path):
    dtype = jnp.dtype(dtype)
    x_shape, start, shape = (24, 64), (-3, 16), (16, 64)
    x = random_array(rng, x_shape, dtype)
    f = jax.jit(lambda a, poison: jax_tma.window(a, start, shape, fill=fill, method=method),
                donate_argnums=1, keep_unused=True)
    got = _into_poison(f, x, (), shape, gpu, path)
    assert_bits_equal(got, window_reference(x, start, shape, fill=fill))


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "uint64", "int8", "int64"])
def test_starts_of_every_integer_dtype(gpu, rng, dtype):
    """Unsigned starts past the end read fill (a uint32 of 2^32-1 read row -1
    once); the start array and scalar forms agree on the GPU."""
    x = random_array(rng, (12, 32), np.float32)
    info = jnp.iinfo(dtype)
    f = jax.jit(lambda a, s: jax_tma.window(a, s, (4, 32)))
    g = jax.jit(lambda a, i, j: jax_tma.window(a, (i, j), (4, 32)))
    xd = jax.device_put(x, gpu)
    for v in sorted({int(info.max), 0, 9, int(info.min)}):
        want = window_reference(x, (v, 0), (4, 32))
        s = jax.device_put(np.array([v, 0], dtype), gpu)
        assert_bits_equal(f(xd, s), want)
        assert_bits_equal(g(xd, s[0], s[1]), want)
