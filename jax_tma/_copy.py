"""jax_tma.copy: a bit-exact whole-array copy as a JAX primitive (jit, vmap,
AD, shard_map and NamedSharding partitioning without collectives)."""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jax_tma import _checks, _ffi
from jax_tma._window import window_p

CopyMethod = Literal["auto", "bulk", "simt", "tiled"]
_METHODS = ("auto", "bulk", "simt", "tiled")
_OP = "jax_tma.copy"

copy_p = Primitive("jax_tma_copy")
_ffi.def_jitted_impl(copy_p)
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
        _checks.require_tma(_OP, method)
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
    x = _checks.as_array(_OP, "x", x)
    _checks.check_choice(_OP, "method", method, _METHODS)
    _ffi.register()
    if method == "tiled":
        if not all(isinstance(d, int) for d in x.shape):
            raise ValueError(f"{_OP}: method='tiled' views x as rows of a static length, but "
                             f"x.shape={tuple(x.shape)} has symbolic dims; use method='auto'")
        return tiled_copy(x)
    return _checks.narrow(copy_p.bind(_checks.widen(x), method=method), x.dtype)


def tiled_copy(x: jax.Array) -> jax.Array:
    """copy(x, method="tiled"): the whole array as one 2-D window on the TMA
    tensor-map path (forced: an error names the rule where it cannot run).
    The flat array is viewed as rows of L elements, L the largest power of two
    up to 4096 that divides the size and makes a row a multiple of 16 bytes
    (the tensor-map stride rule); without one, rows are the whole array."""
    if x.size == 0:
        return x.copy()
    src = _checks.widen(x)
    itemsize = np.dtype(src.dtype).itemsize
    row = 4096
    while row > 1 and (x.size % row or (row * itemsize) % 16):
        row //= 2
    if (row * itemsize) % 16:
        row = x.size
    rows = src.reshape(-1, row)
    # Bound directly (not through window()): a 2-D box, no batch folding.
    y = window_p.bind(rows, jnp.zeros(2, jnp.int32), shape=rows.shape, strides=(1, 1),
                      fill_bits=0, method="tma")
    return _checks.narrow(y.reshape(x.shape), x.dtype)
