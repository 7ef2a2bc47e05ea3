"""A ring shift across devices with jax_tma.ppermute: every device passes its
block to the next one, as in a ring all-reduce or a pipeline stage hand-off,
and the result is checked against lax.ppermute.

On GPUs with peer access the blocks move GPU to GPU with TMA bulk copies; on
a machine without GPUs four host devices stand in for them.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_tma  # noqa: E402


def ring_shift(fn, mesh):
    n = mesh.size
    perm = [(i, (i + 1) % n) for i in range(n)]
    return jax.jit(jax.shard_map(lambda b: fn(b, "ring", perm), mesh=mesh,
                                 in_specs=P("ring"), out_specs=P("ring")))


def main():
    mesh = Mesh(np.array(jax.devices()), ("ring",))
    x = jax.device_put(jnp.arange(mesh.size * 4, dtype=jnp.float32),
                       NamedSharding(mesh, P("ring")))
    y = ring_shift(jax_tma.ppermute, mesh)(x)
    assert bool((y == ring_shift(jax.lax.ppermute, mesh)(x)).all())
    print(f"{mesh.size} devices ({mesh.devices.flat[0].platform}):", np.asarray(y).tolist())
    print("ring_shift OK")


if __name__ == "__main__":
    main()
