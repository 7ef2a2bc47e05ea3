"""jax_tma.gather / jax_tma.scatter: whole slabs (rows, pages) picked by an
index array, as JAX primitives (jit, vmap folded into shared batch dims,
AD gather <-> scatter-add, shard_map, explicit and automatic sharding with
every dim but `axis` partitioned without collectives; scatter works in
place on a donated x)."""

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
from jax.extend.core import Primitive
from jax.interpreters import ad, mlir
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_tma import _checks, _ffi, _lowering

GatherMethod = Literal["auto", "tma", "simt"]
ScatterMode = Literal["set", "add"]
_METHODS = ("auto", "tma", "simt")
_MODES = ("set", "add")
_OP_G = "jax_tma.gather"
_OP_S = "jax_tma.scatter"


# ---- the public ops -------------------------------------------------------------

def gather(
    x: jax.Array | np.ndarray | Sequence[jax.Array | np.ndarray],
    indices: jax.Array | np.ndarray | int,
    *,
    axis: int = 0,
    fill: float | int | complex = 0,
    method: GatherMethod = "auto",
) -> jax.Array | tuple[jax.Array, ...]:
    """The slabs of ``x`` along ``axis`` picked by ``indices``: bit for bit
    ``jnp.take(x, indices, axis, mode="fill", fill_value=fill)``.

    A slab is the block of ``x`` at one position of ``axis``: all dims after
    ``axis``, contiguous in memory (a row of a table, a page of a KV cache).
    Negative indices wrap once (``-1`` is the last slab); any other index out
    of range gives a slab of ``fill``. NaN payloads survive, where XLA's own
    gather may quiet them. On Hopper/Blackwell GPUs a slab can move as one
    Tensor Memory Accelerator bulk copy (``cp.async.bulk``); a vectorised
    SIMT kernel moves the others with the same result.
    Works under ``jit``, ``vmap`` (batched ``x`` and/or ``indices`` become
    one call), ``grad`` (the transpose is a scatter-add; float types the
    handlers cannot add, float8_* and float4_e2m1fn, are summed in float32
    and rounded once, where XLA rounds after every add: with duplicate
    indices the last bit may differ), ``shard_map`` (the result varies
    along the mesh axes ``x`` or ``indices`` vary along) and on sharded
    arrays without collectives: under an automatic mesh every dim but
    ``axis`` may be split; under an explicit mesh (``AxisType.Explicit``)
    the result is split as ``x`` on ``x``'s dims and as ``indices`` on the
    index dims (jnp.take refuses split indices), and an ``x`` split along
    ``axis``, or a mesh axis that would split two dims of the result, is a
    ValueError (jnp.take refuses both too).

    Several tables through one index array (a paged cache's K and V pools):
    pass ``x`` as a tuple or list of up to 8 arrays that agree in
    ``x.shape[:axis + 1]``, each with its own dtype and slab dims; the
    result is a tuple, each table's gathered slabs. It is one call: on the
    GPU neighbouring tables that share their slab geometry (the same slab
    bytes and element size, and addresses aligned alike, so that they take
    the same kernel and tiling) move in one kernel launch, the others in
    separate launches.

    ``method="auto"`` takes the SIMT kernel where it can give a thread to
    each 16-byte vector (XLA's own gather layout) and the slabs are at most
    4 KiB, or the gather moves at most 64 MiB, or the call has at most one
    vector for each thread of one resident wave of the GPU; otherwise one
    bulk copy per slab where the GPU has TMA and the slabs are multiples of
    16 bytes; else the SIMT kernel.

    Args:
      x: an array of rank >= 1 and any dtype (sub-byte types are widened
        around the call), or a tuple or list of 1 to 8 such tables.
      indices: integers of any shape and integer dtype (sub-byte ones
        widened around the call), or a Python int. Every index counts as
        its exact value: a uint64 index past 2^63, or a negative one whose
        table is longer than its dtype's range, is neither wrapped nor
        reinterpreted (jnp.take wraps both).
      axis: the dim of ``x`` that the indices pick along, in
        ``[-x.ndim, x.ndim)``.
      fill: the value of slabs picked by out-of-range indices: a Python or
        NumPy scalar or a concrete 0-d array, converted to ``x``'s dtype (to
        each table's) as jnp converts a scalar (a Python int past int64 is a
        float for float tables; float8_e8m0fnu's default 0 is 0xFF, its NaN).
      method: ``"auto"`` (the rule above), ``"tma"`` (one bulk copy per
        slab: ``cp.async.bulk`` global to shared memory, then one bulk store
        per stage of gathered rows, several stages in flight per CTA; slabs
        over 16 KiB move in pieces) or ``"simt"`` (the vectorised kernel,
        any geometry). On the CPU every method gives the same host copy.

    Returns:
      An array of shape ``x.shape[:axis] + indices.shape + x.shape[axis+1:]``;
      a tuple of them, one per table, where ``x`` is a tuple or list.

    Raises:
      TypeError: ``x`` (or a table) or ``indices`` is not an array or
        scalar; ``indices`` are not integers; ``axis`` is not an int;
        ``fill`` is not a concrete number (a traced value, a non-numeric
        object, a complex fill of a real table).
      ValueError: a 0-d ``x``; ``axis`` out of range; ``x`` a sequence of
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
    tables, names, axis, many = _tables(_OP_G, x, axis)
    indices = _indices(_OP_G, indices)
    _checks.check_choice(_OP_G, "method", method, _METHODS)
    fills = tuple(_checks.fill_bytes(name, fill, t.dtype) for name, t in zip(names, tables))
    srcs = [_checks.widen(t) for t in tables]
    for name, t, src in zip(names, tables, srcs):
        _check_tma_slab(name, method, t, src.dtype, axis)
    _ffi.register()
    ys = _bind_gather(indices, *srcs, axis=axis, batch=0, fills=fills, method=method)
    ys = tuple(_checks.narrow(y, t.dtype) for y, t in zip(ys, tables))
    return ys if many else ys[0]


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
    written in place: the output is ``x``'s buffer and no copy of ``x`` is
    made (without donation XLA copies ``x`` first; a donated ``x`` that
    reaches ``scatter`` through a reshape is copied too). On Hopper/Blackwell
    GPUs a slab can be one bulk copy (``set``) or one bulk reduce-add
    (``cp.reduce.async.bulk .add``, for 32/64-bit integers, f16, bf16, f32,
    f64, c64 and c128); a SIMT kernel (vectorised stores, vector or element
    atomic adds) moves the others with the same result.

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

    Float types the handlers cannot add (float8_*, float4_e2m1fn) are
    summed in float32: each row's updates, then the row, rounded to the
    dtype once (XLA rounds after every add: with duplicate indices the last
    bit may differ); rows without updates keep their bits.

    ``updates`` of another dtype are converted as ``x.at[].set`` converts
    them (jnp's own promotion: computed in the common type and converted
    back to ``x``'s dtype, with jnp's FutureWarning where the cast is not
    safe); in place only where no conversion of ``x`` is needed.

    Works under ``jit``, ``vmap``, ``grad`` (``set``: the cotangent of ``x``
    has the overwritten slabs zeroed and that of ``updates`` is the gathered
    cotangent, zero for dropped and losing duplicate updates; ``add``:
    identity and gather), ``shard_map`` and on sharded arrays without
    collectives: every dim but ``axis`` may be split, ``indices`` and their
    ``updates`` dims replicated (under an explicit mesh the result is split
    as ``x``, and split indices or an ``x`` split along ``axis`` are a
    ValueError, as ``x.at[]`` refuses them).

    Several tables (as for :func:`gather`): ``x`` a tuple or list of up to
    8 tables agreeing in ``x.shape[:axis + 1]`` and ``updates`` a tuple of as
    many arrays, one per table; the result is a tuple, each table updated in
    place where it is donated; ``deterministic=True`` sorts the shared
    indices once. On the GPU the tables move in one kernel launch where they
    share their slab geometry, as for :func:`gather`.

    ``method="auto"``: under ``"set"`` as for :func:`gather`, except that
    the 64 MiB rule is a gather's alone; under ``"add"`` the SIMT kernel's
    16-byte vector reductions (``red.global.add.v4`` of f32, f16x2 and
    bf16x2) for float32, float16 and bfloat16 where slabs and addresses
    allow them on a GPU with TMA, else one bulk reduce-add per slab where it
    can run, else the SIMT kernel's element atomics. ``deterministic=True``
    always takes the SIMT kernel.

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
      deterministic: fixes the order duplicates apply in (see above); costs
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
      >>> k_pool, v_pool = jnp.zeros((4, 2), jnp.int32), jnp.zeros(4)
      >>> k, v = jax_tma.scatter((k_pool, v_pool), jnp.array([2, 0]),
      ...                        (jnp.ones((2, 2), jnp.int32), jnp.array([5.0, 6.0])))
      >>> k.tolist(), v.tolist()
      ([[1, 1], [0, 0], [1, 1], [0, 0]], [6.0, 0.0, 5.0, 0.0])
      >>> update = jax.jit(lambda t, i, u: jax_tma.scatter(t, i, u), donate_argnums=0)
      >>> args = (jnp.zeros((1024, 64)), jnp.array([3]), jnp.ones((1, 64)))
      >>> " copy(" in update.lower(*args).compile().as_text()   # in place: no copy of x
      False
      >>> jax_tma.scatter(table, jnp.array([0, 1]), jnp.ones((3, 2), jnp.int32))
      Traceback (most recent call last):
        ...
      ValueError: jax_tma.scatter: updates have shape (3, 2), which does not broadcast to (2, 2)...
    """
    tables, names, axis, many = _tables(_OP_S, x, axis)
    indices = _indices(_OP_S, indices)
    if many:
        if not isinstance(updates, (tuple, list)) or len(updates) != len(tables):
            got = (f"{len(updates)} arrays" if isinstance(updates, (tuple, list))
                   else type(updates).__name__)
            raise TypeError(f"{_OP_S}: x is {len(tables)} tables, so updates must be a tuple of "
                            f"{len(tables)} arrays (one per table), got {got}")
        labels = [f"updates[{t}]" for t in range(len(tables))]
    else:
        labels, updates = ["updates"], [updates]
    _checks.check_choice(_OP_S, "mode", mode, _MODES)
    _checks.check_choice(_OP_S, "method", method, _METHODS)
    if not isinstance(deterministic, (bool, np.bool_)):
        raise TypeError(f"{_OP_S}: deterministic must be a bool, got {deterministic!r}")
    if deterministic and method == "tma":
        raise ValueError(f"{_OP_S}: deterministic=True applies updates in index order with the "
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
        ys = _bind_scatter(indices, *(_checks.widen(pairs[t][0]) for t in rest),
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

def _indices(op: str, indices: Any) -> jax.Array:
    """`indices` as an integer array (Python ints as jnp.asarray takes them),
    sub-byte integers widened to a byte for the handlers (every value kept)."""
    indices = _checks.as_array(op, "indices", indices)
    if not jnp.issubdtype(indices.dtype, jnp.integer):
        raise TypeError(f"{op}: indices must be integers, got dtype {indices.dtype}")
    return _checks.widen(indices)


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
    """method='tma' moves each slab with one bulk copy: 16-byte multiples.
    `wide` is the dtype the slabs move as."""
    slab = x.shape[axis + 1:]
    nbytes = math.prod(slab) * np.dtype(wide).itemsize
    moved = "" if np.dtype(wide) == _checks.widen_dtype(x.dtype) else f", moved as {wide},"
    if method == "tma" and nbytes % _ffi.rules()["tma_align_bytes"]:
        raise ValueError(f"{op}: method='tma' moves slabs of a multiple of 16 bytes (the bulk-copy "
                         f"size rule), but x.shape[axis + 1:] = {slab} of {x.dtype}{moved} is "
                         f"{nbytes} B; use method='auto' or 'simt'")


def _tables(op: str, x: Any, axis: Any) -> tuple[list[jax.Array], list[str], int, bool]:
    """x (an array, or a tuple or list of tables) as a list of arrays; the
    name each table's errors go by; the axis, normalised; and whether x was
    a sequence. The tables must agree in x.shape[:axis + 1]."""
    many = isinstance(x, (tuple, list))
    max_tables = _ffi.rules()["gather.max_tables"]
    if many and not 1 <= len(x) <= max_tables:
        raise ValueError(f"{op}: x must be an array or a tuple of 1 to {max_tables} arrays "
                         f"(tables sharing the indices), got {len(x)} tables")
    tables = [_checks.as_array(op, f"x[{t}]", a) for t, a in enumerate(x)] if many else \
        [_checks.as_array(op, "x", x)]
    names = [f"{op}: table {t}" for t in range(len(tables))] if many else [op]
    axes = [_axis(name, axis, t) for name, t in zip(names, tables)]
    lead = tables[0].shape[:axes[0] + 1]
    for t, (table, a) in enumerate(zip(tables, axes)):
        if a != axes[0] or table.shape[:a + 1] != lead:
            raise ValueError(f"{op}: the tables must agree in x.shape[:axis + 1] (axis={axis}): "
                             f"table 0 has {tuple(lead)}, table {t} "
                             f"{tuple(table.shape[:a + 1])}")
    return tables, names, axes[0], many


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
    want = _gathered_shape(x.shape, indices.shape, axis, 0)
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
    return jnp.issubdtype(dtype, jnp.floating) and not _adds_natively(dtype)


def _check_bound(op: str, x: jax.Array, axis: int, mode: str, method: str) -> None:
    """One table's rules of scatter, on x in the dtype it is computed in:
    the add's dtypes and method='tma''s rules."""
    if mode == "add" and not (_adds_natively(x.dtype) or _sums_in_f32(x.dtype)):
        raise TypeError(f"{op}: mode='add' cannot sum dtype {x.dtype} (as x.at[].add cannot)")
    wide = _checks.widen_dtype(x.dtype)
    _check_tma_slab(op, method, x, wide, axis)
    added = np.dtype(np.float32) if _sums_in_f32(x.dtype) else wide
    bulk_add = _ffi.rules()["gather.bulk_add_dtypes"]
    if method == "tma" and mode == "add" and added.name not in bulk_add:
        raise ValueError(f"{op}: method='tma' adds with cp.reduce.async.bulk, which has no "
                         f"add for {added} (it has {', '.join(bulk_add)}); use method='auto' "
                         "or 'simt'")


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
    (sums,) = _bind_scatter(indices, -_zeros(jax.typeof(x), f32), updates.astype(f32),
                            mode="add", deterministic=deterministic, **params)
    rows, row_sums = _bind_gather(indices, wide, sums,
                                  fills=(_zero_fill(wide.dtype), _zero_fill(f32)), **params)
    new = (_checks.narrow(rows, x.dtype).astype(f32) + row_sums).astype(x.dtype)
    # Duplicate indices set equal values: any winner gives the same table.
    (y,) = _bind_scatter(indices, wide, _checks.widen(new), mode="set", deterministic=False,
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
    (sums,) = _bind_scatter(indices, -_zeros(jax.typeof(x), f32), tu.astype(f32), axis=axis,
                            batch=0, mode="add", deterministic=deterministic, method=method)
    return y, tx + sums.astype(x.dtype)


# ---- primitives -------------------------------------------------------------

# Both ops view each table x as (*batch, *outer, N, *slab) with N =
# x.shape[axis]; the tables of one call share x.shape[:axis + 1] and the
# indices, whose first `batch` dims equal the tables' (vmap folds into them).
# gather_p(indices, *xs): per table (*x.shape[:axis], *indices.shape[batch:],
# *slab); fills holds each table's fill element as bytes of its dtype.
# scatter_p(indices, *xs, *updates): the tables' shapes; each table's
# updates are shaped like its gathered slabs. Each lowers (per device, under
# custom_partitioning) to the *_local_p FFI call on its shard:
# gather_local_p(indices, *xs) (the fills its "fill" attribute),
# scatter_local_p(indices, order, *xs, *updates).
gather_p = Primitive("jax_tma_gather")
gather_local_p = Primitive("jax_tma_gather_local")
scatter_p = Primitive("jax_tma_scatter")
scatter_local_p = Primitive("jax_tma_scatter_local")
for _p in (gather_p, gather_local_p, scatter_p, scatter_local_p):
    _p.multiple_results = True


def _gathered_shape(x_shape, idx_shape, axis, batch):
    return tuple(x_shape[:axis]) + tuple(idx_shape[batch:]) + tuple(x_shape[axis + 1:])


def _halves(operands):
    """The tables and the per-table operands that follow them."""
    n = len(operands) // 2
    return operands[:n], operands[n:]


def _bind_gather(indices, *xs, **params):
    """gather_p on operands cast to the union of their varying mesh axes
    (shard_map), which the results then carry."""
    return gather_p.bind(*_checks.align_varying(indices, *xs), **params)


def _bind_scatter(indices, *operands, **params):
    """scatter_p(indices, *xs, *updates) as _bind_gather binds gather_p."""
    return scatter_p.bind(*_checks.align_varying(indices, *operands), **params)


def _mesh_axes(entry) -> tuple:
    return () if entry is None else entry if isinstance(entry, tuple) else (entry,)


def _like(*avals):
    """The operand whose mesh a result takes: the first with one (a
    replicated constant has none). Operands are bound with the same varying
    mesh axes (_bind_gather, _bind_scatter), which the result keeps."""
    return next((a for a in avals if not a.sharding.mesh.empty), avals[0])


def _lead_spec(op: str, indices, xs, axis: int, batch: int) -> list:
    """The split of x.shape[:axis] that every result shares, from the
    operands' explicit shardings (an Auto mesh and shard_map's manual axes
    leave specs empty): the tables', which must agree and leave `axis`
    whole, and on the batch dims the indices' where the tables have none
    (a table that vmap broadcast to the indices' batch)."""
    specs = [_lowering.spec_of(x) for x in xs]
    for t, spec in enumerate(specs):
        if spec[axis] is not None:
            name = f"{op}: table {t}" if len(xs) > 1 else op
            raise ValueError(
                f"{name}: x is split along axis {axis} over mesh axes {spec[axis]!r} (x is "
                f"sharded {P(*spec)}), but every device needs that whole dim to pick slabs from "
                "(as jnp.take and x.at[] do); replicate it first (jax.sharding.reshard)")
        if spec[:axis] != specs[0][:axis]:
            raise ValueError(f"{op}: the tables must be sharded alike in x.shape[:axis] "
                             f"(axis={axis}): table 0 has {P(*specs[0][:axis])}, table {t} "
                             f"{P(*spec[:axis])}")
    ispec = _lowering.spec_of(indices)
    lead = list(specs[0][:axis])
    for d in range(batch):  # vmap gives both the same split, or x's broadcast none
        if lead[d] is None:
            lead[d] = ispec[d]
    return lead


def _distinct(op: str, spec: list, *operands) -> tuple:
    """`spec`, once each mesh axis splits one dim at most."""
    seen: set = set()
    for entry in spec:
        for a in _mesh_axes(entry):
            if a in seen:
                shown = ", ".join(f"{name} {P(*_lowering.spec_of(v))}" for name, v in operands)
                raise ValueError(f"{op}: mesh axis {a!r} would split two dims of the result "
                                 f"{P(*spec)} ({shown}); reshard one of them first "
                                 "(jax.sharding.reshard)")
            seen.add(a)
    return tuple(spec)


def _check_whole_indices(indices, batch: int) -> None:
    """A scatter's indices are whole beyond the batch dims: every device that
    holds rows of x needs every index."""
    spec = _lowering.spec_of(indices)
    if any(e is not None for e in spec[batch:]):
        raise ValueError(f"{_OP_S}: the indices are split over mesh axes (sharded {P(*spec)}), "
                         "but every device that holds rows of x needs every index (as x.at[] "
                         "does); replicate them first (jax.sharding.reshard)")


def _gather_abstract(indices, *xs, axis, batch, **_):
    # Explicit shardings: x's dims but axis keep theirs, the index dims take
    # the indices' (no collective: each device picks its own indices' slabs).
    lead = _lead_spec(_OP_G, indices, xs, axis, batch)
    ispec = _lowering.spec_of(indices)
    return [_lowering.out_aval(
        _like(x, indices), _gathered_shape(x.shape, indices.shape, axis, batch), x.dtype,
        _distinct(_OP_G, lead + list(ispec[batch:]) + list(_lowering.spec_of(x)[axis + 1:]),
                  ("x", x), ("indices", indices)))
        for x in xs]




def _scatter_abstract(indices, *operands, axis, batch, **_):
    # Explicit shardings as x.at[].set gives them: the result is split as x
    # (its batch dims as the indices' where x has none); the indices must be
    # whole beyond the batch dims. The updates are resharded as x's slabs.
    xs, us = _halves(operands)
    lead = _lead_spec(_OP_S, indices, xs, axis, batch)
    _check_whole_indices(indices, batch)
    return [_lowering.out_aval(_like(x, indices, u), x.shape, x.dtype,
                               _distinct(_OP_S, lead + list(_lowering.spec_of(x)[axis:]),
                                         ("x", x), ("indices", indices)))
            for x, u in zip(xs, us)]


def _scatter_local_abstract(indices, order, *operands, **params):
    return _scatter_abstract(indices, *operands, **params)


# ---- lowering and partitioning ----------------------------------------------

def _gather_local_lowering(ctx, indices, *xs, axis, batch, fills, method):
    return jax.ffi.ffi_lowering("jax_tma_gather")(
        ctx, indices, *xs, axis=np.int64(axis), batch=np.int64(batch),
        fill=_lowering.fill_attr(fills), method=method)


def _scatter_local_lowering(ctx, indices, order, *operands, axis, batch, mode, deterministic,
                            method):
    # Each output is its table's buffer: in place where the table is donated,
    # else XLA copies it.
    aliases = {2 + t: t for t in range(len(operands) // 2)}
    return jax.ffi.ffi_lowering("jax_tma_scatter", operand_output_aliases=aliases)(
        ctx, indices, order, *operands, axis=np.int64(axis), batch=np.int64(batch), mode=mode,
        deterministic=bool(deterministic), method=method)


# ---- index arithmetic shared by AD and deterministic scatter ----------------

def _count_dtype(count) -> np.dtype:
    """The integer type of numbers up to `count` (row numbers, positions):
    int32 where it holds them, else int64; for a symbolic count (a
    shape-polymorphic export) jnp's default int, as jnp.argsort gives."""
    if not isinstance(count, int):
        return jax.dtypes.canonicalize_dtype(jnp.int64)
    if count < 2**31 - 1:
        return np.dtype(np.int32)
    if not jax.config.jax_enable_x64:
        raise ValueError(f"{_OP_S}: {count} rows or indices need int64 row numbers; enable "
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


# ---- partitioning: every dim but axis keeps its sharding ---------------------

def _spec(sharding, ndim: int) -> list:
    spec = tuple(sharding.spec) if isinstance(sharding, NamedSharding) else ()
    return list(spec) + [None] * (ndim - len(spec))


def _factors(x_ndims, idx_ndim, axis, batch):
    """Shardy factor names of the tables, the indices and the gathered slabs:
    the tables share those of their dims up to axis, and each has its own
    slab dims."""
    lead = [f"b{d}" for d in range(batch)] + [f"p{d}" for d in range(batch, axis)]
    xs = [lead + ["n"] + [f"s{t}_{d}" for d in range(axis + 1, nd)]
          for t, nd in enumerate(x_ndims)]
    idx = lead[:batch] + [f"i{d}" for d in range(batch, idx_ndim)]
    slabs = [lead + idx[batch:] + x[axis + 1:] for x in xs]
    return xs, idx, slabs


def _shardings(mesh, x_shapes, idx_shape, axis, batch, split_indices):
    """The tables' shardings with axis unsplit and table 0's split of the dims
    before it, the indices' on batch dims it leaves whole (each table keeps
    its own slab dims' split, less mesh axes those dims use), the indices
    split like the batch dims and, with
    `split_indices` (a gather: each device picks its own indices' slabs),
    their other dims as they come less mesh axes the tables' dims use,
    else whole; and the matching shardings of the gathered slabs."""
    lead = _spec(x_shapes[0].sharding, len(x_shapes[0].shape))[:axis]
    used = {a for e in lead for a in _mesh_axes(e)}

    def own(entry):
        kept = tuple(a for a in _mesh_axes(entry) if a not in used)
        return None if not kept else kept[0] if len(kept) == 1 else kept

    idx_ndim = len(idx_shape.shape)
    idx_spec = _spec(idx_shape.sharding, idx_ndim)
    for d in range(batch):  # a batch dim table 0 leaves whole splits as the indices'
        if lead[d] is None:
            lead[d] = own(idx_spec[d])
            used |= set(_mesh_axes(lead[d]))
    xs = [lead + [None] + [own(e) for e in _spec(s.sharding, len(s.shape))[axis + 1:]]
          for s in x_shapes]
    rest = [None] * (idx_ndim - batch)
    if split_indices:
        used |= {a for x in xs for e in x for a in _mesh_axes(e)}
        rest = [own(e) for e in idx_spec[batch:]]
    idx = lead[:batch] + rest
    slabs = [lead + rest + x[axis + 1:] for x in xs]
    named = lambda specs: tuple(NamedSharding(mesh, P(*s)) for s in specs)  # noqa: E731
    return named(xs), NamedSharding(mesh, P(*idx)), named(slabs)


def _rule(*operands, results) -> str:
    join = lambda groups: ", ".join(" ".join(g) for g in groups)  # noqa: E731
    return f"{join(operands)} -> {join(results)}"


@functools.cache
def _partitioned_gather(x_ndims, idx_ndim, axis, batch, fills, method):
    def local(indices, *xs):
        return tuple(gather_local_p.bind(indices, *xs, axis=axis, batch=batch, fills=fills,
                                         method=method))

    def infer(mesh, arg_shapes, result_shape):
        return _shardings(mesh, arg_shapes[1:], arg_shapes[0], axis, batch, True)[2]

    def partition(mesh, arg_shapes, result_shape):
        xs, idx, out = _shardings(mesh, arg_shapes[1:], arg_shapes[0], axis, batch, True)
        return mesh, local, out, (idx, *xs)

    xs, idx, slabs = _factors(x_ndims, idx_ndim, axis, batch)
    f = custom_partitioning(local)
    f.def_partition(infer_sharding_from_operands=infer, partition=partition,
                    sharding_rule=_rule(idx, *xs, results=slabs),
                    need_replication_factors=("n",))
    return local, f


@functools.cache
def _partitioned_scatter(x_ndims, idx_ndim, axis, batch, mode, deterministic, method):
    def local(indices, *operands):
        xs = _halves(operands)[0]
        if deterministic:  # one sort for every table: they share the indices
            order = _stable_order(_rows(indices, xs[0].shape[axis], batch))
        else:
            order = jnp.zeros((0,), jnp.int32)
        return tuple(scatter_local_p.bind(indices, order, *operands, axis=axis, batch=batch,
                                          mode=mode, deterministic=deterministic, method=method))

    def infer(mesh, arg_shapes, result_shape):
        return _shardings(mesh, _halves(arg_shapes[1:])[0], arg_shapes[0], axis, batch, False)[0]

    def partition(mesh, arg_shapes, result_shape):
        xs, idx, upd = _shardings(mesh, _halves(arg_shapes[1:])[0], arg_shapes[0], axis, batch,
                                  False)
        return mesh, local, xs, (idx, *xs, *upd)

    xs, idx, slabs = _factors(x_ndims, idx_ndim, axis, batch)
    f = custom_partitioning(local)
    # Every update must reach the device that holds its row: n and the index
    # dims stay whole (named in the order the rule first uses them).
    f.def_partition(infer_sharding_from_operands=infer, partition=partition,
                    sharding_rule=_rule(idx, *xs, *slabs, results=xs),
                    need_replication_factors=tuple(idx[batch:]) + ("n",))
    return local, f


def _partitioned(ctx) -> bool:
    """Whether the call is lowered through custom_partitioning: a program on
    several devices, with static shapes (symbolic dims of a
    shape-polymorphic export have no partitioning rule; XLA keeps such
    operands whole)."""
    return not _lowering.single_device(ctx) and _lowering.static_shape(*ctx.avals_in,
                                                                         *ctx.avals_out)


def _gather_lowering(ctx, indices, *xs, axis, batch, fills, method):
    x_ndims = tuple(a.ndim for a in ctx.avals_in[1:])
    local, f = _partitioned_gather(x_ndims, ctx.avals_in[0].ndim, axis, batch, fills, method)
    fn = f if _partitioned(ctx) else local
    return mlir.lower_fun(fn, multiple_results=True)(ctx, indices, *xs)


def _scatter_lowering(ctx, indices, *operands, axis, batch, mode, deterministic, method):
    x_ndims = tuple(a.ndim for a in _halves(ctx.avals_in[1:])[0])
    local, f = _partitioned_scatter(x_ndims, ctx.avals_in[0].ndim, axis, batch, mode,
                                    deterministic, method)
    fn = f if _partitioned(ctx) else local
    return mlir.lower_fun(fn, multiple_results=True)(ctx, indices, *operands)


def _cuda_gather_lowering(ctx, *args, method, **params):
    if method == "tma":
        _checks.require_tma(_OP_G, method)
    return _gather_lowering(ctx, *args, method=method, **params)


def _cuda_scatter_lowering(ctx, *args, method, **params):
    if method == "tma":
        _checks.require_tma(_OP_S, method)
    return _scatter_lowering(ctx, *args, method=method, **params)


# ---- vmap: the vmapped dim becomes a batch dim or an outer dim ---------------

def _front(a, d, size, to):
    """`a` with its vmapped dim `d` at position `to`, or broadcast to have one."""
    if d is None:
        return jnp.broadcast_to(jnp.expand_dims(a, to), a.shape[:to] + (size,) + a.shape[to:])
    return jnp.moveaxis(a, d, to)


def _by_group(n, in_group, bind):
    """Outputs and their vmapped dims for n tables bound in two groups: the
    tables where in_group(t) and the others, each group one call of
    bind(tables) -> (outputs, dim). The tables of one call share their dims
    up to axis, so tables that the vmap reaches and tables it does not
    cannot share one."""
    outs, dims = [None] * n, [None] * n
    for flag in (True, False):
        group = [t for t in range(n) if in_group(t) == flag]
        if group:
            ys, dim = bind(group, flag)
            for t, y in zip(group, ys):
                outs[t], dims[t] = y, dim
    return outs, dims


def _gather_batcher(args, dims, *, axis, batch, fills, method):
    (indices, *xs), (di, *dxs) = args, dims
    some = lambda group: tuple(fills[t] for t in group)  # noqa: E731

    def bind(group, batched):
        fs = some(group)
        if not batched:  # di is not None: more indices; else untouched by the vmap
            if di is None:
                return _bind_gather(indices, *(xs[t] for t in group), axis=axis, batch=batch,
                                     fills=fs, method=method), None
            i = jnp.moveaxis(indices, di, batch)
            return _bind_gather(i, *(xs[t] for t in group), axis=axis, batch=batch, fills=fs,
                                 method=method), axis
        if di is None:  # one index set for every x: the new dim is an outer dim
            ts = [jnp.moveaxis(xs[t], dxs[t], batch) for t in group]
            return _bind_gather(indices, *ts, axis=axis + 1, batch=batch, fills=fs,
                                 method=method), batch
        ts = [jnp.moveaxis(xs[t], dxs[t], 0) for t in group]
        return _bind_gather(jnp.moveaxis(indices, di, 0), *ts, axis=axis + 1, batch=batch + 1,
                             fills=fs, method=method), 0

    return _by_group(len(xs), lambda t: dxs[t] is not None, bind)


def _scatter_batcher(args, dims, *, axis, batch, **params):
    indices, (xs, us) = args[0], _halves(args[1:])
    di, (dxs, dus) = dims[0], _halves(dims[1:])
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)

    def bind(group, reached):
        x, u = [xs[t] for t in group], [us[t] for t in group]
        if not reached:  # neither the indices nor these tables are vmapped
            return _bind_scatter(indices, *x, *u, axis=axis, batch=batch, **params), None
        if di is None:  # shared indices: the new dim is an outer dim of x and updates
            x = [_front(a, dxs[t], size, batch) for a, t in zip(x, group)]
            u = [_front(a, dus[t], size, batch) for a, t in zip(u, group)]
            return _bind_scatter(indices, *x, *u, axis=axis + 1, batch=batch, **params), batch
        x = [_front(a, dxs[t], size, 0) for a, t in zip(x, group)]
        u = [_front(a, dus[t], size, 0) for a, t in zip(u, group)]
        return _bind_scatter(jnp.moveaxis(indices, di, 0), *x, *u, axis=axis + 1,
                              batch=batch + 1, **params), 0

    return _by_group(len(xs), lambda t: di is not None or dxs[t] is not None
                     or dus[t] is not None, bind)


# ---- autodiff: linear in the tables (and updates); the indices are constants ----

def _zero_fill(dtype) -> bytes:
    """A fill of 0 as jnp's zeros hold it (float8_e8m0fnu, which has no 0:
    0xFF, its NaN)."""
    return _checks.fill_bytes(_OP_G, 0, dtype)


def _zero_tangent(y) -> ad.Zero:
    return ad.Zero(jax.typeof(y).to_tangent_aval())


def _aval(a):
    return a.aval if ad.is_undefined_primal(a) else jax.typeof(a)


def _zeros(aval, dtype):
    """Zeros of `dtype` with `aval`'s shape, sharding and varying mesh axes."""
    return ad.instantiate_zeros(ad.Zero(aval.update(dtype=np.dtype(dtype), weak_type=False)))


def _adds_natively(dtype) -> bool:
    """Whether the handlers' add sums `dtype`: integers, f16, bf16, f32, f64,
    c64 and c128. Other floats (float8_*, float4_e2m1fn) are summed in
    float32 and rounded to their dtype once (XLA rounds after every add)."""
    return _checks.widen_dtype(dtype).name in _ffi.rules()["summed_dtypes"]


def _resharded(a, spec) -> jax.Array:
    """`a` with the explicit PartitionSpec `spec` (one entry per dim); a
    no-op where it has it (always, but for explicit meshes)."""
    if _lowering.spec_of(jax.typeof(a)) == tuple(spec):
        return a
    return jax.sharding.reshard(a, P(*spec))


def _gather_jvp(primals, tangents, *, fills, **params):
    indices = primals[0]
    ys = _bind_gather(*primals, fills=fills, **params)
    live = [t for t, tx in enumerate(tangents[1:]) if type(tx) is not ad.Zero]
    out = [_zero_tangent(y) for y in ys]
    if live:
        # The fill is a constant: its tangent is 0.
        tys = _bind_gather(indices, *(tangents[1 + t] for t in live),
                           fills=tuple(_zero_fill(ys[t].dtype) for t in live), **params)
        for t, ty in zip(live, tys):
            out[t] = ty
    return ys, out


def _gather_transpose(cts, indices, *xs, axis, batch, fills, method):
    assert not ad.is_undefined_primal(indices)
    out = [ad.Zero(x.aval) if ad.is_undefined_primal(x) else None for x in xs]
    live = [t for t, x in enumerate(xs)
            if ad.is_undefined_primal(x) and type(cts[t]) is not ad.Zero]
    if live:
        # A scatter-add into zeros, as jnp.take's transpose; its indices and
        # updates whole beyond the batch dims (an explicit gather may split
        # them, a scatter may not).
        ispec = _lowering.spec_of(jax.typeof(indices))
        indices = _resharded(indices, ispec[:batch] + (None,) * (indices.ndim - batch))
        avals = [xs[t].aval for t in live]
        wide = [a.dtype if _adds_natively(a.dtype) else np.dtype(np.float32) for a in avals]
        ups = []
        for t in live:
            spec = _lowering.spec_of(jax.typeof(cts[t]))
            spec = spec[:axis] + (None,) * (indices.ndim - batch) + spec[axis + indices.ndim
                                                                        - batch:]
            ups.append(_resharded(cts[t], spec))
        sums = _bind_scatter(indices, *(_zeros(a, w) for a, w in zip(avals, wide)),
                             *(u.astype(w) for u, w in zip(ups, wide)), axis=axis,
                             batch=batch, mode="add", deterministic=False, method=method)
        for t, a, total in zip(live, avals, sums):
            out[t] = total.astype(a.dtype)
    return [None, *out]


def _scatter_jvp(primals, tangents, *, axis, batch, mode, deterministic, method):
    indices, (xs, us) = primals[0], _halves(primals[1:])
    txs, tus = _halves(tangents[1:])
    params = dict(axis=axis, batch=batch, mode=mode, deterministic=deterministic, method=method)
    if mode == "set":
        # Primal and tangent must keep the same winner of each duplicate.
        indices = _last_wins(indices, xs[0].shape[axis], batch)
    ys = _bind_scatter(indices, *xs, *us, **params)
    live = [t for t in range(len(xs))
            if type(txs[t]) is not ad.Zero or type(tus[t]) is not ad.Zero]
    out = [_zero_tangent(y) for y in ys]
    if live:
        tys = _bind_scatter(indices, *(ad.instantiate_zeros(txs[t]) for t in live),
                            *(ad.instantiate_zeros(tus[t]) for t in live), **params)
        for t, ty in zip(live, tys):
            out[t] = ty
    return ys, out


def _scatter_transpose(cts, indices, *operands, axis, batch, mode, deterministic, method):
    assert not ad.is_undefined_primal(indices)
    xs, us = _halves(operands)
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
        zeros = [_zeros(_aval(us[t]), cts[t].dtype) for t in for_x]
        cleared = _bind_scatter(indices, *(cts[t] for t in for_x), *zeros, axis=axis,
                                batch=batch, mode="set", deterministic=False, method=method)
        for t, c in zip(for_x, cleared):
            ct_x[t] = c
    for_u = [t for t in live if undefined(us[t])]
    if for_u:
        got = _bind_gather(indices, *(cts[t] for t in for_u), axis=axis, batch=batch,
                           fills=tuple(_zero_fill(cts[t].dtype) for t in for_u), method=method)
        for t, g in zip(for_u, got):
            ct_u[t] = _resharded(g, _lowering.spec_of(_aval(us[t])))
    return [None, *ct_x, *ct_u]


# ---- registration -----------------------------------------------------------

_lowering.register(gather_p, _gather_abstract,
                   {"cpu": _gather_lowering, "cuda": _cuda_gather_lowering},
                   batcher=_gather_batcher)
_lowering.register(scatter_p, _scatter_abstract,
                   {"cpu": _scatter_lowering, "cuda": _cuda_scatter_lowering},
                   batcher=_scatter_batcher)
_lowering.register(gather_local_p, _gather_abstract, _gather_local_lowering, jitted=False)
_lowering.register(scatter_local_p, _scatter_local_abstract, _scatter_local_lowering,
                   jitted=False)
_lowering.require_devices_during_lowering(gather_p)
_lowering.require_devices_during_lowering(scatter_p)
ad.primitive_jvps[gather_p] = _gather_jvp
ad.primitive_transposes[gather_p] = _gather_transpose
ad.primitive_jvps[scatter_p] = _scatter_jvp
ad.primitive_transposes[scatter_p] = _scatter_transpose
