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

from families import CPU_CALLS, GPU_CALLS
from jax_tma import _ffi, _jax_tma
from paths import assert_path, paths_ran, run_on_path
from reference import assert_bits_equal, cpu_device, random_array

# One call per op (CPU_CALLS) and one per CUDA path (GPU_CALLS) of every
# family: its descriptor's (tests/families/<family>.py), which
# tests/test_families.py holds to its targets and paths.


@pytest.mark.gpu
@pytest.mark.quick
@pytest.mark.parametrize("path", sorted(GPU_CALLS))
def test_each_cuda_path_runs_alone_and_matches_the_cpu(gpu, rng, path):
    # (64, 16): multicast splits a tile of several rows among its CTAs
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
    c = CPU_CALLS[op]
    x = jax.device_put(rng.standard_normal((8, 16)).astype(np.float32), c.where or cpu_device())
    for calls in (1, 2):
        f = jax.jit(c.call)  # a fresh executable each time
        with paths_ran() as ran:
            for _ in range(calls):
                jax.block_until_ready(f(x))
        assert ran == {f"{op}.cpu": calls * c.handler_calls}
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
