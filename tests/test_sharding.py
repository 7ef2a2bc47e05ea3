"""Every op (families.OPS, each family's descriptor) on sharded arrays over 8
forced host devices: jit over NamedSharding inputs, shard_map and the vjp
compile with no collectives for the dims the op's case may split, and give
the NumPy result bit for bit (the grads as the jnp equivalent's). Each
family's own test file has the cases particular to it (other meshes, dims
that a box does not cover, several tables)."""

import jax
import numpy as np
import pytest

import ops_table as T
from families import BY_NAME, OP_NAMES, build
from reference import assert_bits_equal, assert_no_collectives

# Which dims of args[0] the 2 x 4 mesh splits: the batch dim over both axes;
# the batch dim over "a" and the last dim the op splits locally over "b".
LAYOUTS = ["batch", "two-dims"]
# A collective's blocks are split along the batch dim alone.
CASES = [(n, layout) for n in OP_NAMES for layout in LAYOUTS
         if not BY_NAME[n].collective or layout == "batch"]


@pytest.fixture(autouse=True)
def _eight_cpu_devices():
    if len(jax.devices("cpu")) < 8:
        pytest.fail("the sharding tests need XLA_FLAGS=--xla_force_host_platform_device_count=8 "
                    "(set by tests/conftest.py before jax starts)")


def _dims(case, layout) -> dict:
    if layout == "batch" or len(case.local_split()) < 2:
        return {0: T.MESH_AXES}
    return {0: "a", case.local_split()[-1]: "b"}


@pytest.mark.parametrize("name,layout", CASES)
def test_jit_over_named_sharding_moves_no_data_between_devices(rng, name, layout):
    case = build(name, rng, np.float32)
    mesh = T.cpu_mesh()
    args = T.put(case.args, mesh, case.in_specs(_dims(case, layout)))
    f = jax.jit(case.ours)
    assert_no_collectives(f.lower(*args).compile().as_text())
    assert_bits_equal(f(*args), case.want())


@pytest.mark.parametrize("name,layout", CASES)
def test_vjp_over_named_sharding_moves_no_data_between_devices(rng, name, layout):
    case = build(name, rng, np.float32)
    mesh = T.cpu_mesh()
    args = T.put(case.args, mesh, case.in_specs(_dims(case, layout)))
    ct = T.cotangent(rng, T.out_struct(case).shape, np.float32)
    f = jax.jit(lambda c, *a: T.vjp(case, case.ours, a, c))
    assert_no_collectives(f.lower(ct, *args).compile().as_text())
    y, grads = f(ct, *args)
    assert_bits_equal(y, case.want())
    want = jax.jit(lambda c, *a: T.vjp(case, case.ref, a, c)[1])(ct, *case.args)
    for g, w in zip(grads, want):
        T.assert_like_jnp(g, w)


@pytest.mark.parametrize("name", OP_NAMES)
def test_shard_map_moves_no_data_between_devices(rng, name):
    case = build(name, rng, np.float32)
    mesh = T.cpu_mesh()
    f = jax.jit(T.shard_map(T.local_fns(case)[0], mesh=mesh, in_specs=case.batch_specs(),
                            out_specs=T.BATCH))
    assert_no_collectives(f.lower(*case.args).compile().as_text())
    assert_bits_equal(f(*case.args), case.want())
