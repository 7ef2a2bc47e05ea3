"""jax_tma.gather / jax_tma.scatter: whole slabs (rows, pages) picked by an
index array, as JAX primitives (jit, vmap folded into shared batch dims,
AD gather <-> scatter-add, partitioning of every dim but `axis` without
collectives; scatter works in place on a donated x)."""

from __future__ import annotations

import functools
import math
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_tma import _checks, _ffi

GatherMethod = Literal["auto", "tma", "simt"]
ScatterMode = Literal["set", "add"]
_METHODS = ("auto", "tma", "simt")
_MODES = ("set", "add")
_OP_G = "jax_tma.gather"
_OP_S = "jax_tma.scatter"
# Element types a bulk reduce-add (cp.reduce.async.bulk .add) can sum; the
# others add with SIMT atomics under method="auto".
_BULK_ADD = ("int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64",
             "complex64", "complex128")

# Both ops view x as (*batch, *outer, N, *slab) with N = x.shape[axis]; the
# first `batch` dims of the indices equal x's (vmap folds into them).
# gather_p(x, indices): (*x.shape[:axis], *indices.shape[batch:], *slab);
# fill is the fill element's bytes in x's dtype.
# scatter_p(x, indices, updates): x's shape; updates are shaped like
# gather's output. Each lowers (per device, under custom_partitioning) to
# the *_local_p FFI call on its shard.
gather_p = Primitive("jax_tma_gather")
gather_local_p = Primitive("jax_tma_gather_local")
scatter_p = Primitive("jax_tma_scatter")
scatter_local_p = Primitive("jax_tma_scatter_local")


def _gathered_shape(x_shape, idx_shape, axis, batch):
    return tuple(x_shape[:axis]) + tuple(idx_shape[batch:]) + tuple(x_shape[axis + 1:])


def _gather_abstract(x, indices, *args, axis, batch, **_):
    return jax.core.ShapedArray(_gathered_shape(x.shape, indices.shape, axis, batch), x.dtype)


def _scatter_abstract(x, *args, **_):
    return jax.core.ShapedArray(x.shape, x.dtype)


gather_p.def_abstract_eval(_gather_abstract)
gather_local_p.def_abstract_eval(_gather_abstract)
scatter_p.def_abstract_eval(_scatter_abstract)
scatter_local_p.def_abstract_eval(_scatter_abstract)
_ffi.def_jitted_impl(gather_p)
_ffi.def_jitted_impl(scatter_p)


def _gather_local_lowering(ctx, x, indices, fill, *, axis, batch, method):
    return jax.ffi.ffi_lowering("jax_tma_gather")(
        ctx, x, indices, fill, axis=np.int64(axis), batch=np.int64(batch), method=method)


def _scatter_local_lowering(ctx, x, indices, updates, order, *, axis, batch, mode,
                            deterministic, method):
    # The output is x's buffer: in place where x is donated, else XLA copies x.
    return jax.ffi.ffi_lowering("jax_tma_scatter", operand_output_aliases={0: 0})(
        ctx, x, indices, updates, order, axis=np.int64(axis), batch=np.int64(batch), mode=mode,
        deterministic=bool(deterministic), method=method)


for _platform in ("cpu", "cuda"):
    mlir.register_lowering(gather_local_p, _gather_local_lowering, platform=_platform)
    mlir.register_lowering(scatter_local_p, _scatter_local_lowering, platform=_platform)


# ---- index arithmetic shared by AD and deterministic scatter ----------------

def _rows(indices: jax.Array, n: int, batch: int) -> jax.Array:
    """(B, M) keys: each index wrapped as the handlers wrap it (negative +n,
    once), n where it is out of range. int32 unless n needs int64."""
    if n >= 2**31 - 1 and not jax.config.jax_enable_x64:
        raise ValueError(f"{_OP_S}: a table of {n} rows needs int64 row numbers; enable "
                         "jax_enable_x64")
    dtype = jnp.int64 if n >= 2**31 - 1 else jnp.int32
    b = math.prod(indices.shape[:batch])
    i = indices.reshape(b, -1)
    if jnp.issubdtype(i.dtype, jnp.unsignedinteger):
        valid = i < n
        w = jnp.where(valid, i, 0).astype(dtype)
    else:
        w = i.astype(jnp.int64 if i.dtype == jnp.int64 else dtype)
        w = jnp.where(w < 0, w + n, w)
        valid = (w >= 0) & (w < n)
        w = w.astype(dtype)
    return jnp.where(valid, w, jnp.asarray(n, dtype))


def _stable_order(keys: jax.Array) -> jax.Array:
    """Per batch row, the positions of the keys in stable sorted order."""
    dtype = jnp.int32 if keys.shape[-1] < 2**31 else jnp.int64
    return jnp.argsort(keys, axis=-1, stable=True).astype(dtype)


def _last_wins(indices: jax.Array, n: int, batch: int) -> jax.Array:
    """indices with every out-of-range index, and every duplicate but the
    last of its row, replaced by n (dropped): no two in-range indices of a
    batch entry are equal any more, so a scatter-set of them is linear and
    deterministic, with the result the CPU handler gives."""
    keys = _rows(indices, n, batch)
    order = _stable_order(keys)
    sk = jnp.take_along_axis(keys, order, axis=-1)
    last = jnp.concatenate([sk[:, 1:] != sk[:, :-1], jnp.ones_like(sk[:, :1], bool)], axis=-1)
    rows = jnp.arange(keys.shape[0])[:, None]
    won = jnp.zeros(keys.shape, bool).at[rows, order].set(last & (sk < n), unique_indices=True)
    return jnp.where(won, keys, jnp.asarray(n, keys.dtype)).reshape(indices.shape)


# ---- partitioning: every dim but axis keeps its sharding ---------------------

def _spec(sharding, ndim: int) -> list:
    spec = tuple(sharding.spec) if isinstance(sharding, NamedSharding) else ()
    return list(spec) + [None] * (ndim - len(spec))


def _factors(x_ndim, idx_ndim, axis, batch):
    """Shardy factor names of x, the indices and the gathered slabs."""
    xs = ([f"b{d}" for d in range(batch)] + [f"p{d}" for d in range(batch, axis)] + ["n"]
          + [f"s{d}" for d in range(axis + 1, x_ndim)])
    idx = xs[:batch] + [f"i{d}" for d in range(batch, idx_ndim)]
    slabs = xs[:axis] + idx[batch:] + xs[axis + 1:]
    return xs, idx, slabs


def _shardings(mesh, arg_shapes, x_ndim, idx_ndim, axis, batch):
    """x's sharding with axis unsplit, the indices split like x's batch dims
    and whole otherwise, and the matching sharding of gathered slabs."""
    xs = _spec(arg_shapes[0].sharding, x_ndim)
    xs[axis] = None
    idx = xs[:batch] + [None] * (idx_ndim - batch)
    slabs = xs[:axis] + idx[batch:] + xs[axis + 1:]
    return (NamedSharding(mesh, P(*xs)), NamedSharding(mesh, P(*idx)),
            NamedSharding(mesh, P(*slabs)))


@functools.cache
def _partitioned_gather(x_ndim, idx_ndim, axis, batch, fill, method):
    def local(x, indices):
        fill_arr = jnp.asarray(np.frombuffer(fill, x.dtype).reshape(()))
        return gather_local_p.bind(x, indices, fill_arr, axis=axis, batch=batch, method=method)

    def infer(mesh, arg_shapes, result_shape):
        return _shardings(mesh, arg_shapes, x_ndim, idx_ndim, axis, batch)[2]

    def partition(mesh, arg_shapes, result_shape):
        xs, idx, out = _shardings(mesh, arg_shapes, x_ndim, idx_ndim, axis, batch)
        return mesh, local, out, (xs, idx)

    xs, idx, slabs = _factors(x_ndim, idx_ndim, axis, batch)
    rule = f"{' '.join(xs)}, {' '.join(idx)} -> {' '.join(slabs)}"
    f = custom_partitioning(local)
    f.def_partition(infer_sharding_from_operands=infer, partition=partition, sharding_rule=rule,
                    need_replication_factors=("n",))
    return local, f


@functools.cache
def _partitioned_scatter(x_ndim, idx_ndim, axis, batch, mode, deterministic, method):
    def local(x, indices, updates):
        if deterministic:
            order = _stable_order(_rows(indices, x.shape[axis], batch))
        else:
            order = jnp.zeros((0,), jnp.int32)
        return scatter_local_p.bind(x, indices, updates, order, axis=axis, batch=batch, mode=mode,
                                    deterministic=deterministic, method=method)

    def infer(mesh, arg_shapes, result_shape):
        return _shardings(mesh, arg_shapes, x_ndim, idx_ndim, axis, batch)[0]

    def partition(mesh, arg_shapes, result_shape):
        xs, idx, upd = _shardings(mesh, arg_shapes, x_ndim, idx_ndim, axis, batch)
        return mesh, local, xs, (xs, idx, upd)

    xs, idx, slabs = _factors(x_ndim, idx_ndim, axis, batch)
    rule = f"{' '.join(xs)}, {' '.join(idx)}, {' '.join(slabs)} -> {' '.join(xs)}"
    f = custom_partitioning(local)
    # Every update must reach the device that holds its row: n and the index
    # dims stay whole.
    f.def_partition(infer_sharding_from_operands=infer, partition=partition, sharding_rule=rule,
                    need_replication_factors=("n",) + tuple(idx[batch:]))
    return local, f


def _gather_lowering(ctx, x, indices, *, axis, batch, fill, method):
    local, f = _partitioned_gather(ctx.avals_in[0].ndim, ctx.avals_in[1].ndim, axis, batch,
                                   fill, method)
    fn = local if _ffi.single_device(ctx) else f
    return mlir.lower_fun(fn, multiple_results=False)(ctx, x, indices)


def _scatter_lowering(ctx, x, indices, updates, *, axis, batch, mode, deterministic, method):
    local, f = _partitioned_scatter(ctx.avals_in[0].ndim, ctx.avals_in[1].ndim, axis, batch,
                                    mode, deterministic, method)
    fn = local if _ffi.single_device(ctx) else f
    return mlir.lower_fun(fn, multiple_results=False)(ctx, x, indices, updates)


def _cuda_gather_lowering(ctx, *args, method, **params):
    if method == "tma":
        _checks.require_tma(_OP_G, method)
    return _gather_lowering(ctx, *args, method=method, **params)


def _cuda_scatter_lowering(ctx, *args, method, **params):
    if method == "tma":
        _checks.require_tma(_OP_S, method)
    return _scatter_lowering(ctx, *args, method=method, **params)


_ffi.require_devices_during_lowering(gather_p)
_ffi.require_devices_during_lowering(scatter_p)
mlir.register_lowering(gather_p, _gather_lowering, platform="cpu")
mlir.register_lowering(gather_p, _cuda_gather_lowering, platform="cuda")
mlir.register_lowering(scatter_p, _scatter_lowering, platform="cpu")
mlir.register_lowering(scatter_p, _cuda_scatter_lowering, platform="cuda")


# ---- vmap: the vmapped dim becomes a batch dim or an outer dim ---------------

def _front(a, d, size, to):
    """`a` with its vmapped dim `d` at position `to`, or broadcast to have one."""
    if d is None:
        return jnp.broadcast_to(jnp.expand_dims(a, to), a.shape[:to] + (size,) + a.shape[to:])
    return jnp.moveaxis(a, d, to)


def _gather_batcher(args, dims, *, axis, batch, **params):
    (x, indices), (dx, di) = args, dims
    if di is None:  # one index set for every x: the new dim is an outer dim
        x = jnp.moveaxis(x, dx, batch)
        return gather_p.bind(x, indices, axis=axis + 1, batch=batch, **params), batch
    if dx is None:  # one x for every index set: more indices
        indices = jnp.moveaxis(indices, di, batch)
        return gather_p.bind(x, indices, axis=axis, batch=batch, **params), axis
    x, indices = jnp.moveaxis(x, dx, 0), jnp.moveaxis(indices, di, 0)
    return gather_p.bind(x, indices, axis=axis + 1, batch=batch + 1, **params), 0


def _scatter_batcher(args, dims, *, axis, batch, **params):
    (x, indices, updates), (dx, di, du) = args, dims
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    if di is None:  # shared indices: the new dim is an outer dim of x and updates
        x, updates = _front(x, dx, size, batch), _front(updates, du, size, batch)
        return scatter_p.bind(x, indices, updates, axis=axis + 1, batch=batch, **params), batch
    x, updates = _front(x, dx, size, 0), _front(updates, du, size, 0)
    indices = jnp.moveaxis(indices, di, 0)
    return scatter_p.bind(x, indices, updates, axis=axis + 1, batch=batch + 1, **params), 0


batching.primitive_batchers[gather_p] = _gather_batcher
batching.primitive_batchers[scatter_p] = _scatter_batcher


# ---- autodiff: linear in x (and updates); the indices are constants ----------

def _zero_fill(dtype) -> bytes:
    return np.zeros((), dtype).tobytes()


def _gather_jvp(primals, tangents, *, fill, **params):
    x, indices = primals
    tx, _ = tangents
    y = gather_p.bind(x, indices, fill=fill, **params)
    if type(tx) is ad.Zero:
        return y, ad.Zero.from_primal_value(y)
    # The fill is a constant: its tangent is 0.
    return y, gather_p.bind(tx, indices, fill=_zero_fill(tx.dtype), **params)


def _gather_transpose(ct, x, indices, *, axis, batch, fill, method):
    assert ad.is_undefined_primal(x) and not ad.is_undefined_primal(indices)
    if type(ct) is ad.Zero:
        return [ad.Zero(x.aval), None]
    zeros = jnp.zeros(x.aval.shape, ct.dtype)
    return [scatter_p.bind(zeros, indices, ct, axis=axis, batch=batch, mode="add",
                           deterministic=False, method=method), None]


def _scatter_jvp(primals, tangents, *, axis, batch, mode, deterministic, method):
    x, indices, updates = primals
    tx, _, tu = tangents
    params = dict(axis=axis, batch=batch, mode=mode, deterministic=deterministic, method=method)
    if mode == "set":
        # Primal and tangent must keep the same winner of each duplicate.
        indices = _last_wins(indices, x.shape[axis], batch)
    y = scatter_p.bind(x, indices, updates, **params)
    if type(tx) is ad.Zero and type(tu) is ad.Zero:
        return y, ad.Zero.from_primal_value(y)
    tx, tu = ad.instantiate_zeros(tx), ad.instantiate_zeros(tu)
    return y, scatter_p.bind(tx, indices, tu, **params)


def _scatter_transpose(ct, x, indices, updates, *, axis, batch, mode, deterministic, method):
    assert not ad.is_undefined_primal(indices)
    x_aval = x.aval if ad.is_undefined_primal(x) else jax.typeof(x)
    u_aval = updates.aval if ad.is_undefined_primal(updates) else jax.typeof(updates)
    if type(ct) is ad.Zero:
        return [ad.Zero(x_aval) if ad.is_undefined_primal(x) else None, None,
                ad.Zero(u_aval) if ad.is_undefined_primal(updates) else None]
    n = x_aval.shape[axis]
    if mode == "set":
        indices = _last_wins(indices, n, batch)
    ct_x = ct_u = None
    if ad.is_undefined_primal(x):
        if mode == "add":
            ct_x = ct
        else:  # the overwritten slabs do not reach the output
            ct_x = scatter_p.bind(ct, indices, jnp.zeros(u_aval.shape, ct.dtype), axis=axis,
                                  batch=batch, mode="set", deterministic=False, method=method)
    if ad.is_undefined_primal(updates):
        ct_u = gather_p.bind(ct, indices, axis=axis, batch=batch, fill=_zero_fill(ct.dtype),
                             method=method)
    return [ct_x, None, ct_u]


ad.primitive_jvps[gather_p] = _gather_jvp
ad.primitive_transposes[gather_p] = _gather_transpose
ad.primitive_jvps[scatter_p] = _scatter_jvp
ad.primitive_transposes[scatter_p] = _scatter_transpose


# ---- argument checks -----------------------------------------------------------

def _indices(op: str, indices: Any) -> jax.Array:
    if isinstance(indices, (int, np.integer)) and not isinstance(indices, bool):
        indices = np.asarray(indices)
    indices = _checks.as_array(op, "indices", indices)
    if not jnp.issubdtype(indices.dtype, jnp.integer):
        raise TypeError(f"{op}: indices must be integers, got dtype {indices.dtype}")
    return indices


def _axis(op: str, axis: Any, x: jax.Array) -> int:
    if x.ndim == 0:
        raise ValueError(f"{op}: x must have rank >= 1, got a 0-d array")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{op}: axis must be an int, got {axis!r}")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"{op}: axis {axis} is out of range for x of rank {x.ndim} "
                         f"(valid: {-x.ndim} to {x.ndim - 1})")
    return int(axis) % x.ndim


def _check_tma_slab(op: str, method: str, x: jax.Array, wide, axis: int) -> None:
    """method='tma' moves each slab with one bulk copy: 16-byte multiples."""
    slab = x.shape[axis + 1:]
    nbytes = math.prod(slab) * np.dtype(wide).itemsize
    if method == "tma" and nbytes % 16:
        raise ValueError(f"{op}: method='tma' moves slabs of a multiple of 16 bytes (the bulk-copy "
                         f"size rule), but x.shape[axis + 1:] = {slab} of {x.dtype} is {nbytes} B; "
                         f"use method='auto' or 'simt'")


def _fill_bytes(fill: Any, dtype: np.dtype) -> bytes:
    if isinstance(fill, jax.core.Tracer) or np.ndim(fill) != 0 or isinstance(fill, str):
        raise TypeError(f"{_OP_G}: fill must be a concrete scalar, got {fill!r:.80}")
    value = np.asarray(fill)
    if value.dtype.kind not in "biufc":
        raise TypeError(f"{_OP_G}: fill must be a number, got {fill!r:.80}")
    if value.dtype.kind == "c" and np.dtype(dtype).kind != "c":
        raise TypeError(f"{_OP_G}: a complex fill {fill!r} needs a complex x, x has dtype {dtype}")
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(value.astype(dtype)).astype(_checks.widen_dtype(dtype)).tobytes()


# ---- the public ops -------------------------------------------------------------

def gather(
    x: jax.Array | np.ndarray,
    indices: jax.Array | np.ndarray | int,
    *,
    axis: int = 0,
    fill: float | int | complex = 0,
    method: GatherMethod = "auto",
) -> jax.Array:
    """The slabs of ``x`` along ``axis`` picked by ``indices``: bit for bit
    ``jnp.take(x, indices, axis, mode="fill", fill_value=fill)``.

    A slab is the block of ``x`` at one position of ``axis``: all dims after
    ``axis``, contiguous in memory (a row of a table, a page of a KV cache).
    Negative indices wrap once (``-1`` is the last slab); any other index out
    of range gives a slab of ``fill``. On Hopper/Blackwell GPUs each slab is
    moved by the Tensor Memory Accelerator as one bulk copy
    (``cp.async.bulk``) where slabs are 16-byte multiples; other slabs, and
    small ones, take a vectorised SIMT kernel with the same result.
    Works under ``jit``, ``vmap`` (batched ``x`` and/or ``indices`` become
    one call), ``grad`` (the transpose is a scatter-add) and on sharded
    arrays (every dim but ``axis`` may be split, ``indices`` replicated; no
    collectives are inserted).

    Args:
      x: an array of rank >= 1 and any dtype (sub-byte types are widened
        around the call).
      indices: integers of any shape (and any integer dtype).
      axis: the dim of ``x`` that the indices pick along, in
        ``[-x.ndim, x.ndim)``.
      fill: the value of slabs picked by out-of-range indices: a Python or
        NumPy scalar, cast to ``x``'s dtype.
      method: ``"auto"`` (the SIMT kernel for slabs of at most 4 KiB, for
        calls of at most 64 MiB and for calls of at most a vector for each
        thread of one resident wave, where it is the faster, and on GPUs
        without TMA; ``"tma"`` otherwise where the slabs allow it),
        ``"tma"`` (one bulk copy per slab; a ValueError
        naming the 16-byte rule where slabs break it, a RuntimeError on GPUs
        without TMA) or ``"simt"``. On the CPU every method gives the same
        host copy.

    Returns:
      An array of shape ``x.shape[:axis] + indices.shape + x.shape[axis+1:]``.

    Example:
      >>> import jax.numpy as jnp, jax_tma
      >>> table = jnp.arange(8).reshape(4, 2)
      >>> jax_tma.gather(table, jnp.array([3, -1, 4]), fill=-7).tolist()
      [[6, 7], [6, 7], [-7, -7]]
    """
    x = _checks.as_array(_OP_G, "x", x)
    indices = _indices(_OP_G, indices)
    axis = _axis(_OP_G, axis, x)
    _checks.check_choice(_OP_G, "method", method, _METHODS)
    fill_bytes = _fill_bytes(fill, x.dtype)
    src = _checks.widen(x)
    _check_tma_slab(_OP_G, method, x, src.dtype, axis)
    _ffi.register()
    y = gather_p.bind(src, indices, axis=axis, batch=0, fill=fill_bytes, method=method)
    return _checks.narrow(y, x.dtype)


def scatter(
    x: jax.Array | np.ndarray,
    indices: jax.Array | np.ndarray | int,
    updates: jax.Array | np.ndarray,
    *,
    axis: int = 0,
    mode: ScatterMode = "set",
    method: GatherMethod = "auto",
    deterministic: bool = False,
) -> jax.Array:
    """``x`` with the slabs along ``axis`` at ``indices`` replaced by
    (``mode="set"``) or increased by (``mode="add"``) the slabs of
    ``updates``: ``x.at[(slice(None),) * axis + (indices,)].set(updates,
    mode="drop")`` (or ``.add``).

    Negative indices wrap once; any other out-of-range index is dropped.
    Under ``jit`` with ``x`` donated (``donate_argnums``) the slabs are
    written in place: the output is ``x``'s buffer and no copy of ``x`` is
    made (without donation XLA copies ``x`` first). On Hopper/Blackwell GPUs
    each slab is one bulk copy (``set``) or one bulk reduce-add
    (``cp.reduce.async.bulk .add``, for 32/64-bit integers, f16, bf16, f32,
    f64, c64 and c128) where slabs are 16-byte multiples; other slabs and
    dtypes take a SIMT kernel (atomic adds) with the same result.

    Duplicate indices:
      - ``set``: each element of a slab indexed more than once holds that
        element of one of its updates, as in XLA. On the CPU, and on the GPU
        with ``deterministic=True``, it is always the last update (in index
        order); otherwise the GPU picks any.
      - ``add``: all updates are summed. Integers add exactly (wrapping);
        floats add in an unspecified order on the GPU, where the hardware
        reduction may also flush f32 subnormals. With ``deterministic=True``
        every slab adds its updates in index order, rounding to the dtype
        after each add, identically on the CPU and GPU (the CPU always does;
        a NaN sum is stored as the canonical quiet NaN on both).

    Works under ``jit``, ``vmap``, ``grad`` (``set``: the cotangent of ``x``
    has the overwritten slabs zeroed and that of ``updates`` is the gathered
    cotangent, zero for dropped and losing duplicate updates; ``add``:
    identity and gather) and on sharded arrays (every dim but ``axis`` may
    be split; ``indices`` and their ``updates`` dims replicated).

    Args:
      x: an array of rank >= 1 (any dtype for ``set``; integers, f16, bf16,
        f32, f64, c64 or c128 for ``add``).
      indices: integers of any shape.
      updates: an array of ``x``'s dtype and shape
        ``x.shape[:axis] + indices.shape + x.shape[axis+1:]``.
      axis: the dim of ``x`` the indices pick along.
      mode: ``"set"`` or ``"add"``.
      method: ``"auto"`` (under ``"set"`` as for :func:`gather`, but for
        the 64 MiB rule; under ``"add"`` the SIMT kernel's 16-byte vector
        reductions for float32, float16 and bfloat16 where slabs and
        addresses are multiples of 16 bytes, ``"tma"`` for other types where
        it can run), ``"tma"`` (bulk copies / bulk reduce-adds; a ValueError
        naming the rule where slabs or dtype break it) or ``"simt"``. On the CPU every method gives the same result.
      deterministic: fixes the order duplicates apply in (see above); costs
        a sort of the indices on the device.

    Returns:
      An array of ``x``'s shape and dtype.

    Example:
      >>> import jax.numpy as jnp, jax_tma
      >>> table = jnp.zeros((4, 2), jnp.int32)
      >>> jax_tma.scatter(table, jnp.array([1, -1, 9]), jnp.ones((3, 2), jnp.int32),
      ...                 mode="add").tolist()
      [[0, 0], [1, 1], [0, 0], [1, 1]]
    """
    x = _checks.as_array(_OP_S, "x", x)
    indices = _indices(_OP_S, indices)
    updates = _checks.as_array(_OP_S, "updates", updates)
    axis = _axis(_OP_S, axis, x)
    _checks.check_choice(_OP_S, "mode", mode, _MODES)
    _checks.check_choice(_OP_S, "method", method, _METHODS)
    if not isinstance(deterministic, (bool, np.bool_)):
        raise TypeError(f"{_OP_S}: deterministic must be a bool, got {deterministic!r}")
    want = _gathered_shape(x.shape, indices.shape, axis, 0)
    if updates.dtype != x.dtype:
        raise TypeError(f"{_OP_S}: updates have dtype {updates.dtype} but x has dtype {x.dtype}")
    if tuple(updates.shape) != want:
        raise ValueError(f"{_OP_S}: updates have shape {tuple(updates.shape)}; expected {want} "
                         f"(x.shape[:axis] + indices.shape + x.shape[axis+1:] with "
                         f"x.shape={tuple(x.shape)}, indices.shape={tuple(indices.shape)}, "
                         f"axis={axis})")
    summable = x.dtype.name not in _checks.SUB_BYTE_WIDE and (
        x.dtype.kind in "iuc" or x.dtype.name in ("float16", "bfloat16", "float32", "float64"))
    if mode == "add" and not summable:
        raise TypeError(f"{_OP_S}: mode='add' cannot sum dtype {x.dtype} (integers, float16, "
                        "bfloat16, float32, float64, complex64 or complex128)")
    src = _checks.widen(x)
    _check_tma_slab(_OP_S, method, x, src.dtype, axis)
    if method == "tma" and mode == "add" and x.dtype.name not in _BULK_ADD:
        raise ValueError(f"{_OP_S}: method='tma' adds with cp.reduce.async.bulk, which has no "
                         f"add for {x.dtype} (it has int32, uint32, int64, uint64, float16, "
                         "bfloat16, float32, float64; complex as their parts); use method='auto' "
                         "or 'simt'")
    if deterministic and method == "tma":
        raise ValueError(f"{_OP_S}: deterministic=True applies updates in index order with the "
                         "SIMT kernel; method='tma' cannot (use method='auto' or 'simt')")
    _ffi.register()
    y = scatter_p.bind(src, indices, _checks.widen(updates), axis=axis, batch=0, mode=mode,
                       deterministic=bool(deterministic), method=method)
    return _checks.narrow(y, x.dtype)
