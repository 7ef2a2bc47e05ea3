"""Every op under jax.disable_jit(): eager calls and vmap give the NumPy
result, vjp and jvp what the jnp/lax equivalent gives."""

import jax
import numpy as np
import pytest

import ops_table as T
from families import OP_NAMES, build
from reference import assert_bits_equal


@pytest.mark.parametrize("name", OP_NAMES)
def test_call(rng, name):
    # an integer dtype here; test_vjp_and_jvp calls each op on float32
    case = build(name, rng, np.int8)
    with jax.disable_jit():
        y = case.ours(*case.args)
    assert_bits_equal(y, case.want())


@pytest.mark.parametrize("name", OP_NAMES)
def test_vjp_and_jvp(rng, name):
    case = build(name, rng, np.float32)
    ct = T.cotangent(rng, T.out_struct(case).shape, np.float32)
    tangents = tuple(T.cotangent(rng, case.args[i].shape, np.float32) for i in case.diff)

    def jvp(fn, args, tangents):
        def f(*d):
            full = list(args)
            for i, v in zip(case.diff, d):
                full[i] = v
            return fn(*full)
        return jax.jvp(f, tuple(args[i] for i in case.diff), tangents)

    with jax.disable_jit():
        y, grads = T.vjp(case, case.ours, case.args, ct)
        (y_dot_primal, y_dot) = jvp(case.ours, case.args, tangents)
    # the jnp equivalent compiled: the same values, fewer programs
    want_grads, want_dot = jax.jit(lambda c, t, *a: (T.vjp(case, case.ref, a, c)[1],
                                                     jvp(case.ref, a, t)[1]))(
        ct, tangents, *case.args)
    assert_bits_equal(y, case.want())
    assert_bits_equal(y_dot_primal, case.want())
    for g, w in zip(grads, want_grads):
        T.assert_like_jnp(g, w)
    T.assert_like_jnp(y_dot, want_dot)


@pytest.mark.parametrize("name", OP_NAMES)
def test_vmap(rng, name):
    case = build(name, rng, np.float32)
    args, in_axes, want = T.stacked(case, rng)
    with jax.disable_jit():
        y = jax.vmap(case.ours, in_axes=in_axes)(*args)
    assert_bits_equal(y, want)
