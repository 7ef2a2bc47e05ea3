"""Every integer dtype (int2 to int64, uint2 to uint64) for window's starts
and gather's and scatter's indices, with values at each dtype's extremes:
traced arrays, traced scalars, concrete scalars and vmapped arrays give the
NumPy result for the exact value (no wrap-around: an unsigned start of
2**32 - 1 reads fill, as no row exists there), and so do the grads."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_tma
import ops_table as T
from families.gather import gather_reference, scatter_reference, wrap_rows
from families.window import window_expect, window_grad_expect
from reference import assert_bits_equal, random_array

IDS = [d.name for d in T.INT_DTYPES]
X_SHAPE, BOX, STRIDES = (5, 6), (2, 3), (1, 2)


def _starts(rng, dtype):
    """Start pairs: each extreme of the dtype in one dim, an in-range value
    (of the dtype) in the other."""
    ext = T.int_extremes(dtype)
    inner = [int(rng.integers(0, n)) for n in X_SHAPE]
    fits = [min(max(v, ext[0]), ext[-1]) for v in inner]
    pairs = [(v, fits[1]) for v in ext] + [(fits[0], v) for v in ext]
    return np.array(pairs, dtype=object).astype(np.int64 if dtype != np.uint64 else np.uint64)


@pytest.mark.parametrize("dtype", T.INT_DTYPES, ids=IDS)
def test_window_starts(rng, dtype):
    x = random_array(rng, X_SHAPE, np.float32, finite=True)
    pairs = _starts(rng, dtype)
    starts = pairs.astype(dtype)  # the values of `pairs`, each fits
    ct = T.cotangent(rng, (len(starts),) + BOX, np.float32)
    win = functools.partial(jax_tma.window, shape=BOX, strides=STRIDES)

    # XLA's GPU backend cannot slice an array of a sub-byte type: such starts
    # travel as int8 and take their dtype inside, one start at a time.
    carrier = starts.astype(np.int8) if jnp.iinfo(dtype).bits < 8 else starts

    @jax.jit
    def traced(x, s, ct):
        def one(args):  # one start at a time: an unbatched traced start
            t, c = args
            t = t.astype(dtype)
            return win(x, t), win(x, (t[0], t[1])), jax.vjp(lambda a: win(a, t), x)[1](c)[0]

        return (*lax.map(one, (s, ct)), jax.vmap(lambda t: win(x, t.astype(dtype)))(s))

    got = traced(x, carrier, ct)
    values = [[int(v) for v in p] for p in pairs]
    want = np.stack([window_expect(x, v, BOX, STRIDES) for v in values])
    want_grads = np.stack([window_grad_expect(X_SHAPE, c, v, BOX, STRIDES)
                           for v, c in zip(values, ct)])
    arrays, scalars, grads, batched = got
    for g in (arrays, scalars, batched):
        assert_bits_equal(g, want)
    assert_bits_equal(grads, want_grads)
    # concrete NumPy scalars: the dtype's extremes in dim 0
    for j in (0, len(T.int_extremes(dtype)) - 1):
        s = (starts[j, 0], starts[j, 1])
        assert_bits_equal(win(x, s), want[j])


@pytest.mark.parametrize("dtype", T.INT_DTYPES, ids=IDS)
def test_window_start_array_of_a_batch_form(rng, dtype):
    """Starts whose leading dims the box covers (static 0) and whose other
    dims are traced scalars of the dtype: the form that splits batch dims."""
    x = random_array(rng, (3,) + X_SHAPE, np.float32)
    ext = T.int_extremes(dtype)
    s = np.array([ext[0], ext[-1]], dtype=np.int64 if dtype != np.uint64 else np.uint64)
    f = jax.jit(lambda a, t: jax_tma.window(a, (0, t[0], t[1]), (3,) + BOX,
                                            strides=(1,) + STRIDES))
    want = window_expect(x, [0, int(s[0]), int(s[1])], (3,) + BOX, (1,) + STRIDES)
    assert_bits_equal(f(x, s.astype(dtype)), want)


def _indices(rng, dtype, n):
    """The dtype's extremes, the edges of a dim of size n (where the dtype
    holds them) and random in-range values."""
    ext = T.int_extremes(dtype)
    edges = [v for v in (n - 1, n, -n, -n - 1) if ext[0] <= v <= ext[-1]]
    inner = [int(v) for v in rng.integers(max(ext[0], -n), min(ext[-1], n - 1) + 1, 4)]
    vals = ext + edges + inner
    return [vals[i] for i in rng.permutation(len(vals))]


def _as(dtype, values):
    wide = np.uint64 if dtype == np.uint64 else np.int64
    return np.array(values, dtype=object).astype(wide).astype(dtype)


@pytest.mark.parametrize("dtype", T.INT_DTYPES, ids=IDS)
def test_gather_indices(rng, dtype):
    n = 7
    x = random_array(rng, (n, 3), np.float32)
    values = _indices(rng, dtype, n)
    idx = _as(dtype, values)
    ct = T.cotangent(rng, (len(values), 3), np.float32)

    @jax.jit
    def traced(x, i, ct):
        y, pull = jax.vjp(lambda a: jax_tma.gather(a, i, fill=-1.0), x)
        return y, pull(ct)[0], jax.vmap(lambda j: jax_tma.gather(x, j))(i)

    y, g, per_index = traced(x, idx, ct)
    want = gather_reference(x, np.array(values, dtype=object), 0, T.take_fill(-1.0, x.dtype))
    assert_bits_equal(y, want)
    assert_bits_equal(per_index, gather_reference(x, np.array(values, dtype=object), 0,
                                                    T.take_fill(0, x.dtype)))
    rows, inside = wrap_rows(np.array(values, dtype=object), n)
    want_g = np.zeros_like(x)
    np.add.at(want_g, rows[inside], ct[inside])
    assert_bits_equal(g, want_g)
    # concrete NumPy scalar indices at the extremes
    for v in (idx[values.index(min(values))], idx[values.index(max(values))]):
        assert_bits_equal(jax_tma.gather(x, v, fill=-1.0),
                          gather_reference(x, np.array(int(v)), 0, T.take_fill(-1.0, x.dtype)))


@pytest.mark.parametrize("dtype", T.INT_DTYPES, ids=IDS)
def test_scatter_indices(rng, dtype):
    n = 7
    values = _indices(rng, dtype, n)
    idx = _as(dtype, values)
    obj = np.array(values, dtype=object)
    x = random_array(rng, (n, 3), np.int32)
    u = random_array(rng, (len(values), 3), np.int32)
    xf = T.cotangent(rng, (n, 3), np.float32)
    uf = T.cotangent(rng, (len(values), 3), np.float32)
    ct = T.cotangent(rng, (n, 3), np.float32)

    @jax.jit
    def traced(x, i, u, xf, uf, ct):
        # deterministic: the last of duplicate indices wins, as the
        # reference says (without it the GPU's order is any order)
        s = jax_tma.scatter(x, i, u, deterministic=True)
        a = jax_tma.scatter(x, i, u, mode="add")
        _, pull = jax.vjp(lambda p, q: jax_tma.scatter(p, i, q, deterministic=True), xf, uf)
        return s, a, pull(ct)

    s, a, (gx, gu) = traced(x, idx, u, xf, uf, ct)
    assert_bits_equal(s, scatter_reference(x, obj, u, 0, "set"))
    assert_bits_equal(a, scatter_reference(x, obj, u, 0, "add"))
    # set's grads: x's cotangent is zero at written rows; each update gets its
    # row's cotangent if it is the update that stays (the last), else zero
    rows, inside = wrap_rows(obj, n)
    want_gx, want_gu = ct.copy(), np.zeros_like(uf)
    want_gx[rows[inside]] = 0
    last = {r: k for k, (r, ok) in enumerate(zip(rows, inside)) if ok}
    for r, k in last.items():
        want_gu[k] = ct[r]
    assert_bits_equal(gx, want_gx)
    assert_bits_equal(gu, want_gu)
