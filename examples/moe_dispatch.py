"""Mixture-of-experts routing with jax_tma.gather and jax_tma.scatter.

Top-k routing sends each token to k experts. Dispatch gathers the tokens'
rows in expert order (jax_tma.gather: one row copy per slot); each expert
multiplies its contiguous block by its weights; combine scatter-adds every
slot's weighted output back to its token (jax_tma.scatter, mode="add").
The forward pass and its gradient are checked against the dense one-hot
formulation (every token through every expert, masked by the router).

    python examples/moe_dispatch.py
"""

import jax
import jax.numpy as jnp
import numpy as np

import jax_tma

TOKENS, DIM, HIDDEN, EXPERTS, TOP_K = 64, 32, 48, 8, 2
CAPACITY = TOKENS * TOP_K // EXPERTS * 2  # slots per expert; ample for this router


def route(x, w_router):
    """Top-k experts per token and their softmax gates."""
    logits = x @ w_router
    gates, experts = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), TOP_K)
    return gates, experts


def moe(x, w_router, w1, w2):
    gates, experts = route(x, w_router)
    flat_expert = experts.reshape(-1)                     # (TOKENS * TOP_K,)
    flat_token = jnp.repeat(jnp.arange(TOKENS), TOP_K)
    # Each (token, choice) gets a slot in its expert's block, in token order.
    order = jnp.argsort(flat_expert, stable=True)
    rank = jnp.arange(order.size) - jnp.searchsorted(flat_expert[order], flat_expert[order])
    slot = jnp.zeros_like(order).at[order].set(flat_expert[order] * CAPACITY + rank)
    # slot -> token (slots nobody uses point past the end: gather fills 0).
    token_of_slot = jnp.full((EXPERTS * CAPACITY,), TOKENS).at[slot].set(flat_token)
    xe = jax_tma.gather(x, token_of_slot)                 # dispatch: (E * C, DIM)
    xe = xe.reshape(EXPERTS, CAPACITY, DIM)
    h = jax.nn.gelu(jnp.einsum("ecd,edh->ech", xe, w1))
    ye = jnp.einsum("ech,ehd->ecd", h, w2).reshape(EXPERTS * CAPACITY, DIM)
    weighted = jax_tma.gather(ye, slot) * gates.reshape(-1, 1)   # (TOKENS * TOP_K, DIM)
    # combine: every choice's output added back to its token
    return jax_tma.scatter(jnp.zeros_like(x), flat_token, weighted, mode="add")


def moe_dense(x, w_router, w1, w2):
    gates, experts = route(x, w_router)
    mask = (jax.nn.one_hot(experts, EXPERTS) * gates[..., None]).sum(axis=1)  # (T, E)
    h = jax.nn.gelu(jnp.einsum("td,edh->teh", x, w1))
    y = jnp.einsum("teh,ehd->ted", h, w2)
    return jnp.einsum("te,ted->td", mask, y)


def main() -> None:
    keys = jax.random.split(jax.random.key(0), 5)
    x = jax.random.normal(keys[0], (TOKENS, DIM), jnp.float32)
    w_router = jax.random.normal(keys[1], (DIM, EXPERTS))
    w1 = jax.random.normal(keys[2], (EXPERTS, DIM, HIDDEN)) / np.sqrt(DIM)
    w2 = jax.random.normal(keys[3], (EXPERTS, HIDDEN, DIM)) / np.sqrt(HIDDEN)
    y = jax.jit(moe)(x, w_router, w1, w2)
    np.testing.assert_allclose(y, moe_dense(x, w_router, w1, w2), rtol=1e-4, atol=1e-4)

    def loss(fn):
        return lambda x, w1, w2: (fn(x, w_router, w1, w2) ** 2).sum()

    grads = jax.jit(jax.grad(loss(moe), argnums=(0, 1, 2)))(x, w1, w2)
    want = jax.grad(loss(moe_dense), argnums=(0, 1, 2))(x, w1, w2)
    for g, w in zip(grads, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    print(f"top-{TOP_K} MoE over {EXPERTS} experts: output and gradients equal the dense "
          "one-hot formulation")
    print("moe_dispatch OK")


if __name__ == "__main__":
    main()
