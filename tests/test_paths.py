"""The per-op, per-path handler counters (jax_tma._ffi.path_counts) that the
GPU tests use to check which kernel ran: every path is listed, and each op's
CPU handler counts its calls, and only its own path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_tma
from jax_tma import _ffi
from paths import assert_path, paths_ran
from reference import cpu_device

PATHS = {
    "copy": ("cpu", "bulk", "simt"),
    "window": ("cpu", "tiled", "simt"),
    "im2col": ("cpu", "tma", "simt"),
    "broadcast": ("cpu", "store", "multicast", "dsmem", "simt"),
    "ppermute": ("cpu", "bulk", "simt"),
    "gather": ("cpu", "bulk", "simt"),
    "scatter": ("cpu", "bulk", "simt", "ordered"),
}


def test_every_path_is_counted():
    counts = _ffi.path_counts()
    assert sorted(counts) == sorted(f"{op}.{p}" for op, ps in PATHS.items() for p in ps)
    assert all(isinstance(n, int) and n >= 0 for n in counts.values())


@pytest.mark.parametrize("op, call", [
    ("copy", lambda x: jax_tma.copy(x, method="bulk")),
    ("window", lambda x: jax_tma.window(x, (1, -2), (4, 8))),
    ("im2col", lambda x: jax_tma.im2col(x[None, :, :, None], 3)),
    ("broadcast", lambda x: jax_tma.broadcast(x, 3, method="multicast")),
    ("gather", lambda x: jax_tma.gather(x, jnp.array([3, -1, 9]), method="tma")),
    ("scatter", lambda x: jax_tma.scatter(x, jnp.array([3, -1, 9]), x[:3], mode="add")),
], ids=["copy", "window", "im2col", "broadcast", "gather", "scatter"])
def test_cpu_handlers_count_their_calls(rng, op, call):
    x = jax.device_put(rng.standard_normal((8, 16)).astype(np.float32), cpu_device())
    for calls in (1, 2):
        f = jax.jit(call)  # a fresh executable each time
        with paths_ran() as ran:
            for _ in range(calls):
                jax.block_until_ready(f(x))
        assert ran == {f"{op}.cpu": calls}
        assert_path(ran, f"{op}.cpu")


def test_assert_path_names_what_ran():
    with pytest.raises(AssertionError, match=r"expected window\.tiled alone, the handlers ran "
                                             r"\{'window\.cpu': 1\}"):
        assert_path({"window.cpu": 1}, "window.tiled")
    with pytest.raises(AssertionError, match="expected copy.bulk alone"):
        assert_path({"copy.bulk": 1, "copy.simt": 1}, "copy.bulk")
    assert_path({"copy.bulk": 2, "window.simt": 1}, "copy.bulk")  # other ops do not matter


def test_a_failing_call_counts_nothing():
    call = jax.ffi.ffi_call("jax_tma_copy", jax.ShapeDtypeStruct((5,), jnp.float32))
    with paths_ran() as ran, pytest.raises(Exception, match="output has 5 elements"):
        jax.block_until_ready(jax.jit(lambda a: call(a, method="auto"))(
            jax.device_put(jnp.ones(4, jnp.float32), cpu_device())))
    assert ran == {}
