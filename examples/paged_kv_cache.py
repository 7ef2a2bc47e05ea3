"""A paged KV cache for LLM decoding with jax_tma.scatter and jax_tma.gather.

The cache is a pool of fixed-size pages (PAGE tokens of K and V each); a page
table maps every sequence's logical pages to pool pages. Each decode step
appends the new token's K and V into their pools in place (one
jax_tma.scatter of both donated pools, one row per sequence) and gathers each
sequence's pages of both pools for attention (one jax_tma.gather of both: the
pools are the tables of one call, one kernel launch on the GPU). A jitted
loop of decode steps is checked against the same model with a dense
(batch, max_len) cache.

    python examples/paged_kv_cache.py
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

import jax_tma

BATCH, HEADS, DIM, PAGE, PAGES_PER_SEQ = 4, 2, 16, 8, 6
MAX_LEN = PAGE * PAGES_PER_SEQ
POOL_PAGES = BATCH * PAGES_PER_SEQ + 5  # some pages belong to nobody


def attend(q, k, v, length):
    """q: (B, H, D); k, v: (B, T, H, D), positions >= length masked out."""
    logits = jnp.einsum("bhd,bthd->bht", q, k) / np.sqrt(DIM)
    mask = jnp.arange(k.shape[1])[None, None, :] < length[:, None, None]
    weights = jax.nn.softmax(jnp.where(mask, logits, -jnp.inf), axis=-1)
    return jnp.einsum("bht,bthd->bhd", weights, v)


def project(x, w):
    """The toy model: q, k, v of one token from its embedding x (B, D)."""
    return [jnp.einsum("bd,dhe->bhe", x, w[i]) for i in range(3)]


def paged_step(pools, page_table, length, x, w):
    """Appends this step's K and V at position `length` and attends over the
    sequence so far. pools: K and V, each (POOL_PAGES * PAGE, H, D) rows."""
    q, k, v = project(x, w)
    page = page_table[jnp.arange(BATCH), length // PAGE]
    row = page * PAGE + length % PAGE  # the token's row in the pools
    # In place: the pools are donated to the jitted loop, so only B rows move.
    pools = jax_tma.scatter(pools, row, (k, v))
    pages = tuple(pool.reshape(POOL_PAGES, PAGE, HEADS, DIM) for pool in pools)
    seq_k, seq_v = jax_tma.gather(pages, page_table)  # each (B, PAGES_PER_SEQ, PAGE, H, D)
    seq_k, seq_v = (s.reshape(BATCH, MAX_LEN, HEADS, DIM) for s in (seq_k, seq_v))
    return pools, attend(q, seq_k, seq_v, length + 1)


def dense_step(cache, length, x, w):
    q, k, v = project(x, w)
    b = jnp.arange(BATCH)
    cache = cache.at[0, b, length].set(k).at[1, b, length].set(v)
    return cache, attend(q, cache[0], cache[1], length + 1)


@functools.partial(jax.jit, donate_argnums=0)
def paged_decode(pools, page_table, xs, w):
    def body(pools, step):
        t, x = step
        return paged_step(pools, page_table, jnp.full((BATCH,), t), x, w)
    return jax.lax.scan(body, pools, (jnp.arange(xs.shape[0]), xs))


@jax.jit
def dense_decode(xs, w):
    cache = jnp.zeros((2, BATCH, MAX_LEN, HEADS, DIM), xs.dtype)

    def body(cache, step):
        t, x = step
        return dense_step(cache, jnp.full((BATCH,), t), x, w)
    return jax.lax.scan(body, cache, (jnp.arange(xs.shape[0]), xs))


def main() -> None:
    key = jax.random.key(0)
    steps = MAX_LEN - 3
    xs = jax.random.normal(key, (steps, BATCH, DIM), jnp.float32)
    w = jax.random.normal(jax.random.fold_in(key, 1), (3, DIM, HEADS, DIM)) / np.sqrt(DIM)
    # Each sequence gets distinct random pool pages.
    page_table = jax.random.permutation(jax.random.fold_in(key, 2), POOL_PAGES)
    page_table = page_table[: BATCH * PAGES_PER_SEQ].reshape(BATCH, PAGES_PER_SEQ)
    pools = tuple(jnp.zeros((POOL_PAGES * PAGE, HEADS, DIM), jnp.float32) for _ in "kv")
    pools, out = paged_decode(pools, page_table.astype(jnp.int32), xs, w)
    cache, want = dense_decode(xs, w)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    # The pools hold exactly the dense cache's tokens, page by page.
    pages = np.stack(pools).reshape(2, POOL_PAGES, PAGE, HEADS, DIM)
    seq = pages[:, np.asarray(page_table)].reshape(2, BATCH, MAX_LEN, HEADS, DIM)
    np.testing.assert_array_equal(seq[:, :, :steps], np.asarray(cache)[:, :, :steps])
    print(f"{steps} decode steps over a paged cache of {POOL_PAGES} pages equal the dense cache")
    print("paged_kv_cache OK")


if __name__ == "__main__":
    main()
