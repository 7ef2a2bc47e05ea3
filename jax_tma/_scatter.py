"""jax_tma.scatter: whole slabs (rows, pages) set or added by an index array,
in place on a donated x, as a JAX primitive (jit, vmap folded into shared
batch dims, AD through gathers, shard_map, explicit and automatic sharding
with every dim but `axis` partitioned without collectives). What it shares
with gather is in _gather_common.py."""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.interpreters import ad, mlir
from jax.sharding import PartitionSpec as P

from jax_tma import _checks, _ffi, _lowering
from jax_tma._gather_common import (GatherMethod, METHODS, adds_natively, as_indices, as_tables,
                                    bind_gather, bind_scatter, by_group, check_tma_slab, distinct,
                                    factors, gathered_shape, halves, lead_spec, like, partitioned,
                                    resharded, scatter_local_p, scatter_p, sharding_rule,
                                    shardings, with_tma_check, zero_fill, zero_tangent, zeros_of)

ScatterMode = Literal["set", "add"]
_MODES = ("set", "add")
_OP = "jax_tma.scatter"


# ---- the public op ----------------------------------------------------------

def scatter(
    x: jax.Array | np.ndarray | Sequence[jax.Array | np.ndarray],
    indices: jax.Array | np.ndarray | int,
    updates: jax.Array | np.ndarray | Sequence[jax.Array | np.ndarray],
    *,
    axis: int = 0,
    mode: ScatterMode = "set",
    method: GatherMethod = "auto",
    deterministic: bool = False,
) -> jax.Array | tuple[jax.Array, ...]:
    """``x`` with the slabs along ``axis`` at ``indices`` replaced by
    (``mode="set"``) or increased by (``mode="add"``) the slabs of
    ``updates``: ``x.at[(slice(None),) * axis + (indices,)].set(updates,
    mode="drop")`` (or ``.add``).

    Negative indices wrap once; any other out-of-range index is dropped.
    Under ``jit`` with ``x`` donated (``donate_argnums``) the slabs are
    written in place: the output is ``x``'s buffer (without donation XLA
    copies ``x`` first). On Hopper/Blackwell GPUs a slab can be one bulk
    copy (``set``) or one bulk reduce-add (``cp.reduce.async.bulk .add``); a
    SIMT kernel moves the others with the same result. Works under ``jit``,
    ``vmap``, ``grad``, ``shard_map`` and on sharded arrays without
    collectives (every dim but ``axis`` may be split, ``indices``
    replicated); the op's page says how each rule shards and differentiates.

    Duplicate indices: under ``set`` each element keeps one of its updates
    (the last, in index order, on the CPU and with ``deterministic=True``;
    any on the GPU otherwise); under ``add`` all are summed, floats in an
    unspecified order on the GPU unless ``deterministic=True``, which adds
    in index order, rounding after each add, as the CPU does. Float types
    the handlers cannot add (float8_*, float4_e2m1fn) are summed in float32
    and rounded once. ``updates`` of another dtype are converted as
    ``x.at[].set`` converts them.

    Several tables (as for :func:`gather`): ``x`` a tuple or list of up to 8
    tables and ``updates`` a tuple of one array per table; the result is a
    tuple, each table updated in place where it is donated.

    ``method="auto"``: under ``"set"`` as for :func:`gather` (but its
    64 MiB rule); under ``"add"`` the SIMT kernel's 16-byte vector
    reductions for float32, float16 and bfloat16 where slabs and addresses
    allow them, else one bulk reduce-add per slab where it can run, else
    the SIMT kernel's element atomics. ``deterministic=True`` always takes
    the SIMT kernel.

    Args:
      x: an array of rank >= 1 (any dtype for ``set``; any numeric dtype
        for ``add``), or a tuple or list of 1 to 8 such tables.
      indices: integers of any shape and integer dtype, as for
        :func:`gather`.
      updates: an array or a Python scalar that broadcasts to
        ``x.shape[:axis] + indices.shape + x.shape[axis+1:]``; for tables, a
        tuple of one per table.
      axis: the dim of ``x`` the indices pick along, in ``[-x.ndim, x.ndim)``.
      mode: ``"set"`` or ``"add"``.
      method: ``"auto"`` (the rule above), ``"tma"`` (bulk copies / bulk
        reduce-adds: slabs a multiple of 16 bytes, and for ``add`` a dtype
        that ``cp.reduce.async.bulk`` adds) or ``"simt"``. On the CPU every
        method gives the same result.
      deterministic: applies duplicates in index order (see above); costs
        a sort of the indices on the device.

    Returns:
      An array of ``x``'s shape and dtype; for tables, a tuple of them.

    Raises:
      TypeError: ``x``, ``indices`` or ``updates`` is not an array or
        scalar; ``indices`` are not integers; ``axis`` is not an int;
        ``x`` is several tables and ``updates`` not a tuple of as many
        arrays; ``deterministic`` is not a bool; ``mode="add"`` of a dtype
        that cannot be summed (bool).
      ValueError: a 0-d ``x``; ``axis`` out of range; ``x`` a sequence of
        no or more than 8 tables, or tables that disagree in
        ``x.shape[:axis + 1]``; ``mode`` or ``method`` is not one of its
        names; ``updates`` that do not broadcast to the gathered shape;
        ``deterministic=True`` with ``method="tma"``; ``method="tma"`` with
        slabs that are not a multiple of 16 bytes or an add of a dtype
        ``cp.reduce.async.bulk`` lacks; under an explicit mesh, split
        indices or an ``x`` split along ``axis``; over 2^31 - 1 rows or
        indices to number (``deterministic=True``, or ``grad``) without
        ``jax_enable_x64``.
      RuntimeError: ``method="tma"`` is lowered for a GPU without TMA
        (compute capability below 9.0).

    Warns:
      FutureWarning: ``updates`` whose dtype cannot be cast safely to
        ``x``'s, as ``x.at[].set`` warns.

    Examples:
      >>> import jax, jax.numpy as jnp, jax_tma
      >>> table = jnp.zeros((4, 2), jnp.int32)
      >>> jax_tma.scatter(table, jnp.array([1, -1, 9]), jnp.ones((3, 2), jnp.int32),
      ...                 mode="add").tolist()
      [[0, 0], [1, 1], [0, 0], [1, 1]]
      >>> update = jax.jit(lambda t, i, u: jax_tma.scatter(t, i, u), donate_argnums=0)
      >>> args = (jnp.zeros((1024, 64)), jnp.array([3]), jnp.ones((1, 64)))
      >>> " copy(" in update.lower(*args).compile().as_text()   # in place: no copy of x
      False
      >>> jax_tma.scatter(table, jnp.array([0, 1]), jnp.ones((3, 2), jnp.int32))
      Traceback (most recent call last):
        ...
      ValueError: jax_tma.scatter: updates have shape (3, 2), which does not broadcast to (2, 2)...
    """
    tables, names, axis, many = as_tables(_OP, x, axis)
    indices = as_indices(_OP, indices)
    if many:
        if not isinstance(updates, (tuple, list)) or len(updates) != len(tables):
            got = (f"{len(updates)} arrays" if isinstance(updates, (tuple, list))
                   else type(updates).__name__)
            raise TypeError(f"{_OP}: x is {len(tables)} tables, so updates must be a tuple of "
                            f"{len(tables)} arrays (one per table), got {got}")
        labels = [f"updates[{t}]" for t in range(len(tables))]
    else:
        labels, updates = ["updates"], [updates]
    _checks.check_choice(_OP, "mode", mode, _MODES)
    _checks.check_choice(_OP, "method", method, METHODS)
    if not isinstance(deterministic, (bool, np.bool_)):
        raise TypeError(f"{_OP}: deterministic must be a bool, got {deterministic!r}")
    if deterministic and method == "tma":
        raise ValueError(f"{_OP}: deterministic=True applies updates in index order with the "
                         "SIMT kernel; method='tma' cannot (use method='auto' or 'simt')")
    _check_whole_indices(jax.typeof(indices), 0)
    ups = [_updates(name, label, t, indices, u, axis)
           for name, label, t, u in zip(names, labels, tables, updates)]
    pairs = []
    for name, t, u in zip(names, tables, ups):  # a loop: the warning's stacklevel is the caller's
        pairs.append(_promoted(name, t, u))
        _check_bound(name, pairs[-1][0], axis, mode, method)
    _ffi.register()
    params = dict(axis=axis, batch=0, mode=mode, deterministic=bool(deterministic),
                  method=method)
    outs = [None] * len(tables)
    in_f32 = [t for t, (xp, _) in enumerate(pairs) if mode == "add" and _sums_in_f32(xp.dtype)]
    rest = [t for t in range(len(tables)) if t not in in_f32]
    if rest:
        ys = bind_scatter(indices, *(_checks.widen(pairs[t][0]) for t in rest),
                            *(_checks.widen(pairs[t][1]) for t in rest), **params)
        for t, y in zip(rest, ys):
            outs[t] = _checks.narrow(y, pairs[t][0].dtype)
    for t in in_f32:
        outs[t] = _add_in_f32(indices, *pairs[t], axis, bool(deterministic), method)
    # Back to x's dtype, as x.at[] converts; x itself where nothing is
    # scattered (no slab), as x.at[] returns it.
    outs = [x if x.dtype != y.dtype and u.size == 0 else y.astype(x.dtype)
            for x, u, y in zip(tables, ups, outs)]
    return tuple(outs) if many else outs[0]


# ---- argument checks -----------------------------------------------------------

def _updates(op: str, name: str, x: jax.Array, indices: jax.Array, updates: Any,
             axis: int) -> jax.Array:
    """One table's updates as x.at[].set takes them (jax's _scatter_update):
    a Python int that fits an integer x in x's dtype, anything else as
    jnp.asarray takes it; broadcast to the gathered slabs' shape."""
    if isinstance(updates, int) and not isinstance(updates, bool) and \
            jnp.issubdtype(x.dtype, jnp.integer) and \
            jnp.iinfo(x.dtype).min <= updates <= jnp.iinfo(x.dtype).max:
        updates = jnp.asarray(updates, x.dtype)
    updates = _checks.as_array(op, name, updates)
    want = gathered_shape(x.shape, indices.shape, axis, 0)
    try:
        fits = jnp.broadcast_shapes(updates.shape, want) == want
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"{op}: updates have shape {tuple(updates.shape)}, which does not "
                         f"broadcast to {want} (x.shape[:axis] + indices.shape + "
                         f"x.shape[axis+1:] with x.shape={tuple(x.shape)}, "
                         f"indices.shape={tuple(indices.shape)}, axis={axis})")
    return jnp.broadcast_to(updates, want)


def _promoted(op: str, x: jax.Array, updates: jax.Array) -> list[jax.Array]:
    """x and its updates in the dtype x.at[].set/add computes in, converted
    by jnp's own helpers as jax/_src/ops/scatter.py's _scatter_impl does
    (the same in jax 0.10.2 to 0.12), with its FutureWarning where the
    updates cannot be cast safely to x's dtype. The result goes back to
    x's dtype."""
    from jax._src import dtypes
    from jax._src.numpy.util import promote_dtypes

    if not dtypes.safe_to_cast(updates, x):
        warnings.warn(
            f"{op}: updates of dtype {updates.dtype} cannot be cast safely to x's dtype "
            f"{x.dtype} (jax_numpy_dtype_promotion={jax.config.jax_numpy_dtype_promotion}); "
            "they are converted as x.at[].set converts them, which warns the same and will "
            "raise in a future JAX release", FutureWarning, stacklevel=3)
    return promote_dtypes(x, updates)


def _sums_in_f32(dtype) -> bool:
    """Whether an add into a table of `dtype` is summed in float32: a float
    type the handlers cannot add (float8_*, float4_e2m1fn)."""
    return jnp.issubdtype(dtype, jnp.floating) and not adds_natively(dtype)


def _check_bound(op: str, x: jax.Array, axis: int, mode: str, method: str) -> None:
    """One table's rules of scatter, on x in the dtype it is computed in:
    the add's dtypes and method='tma''s rules."""
    if mode == "add" and not (adds_natively(x.dtype) or _sums_in_f32(x.dtype)):
        raise TypeError(f"{op}: mode='add' cannot sum dtype {x.dtype} (as x.at[].add cannot)")
    wide = _checks.widen_dtype(x.dtype)
    check_tma_slab(op, method, x, wide, axis)
    added = np.dtype(np.float32) if _sums_in_f32(x.dtype) else wide
    bulk_add = _ffi.rules()["gather.bulk_add_dtypes"]
    if method == "tma" and mode == "add" and added.name not in bulk_add:
        raise ValueError(f"{op}: method='tma' adds with cp.reduce.async.bulk, which has no "
                         f"add for {added} (it has {', '.join(bulk_add)}); use method='auto' "
                         "or 'simt'")


def _check_whole_indices(indices, batch: int) -> None:
    """A scatter's indices are whole beyond the batch dims: every device that
    holds rows of x needs every index."""
    spec = _lowering.spec_of(indices)
    if any(e is not None for e in spec[batch:]):
        raise ValueError(f"{_OP}: the indices are split over mesh axes (sharded {P(*spec)}), "
                         "but every device that holds rows of x needs every index (as x.at[] "
                         "does); replicate them first (jax.sharding.reshard)")


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4, 5))
def _add_in_f32(indices: jax.Array, x: jax.Array, updates: jax.Array, axis: int,
                deterministic: bool, method: str) -> jax.Array:
    """x.at[].add(updates) for a float type the handlers cannot add: each
    row's updates summed in float32 (from -0, the identity of +, in index
    order where deterministic), added to the row in float32 and rounded to
    x's dtype once (XLA rounds after every add), then set. Rows without
    updates are never converted: they keep their bits, NaN payloads too
    (XLA's CPU float8 arithmetic and select run in float32 and change
    them)."""
    f32 = np.dtype(np.float32)
    wide = _checks.widen(x)
    params = dict(axis=axis, batch=0, method=method)
    (sums,) = bind_scatter(indices, -zeros_of(jax.typeof(x), f32), updates.astype(f32),
                             mode="add", deterministic=deterministic, **params)
    rows, row_sums = bind_gather(indices, wide, sums,
                                   fills=(zero_fill(wide.dtype), zero_fill(f32)), **params)
    new = (_checks.narrow(rows, x.dtype).astype(f32) + row_sums).astype(x.dtype)
    # Duplicate indices set equal values: any winner gives the same table.
    (y,) = bind_scatter(indices, wide, _checks.widen(new), mode="set", deterministic=False,
                          **params)
    return _checks.narrow(y, x.dtype)


@_add_in_f32.defjvp
def _add_in_f32_jvp(axis, deterministic, method, primals, tangents):
    # The derivative of an add: the identity in x, a scatter-add of the
    # updates. x's tangent is added last, so that the transpose hands x's
    # cotangent through untouched (float8_e8m0fnu has no 0 to add to it);
    # the sums start from -0, which leaves every tangent as it is.
    indices, x, updates = primals
    _, tx, tu = tangents
    y = _add_in_f32(indices, x, updates, axis, deterministic, method)
    f32 = np.dtype(np.float32)
    (sums,) = bind_scatter(indices, -zeros_of(jax.typeof(x), f32), tu.astype(f32), axis=axis,
                             batch=0, mode="add", deterministic=deterministic, method=method)
    return y, tx + sums.astype(x.dtype)


# ---- the primitive (scatter_p) ----------------------------------------------

def _abstract(indices, *operands, axis, batch, **_):
    # Explicit shardings as x.at[].set gives them: the result is split as x
    # (its batch dims as the indices' where x has none); the indices must be
    # whole beyond the batch dims. The updates are resharded as x's slabs.
    xs, us = halves(operands)
    lead = lead_spec(_OP, indices, xs, axis, batch)
    _check_whole_indices(indices, batch)
    return [_lowering.out_aval(like(x, indices, u), x.shape, x.dtype,
                               distinct(_OP, lead + list(_lowering.spec_of(x)[axis:]),
                                          ("x", x), ("indices", indices)))
            for x, u in zip(xs, us)]


def _local_abstract(indices, order, *operands, **params):
    return _abstract(indices, *operands, **params)


# ---- index arithmetic of AD and deterministic scatter -----------------------

def _count_dtype(count) -> np.dtype:
    """The integer type of numbers up to `count` (row numbers, positions):
    int32 where it holds them, else int64; for a symbolic count (a
    shape-polymorphic export) jnp's default int, as jnp.argsort gives."""
    if not isinstance(count, int):
        return jax.dtypes.canonicalize_dtype(jnp.int64)
    if count < 2**31 - 1:
        return np.dtype(np.int32)
    if not jax.config.jax_enable_x64:
        raise ValueError(f"{_OP}: {count} rows or indices need int64 row numbers; enable "
                         "jax_enable_x64")
    return np.dtype(np.int64)


def _rows(indices: jax.Array, n, batch: int) -> jax.Array:
    """(B, M) keys: each index wrapped as the handlers wrap it (negative +n,
    once), n where it is out of range."""
    dtype = _count_dtype(n)
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
    return jnp.argsort(keys, axis=-1, stable=True).astype(_count_dtype(keys.shape[-1]))


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


# ---- lowering and partitioning ----------------------------------------------

def _local_lowering(ctx, indices, order, *operands, axis, batch, mode, deterministic, method):
    # Each output is its table's buffer: in place where the table is donated,
    # else XLA copies it.
    aliases = {2 + t: t for t in range(len(operands) // 2)}
    return jax.ffi.ffi_lowering("jax_tma_scatter", operand_output_aliases=aliases)(
        ctx, indices, order, *operands, axis=np.int64(axis), batch=np.int64(batch), mode=mode,
        deterministic=bool(deterministic), method=method)


@functools.cache
def _partitioned(x_ndims, idx_ndim, axis, batch, mode, deterministic, method):
    def local(indices, *operands):
        xs = halves(operands)[0]
        if deterministic:  # one sort for every table: they share the indices
            order = _stable_order(_rows(indices, xs[0].shape[axis], batch))
        else:
            order = jnp.zeros((0,), jnp.int32)
        return tuple(scatter_local_p.bind(indices, order, *operands, axis=axis, batch=batch,
                                            mode=mode, deterministic=deterministic,
                                            method=method))

    def infer(mesh, arg_shapes, result_shape):
        return shardings(mesh, halves(arg_shapes[1:])[0], arg_shapes[0], axis, batch,
                           False)[0]

    def partition(mesh, arg_shapes, result_shape):
        xs, idx, upd = shardings(mesh, halves(arg_shapes[1:])[0], arg_shapes[0], axis,
                                   batch, False)
        return mesh, local, xs, (idx, *xs, *upd)

    xs, idx, slabs = factors(x_ndims, idx_ndim, axis, batch)
    f = custom_partitioning(local)
    # Every update must reach the device that holds its row: n and the index
    # dims stay whole (named in the order the rule first uses them).
    f.def_partition(infer_sharding_from_operands=infer, partition=partition,
                    sharding_rule=sharding_rule(idx, *xs, *slabs, results=xs),
                    need_replication_factors=tuple(idx[batch:]) + ("n",))
    return local, f


def _lowering_rule(ctx, indices, *operands, axis, batch, mode, deterministic, method):
    x_ndims = tuple(a.ndim for a in halves(ctx.avals_in[1:])[0])
    local, f = _partitioned(x_ndims, ctx.avals_in[0].ndim, axis, batch, mode, deterministic,
                            method)
    fn = f if partitioned(ctx) else local
    return mlir.lower_fun(fn, multiple_results=True)(ctx, indices, *operands)


# ---- vmap: the vmapped dim becomes a batch dim or an outer dim ---------------

def _front(a, d, size, to):
    """`a` with its vmapped dim `d` at position `to`, or broadcast to have one."""
    if d is None:
        return jnp.broadcast_to(jnp.expand_dims(a, to), a.shape[:to] + (size,) + a.shape[to:])
    return jnp.moveaxis(a, d, to)


def _batcher(args, dims, *, axis, batch, **params):
    indices, (xs, us) = args[0], halves(args[1:])
    di, (dxs, dus) = dims[0], halves(dims[1:])
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)

    def bind(group, reached):
        x, u = [xs[t] for t in group], [us[t] for t in group]
        if not reached:  # neither the indices nor these tables are vmapped
            return bind_scatter(indices, *x, *u, axis=axis, batch=batch, **params), None
        if di is None:  # shared indices: the new dim is an outer dim of x and updates
            x = [_front(a, dxs[t], size, batch) for a, t in zip(x, group)]
            u = [_front(a, dus[t], size, batch) for a, t in zip(u, group)]
            return bind_scatter(indices, *x, *u, axis=axis + 1, batch=batch, **params), batch
        x = [_front(a, dxs[t], size, 0) for a, t in zip(x, group)]
        u = [_front(a, dus[t], size, 0) for a, t in zip(u, group)]
        return bind_scatter(jnp.moveaxis(indices, di, 0), *x, *u, axis=axis + 1,
                              batch=batch + 1, **params), 0

    return by_group(len(xs), lambda t: di is not None or dxs[t] is not None
                      or dus[t] is not None, bind)


# ---- autodiff: linear in the tables and updates; the indices are constants ----

def _aval(a):
    return a.aval if ad.is_undefined_primal(a) else jax.typeof(a)


def _jvp(primals, tangents, *, axis, batch, mode, deterministic, method):
    indices, (xs, us) = primals[0], halves(primals[1:])
    txs, tus = halves(tangents[1:])
    params = dict(axis=axis, batch=batch, mode=mode, deterministic=deterministic, method=method)
    if mode == "set":
        # Primal and tangent must keep the same winner of each duplicate.
        indices = _last_wins(indices, xs[0].shape[axis], batch)
    ys = bind_scatter(indices, *xs, *us, **params)
    live = [t for t in range(len(xs))
            if type(txs[t]) is not ad.Zero or type(tus[t]) is not ad.Zero]
    out = [zero_tangent(y) for y in ys]
    if live:
        tys = bind_scatter(indices, *(ad.instantiate_zeros(txs[t]) for t in live),
                             *(ad.instantiate_zeros(tus[t]) for t in live), **params)
        for t, ty in zip(live, tys):
            out[t] = ty
    return ys, out


def _transpose(cts, indices, *operands, axis, batch, mode, deterministic, method):
    assert not ad.is_undefined_primal(indices)
    xs, us = halves(operands)
    undefined = ad.is_undefined_primal
    ct_x = [ad.Zero(_aval(x)) if undefined(x) else None for x in xs]
    ct_u = [ad.Zero(_aval(u)) if undefined(u) else None for u in us]
    live = [t for t in range(len(xs)) if type(cts[t]) is not ad.Zero]
    if mode == "set" and live:
        indices = _last_wins(indices, _aval(xs[0]).shape[axis], batch)
    for_x = [t for t in live if undefined(xs[t])]
    if mode == "add":
        for t in for_x:
            ct_x[t] = cts[t]
    elif for_x:  # the overwritten slabs do not reach the output
        zeros = [zeros_of(_aval(us[t]), cts[t].dtype) for t in for_x]
        cleared = bind_scatter(indices, *(cts[t] for t in for_x), *zeros, axis=axis,
                                 batch=batch, mode="set", deterministic=False, method=method)
        for t, c in zip(for_x, cleared):
            ct_x[t] = c
    for_u = [t for t in live if undefined(us[t])]
    if for_u:
        got = bind_gather(indices, *(cts[t] for t in for_u), axis=axis, batch=batch,
                            fills=tuple(zero_fill(cts[t].dtype) for t in for_u),
                            method=method)
        for t, g in zip(for_u, got):
            ct_u[t] = resharded(g, _lowering.spec_of(_aval(us[t])))
    return [None, *ct_x, *ct_u]


# ---- registration -----------------------------------------------------------

_lowering.register(scatter_p, _abstract,
                   {"cpu": _lowering_rule, "cuda": with_tma_check(_OP, _lowering_rule)},
                   batcher=_batcher)
_lowering.register(scatter_local_p, _local_abstract, _local_lowering, jitted=False)
_lowering.require_devices_during_lowering(scatter_p)
ad.primitive_jvps[scatter_p] = _jvp
ad.primitive_transposes[scatter_p] = _transpose
