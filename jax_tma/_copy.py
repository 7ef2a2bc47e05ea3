"""jax_tma.copy: a bit-exact whole-array copy as a JAX primitive (jit, vmap,
AD, shard_map and NamedSharding partitioning without collectives)."""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad

from jax_tma import _checks, _ffi, _lowering
from jax_tma._window import window_p

CopyMethod = Literal["auto", "tma", "simt", "tiled"]
_METHODS = ("auto", "tma", "simt", "tiled")
_OP = "jax_tma.copy"


# ---- the public op ----------------------------------------------------------

def copy(x: jax.Array | np.ndarray, *, method: CopyMethod = "auto") -> jax.Array:
    """Returns a new array equal to ``x`` bit for bit.

    NaN payloads, ``-0.0`` and subnormals survive: the op moves bytes and
    never computes. On Hopper/Blackwell GPUs ``method="tma"`` streams the
    bytes through shared memory with the Tensor Memory Accelerator
    (``cp.async.bulk``, several stages in flight per CTA). Works under ``jit``, ``vmap`` (the
    batch is folded into one copy), ``grad`` (a copy is linear: its
    derivative is the identity), ``shard_map`` and on sharded arrays (every
    dimension may be split; the partitioned program has no collectives).

    ``method="auto"`` takes the SIMT copy at every size, on every GPU: on
    an H100 it is as fast as the TMA bulk copy, on an H200 faster (the op's
    page has the numbers); ``method="tma"`` runs the bulk copy.

    Args:
      x: an array of any dtype (bool, integers, floats including bfloat16
        and the float8 types, complex; sub-byte types are widened around the
        copy and narrowed back, every value kept) and any shape, including
        0-d and zero-size; NumPy arrays and Python scalars are converted as
        ``jnp.asarray`` converts them.
      method: ``"auto"`` (the rule above), ``"tma"`` (the TMA bulk copy),
        ``"simt"`` (a vectorised CUDA copy without TMA) or ``"tiled"`` (the
        tensor-map machinery of :func:`jax_tma.window` over the whole array,
        viewed as rows of a multiple of 16 bytes). On the CPU every method
        is the same host copy. ``"bulk"``, the old name of ``"tma"``, still
        works and emits a ``DeprecationWarning``.

    Returns:
      A new array with ``x``'s shape, dtype, sharding and bits.

    Raises:
      TypeError: ``x`` is neither an array nor a scalar.
      ValueError: ``method`` is not one of the four names, or
        ``method="tiled"`` is asked of an ``x`` with symbolic dims (a
        shape-polymorphic export).
      RuntimeError: ``method="tma"`` is lowered for a GPU without TMA
        (compute capability below 9.0).
      jax.errors.JaxRuntimeError: on a GPU, ``method="tiled"`` where the
        array has no tensor-map form (e.g. 3 float32 values: a row of 12
        bytes); the message names the tensor-map rule.

    Examples:
      >>> import jax, jax.numpy as jnp, jax_tma
      >>> bits = jnp.array([0x7FC00001, 0x80000000, 0x00000001], jnp.uint32)
      >>> x = jax.lax.bitcast_convert_type(bits, jnp.float32)  # NaN payload, -0.0, subnormal
      >>> y = jax.jit(jax_tma.copy)(x)
      >>> jax.lax.bitcast_convert_type(y, jnp.uint32).tolist() == bits.tolist()
      True
      >>> jax.vmap(jax_tma.copy)(jnp.arange(6).reshape(2, 3)).tolist()
      [[0, 1, 2], [3, 4, 5]]
      >>> jax.grad(lambda v: jnp.sum(jax_tma.copy(v) ** 2))(jnp.arange(3.0)).tolist()
      [0.0, 2.0, 4.0]
      >>> jax_tma.copy(jnp.arange(3), method="fast")
      Traceback (most recent call last):
        ...
      ValueError: jax_tma.copy: method must be one of 'auto', 'tma', 'simt', 'tiled', got 'fast'
    """
    x = _checks.as_array(_OP, "x", x)
    method = _checks.check_method(_OP, method, _METHODS)
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
    align = _ffi.rules()["tma_align_bytes"]
    row = 4096
    while row > 1 and (x.size % row or (row * itemsize) % align):
        row //= 2
    if (row * itemsize) % align:
        row = x.size
    rows = src.reshape(-1, row)
    # Bound directly (not through window()): a 2-D box. Its starts are given
    # as unknown (static=None), so that no dim folds into a batch dim of the
    # call; the forced method does not read the innermost start.
    y = window_p.bind(rows, jnp.zeros(2, jnp.int32), shape=rows.shape, strides=(1, 1),
                      fill=_lowering.ZERO_BITS, method="tma", static=(None, None))
    return _checks.narrow(y.reshape(x.shape), x.dtype)


# ---- primitives -------------------------------------------------------------

copy_p = Primitive("jax_tma_copy")


# ---- lowering and partitioning ----------------------------------------------

_copy_lowering = _lowering.elementwise_lowering("jax_tma_copy")


def _cuda_lowering(ctx, x, *, method):
    if method == "tma":
        _checks.require_tma(_OP, method)
    return _copy_lowering(ctx, x, method=method)


# ---- vmap -------------------------------------------------------------------

def _copy_batcher(args, dims, *, method):
    (x,), (d,) = args, dims
    return copy_p.bind(x, method=method), d


# ---- AD ---------------------------------------------------------------------

def _copy_transpose(ct, x, *, method):
    # copy is linear: its tangent and its cotangent are copies too.
    return [copy_p.bind(ct, method=method)]


# ---- registration -----------------------------------------------------------

# The output has the input's shape, dtype, sharding and varying-mesh-axes.
_lowering.register(copy_p, lambda x, *, method: x,
                   {"cpu": _copy_lowering, "cuda": _cuda_lowering}, batcher=_copy_batcher)
ad.deflinear2(copy_p, _copy_transpose)
