"""jax_tma.gather: whole slabs (rows, pages) picked by an index array, as a
JAX primitive (jit, vmap folded into shared batch dims, AD through a
scatter-add, shard_map, explicit and automatic sharding with every dim but
`axis` partitioned without collectives). What it shares with scatter is in
_gather_common.py."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.interpreters import ad, mlir

from jax_tma import _checks, _ffi, _lowering
from jax_tma._gather_common import (GatherMethod, METHODS, adds_natively, as_indices, as_tables,
                                    bind_gather, bind_scatter, by_group, check_tma_slab, distinct,
                                    factors, gather_local_p, gather_p, gathered_shape, lead_spec,
                                    like, partitioned, resharded, sharding_rule, shardings,
                                    with_tma_check, zero_fill, zero_tangent, zeros_of)

_OP = "jax_tma.gather"


# ---- the public op ----------------------------------------------------------

def gather(
    x: jax.Array | np.ndarray | Sequence[jax.Array | np.ndarray],
    indices: jax.Array | np.ndarray | int,
    *,
    axis: int = 0,
    fill: float | int | complex | str = 0,
    method: GatherMethod = "auto",
) -> jax.Array | tuple[jax.Array, ...]:
    """The slabs of ``x`` along ``axis`` picked by ``indices``: bit for bit
    ``jnp.take(x, indices, axis, mode="fill", fill_value=fill)``.

    The default ``fill`` is 0 for every dtype, where ``jnp.take``'s
    ``fill_value=None`` is NaN for floats (the most negative value for
    signed integers, the largest for unsigned ones, True for bool): porting
    ``jnp.take(..., mode="fill")`` without a ``fill_value``, pass
    ``fill="nan"`` for floats to keep its NaN.

    A slab is the block of ``x`` at one position of ``axis``: all dims after
    ``axis``, contiguous in memory (a row of a table, a page of a KV cache).
    Negative indices wrap once (``-1`` is the last slab); any other index out
    of range gives a slab of ``fill``. NaN payloads survive, where XLA's own
    gather may quiet them. On Hopper/Blackwell GPUs a slab can move as one
    Tensor Memory Accelerator bulk copy (``cp.async.bulk``); a vectorised
    SIMT kernel moves the others with the same result. Works under ``jit``,
    ``vmap`` (one call), ``grad`` (the transpose is a scatter-add),
    ``shard_map`` and on sharded arrays without collectives (every dim but
    ``axis`` may be split); the op's page says how each rule shards and
    sums.

    Several tables through one index array (a paged cache's K and V pools):
    pass ``x`` as a tuple or list of up to 8 arrays that agree in
    ``x.shape[:axis + 1]``, each with its own dtype and slab dims; the
    result is a tuple, from one call.

    ``method="auto"`` takes the SIMT kernel where it can give a thread to
    each 16-byte vector (XLA's own gather layout) and the slabs are at most
    4 KiB, or the gather moves at most 64 MiB, or the call has at most one
    vector for each thread of one resident wave of the GPU; otherwise one
    bulk copy per slab where the GPU has TMA and the slabs are multiples of
    16 bytes; else the SIMT kernel.

    Args:
      x: an array of rank >= 1 and any dtype (sub-byte types are widened
        around the call), or a tuple or list of 1 to 8 such tables.
      indices: integers of any shape and integer dtype, or a Python int.
        Every index counts as its exact value: a uint64 index past 2^63, or
        a negative one whose table is longer than its dtype's range, is
        neither wrapped nor reinterpreted (jnp.take wraps both).
      axis: the dim of ``x`` that the indices pick along, in
        ``[-x.ndim, x.ndim)``.
      fill: the value of slabs picked by out-of-range indices (default 0,
        not jnp.take's NaN): a Python or NumPy scalar or a concrete 0-d
        array, converted to ``x``'s dtype (to each table's) as jnp converts
        a scalar (float8_e8m0fnu's default 0 is 0xFF, its NaN); ``"nan"``
        is NaN (NaN in both parts for complex). A NaN fill needs a floating
        or complex table, as for :func:`window`.
      method: ``"auto"`` (the rule above), ``"tma"`` (one bulk copy per
        slab) or ``"simt"`` (the vectorised kernel, any geometry). On the
        CPU every method gives the same host copy.

    Returns:
      An array of shape ``x.shape[:axis] + indices.shape + x.shape[axis+1:]``;
      a tuple of them, one per table, where ``x`` is a tuple or list.

    Raises:
      TypeError: ``x`` (or a table) or ``indices`` is not an array or
        scalar; ``indices`` are not integers; ``axis`` is not an int;
        ``fill`` is not a concrete number (a traced value, a non-numeric
        object, a complex fill of a real table).
      ValueError: ``fill`` is a string other than ``"nan"`` or a NaN for a
        table that is not floating or complex; a 0-d ``x``; ``axis`` out of
        range; ``x`` a sequence of
        no or more than 8 tables, or tables that disagree in
        ``x.shape[:axis + 1]``; ``method`` is not one of the three names;
        ``method="tma"`` with slabs that are not a multiple of 16 bytes;
        under an explicit mesh, ``x`` split along ``axis``, tables sharded
        unalike, or a mesh axis that would split two dims of the result.
      OverflowError: an integer ``fill`` outside the range of int64 and
        uint64 for an integer table.
      RuntimeError: ``method="tma"`` is lowered for a GPU without TMA
        (compute capability below 9.0).

    Examples:
      >>> import jax, jax.numpy as jnp, jax_tma
      >>> table = jnp.arange(8).reshape(4, 2)
      >>> jax_tma.gather(table, jnp.array([3, -1, 4]), fill=-7).tolist()
      [[6, 7], [6, 7], [-7, -7]]
      >>> k_pool, v_pool = jnp.arange(8).reshape(4, 2), jnp.arange(4.0)
      >>> k, v = jax_tma.gather((k_pool, v_pool), jnp.array([2, 0]))
      >>> k.tolist(), v.tolist()
      ([[4, 5], [0, 1]], [2.0, 0.0])
      >>> jax.grad(lambda t: jax_tma.gather(t, jnp.array([1, 1, 3])).sum())(
      ...     jnp.zeros((4, 2))).tolist()
      [[0.0, 0.0], [2.0, 2.0], [0.0, 0.0], [1.0, 1.0]]
      >>> jax_tma.gather(table, jnp.array([0.5]))
      Traceback (most recent call last):
        ...
      TypeError: jax_tma.gather: indices must be integers, got dtype float...
    """
    tables, names, axis, many = as_tables(_OP, x, axis)
    indices = as_indices(_OP, indices)
    _checks.check_choice(_OP, "method", method, METHODS)
    fills = tuple(_checks.fill_bytes(name, fill, t.dtype) for name, t in zip(names, tables))
    srcs = [_checks.widen(t) for t in tables]
    for name, t, src in zip(names, tables, srcs):
        check_tma_slab(name, method, t, src.dtype, axis)
    _ffi.register()
    ys = bind_gather(indices, *srcs, axis=axis, batch=0, fills=fills, method=method)
    ys = tuple(_checks.narrow(y, t.dtype) for y, t in zip(ys, tables))
    return ys if many else ys[0]


# ---- the primitive (gather_p) -----------------------------------------------

def _abstract(indices, *xs, axis, batch, **_):
    # Explicit shardings: x's dims but axis keep theirs, the index dims take
    # the indices' (no collective: each device picks its own indices' slabs).
    lead = lead_spec(_OP, indices, xs, axis, batch)
    ispec = _lowering.spec_of(indices)
    return [_lowering.out_aval(
        like(x, indices), gathered_shape(x.shape, indices.shape, axis, batch), x.dtype,
        distinct(_OP, lead + list(ispec[batch:]) + list(_lowering.spec_of(x)[axis + 1:]),
                   ("x", x), ("indices", indices)))
        for x in xs]


# ---- lowering and partitioning ----------------------------------------------

def _local_lowering(ctx, indices, *xs, axis, batch, fills, method):
    return jax.ffi.ffi_lowering("jax_tma_gather")(
        ctx, indices, *xs, axis=np.int64(axis), batch=np.int64(batch),
        fill=_lowering.fill_attr(fills), method=method)


@functools.cache
def _partitioned(x_ndims, idx_ndim, axis, batch, fills, method):
    def local(indices, *xs):
        return tuple(gather_local_p.bind(indices, *xs, axis=axis, batch=batch, fills=fills,
                                           method=method))

    def infer(mesh, arg_shapes, result_shape):
        return shardings(mesh, arg_shapes[1:], arg_shapes[0], axis, batch, True)[2]

    def partition(mesh, arg_shapes, result_shape):
        xs, idx, out = shardings(mesh, arg_shapes[1:], arg_shapes[0], axis, batch, True)
        return mesh, local, out, (idx, *xs)

    xs, idx, slabs = factors(x_ndims, idx_ndim, axis, batch)
    f = custom_partitioning(local)
    f.def_partition(infer_sharding_from_operands=infer, partition=partition,
                    sharding_rule=sharding_rule(idx, *xs, results=slabs),
                    need_replication_factors=("n",))
    return local, f


def _lowering_rule(ctx, indices, *xs, axis, batch, fills, method):
    x_ndims = tuple(a.ndim for a in ctx.avals_in[1:])
    local, f = _partitioned(x_ndims, ctx.avals_in[0].ndim, axis, batch, fills, method)
    fn = f if partitioned(ctx) else local
    return mlir.lower_fun(fn, multiple_results=True)(ctx, indices, *xs)


# ---- vmap: the vmapped dim becomes a batch dim or an outer dim ---------------

def _batcher(args, dims, *, axis, batch, fills, method):
    (indices, *xs), (di, *dxs) = args, dims
    some = lambda group: tuple(fills[t] for t in group)  # noqa: E731

    def bind(group, batched):
        fs = some(group)
        if not batched:  # di is not None: more indices; else untouched by the vmap
            if di is None:
                return bind_gather(indices, *(xs[t] for t in group), axis=axis, batch=batch,
                                     fills=fs, method=method), None
            i = jnp.moveaxis(indices, di, batch)
            return bind_gather(i, *(xs[t] for t in group), axis=axis, batch=batch, fills=fs,
                                 method=method), axis
        if di is None:  # one index set for every x: the new dim is an outer dim
            ts = [jnp.moveaxis(xs[t], dxs[t], batch) for t in group]
            return bind_gather(indices, *ts, axis=axis + 1, batch=batch, fills=fs,
                                 method=method), batch
        ts = [jnp.moveaxis(xs[t], dxs[t], 0) for t in group]
        return bind_gather(jnp.moveaxis(indices, di, 0), *ts, axis=axis + 1, batch=batch + 1,
                             fills=fs, method=method), 0

    return by_group(len(xs), lambda t: dxs[t] is not None, bind)


# ---- autodiff: linear in the tables; the indices are constants ---------------

def _jvp(primals, tangents, *, fills, **params):
    indices = primals[0]
    ys = bind_gather(*primals, fills=fills, **params)
    live = [t for t, tx in enumerate(tangents[1:]) if type(tx) is not ad.Zero]
    out = [zero_tangent(y) for y in ys]
    if live:
        # The fill is a constant: its tangent is 0.
        tys = bind_gather(indices, *(tangents[1 + t] for t in live),
                            fills=tuple(zero_fill(ys[t].dtype) for t in live), **params)
        for t, ty in zip(live, tys):
            out[t] = ty
    return ys, out


def _transpose(cts, indices, *xs, axis, batch, fills, method):
    assert not ad.is_undefined_primal(indices)
    out = [ad.Zero(x.aval) if ad.is_undefined_primal(x) else None for x in xs]
    live = [t for t, x in enumerate(xs)
            if ad.is_undefined_primal(x) and type(cts[t]) is not ad.Zero]
    if live:
        # A scatter-add into zeros, as jnp.take's transpose; its indices and
        # updates whole beyond the batch dims (an explicit gather may split
        # them, a scatter may not).
        ispec = _lowering.spec_of(jax.typeof(indices))
        indices = resharded(indices, ispec[:batch] + (None,) * (indices.ndim - batch))
        avals = [xs[t].aval for t in live]
        wide = [a.dtype if adds_natively(a.dtype) else np.dtype(np.float32) for a in avals]
        ups = []
        for t in live:
            spec = _lowering.spec_of(jax.typeof(cts[t]))
            spec = spec[:axis] + (None,) * (indices.ndim - batch) + spec[axis + indices.ndim
                                                                        - batch:]
            ups.append(resharded(cts[t], spec))
        sums = bind_scatter(indices, *(zeros_of(a, w) for a, w in zip(avals, wide)),
                              *(u.astype(w) for u, w in zip(ups, wide)), axis=axis,
                              batch=batch, mode="add", deterministic=False, method=method)
        for t, a, total in zip(live, avals, sums):
            out[t] = total.astype(a.dtype)
    return [None, *out]


# ---- registration -----------------------------------------------------------

_lowering.register(gather_p, _abstract,
                   {"cpu": _lowering_rule, "cuda": with_tma_check(_OP, _lowering_rule)},
                   batcher=_batcher)
_lowering.register(gather_local_p, _abstract, _local_lowering, jitted=False)
_lowering.require_devices_during_lowering(gather_p)
ad.primitive_jvps[gather_p] = _jvp
ad.primitive_transposes[gather_p] = _transpose
