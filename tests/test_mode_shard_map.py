"""Every op inside jax.shard_map with its default checks (check_vma on), over
8 host devices as a 2 x 4 mesh: vjp and grad give what the jnp/lax
equivalent gives in the same shard_map, operands that vary along mesh axes
and operands that do not mix, and out_specs=P() on a varying result raises
JAX's replication error as the jnp equivalent does."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import ops_table as T
from families import BY_NAME, OP_NAMES, build
from reference import assert_bits_equal

REPLICATION_ERROR = "out_specs which require replication"
# ops with an index operand (starts, indices), which may vary while x does not
INDEXED = tuple(n for n in OP_NAMES
                if BY_NAME[n].build(np.random.default_rng(0), np.dtype(np.float32)).index is not None)


@pytest.fixture(scope="module")
def mesh():
    return T.cpu_mesh()


def _vjp_body(case, fn):
    def body(ct, *args):
        return T.vjp(case, fn, args, ct)
    return body


@pytest.mark.parametrize("name", OP_NAMES)
def test_vjp_of_blocks_split_over_every_device(rng, mesh, name):
    case = build(name, rng, np.float32)
    specs = case.batch_specs()
    ct = T.cotangent(rng, T.out_struct(case).shape, np.float32)
    out_specs = (T.BATCH, tuple(specs[i] for i in case.diff))
    got, want = (jax.jit(T.shard_map(_vjp_body(case, fn), mesh=mesh, in_specs=(T.BATCH,) + specs,
                                     out_specs=out_specs))(ct, *case.args)
                 for fn in T.local_fns(case))
    assert_bits_equal(got[0], case.want())
    for g, w in zip(got[1], want[1]):
        T.assert_like_jnp(g, w)


@pytest.mark.parametrize("name", OP_NAMES)
def test_grad_of_a_loss(rng, mesh, name):
    case = build(name, rng, np.float32)
    specs = case.batch_specs()
    w = T.cotangent(rng, T.out_struct(case).shape, np.float32)

    def body(fn):
        def grads(w_blk, *args):
            def loss(*d):
                full = list(args)
                for i, v in zip(case.diff, d):
                    full[i] = v
                return (fn(*full) * w_blk).sum()
            return jax.grad(loss, argnums=tuple(range(len(case.diff))))(
                *(args[i] for i in case.diff))
        return grads

    got, want = (jax.jit(T.shard_map(body(fn), mesh=mesh, in_specs=(T.BATCH,) + specs,
                                     out_specs=tuple(specs[i] for i in case.diff)))(w, *case.args)
                 for fn in T.local_fns(case))
    for g, r in zip(got, want):
        T.assert_like_jnp(g, r)


@pytest.mark.parametrize("name", INDEXED)
def test_replicated_x_with_varying_indices(rng, mesh, name):
    """x the same on every device, the starts or indices differ per device:
    the result varies, and x's cotangent (and updates') sums over devices."""
    case = build(name, rng, np.float32)
    k = case.index
    idx = np.stack([case.draw(rng)[k] for _ in range(8)])
    args = list(case.args)
    specs = tuple(T.BATCH if i == k else P() for i in range(len(args)))
    ct = T.cotangent(rng, (8,) + T.out_struct(case).shape, np.float32)

    def body(fn):
        def run(ct_blk, *blocks):
            local = [b[0] if i == k else b for i, b in enumerate(blocks)]
            y, grads = T.vjp(case, fn, local, ct_blk[0])
            return y[None], grads
        return run

    args[k] = idx
    out_specs = (T.BATCH, tuple(P() for _ in case.diff))
    got, want = (jax.jit(T.shard_map(body(fn), mesh=mesh, in_specs=(T.BATCH,) + specs,
                                     out_specs=out_specs))(ct, *args)
                 for fn in (case.ours, case.ref))
    per_device = [list(case.args) for _ in range(8)]
    for d in range(8):
        per_device[d][k] = idx[d]
    assert_bits_equal(got[0], np.stack([case.want(*a) for a in per_device]))
    for g, w in zip(got[1], want[1]):
        T.assert_like_jnp(g, w)


def _raises_like_jnp(case, mesh, in_specs, fns, args):
    for fn in fns:  # the jnp equivalent first: the test's own premise
        f = jax.jit(T.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=P()))
        with pytest.raises(ValueError, match=REPLICATION_ERROR):
            f.lower(*args)


@pytest.mark.parametrize("name", OP_NAMES)
def test_replicated_out_spec_of_a_varying_result_raises(rng, mesh, name):
    case = build(name, rng, np.float32)
    ours, ref = T.local_fns(case)
    _raises_like_jnp(case, mesh, case.batch_specs(), (ref, ours), case.args)


@pytest.mark.parametrize("name", INDEXED)
def test_replicated_out_spec_with_varying_indices_raises(rng, mesh, name):
    case = build(name, rng, np.float32)
    k = case.index
    args = list(case.args)
    args[k] = np.stack([case.draw(rng)[k] for _ in range(8)])
    specs = tuple(T.BATCH if i == k else P() for i in range(len(args)))

    def local(fn):
        return lambda *blocks: fn(*(b[0] if i == k else b for i, b in enumerate(blocks)))

    _raises_like_jnp(case, mesh, specs, (local(case.ref), local(case.ours)), args)
