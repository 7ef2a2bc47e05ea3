"""jax_tma ops on sharded arrays over 8 forced host devices: jit over
NamedSharding inputs and shard_map compile with no collectives for every
dimension the op can split, and give the unsharded result bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_tma
from reference import (assert_bits_equal, assert_no_collectives, broadcast_reference,
                       col2im_reference, collectives_in, cpu_mesh, im2col_reference,
                       random_array, window_reference)


@pytest.fixture(autouse=True)
def _eight_cpu_devices():
    if len(jax.devices("cpu")) < 8:
        pytest.fail("the sharding tests need XLA_FLAGS=--xla_force_host_platform_device_count=8 "
                    "(set by tests/conftest.py before jax starts)")


CASES = [
    ((2, 4), ("a", "b"), (64, 32), P("a", "b")),
    ((8,), ("x",), (16, 8, 6), P(None, "x", None)),
    ((8,), ("x",), (16, 8, 24), P(None, None, "x")),
    ((2, 4), ("a", "b"), (8, 4, 12), P(("a", "b"), None, None)),
    ((2, 2, 2), ("a", "b", "c"), (4, 6, 2, 10), P("b", None, "c", "a")),
    ((8,), ("x",), (8 * 1024,), P("x")),
]


@pytest.mark.parametrize("mesh_shape,names,shape,spec", CASES, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.uint8, jnp.bfloat16, np.complex64], ids=str)
def test_jit_over_named_sharding_splits_every_dim(rng, mesh_shape, names, shape, spec, dtype):
    mesh = cpu_mesh(mesh_shape, names)
    host = random_array(rng, shape, dtype)
    x = jax.device_put(host, NamedSharding(mesh, spec))
    f = jax.jit(jax_tma.copy)
    assert_no_collectives(f.lower(x).compile().as_text())
    y = f(x)
    assert y.sharding.is_equivalent_to(x.sharding, len(shape))
    assert_bits_equal(y, host)


@pytest.mark.parametrize("mesh_shape,names,shape,spec", CASES, ids=str)
def test_shard_map(rng, mesh_shape, names, shape, spec):
    mesh = cpu_mesh(mesh_shape, names)
    host = random_array(rng, shape, np.float32)
    x = jax.device_put(host, NamedSharding(mesh, spec))
    f = jax.jit(jax.shard_map(jax_tma.copy, mesh=mesh, in_specs=spec, out_specs=spec))
    assert_no_collectives(f.lower(x).compile().as_text())
    assert_bits_equal(f(x), host)


def test_vjp_and_vmap_keep_the_sharding(rng):
    mesh = cpu_mesh((2, 4), ("a", "b"))
    sharding = NamedSharding(mesh, P("a", "b"))
    host = random_array(rng, (8, 16), np.float32)
    x = jax.device_put(host, sharding)
    ct = jax.device_put(random_array(rng, (8, 16), np.float32), sharding)

    def pullback(a, c):
        return jax.vjp(jax_tma.copy, a)[1](c)[0]

    f = jax.jit(pullback)
    assert_no_collectives(f.lower(x, ct).compile().as_text())
    assert_bits_equal(f(x, ct), np.asarray(ct))
    g = jax.jit(jax.vmap(jax_tma.copy, in_axes=1, out_axes=1))
    assert_no_collectives(g.lower(x).compile().as_text())
    assert_bits_equal(g(x), host)


def test_explicit_mesh_axes(rng):
    mesh = cpu_mesh((2, 4), ("a", "b"), AxisType.Explicit)
    host = rng.standard_normal((8, 16)).astype(np.float32)  # arithmetic below: no subnormals
    with jax.set_mesh(mesh):
        x = jax.device_put(host, NamedSharding(mesh, P("a", "b")))
        f = jax.jit(jax_tma.copy)
        assert jax.typeof(f(x)).sharding.spec == P("a", "b")
        assert_no_collectives(f.lower(x).compile().as_text())
        assert_bits_equal(f(x), host)
        g = jax.jit(jax.grad(lambda a: (jax_tma.copy(a) * a).sum()))
        np.testing.assert_array_equal(g(x), 2 * host)


@pytest.mark.parametrize("spec", [P("x", None, None), P(("a", "b"), None, None)], ids=str)
def test_window_batch_dims_split_without_collectives(rng, spec):
    mesh = cpu_mesh((8,), ("x",)) if spec[0] == "x" else cpu_mesh((2, 4), ("a", "b"))
    host = random_array(rng, (16, 12, 10), np.float32)
    x = jax.device_put(host, NamedSharding(mesh, spec))
    # vmapped over the leading dim, and the same as a fully covered leading dim
    for f in (jax.jit(jax.vmap(lambda a: jax_tma.window(a, (-1, 3), (5, 9), strides=(2, 1)))),
              jax.jit(lambda a: jax_tma.window(a, (0, -1, 3), (16, 5, 9), strides=(1, 2, 1)))):
        assert_no_collectives(f.lower(x).compile().as_text())
        want = np.stack([window_reference(h, (-1, 3), (5, 9), (2, 1)) for h in host])
        assert_bits_equal(f(x), want)


def test_window_over_a_split_spatial_dim_is_replicated(rng):
    # A box that does not cover a sharded dim in full needs that dim's data
    # from every device: XLA gathers it (and the result is still exact).
    mesh = cpu_mesh((8,), ("x",))
    host = random_array(rng, (16, 12), np.float32)
    x = jax.device_put(host, NamedSharding(mesh, P("x", None)))
    f = jax.jit(lambda a: jax_tma.window(a, (3, 1), (6, 6)))
    found = collectives_in(f.lower(x).compile().as_text())
    assert any(c.startswith("all-gather") for c in found), found
    assert_bits_equal(f(x), window_reference(host, (3, 1), (6, 6)))


BROADCAST_CASES = [
    ((2, 4), ("a", "b"), (16, 32), P("a", "b"), 0),
    ((2, 4), ("a", "b"), (16, 32), P("a", "b"), 1),
    ((2, 4), ("a", "b"), (16, 32), P("a", "b"), 2),
    ((8,), ("x",), (4, 16, 8), P(None, "x", None), 1),
    ((2, 2, 2), ("a", "b", "c"), (4, 6, 2, 10), P("b", None, "c", "a"), 3),
]


@pytest.mark.parametrize("mesh_shape,names,shape,spec,axis", BROADCAST_CASES, ids=str)
def test_broadcast_splits_every_dim_of_x_without_collectives(rng, mesh_shape, names, shape,
                                                             spec, axis):
    mesh = cpu_mesh(mesh_shape, names)
    host = random_array(rng, shape, jnp.bfloat16)
    x = jax.device_put(host, NamedSharding(mesh, spec))
    f = jax.jit(lambda a: jax_tma.broadcast(a, 3, axis=axis))
    assert_no_collectives(f.lower(x).compile().as_text())
    y = f(x)
    padded = tuple(spec) + (None,) * (len(shape) - len(spec))
    assert y.sharding.is_equivalent_to(
        NamedSharding(mesh, P(*padded[:axis], None, *padded[axis:])), len(shape) + 1)
    assert_bits_equal(y, broadcast_reference(host, 3, axis))


def test_broadcast_grad_vmap_and_shard_map_without_collectives(rng):
    mesh = cpu_mesh((2, 4), ("a", "b"))
    sharding = NamedSharding(mesh, P("a", "b"))
    host = rng.standard_normal((8, 16)).astype(np.float32)
    x = jax.device_put(host, sharding)
    g = jax.jit(jax.grad(lambda a: (jax_tma.broadcast(a, 4, axis=1) ** 2).sum()))
    assert_no_collectives(g.lower(x).compile().as_text())
    np.testing.assert_allclose(g(x), 8 * host, rtol=1e-6)
    v = jax.jit(jax.vmap(lambda a: jax_tma.broadcast(a, 3), in_axes=1, out_axes=1))
    assert_no_collectives(v.lower(x).compile().as_text())
    assert_bits_equal(v(x), np.moveaxis(broadcast_reference(host.T, 3, 1), 0, 1))
    s = jax.jit(jax.shard_map(lambda a: jax_tma.broadcast(a, 2, axis=2), mesh=mesh,
                              in_specs=P("a", "b"), out_specs=P("a", "b", None)))
    assert_no_collectives(s.lower(x).compile().as_text())
    assert_bits_equal(s(x), broadcast_reference(host, 2, 2))


@pytest.mark.parametrize("spec", [P("x", None, None, None), P(("a", "b"), None, None, None)],
                         ids=str)
def test_im2col_batch_splits_without_collectives(rng, spec):
    mesh = cpu_mesh((8,), ("x",)) if spec[0] == "x" else cpu_mesh((2, 4), ("a", "b"))
    host = random_array(rng, (16, 7, 6, 3), np.float32)
    x = jax.device_put(host, NamedSharding(mesh, spec))
    geo = dict(strides=(2, 1), padding=((1, 2), (0, 1)), dilation=(1, 2))
    f = jax.jit(lambda a: jax_tma.im2col(a, (3, 2), **geo))
    assert_no_collectives(f.lower(x).compile().as_text())
    y = f(x)
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, spec), 4)
    want = im2col_reference(host, (3, 2), (2, 1), ((1, 2), (0, 1)), (1, 2))
    assert_bits_equal(y, want)
    # the gradient (col2im) splits the same way
    g = jax.jit(lambda p: jax_tma.col2im(p, host.shape, (3, 2), **geo))
    assert_no_collectives(g.lower(y).compile().as_text())
    assert_bits_equal(g(y), col2im_reference(want, host.shape, (3, 2), (2, 1),
                                             ((1, 2), (0, 1)), (1, 2)))
    v = jax.jit(jax.grad(lambda a: (jax_tma.im2col(a, (3, 2), **geo) ** 2).sum()))
    assert_no_collectives(v.lower(x).compile().as_text())


def test_im2col_under_shard_map(rng):
    mesh = cpu_mesh((8,), ("x",))
    host = random_array(rng, (8, 5, 4), jnp.bfloat16)
    x = jax.device_put(host, NamedSharding(mesh, P("x")))
    f = jax.jit(jax.shard_map(lambda a: jax_tma.im2col(a, 3, padding="SAME"), mesh=mesh,
                              in_specs=P("x"), out_specs=P("x")))
    assert_no_collectives(f.lower(x).compile().as_text())
    assert_bits_equal(f(x), im2col_reference(host, (3,), (1,), ((1, 1),), (1,)))


GATHER_CASES = [
    ((2, 4), ("a", "b"), (16, 8, 12), 0, P(None, "a", "b")),
    ((8,), ("x",), (8, 16, 4), 1, P("x", None, None)),
    ((2, 4), ("a", "b"), (8, 6, 16), 1, P("a", None, "b")),
    ((8,), ("x",), (6, 32), 0, P(None, "x")),
]


@pytest.mark.parametrize("mesh_shape,names,shape,axis,spec", GATHER_CASES, ids=str)
def test_gather_splits_every_dim_but_axis_without_collectives(rng, mesh_shape, names, shape,
                                                              axis, spec):
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


@pytest.mark.parametrize("mesh_shape,names,shape,axis,spec", GATHER_CASES, ids=str)
@pytest.mark.parametrize("mode", ["set", "add"])
def test_scatter_splits_every_dim_but_axis_without_collectives(rng, mesh_shape, names, shape,
                                                               axis, spec, mode):
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


def test_gather_grad_and_vmap_split_without_collectives(rng):
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


def test_tables_split_without_collectives(rng):
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
