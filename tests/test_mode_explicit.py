"""Every op on a mesh of Explicit axes (what jax.make_mesh makes by default)
under jax.set_mesh: outputs and the grads of vjp keep their sharding, the
sharding the jnp/lax equivalent gives, in the array's type (jax.typeof) and
on the devices, with and without jit, and the values are exact."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding

import ops_table as T
from families import BY_NAME, LOCAL_OPS, OP_NAMES, build
from reference import assert_bits_equal

# Which dims of x the mesh splits: the batch dim over both axes; the batch
# dim over "a" and the op's last splittable dim over "b"; nothing.
LAYOUTS = ["batch", "two-dims", "replicated"]


def _dims(case, layout):
    if layout == "batch":
        return {0: T.MESH_AXES}
    if layout == "two-dims":
        return {0: "a", case.split[-1]: "b"} if len(case.split) > 1 else {0: T.MESH_AXES}
    return {}


def _type_spec(a) -> tuple:
    spec = tuple(jax.typeof(a).sharding.spec)
    return spec + (None,) * (a.ndim - len(spec))


def assert_same_sharding(got, want, what):
    assert _type_spec(got) == _type_spec(want), \
        f"{what}: type {jax.typeof(got)}, the jnp equivalent gives {jax.typeof(want)}"
    assert got.sharding.is_equivalent_to(want.sharding, got.ndim), \
        f"{what}: sharding {got.sharding}, the jnp equivalent gives {want.sharding}"


@pytest.fixture(scope="module")
def mesh():
    return T.explicit_mesh()


# A collective's blocks are split along dim 0 only (on Explicit meshes
# shard_map's in_specs must match the operand's sharding, for lax's too)
CASES = [(n, layout) for n in OP_NAMES for layout in LAYOUTS
         if not BY_NAME[n].collective or layout == "batch"]


@pytest.mark.parametrize("name,layout", CASES)
def test_outputs_and_grads_keep_the_sharding(rng, mesh, name, layout):
    case = build(name, rng, np.float32)
    specs = case.in_specs(_dims(case, layout))
    with T.set_mesh(mesh):
        args = T.put(case.args, mesh, specs)
        out = jax.eval_shape(jax.jit(case.ref), *args)  # the jnp equivalent's type
        ct = jax.device_put(T.cotangent(rng, out.shape, np.float32),
                            NamedSharding(mesh, out.sharding.spec))
        # one program for both (one compilation), where it may be: outputs
        # and vjp grads
        (y, grads), (want, want_grads) = T.ours_and_ref(
            case, lambda c, *a: T.vjp(case, case.ours, a, c),
            lambda c, *a: T.vjp(case, case.ref, a, c), ct, *args)
        eager = case.ours(*args)
    for how, got in (("jit", y), ("eager", eager)):
        assert_same_sharding(got, want, f"{how} output")
        assert_bits_equal(got, case.want())
    for i, g, w in zip(case.diff, grads, want_grads):
        assert_same_sharding(g, w, f"grad of operand {i}")
        T.assert_like_jnp(g, w)


@pytest.mark.parametrize("name", LOCAL_OPS)
def test_grad_of_a_loss_keeps_the_sharding(rng, mesh, name):
    """jax.grad of a weighted sum (the cotangent sharded like the weights)
    and of a plain sum (the cotangent an unsharded broadcast of ones)."""
    case = build(name, rng, np.float32)
    specs = case.in_specs(_dims(case, "two-dims"))

    def grads(fn, w, args):
        def loss(*d):
            full = list(args)
            for i, v in zip(case.diff, d):
                full[i] = v
            y = fn(*full)
            return (y * w).sum() + y.sum()
        return jax.grad(loss, argnums=tuple(range(len(case.diff))))(*(args[i] for i in case.diff))

    with T.set_mesh(mesh):
        args = T.put(case.args, mesh, specs)
        out = jax.eval_shape(jax.jit(case.ref), *args)
        w = jax.device_put(T.cotangent(rng, out.shape, np.float32),
                           NamedSharding(mesh, out.sharding.spec))
        got, want = jax.jit(lambda w_, *a: (grads(case.ours, w_, a), grads(case.ref, w_, a)))(
            w, *args)
    for i, g, r in zip(case.diff, got, want):
        assert_same_sharding(g, r, f"grad of operand {i}")
        T.assert_like_jnp(g, r)
