"""jax_tma.gather / jax_tma.scatter on the CPU: bit-exact against jnp.take and
.at[].set/.add(mode="drop") for every dtype, axis, index shape and
out-of-range index; in-place scatter of a donated x; the transformations
(jit, vmap, grad); and every validation rule, in Python and in the handlers."""

import functools
import math
import re
import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jax.test_util import check_grads

import jax_tma
from jax_tma import _devices, _lowering
from families.gather import gather_reference
from ops_table import COMPLEX_FILLS, FLOAT_DTYPES, check_fills, take_fill
from reference import (ALL_DTYPES, SUB_BYTE_BITS, assert_bits_equal, assert_no_collectives,
                       cpu_device, cpu_mesh, random_array)

BYTE_DTYPES = [d for d in ALL_DTYPES if d.name not in SUB_BYTE_BITS]
SUMMABLE = [np.dtype(d) for d in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
                                  np.int64, np.uint64, jnp.float16, jnp.bfloat16, np.float32,
                                  np.float64, np.complex64, np.complex128)]
METHODS = ["auto", "tma", "simt"]


def on_cpu(a):
    return jax.device_put(a, cpu_device())


def indices_for(rng, n, shape, dtype=np.int32):
    """Indices in [-n - 2, n + 2): in range, wrapped negatives and out of range."""
    return rng.integers(-n - 2, n + 2, shape).astype(dtype)


def unique_indices_for(rng, n, count, dtype=np.int32):
    """`count` distinct rows (a random sign each: -1 is the last row), plus
    out-of-range ones where count > n."""
    rows = rng.permutation(n)[:count]
    rows = np.where(rng.integers(0, 2, rows.shape) == 1, rows - n, rows)
    extra = np.arange(n, n + count - rows.size) + 1
    return rng.permutation(np.concatenate([rows, extra])).astype(dtype)


def take_ref(x, idx, axis, fill=0):
    return jnp.take(on_cpu(x), on_cpu(idx), axis=axis, mode="fill", fill_value=fill)


def at(axis, idx):
    return (slice(None),) * axis + (idx,)


# ---- gather --------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_gather_every_dtype_bit_exact(rng, dtype):
    x = random_array(rng, (9, 5, 3), dtype)
    idx = indices_for(rng, 9, (11,))
    y = np.asarray(jax.jit(jax_tma.gather)(on_cpu(x), on_cpu(idx)))
    inside = (idx >= -9) & (idx < 9)
    assert_bits_equal(y[inside], x[idx[inside]])
    # jnp.take's own fill (0 cast to the dtype; e8m0 has no 0); its gathered
    # rows may quiet NaN payloads, ours never do.
    assert_bits_equal(y[~inside], np.asarray(take_ref(x, idx, 0))[~inside])


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
@pytest.mark.parametrize("idx_shape", [(), (0,), (4,), (2, 3), (1, 2, 2)], ids=str)
@pytest.mark.parametrize("method", METHODS)
def test_gather_axes_and_index_shapes_match_take(rng, axis, idx_shape, method):
    x = random_array(rng, (4, 6, 8), np.float32)
    n = x.shape[axis]
    idx = indices_for(rng, n, idx_shape)
    f = jax.jit(functools.partial(jax_tma.gather, axis=axis, method=method))
    if method == "tma" and axis % 3 == 2:  # 4-byte slabs
        with pytest.raises(ValueError, match=r"method='tma' moves slabs of a multiple of 16"):
            f(on_cpu(x), on_cpu(idx))
        return
    assert_bits_equal(f(on_cpu(x), on_cpu(idx)), take_ref(x, idx, axis))


INDEX_DTYPES = [np.dtype(d) for d in (np.int8, np.int16, np.int32, np.int64, np.uint8,
                                      np.uint16, np.uint32, np.uint64)] + \
    [d for d in ALL_DTYPES if d.name in ("int4", "uint4", "int2", "uint2")]


def exact_rows(idx, n):
    """Each index as a row of an n-row table (negative + n, once), -1 where
    out of range: Python ints, so no index type wraps (jnp.take does here:
    an int8 -1 of a 300-row table picks row 43, a uint64 index past 2^63
    a small row)."""
    vals = [int(v) for v in np.asarray(idx).ravel()]
    rows = [v + n if v < 0 else v for v in vals]
    return np.array([r if 0 <= r < n else -1 for r in rows], np.int64).reshape(np.shape(idx))


def take_exact(x, idx, fill=0):
    """gather along axis 0 by exact_rows, in NumPy."""
    x = np.asarray(x)
    rows = exact_rows(idx, x.shape[0])
    out = x[np.maximum(rows, 0)]
    out[rows < 0] = np.asarray(fill).astype(x.dtype)
    return out


def index_extremes(rng, dtype, n, count):
    """Indices of `dtype`: its extremes, the edges of an n-row table (in
    range, wrapped, out of range) where the type holds them, and random
    ones."""
    info = jnp.iinfo(dtype)
    lo, hi = int(info.min), int(info.max)
    edges = [v for v in (0, 1, n - 1, n, n + 1, -1, -n, -n - 1, lo, hi, 2**63 + 1)
             if lo <= v <= hi]
    rand = rng.integers(max(lo, -n - 2), min(hi, n + 2), count, endpoint=True)
    return np.array(edges + [int(v) for v in rand], dtype=object).astype(np.int64 if lo < 0 else
                                                                        np.uint64).astype(dtype)


@pytest.mark.parametrize("idx_dtype", INDEX_DTYPES, ids=str)
def test_every_index_dtype(rng, idx_dtype):
    n = 5 if idx_dtype.name in SUB_BYTE_BITS else 300
    x = random_array(rng, (n, 3), np.int16)
    idx = index_extremes(rng, idx_dtype, n, 12)
    rows = exact_rows(idx, n)
    got = jax.jit(functools.partial(jax_tma.gather, fill=-9))(on_cpu(x), on_cpu(idx))
    assert_bits_equal(got, take_exact(x, idx, -9))
    # Scatter: the last update of a row wins on the CPU; out-of-range ones drop.
    u = random_array(rng, (idx.size, 3), np.int16)
    want = x.copy()
    for k, r in enumerate(rows):
        if r >= 0:
            want[r] = u[k]
    assert_bits_equal(jax.jit(jax_tma.scatter)(on_cpu(x), on_cpu(idx), on_cpu(u)), want)
    # The transpose: a row's cotangent is the sum over the indices that pick it.
    w = rng.standard_normal((idx.size, 3))
    g = jax.grad(lambda a: (jax_tma.gather(a, idx) * w).sum())(jnp.zeros((n, 3)))
    want_g = np.zeros((n, 3))
    for k, r in enumerate(rows):
        if r >= 0:
            want_g[r] += w[k]
    np.testing.assert_allclose(g, want_g, rtol=1e-12)


@pytest.mark.parametrize("fill,dtype", [(np.nan, np.float32), (-3, np.int8), (2.5, jnp.bfloat16),
                                        (1 + 2j, np.complex128), (True, np.bool_),
                                        (np.inf, np.float16), (-7, jnp.int4)], ids=str)
def test_gather_fill_values(rng, fill, dtype):
    x = random_array(rng, (5, 4), dtype)
    idx = np.array([7, 0, -6, 4, 5])
    y = np.asarray(jax.jit(functools.partial(jax_tma.gather, fill=fill))(on_cpu(x), on_cpu(idx)))
    inside = np.array([False, True, False, True, False])
    assert_bits_equal(y[inside], x[idx[inside]])
    # jnp.take's fill rows give the fill's conversion to the dtype; its
    # gathered 16-bit float rows pass through f32 on the CPU, which quiets NaN
    # payloads and flushes subnormals, so those rows are checked against x.
    assert_bits_equal(y[~inside], np.asarray(take_ref(x, idx, 0, fill=fill))[~inside])


@pytest.mark.parametrize("fill,dtype", [(2**70, np.float32), (2**70, np.float64),
                                        (2**64 - 1, np.uint64), (-2**63, np.int64),
                                        (np.float64(1e300), np.float32), (0, jnp.float8_e8m0fnu),
                                        (-2.5, jnp.float8_e4m3fn), (ml_dtypes.bfloat16(7.5), np.float32),
                                        (ml_dtypes.float8_e4m3fn(-3), jnp.bfloat16),
                                        (np.nan, jnp.float8_e5m2)], ids=str)
def test_fill_converts_as_jnp_take(rng, fill, dtype):
    x = random_array(rng, (4, 3), dtype)
    idx = np.array([5, 1, -5])
    with np.errstate(over="ignore"):
        y = np.asarray(jax_tma.gather(on_cpu(x), on_cpu(idx), fill=fill))
        want = np.asarray(take_ref(x, idx, 0, fill=fill))
    assert_bits_equal(y[1], x[1])
    assert_bits_equal(y[[0, 2]], want[[0, 2]])


GATHER_FILLS = [0, 0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1.5, -3.25, 2**70,
                1e300, -1e-300, np.float16(2.5), np.float32(-0.0), ml_dtypes.bfloat16(7.0)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_every_fill_of_every_float_dtype_as_jnp_take_writes_it(rng, dtype):
    """On the default device, every fill in one program."""
    x = random_array(rng, (4, 3), dtype)
    idx = np.array([1, 9, -1, -5], np.int32)
    fills = []
    for fill in GATHER_FILLS + (COMPLEX_FILLS if np.dtype(dtype).kind == "c" else []):
        try:
            take_fill(fill, dtype)
            fills.append(fill)
        except TypeError:  # jnp.take takes no 2**70 for ml_dtypes' types: nothing to match
            pass
    check_fills(lambda a, f: jax_tma.gather(a, idx, fill=f), x, fills,
                lambda f: gather_reference(x, idx, 0, take_fill(f, dtype)))


@pytest.mark.parametrize("fill,dtype", [(jnp.array(0.5), np.float16),
                                        (jnp.array(3, jnp.int8), np.int32),
                                        (np.array(-1.5), jnp.bfloat16)], ids=str)
def test_fill_may_be_a_concrete_0d_array(rng, fill, dtype):
    # (jnp.take wants a hashable fill_value: its reference takes the scalar.)
    x = random_array(rng, (4, 3), dtype)
    y = jax.jit(functools.partial(jax_tma.gather, fill=fill))(on_cpu(x), on_cpu(np.array([7])))
    assert_bits_equal(y, take_ref(x, np.array([7]), 0, fill=fill.item()))


def test_default_fill_of_e8m0_is_its_nan():
    # float8_e8m0fnu has no 0: jnp converts it to 0xFF, its NaN.
    x = jnp.ones((2, 2), jnp.float8_e8m0fnu)
    y = np.asarray(jax_tma.gather(x, jnp.array([7])))
    assert (y.view(np.uint8) == 0xFF).all()


def test_fill_that_does_not_fit_an_integer_x():
    with pytest.raises(OverflowError, match=r"jax_tma\.gather: fill 1180591620717411303424 does "
                                            r"not fit x's dtype int32"):
        jax_tma.gather(jnp.ones((2, 2), jnp.int32), jnp.array([7]), fill=2**70)


@pytest.mark.parametrize("x_shape,axis", [((0, 3), 0), ((3, 0), 0), ((3, 0, 2), 1),
                                          ((0,), 0), ((4, 5, 0), 1)], ids=str)
def test_gather_empty_arrays(rng, x_shape, axis):
    x = random_array(rng, x_shape, np.float32)
    idx = np.array([0, -1, 2])
    y = jax.jit(functools.partial(jax_tma.gather, axis=axis, fill=1.5))(on_cpu(x), on_cpu(idx))
    if x_shape[axis] == 0:  # every index is out of range (jnp.take refuses)
        want = np.full(x_shape[:axis] + (3,) + x_shape[axis + 1:], 1.5, np.float32)
    else:
        want = take_ref(x, idx, axis, fill=1.5)
    assert_bits_equal(y, want)


def test_gather_special_float_bits_survive():
    bits = np.array([0x7FC00001, 0xFFC12345, 0x7F800001, 0x80000000, 0x00000001, 0x807FFFFF],
                    np.uint32)
    x = bits.view(np.float32).reshape(3, 2)
    idx = np.array([2, 0, 1, 2])
    assert_bits_equal(jax_tma.gather(on_cpu(x), on_cpu(idx)), x[idx])


def test_gather_python_int_index_and_numpy_inputs(rng):
    x = random_array(rng, (4, 3), np.uint16)
    assert_bits_equal(jax_tma.gather(x, 2), x[2])
    assert_bits_equal(jax_tma.gather(x, -1, axis=1), x[:, 2])


@pytest.mark.parametrize("x_dtype,updates", [(np.float32, 2.5), (np.int8, 7), (np.int8, 300),
                                             (np.uint8, -1), (np.float32, 3), (np.int32, 1.5),
                                             (np.bool_, True), (np.complex64, 1 - 2j)], ids=str)
@pytest.mark.parametrize("index", [1, -2], ids=str)
def test_python_scalar_updates_and_indices_as_at(rng, x_dtype, updates, index):
    # Python scalars are converted as x.at[].set converts them (an int that
    # fits an integer x takes its dtype, 300 into int8 wraps as in jnp),
    # and broadcast to the slabs.
    x = random_array(rng, (5, 3), x_dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # an unsafe cast warns in both
        got = jax_tma.scatter(on_cpu(x), index, updates)
        want = on_cpu(x).at[index].set(updates)
    assert_bits_equal(got, want)


def test_updates_broadcast_as_at(rng):
    x = random_array(rng, (6, 4, 3), np.float32)
    idx = np.array([[1, 4], [0, -1]])
    u = random_array(rng, (1, 4, 3), np.float32)  # one slab for every index
    got = jax_tma.scatter(on_cpu(x), on_cpu(idx), on_cpu(u))
    assert_bits_equal(got, on_cpu(x).at[on_cpu(idx)].set(on_cpu(u)))
    x = rng.standard_normal(x.shape).astype(np.float32)  # sums of numbers, not of NaNs
    v = rng.standard_normal(3).astype(np.float32)
    got = jax_tma.scatter(on_cpu(x), on_cpu(idx), on_cpu(v), axis=1, mode="add")
    assert_bits_equal(got, on_cpu(x).at[:, on_cpu(idx)].add(on_cpu(v)))


# ---- scatter ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_scatter_set_every_dtype_bit_exact(rng, dtype):
    x = random_array(rng, (9, 5, 3), dtype)
    idx = unique_indices_for(rng, 9, 11)
    u = random_array(rng, (11, 5, 3), dtype)
    y = jax.jit(jax_tma.scatter)(on_cpu(x), on_cpu(idx), on_cpu(u))
    want = np.array(x)
    for i, row in enumerate(idx):
        if -9 <= row < 9:
            want[row] = u[i]
    assert_bits_equal(y, want)


@pytest.mark.parametrize("axis", [0, 1, 2, -2])
@pytest.mark.parametrize("idx_shape", [(), (0,), (5,), (2, 3)], ids=str)
@pytest.mark.parametrize("method", METHODS)
def test_scatter_set_with_duplicates_matches_xla(rng, axis, idx_shape, method):
    # XLA's CPU scatter applies updates in order, as the handler does: the
    # last duplicate wins in both.
    x = random_array(rng, (4, 6, 8), np.float32)
    n = x.shape[axis]
    idx = indices_for(rng, n, idx_shape)
    u_shape = x.shape[:axis % 3] + idx_shape + x.shape[axis % 3 + 1:]
    u = random_array(rng, u_shape, np.float32)
    f = jax.jit(functools.partial(jax_tma.scatter, axis=axis, method=method))
    if method == "tma" and axis % 3 == 2:  # 4-byte slabs
        with pytest.raises(ValueError, match=r"method='tma' moves slabs of a multiple of 16"):
            f(on_cpu(x), on_cpu(idx), on_cpu(u))
        return
    want = on_cpu(x).at[at(axis % 3, on_cpu(idx))].set(on_cpu(u), mode="drop")
    assert_bits_equal(f(on_cpu(x), on_cpu(idx), on_cpu(u)), want)


@pytest.mark.parametrize("dtype", SUMMABLE, ids=str)
@pytest.mark.parametrize("deterministic", [False, True])
def test_scatter_add_every_summable_dtype_matches_xla(rng, dtype, deterministic):
    x = random_array(rng, (7, 4, 3), dtype, finite=True)
    idx = indices_for(rng, 7, (12,))
    u = random_array(rng, (12, 4, 3), dtype, finite=True)
    if dtype.kind in "fc" or dtype.name == "bfloat16":
        # Arithmetic on normal values: XLA's own CPU scatter flushes subnormals.
        x = rng.standard_normal(x.shape).astype(dtype)
        u = rng.standard_normal(u.shape).astype(dtype)
    f = jax.jit(functools.partial(jax_tma.scatter, mode="add", deterministic=deterministic))
    want = on_cpu(x).at[on_cpu(idx)].add(on_cpu(u), mode="drop")
    assert_bits_equal(f(on_cpu(x), on_cpu(idx), on_cpu(u)), want)


def scatter_add_reference(x, idx, u):
    """Sequential add in index order, rounded to the dtype after each add."""
    out = np.array(x)
    n = x.shape[0]
    with np.errstate(over="ignore", invalid="ignore"):
        for i, row in enumerate(idx):
            if -n <= row < n:
                out[row] = (out[row].astype(np.float32) + u[i].astype(np.float32)).astype(x.dtype)
    return out


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, np.float32], ids=str)
def test_scatter_add_sums_in_index_order_with_subnormals_kept(rng, dtype):
    x = random_array(rng, (5, 16), dtype, finite=True)
    idx = indices_for(rng, 5, (40,))
    u = random_array(rng, (40, 16), dtype, finite=True)
    y = jax_tma.scatter(on_cpu(x), on_cpu(idx), on_cpu(u), mode="add", deterministic=True)
    want = scatter_add_reference(x, idx, u)
    got = np.asarray(y)
    nan = np.isnan(want.astype(np.float32))
    assert_bits_equal(got[~nan], want[~nan])
    assert np.isnan(got.astype(np.float32)[nan]).all()


def test_scatter_add_integers_wrap(rng):
    x = np.array([[250, 7]], np.uint8)
    y = jax_tma.scatter(x, np.array([0, 0, 0]), np.full((3, 2), 100, np.uint8), mode="add")
    assert_bits_equal(y, np.array([[(250 + 300) % 256, 51]], np.uint8))


@pytest.mark.parametrize("x_shape,axis,idx_shape", [((0, 3), 0, (2,)), ((3, 0), 0, (2,)),
                                                    ((3, 2), 0, (0,)), ((2, 0, 3), 1, (4,))],
                         ids=str)
@pytest.mark.parametrize("mode", ["set", "add"])
def test_scatter_empty_arrays(rng, x_shape, axis, idx_shape, mode):
    x = random_array(rng, x_shape, np.int32)
    idx = np.zeros(idx_shape, np.int32)
    u = random_array(rng, x_shape[:axis] + idx_shape + x_shape[axis + 1:], np.int32)
    y = jax.jit(functools.partial(jax_tma.scatter, axis=axis, mode=mode))(x, idx, u)
    ref = jnp.asarray(x).at[at(axis, idx)]
    assert_bits_equal(y, getattr(ref, mode)(u, mode="drop"))


def test_scatter_sub_byte_and_bool(rng):
    for dtype in (jnp.int4, jnp.uint4, np.bool_):
        x = random_array(rng, (6, 5), dtype)
        idx = unique_indices_for(rng, 6, 4)
        u = random_array(rng, (4, 5), dtype)
        want = jnp.asarray(x).at[idx].set(u, mode="drop")
        assert_bits_equal(jax.jit(jax_tma.scatter)(x, idx, u), want)


# ---- in place ----------------------------------------------------------------------

def _copies(hlo_text: str) -> list[str]:
    return re.findall(r"^\s*\S+ = \S+ copy\(", hlo_text, re.M)


def test_scatter_of_a_donated_x_makes_no_copy(rng):
    x = on_cpu(random_array(rng, (64, 32), np.float32))
    idx = on_cpu(np.array([3, 9, -1], np.int32))
    u = on_cpu(random_array(rng, (3, 32), np.float32))
    donated = jax.jit(jax_tma.scatter, donate_argnums=0)
    text = donated.lower(x, idx, u).compile().as_text()
    assert "output_to_operand_aliasing" in text
    assert not _copies(text), _copies(text)
    # Without donation XLA keeps x and copies it before the call.
    kept = jax.jit(jax_tma.scatter).lower(x, idx, u).compile().as_text()
    assert _copies(kept)
    want = np.asarray(x).copy()
    want[[3, 9, -1]] = np.asarray(u)
    # (Whether the runtime then reuses x's buffer is its business: on the CPU
    # an array put from NumPy may share NumPy's memory and is copied once.)
    y = donated(x, idx, u)
    assert x.is_deleted()
    assert_bits_equal(y, want)


def test_scatter_without_donation_leaves_x_alone(rng):
    host = random_array(rng, (8, 4), np.int32)
    x = on_cpu(host)
    y = jax.jit(jax_tma.scatter)(x, np.array([1, 2]), np.zeros((2, 4), np.int32))
    assert_bits_equal(x, host)
    assert_bits_equal(y[1:3], np.zeros((2, 4), np.int32))


# ---- transformations -------------------------------------------------------------

def _prims(f, *args):
    return [e.primitive.name for e in jax.make_jaxpr(f)(*args).jaxpr.eqns]


@pytest.mark.parametrize("in_axes", [(0, None), (None, 0), (0, 0), (1, 1), (2, None)], ids=str)
def test_gather_vmap_is_one_call(rng, in_axes):
    x = random_array(rng, (3, 5, 4), np.float32)
    idx = indices_for(rng, 5, (3, 4, 2))
    xs = x if in_axes[0] is not None else x[0]
    idx_b = idx if in_axes[1] is not None else idx[0]
    if in_axes[1] == 1:
        idx_b = np.moveaxis(idx, 0, 1)
    if in_axes[0] == 1:
        xs = np.moveaxis(x, 0, 1)
    if in_axes[0] == 2:
        xs = np.moveaxis(x, 0, 2)
    f = jax.vmap(lambda a, i: jax_tma.gather(a, i, axis=0 if in_axes[0] != 2 else 1,
                                             fill=-1.0), in_axes=in_axes)
    g = jax.vmap(lambda a, i: take_ref(a, i, 0 if in_axes[0] != 2 else 1, -1.0), in_axes=in_axes)
    assert_bits_equal(jax.jit(f)(xs, idx_b), g(xs, idx_b))
    names = _prims(f, xs, idx_b)
    assert names.count("jax_tma_gather") == 1 and not {"scan", "while"} & set(names), names


@pytest.mark.parametrize("in_axes", [(0, None, 0), (None, 0, 0), (0, 0, 0), (None, None, 0),
                                     (0, None, None), (None, 0, None)], ids=str)
@pytest.mark.parametrize("mode", ["set", "add"])
def test_scatter_vmap_is_one_call(rng, in_axes, mode):
    b = 3
    x = random_array(rng, (b, 6, 4), np.int32)
    idx = indices_for(rng, 6, (b, 5))
    u = random_array(rng, (b, 5, 4), np.int32)
    # On the CPU: there the last of duplicate indices wins under "set", as in
    # XLA's CPU scatter (on a GPU either may).
    args = [on_cpu(jnp.asarray(a if d is not None else a[0])) for a, d in zip((x, idx, u), in_axes)]
    f = jax.vmap(functools.partial(jax_tma.scatter, mode=mode), in_axes=in_axes)
    g = jax.vmap(lambda a, i, v: getattr(a.at[i], mode)(v, mode="drop"), in_axes=in_axes)
    assert_bits_equal(jax.jit(f)(*args), jax.jit(g)(*args))
    names = _prims(f, *args)
    assert names.count("jax_tma_scatter") == 1 and not {"scan", "while"} & set(names), names


def test_nested_vmap(rng):
    x = random_array(rng, (2, 3, 7, 4), np.float32)
    idx = indices_for(rng, 7, (2, 3, 5))
    f = jax.vmap(jax.vmap(jax_tma.gather))
    assert_bits_equal(jax.jit(f)(x, idx),
                      jax.vmap(jax.vmap(lambda a, i: take_ref(a, i, 0)))(x, idx))


def test_gather_grad_is_scatter_add(rng):
    x = on_cpu(jnp.asarray(rng.standard_normal((6, 3))))
    idx = on_cpu(jnp.array([1, 1, -1, 9, 0]))
    w = jnp.asarray(rng.standard_normal((5, 3)))
    g = jax.jit(jax.grad(lambda a: (jax_tma.gather(a, idx, fill=5.0) * w).sum()))(x)
    want = jax.grad(lambda a: (take_ref(a, idx, 0, 5.0) * w).sum())(x)
    np.testing.assert_allclose(g, want, rtol=1e-12)
    check_grads(lambda a: jnp.sin(jax_tma.gather(a, idx, axis=0)), (x,), order=2,
                modes=("fwd", "rev"))


def test_scatter_add_grad(rng):
    x = on_cpu(jnp.asarray(rng.standard_normal((6, 3))))
    u = on_cpu(jnp.asarray(rng.standard_normal((4, 3))))
    idx = on_cpu(jnp.array([2, 2, -7, 5]))

    def f(a, v):
        return jnp.sin(jax_tma.scatter(a, idx, v, mode="add"))

    def ref(a, v):
        return jnp.sin(a.at[idx].add(v, mode="drop"))

    w = jnp.asarray(rng.standard_normal((6, 3)))
    got = jax.grad(lambda a, v: (f(a, v) * w).sum(), argnums=(0, 1))(x, u)
    want = jax.grad(lambda a, v: (ref(a, v) * w).sum(), argnums=(0, 1))(x, u)
    for g_, w_ in zip(got, want):
        np.testing.assert_allclose(g_, w_, rtol=1e-12)
    check_grads(f, (x, u), order=2, modes=("fwd", "rev"))


def test_scatter_set_grad_zeroes_overwritten_and_losing_updates(rng):
    x = on_cpu(jnp.asarray(rng.standard_normal((6, 3))))
    u = on_cpu(jnp.asarray(rng.standard_normal((5, 3))))
    idx = on_cpu(jnp.array([2, 4, 2, -7, -2]))  # 2 twice, -7 dropped, -2 is row 4 again
    w = jnp.asarray(rng.standard_normal((6, 3)))
    gx, gu = jax.jit(jax.grad(lambda a, v: (jax_tma.scatter(a, idx, v) * w).sum(),
                              argnums=(0, 1)))(x, u)
    want_x = np.asarray(w).copy()
    want_x[[2, 4]] = 0
    want_u = np.zeros((5, 3))
    want_u[2] = w[2]  # the last update of row 2 wins
    want_u[4] = w[4]  # -2 (row 4) comes after 4
    np.testing.assert_array_equal(gx, want_x)
    np.testing.assert_array_equal(gu, want_u)
    xla = jax.grad(lambda a, v: (a.at[idx].set(v, mode="drop") * w).sum(), argnums=(0, 1))(x, u)
    np.testing.assert_array_equal(gx, xla[0])
    np.testing.assert_array_equal(gu, xla[1])
    check_grads(lambda a, v: jax_tma.scatter(a, idx, v) ** 2, (x, u), order=2,
                modes=("fwd", "rev"))


def test_vmap_of_grad_and_grad_of_vmap(rng):
    x = on_cpu(jnp.asarray(rng.standard_normal((4, 6, 3))))
    idx = on_cpu(jnp.asarray(indices_for(rng, 6, (4, 5))))

    def loss(a, i):
        return (jax_tma.gather(a, i) ** 2).sum()

    def ref(a, i):
        return (take_ref(a, i, 0) ** 2).sum()

    np.testing.assert_allclose(jax.vmap(jax.grad(loss))(x, idx), jax.vmap(jax.grad(ref))(x, idx))
    np.testing.assert_allclose(jax.grad(lambda a: jax.vmap(loss)(a, idx).sum())(x),
                               jax.grad(lambda a: jax.vmap(ref)(a, idx).sum())(x))


def test_eager_calls(rng):
    x = random_array(rng, (4, 2), np.float32)
    assert_bits_equal(jax_tma.gather(on_cpu(x), np.array([1])), x[[1]])


# ---- bad input: Python-side validation ---------------------------------------------

def test_non_array_inputs_are_type_errors():
    with pytest.raises(TypeError, match=r"jax_tma\.gather: indices must be an array"):
        jax_tma.gather(jnp.ones(3), [0, 1])
    with pytest.raises(TypeError, match=r"jax_tma\.gather: x\[1\] must be an array"):
        jax_tma.gather((jnp.ones(3), "abc"), jnp.array([0]))  # a list or tuple is tables
    with pytest.raises(TypeError, match=r"jax_tma\.scatter: updates must be an array"):
        jax_tma.scatter(jnp.ones(3), jnp.array([0]), None)
    # Tables' updates for a single x: as before tables existed.
    with pytest.raises(TypeError, match=r"jax_tma\.scatter: updates must be an array \(jax\.Array "
                                        r"or numpy\.ndarray\) or a scalar, got tuple"):
        jax_tma.scatter(jnp.ones(3), jnp.array([0]), (jnp.ones(1),))


def test_scalar_x_is_a_rank_error():
    # As jnp.take, which has no axis 0 to pick along in a 0-d array.
    with pytest.raises(ValueError, match=r"jax_tma\.gather: x must have rank >= 1, got a 0-d"):
        jax_tma.gather(1.0, jnp.array([0]))
    with pytest.raises(ValueError, match=r"jax_tma\.gather: table 0: x must have rank >= 1"):
        jax_tma.gather([1, 2], jnp.array([0]))


def test_float_indices_are_a_type_error():
    with pytest.raises(TypeError, match=r"jax_tma\.gather: indices must be integers, got dtype "
                                        r"float32"):
        jax_tma.gather(jnp.ones(3), jnp.array([0.0], jnp.float32))
    with pytest.raises(TypeError, match=r"jax_tma\.scatter: indices must be integers, got dtype "
                                        r"bool"):
        jax_tma.scatter(jnp.ones(3), jnp.array([True]), jnp.ones(1))


@pytest.mark.parametrize("axis,msg", [(2, r"axis 2 is out of range for x of rank 2 \(valid: -2 "
                                          r"to 1\)"),
                                      (-3, r"axis -3 is out of range"),
                                      (1.0, r"axis must be an int, got 1\.0")])
def test_bad_axis(axis, msg):
    with pytest.raises((ValueError, TypeError), match=r"jax_tma\.gather: " + msg):
        jax_tma.gather(jnp.ones((2, 3)), jnp.array([0]), axis=axis)


def test_zero_d_x():
    with pytest.raises(ValueError, match=r"jax_tma\.scatter: x must have rank >= 1, got a 0-d"):
        jax_tma.scatter(jnp.float32(1), jnp.array([0]), jnp.ones(1))


def test_unknown_method_and_mode():
    with pytest.raises(ValueError, match=r"jax_tma\.gather: method must be one of 'auto', 'tma', "
                                         r"'simt', got 'bulk'"):
        jax_tma.gather(jnp.ones(3), jnp.array([0]), method="bulk")
    with pytest.raises(ValueError, match=r"jax_tma\.scatter: mode must be one of 'set', 'add', "
                                         r"got 'max'"):
        jax_tma.scatter(jnp.ones(3), jnp.array([0]), jnp.ones(1), mode="max")


@pytest.mark.parametrize("fill", [jnp.ones(2), None])
def test_bad_fill(fill):
    with pytest.raises(TypeError, match=r"jax_tma\.gather: fill must be a"):
        jax_tma.gather(jnp.ones(3), jnp.array([0]), fill=fill)


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.complex64, np.int32, np.uint8,
                                   np.bool_], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("fill", ["nan", "NaN", float("nan"), np.float16("nan"),
                                  jnp.array(float("nan"))], ids=repr)
def test_nan_fill_is_one_rule_for_gather_and_window(rng, dtype, fill):
    """A NaN fill, the string "nan" (any case) or a NaN number, is one rule
    for both ops with a fill: NaN of a floating x (for complex, "nan" is
    NaN in both parts, a number NaN + 0j, as jnp.pad converts it), refused
    with the same message for an integer or bool x."""
    x = random_array(rng, (3, 4), dtype)
    if not jnp.issubdtype(dtype, jnp.inexact):
        for op, call in (("gather", lambda: jax_tma.gather(x, jnp.array([5]), fill=fill)),
                         ("window", lambda: jax_tma.window(x, (2, 0), (2, 4), fill=fill))):
            with pytest.raises(ValueError, match=rf"^jax_tma\.{op}: fill=NaN needs a floating "
                                                 rf"dtype, x has dtype {np.dtype(dtype)}$"):
                call()
        return
    got = jax_tma.gather(on_cpu(x), on_cpu(np.array([2, 5])), fill=fill)
    boxed = jax_tma.window(on_cpu(x), (2, 0), (2, 4), fill=fill)  # x's last row, then fill
    assert_bits_equal(got, boxed)
    assert_bits_equal(got[0], x[2])
    row = np.asarray(got[1])
    if dtype == np.complex64:
        assert np.isnan(row.real).all()
        assert np.isnan(row.imag).all() if isinstance(fill, str) else (row.imag == 0).all()
    else:
        assert np.isnan(row.astype(np.float32)).all()


def test_complex_fill_for_a_real_x():
    with pytest.raises(TypeError, match=r"jax_tma\.gather: a complex fill \(1\+1j\) needs a "
                                        r"complex x, x has dtype float32"):
        jax_tma.gather(jnp.ones(3, jnp.float32), jnp.array([0]), fill=1 + 1j)


def test_traced_fill_is_a_type_error():
    with pytest.raises(TypeError, match=r"jax_tma\.gather: fill must be a concrete scalar"):
        jax.jit(lambda f: jax_tma.gather(jnp.ones(3), jnp.array([0]), fill=f))(1.0)


def test_updates_shape():
    x = jnp.ones((4, 3, 2), jnp.float32)
    with pytest.raises(ValueError, match=r"jax_tma\.scatter: updates have shape \(2, 3\), which "
                                         r"does not broadcast to \(4, 5, 2\) \(x\.shape\[:axis\] "
                                         r"\+ indices\.shape \+ x\.shape\[axis\+1:\] with "
                                         r"x\.shape=\(4, 3, 2\), indices\.shape=\(5,\), axis=1\)"):
        jax_tma.scatter(x, jnp.zeros(5, jnp.int32), jnp.ones((2, 3), jnp.float32), axis=1)
    with pytest.raises(ValueError, match=r"updates have shape \(1, 5, 2, 1\), which does not "
                                         r"broadcast to \(4, 5, 2\)"):
        jax_tma.scatter(x, jnp.zeros(5, jnp.int32), jnp.ones((1, 5, 2, 1)), axis=1)


def test_add_of_bool_is_a_type_error():
    # As x.at[].add: XLA has no add of booleans (an int update promotes).
    x = jnp.zeros((3, 2), bool)
    with pytest.raises(TypeError, match=r"jax_tma\.scatter: mode='add' cannot sum dtype bool "
                                        r"\(as x\.at\[\]\.add cannot\)"):
        jax_tma.scatter(x, jnp.array([0]), jnp.zeros((1, 2), bool), mode="add")
    with pytest.raises(TypeError):
        x.at[jnp.array([0])].add(jnp.zeros((1, 2), bool))


def test_deterministic_must_be_a_bool():
    with pytest.raises(TypeError, match=r"jax_tma\.scatter: deterministic must be a bool, got 1"):
        jax_tma.scatter(jnp.ones(3), jnp.array([0]), jnp.ones(1), deterministic=1)


def test_tma_names_the_16_byte_rule():
    with pytest.raises(ValueError, match=r"jax_tma\.gather: method='tma' moves slabs of a multiple "
                                         r"of 16 bytes \(the bulk-copy size rule\), but "
                                         r"x\.shape\[axis \+ 1:\] = \(3,\) of float32 is 12 B"):
        jax_tma.gather(jnp.ones((5, 3), jnp.float32), jnp.array([0]), method="tma")
    with pytest.raises(ValueError, match=r"jax_tma\.scatter: method='tma' moves slabs of a "
                                         r"multiple of 16 bytes .* = \(5,\) of int8 is 5 B"):
        jax_tma.scatter(jnp.ones((5, 5), jnp.int8), jnp.array([0]), jnp.ones((1, 5), jnp.int8),
                        method="tma")
    # 16-byte slabs, and empty ones, pass.
    jax_tma.gather(jnp.ones((5, 4), jnp.float32), jnp.array([0]), method="tma")
    jax_tma.gather(jnp.ones((5, 0), jnp.float32), jnp.array([0]), method="tma")


def test_tma_add_names_the_bulk_reduce_types():
    with pytest.raises(ValueError, match=r"jax_tma\.scatter: method='tma' adds with "
                                         r"cp\.reduce\.async\.bulk, which has no add for int16"):
        jax_tma.scatter(jnp.ones((5, 8), jnp.int16), jnp.array([0]), jnp.ones((1, 8), jnp.int16),
                        mode="add", method="tma")


def test_deterministic_with_tma_is_an_error():
    with pytest.raises(ValueError, match=r"jax_tma\.scatter: deterministic=True applies updates in "
                                         r"index order with the SIMT kernel; method='tma' cannot"):
        jax_tma.scatter(jnp.ones((4, 4)), jnp.array([0]), jnp.ones((1, 4)), mode="add",
                        deterministic=True, method="tma")


def test_tma_on_a_gpu_without_tma_names_the_compute_capability(monkeypatch):
    monkeypatch.setattr(_devices, "gpu_compute_capabilities", lambda: [(8, 0)])
    f = jax.jit(functools.partial(jax_tma.gather, method="tma"))
    with pytest.raises(RuntimeError, match=r"jax_tma\.gather: method='tma' needs TMA, but device "
                                           r"0 has compute capability 8\.0"):
        f.trace(jnp.ones((4, 4)), jnp.array([0])).lower(lowering_platforms=("cuda",))
    g = jax.jit(functools.partial(jax_tma.scatter, method="tma"))
    with pytest.raises(RuntimeError, match=r"jax_tma\.scatter: method='tma' needs TMA"):
        g.trace(jnp.ones((4, 4)), jnp.array([0]), jnp.ones((1, 4))).lower(
            lowering_platforms=("cuda",))
    for method in ("auto", "simt"):
        h = jax.jit(functools.partial(jax_tma.gather, method=method))
        assert "jax_tma_gather" in h.trace(jnp.ones((4, 4)), jnp.array([0])).lower(
            lowering_platforms=("cuda",)).as_text()


# ---- bad input reaching the C++ handlers directly (e.g. exported HLO) --------------

def fill_words(*fills) -> np.ndarray:
    """The "fill" attribute of a raw call: each fill's bytes (a NumPy
    scalar of its table's dtype) repeated to 16 bytes (ffi/fill.h)."""
    return _lowering.fill_attr([np.asarray(f).tobytes() for f in fills])


def raw_gather(x, idx, out_shape, out_dtype=None, **attrs):
    call = jax.ffi.ffi_call("jax_tma_gather", jax.ShapeDtypeStruct(out_shape, out_dtype or x.dtype),
                            has_side_effect=True)
    base = dict(axis=np.int64(0), batch=np.int64(0), fill=fill_words(np.zeros((), x.dtype)),
                method="auto")
    base.update(attrs)
    return jax.jit(lambda a, i: call(i, a, **base))(on_cpu(x), on_cpu(idx))


def raw_scatter(x, idx, upd, order=None, out_shape=None, out_dtype=None, **attrs):
    order = np.zeros((0,), np.int32) if order is None else order
    call = jax.ffi.ffi_call("jax_tma_scatter", jax.ShapeDtypeStruct(
        out_shape or x.shape, out_dtype or x.dtype), has_side_effect=True)
    base = dict(axis=np.int64(0), batch=np.int64(0), mode="set", deterministic=False,
                method="auto")
    base.update(attrs)
    return jax.jit(lambda *a: call(*a, **base))(*map(on_cpu, (idx, order, x, upd)))


X = np.arange(24, dtype=np.float32).reshape(4, 3, 2)
IDX = np.array([1, -1, 7], np.int32)


@pytest.mark.parametrize("kwargs,msg", [
    (dict(method="bulk"), r"method must be one of 'auto', 'tma', 'simt', got 'bulk'"),
    (dict(axis=np.int64(3)), r"axis 3 is outside \[0, 2\] for x of rank 3"),
    (dict(batch=np.int64(1)), r"batch 1 is outside \[0, min\(axis, indices rank\)\] = \[0, 0\]"),
    (dict(out_shape=(3, 3)), r"output has rank 2; expected 3 \(x rank 3 - 1 \+ indices rank 1 - "
                             r"batch 0\)"),
    (dict(out_shape=(3, 3, 3)), r"output dim 2 is 3; expected 2 \(x\.shape\[:axis\] \+ "
                                r"indices\.shape\[batch:\] \+ x\.shape\[axis\+1:\]\)"),
    (dict(out_dtype=np.int32), r"output element type s32 differs from input element type f32"),
    (dict(fill=np.zeros(3, np.int64)), r"fill holds 3 int64 words; expected 2 per output, 2 in "
                                       r"all"),
    (dict(fill=np.array([1, 1], np.int64)), r"fill is not one 4-byte element repeated to 16 "
                                            r"bytes \(words 1, 1\)"),
    (dict(idx=np.array([1.0], np.float32)), r"indices must be integers, got element type f32"),
])
def test_gather_handler_rejects(kwargs, msg):
    idx = kwargs.pop("idx", IDX)
    out_shape = kwargs.pop("out_shape", (3, 3, 2))
    with pytest.raises(Exception, match=r"jax_tma\.gather: " + msg):
        raw_gather(X, idx, out_shape, **kwargs)


def test_gather_handler_batch_dims():
    x = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    idx = np.array([[2, 0], [1, -1]], np.int32)
    y = raw_gather(x, idx, (2, 2, 4), axis=np.int64(1), batch=np.int64(1))
    assert_bits_equal(y, np.stack([x[0][[2, 0]], x[1][[1, 2]]]))
    with pytest.raises(Exception, match=r"jax_tma\.gather: indices dim 0 = 3 differs from x dim 0 "
                                        r"= 2 \(both are batch dims\)"):
        raw_gather(x, np.zeros((3, 2), np.int32), (2, 2, 4), axis=np.int64(1), batch=np.int64(1))


def test_gather_handler_rejects_a_0d_x():
    with pytest.raises(Exception, match=r"jax_tma\.gather: x must have rank >= 1, got a 0-d"):
        raw_gather(np.float32(1), IDX, (3,))


def test_gather_handler_rejects_sub_byte():
    x = np.ones((4, 2), jnp.int4)
    with pytest.raises(Exception, match=r"jax_tma\.gather: sub-byte element type s4 must be "
                                        r"widened before the call"):
        raw_gather(x, IDX, (3, 2))


U = np.ones((3, 3, 2), np.float32)


@pytest.mark.parametrize("kwargs,msg", [
    (dict(mode="max"), r"mode must be one of 'set', 'add', got 'max'"),
    (dict(method="x"), r"method must be one of 'auto', 'tma', 'simt', got 'x'"),
    (dict(upd=np.ones((3, 3), np.float32)), r"updates has rank 2; expected 3"),
    (dict(upd=np.ones((2, 3, 2), np.float32)), r"updates dim 0 is 2; expected 3"),
    (dict(upd=np.ones((3, 3, 2), np.float64)), r"output element type f64 differs from input "
                                               r"element type f32"),
    (dict(out_shape=(4, 3, 1)), r"the output's shape differs from x's"),
    (dict(out_dtype=np.int32), r"output element type s32 differs from input element type f32"),
    (dict(deterministic=True), r"order must be 3 s32 or s64 row numbers \(one per index\), got 0 "
                               r"of s32"),
    (dict(deterministic=True, order=np.zeros(3, np.float32)), r"order must be 3 s32 or s64"),
    (dict(order=np.zeros(3, np.int32)), r"order must be 0 elements without deterministic, got 3"),
])
def test_scatter_handler_rejects(kwargs, msg):
    upd = kwargs.pop("upd", U)
    with pytest.raises(Exception, match=r"jax_tma\.scatter: " + msg):
        raw_scatter(X, IDX, upd, **kwargs)


def test_scatter_handler_rejects_an_unsummable_add():
    x = np.ones((4, 2), np.bool_)
    with pytest.raises(Exception, match=r"jax_tma\.scatter: mode 'add' cannot sum element type "
                                        r"pred \(integer, f16, bf16, f32, f64, c64 or c128\)"):
        raw_scatter(x, IDX, np.ones((3, 2), np.bool_), mode="add")


def test_scatter_handler_copies_x_when_not_aliased():
    y = raw_scatter(X, IDX, U)
    want = X.copy()
    want[[1, -1]] = 1
    assert_bits_equal(y, want)
    y = raw_scatter(X, IDX, U, mode="add", deterministic=True, order=np.array([0, 1, 2], np.int32))
    want = X.copy()
    want[[1, -1]] += 1
    assert_bits_equal(y, want)



# ---- several tables through one index array ----------------------------------------

# Tables sharing x.shape[:axis + 1] with their own dtypes and slab dims (a
# sub-byte one widened around the call).
TABLE_SETS = [
    [((6, 4, 8), jnp.bfloat16), ((6, 4, 8), np.float32)],
    [((6, 3), np.int8), ((6, 5, 2), np.float64), ((6,), jnp.int4)],
]


def tables_for(rng, shapes):
    return [random_array(rng, shape, dtype) for shape, dtype in shapes]


def take_np(x, idx, axis, fill=0):
    """jnp.take(x, idx, axis, mode="fill") in NumPy, NaN payloads kept."""
    x = np.asarray(x)
    n = x.shape[axis]
    w = np.where(idx < 0, idx + n, idx)
    inside = (w >= 0) & (w < n)
    out = np.take(x, np.where(inside, w, 0), axis=axis)
    mask = inside.reshape((1,) * axis + idx.shape + (1,) * (x.ndim - axis - 1))
    return np.where(mask, out, np.asarray(fill).astype(x.dtype))


@pytest.mark.parametrize("shapes", TABLE_SETS, ids=["kv", "mixed"])
@pytest.mark.parametrize("idx_shape", [(), (0,), (7,), (2, 3)], ids=str)
@pytest.mark.parametrize("method", METHODS)
def test_gather_of_tables_matches_take_per_table(rng, shapes, idx_shape, method):
    xs = tables_for(rng, shapes)
    idx = indices_for(rng, 6, idx_shape)
    tma_bad = method == "tma" and any(not tma_ok(x) for x in xs)
    f = jax.jit(functools.partial(jax_tma.gather, fill=3, method=method))
    if tma_bad:
        with pytest.raises(ValueError, match=r"jax_tma\.gather: table \d: method='tma' moves "
                                             r"slabs of a multiple of 16"):
            f(list(map(on_cpu, xs)), on_cpu(idx))
        return
    ys = f(list(map(on_cpu, xs)), on_cpu(idx))
    assert isinstance(ys, tuple) and len(ys) == len(xs)
    for y, x in zip(ys, xs):
        assert_bits_equal(y, take_np(x, idx, 0, 3))
    # One table in a tuple gives a tuple of one.
    (one,) = jax_tma.gather((on_cpu(xs[0]),), on_cpu(idx), fill=3, method=method)
    assert_bits_equal(one, ys[0])


def tma_ok(x) -> bool:
    return math.prod(x.shape[1:]) * np.dtype(x.dtype).itemsize % 16 == 0


@pytest.mark.parametrize("axis", [1, -2])
def test_gather_of_tables_along_an_inner_axis(rng, axis):
    xs = [random_array(rng, (2, 5, 3), np.int16), random_array(rng, (2, 5, 2, 2), np.uint8)]
    if axis == -2:  # -2 is dim 1 of the first table but dim 2 of the second
        with pytest.raises(ValueError, match=r"jax_tma\.gather: the tables must agree in "
                                             r"x\.shape\[:axis \+ 1\] \(axis=-2\): table 0 has "
                                             r"\(2, 5\), table 1 \(2, 5, 2\)"):
            jax_tma.gather(xs, np.array([0]), axis=axis)
        xs = [xs[0], xs[1].reshape(2, 5, 4)]
    idx = indices_for(rng, 5, (4,))
    ys = jax.jit(functools.partial(jax_tma.gather, axis=axis))(xs, idx)
    for y, x in zip(ys, xs):
        assert_bits_equal(y, take_np(x, idx, 1))


@pytest.mark.parametrize("mode,deterministic", [("set", False), ("add", False), ("add", True)])
def test_scatter_of_tables_matches_xla_per_table(rng, mode, deterministic):
    # Small integers: no NaN whose payload XLA's reference might change.
    def small(shape, dtype):
        return rng.integers(-50, 50, shape).astype(dtype)

    xs = [small((6, 4, 8), jnp.bfloat16), small((6, 3), np.int32), small((6, 2), np.complex64)]
    idx = indices_for(rng, 6, (2, 4))
    us = [small((2, 4) + x.shape[1:], x.dtype) for x in xs]
    f = jax.jit(functools.partial(jax_tma.scatter, mode=mode, deterministic=deterministic))
    ys = f(list(map(on_cpu, xs)), on_cpu(idx), list(map(on_cpu, us)))
    assert isinstance(ys, tuple) and len(ys) == 3
    for y, x, u in zip(ys, xs, us):
        ref = jax.jit(lambda a, i, v: getattr(a.at[i], mode)(v, mode="drop"))
        assert_bits_equal(y, ref(on_cpu(x), on_cpu(idx), on_cpu(u)))


@pytest.mark.parametrize("axis,shapes", [
    (0, TABLE_SETS[0]), (0, TABLE_SETS[1]),
    (1, [((2, 6, 3), np.int16), ((2, 6), np.uint8)]),
    (-1, [((2, 6), jnp.bfloat16), ((2, 6), jnp.int4)]),
], ids=["kv", "mixed", "axis1", "axis-1"])
@pytest.mark.parametrize("idx_shape", [(), (0,), (7,), (2, 3)], ids=str)
@pytest.mark.parametrize("mode,deterministic", [("set", False), ("add", False), ("add", True)])
def test_scatter_of_tables_every_axis_and_index_shape(rng, axis, shapes, idx_shape, mode,
                                                      deterministic):
    # Small integers (sums exact in every dtype); the sub-byte table, which
    # cannot add, as int8 under "add".
    def small(shape, dtype):
        if mode == "add" and np.dtype(dtype).name in SUB_BYTE_BITS:
            dtype = np.int8
        return rng.integers(-7, 8, shape).astype(dtype)

    xs = [small(shape, dtype) for shape, dtype in shapes]
    a = axis % xs[0].ndim
    idx = indices_for(rng, xs[0].shape[a], idx_shape)
    us = [small(x.shape[:a] + idx_shape + x.shape[a + 1:], x.dtype) for x in xs]
    f = jax.jit(functools.partial(jax_tma.scatter, axis=axis, mode=mode,
                                  deterministic=deterministic))
    ys = f(list(map(on_cpu, xs)), on_cpu(idx), list(map(on_cpu, us)))
    assert isinstance(ys, tuple) and len(ys) == len(xs)
    for y, x, u in zip(ys, xs, us):
        ref = getattr(on_cpu(x).at[at(a, on_cpu(idx))], mode)(on_cpu(u), mode="drop")
        assert_bits_equal(y, ref)


def test_scatter_of_donated_tables_makes_no_copy(rng):
    xs = [on_cpu(random_array(rng, (64, 32), np.float32)),
          on_cpu(random_array(rng, (64, 8), jnp.bfloat16))]
    idx = on_cpu(np.array([3, 9, -1], np.int32))
    us = [on_cpu(random_array(rng, (3,) + x.shape[1:], x.dtype)) for x in xs]
    donated = jax.jit(jax_tma.scatter, donate_argnums=0)
    text = donated.lower(xs, idx, us).compile().as_text()
    # Each output is its table's buffer, in the call (operands: indices,
    # order, the tables, the updates) and in the program; no copy of either.
    assert "output_to_operand_aliasing={{0}: (2, {}), {1}: (3, {})}" in text
    program = re.search(r"input_output_alias=\{.*?\) \}", text).group(0)
    assert "{0}: (0, {}" in program and "{1}: (1, {}" in program, program
    assert not _copies(text), _copies(text)
    wants = [np.asarray(x).copy() for x in xs]
    for w, u in zip(wants, us):
        w[[3, 9, -1]] = np.asarray(u)
    # (Whether the runtime then takes each buffer is its business: one put
    # from NumPy may share NumPy's memory; on the GPU machine's CPU client
    # one of these two was kept and copied.)
    ys = donated(xs, idx, us)
    for y, w in zip(ys, wants):
        assert_bits_equal(y, w)


@pytest.mark.parametrize("in_axes", [((0, 0), None), ((None, None), 0), ((0, 0), 0),
                                     ((0, None), None), ((None, 0), 0)], ids=str)
def test_gather_of_tables_under_vmap(rng, in_axes):
    b = 3
    xs = [random_array(rng, (b, 5, 4), np.float32), random_array(rng, (b, 5, 2), np.int8)]
    idx = indices_for(rng, 5, (b, 6))
    args = ([x if d is not None else x[0] for x, d in zip(xs, in_axes[0])],
            idx if in_axes[1] is not None else idx[0])
    f = jax.vmap(functools.partial(jax_tma.gather, fill=-1), in_axes=(list(in_axes[0]),
                                                                     in_axes[1]))
    ys = jax.jit(f)(*args)
    for t, y in enumerate(ys):
        axes = (in_axes[0][t], in_axes[1])
        if axes == (None, None):  # untouched by the vmap: broadcast over its entries
            want = np.broadcast_to(take_np(args[0][t], args[1], 0, -1), y.shape)
        else:
            want = np.stack([take_np(args[0][t] if axes[0] is None else args[0][t][k],
                                     args[1] if axes[1] is None else args[1][k], 0, -1)
                             for k in range(b)])
        assert_bits_equal(y, want)
    # One call where the vmap reaches both tables or neither; a call each else.
    want = 1 if in_axes[0][0] == in_axes[0][1] else 2
    assert _prims(f, *args).count("jax_tma_gather") == want


@pytest.mark.parametrize("in_axes", [((0, 0), None, (0, 0)), ((None, None), 0, (None, None)),
                                     ((0, None), None, (0, None)), ((0, None), 0, (0, None)),
                                     ((None, None), None, (0, None))], ids=str)
def test_scatter_of_tables_under_vmap(rng, in_axes):
    b = 3
    xs = [random_array(rng, (b, 6, 4), np.int32), random_array(rng, (b, 6, 2), np.int16)]
    idx = indices_for(rng, 6, (b, 5))
    us = [random_array(rng, (b, 5) + x.shape[2:], x.dtype) for x in xs]
    pick = lambda a, d: a if d is not None else a[0]  # noqa: E731
    args = ([pick(x, d) for x, d in zip(xs, in_axes[0])], pick(idx, in_axes[1]),
            [pick(u, d) for u, d in zip(us, in_axes[2])])
    args = jax.tree.map(lambda a: on_cpu(jnp.asarray(a)), args)
    spec = (list(in_axes[0]), in_axes[1], list(in_axes[2]))
    f = jax.vmap(functools.partial(jax_tma.scatter, mode="add"), in_axes=spec)
    ys = jax.jit(f)(*args)
    for t, y in enumerate(ys):
        axes = (in_axes[0][t], in_axes[1], in_axes[2][t])
        ref = jax.jit(lambda a, i, v: a.at[i].add(v, mode="drop"))
        if axes == (None, None, None):  # untouched by the vmap: broadcast
            want = np.broadcast_to(ref(args[0][t], args[1], args[2][t]), y.shape)
        else:
            want = jax.vmap(ref, in_axes=axes)(args[0][t], args[1], args[2][t])
        assert_bits_equal(y, want)
    # One call where the vmap reaches both tables (through the indices, the
    # table or its updates) or neither; a call each else.
    reached = {in_axes[1] is not None or in_axes[0][t] is not None or in_axes[2][t] is not None
               for t in range(2)}
    assert _prims(f, *args).count("jax_tma_scatter") == len(reached)


def test_grad_of_tables(rng):
    xs = [on_cpu(jnp.asarray(rng.standard_normal((6, 3)))),
          on_cpu(jnp.asarray(rng.standard_normal((6, 2, 2))))]
    idx = on_cpu(jnp.array([1, 1, -1, 9, 0]))
    ws = [jnp.asarray(rng.standard_normal((5,) + x.shape[1:])) for x in xs]

    def loss(f, a, b):
        return sum((y * w).sum() for y, w in zip(f((a, b)), ws))

    g = jax.jit(jax.grad(lambda a, b: loss(lambda t: jax_tma.gather(t, idx, fill=5.0), a, b),
                         argnums=(0, 1)))(*xs)
    want = jax.grad(lambda a, b: loss(lambda t: [take_ref(x, idx, 0, 5.0) for x in t], a, b),
                    argnums=(0, 1))(*xs)
    for got, w in zip(g, want):
        np.testing.assert_allclose(got, w, rtol=1e-12)
    check_grads(lambda a, b: tuple(jnp.sin(y) for y in jax_tma.gather((a, b), idx)), xs,
                order=2, modes=("fwd", "rev"))
    us = [jnp.asarray(rng.standard_normal((5,) + x.shape[1:])) for x in xs]
    for mode in ("set", "add"):
        check_grads(lambda a, b, u, v: jax_tma.scatter((a, b), idx, (u, v), mode=mode),
                    (*xs, *us), order=1, modes=("fwd", "rev"))
        # Only one table's updates differentiated: the other table's primal
        # still goes through the same call.
        gu = jax.grad(lambda u: sum(y.sum() for y in jax_tma.scatter(
            (xs[0], xs[1]), idx, (u, us[1]), mode=mode)))(us[0])
        ref = jax.grad(lambda u: getattr(xs[0].at[idx], mode)(u, mode="drop").sum())(us[0])
        np.testing.assert_allclose(gu, ref, rtol=1e-12)


@pytest.mark.parametrize("call,err,msg", [
    (lambda: jax_tma.gather((), np.array([0])), ValueError,
     r"jax_tma\.gather: x must be an array or a tuple of 1 to 8 arrays \(tables sharing the "
     r"indices\), got 0 tables"),
    (lambda: jax_tma.gather([np.zeros((2, 1))] * 9, np.array([0])), ValueError,
     r"got 9 tables"),
    (lambda: jax_tma.gather((np.zeros((2, 1)), 1.0), np.array([0])), ValueError,
     r"jax_tma\.gather: table 1: x must have rank >= 1, got a 0-d array"),
    (lambda: jax_tma.gather((np.zeros((2, 1)), np.zeros((3, 1))), np.array([0])), ValueError,
     r"jax_tma\.gather: the tables must agree in x\.shape\[:axis \+ 1\] \(axis=0\): table 0 "
     r"has \(2,\), table 1 \(3,\)"),
    (lambda: jax_tma.gather((np.zeros((2, 1)), np.zeros((2,))), np.array([0]), axis=1),
     ValueError, r"jax_tma\.gather: table 1: axis 1 is out of range for x of rank 1"),
    (lambda: jax_tma.scatter((np.zeros((2, 1)),), np.array([0]), np.zeros((1, 1))), TypeError,
     r"jax_tma\.scatter: x is 1 tables, so updates must be a tuple of 1 arrays \(one per "
     r"table\), got ndarray"),
    (lambda: jax_tma.scatter((np.zeros((2, 1)), np.zeros((2, 3))), np.array([0]),
                             (np.zeros((1, 1)),)), TypeError,
     r"updates must be a tuple of 2 arrays \(one per table\), got 1 arrays"),
    (lambda: jax_tma.scatter((np.zeros((2, 1)), np.zeros((2, 3))), np.array([0]),
                             (np.zeros((1, 1)), np.zeros((1, 2)))), ValueError,
     r"jax_tma\.scatter: table 1: updates have shape \(1, 2\), which does not broadcast to "
     r"\(1, 3\)"),
    (lambda: jax_tma.scatter((np.zeros((2, 1)), np.zeros((2, 1), bool)), np.array([0]),
                             (np.zeros((1, 1)), np.zeros((1, 1), bool)), mode="add"), TypeError,
     r"jax_tma\.scatter: table 1: mode='add' cannot sum dtype bool"),
    (lambda: jax_tma.scatter((np.zeros((2, 4), np.float32), np.zeros((2, 4), np.int8)),
                             np.array([0]), (np.zeros((1, 4), np.float32),
                                             np.zeros((1, 4), np.int8)), method="tma"),
     ValueError, r"jax_tma\.scatter: table 1: method='tma' moves slabs of a multiple of 16"),
])
def test_tables_validation(call, err, msg):
    with pytest.raises(err, match=msg):
        call()


def raw_tables(target, operands, results, **attrs):
    call = jax.ffi.ffi_call(target, [jax.ShapeDtypeStruct(*r) for r in results],
                            has_side_effect=True)
    base = dict(axis=np.int64(0), batch=np.int64(0), method="auto")
    if target == "jax_tma_scatter":
        base.update(mode="set", deterministic=False)
    else:
        base.update(fill=fill_words(*[np.float32(0)] * len(results)))
    base.update(attrs)
    return jax.jit(lambda *a: call(*a, **base))(*map(on_cpu, operands))


def test_handlers_check_the_table_count_and_name_the_table():
    with pytest.raises(Exception, match=r"jax_tma\.gather: takes indices, n tables for n "
                                        r"outputs \(1 <= n <= 8\); got 4 operands and 2 "
                                        r"outputs"):
        raw_tables("jax_tma_gather", [IDX, X, X, X], [((3, 3, 2), np.float32)] * 2)
    with pytest.raises(Exception, match=r"got 10 operands and 9 outputs"):
        raw_tables("jax_tma_gather", [IDX] + [X] * 9, [((3, 3, 2), np.float32)] * 9)
    with pytest.raises(Exception, match=r"jax_tma\.gather: table 1: output dim 1 is 4; "
                                        r"expected 3"):
        raw_tables("jax_tma_gather", [IDX, X, X],
                   [((3, 3, 2), np.float32), ((3, 4, 2), np.float32)])
    with pytest.raises(Exception, match=r"jax_tma\.gather: table 1: fill is not one 4-byte "
                                        r"element repeated to 16 bytes \(words 0, 1\)"):
        raw_tables("jax_tma_gather", [IDX, X, X], [((3, 3, 2), np.float32)] * 2,
                   fill=np.array([0, 0, 0, 1], np.int64))
    order = np.zeros((0,), np.int32)
    with pytest.raises(Exception, match=r"jax_tma\.scatter: takes indices, order, n tables and n "
                                        r"updates for n outputs \(1 <= n <= 8\); got 5 operands "
                                        r"and 1 outputs"):
        raw_tables("jax_tma_scatter", [IDX, order, X, X, U], [(X.shape, np.float32)])
    with pytest.raises(Exception, match=r"jax_tma\.scatter: table 1: updates dim 0 is 2; "
                                        r"expected 3"):
        raw_tables("jax_tma_scatter", [IDX, order, X, X, U, U[:2]], [(X.shape, np.float32)] * 2)
    ys = raw_tables("jax_tma_gather", [IDX, X, X[:, :, :1]],
                    [((3, 3, 2), np.float32), ((3, 3, 1), np.float32)],
                    fill=fill_words(np.float32(0), np.float32(7)))
    assert_bits_equal(ys[1], np.asarray(take_ref(X[:, :, :1], IDX, 0, 7)))


# ---- updates of another dtype: converted as x.at[].set/.add converts them ----------

CASTS = [
    (np.float32, jnp.bfloat16, "set"), (np.float32, jnp.bfloat16, "add"),
    (jnp.bfloat16, np.float32, "add"), (np.float32, np.float64, "set"),
    (np.int32, np.float32, "add"), (np.int64, np.float64, "set"), (np.bool_, np.int32, "add"),
    (jnp.float8_e4m3fn, np.float32, "add"), (jnp.int4, np.int8, "add"),
    (np.uint8, np.int16, "set"), (np.complex64, np.float64, "add"),
]


@pytest.mark.parametrize("x_dtype,u_dtype,mode", CASTS, ids=str)
def test_updates_cast_as_at(rng, x_dtype, u_dtype, mode):
    # jnp promotes x and the updates to their common type, scatters there
    # and converts back to x's dtype, warning (FutureWarning) where the
    # updates cannot be cast safely; so does jax_tma.scatter, through the
    # same helpers.
    def values(shape, dtype):
        if jnp.issubdtype(dtype, jnp.inexact):
            return rng.standard_normal(shape).astype(dtype)  # numbers: sums, not NaN payloads
        return random_array(rng, shape, dtype)

    x = on_cpu(values((6, 4), x_dtype))
    idx = on_cpu(indices_for(rng, 6, (5,)))
    u = on_cpu(values((5, 4), u_dtype))
    with warnings.catch_warnings(record=True) as theirs:
        warnings.simplefilter("always")
        try:
            want = getattr(x.at[idx], mode)(u, mode="drop")
        except jax.dtypes.TypePromotionError:  # no implicit promotion (8-bit floats)
            with pytest.raises(jax.dtypes.TypePromotionError):
                jax_tma.scatter(x, idx, u, mode=mode)
            return
    with warnings.catch_warnings(record=True) as ours:
        warnings.simplefilter("always")
        got = jax_tma.scatter(x, idx, u, mode=mode)
    assert_bits_equal(got, want)
    future = [w for w in ours if issubclass(w.category, FutureWarning)]
    assert len(future) == sum(issubclass(w.category, FutureWarning) for w in theirs)
    for w in future:
        assert re.match(r"jax_tma\.scatter: updates of dtype \S+ cannot be cast safely to x's "
                        r"dtype \S+ \(jax_numpy_dtype_promotion=standard\)", str(w.message))
        assert w.filename == __file__  # the warning points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        assert_bits_equal(jax.jit(functools.partial(jax_tma.scatter, mode=mode))(x, idx, u), want)


def test_safe_cast_is_silent_and_strict_promotion_refuses(rng):
    x = jnp.zeros((4, 2), jnp.float32)
    u = jnp.ones((1, 2), jnp.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_bits_equal(jax_tma.scatter(x, jnp.array([2]), u), x.at[jnp.array([2])].set(u))
    with jax.numpy_dtype_promotion("strict"):
        with pytest.raises(jax.dtypes.TypePromotionError):
            x.at[jnp.array([2])].set(u)
        with pytest.raises(jax.dtypes.TypePromotionError):
            jax_tma.scatter(x, jnp.array([2]), u)


def test_same_dtype_scatter_stays_in_place(rng):
    # Conversions happen only for another dtype: a donated x of the updates'
    # dtype is still written in place.
    x = on_cpu(random_array(rng, (16, 4), np.float32))
    text = jax.jit(jax_tma.scatter, donate_argnums=0).lower(
        x, np.array([3]), 1.5).compile().as_text()
    assert "output_to_operand_aliasing" in text and not _copies(text)


def test_empty_scatter_of_another_dtype_returns_x(rng):
    # As x.at[] (which returns x before converting it): an int64 x with
    # float updates keeps every bit.
    x = np.array([[2**62 + 1, -3]], np.int64)
    with pytest.warns(FutureWarning, match=r"jax_tma\.scatter: updates of dtype float64"):
        y = jax_tma.scatter(x, np.zeros((0,), np.int32), np.zeros((0, 2)))
    assert_bits_equal(y, x)
    with pytest.warns(FutureWarning):
        want = jnp.asarray(x).at[np.zeros((0,), np.int32)].set(np.zeros((0, 2)))
    assert_bits_equal(y, want)


def test_deterministic_scatter_of_2_pow_31_rows_needs_x64():
    # Its stable order numbers the rows: past int32 without jax_enable_x64,
    # the call says so when it is lowered (shapes alone: nothing is
    # allocated).
    x = jax.ShapeDtypeStruct((2**31, 1), jnp.float32)
    i = jax.ShapeDtypeStruct((3,), jnp.int32)
    u = jax.ShapeDtypeStruct((3, 1), jnp.float32)
    f = jax.jit(lambda x, i, u: jax_tma.scatter(x, i, u, deterministic=True))
    with jax.enable_x64(False), pytest.raises(
            ValueError, match=r"^jax_tma\.scatter: 2147483648 rows or indices need int64 row "
                              r"numbers; enable jax_enable_x64"):
        f.lower(x, i, u)


# ---- every float type: adds and gradients ------------------------------------------

FLOAT_DTYPES = [d for d in ALL_DTYPES if jnp.issubdtype(d, jnp.floating)]
NATIVE_ADD = ("float16", "bfloat16", "float32", "float64")


def small_values(rng, shape, dtype):
    """Values every float type holds exactly (powers of two; positive for
    float8_e8m0fnu, which has no sign)."""
    v = 2.0 ** rng.integers(-2, 2, shape)
    if np.dtype(dtype).name != "float8_e8m0fnu":
        v *= rng.choice([-1.0, 1.0], shape)
    return v.astype(dtype)


def summed_once(x_f32, idx, u, dtype):
    """x plus the updates of each row, summed in float32 in index order and
    rounded to `dtype` once, by XLA's convert."""
    acc = np.array(x_f32, np.float32)
    for k, r in enumerate(exact_rows(idx, acc.shape[0])):
        if r >= 0:
            acc[r] += np.asarray(u[k], np.float32)
    return np.asarray(jnp.asarray(acc).astype(dtype))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_gather_grad_every_float_dtype(rng, dtype):
    x = on_cpu(small_values(rng, (6, 3), dtype))
    idx = np.array([1, 4, 1, -1, 9, 1])  # row 1 three times, row 5 twice
    ct = small_values(rng, (6, 3), dtype)
    _, vjp = jax.vjp(lambda a: jax_tma.gather(a, idx), x)
    (g,) = vjp(on_cpu(ct))
    if dtype.name in NATIVE_ADD:  # summed in the dtype, in index order, as XLA's CPU scatter
        assert_bits_equal(g, jax.vjp(lambda a: take_ref(a, idx, 0), x)[1](on_cpu(ct))[0])
    else:
        # Summed in float32, rounded once (XLA rounds after every add).
        assert_bits_equal(g, summed_once(np.zeros((6, 3), np.float32), idx, ct, dtype))
    # Without duplicates there is one add per row: jnp's bits (float8_e8m0fnu
    # has no 0, so jnp's zeros are NaN and so is every sum of its own).
    unique = np.array([3, 0, -2])
    _, vjp = jax.vjp(lambda a: jax_tma.gather(a, unique), x)
    _, ref = jax.vjp(lambda a: take_ref(a, unique, 0), x)
    if dtype.name != "float8_e8m0fnu":
        assert_bits_equal(vjp(on_cpu(ct[:3]))[0], ref(on_cpu(ct[:3]))[0])


@pytest.mark.parametrize("dtype", [d for d in FLOAT_DTYPES if d.name not in NATIVE_ADD], ids=str)
@pytest.mark.parametrize("deterministic", [False, True])
def test_scatter_add_of_float_types_the_handlers_cannot_sum(rng, dtype, deterministic):
    x = random_array(rng, (7, 3), dtype)  # NaN payloads and all: untouched rows keep their bits
    idx = np.array([2, 5, 2, -1, 9, 2])  # rows 2 and 6 take several updates, row 9 none
    u = small_values(rng, (6, 3), dtype)
    y = np.asarray(jax.jit(functools.partial(jax_tma.scatter, mode="add",
                                             deterministic=deterministic))(x, idx, u))
    touched = np.isin(np.arange(7), exact_rows(idx, 7))
    assert_bits_equal(y[~touched], x[~touched])
    want = summed_once(np.asarray(jnp.asarray(x).astype(np.float32)), idx, u, dtype)
    np.testing.assert_array_equal(y[touched].astype(np.float32),
                                  want[touched].astype(np.float32))  # NaN equals NaN
    # One update per row: x.at[].add's value (it rounds after each add).
    unique = np.array([4, 0, -2])
    got = jax_tma.scatter(x, unique, u[:3], mode="add")
    want = jnp.asarray(x).at[unique].add(u[:3])
    np.testing.assert_array_equal(np.asarray(got).astype(np.float32),
                                  np.asarray(want).astype(np.float32))


# float8_e8m0fnu has no 0: the zeros of its cotangents are a convention (jnp's
# are NaN), and so are sums with them.
@pytest.mark.parametrize("dtype", [d for d in FLOAT_DTYPES if d.name not in NATIVE_ADD
                                   and d.name != "float8_e8m0fnu"], ids=str)
@pytest.mark.parametrize("mode", ["set", "add"])
def test_scatter_grads_of_float_types_the_handlers_cannot_sum(rng, dtype, mode):
    x = on_cpu(small_values(rng, (5, 2), dtype))
    u = on_cpu(small_values(rng, (3, 2), dtype))
    idx = np.array([1, -1, 1])
    ct = on_cpu(small_values(rng, (5, 2), dtype))
    _, vjp = jax.vjp(lambda a, v: jax_tma.scatter(a, idx, v, mode=mode), x, u)
    _, ref = jax.vjp(lambda a, v: getattr(a.at[idx], mode)(v, mode="drop"), x, u)
    for got, want in zip(vjp(ct), ref(ct)):
        np.testing.assert_array_equal(np.asarray(got).astype(np.float32),
                                      np.asarray(want).astype(np.float32))


@pytest.mark.parametrize("dtype", [d for d in FLOAT_DTYPES if d.name not in NATIVE_ADD], ids=str)
def test_scatter_add_grad_of_x_is_its_cotangent(rng, dtype):
    # As x.at[].add's: bit for bit, -0 and float8_e8m0fnu (no 0) included;
    # forward mode and vmap of the float32 sums work too.
    x = on_cpu(small_values(rng, (5, 2), dtype))
    u = on_cpu(small_values(rng, (4, 2), dtype))
    idx = np.array([1, 1, -1, 7])
    ct = on_cpu(random_array(rng, (5, 2), dtype))
    _, vjp = jax.vjp(lambda a, v: jax_tma.scatter(a, idx, v, mode="add"), x, u)
    assert_bits_equal(vjp(ct)[0], ct)
    tx = small_values(rng, (5, 2), dtype)
    tx[0, 0] = -0.0  # numbers (arithmetic quiets NaN payloads), -0 among them
    _, ty = jax.jvp(lambda a: jax_tma.scatter(a, idx, u, mode="add"), (x,), (on_cpu(tx),))
    touched = np.isin(np.arange(5), exact_rows(idx, 5))
    if dtype.name != "float8_e8m0fnu":  # whose tangent sums start from NaN, its 0
        assert_bits_equal(np.asarray(ty)[~touched], np.asarray(tx)[~touched])
    xs = jnp.stack([x, x])
    ys = jax.vmap(lambda a: jax_tma.scatter(a, idx, u, mode="add"))(xs)
    assert_bits_equal(ys[1], jax_tma.scatter(x, idx, u, mode="add"))


def test_sub_byte_integer_add_wraps_as_at(rng):
    for dtype in (jnp.int4, jnp.uint4, jnp.int2, jnp.uint2):
        x = random_array(rng, (4, 3), dtype)
        idx = np.array([1, 1, 1, -1, 3])
        u = random_array(rng, (5, 3), dtype)
        got = jax.jit(functools.partial(jax_tma.scatter, mode="add"))(x, idx, u)
        assert_bits_equal(got, jnp.asarray(x).at[idx].add(u))


# ---- shard_map, with its checks of varying mesh axes -------------------------------

def sharded(f, mesh, in_specs, out_specs):
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs))


def ops(lib):
    """Gather and scatter by jax_tma or by jnp, along axis 1."""
    if lib == "jax_tma":
        return (lambda a, i: jax_tma.gather(a, i, axis=1, fill=0.5),
                lambda a, i, v, mode: jax_tma.scatter(a, i, v, axis=1, mode=mode))
    return (lambda a, i: jnp.take(a, i, axis=1, mode="fill", fill_value=0.5),
            lambda a, i, v, mode: getattr(a.at[:, i], mode)(v, mode="drop"))


@pytest.mark.parametrize("mode", ["set", "add"])
def test_grads_under_shard_map(rng, mode):
    # x split over the devices and the indices replicated; the indices split
    # and x replicated (its cotangent summed over the devices, as JAX does
    # for jnp.take); x split and its updates replicated: the grads of x and
    # updates are jnp's.
    mesh = cpu_mesh((8,), ("i",), jax.sharding.AxisType.Auto)
    x = rng.standard_normal((8, 6, 3))
    u = rng.standard_normal((8, 4, 3))
    idx = np.array([[1, -1, 9, 1]] * 8) + np.arange(8)[:, None] % 3

    def grads(lib, a, i, v):
        gather, scatter = ops(lib)
        g = jax.grad(lambda b: (gather(b, i[0]) ** 2).sum())(a)
        sx, su = jax.grad(lambda b, w: (jnp.sin(scatter(b, i[0], w, mode))).sum(),
                          argnums=(0, 1))(a, v)
        return g, sx, su

    for in_specs, out_specs in [((P("i"), P(), P("i")), (P("i"),) * 3),
                                ((P(), P("i"), P()), (P(),) * 3),
                                ((P("i"), P(), P()), (P("i"), P("i"), P()))]:
        i = idx if in_specs[1] == P("i") else idx[:1]
        v = u[:1] if in_specs[::2] == (P("i"), P()) else u  # a replicated block's updates
        got = sharded(functools.partial(grads, "jax_tma"), mesh, in_specs, out_specs)(x, i, v)
        want = sharded(functools.partial(grads, "jnp"), mesh, in_specs, out_specs)(x, i, v)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-12)


def test_a_varying_result_needs_varying_out_specs(rng):
    # A result that varies along a mesh axis cannot be returned as replicated:
    # JAX's own error, as for jnp.take (without the checks, device 0's block).
    mesh = cpu_mesh((8,), ("i",), jax.sharding.AxisType.Auto)
    x = rng.standard_normal((8, 6, 3))
    idx = np.arange(8)[:, None] % 6
    u = rng.standard_normal((64, 1, 3))  # a (8, 1, 3) block of updates a device
    for lib in ("jax_tma", "jnp"):
        gather, scatter = ops(lib)
        for f, args, in_specs in [(lambda a, i: gather(a, i[0]), (x, idx), (P(), P("i"))),
                                  (lambda a, v: scatter(a, np.array([2]), v, "set"), (x, u),
                                   (P(), P("i")))]:
            with pytest.raises(ValueError, match=r"out_specs"):
                sharded(f, mesh, in_specs, P())(*args)
    gather, _ = ops("jax_tma")
    y = sharded(lambda a, i: gather(a, i), mesh, (P(), P()), P())(x, idx[0])
    assert_bits_equal(y, np.asarray(take_ref(x, idx[0], 1, 0.5)))


def test_tables_under_shard_map_with_grads(rng):
    # A split table and a replicated one through one call: both results vary.
    mesh = cpu_mesh((4,), ("i",), jax.sharding.AxisType.Auto)
    xs = (rng.standard_normal((4, 6, 2)), rng.standard_normal((1, 6)).astype(np.float32))
    idx = np.array([3, 3, -1])

    def grads(gather, a, b):
        def loss(a, b):
            y0, y1 = gather((a, b))
            return (y0 ** 2).sum() + (y1 ** 3).sum()
        return jax.grad(loss, argnums=(0, 1))(a, b)

    ours = functools.partial(grads, lambda t: jax_tma.gather(t, idx, axis=1))
    theirs = functools.partial(grads, lambda t: [jnp.take(v, idx, axis=1, mode="fill",
                                                          fill_value=0) for v in t])
    got = sharded(ours, mesh, (P("i"), P()), (P("i"), P()))(*xs)
    want = sharded(theirs, mesh, (P("i"), P()), (P("i"), P()))(*xs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)


# ---- explicit meshes: shardings as jnp gives them -------------------------------------

EXPLICIT_CASES = [(P("a"), 1), (P("a", None, "b"), 1), (P(None, None, "b"), 0),
                  (P(None, "b"), 2), (P(("a", "b")), 2)]


def explicit_mesh():
    return cpu_mesh((2, 4), ("a", "b"), jax.sharding.AxisType.Explicit)


def types(tree):
    return [str(jax.typeof(a)) for a in jax.tree.leaves(tree)]


@pytest.mark.parametrize("spec,axis", EXPLICIT_CASES, ids=str)
def test_explicit_mesh_shardings_as_jnp(rng, spec, axis):
    host = rng.standard_normal((8, 16, 12)).astype(np.float32)
    idx = indices_for(rng, host.shape[axis], (2, 3))
    u_host = rng.standard_normal(host.shape[:axis] + (2, 3) + host.shape[axis + 1:])
    u_host = u_host.astype(np.float32)
    with jax.set_mesh(explicit_mesh()):
        x = jax.device_put(host, spec)
        u = jax.device_put(u_host, P(*(tuple(spec) + (None,) * 3)[:axis], None, None,
                                     *(tuple(spec) + (None,) * 3)[axis + 1:3]))
        i = jax.device_put(idx, P())
        gather = jax.jit(lambda a, j: jax_tma.gather(a, j, axis=axis))
        take = jax.jit(lambda a, j: jnp.take(a, j, axis=axis, mode="fill", fill_value=0))
        assert types(gather(x, i)) == types(take(x, i))
        assert_bits_equal(gather(x, i), take(x, i))
        assert_no_collectives(gather.lower(x, i).compile().as_text())
        grad = jax.jit(jax.grad(lambda a, j: (jnp.sin(jax_tma.gather(a, j, axis=axis))).sum()))
        want = jax.jit(jax.grad(lambda a, j: (jnp.sin(take(a, j))).sum()))(x, i)
        assert types(grad(x, i)) == types(want)
        np.testing.assert_allclose(grad(x, i), want, rtol=1e-6)
        assert_no_collectives(grad.lower(x, i).compile().as_text())
        for mode in ("set", "add"):
            scatter = jax.jit(lambda a, j, v: jax_tma.scatter(a, j, v, axis=axis, mode=mode))
            at = jax.jit(lambda a, j, v: getattr(a.at[at_(axis, j)], mode)(v, mode="drop"))
            assert types(scatter(x, i, u)) == types(at(x, i, u)) == [str(jax.typeof(x))]
            assert_no_collectives(scatter.lower(x, i, u).compile().as_text())
            np.testing.assert_allclose(scatter(x, i, u), at(x, i, u), rtol=1e-6)
            # (jnp's own scatter grads refuse explicit shardings in 0.10 to 0.12.)
            gx, gu = jax.jit(jax.grad(lambda a, v: jnp.sin(scatter(a, i, v)).sum(),
                                      argnums=(0, 1)))(x, u)
            assert types((gx, gu)) == types((x, u))
            wx, wu = jax.grad(lambda a, v: jnp.sin(getattr(a.at[at_(axis, idx)], mode)(
                v, mode="drop")).sum(), argnums=(0, 1))(host, u_host)
            np.testing.assert_allclose(gx, wx, rtol=1e-6)
            np.testing.assert_allclose(gu, wu, rtol=1e-6)


def at_(axis, idx):
    return (slice(None),) * axis + (idx,)


def test_explicit_gather_with_split_indices(rng):
    # jnp.take refuses split indices; gather splits its index dims as the
    # indices (each device picks its own indices' slabs), the grad gathers
    # the cotangent's index dims for the scatter-add.
    host = rng.standard_normal((16, 4, 12)).astype(np.float32)
    idx = indices_for(rng, 16, (8, 2))
    with jax.set_mesh(explicit_mesh()):
        x = jax.device_put(host, P(None, None, "b"))
        i = jax.device_put(idx, P("a"))
        f = jax.jit(lambda a, j: jax_tma.gather(a, j))
        assert jax.typeof(f(x, i)).sharding.spec == P("a", None, None, "b")
        assert_no_collectives(f.lower(x, i).compile().as_text())
        assert_bits_equal(f(x, i), take_exact(host, idx))
        g = jax.jit(jax.grad(lambda a, j: (jax_tma.gather(a, j) ** 2).sum()))(x, i)
        assert jax.typeof(g).sharding.spec == P(None, None, "b")
        want = jax.grad(lambda a: (jnp.take(a, idx, axis=0, mode="fill", fill_value=0) ** 2
                                   ).sum())(host)
        np.testing.assert_allclose(g, want, rtol=1e-6)


def test_explicit_mesh_errors(rng):
    host = rng.standard_normal((8, 16, 12)).astype(np.float32)
    with jax.set_mesh(explicit_mesh()):
        x = jax.device_put(host, P("a", "b"))
        other = jax.device_put(host, P("b", "a"))
        idx = jax.device_put(np.arange(8), P("b"))
        u = jnp.zeros((8, 8, 12), np.float32)
        with pytest.raises(ValueError, match=r"jax_tma\.gather: x is split along axis 1 over mesh "
                                             r"axes 'b' \(x is sharded P.*\), but every device "
                                             r"needs that whole dim"):
            jax.jit(lambda a: jax_tma.gather(a, np.arange(3), axis=1))(x)
        with pytest.raises(ValueError, match=r"jax_tma\.scatter: x is split along axis 0"):
            jax.jit(lambda a: jax_tma.scatter(a, np.arange(3), 1.0))(x)
        with pytest.raises(ValueError, match=r"jax_tma\.gather: mesh axis 'b' would split two dims "
                                             r"of the result"):
            jax.jit(lambda a, i: jax_tma.gather(a, i, axis=2))(x, idx)
        with pytest.raises(ValueError, match=r"jax_tma\.scatter: the indices are split over mesh "
                                             r"axes \(sharded P\('b',?\)\)"):
            jax.jit(lambda a, i, v: jax_tma.scatter(a, i, v, axis=1))(
                jax.device_put(host, P("a")), idx, u)
        with pytest.raises(ValueError, match=r"jax_tma\.gather: the tables must be sharded alike "
                                             r"in x\.shape\[:axis\] \(axis=2\): table 0 has "
                                             r"P\('a', 'b'\), table 1 P\('b', 'a'\)"):
            jax.jit(lambda a, b: jax_tma.gather((a, b), np.arange(3), axis=2))(x, other)


def test_explicit_vmap_splits_the_batch_dims(rng):
    host = rng.standard_normal((8, 16, 12)).astype(np.float32)
    idx = indices_for(rng, 16, (8, 5))
    with jax.set_mesh(explicit_mesh()):
        x = jax.device_put(host, P("a", None, "b"))
        i = jax.device_put(idx, P("a"))
        f = jax.jit(jax.vmap(jax_tma.gather))
        assert jax.typeof(f(x, i)).sharding.spec == P("a", None, "b")
        assert_no_collectives(f.lower(x, i).compile().as_text())
        assert_bits_equal(f(x, i), np.stack([take_exact(h, j) for h, j in zip(host, idx)]))
        # A table the vmap broadcasts to the indices' batch (split over "a"):
        # the result is split as x.at[] gives it.
        u = rng.standard_normal((8, 5, 12)).astype(np.float32)
        s = jax.jit(jax.vmap(jax_tma.scatter, in_axes=(None, 0, 0)))
        t = jax.jit(jax.vmap(lambda a, j, v: a.at[j].set(v, mode="drop"), in_axes=(None, 0, 0)))
        args = (jax.device_put(host[0], P(None, "b")), i, jax.device_put(u, P("a", None, "b")))
        assert types(s(*args)) == types(t(*args))
        assert_no_collectives(s.lower(*args).compile().as_text())
        assert_bits_equal(s(*args), t(*args))


# ---- eager (jax.disable_jit) and shape-polymorphic export -------------------------------

def test_disable_jit_runs_the_ops_eagerly(rng):
    x = rng.standard_normal((6, 4))
    idx = np.array([1, -1, 9, 1])
    u = rng.standard_normal((4, 4))
    mesh = cpu_mesh((4,), ("x",), jax.sharding.AxisType.Auto)
    xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, P(None, "x")))

    def all_of(a):
        return (jax_tma.gather(a, idx, fill=2.0), jax_tma.scatter(a, idx, u, mode="add"),
                jax.grad(lambda b: (jax_tma.gather(b, idx) ** 2).sum())(a),
                jax.vmap(jax_tma.gather, in_axes=(None, 0))(a, idx[:, None]))

    want = jax.jit(all_of)(x)
    with jax.disable_jit():
        for a in (x, xs):  # the sharded one takes the partitioned lowering
            for got, w in zip(all_of(a), want):
                assert_bits_equal(got, w)
        assert jax_tma.gather(xs, idx).sharding.is_equivalent_to(xs.sharding, 2)


def test_shape_polymorphic_export(rng):
    from jax import export

    checks = [export.DisabledSafetyCheck.custom_call(t)
              for t in ("jax_tma_gather", "jax_tma_scatter")]
    n, b = export.symbolic_shape("n, b")

    def f(a, i):
        y = jax_tma.gather(a, i, fill=-1.0)
        s = jax_tma.scatter(a, i, y, mode="add", deterministic=True)
        t = jax_tma.scatter(a, i, 2 * y)
        g = jax.grad(lambda c: (jax_tma.scatter(c, i, y) ** 2).sum())(a)
        return y, s, t, g

    exp = export.export(jax.jit(f), disabled_checks=checks)(
        jax.ShapeDtypeStruct((n, 3), jnp.float32), jax.ShapeDtypeStruct((b,), jnp.int32))
    exp = export.deserialize(exp.serialize())
    for rows, count in [(5, 7), (9, 2)]:
        x = rng.standard_normal((rows, 3)).astype(np.float32)
        idx = indices_for(rng, rows, (count,))
        for got, want in zip(exp.call(x, idx), jax.jit(f)(x, idx)):
            assert_bits_equal(got, want)


# ---- sharded over 8 host devices: no collectives for the dims the op splits ----

SHARDING_CASES = [
    ((2, 4), ("a", "b"), (16, 8, 12), 0, P(None, "a", "b")),
    ((8,), ("x",), (8, 16, 4), 1, P("x", None, None)),
    ((2, 4), ("a", "b"), (8, 6, 16), 1, P("a", None, "b")),
    ((8,), ("x",), (6, 32), 0, P(None, "x")),
]


@pytest.mark.parametrize("mesh_shape,names,shape,axis,spec", SHARDING_CASES, ids=str)
def test_sharding_of_gather_splits_every_dim_but_axis(rng, mesh_shape, names, shape, axis,
                                                       spec):
    mesh = cpu_mesh(mesh_shape, names)
    host = random_array(rng, shape, np.float32)
    x = jax.device_put(host, NamedSharding(mesh, spec))
    idx = rng.integers(-shape[axis] - 2, shape[axis] + 2, (5, 3)).astype(np.int32)
    f = jax.jit(lambda a, i: jax_tma.gather(a, i, axis=axis, fill=-1.0))
    assert_no_collectives(f.lower(x, idx).compile().as_text())
    y = f(x, idx)
    padded = list(spec) + [None] * (len(shape) - len(spec))
    assert y.sharding.is_equivalent_to(
        NamedSharding(mesh, P(*padded[:axis], None, None, *padded[axis + 1:])), len(shape) + 1)
    assert_bits_equal(y, jnp.take(host, idx, axis=axis, mode="fill", fill_value=-1.0))


@pytest.mark.parametrize("mesh_shape,names,shape,axis,spec", SHARDING_CASES, ids=str)
@pytest.mark.parametrize("mode", ["set", "add"])
def test_sharding_of_scatter_splits_every_dim_but_axis(rng, mesh_shape, names, shape, axis,
                                                        spec, mode):
    mesh = cpu_mesh(mesh_shape, names)
    host = random_array(rng, shape, np.int32)
    idx = rng.permutation(shape[axis])[:4].astype(np.int32)
    u_host = random_array(rng, shape[:axis] + (4,) + shape[axis + 1:], np.int32)
    x = jax.device_put(host, NamedSharding(mesh, spec))
    u = jax.device_put(u_host, NamedSharding(mesh, spec))
    f = jax.jit(lambda a, i, v: jax_tma.scatter(a, i, v, axis=axis, mode=mode),
                donate_argnums=0)
    assert_no_collectives(f.lower(x, idx, u).compile().as_text())
    want = getattr(jnp.asarray(host).at[(slice(None),) * axis + (idx,)], mode)(u_host)
    y = f(x, idx, u)
    assert y.sharding.is_equivalent_to(x.sharding, len(shape))
    assert_bits_equal(y, want)


def test_sharding_of_gather_grad_and_vmap(rng):
    mesh = cpu_mesh((2, 4), ("a", "b"))
    host = rng.standard_normal((4, 16, 8)).astype(np.float32)
    x = jax.device_put(host, NamedSharding(mesh, P("a", None, "b")))
    idx = rng.integers(0, 16, (4, 6)).astype(np.int32)
    # vmapped over x's leading dim and the indices: a batch dim split over "a"
    i = jax.device_put(idx, NamedSharding(mesh, P("a", None)))
    v = jax.jit(jax.vmap(jax_tma.gather))
    assert_no_collectives(v.lower(x, i).compile().as_text())
    assert_bits_equal(v(x, i), np.stack([h[j] for h, j in zip(host, idx)]))
    g = jax.jit(jax.grad(lambda a: (jax_tma.gather(a, idx[0], axis=1) ** 2).sum()))
    assert_no_collectives(g.lower(x).compile().as_text())
    want = jax.grad(lambda a: (jnp.take(a, idx[0], axis=1) ** 2).sum())(host)
    np.testing.assert_allclose(g(x), want, rtol=1e-6)


def test_gather_under_shard_map(rng):
    mesh = cpu_mesh((8,), ("x",))
    host = random_array(rng, (8, 10, 4), jnp.bfloat16)
    x = jax.device_put(host, NamedSharding(mesh, P("x")))
    idx = np.array([9, 0, -1, 12], np.int32)
    f = jax.jit(jax.shard_map(lambda a: jax_tma.gather(a, idx, axis=1), mesh=mesh,
                              in_specs=P("x"), out_specs=P("x")))
    assert_no_collectives(f.lower(x).compile().as_text())
    want = np.zeros((8, 4, 4), host.dtype)  # index 12 is out of range: zeros
    want[:, :3] = host[:, [9, 0, 9]]
    assert_bits_equal(f(x), want)


def test_sharding_of_tables(rng):
    """K and V pools as the tables of one gather and one scatter: the dims
    before axis split like table 0's, each table's slab dims its own way."""
    mesh = cpu_mesh((2, 4), ("a", "b"))
    hosts = [random_array(rng, (8, 16, 4), np.float32),
             random_array(rng, (8, 16, 2, 8), jnp.bfloat16)]
    specs = (P("a", None, "b"), P("a", None, None, "b"))
    xs = [jax.device_put(h, NamedSharding(mesh, spec)) for h, spec in zip(hosts, specs)]
    idx = rng.permutation(16)[:5].astype(np.int32)
    g = jax.jit(lambda t, i: jax_tma.gather(t, i, axis=1))
    assert_no_collectives(g.lower(xs, idx).compile().as_text())
    ys = g(xs, idx)
    for y, spec, h in zip(ys, specs, hosts):
        assert y.sharding.is_equivalent_to(NamedSharding(mesh, spec), h.ndim)
        assert_bits_equal(y, h[:, idx])
    us = [random_array(rng, (8, 5) + h.shape[2:], h.dtype) for h in hosts]
    s = jax.jit(lambda t, i, u: jax_tma.scatter(t, i, u, axis=1), donate_argnums=0)
    assert_no_collectives(s.lower(xs, idx, us).compile().as_text())
    outs = s(xs, idx, us)
    for out, spec, h, u in zip(outs, specs, hosts, us):
        assert out.sharding.is_equivalent_to(NamedSharding(mesh, spec), h.ndim)
        want = h.copy()
        want[:, idx] = u
        assert_bits_equal(out, want)
