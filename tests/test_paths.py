"""The per-op, per-path handler counters (jax_tma._ffi.path_counts) that the
GPU tests use to check which kernel ran: every path the family manifests
declare is counted, and each op's CPU handler counts its calls, and only its
own path. On a GPU, one call per CUDA path runs on that path alone and gives
the CPU handler's result bit for bit: the kernels' smoke test, which
scripts/gpu_check.sh's quick tier runs after any kernel change."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_tma
from jax_tma import _ffi, _jax_tma
from paths import assert_path, paths_ran, run_on_path
from reference import assert_bits_equal, cpu_device, random_array


_PAIR = jax.sharding.Mesh(np.array(jax.devices("cpu")[:2]), ("i",))
_ppermute = jax.shard_map(lambda b: jax_tma.ppermute(b, "i", [(0, 1), (1, 0)]), mesh=_PAIR,
                          in_specs=P("i"), out_specs=P("i"))

# One call per op (the op of each FFI target "jax_tma_<op>"), where its input
# lives and how many handler calls it makes (one per device), which its CPU
# handler counts; tests/test_families.py holds every family's targets to it.
CPU_CALLS = {
    "copy": (lambda x: jax_tma.copy(x, method="tma"), None, 1),
    "window": (lambda x: jax_tma.window(x, (1, -2), (4, 8)), None, 1),
    "im2col": (lambda x: jax_tma.im2col(x[None, :, :, None], 3), None, 1),
    "broadcast": (lambda x: jax_tma.broadcast(x, 3, method="multicast"), None, 1),
    "gather": (lambda x: jax_tma.gather(x, jnp.array([3, -1, 9]), method="tma"), None, 1),
    "scatter": (lambda x: jax_tma.scatter(x, jnp.array([3, -1, 9]), x[:3], mode="add"), None, 1),
    "ppermute": (_ppermute, NamedSharding(_PAIR, P("i")), 2),
}


def _self_permute(method):
    """ppermute onto itself over a one-device mesh of `device`."""
    def call(x, device):
        mesh = jax.sharding.Mesh(np.array([device]), ("i",))
        return jax.shard_map(lambda b: jax_tma.ppermute(b, "i", [(0, 0)], method=method),
                             mesh=mesh, in_specs=P("i"), out_specs=P("i"))(x)
    return call


# One call per CUDA path of every family (each forcing its path where `auto`
# would not take it) of a random float32 array of shape (64, 16) on `device`.
GPU_CALLS = {
    "copy.tma": lambda x, device: jax_tma.copy(x, method="tma"),
    "copy.simt": lambda x, device: jax_tma.copy(x, method="simt"),
    "window.tiled": lambda x, device: jax_tma.window(x, (1, -2), (4, 8), method="tma"),
    "window.simt": lambda x, device: jax_tma.window(x, (1, -2), (4, 8), method="simt"),
    "im2col.tma": lambda x, device: jax_tma.im2col(x.reshape(4, 8, 8, 4), 3, method="tma"),
    "im2col.simt": lambda x, device: jax_tma.im2col(x.reshape(4, 8, 8, 4), 3, method="simt"),
    "broadcast.store": lambda x, device: jax_tma.broadcast(x, 3, method="store"),
    "broadcast.multicast": lambda x, device: jax_tma.broadcast(x, 3, method="multicast"),
    "broadcast.dsmem": lambda x, device: jax_tma.broadcast(x, 3, method="dsmem"),
    "broadcast.simt": lambda x, device: jax_tma.broadcast(x, 3, method="simt"),
    "gather.tma": lambda x, device: jax_tma.gather(x, jnp.array([3, -1, 9, 70]), method="tma"),
    "gather.simt": lambda x, device: jax_tma.gather(x, jnp.array([3, -1, 9, 70]), method="simt"),
    "scatter.tma": lambda x, device: jax_tma.scatter(x, jnp.array([3, -1, 70]), x[:3],
                                                     method="tma"),
    "scatter.simt": lambda x, device: jax_tma.scatter(x, jnp.array([3, -1, 70]), x[:3],
                                                      method="simt"),
    "scatter.ordered": lambda x, device: jax_tma.scatter(x, jnp.array([3, 3, 7]), x[:3],
                                                         mode="add", deterministic=True),
    "ppermute.tma": _self_permute("tma"),
    "ppermute.simt": _self_permute("simt"),
}


def test_every_cuda_path_has_a_gpu_call():
    declared = {p for family in _jax_tma.families().values() for p in family["paths"]
                if not p.endswith(".cpu")}
    assert sorted(GPU_CALLS) == sorted(declared), \
        "tests/test_paths.py's GPU_CALLS needs one call per CUDA path of the manifests"


@pytest.mark.gpu
@pytest.mark.quick
@pytest.mark.parametrize("path", sorted(GPU_CALLS))
def test_each_cuda_path_runs_alone_and_matches_the_cpu(gpu, rng, path):
    x = random_array(rng, (64, 16), np.float32)
    call = jax.jit(GPU_CALLS[path], static_argnums=1)
    want = call(jax.device_put(x, cpu_device()), cpu_device())
    assert_bits_equal(run_on_path(path, call, jax.device_put(x, gpu), gpu), want)


def test_every_path_is_counted():
    counts = _ffi.path_counts()
    declared = [p for family in _jax_tma.families().values() for p in family["paths"]]
    assert sorted(counts) == sorted(declared)
    assert all(isinstance(n, int) and n >= 0 for n in counts.values())


@pytest.mark.parametrize("op", sorted(CPU_CALLS))
def test_cpu_handlers_count_their_calls(rng, op):
    call, where, handler_calls = CPU_CALLS[op]
    x = jax.device_put(rng.standard_normal((8, 16)).astype(np.float32), where or cpu_device())
    for calls in (1, 2):
        f = jax.jit(call)  # a fresh executable each time
        with paths_ran() as ran:
            for _ in range(calls):
                jax.block_until_ready(f(x))
        assert ran == {f"{op}.cpu": calls * handler_calls}
        assert_path(ran, f"{op}.cpu")


def test_assert_path_names_what_ran():
    with pytest.raises(AssertionError, match=r"expected window\.tiled alone, the handlers ran "
                                             r"\{'window\.cpu': 1\}"):
        assert_path({"window.cpu": 1}, "window.tiled")
    with pytest.raises(AssertionError, match="expected copy.tma alone"):
        assert_path({"copy.tma": 1, "copy.simt": 1}, "copy.tma")
    assert_path({"copy.tma": 2, "window.simt": 1}, "copy.tma")  # other ops do not matter


def test_a_failing_call_counts_nothing():
    call = jax.ffi.ffi_call("jax_tma_copy", jax.ShapeDtypeStruct((5,), jnp.float32))
    with paths_ran() as ran, pytest.raises(Exception, match="output has 5 elements"):
        jax.block_until_ready(jax.jit(lambda a: call(a, method="auto"))(
            jax.device_put(jnp.ones(4, jnp.float32), cpu_device())))
    assert ran == {}
