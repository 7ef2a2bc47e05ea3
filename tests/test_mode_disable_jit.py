"""Every op under jax.disable_jit(): eager calls and vmap give the NumPy
result, vjp and jvp what the jnp/lax equivalent gives under disable_jit."""

import jax
import numpy as np
import pytest

import ops_table as T
from reference import assert_bits_equal


@pytest.mark.parametrize("name", T.OP_NAMES)
def test_call(rng, name):
    # an integer dtype here; test_vjp_and_jvp calls each op on float32
    case = T.build(name, rng, np.int8)
    with jax.disable_jit():
        y = case.ours(*case.args)
    assert_bits_equal(y, case.want())


@pytest.mark.parametrize("name", T.OP_NAMES)
def test_vjp_and_jvp(rng, name):
    case = T.build(name, rng, np.float32)
    ct = T.cotangent(rng, T.out_struct(case).shape, np.float32)
    tangents = tuple(T.cotangent(rng, case.args[i].shape, np.float32) for i in case.diff)

    def jvp(fn):
        def f(*d):
            full = list(case.args)
            for i, v in zip(case.diff, d):
                full[i] = v
            return fn(*full)
        return jax.jvp(f, tuple(case.args[i] for i in case.diff), tangents)

    with jax.disable_jit():
        y, grads = T.vjp(case, case.ours, case.args, ct)
        _, want_grads = T.vjp(case, case.ref, case.args, ct)
        (y_dot_primal, y_dot) = jvp(case.ours)
        (_, want_dot) = jvp(case.ref)
    assert_bits_equal(y, case.want())
    assert_bits_equal(y_dot_primal, case.want())
    for g, w in zip(grads, want_grads):
        T.assert_like_jnp(g, w)
    T.assert_like_jnp(y_dot, want_dot)


@pytest.mark.parametrize("name", T.OP_NAMES)
def test_vmap(rng, name):
    case = T.build(name, rng, np.float32)
    args, in_axes, want = T.stacked(case, rng)
    with jax.disable_jit():
        y = jax.vmap(case.ours, in_axes=in_axes)(*args)
    assert_bits_equal(y, want)
