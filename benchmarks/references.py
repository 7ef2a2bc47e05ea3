"""What the benchmarks measure jax_tma against, from the benchmarks' own
extension module _jax_tma_bench (benchmarks/ffi/, built with
JAX_TMA_BENCH=ON, never in a jax_tma wheel): cudaMemcpyAsync D2D (the copy
ceiling), the seed-style TMA copy, read-only and write-only streams, the
raw launch hook of jax_tma's copy kernels, and cudaMemcpyPeerAsync between
devices timed by CUDA events (the link's ceiling). A smoke run (CPU) gets
jnp stand-ins with the same results, and a host copy for the peer copy."""

from __future__ import annotations

import ctypes
import functools
import time
import types
from collections.abc import Callable
from types import ModuleType

import jax
import jax.numpy as jnp
import numpy as np

from jax_tma import _ffi

BUILD_HINT = ("build it with JAX_TMA_BENCH=ON (it needs the CUDA build), e.g. "
              "`JAX_TMA_CUDA=ON JAX_TMA_BENCH=ON pip install .`, or "
              "`... pip install --no-build-isolation --no-deps --target DIR .` with DIR on "
              "PYTHONPATH")


def load_extension() -> ModuleType:
    """The _jax_tma_bench module; ImportError saying how to build it."""
    try:
        import _jax_tma_bench
    except ImportError as e:
        raise ImportError(f"the benchmarks' extension _jax_tma_bench is not importable ({e}): "
                          + BUILD_HINT) from e
    return _jax_tma_bench


@functools.cache
def register() -> None:
    """Registers jax_tma's targets and the reference targets; once."""
    _ffi.register()
    for name, capsule in load_extension().cuda_registrations().items():
        jax.ffi.register_ffi_target(name, capsule, platform="CUDA")


def ffi_reference(target: str) -> Callable[[jax.Array], jax.Array]:
    """A jitted call of one of the CUDA-only benchmark reference targets."""

    def f(x):
        return jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    return jax.jit(f)


@jax.jit
def read_stream(x: jax.Array) -> jax.Array:
    """The read-only reference: a 16-B XOR checksum of x (CUDA only)."""
    return jax.ffi.ffi_call("jax_tma_bench_read", jax.ShapeDtypeStruct((4,), jnp.uint32))(x)


def xor_checksum(x: jax.Array) -> jax.Array:
    """What read_stream computes, for uint32 x: the XOR of its 16-B vectors."""
    return jax.lax.reduce(x.reshape(-1, 4), np.uint32(0), jax.lax.bitwise_xor, (0,))


class CpuHook:
    """The raw launch hook's stand-in in a smoke run: host memmove of the
    bytes, the shapes and threshold of the real module."""

    dynamic_bulk_min_bytes = _ffi.rules()["copy.dynamic_bulk_min_bytes"]

    @staticmethod
    def shipped_bulk_configs(device):
        return {"static": (32768, 4, 4, False), "dynamic": (8192, 16, 4, True)}

    @staticmethod
    def raw_copy(method, device, dst, src, nbytes, *config):
        ctypes.memmove(dst, src, nbytes)

    @staticmethod
    def synchronize(device):
        pass

    @staticmethod
    def peer_copy(pairs, nbytes, iters):
        """_jax_tma_bench.peer_copy's stand-in: host copies between buffers
        of its own per pair, pairs in turn (the dict of the real one)."""
        buffers = [(ctypes.create_string_buffer(nbytes), ctypes.create_string_buffer(nbytes))
                   for _ in pairs]
        us = []
        for src, dst in buffers:
            t0 = time.perf_counter()
            for _ in range(iters):
                ctypes.memmove(dst, src, nbytes)
            us.append((time.perf_counter() - t0) / iters * 1e6)
        return {"us_per_copy": us, "peer_access": [True] * len(pairs), "queue_us": 0.0,
                "hold_us": 0.0}


def load(smoke: bool) -> types.SimpleNamespace:
    """The references: memcpy, seed_copy, read_stream, write_stream (each
    x -> array), ext (the raw launch hook's module; CpuHook in a smoke run)
    and peer_copy (ext.peer_copy; None where the module was built before it
    had one)."""
    if smoke:
        copy = jax.jit(jnp.copy)
        return types.SimpleNamespace(
            memcpy=copy, seed_copy=copy, read_stream=jax.jit(xor_checksum),
            write_stream=jax.jit(lambda x: jnp.full_like(x, 0x5A5A5A5A)),  # uint32 x
            ext=CpuHook(), peer_copy=CpuHook.peer_copy)
    register()
    ext = load_extension()
    return types.SimpleNamespace(
        memcpy=ffi_reference("jax_tma_bench_memcpy"),
        seed_copy=ffi_reference("jax_tma_bench_seed_copy"),
        read_stream=read_stream, write_stream=ffi_reference("jax_tma_bench_write"),
        ext=ext, peer_copy=getattr(ext, "peer_copy", None))
