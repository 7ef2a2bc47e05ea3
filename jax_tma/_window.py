"""jax_tma.window: a strided box of an array with out-of-bounds fill, as a JAX
primitive (jit, vmap with batched starts, linear AD with a kernel transpose,
partitioning of batch and fully-covered leading dimensions)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.extend.mlir.dialects import stablehlo as hlo
from jax.interpreters import ad, batching, mlir

from jax_tma import _checks, _ffi

WindowMethod = Literal["auto", "tma", "simt"]
_METHODS = ("auto", "tma", "simt")
_OP = "jax_tma.window"

# window_p(x, start): x has the spatial dims last (len(shape) of them) and
# optionally batch dims before; start is (r,) or (*batch, r). The output is
# (*batch, *shape). window_transpose_p(ct, start) is its linear transpose:
# ct is (*batch, *shape), the result (*batch, *x_shape), zeros where no
# window element lands.
window_p = Primitive("jax_tma_window")
window_transpose_p = Primitive("jax_tma_window_transpose")


def _batch_shape(x_aval, start_aval, r):
    if x_aval.ndim > r:
        return tuple(x_aval.shape[: x_aval.ndim - r])
    return tuple(start_aval.shape[:-1])


def _window_abstract(x, start, *, shape, strides, fill_nan, method):
    return jax.core.ShapedArray(_batch_shape(x, start, len(shape)) + tuple(shape), x.dtype)


def _transpose_abstract(ct, start, *, x_shape, strides, method):
    r = len(x_shape)
    return jax.core.ShapedArray(tuple(ct.shape[: ct.ndim - r]) + tuple(x_shape), ct.dtype)


window_p.def_abstract_eval(_window_abstract)
window_transpose_p.def_abstract_eval(_transpose_abstract)
_ffi.def_jitted_impl(window_p)
_ffi.def_jitted_impl(window_transpose_p)


def _fill_bits(dtype: np.dtype, fill_nan: bool) -> int:
    """The fill element's bits as a little-endian unsigned int; complex NaN
    is NaN in both parts, and 16-byte elements pass their first 8 bytes,
    which the handlers repeat."""
    if not fill_nan:
        return 0
    value = complex(np.nan, np.nan) if dtype.kind == "c" else np.nan
    raw = np.array(value, dtype).reshape(1).view(np.uint8)[:8]
    return int.from_bytes(raw.tobytes(), "little")


def _ffi_rule(ctx, src, start, *, strides, fill_nan, transpose, method):
    src_aval, start_aval = ctx.avals_in
    out_aval = ctx.avals_out[0]
    r = len(strides)
    nb = len(out_aval.shape) - r
    rule = jax.ffi.ffi_lowering("jax_tma_window")
    if nb and src_aval.ndim == nb + r:
        # The batch partitioner splits the leading dims of every operand, so
        # a shared start is broadcast to (*batch, r) (it is tiny); then the
        # batch dims shard freely. A shared src stays replicated.
        if start_aval.ndim == 1:
            start_aval = start_aval.update(shape=tuple(out_aval.shape[:nb]) + (r,))
            start = hlo.broadcast_in_dim(
                mlir.aval_to_ir_type(ctx.module_context, start_aval), start,
                mlir.dense_int_array([nb]))
            ctx = ctx.replace(avals_in=[src_aval, start_aval])
        rule = _ffi.batch_partitioned_lowering("jax_tma_window", nb)
        starts = [start]
    elif start_aval.ndim == 1:
        # One scalar operand per dim: XLA folds these slices of the stacked
        # start back into the scalars it was built from, so traced starts
        # reach the call as they are, with no kernel to stack them first.
        scalar = start_aval.update(shape=())
        scalar_type = mlir.aval_to_ir_type(ctx.module_context, scalar)
        starts = [hlo.reshape(scalar_type, hlo.slice(start, mlir.dense_int_array([d]),
                                                     mlir.dense_int_array([d + 1]),
                                                     mlir.dense_int_array([1])))
                  for d in range(r)]
        ctx = ctx.replace(avals_in=[src_aval] + [scalar] * r)
    else:
        starts = [start]
    return rule(
        ctx,
        src,
        *starts,
        strides=np.asarray(strides, np.int64),
        fill_bits=np.uint64(_fill_bits(np.dtype(src_aval.dtype), fill_nan)),
        transpose=bool(transpose),
        method=method,
    )


def _window_lowering(ctx, x, start, *, shape, strides, fill_nan, method):
    return _ffi_rule(ctx, x, start, strides=strides, fill_nan=fill_nan, transpose=False,
                     method=method)


def _transpose_lowering(ctx, ct, start, *, x_shape, strides, method):
    return _ffi_rule(ctx, ct, start, strides=strides, fill_nan=False, transpose=True,
                     method=method)


for _platform in ("cpu", "cuda"):
    mlir.register_lowering(window_p, _window_lowering, platform=_platform)
    mlir.register_lowering(window_transpose_p, _transpose_lowering, platform=_platform)


# ---- autodiff: linear in x, start is an integer (non-differentiable) input --

def _window_jvp(primals, tangents, *, shape, strides, fill_nan, method):
    x, start = primals
    tx, _ = tangents
    y = window_p.bind(x, start, shape=shape, strides=strides, fill_nan=fill_nan, method=method)
    if type(tx) is ad.Zero:
        return y, ad.Zero.from_primal_value(y)
    # Out-of-bounds elements are constants (0 or NaN): their tangent is 0.
    ty = window_p.bind(tx, start, shape=shape, strides=strides, fill_nan=False, method=method)
    return y, ty


def _window_transpose_rule(ct, x, start, *, shape, strides, fill_nan, method):
    assert ad.is_undefined_primal(x) and not ad.is_undefined_primal(start)
    x_aval = x.aval
    r = len(shape)
    if type(ct) is ad.Zero:
        return [ad.Zero(x_aval), None]
    if ct.ndim > r and start.ndim == 1:
        start = jnp.broadcast_to(start, ct.shape[: ct.ndim - r] + start.shape)
    x_shape = tuple(x_aval.shape[x_aval.ndim - r:])
    dx = window_transpose_p.bind(ct, start, x_shape=x_shape, strides=strides, method=method)
    extra = dx.ndim - x_aval.ndim  # batch dims x did not have: its uses add up
    if extra:
        dx = dx.sum(axis=tuple(range(extra)))
    return [dx, None]


def _transpose_jvp(primals, tangents, **params):
    ct, start = primals
    tct, _ = tangents
    y = window_transpose_p.bind(ct, start, **params)
    if type(tct) is ad.Zero:
        return y, ad.Zero.from_primal_value(y)
    return y, window_transpose_p.bind(tct, start, **params)


def _transpose_transpose_rule(ct, ct_in, start, *, x_shape, strides, method):
    shape = tuple(ct_in.aval.shape[ct_in.aval.ndim - len(x_shape):])
    if type(ct) is ad.Zero:
        return [ad.Zero(ct_in.aval), None]
    return [window_p.bind(ct, start, shape=shape, strides=strides, fill_nan=False,
                          method=method), None]


ad.primitive_jvps[window_p] = _window_jvp
ad.primitive_transposes[window_p] = _window_transpose_rule
ad.primitive_jvps[window_transpose_p] = _transpose_jvp
ad.primitive_transposes[window_transpose_p] = _transpose_transpose_rule


# ---- vmap: the batch becomes a leading batch dim of the call ---------------

def _align_batch(args, dims, tails):
    """Moves each batched arg's vmapped dim to the front and gives every arg
    that carries batch dims the full batch shape (new dim + older ones);
    args with no batch dims at all stay shared."""
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    moved = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
    old = [m.ndim - t - (d is not None) for m, d, t in zip(moved, dims, tails)]
    old_shape = ()
    for m, d, o in zip(moved, dims, old):
        if o:
            start = 1 if d is not None else 0
            old_shape = tuple(m.shape[start:start + o])
    full = (size,) + old_shape
    out = []
    for m, d, o, t in zip(moved, dims, old, tails):
        if d is None and o == 0:
            out.append(m)
            continue
        tail = m.shape[m.ndim - t:]
        if d is None:
            m = m[None]
        if o < len(old_shape):
            m = m.reshape((size,) + (1,) * len(old_shape) + tail)
        out.append(jnp.broadcast_to(m, full + tail))
    return out


def _window_batcher(args, dims, *, shape, **params):
    x, start = _align_batch(args, dims, (len(shape), 1))
    return window_p.bind(x, start, shape=shape, **params), 0


def _transpose_batcher(args, dims, *, x_shape, **params):
    ct, start = args
    ct_dim, start_dim = dims
    if ct_dim is None:  # the cotangent always carries the batch
        size = start.shape[start_dim]
        ct = jnp.broadcast_to(ct[None], (size,) + ct.shape)
        ct_dim = 0
    ct, start = _align_batch([ct, start], [ct_dim, start_dim], (len(x_shape), 1))
    return window_transpose_p.bind(ct, start, x_shape=x_shape, **params), 0


batching.primitive_batchers[window_p] = _window_batcher
batching.primitive_batchers[window_transpose_p] = _transpose_batcher


# ---- the public op -----------------------------------------------------------

def _check_length(name: str, n: int, rank: int, x_shape) -> None:
    if n != rank:
        raise ValueError(
            f"{_OP}: {name} has {n} entries but x has rank {rank} (x.shape={tuple(x_shape)})"
        )


def _start_array(start: Any, rank: int, x_shape) -> jax.Array:
    if isinstance(start, (jax.Array, np.ndarray)) and np.ndim(start) == 1:
        _check_length("start", start.shape[0], rank, x_shape)
        if not jnp.issubdtype(start.dtype, jnp.integer):
            raise TypeError(f"{_OP}: start must be integers, got dtype {start.dtype}")
        return jnp.asarray(start)
    if not isinstance(start, Sequence) or isinstance(start, str):
        raise TypeError(f"{_OP}: start must be a sequence of {rank} integers, got {start!r}")
    _check_length("start", len(start), rank, x_shape)
    parts = []
    for i, v in enumerate(start):
        if isinstance(v, bool) or isinstance(v, float) or not (
            isinstance(v, (int, np.integer))
            or (hasattr(v, "dtype") and jnp.issubdtype(v.dtype, jnp.integer) and np.ndim(v) == 0)
        ):
            raise TypeError(f"{_OP}: start[{i}] must be an integer scalar, got {v!r}")
        parts.append(v)
    static = [int(v) for v in parts if isinstance(v, (int, np.integer))]
    wide = any(abs(v) > 2**31 - 1 for v in static)
    if wide and not jax.config.jax_enable_x64:
        raise ValueError(f"{_OP}: start {tuple(static)} needs int64; enable jax_enable_x64")
    dtype = jnp.int64 if wide or any(
        getattr(v, "dtype", None) == jnp.int64 for v in parts) else jnp.int32
    return jnp.stack([jnp.asarray(v, dtype) for v in parts])


def _fill_is_nan(fill: Any, dtype: np.dtype) -> bool:
    if isinstance(fill, str):
        if fill.lower() != "nan":
            raise ValueError(f"{_OP}: fill must be 0 or NaN ('nan'), got {fill!r}")
        nan = True
    elif isinstance(fill, (int, float, np.integer, np.floating)) and not isinstance(fill, bool):
        if math.isnan(fill):
            nan = True
        elif fill == 0:
            nan = False
        else:
            raise ValueError(f"{_OP}: fill must be 0 or NaN, got {fill!r}")
    else:
        raise ValueError(f"{_OP}: fill must be 0 or NaN, got {fill!r}")
    if nan and not (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.complexfloating)):
        raise ValueError(f"{_OP}: fill=NaN needs a floating dtype, x has dtype {dtype}")
    return nan


def window(
    x: jax.Array | np.ndarray,
    start: Sequence[int | jax.Array] | jax.Array,
    shape: Sequence[int],
    *,
    strides: Sequence[int] | None = None,
    fill: float | str = 0,
    method: WindowMethod = "auto",
) -> jax.Array:
    """The box of ``x`` of shape ``shape`` whose first element is ``x[start]``,
    taking every ``strides[d]``-th element along dim ``d``; elements outside
    ``x`` read as ``fill``.

    ``out[i] = x[start + i * strides]`` where that index is inside ``x``, else
    ``fill``. Covers ``lax.dynamic_slice``, strided ``lax.slice``, crops and
    constant padding (a negative start or a box past the end). Unlike
    ``lax.dynamic_slice``, starts are **not clamped** into the array: a box
    that hangs over an edge reads ``fill`` there.

    On Hopper/Blackwell GPUs the box is moved by the TMA tensor-copy engine
    (``cp.async.bulk.tensor`` with hardware out-of-bounds fill) where the
    tensor-map rules allow and the innermost start is known to be 16-byte
    aligned; other geometries take a SIMT kernel with the same result.
    Works under ``jit``, ``vmap`` (batched ``x`` and/or ``start`` become one
    call), ``grad`` (the transpose scatters the cotangent back into zeros
    shaped like ``x``) and on sharded arrays
    (batch dims split without collectives).

    Args:
      x: an array of rank >= 1, any dtype.
      start: one integer per dim of ``x``: Python ints, traced integer
        scalars, or an integer array of shape ``(x.ndim,)``; negative values
        and values past the end are allowed.
      shape: the output shape, one int >= 1 (and < 2^31) per dim.
      strides: element strides >= 1 per dim (default all 1).
      fill: ``0`` or NaN (``"nan"`` or ``float("nan")``; floating and
        complex dtypes only).
      method: ``"auto"`` (the tensor-map path where the innermost start is a
        static multiple of 16 bytes and the tensor-map rules hold, else the
        SIMT kernel, which measured faster there), ``"tma"`` (the tensor-map
        path; an error naming the violated rule where it cannot run) or
        ``"simt"``.

    Returns:
      An array of shape ``shape`` and ``x``'s dtype.

    Example:
      >>> import jax.numpy as jnp, jax_tma
      >>> x = jnp.arange(12).reshape(3, 4)
      >>> jax_tma.window(x, (-1, 1), (2, 2)).tolist()
      [[0, 0], [1, 2]]
    """
    x = _checks.as_array(_OP, "x", x)
    _checks.check_choice(_OP, "method", method, _METHODS)
    if x.ndim == 0:
        raise ValueError(f"{_OP}: x must have rank >= 1, got a 0-d array")
    rank = x.ndim
    dims = f"rank {rank} (x.shape={tuple(x.shape)})"
    shape = _checks.per_dim_ints(_OP, "shape", shape, rank, dims)
    strides = (1,) * rank if strides is None else _checks.per_dim_ints(
        _OP, "strides", strides, rank, dims)
    start_arr = _start_array(start, rank, x.shape)
    fill_nan = _fill_is_nan(fill, x.dtype)
    _ffi.register()
    src = _checks.widen(x)
    # Leading dims that the box covers in full (static start 0, the whole
    # extent, stride 1) become batch dims of the call: XLA may then split them
    # across devices without collectives.
    lead = 0
    static = start if isinstance(start, Sequence) else ()
    while (lead < rank - 1 and lead < len(static)
           and isinstance(static[lead], (int, np.integer)) and static[lead] == 0
           and shape[lead] == x.shape[lead] and strides[lead] == 1):
        lead += 1
    groups = _mergeable_groups(x.shape, shape, strides, static, start_arr.dtype, lead)
    if len(groups) < rank - lead:
        src, start_arr, m_shape, m_strides = _merge_dims(src, start_arr, shape, strides,
                                                         static, lead, groups)
    else:
        m_shape, m_strides = shape[lead:], strides[lead:]
        start_arr = start_arr[lead:]
    if lead:
        start_arr = jnp.broadcast_to(start_arr, x.shape[:lead] + start_arr.shape)
    if method == "auto" and not _inner_start_aligned(x.shape, src.dtype, static, groups[-1][0]):
        method = "simt"
    y = window_p.bind(src, start_arr, shape=m_shape, strides=m_strides,
                      fill_nan=fill_nan, method=method)
    return _checks.narrow(y.reshape(x.shape[:lead] + shape[lead:]), x.dtype)


def _inner_start_aligned(x_shape, dtype, static, first) -> bool:
    """Whether the start of the innermost (merged) dim, whose first original
    dim is `first`, is a static multiple of 16 bytes. Only then does auto let
    the handler take the TMA path: a TMA box must start 16-B aligned, so any
    other start is loaded wider and shifted in shared memory, which measured
    slower than the SIMT kernel (benchmarks/bench_window.py). A traced start
    may be anything, so it takes SIMT too."""
    if first >= len(static) or not isinstance(static[first], (int, np.integer)):
        return False
    elems = int(static[first]) * int(np.prod(x_shape[first + 1:]))
    return (elems * np.dtype(dtype).itemsize) % 16 == 0


def _covers(static, x_shape, shape, strides, d) -> bool:
    """Whether the box takes all of dim d (static start 0, stride 1)."""
    return (d < len(static) and isinstance(static[d], (int, np.integer)) and static[d] == 0
            and shape[d] == x_shape[d] and strides[d] == 1)


def _mergeable_groups(x_shape, shape, strides, static, start_dtype, lead):
    """Runs of dims [first, last] (from `lead` on) that fold into one: a dim
    d+1 the box covers in full folds into dim d when strides[d] == 1, since
    then x[.., s + i, j, ..] over all j is x viewed with the two dims merged,
    at start s * dim(d+1) (in bounds exactly when s + i is). A traced start
    is scaled in int64, so without x64 only static starts merge. This is what
    lets ranks over 5 reach the TMA path."""
    groups = [[len(x_shape) - 1] * 2]
    for d in range(len(x_shape) - 2, lead - 1, -1):
        first, last = groups[-1]
        inner = int(np.prod(x_shape[first:last + 1]))
        whole = all(_covers(static, x_shape, shape, strides, k) for k in range(first, last + 1))
        static_d = d < len(static) and isinstance(static[d], (int, np.integer))
        start_ok = (jax.config.jax_enable_x64 or start_dtype == jnp.int64
                    or (static_d and abs(int(static[d]) * inner) <= _checks.MAX_DIM))
        if (whole and strides[d] == 1 and start_ok
                and x_shape[d] * inner <= _checks.MAX_DIM and shape[d] * inner <= _checks.MAX_DIM):
            groups[-1][0] = d
        else:
            groups.append([d, d])
    return [tuple(g) for g in reversed(groups)]


def _merge_dims(src, start_arr, shape, strides, static, lead, groups):
    """src, start, shape and strides of the window over dims `lead` on, with
    each group of dims folded into its first (see _mergeable_groups)."""
    x_shape = src.shape
    dtype = start_arr.dtype
    if any(first < last for first, last in groups) and jax.config.jax_enable_x64:
        dtype = jnp.int64
    starts, m_shape, m_strides, m_dims = [], [], [], []
    for first, last in groups:
        inner = int(np.prod(x_shape[first + 1:last + 1]))
        starts.append(start_arr[first].astype(dtype) * inner)
        m_shape.append(shape[first] * inner)
        m_strides.append(strides[first])
        m_dims.append(x_shape[first] * inner)
    src = src.reshape(x_shape[:lead] + tuple(m_dims))
    return src, jnp.stack(starts), tuple(m_shape), tuple(m_strides)
