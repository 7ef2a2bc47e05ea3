"""jax_tma.copy: a bit-exact whole-array copy as a JAX primitive (jit, vmap,
AD, shard_map and NamedSharding partitioning without collectives)."""

from __future__ import annotations

import functools
from typing import Literal

import jax
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jax_tma import _ffi
from jax_tma._dtypes import SUB_BYTE_WIDE
from jax_tma._window import tiled_copy

CopyMethod = Literal["auto", "bulk", "simt", "tiled"]
_METHODS = ("auto", "bulk", "simt", "tiled")

copy_p = Primitive("jax_tma_copy")


@functools.cache
def _jitted_bind(method: str):
    return jax.jit(functools.partial(copy_p.bind, method=method))


copy_p.def_impl(lambda x, *, method: _jitted_bind(method)(x))
# The output has the input's shape, dtype, sharding and varying-mesh-axes.
copy_p.def_abstract_eval(lambda x, *, method: x)


def _copy_batcher(args, dims, *, method):
    (x,), (d,) = args, dims
    return copy_p.bind(x, method=method), d


batching.primitive_batchers[copy_p] = _copy_batcher
# copy is linear: its tangent and its cotangent are copies too.
ad.deflinear2(copy_p, lambda ct, x, *, method: [copy_p.bind(ct, method=method)])


_lowering = _ffi.elementwise_lowering("jax_tma_copy")


def _cuda_lowering(ctx, x, *, method):
    if method == "bulk":
        for i, cap in enumerate(_ffi.gpu_compute_capabilities()):
            if cap < (9, 0):
                raise RuntimeError(
                    "jax_tma.copy: method='bulk' needs TMA (compute capability "
                    f">= 9.0), but GPU {i} has compute capability {cap[0]}.{cap[1]}; "
                    "use method='auto' or 'simt'"
                )
    return _lowering(ctx, x, method=method)


mlir.register_lowering(copy_p, _lowering, platform="cpu")
mlir.register_lowering(copy_p, _cuda_lowering, platform="cuda")


def copy(x: jax.Array | np.ndarray, *, method: CopyMethod = "auto") -> jax.Array:
    """Returns a new array equal to ``x`` bit for bit.

    On Hopper/Blackwell GPUs the default method streams the bytes through
    shared memory with the Tensor Memory Accelerator (``cp.async.bulk``,
    several stages in flight per CTA). Works under ``jit``, ``vmap``,
    ``grad``, ``shard_map`` and on sharded arrays (every dimension may be
    split; no collectives are inserted).

    Args:
      x: an array of any dtype (sub-byte types are widened around the copy)
        and any shape, including 0-d and zero-size.
      method: ``"auto"`` (bulk TMA where the GPU has it and the copy is at
        least 32 MiB; below that the SIMT kernel measured faster),
        ``"bulk"`` (TMA; an error on GPUs below compute capability 9.0),
        ``"simt"`` (a plain vectorised CUDA copy) or ``"tiled"`` (the
        tensor-map machinery of :func:`jax_tma.window` over the whole array;
        an error naming the tensor-map rule where it cannot run). On the CPU
        every method gives the same host copy.

    Returns:
      A new array with ``x``'s shape, dtype and bits.

    Example:
      >>> import jax, jax.numpy as jnp, jax_tma
      >>> x = jnp.arange(6.0).reshape(2, 3)
      >>> y = jax.jit(jax_tma.copy)(x)
      >>> bool((y == x).all())
      True
    """
    if not isinstance(x, (jax.Array, np.ndarray, np.generic)):
        raise TypeError(
            "jax_tma.copy: x must be an array (jax.Array or numpy.ndarray), got "
            f"{type(x).__name__} {x!r:.80}; wrap Python values in jnp.asarray"
        )
    if not isinstance(method, str) or method not in _METHODS:
        raise ValueError(
            f"jax_tma.copy: method must be one of {', '.join(map(repr, _METHODS))}, "
            f"got {method!r}"
        )
    _ffi.register()
    x = jax.numpy.asarray(x)
    if method == "tiled":
        return tiled_copy(x)
    wide = SUB_BYTE_WIDE.get(x.dtype.name)
    if wide is not None:
        y = copy_p.bind(lax.convert_element_type(x, wide), method=method)
        return lax.convert_element_type(y, x.dtype)
    return copy_p.bind(x, method=method)
