"""jax_tma.all_to_all on 8 host devices: lax.all_to_all's result bit for bit
for every split and concat dim (the batch dim included), tiled or not, over
one mesh axis or both; pytrees; axis_index_groups through lax; grads where
lax's own fail; each validation rule's message. The mode tests
(tests/families/ppermute.py's OPS) cover jit, vmap, grad, export and every
dtype."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import jax_tma
from families.ppermute import all_to_all_reference
from reference import assert_bits_equal, random_array

MESH = Mesh(np.array(jax.devices("cpu")[:8]).reshape(2, 4), ("a", "b"))
BOTH = ("a", "b")


def _on_mesh(fn, spec=P(BOTH)):
    return jax.jit(jax.shard_map(fn, mesh=MESH, in_specs=spec, out_specs=spec))


def _block_shape(split, tiled, n):
    shape = [2, 3, 5]
    shape[split] = 2 * n if tiled else n
    return shape


@pytest.mark.parametrize("axes", ["b", BOTH])
@pytest.mark.parametrize("tiled", [True, False])
@pytest.mark.parametrize("split,concat", [(0, 0), (0, 1), (1, 0), (1, 2), (2, 1), (-1, 0)])
def test_matches_lax_bit_for_bit(rng, axes, tiled, split, concat):
    n = 4 if axes == "b" else 8
    block = _block_shape(split % 3, tiled, n)
    x = random_array(rng, (8 * block[0], *block[1:]), np.uint32)
    ours = _on_mesh(lambda b: jax_tma.all_to_all(b, axes, split, concat, tiled=tiled))(x)
    # lax's own axes non-negative: jax 0.10.2's lax.all_to_all misreads -1
    want = _on_mesh(lambda b: lax.all_to_all(b, axes, split % 3, concat % 3, tiled=tiled))(x)
    assert_bits_equal(ours, want)
    if axes == BOTH:  # one group of all 8 blocks: the NumPy reference's 1-D mesh
        assert_bits_equal(ours, all_to_all_reference(x, 8, split % 3, concat % 3, tiled))


def test_a_pytree_exchanges_each_leaf(rng):
    tree = {"k": random_array(rng, (64, 8), np.float32), "v": [random_array(rng, (8, 16), np.int8)]}
    f = _on_mesh(lambda t: jax_tma.all_to_all(t, BOTH, 1, 0, tiled=True), spec=P(BOTH))
    g = _on_mesh(lambda t: lax.all_to_all(t, BOTH, 1, 0, tiled=True), spec=P(BOTH))
    for got, want in zip(jax.tree.leaves(f(tree)), jax.tree.leaves(g(tree))):
        assert_bits_equal(got, want)


def test_axis_index_groups_go_through_lax_and_say_so(rng, caplog):
    x = random_array(rng, (16, 2), np.float32)
    groups = [[0, 1], [2, 3]]
    with caplog.at_level(logging.DEBUG, logger="jax_tma"):
        ours = _on_mesh(lambda b: jax_tma.all_to_all(b, "b", 0, 0, axis_index_groups=groups,
                                                     tiled=True))(x)
    want = _on_mesh(lambda b: lax.all_to_all(b, "b", 0, 0, axis_index_groups=groups,
                                             tiled=True))(x)
    assert_bits_equal(ours, want)
    assert "lax.all_to_all, because axis_index_groups is given" in caplog.text


def test_the_debug_log_names_the_transport(rng, caplog):
    x = random_array(rng, (64, 2), np.float32)
    with caplog.at_level(logging.DEBUG, logger="jax_tma"):
        _on_mesh(lambda b: jax_tma.all_to_all(b, BOTH, 0, 1, tiled=True))(x)
    assert "jax_tma.all_to_all over ('a', 'b') at " in caplog.text
    assert ("jax_tma_all_to_all (cpu peer copies between 8 devices of this process, 7 steps)"
            in caplog.text)


@pytest.mark.parametrize("split,concat", [(1, 2), (2, 1), (0, 1)])
def test_grad_is_the_reverse_exchange_where_lax_grad_fails(rng, split, concat):
    # jax's grad of lax.all_to_all(tiled=False) with split_axis != concat_axis
    # fails in jax 0.12.0.1 ("Expected cotangent type"); ours is the reverse
    # exchange, checked against NumPy.
    block = _block_shape(split, False, 8)
    x = random_array(rng, (8 * block[0], *block[1:]), np.float32)
    f = jax.shard_map(lambda b: jax_tma.all_to_all(b, BOTH, split, concat), mesh=MESH,
                      in_specs=P(BOTH), out_specs=P(BOTH))
    y, pull = jax.vjp(f, x)
    ct = random_array(rng, y.shape, np.float32)
    assert_bits_equal(y, all_to_all_reference(x, 8, split, concat, False))
    assert_bits_equal(pull(ct)[0], all_to_all_reference(ct, 8, concat, split, False))


def _bad(rng, call, shape=(16, 8)):
    x = random_array(rng, shape, np.float32)
    return _on_mesh(call)(x)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(split_axis=0.0, concat_axis=0), TypeError, r"jax_tma\.all_to_all: split_axis must be an int, got 0\.0"),
    (dict(split_axis=0, concat_axis=True), TypeError, r"concat_axis must be an int, got True"),
    (dict(split_axis=0, concat_axis=0, tiled=1), TypeError, r"tiled must be a bool, got 1"),
    (dict(split_axis=2, concat_axis=0), ValueError, r"split_axis 2 is out of range for a block of rank 2"),
    (dict(split_axis=0, concat_axis=-3), ValueError, r"concat_axis -3 is out of range for a block of rank 2"),
    (dict(split_axis=0, concat_axis=0, tiled=True), ValueError,
     r"x\.shape\[0\] = 2 is not a multiple of the 8 positions along \('a', 'b'\)"),
    (dict(split_axis=1, concat_axis=0, tiled=False), ValueError, r"x\.shape\[1\] = 4 must equal the 8 positions"),
])
def test_bad_arguments_are_refused_by_name(rng, kwargs, error, match):
    with pytest.raises(error, match=match):
        _bad(rng, lambda b: jax_tma.all_to_all(b, BOTH, **kwargs), shape=(16, 4))


def test_axis_names_are_checked(rng):
    with pytest.raises(NameError, match=r"jax_tma\.all_to_all: axis name 'c' is not bound here; "
                                        r"call all_to_all inside shard_map"):
        _bad(rng, lambda b: jax_tma.all_to_all(b, "c", 0, 0, tiled=True))
    with pytest.raises(ValueError, match=r"axis_name \('b', 'a'\) must list the mesh axes in the "
                                         r"mesh's order"):
        _bad(rng, lambda b: jax_tma.all_to_all(b, ("b", "a"), 0, 0, tiled=True), shape=(64, 1))
    with pytest.raises(TypeError, match=r"axis_name must be a mesh axis name or a tuple of them"):
        _bad(rng, lambda b: jax_tma.all_to_all(b, 3, 0, 0, tiled=True))
    with pytest.raises(TypeError, match=r"jax_tma\.all_to_all: x must be an array"):
        _bad(rng, lambda b: jax_tma.all_to_all([b, "s"], BOTH, 0, 0, tiled=True), shape=(64, 1))


def test_empty_blocks_exchange(rng):
    x = np.zeros((64, 0), np.float32)
    ours = _on_mesh(lambda b: jax_tma.all_to_all(b, BOTH, 0, 1, tiled=True))(x)
    assert ours.shape == (8, 0) and ours.dtype == jnp.float32
