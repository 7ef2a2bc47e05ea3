"""One training step of a mixture-of-experts layer whose experts are sharded
over the devices (expert parallelism), with jax_tma.moe_dispatch and
jax_tma.moe_combine, checked against the dense formulation: the loss, and
the gradients of the router and of every expert's weights.

Each device holds its tokens and EXPERTS / n of the experts. The router
picks each token's top-k experts; moe_dispatch sends each token once to each
device that owns one of them and returns the rows grouped by local expert;
lax.ragged_dot runs the experts; moe_combine brings each token's weighted
sum home. On a machine without GPUs eight host devices stand in for them;
with GPUs, jax.devices() are the GPUs (EXPERTS must divide by their number).

    python examples/moe_expert_parallel.py
"""

import functools
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_tma  # noqa: E402

TOKENS, DIM, HIDDEN, EXPERTS, TOP_K = 16, 32, 64, 16, 2  # TOKENS: per device
LEARNING_RATE = 0.1
# float32 dots in full float32 (a GPU's default is TF32), so that both layers
# round alike and the check below can be tight.
EXACT = lax.Precision.HIGHEST


def route(x, router):
    """Each token's top-k experts and their softmax gates."""
    logits = jnp.matmul(x, router, precision=EXACT)
    gates, experts = lax.top_k(jax.nn.softmax(logits, axis=-1), TOP_K)
    return gates, experts


def moe_layer(x, router, w1, w2):
    """Inside shard_map: x is this device's tokens, w1 and w2 its experts'."""
    gates, experts = route(x, router)
    recv, plan = jax_tma.moe_dispatch(x, experts, num_experts=EXPERTS, axis_name="expert")
    h = jax.nn.gelu(lax.ragged_dot(recv, w1, plan.group_sizes, precision=EXACT))
    y = lax.ragged_dot(h, w2, plan.group_sizes, precision=EXACT)
    return jax_tma.moe_combine(y, plan, gates)


def dense_layer(x, router, w1, w2):
    """Every token through every expert, the outputs weighted by the gates."""
    gates, experts = route(x, router)
    mask = (jax.nn.one_hot(experts, EXPERTS) * gates[..., None]).sum(axis=1)  # (T, E)
    h = jax.nn.gelu(jnp.einsum("td,edh->teh", x, w1, precision=EXACT))
    return jnp.einsum("te,teh,ehd->td", mask, h, w2, precision=EXACT)


def train_step(layer, params, x, target):
    """The loss, its gradients and the parameters after one SGD step."""
    def loss(params):
        return jnp.mean((layer(x, *params) - target) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    return value, grads, jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)


def main() -> None:
    mesh = Mesh(np.array(jax.devices()), ("expert",))
    n = mesh.size
    keys = jax.random.split(jax.random.key(0), 5)
    x = jax.random.normal(keys[0], (n * TOKENS, DIM))
    target = jax.random.normal(keys[1], (n * TOKENS, DIM))
    params = (jax.random.normal(keys[2], (DIM, EXPERTS)),                       # router
              jax.random.normal(keys[3], (EXPERTS, DIM, HIDDEN)) / np.sqrt(DIM),  # w1
              jax.random.normal(keys[4], (EXPERTS, HIDDEN, DIM)) / np.sqrt(HIDDEN))  # w2

    # Tokens split over the devices, the router on every device, the experts
    # split over the devices: device d holds experts d * EXPERTS / n on.
    specs = (P(), P("expert"), P("expert"))
    layer = jax.shard_map(moe_layer, mesh=mesh, in_specs=(P("expert"),) + specs,
                          out_specs=P("expert"))
    placed = [jax.device_put(p, NamedSharding(mesh, s)) for p, s in zip(params, specs)]
    tokens = [jax.device_put(a, NamedSharding(mesh, P("expert"))) for a in (x, target)]
    loss, grads, _ = jax.jit(functools.partial(train_step, layer))(tuple(placed), *tokens)

    want_loss, want_grads, _ = jax.jit(functools.partial(train_step, dense_layer))(
        params, x, target)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-4)
    for name, got, want in zip(("router", "w1", "w2"), grads, want_grads):
        scale = float(np.abs(want).max())
        error = float(np.abs(np.asarray(got) - np.asarray(want)).max())
        assert error <= 1e-4 * scale, f"{name}: gradient off by {error} (scale {scale})"
    print(f"{n} devices ({mesh.devices.flat[0].platform}), {EXPERTS // n} experts each: "
          f"loss {float(loss):.6f}, dense {float(want_loss):.6f}; the gradients of the router "
          "and of every expert equal the dense formulation's")
    print("moe_expert_parallel OK")


if __name__ == "__main__":
    main()
