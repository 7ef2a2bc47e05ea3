"""What the benchmarks measure jax_tma against, from the benchmarks' own
extension module _jax_tma_bench (benchmarks/ffi/, built with
JAX_TMA_BENCH=ON, never in a jax_tma wheel): cudaMemcpyAsync D2D (the copy
ceiling), the seed-style TMA copy, read-only and write-only streams, and the
raw launch hook of jax_tma's copy kernels."""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType

import jax
import jax.numpy as jnp

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
