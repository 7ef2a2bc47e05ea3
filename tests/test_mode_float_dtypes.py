"""Every float dtype (float16, bfloat16, float32, float64, every float8 type,
float4, complex) for the grads of every op and for the fills of window,
gather and im2col's padding: grads as the jnp/lax equivalent's (cotangents
whose sums are exact, so any adding order gives the same bits; see
ops_table.assert_grads_like_jnp for float8_e8m0fnu, whose zero is NaN), fills as
jnp.pad and jnp.take write them (-0.0 stays negative, NaN is float8_e5m2's
0x7F, 0 is float8_e8m0fnu's 0xFF); and Python scalars taken as jnp takes them."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_tma
import ops_table as T
from reference import assert_bits_equal, cpu_device, im2col_reference, random_array

IDS = [d.name for d in T.FLOAT_DTYPES]
# col2im and scatter(mode="add") sum only the dtypes their docstrings list;
# for the others a TypeError at trace time naming the op is the documented
# difference from the jnp equivalent.
SUMMING = {"col2im": "jax_tma.col2im", "scatter-add": "jax_tma.scatter"}


# The float8 types cost twice the others to compile: each run takes three of
# them (the common two, and e8m0 with no zero) and one of the other five,
# drawn with the run's seed, for each op.
_FIXED_FLOAT8 = ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")
_OTHER_FLOAT8 = tuple(d for d in IDS if d.startswith("float8") and d not in _FIXED_FLOAT8)
GRAD_DTYPES = [d for d in IDS if not d.startswith("float8")] + list(_FIXED_FLOAT8) + \
    ["another-float8"]


@pytest.mark.parametrize("dtype", GRAD_DTYPES)
@pytest.mark.parametrize("name", T.OP_NAMES)
def test_grads(rng, name, dtype):
    if dtype == "another-float8":
        dtype = str(rng.choice(_OTHER_FLOAT8))
    dtype = np.dtype(getattr(jnp, dtype))
    case = T.build(name, rng, dtype)
    ct = T.cotangent(rng, T.out_struct(case).shape, dtype)
    if name in SUMMING and dtype not in T.SUMMABLE:
        try:
            jax.eval_shape(lambda c, *a: T.vjp(case, case.ours, a, c), ct, *case.args)
        except TypeError as e:  # refused at trace time, naming the op
            assert SUMMING[name] in str(e)
            return
    ours = lambda c, *a: T.vjp(case, case.ours, a, c)[1]  # noqa: E731
    if dtype.name == "float4_e2m1fn":
        # The jnp grads on the CPU: XLA's GPU compiler aborts the process on
        # them for float4_e2m1fn (window's: a RET_CHECK in
        # algebraic_simplifier, "equal(slice->shape(), pad->shape())"; the
        # others in one program with ours; H100, jax 0.11.2, 2026-11-25).
        got = jax.jit(ours)(ct, *case.args)
        with jax.default_device(cpu_device()):
            want, exact = jax.jit(lambda c, *a: T.ref_grads(case, a, c))(ct, *case.args)
    else:  # one program for both: one compilation
        got, (want, exact) = jax.jit(lambda c, *a: (ours(c, *a), T.ref_grads(case, a, c)))(
            ct, *case.args)
    for i, g, w, e in zip(case.diff, got, want, exact):
        try:
            T.assert_grads_like_jnp(g, w, e)
        except AssertionError as e:
            raise AssertionError(f"{name} of {dtype.name}, grad of operand {i}: {e}") from None


WINDOW_FILLS = [0, 0.0, -0.0, float("nan"), "nan", np.float32(-0.0), ml_dtypes.bfloat16(-0.0),
                jnp.array(0.0), jnp.array(-0.0), jnp.array(float("nan"))]
COMPLEX_FILLS = [complex(1, -2), complex(float("nan"), 0), np.complex64(-0.0 - 0.0j)]


def _check_fills(op, x, fills, expect):
    """op(x, fill) for every fill in one program, each against expect(fill);
    one failure message naming every fill that failed (at trace time too)."""
    errors, ok = [], []
    for fill in fills:
        try:
            jax.eval_shape(lambda a: op(a, fill), x)
            ok.append(fill)
        except Exception as e:  # noqa: BLE001 (reported below, per fill)
            errors.append(f"fill={fill!r}: {type(e).__name__}: {e}")
    got = jax.jit(lambda a: [op(a, f) for f in ok])(x)
    for fill, y in zip(ok, got):
        try:
            assert_bits_equal(y, expect(fill))
        except AssertionError as e:
            errors.append(f"fill={fill!r}: {e}")
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("dtype", T.FLOAT_DTYPES, ids=IDS)
def test_window_fills(rng, dtype):
    x = random_array(rng, (5, 6), dtype)
    start, shape, strides = (-2, 3), (6, 4), (1, 2)  # over three edges

    def win(a, fill):
        return jax_tma.window(a, start, shape, strides=strides, fill=fill)

    # Every fill as jnp.pad writes it, complex ones of two different halves
    # included (each half its own 8 bytes of complex128's pattern).
    fills = WINDOW_FILLS + (COMPLEX_FILLS if np.dtype(dtype).kind == "c" else [])
    _check_fills(win, x, fills, lambda f: T.window_expect(x, start, shape, strides, f))


GATHER_FILLS = [0, 0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1.5, -3.25, 2**70,
                1e300, -1e-300, np.float16(2.5), np.float32(-0.0), ml_dtypes.bfloat16(7.0)]


@pytest.mark.parametrize("dtype", T.FLOAT_DTYPES, ids=IDS)
def test_gather_fills(rng, dtype):
    x = random_array(rng, (4, 3), dtype)
    idx = np.array([1, 9, -1, -5], np.int32)
    fills = []
    for fill in GATHER_FILLS + (COMPLEX_FILLS if np.dtype(dtype).kind == "c" else []):
        try:
            T.take_fill(fill, dtype)
            fills.append(fill)
        except TypeError:  # jnp.take takes no 2**70 for ml_dtypes' types: nothing to match
            pass
    _check_fills(lambda a, f: jax_tma.gather(a, idx, fill=f), x, fills,
                 lambda f: T.gather_reference(x, idx, 0, T.take_fill(f, dtype)))


@pytest.mark.parametrize("dtype", T.FLOAT_DTYPES, ids=IDS)
def test_im2col_padding(rng, dtype):
    x = random_array(rng, (2, 4, 3, 2), dtype)
    pads = ((2, 1), (1, 2))
    y = jax.jit(lambda a: jax_tma.im2col(a, (2, 2), padding=pads))(x)
    inside = im2col_reference(np.ones(x.shape, bool), (2, 2), (1, 1), pads, (1, 1))
    want = im2col_reference(x, (2, 2), (1, 1), pads, (1, 1))
    want[~inside] = T.pad_fill(0, dtype)[0]  # jnp.pad's zero, not reference.py's conversion
    assert_bits_equal(y, want)


SCALARS = [3.0, -0.0, float("nan"), 1j, 2, True]


@pytest.mark.parametrize("value", SCALARS, ids=repr)
def test_python_scalars(value):
    """As jnp.copy and jnp.broadcast_to take them: the dtype (weakly typed
    where jnp's is) and the bits."""
    for ours, ref in ((jax_tma.copy, jnp.copy),
                      (lambda v: jax_tma.broadcast(v, 3),
                       lambda v: jnp.broadcast_to(v, (3,)))):
        for wrap in (lambda f: f, jax.jit):
            y, want = wrap(ours)(value), wrap(ref)(value)
            assert jax.typeof(y) == jax.typeof(want), f"{jax.typeof(y)}, jnp: {jax.typeof(want)}"
            assert_bits_equal(y, want)
