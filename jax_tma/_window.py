"""jax_tma.window: a strided box of an array with out-of-bounds fill, as a JAX
primitive (jit, vmap with batched starts, linear AD with a kernel transpose,
partitioning that keeps the split of batch dims and of every dim the box
takes whole)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import ad, mlir
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_tma import _checks, _ffi, _lowering

WindowMethod = Literal["auto", "tma", "simt"]
_METHODS = ("auto", "tma", "simt")
_OP = "jax_tma.window"


# ---- the public op ----------------------------------------------------------

def window(
    x: jax.Array | np.ndarray,
    start: Sequence[int | jax.Array] | jax.Array,
    shape: Sequence[int],
    *,
    strides: Sequence[int] | None = None,
    fill: float | int | complex | str | jax.Array = 0,
    method: WindowMethod = "auto",
) -> jax.Array:
    """The box of ``x`` of shape ``shape`` whose first element is ``x[start]``,
    taking every ``strides[d]``-th element along dim ``d``; elements outside
    ``x`` read as ``fill``.

    ``out[i] = x[start + i * strides]`` where that index is inside ``x``, else
    ``fill``. One op covers ``lax.dynamic_slice``, strided ``lax.slice``,
    crops and constant padding (``jnp.pad``: a negative start or a box past
    the end). Unlike ``lax.dynamic_slice``, starts are **not clamped** into
    the array: a box that hangs over an edge reads ``fill`` there.

    On Hopper/Blackwell GPUs the box is moved by the TMA tensor-copy engine
    (``cp.async.bulk.tensor`` with the hardware's out-of-bounds fill) where
    the tensor-map rules allow; other geometries take a SIMT kernel with the
    same result. Works under ``jit`` (also with ``jax.disable_jit()``),
    ``vmap`` (batched ``x`` and/or ``start`` become one call), ``grad`` (the
    transpose writes the cotangent back into zeros shaped like ``x``),
    inside ``shard_map``, on sharded arrays (batch dims, and every dim the
    box takes whole: static start 0, the whole extent, stride 1, keep their
    split in the result and the grad, with no collectives, as
    ``lax.dynamic_slice`` keeps it; a split dim the box crops or pads is
    gathered first; on an Explicit mesh a dim of the result keeps its
    sharding where the box's extent still divides among its devices, as for
    ``lax.dynamic_slice``, and is unsharded where it does not, which
    ``lax.dynamic_slice`` refuses) and in ``jax.export`` with symbolic dims.

    ``method="auto"`` takes the SIMT kernel's vector form wherever it runs
    (a forward window with innermost stride 1, or 2 for elements below 16
    bytes, whose output rows are whole 16-byte vectors, from any start: a
    thread per 16-byte output vector, each 16-byte source vector loaded whole
    or as two aligned loads shifted into place), the faster of the two
    on every window both take (see the op's Speed section). Elsewhere it hands a
    traced innermost start to the SIMT kernel (it may be anything, and a TMA
    box starts 16-byte aligned) and takes the tensor-map path where the
    innermost start is a static multiple of 16 bytes and the tensor-map rules
    hold (tensor-map rank at most 5, element strides at most 8, innermost
    stride 1, rows a multiple of 16 bytes, dims up to 2^30), and the SIMT
    kernel elsewhere; on GPUs without TMA always the SIMT kernel.
    ``method="tma"`` takes the tensor-map path or says which rule it breaks.

    Args:
      x: an array of rank >= 1, any dtype (sub-byte types are widened
        around the call).
      start: one integer per dim of ``x``: Python or NumPy ints (static),
        traced integer scalars of any integer dtype (a ``fori_loop`` index),
        or an integer array of shape ``(x.ndim,)`` (a NumPy array is read as
        its static ints); negative values and values past the end are
        allowed (an unsigned start past the end reads fill, never wraps). A
        static start beyond int32 needs ``jax_enable_x64``.
      shape: the output shape, one int >= 1 (and < 2^31) per dim; in a
        shape-polymorphic export also x's own symbolic dim (taken whole).
      strides: element strides >= 1 (and < 2^31) per dim (default all 1).
      fill: the value of out-of-bounds elements: a concrete scalar (Python or
        NumPy number, or a 0-d array that is not traced) converted to ``x``'s
        dtype as ``jnp.asarray(fill, x.dtype)`` converts it (``-0.0`` stays
        negative); ``"nan"`` is NaN (NaN in both parts for complex), for
        floating and complex dtypes.
      method: ``"auto"`` (the rule above), ``"tma"`` (the tensor-map path)
        or ``"simt"``. On the CPU every method gives the same host copy.

    Returns:
      An array of shape ``shape`` and ``x``'s dtype.

    Raises:
      TypeError: ``x`` is not an array or scalar; ``start`` is not a
        sequence of integer scalars or an integer array; an entry of
        ``shape`` or ``strides`` is not an int; ``fill`` is not a concrete
        number (a traced value, a non-numeric object, a complex fill of a
        real ``x``).
      ValueError: ``method`` is not one of the three names; ``x`` is 0-d;
        ``start``, ``shape`` or ``strides`` has not one entry per dim; an
        extent or stride is below 1 or over 2^31 - 1; a static start needs
        int64 without ``jax_enable_x64``; ``fill`` is a string other than
        ``"nan"`` or a NaN for a non-floating dtype. The message names the
        op, the rule and the values.
      OverflowError: an integer ``fill`` outside the range of int64 and
        uint64 for an integer ``x``.
      jax.errors.JaxRuntimeError: on a GPU, ``method="tma"`` where a
        tensor-map rule is broken or the GPU has no TMA; the message names
        the rule.

    Examples:
      >>> import jax, jax.numpy as jnp, jax_tma
      >>> x = jnp.arange(12).reshape(3, 4)
      >>> jax_tma.window(x, (-1, 1), (2, 2)).tolist()   # the row above x reads fill
      [[0, 0], [1, 2]]
      >>> jax_tma.window(x, (0, 1), (2, 2), strides=(2, 2), fill=-1).tolist()
      [[1, 3], [9, 11]]
      >>> jax.jit(lambda i: jax_tma.window(x, (i, 0), (2, 4)))(2).tolist()
      [[8, 9, 10, 11], [0, 0, 0, 0]]
      >>> jax_tma.window(x, (0,), (2, 2))
      Traceback (most recent call last):
        ...
      ValueError: jax_tma.window: start has 1 entries but x has rank 2 (x.shape=(3, 4))
    """
    x = _checks.as_array(_OP, "x", x)
    _checks.check_choice(_OP, "method", method, _METHODS)
    if x.ndim == 0:
        raise ValueError(f"{_OP}: x must have rank >= 1, got a 0-d array")
    rank = x.ndim
    dims = f"rank {rank} (x.shape={tuple(x.shape)})"
    shape = _box_shape(shape, x.shape, dims)
    strides = (1,) * rank if strides is None else _checks.per_dim_ints(
        _OP, "strides", strides, rank, dims)
    start_arr, static = _start_array(start, x.shape, shape, strides)
    fill_element = _checks.fill_bytes(_OP, fill, x.dtype)
    _ffi.register()
    src, start_arr = _checks.align_varying(_checks.widen(x), start_arr)
    y = window_p.bind(src, start_arr, shape=shape, strides=strides, fill=fill_element,
                      method=method, static=static)
    return _checks.narrow(y, x.dtype)


# ---- checks and the call's geometry -----------------------------------------

def _check_length(name: str, n: int, rank: int, x_shape) -> None:
    if n != rank:
        raise ValueError(
            f"{_OP}: {name} has {n} entries but x has rank {rank} (x.shape={tuple(x_shape)})"
        )


_INT32_MAX = 2**31 - 1


def _as_start(v: Any, dtype) -> jax.Array:
    """A traced start (one scalar, or the whole start array) in `dtype`.
    Unsigned values past int32 saturate at 2^31 - 1: every dim is shorter,
    so the box reads fill there as at the true start; narrower and sub-byte
    integers widen losslessly."""
    v = jnp.asarray(v)
    if jnp.issubdtype(v.dtype, jnp.unsignedinteger) and jnp.iinfo(v.dtype).max > _INT32_MAX:
        v = jnp.minimum(v, jnp.asarray(_INT32_MAX, v.dtype))
    return v.astype(dtype)


def _box_shape(shape: Any, x_shape, dims: str) -> tuple:
    """shape, checked: ints in [1, 2^31), or (in a shape-polymorphic export)
    x's own symbolic dim, which the box then takes whole."""
    rank = len(x_shape)
    if isinstance(shape, Sequence) and not isinstance(shape, str) and len(shape) == rank:
        symbolic = [d for d, v in enumerate(shape)
                    if not isinstance(v, (int, np.integer)) and not isinstance(x_shape[d], int)
                    and v == x_shape[d]]
        ints = _checks.per_dim_ints(_OP, "shape", [1 if d in symbolic else v
                                                   for d, v in enumerate(shape)], rank, dims)
        return tuple(shape[d] if d in symbolic else v for d, v in enumerate(ints))
    return _checks.per_dim_ints(_OP, "shape", shape, rank, dims)


def _clamp_static(v: int, x_dim, size, stride: int) -> int:
    """A static start that lies beyond every element of x along its dim,
    moved to the nearest start that still does: the same all-fill result
    with a smaller number (which also keeps merged starts within int32)."""
    if isinstance(size, int):
        v = max(v, -(size - 1) * stride - 1)
    return min(v, x_dim) if isinstance(x_dim, int) else v


def _start_array(start: Any, x_shape, shape, strides) -> tuple[jax.Array, tuple]:
    """start as one integer array, and per dim its static value (None where
    traced). A NumPy start (an array, or NumPy scalars) is static. int64
    where a start needs it (a traced int64 start, or a static one past
    int32), else int32."""
    rank = len(x_shape)
    if isinstance(start, (jax.Array, np.ndarray)) and np.ndim(start) == 1:
        _check_length("start", start.shape[0], rank, x_shape)
        if not jnp.issubdtype(start.dtype, jnp.integer):
            raise TypeError(f"{_OP}: start must be integers, got dtype {start.dtype}")
        if isinstance(start, np.ndarray):  # concrete: as a sequence of its ints
            start = [int(v) for v in start]
        else:
            dtype = jnp.int64 if start.dtype == jnp.int64 else jnp.int32
            return _as_start(start, dtype), (None,) * rank
    if not isinstance(start, Sequence) or isinstance(start, str):
        raise TypeError(f"{_OP}: start must be a sequence of {rank} integers, got {start!r}")
    _check_length("start", len(start), rank, x_shape)
    static: list[int | None] = []
    for i, v in enumerate(start):
        concrete = isinstance(v, np.ndarray) and v.ndim == 0 and v.dtype.kind in "iu"
        if (isinstance(v, (int, np.integer)) and not isinstance(v, bool)) or concrete:
            static.append(_clamp_static(int(v), x_shape[i], shape[i], strides[i]))
        elif hasattr(v, "dtype") and np.ndim(v) == 0 and jnp.issubdtype(v.dtype, jnp.integer):
            static.append(None)
        else:
            raise TypeError(f"{_OP}: start[{i}] must be an integer scalar, got {v!r}")
    wide = [v for v in static if v is not None and not -_INT32_MAX - 1 <= v <= _INT32_MAX]
    if wide and not jax.config.jax_enable_x64:
        shown = tuple(int(v) if s is not None else v for s, v in zip(static, start))
        raise ValueError(f"{_OP}: start {shown} needs int64; enable jax_enable_x64")
    dtype = jnp.int64 if wide or any(
        s is None and v.dtype == jnp.int64 for s, v in zip(static, start)) else jnp.int32
    parts = [jnp.asarray(s, dtype) if s is not None else _as_start(v, dtype)
             for s, v in zip(static, start)]
    return jnp.stack(parts), tuple(static)


# ---- primitives -------------------------------------------------------------

# window_p(x, start): x has the spatial dims last (len(shape) of them) and
# optionally batch dims before; start is (r,) or (*batch, r). The output is
# (*batch, *shape). window_transpose_p(ct, start) is its linear transpose:
# ct is (*batch, *shape), the result (*batch, *x_shape), zeros where no
# window element lands. Both carry the box as the user gave it and
# `static`, each dim's start where it is known at trace time (None where
# traced). Each lowers to window_local_p, the same geometry on one device's
# operands (its shard, under custom_partitioning), whose lowering folds dims
# and lowers window_call_p, the FFI call.
window_p = Primitive("jax_tma_window")
window_transpose_p = Primitive("jax_tma_window_transpose")
window_local_p = Primitive("jax_tma_window_local")
window_call_p = Primitive("jax_tma_window_call")


def _batch_shape(x_aval, start_aval, r):
    if x_aval.ndim > r:
        return tuple(x_aval.shape[: x_aval.ndim - r])
    return tuple(start_aval.shape[:-1])


def _kept_spec(aval, dims, sizes) -> list:
    """The spec entries of `aval`'s dims `dims` for result dims of `sizes`: a
    dim keeps its mesh axes where the result's extent still divides among
    them (jax's rule for slices), else it is unsharded."""
    spec, mesh = _lowering.spec_of(aval), aval.sharding.mesh
    kept = []
    for d, size in zip(dims, sizes):
        axes = spec[d]
        names = axes if isinstance(axes, tuple) else (axes,)
        parts = math.prod(mesh.shape[a] for a in names) if axes is not None else 1
        kept.append(axes if isinstance(size, int) and size % parts == 0 else None)
    return kept


def _spatial_abstract(x, start, out_shape, r):
    """window_p's result and window_transpose_p's alike: batch dims (of x, or
    of start where only start is batched) keep their sharding, the last r
    dims keep x's where they still divide."""
    nb = len(out_shape) - r
    if x.ndim > r:
        batch = _lowering.spec_of(x)[:nb]
    else:
        batch = _lowering.spec_of(start)[:nb]
    spatial = _kept_spec(x, range(x.ndim - r, x.ndim), out_shape[nb:])
    return _lowering.out_aval(x, out_shape, spec=list(batch) + spatial)


def _window_abstract(x, start, *, shape, strides, fill, method, static):
    return _spatial_abstract(x, start, _batch_shape(x, start, len(shape)) + tuple(shape),
                             len(shape))


def _transpose_abstract(ct, start, *, x_shape, strides, method, static):
    r = len(x_shape)
    return _spatial_abstract(ct, start, tuple(ct.shape[: ct.ndim - r]) + tuple(x_shape), r)


def _local_abstract(src, start, *, transpose, box, x_shape, **_):
    shape = _batch_shape(src, start, len(box)) + tuple(x_shape if transpose else box)
    return _lowering.out_aval(src, shape, spec=(None,) * len(shape))


def _call_abstract(src, *starts, out_shape, **_):
    return _lowering.out_aval(src, out_shape, spec=(None,) * len(out_shape))


# ---- lowering and partitioning ----------------------------------------------

def _covers(static, x_shape, shape, strides, d) -> bool:
    """Whether the box takes all of dim d (static start 0, stride 1)."""
    return static[d] == 0 and shape[d] == x_shape[d] and strides[d] == 1


def _covered(static, x_shape, shape, strides) -> tuple[int, ...]:
    """The spatial dims the box takes whole: each device may window its own
    shard of them (start 0 there too), so they keep their sharding."""
    return tuple(d for d in range(len(strides)) if _covers(static, x_shape, shape, strides, d))


def _bind_local(src, start, *, transpose, box, x_shape, covered, **params):
    """window_local_p on src as this device has it: the dims the box covers
    take their extent from src (from the cotangent in the transpose)."""
    spatial = tuple(src.shape[src.ndim - len(params["strides"]):])
    if transpose:
        box, x_shape = spatial, tuple(spatial[d] if d in covered else v
                                      for d, v in enumerate(x_shape))
    else:
        x_shape, box = spatial, tuple(spatial[d] if d in covered else v
                                      for d, v in enumerate(box))
    return window_local_p.bind(src, start, transpose=transpose, box=box, x_shape=x_shape,
                               **params)


def _shardings(mesh, src, start, out_ndim: int, r: int, covered):
    """The shardings of src, start and the result of one partitioned call:
    the batch dims keep src's split (or start's, where src has none) and the
    dims the box covers keep src's; every other dim is whole. A dim keeps a
    split only where it divides among the devices."""
    nb, src_b = out_ndim - r, len(src.shape) - r
    src_spec = _lowering.sharding_spec(src.sharding, len(src.shape))
    start_spec = _lowering.sharding_spec(start.sharding, len(start.shape))
    used: set = set()

    def kept(entry, size):
        axes = _lowering.mesh_axes(entry)
        if not axes or used & set(axes) or size % math.prod(mesh.shape[a] for a in axes):
            return None
        used.update(axes)
        return entry

    if src_b:
        batch = [kept(e, n) for e, n in zip(src_spec[:nb], src.shape[:nb])]
    else:
        batch = [kept(e, n) for e, n in zip(start_spec[:nb], start.shape[:nb])]
    spatial = [kept(src_spec[src_b + d], src.shape[src_b + d]) if d in covered else None
               for d in range(r)]
    src_out = (batch if src_b else []) + spatial
    start_out = (batch if len(start.shape) > 1 else []) + [None]
    named = lambda spec: NamedSharding(mesh, P(*spec))  # noqa: E731
    return named(src_out), named(start_out), named(batch + spatial)


@functools.cache
def _partitioned(params: tuple, src_ndim: int, start_ndim: int, out_ndim: int):
    """_bind_local (with `params`) under custom_partitioning: batch dims and
    the dims the box covers keep their split, so that XLA moves no data for
    them; the other spatial dims are whole on every device."""
    params = dict(params)

    def local(src, start):
        return _bind_local(src, start, **params)

    r, covered = len(params["strides"]), params["covered"]
    nb = out_ndim - r

    def infer(mesh, arg_shapes, result_shape):
        return _shardings(mesh, *arg_shapes, out_ndim, r, covered)[2]

    def partition(mesh, arg_shapes, result_shape):
        src, start, out = _shardings(mesh, *arg_shapes, out_ndim, r, covered)
        return mesh, local, out, (src, start)

    batch = [f"b{i}" for i in range(nb)]
    src = (batch if src_ndim > r else []) + [f"c{d}" if d in covered else f"i{d}"
                                             for d in range(r)]
    start = (batch if start_ndim > 1 else []) + ["s"]
    out = batch + [f"c{d}" if d in covered else f"o{d}" for d in range(r)]
    # Shardy wants these in the order the rule names them.
    whole = [f for f in src + start + out if f[0] in "ios"]
    f = custom_partitioning(local)
    f.def_partition(infer_sharding_from_operands=infer, partition=partition,
                    sharding_rule=_lowering.sharding_rule(src, start, results=[out]),
                    need_replication_factors=tuple(whole))
    return f


def _lower(ctx, src, start, **params):
    """window_p / window_transpose_p: window_local_p on the whole operands
    (one device, or symbolic dims), or per device under custom_partitioning."""
    if _lowering.partitioned(ctx):
        fn = _partitioned(tuple(sorted(params.items())), ctx.avals_in[0].ndim,
                          ctx.avals_in[1].ndim, ctx.avals_out[0].ndim)
    else:
        fn = functools.partial(_bind_local, **params)
    return mlir.lower_fun(fn, multiple_results=False)(ctx, src, start)


def _window_lowering(ctx, x, start, *, shape, strides, static, **params):
    covered = _covered(static, ctx.avals_in[0].shape[-len(shape):], shape, strides)
    return _lower(ctx, x, start, transpose=False, box=shape, x_shape=None, covered=covered,
                  strides=strides, static=static, **params)


def _transpose_lowering(ctx, ct, start, *, x_shape, strides, static, **params):
    covered = _covered(static, x_shape, ctx.avals_in[0].shape[-len(x_shape):], strides)
    return _lower(ctx, ct, start, transpose=True, box=None, x_shape=x_shape, covered=covered,
                  strides=strides, static=static, fill=_lowering.ZERO_BITS, **params)


def _static_starts(x_shape, static, groups) -> tuple[int | None, ...]:
    """The start of each (merged) dim of the call, whose first original dim
    is a group's first, in elements, where it is static; None where it is
    traced or symbolic. Where all are static the handlers read them from here,
    not from the operands (kernel parameters on the GPU: no load before the
    data's), and the CUDA planner's kernel choice reads the innermost
    (ffi/window/window_plan.h, InnerStartAligned)."""
    out = []
    for first, last in groups:
        inner = x_shape[first + 1:last + 1]
        known = static[first] is not None and all(isinstance(d, int) for d in inner)
        out.append(static[first] * math.prod(inner) if known else None)
    return tuple(out)


def _mergeable_groups(x_shape, shape, strides, static, lead):
    """Runs of dims [first, last] (from `lead` on) that fold into one: a dim
    d+1 the box covers in full folds into dim d when strides[d] == 1, since
    then x[.., s + i, j, ..] over all j is x viewed with the two dims merged,
    at start s * dim(d+1) (in bounds exactly when s + i is). Symbolic dims
    stay apart. This is what lets ranks over 5 reach the TMA path."""
    groups = [[len(x_shape) - 1] * 2]
    for d in range(len(x_shape) - 2, lead - 1, -1):
        first, last = groups[-1]
        if (all(_covers(static, x_shape, shape, strides, k) for k in range(first, last + 1))
                and strides[d] == 1 and all(isinstance(v, int) for v in x_shape[d:last + 1])
                and max(x_shape[d], shape[d]) * math.prod(x_shape[first:last + 1])
                <= _checks.MAX_DIM):
            groups[-1][0] = d
        else:
            groups.append([d, d])
    return [tuple(g) for g in reversed(groups)]


def _call(src, start, *, transpose, box, x_shape, strides, fill, method, static):
    """window_local_p as the FFI call: src is x (window; with batch dims, or
    the spatial dims alone) or the cotangent (transpose; with every batch
    dim); box and x_shape are the spatial dims of the window and of x.
    Leading dims the box covers become batch dims of the call, inner ones
    fold into the dim outside them (_mergeable_groups); the start of a
    folded dim is clamped to [-box, dim] first where it is traced (as
    _clamp_static clamps a static one: beyond that the box reads only
    fill), so that the scaled start stays within the merged extent."""
    zero = _checks.fill_bytes(_OP, 0, src.dtype)
    if transpose and any(zero):
        # float8_e8m0fnu has no zero (jnp's 0 is 0xFF) and the handlers write
        # zero bytes where nothing lands: the cotangent's bits XOR jnp's zero
        # map that zero to zero bytes and back, every other value distinct.
        bits = np.frombuffer(zero, f"<u{len(zero)}")[0]
        y = _call(jax.lax.bitcast_convert_type(src, bits.dtype) ^ bits, start,
                  transpose=True, box=box, x_shape=x_shape, strides=strides, fill=fill,
                  method=method, static=static)
        return jax.lax.bitcast_convert_type(y ^ bits, src.dtype)
    r = len(strides)
    batch = tuple(start.shape[:-1]) if start.ndim > 1 else tuple(src.shape[:src.ndim - r])
    # Covered leading dims become batch dims where the starts are shared
    # (batched starts would need broadcasting over them).
    lead = 0
    while start.ndim == 1 and lead < r - 1 and _covers(static, x_shape, box, strides, lead):
        lead += 1
    groups = _mergeable_groups(x_shape, box, strides, static, lead)
    starts, m_box, m_x = [], [], []
    for first, last in groups:
        inner = math.prod(x_shape[first + 1:last + 1])
        s = start[..., first]
        if first < last:
            if static[first] is None:
                s = jnp.clip(s, -box[first], x_shape[first])
            s = s * inner
        starts.append(s)
        m_box.append(box[first] * inner)
        m_x.append(x_shape[first] * inner)
    lead_dims = tuple(x_shape[:lead])
    src_dims, out_dims = (m_box, m_x) if transpose else (m_x, m_box)
    src = src.reshape(tuple(src.shape[:src.ndim - r]) + lead_dims + tuple(src_dims))
    if start.ndim > 1:  # one (*batch, r) array; else one scalar per dim
        starts = [jnp.stack(starts, axis=-1)]
    y = window_call_p.bind(src, *starts, out_shape=batch + lead_dims + tuple(out_dims),
                           strides=tuple(strides[first] for first, _ in groups), fill=fill,
                           transpose=transpose, method=method,
                           static_start=(None,) * len(groups) if start.ndim > 1
                           else _static_starts(x_shape, static, groups))
    return y.reshape(batch + tuple(x_shape if transpose else box))


def _local_lowering(ctx, src, start, **params):
    # The folding (_call) is this device's own: under custom_partitioning its
    # operands are shards, and their reshapes and start arithmetic must not
    # carry the program's mesh, whose sharding annotations (an Explicit mesh
    # in context) would stay in the per-device module. So they are traced
    # with plain avals and no mesh.
    plain = lambda avals: [jax.core.ShapedArray(a.shape, a.dtype) for a in avals]  # noqa: E731
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), ())):
        return mlir.lower_fun(functools.partial(_call, **params), multiple_results=False)(
            ctx.replace(avals_in=plain(ctx.avals_in), avals_out=plain(ctx.avals_out)),
            src, start)


def _call_lowering(ctx, src, *starts, out_shape, strides, fill, transpose, method,
                   static_start):
    # One scalar operand per start where the starts are shared: XLA folds
    # these slices of the stacked start back into the scalars it was built
    # from, so traced starts reach the call as they are, with no kernel to
    # stack them first.
    return jax.ffi.ffi_lowering("jax_tma_window")(
        ctx,
        src,
        *starts,
        strides=np.asarray(strides, np.int64),
        fill=_lowering.fill_attr([fill]),
        transpose=bool(transpose),
        method=method,
        static_start=np.array([_ffi.rules()["window.unknown_start"] if s is None else s
                               for s in static_start], np.int64),
    )


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


# ---- autodiff: linear in x, start is an integer (non-differentiable) input --

def _window_jvp(primals, tangents, *, fill, **params):
    x, start = primals
    tx, _ = tangents
    y = window_p.bind(x, start, fill=fill, **params)
    if type(tx) is ad.Zero:
        return y, ad.Zero.from_primal_value(y)
    # Out-of-bounds elements are the constant fill: their tangent is 0.
    ty = window_p.bind(tx, start, fill=_lowering.ZERO_BITS, **params)
    return y, ty


def _window_transpose_rule(ct, x, start, *, shape, fill, **params):
    assert ad.is_undefined_primal(x) and not ad.is_undefined_primal(start)
    x_aval = x.aval
    r = len(shape)
    if type(ct) is ad.Zero:
        return [ad.Zero(x_aval), None]
    if ct.ndim > r and start.ndim == 1:
        start = jnp.broadcast_to(start, ct.shape[: ct.ndim - r] + start.shape)
    x_shape = tuple(x_aval.shape[x_aval.ndim - r:])
    dx = window_transpose_p.bind(ct, start, x_shape=x_shape, **params)
    extra = dx.ndim - x_aval.ndim  # batch dims x did not have: its uses add up
    if extra:
        dx = dx.sum(axis=tuple(range(extra)))
    # x's sharding, where a box that did not divide among a dim's devices
    # left that dim of the transpose unsharded.
    if _lowering.spec_of(jax.typeof(dx)) != _lowering.spec_of(x_aval):
        dx = jax.sharding.reshard(dx, x_aval.sharding.spec)
    return [dx, None]


def _transpose_jvp(primals, tangents, **params):
    ct, start = primals
    tct, _ = tangents
    y = window_transpose_p.bind(ct, start, **params)
    if type(tct) is ad.Zero:
        return y, ad.Zero.from_primal_value(y)
    return y, window_transpose_p.bind(tct, start, **params)


def _transpose_transpose_rule(ct, ct_in, start, *, x_shape, **params):
    shape = tuple(ct_in.aval.shape[ct_in.aval.ndim - len(x_shape):])
    if type(ct) is ad.Zero:
        return [ad.Zero(ct_in.aval), None]
    return [window_p.bind(ct, start, shape=shape, fill=_lowering.ZERO_BITS, **params), None]


# ---- registration -----------------------------------------------------------

_lowering.register(window_p, _window_abstract, _window_lowering, batcher=_window_batcher)
_lowering.register(window_transpose_p, _transpose_abstract, _transpose_lowering,
                   batcher=_transpose_batcher)
_lowering.register(window_local_p, _local_abstract, _local_lowering, jitted=False)
_lowering.register(window_call_p, _call_abstract, _call_lowering, jitted=False)
_lowering.require_devices_during_lowering(window_p)
_lowering.require_devices_during_lowering(window_transpose_p)
ad.primitive_jvps[window_p] = _window_jvp
ad.primitive_transposes[window_p] = _window_transpose_rule
ad.primitive_jvps[window_transpose_p] = _transpose_jvp
ad.primitive_transposes[window_transpose_p] = _transpose_transpose_rule
