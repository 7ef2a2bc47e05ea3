"""One process of tests/test_ppermute_processes.py: process `pid` of 2 under
jax.distributed with a local coordinator, 2 host devices each, checking
jax_tma.ppermute against lax.ppermute over the global 4-device mesh (1-D and
2-D) on fresh random data every iteration; prints the jax_tma debug log.

    usage: python tests/ppermute_process.py PID PORT SEED
"""

import functools
import logging
import os
import sys

pid, port, seed = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=pid,
                           initialization_timeout=60)

import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_tma  # noqa: E402
from reference import assert_bits_equal, random_array  # noqa: E402

logging.basicConfig(stream=sys.stdout, format="%(name)s: %(message)s")
logging.getLogger("jax_tma").setLevel(logging.DEBUG)
assert jax.process_count() == 2 and len(jax.devices()) == 4, jax.devices()


def check(mesh, axis, perm, dtype, shape, iterations):
    spec = P(*mesh.axis_names)

    def make(fn):
        return jax.jit(jax.shard_map(lambda b: fn(b, axis, perm), mesh=mesh,
                                     in_specs=spec, out_specs=spec))

    ours, ref = make(jax_tma.ppermute), make(lax.ppermute)
    sharding = NamedSharding(mesh, spec)
    # Every process draws the same global array: same seed, same shape.
    rng = np.random.default_rng([seed, iterations, len(shape)])
    for _ in range(iterations):
        x = random_array(rng, shape, dtype)
        g = jax.make_array_from_callback(shape, sharding, lambda index: x[index])
        a, b = ours(g), ref(g)
        for sa, sb in zip(a.addressable_shards, b.addressable_shards, strict=True):
            assert sa.index == sb.index
            assert_bits_equal(sa.data, sb.data)


ring = [(i, (i + 1) % 4) for i in range(4)]
mesh_1d = Mesh(np.array(jax.devices()), ("i",))
for dtype in (np.float32, np.int8, np.uint16, np.complex64, jax.numpy.bfloat16):
    check(mesh_1d, "i", ring, dtype, (4 * 3, 5), iterations=3)
check(mesh_1d, "i", [(0, 3), (3, 1)], np.float64, (4 * 7,), iterations=2)
mesh_2d = Mesh(np.array(jax.devices()).reshape(2, 2), ("a", "b"))
check(mesh_2d, ("a",), [(0, 1), (1, 0)], np.float32, (2 * 3, 2 * 4), iterations=2)
check(mesh_2d, ("a", "b"), ring, np.int32, (2 * 2, 2 * 3), iterations=2)
print(f"process {pid}: ok", flush=True)
