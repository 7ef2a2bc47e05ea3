"""Every float dtype (float16, bfloat16, float32, float64, every float8 type,
float4, complex) for the grads of every op: as the jnp/lax equivalent's
(cotangents whose sums are exact, so any adding order gives the same bits;
see ops_table.assert_grads_like_jnp for float8_e8m0fnu, whose zero is NaN).
An op that sums takes the dtypes its Op lists; for the others it raises a
TypeError naming the op at trace time. (Each op's fills of every float
dtype: its own test file.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ops_table as T
from families import BY_NAME, OP_NAMES, build
from reference import cpu_device

IDS = [d.name for d in T.FLOAT_DTYPES]


# The float8 types cost twice the others to compile: each run takes three of
# them (the common two, and e8m0 with no zero) and one of the other five,
# drawn with the run's seed, for each op.
_FIXED_FLOAT8 = ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")
_OTHER_FLOAT8 = tuple(d for d in IDS if d.startswith("float8") and d not in _FIXED_FLOAT8)
GRAD_DTYPES = [d for d in IDS if not d.startswith("float8")] + list(_FIXED_FLOAT8) + \
    ["another-float8"]


@pytest.mark.parametrize("dtype", GRAD_DTYPES)
@pytest.mark.parametrize("name", OP_NAMES)
def test_grads(rng, name, dtype):
    if dtype == "another-float8":
        dtype = str(rng.choice(_OTHER_FLOAT8))
    dtype = np.dtype(getattr(jnp, dtype))
    case = build(name, rng, dtype)
    ct = T.cotangent(rng, T.out_struct(case).shape, dtype)
    if dtype not in BY_NAME[name].dtypes:
        # An op that sums (col2im, scatter's add) may refuse a dtype its Op
        # does not list: a TypeError at trace time naming the op, the
        # documented difference from the jnp equivalent.
        try:
            jax.eval_shape(lambda c, *a: T.vjp(case, case.ours, a, c), ct, *case.args)
        except TypeError as e:
            assert str(e).startswith("jax_tma."), e
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
    else:  # one program for both (one compilation), where it may be
        got, (want, exact) = T.ours_and_ref(case, ours, lambda c, *a: T.ref_grads(case, a, c),
                                            ct, *case.args)
    for i, g, w, e in zip(case.diff, got, want, exact):
        try:
            T.assert_grads_like_jnp(g, w, e)
        except AssertionError as e:
            raise AssertionError(f"{name} of {dtype.name}, grad of operand {i}: {e}") from None
