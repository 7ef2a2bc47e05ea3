"""jax_tma.broadcast on a CUDA GPU: every method x cluster size x dtype into
poisoned outputs against the NumPy reference, bit-exact; tiles hanging over
the array's edges; n not a multiple of the cluster size; many repetitions
(a moving error is a race); grad, vmap, the GQA repeat; forced-method errors."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_tma
from paths import run_on_path
from families.broadcast import broadcast_reference
from reference import ALL_DTYPES, assert_bits_equal, random_array

pytestmark = pytest.mark.gpu
POISON = 0xA5
BYTE_DTYPES = [d for d in ALL_DTYPES if d.name not in ("int2", "uint2", "int4", "uint4",
                                                       "float4_e2m1fn")]
COMBOS = ([("auto", None), ("store", None), ("simt", None)]
          + [(m, c) for m in ("multicast", "dsmem") for c in (2, 4, 8, 16)])


@functools.cache
def _into_donated(n, axis, method, cluster_size):
    def f(x, poison):
        return jax_tma.broadcast(x, n, axis=axis, method=method, cluster_size=cluster_size)
    return jax.jit(f, donate_argnums=1, keep_unused=True)


def broadcast_poisoned(x, n, axis, method, cluster_size, device, path):
    """Runs the broadcast into a donated, poisoned output buffer (checked to be
    written in place), so unwritten elements would show, and checks that the
    handler took `path` ("broadcast.store", ...)."""
    f = _into_donated(n, axis, method, cluster_size)
    shape = x.shape[:axis] + (n,) + x.shape[axis:]
    poison = jax.device_put(
        np.full(int(np.prod(shape)) * x.dtype.itemsize, POISON, np.uint8)
        .view(x.dtype).reshape(shape), device)
    xd = jax.device_put(x, device)
    hlo = f.lower(xd, poison).compile().as_text()
    assert "input_output_alias" in hlo and not re.search(r"\bcopy(-start)?\(", hlo)
    ptr = poison.unsafe_buffer_pointer()
    y = run_on_path(path, f, xd, poison)
    assert y.unsafe_buffer_pointer() == ptr
    return y


# (x shape, axis, n): tiles over the R and outer edges, one row per outer
# index (GQA-like), a replica of exactly one tile, n below/above/not a
# multiple of every cluster size.
SHAPES = [
    ((37, 3, 256), 1, 5),       # 37 outer x 3 rows of 256 words: edge tiles both ways
    ((4, 8, 64), 2, 3),         # one 256-B row per outer index (GQA-like)
    ((1000, 24), 0, 17),        # one replica of 96 000 B: 375 rows of 32 words
]


@pytest.mark.parametrize("method,cluster_size", COMBOS, ids=str)
def test_every_method_and_cluster_size(gpu, rng, method, cluster_size):
    for (shape, axis, n), dtype in zip(SHAPES, (jnp.bfloat16, np.float32, np.uint8)):
        x = random_array(rng, shape, dtype)
        # Every output is under 8 MiB: auto takes the SIMT kernel.
        path = "broadcast." + ("simt" if method == "auto" else method)
        got = broadcast_poisoned(x, n, axis, method, cluster_size, gpu, path)
        assert_bits_equal(got, broadcast_reference(x, n, axis))


@pytest.mark.parametrize("dtype", BYTE_DTYPES, ids=str)
def test_every_dtype(gpu, rng, dtype):
    x = random_array(rng, (48, 256), dtype)  # rows of >= 128 B: multicast slices align
    for method, cluster_size in (("auto", None), ("multicast", 4), ("dsmem", 8), ("simt", None)):
        path = "broadcast." + ("simt" if method == "auto" else method)
        got = broadcast_poisoned(x, 6, 1, method, cluster_size, gpu, path)
        assert_bits_equal(got, broadcast_reference(x, 6, 1))


@pytest.mark.parametrize("rows,path", [(2048, "broadcast.simt"), (2049, "broadcast.store")])
def test_auto_takes_simt_up_to_8_mib_of_output_and_store_above(gpu, rng, rows, path):
    # 4 replicas of rows x 1 KiB: 8 MiB of output at 2048 rows.
    x = random_array(rng, (rows, 512), jnp.bfloat16)
    assert_bits_equal(broadcast_poisoned(x, 4, 0, "auto", None, gpu, path),
                      broadcast_reference(x, 4, 0))


def test_odd_replica_sizes_take_simt_under_auto(gpu, rng):
    # 3 x 7 x 2 B = 42 B per replica: no tensor-map form; auto gives the same bytes.
    x = random_array(rng, (5, 3, 7), jnp.float16)
    assert_bits_equal(broadcast_poisoned(x, 4, 1, "auto", None, gpu, "broadcast.simt"),
                      broadcast_reference(x, 4, 1))


@pytest.mark.parametrize("method,cluster_size",
                         [("store", None), ("multicast", 2), ("multicast", 16), ("dsmem", 4),
                          ("dsmem", 16)], ids=str)
def test_repetitions_catch_races(gpu, rng, method, cluster_size):
    x = jax.device_put(random_array(rng, (512, 1024), jnp.bfloat16), gpu)
    want = broadcast_reference(np.asarray(x), 7, 0)
    f = jax.jit(functools.partial(jax_tma.broadcast, n=7, method=method,
                                  cluster_size=cluster_size))
    for _ in range(40):
        assert_bits_equal(f(x), want)


def test_forced_tma_method_names_the_rule(gpu, rng):
    x = jax.device_put(random_array(rng, (4, 3, 7), jnp.float16), gpu)
    for method in ("store", "multicast", "dsmem"):
        with pytest.raises(Exception, match=rf"jax_tma\.broadcast: method='{method}' .*cannot "
                           r"run this shape: one replica of x is 42 B, not a multiple of 16"):
            jax.block_until_ready(jax_tma.broadcast(x, 2, axis=1, method=method))
    tiny = jax.device_put(random_array(rng, (2, 16), np.float32), gpu)
    with pytest.raises(Exception, match=r"jax_tma\.broadcast: method='multicast' \(cluster_size "
                       r"16\) cannot run this shape: a tile has 2 rows .* fewer than cluster_size 16"):
        jax.block_until_ready(jax_tma.broadcast(tiny, 3, axis=1, method="multicast",
                                                cluster_size=16))
    narrow = jax.device_put(random_array(rng, (64, 2), np.float64), gpu)
    with pytest.raises(Exception, match=r"jax_tma\.broadcast: method='multicast' \(cluster_size "
                       r"2\) cannot run this shape: a multicast slice is 1 row\(s\) of 16 B = 16 B, "
                       r"not a multiple of 128"):
        jax.block_until_ready(jax_tma.broadcast(narrow, 3, axis=1, method="multicast"))
    assert_bits_equal(jax_tma.broadcast(narrow, 3, axis=1), broadcast_reference(
        np.asarray(narrow), 3, 1))


def test_grad_vmap_and_gqa_on_gpu(gpu, rng):
    x = jax.device_put(rng.standard_normal((64, 48)).astype(np.float32), gpu)
    w = jax.device_put(rng.standard_normal((64, 3, 48)).astype(np.float32), gpu)
    g = jax.jit(jax.grad(lambda a: (jax_tma.broadcast(a, 3, axis=1, method="multicast") * w)
                         .sum()))(x)
    np.testing.assert_allclose(g, np.asarray(w).sum(axis=1), rtol=1e-5, atol=1e-6)
    v = jax.jit(jax.vmap(lambda a: jax_tma.broadcast(a, 4, method="dsmem"), in_axes=1))(x)
    assert_bits_equal(v, broadcast_reference(np.asarray(x).T, 4, 1))
    kv = jax.device_put(random_array(rng, (2, 128, 4, 64), jnp.bfloat16), gpu)
    rep = jax.jit(lambda a: jax_tma.broadcast(a, 8, axis=3).reshape(2, 128, 32, 64))(kv)
    assert_bits_equal(rep, np.repeat(np.asarray(kv), 8, axis=2))
