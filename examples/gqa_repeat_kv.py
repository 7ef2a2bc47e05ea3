"""Grouped-query attention's "repeat the K/V heads" step with jax_tma.broadcast.

Keys and values have fewer heads than queries; each K/V head serves
`group = q_heads // kv_heads` query heads. jnp.repeat(k, group, axis=2) is
the usual formulation; jax_tma.broadcast(k, group, axis=3) builds the same
buffer with the replica axis right after the head axis, and a reshape (free:
the layout already matches) merges the two. On a Hopper GPU each K/V tile
is read from memory once and stored `group` times.

    python examples/gqa_repeat_kv.py
"""

import jax
import jax.numpy as jnp

import jax_tma


def repeat_kv(kv: jax.Array, group: int) -> jax.Array:
    """(batch, seq, kv_heads, dim) -> (batch, seq, kv_heads * group, dim),
    each K/V head repeated `group` times in place: jnp.repeat(kv, group, 2)."""
    b, s, h, d = kv.shape
    return jax_tma.broadcast(kv, group, axis=3).reshape(b, s, h * group, d)


def attention(q, k, v, repeat=repeat_kv):
    group = q.shape[2] // k.shape[2]
    k, v = repeat(k, group), repeat(v, group)
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, axis=-1), v)


def main() -> None:
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    batch, seq, q_heads, kv_heads, dim = 2, 64, 8, 2, 32
    q = jax.random.normal(kq, (batch, seq, q_heads, dim), jnp.float32)
    k = jax.random.normal(kk, (batch, seq, kv_heads, dim), jnp.float32)
    v = jax.random.normal(kv, (batch, seq, kv_heads, dim), jnp.float32)
    group = q_heads // kv_heads
    assert bool((repeat_kv(k, group) == jnp.repeat(k, group, axis=2)).all())
    out = jax.jit(attention)(q, k, v)
    ref = jax.jit(lambda q, k, v: attention(q, k, v, lambda a, g: jnp.repeat(a, g, axis=2)))(q, k, v)
    assert bool((out == ref).all())
    print("attention output", out.shape, out.dtype, "equals the jnp.repeat formulation")
    print("gqa_repeat_kv OK")


if __name__ == "__main__":
    main()
