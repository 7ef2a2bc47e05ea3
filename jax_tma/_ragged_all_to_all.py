"""jax_tma.ragged_all_to_all: ``lax.ragged_all_to_all`` inside ``shard_map``,
each device's slices pushed into their destinations' outputs, in place, by
jax_tma's peer transport (the one ``jax_tma.all_to_all`` runs on), in one FFI
call; and the formulation of it through ``lax.all_to_all`` that the call
falls back to where the transport cannot run."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad

from jax_tma import _checks, _ffi, _lowering
from jax_tma._all_to_all import all_to_all_p, lower_exchange, make_varying
from jax_tma._ppermute import bound_axes, call_site

_OP = "jax_tma.ragged_all_to_all"
_TARGET = "jax_tma_ragged_all_to_all"
_INDEX_NAMES = ("input_offsets", "send_sizes", "output_offsets", "recv_sizes")
_FALLBACK = "lax.all_to_all of padded slices"
_log = logging.getLogger("jax_tma")


# ---- the public op ----------------------------------------------------------

def ragged_all_to_all(operand: Any, output: Any, input_offsets: Any, send_sizes: Any,
                      output_offsets: Any, recv_sizes: Any, *,
                      axis_name: str | Sequence[str],
                      axis_index_groups: Sequence[Sequence[int]] | None = None) -> jax.Array:
    """``lax.ragged_all_to_all`` inside ``shard_map``, with the same signature
    and the same result bit for bit: every device sends slices of the rows
    of ``operand`` to the devices along ``axis_name`` and writes the slices
    it receives into ``output``, which it returns.

    With ``N`` entries in each of the four index arrays and ``n`` positions
    along ``axis_name`` (``N`` a multiple of ``n``), slice ``i`` of a device,
    rows ``input_offsets[i]`` to ``input_offsets[i] + send_sizes[i]`` of
    ``operand``, goes to the device at position ``i // (N // n)`` and lands
    there at rows ``output_offsets[i]`` on (the offsets are where the *sent*
    slices land on their receivers, as in lax). ``recv_sizes[i]`` is the
    number of rows a device receives as its slice ``i`` from position
    ``i // (N // n)``: what that device sends in its ``send_sizes``. Rows of
    ``output`` that no slice writes keep their values; the call writes
    ``output`` in place (donate it to ``jit`` to spare the copy).

    All slices travel in one call on jax_tma's peer transport, the one
    :func:`all_to_all` runs on: every slice at once, each pushed straight
    into its destination's ``output`` (those that stay into this device's
    own), with no padding, no staging buffer and no NCCL. Where the transport
    cannot run (as for :func:`all_to_all`: across hosts, a ``shard_map``
    manual over only some mesh axes, symbolic dims, GPUs without peer
    access, or a build without its GPU handler) and with
    ``axis_index_groups``, the op is the same exchange written with
    ``lax.all_to_all``: every slice padded to ``operand``'s rows, exchanged,
    and the rows received written into ``output`` with a masked scatter.
    Which one a call site got, and why, is logged at DEBUG level on the
    ``"jax_tma"`` logger (when the call is lowered; with
    ``axis_index_groups``, when it is traced). XLA's own
    ``ragged-all-to-all`` does not run on the CPU.

    Offsets and sizes known when the call is traced (NumPy arrays, Python
    ints, concrete arrays) are checked then; traced ones are checked by the
    handler, which fails the call with an error naming the device, the
    array, the entry and its value, writing none of the rows that the value
    concerns: a negative offset or size, a slice that runs past ``operand``
    or past its receiver's ``output``, or ``recv_sizes`` that differ from
    what the sender sends. (The ``lax.all_to_all`` formulation cannot
    raise: there rows out of range are dropped.)

    Works under ``jit``, ``vmap`` over an axis other than ``axis_name``
    (the batch folded into the rows, as lax does) and ``grad`` (lax's
    transpose: the cotangent's received rows go back by the reverse ragged
    exchange, and ``output``'s cotangent is zero where slices landed).

    Args:
      operand: the rows to send: an array of rank >= 1 (rows first, any
        dtype).
      output: the array the received rows are written into: ``operand``'s
        dtype and row shape (``output.shape[1:] == operand.shape[1:]``),
        any number of rows.
      input_offsets: rank 1, ``N`` integers: where slice ``i`` starts in
        ``operand``.
      send_sizes: rank 1, ``N`` integers: the rows of slice ``i``.
      output_offsets: rank 1, ``N`` integers: where slice ``i`` lands in
        its receiver's ``output``.
      recv_sizes: rank 1, ``N`` integers: the rows received as slice ``i``
        from position ``i // (N // n)``.
      axis_name: a mesh axis name of the enclosing ``shard_map`` or a tuple
        of them in the mesh's order.
      axis_index_groups: as in ``lax.ragged_all_to_all``: groups of
        positions along ``axis_name`` of one size ``n``, each position in
        one group, the slices exchanged within each group in its order;
        the call is then the ``lax.all_to_all`` formulation.

    The four index arrays have one integer dtype; ``int32`` and ``int64``
    reach the handler as they are, other integer types as one of them
    (every value in range kept; ``uint64`` values past ``2**63 - 1`` read
    as ``2**63 - 1``).

    Returns:
      ``output`` with the received slices written: same shape and dtype.

    Raises:
      TypeError: an argument is not an array or scalar; ``operand`` and
        ``output`` have different dtypes; an index array is not of
        integers, or the four have different dtypes; ``axis_name`` is not a
        name or a tuple of names.
      NameError: ``axis_name`` is not bound here.
      NotImplementedError: ``axis_name`` is a ``vmap`` axis (as in lax).
      ValueError: ``operand`` or ``output`` of rank 0 or of different row
        shapes; an index array not of rank 1, empty, or of another length
        than the others, or a length not a multiple of ``n``;
        ``axis_index_groups`` not groups of one size covering the axis;
        static offsets or sizes that break the rules above.
      jax.errors.JaxRuntimeError: traced offsets or sizes that break them,
        named by the handler; a peer that fails, or does not arrive within
        ``JAX_TMA_PPERMUTE_TIMEOUT_S`` seconds (default 30).

    Examples:
      >>> import jax, jax.numpy as jnp, jax_tma
      >>> from jax.sharding import Mesh, PartitionSpec as P
      >>> mesh = Mesh(jax.devices()[:1], ("i",))
      >>> def f(x, out):
      ...     return jax_tma.ragged_all_to_all(x, out, jnp.array([1]), jnp.array([2]),
      ...                                      jnp.array([0]), jnp.array([2]), axis_name="i")
      >>> g = jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
      >>> jax.jit(g)(jnp.array([1, 2, 3]), jnp.array([-1, -1, -1, -1])).tolist()
      [2, 3, -1, -1]

    With two host devices (``--xla_force_host_platform_device_count=2``)
    and lax's docstring example, devices 0 and 1 get ``[1, 3, 0, 0]`` and
    ``[2, 2, 4, 0]``, as ``lax.ragged_all_to_all`` gives them on a GPU.
    """
    operand = _checks.as_array(_OP, "operand", operand)
    output = _checks.as_array(_OP, "output", output)
    static = {name: _static(v) for name, v in zip(_INDEX_NAMES, (
        input_offsets, send_sizes, output_offsets, recv_sizes))}
    indices = [_checks.as_array(_OP, name, v) for name, v in zip(_INDEX_NAMES, (
        input_offsets, send_sizes, output_offsets, recv_sizes))]
    names, axis_size = bound_axes(_OP, axis_name)
    mesh_axes = jax.sharding.get_abstract_mesh().axis_names
    if not set(names) <= set(mesh_axes):
        raise NotImplementedError(
            f"{_OP}: axis {names} is not a mesh axis of the enclosing shard_map (mesh axes "
            f"{tuple(mesh_axes)}): over a vmap axis, lax.ragged_all_to_all raises "
            "NotImplementedError too")
    groups, size = _groups(axis_index_groups, axis_size, names)
    _check_arrays(operand, output, indices, size, names)
    _check_static(static, operand.shape[0], output.shape[0], size)
    indices = [_ffi_index(i) for i in indices]
    dtype = operand.dtype
    operand, output = _checks.widen(operand), _checks.widen(output)
    site = call_site()
    if groups is not None:
        _log.debug("%s over %s at %s: %s, because axis_index_groups is given", _OP, names, site,
                   _FALLBACK)
        args = _checks.align_varying(*(make_varying(a, names)
                                       for a in (operand, output, *indices)))
        y = composed(*args, axis_name=names, axis_index_groups=groups)
    else:
        _ffi.register()
        y = bind(operand, output, *indices, axis_name=names, size=size, site=site)
    return _checks.narrow(y, dtype)


# ---- checks -----------------------------------------------------------------

def _static(value: Any) -> np.ndarray | None:
    """`value` as a NumPy array where it is known at trace time (NumPy,
    Python numbers, concrete jax arrays), else None."""
    if isinstance(value, jax.core.Tracer):
        return None
    try:
        return np.asarray(value)
    except Exception:  # noqa: BLE001 (as_array's check names what it is)
        return None


def _groups(axis_index_groups, axis_size: int, names) -> tuple[tuple | None, int]:
    """The groups as tuples and their size (the positions an exchange runs
    over); the axis size where there are none."""
    if axis_index_groups is None:
        return None, axis_size
    try:
        groups = tuple(tuple(int(i) for i in g) for g in axis_index_groups)
        exact = all(isinstance(i, (int, np.integer)) and not isinstance(i, bool)
                    for g in axis_index_groups for i in g)
    except (TypeError, ValueError):
        exact = False
    if not exact:
        raise TypeError(f"{_OP}: axis_index_groups must be a sequence of sequences of ints, got "
                        f"{axis_index_groups!r:.200}")
    flat = sorted(i for g in groups for i in g)
    if not groups or len({len(g) for g in groups}) != 1 or flat != list(range(axis_size)):
        raise ValueError(
            f"{_OP}: axis_index_groups must split the {axis_size} positions along {names} into "
            f"groups of one size, each position in one group; got {[list(g) for g in groups]}")
    return groups, len(groups[0])


def _check_arrays(operand, output, indices, size: int, names) -> None:
    if operand.ndim == 0 or output.ndim == 0:
        raise ValueError(f"{_OP}: operand and output must have rank >= 1 (rows first), got "
                         f"shapes {operand.shape} and {output.shape}")
    if operand.dtype != output.dtype:
        raise TypeError(f"{_OP}: output has dtype {output.dtype} but operand has "
                        f"{operand.dtype}; they must be the same")
    if operand.shape[1:] != output.shape[1:]:
        raise ValueError(f"{_OP}: operand's rows have shape {operand.shape[1:]} but output's "
                         f"{output.shape[1:]} (operand.shape={operand.shape}, "
                         f"output.shape={output.shape})")
    for name, a in zip(_INDEX_NAMES, indices):
        if not jnp.issubdtype(a.dtype, jnp.integer):
            raise TypeError(f"{_OP}: {name} must be integers, got dtype {a.dtype}")
        if a.dtype != indices[0].dtype:
            raise TypeError(f"{_OP}: {name} has dtype {a.dtype} but input_offsets has "
                            f"{indices[0].dtype}; the four offset and size arrays share one "
                            "dtype (XLA's ragged-all-to-all requires it)")
        if a.ndim != 1 or a.shape[0] < 1:
            raise ValueError(f"{_OP}: {name} must have rank 1 and at least one entry, got "
                             f"shape {a.shape}")
        if a.shape != indices[0].shape:
            raise ValueError(f"{_OP}: {name} has {a.shape[0]} entries but input_offsets has "
                             f"{indices[0].shape[0]}; the four have one entry per slice")
    if _lowering.static_shape(indices[0]) and indices[0].shape[0] % size:
        raise ValueError(f"{_OP}: input_offsets has {indices[0].shape[0]} entries, not a "
                         f"multiple of the {size} positions along {names} (each position "
                         "gets the same number of slices)")


def _check_static(static: dict, rows, out_rows, size: int) -> None:
    """The rules the handler checks, on the offsets and sizes known at trace
    time: inside shard_map those are the same on every device."""
    vals = {k: None if v is None else [int(x) for x in v.reshape(-1).tolist()]
            for k, v in static.items()}
    for name, v in vals.items():
        for i, x in enumerate(v or ()):
            if x < 0:
                raise ValueError(f"{_OP}: {name}[{i}] = {x} is negative")
    ss = vals["send_sizes"]
    if ss is None:
        return
    per = len(ss) // size
    if vals["input_offsets"] is not None and isinstance(rows, int):
        for i, (o, s) in enumerate(zip(vals["input_offsets"], ss)):
            if o + s > rows:
                raise ValueError(f"{_OP}: input_offsets[{i}] + send_sizes[{i}] = {o} + {s} "
                                 f"runs past the operand's {rows} rows")
    if vals["output_offsets"] is not None and isinstance(out_rows, int):
        for i, (o, s) in enumerate(zip(vals["output_offsets"], ss)):
            if o + s > out_rows:
                raise ValueError(
                    f"{_OP}: output_offsets[{i}] + send_sizes[{i}] = {o} + {s} runs past the "
                    f"output's {out_rows} rows (on the device at position {i // per}, which "
                    f"receives slice {i})")
    rs = vals["recv_sizes"]
    if rs is None:
        return
    # Slice t from position j to position d has send_sizes[d * per + t]
    # rows there and recv_sizes[j * per + t] here: the same arrays on every
    # device.
    for d in range(size):
        for j in range(size):
            for t in range(per):
                sent, expected = ss[d * per + t], rs[j * per + t]
                if sent != expected:
                    raise ValueError(
                        f"{_OP}: recv_sizes[{j * per + t}] = {expected} differs from "
                        f"send_sizes[{d * per + t}] = {sent}: static sizes are the same on "
                        f"every device, so position {j} sends {sent} rows as its slice "
                        f"{d * per + t} to position {d}, which expects {expected}")


def _ffi_index(a: jax.Array) -> jax.Array:
    """An index array as the handler takes it: int32 and int64 as they are,
    narrower integers as int32 (exact), uint32 and uint64 as int64 (where
    64-bit types exist; values past the signed range read as its largest)."""
    if a.dtype in (np.int32, np.int64):
        return a
    wide = np.dtype(np.int64 if jax.config.jax_enable_x64 else np.int32)
    if np.iinfo(_checks.widen_dtype(a.dtype)).max <= np.iinfo(np.int32).max:
        return lax.convert_element_type(a, np.int32)
    top = np.iinfo(wide).max
    return lax.convert_element_type(jnp.minimum(a, np.asarray(top).astype(a.dtype)), wide)


# ---- the lax.all_to_all formulation -------------------------------------------

def composed(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *,
             axis_name, axis_index_groups=None) -> jax.Array:
    """The exchange of ragged_all_to_all written with lax.all_to_all, the
    same result for every valid call: each slice gathered into a block of
    operand's rows (padded), the blocks and output_offsets exchanged, and
    each received slice's first recv_sizes rows scattered into output at
    its offset (rows out of range are dropped). What the op falls back to,
    and the reference of the tests."""
    rows, out_rows = operand.shape[0], output.shape[0]
    index = input_offsets.dtype
    r = lax.iota(index, rows)
    src = jnp.clip(input_offsets[:, None] + r[None, :], 0, max(rows - 1, 0))
    send = jnp.take(operand, src, axis=0, mode="clip")  # (N, rows, ...)
    exchange = functools.partial(lax.all_to_all, axis_name=axis_name, split_axis=0,
                                 concat_axis=0, axis_index_groups=axis_index_groups, tiled=True)
    got = exchange(send)  # slice j from position j // (N // n)
    landing = exchange(output_offsets)  # where the slices received here land
    dest = landing[:, None] + r[None, :]
    keep = (r[None, :] < recv_sizes[:, None]) & (dest >= 0) & (dest < out_rows)
    # Rows not written go past the end, each to its own row there (dropped):
    # with the slices received apart, as lax's semantics have them, every
    # index is unique, and jax's derivative of the scatter moves the
    # tangents' bits as they are (its rule for repeated indices adds them
    # to zeros, which flushes subnormals on the CPU).
    dest = jnp.where(keep, dest, out_rows + lax.iota(index, dest.size).reshape(dest.shape))
    return output.at[dest.reshape(-1)].set(
        got.reshape((-1,) + operand.shape[1:]), mode="drop", unique_indices=True)


# ---- the primitive ------------------------------------------------------------

ragged_all_to_all_p = Primitive("jax_tma_ragged_all_to_all")


def bind(operand, output, *indices, axis_name, size, site, rows=None, ctas=0):
    """The primitive bound on operands varying over `axis_name` and over each
    other's axes, as lax's collectives do: the result varies as they do.
    Internal, for jax_tma's own compositions: `rows`: `output` has no rows
    and the result has `rows`, those that no slice writes unspecified (no
    buffer of `rows` rows is filled only to be overwritten); `ctas`: on a
    GPU, at most that many CTAs copy (0: the device's choice; else at least
    one a slice), so the copy holds at most that many SMs."""
    assert rows is None or output.shape[0] == 0, (rows, output.shape)
    args = _checks.align_varying(*(make_varying(a, axis_name)
                                   for a in (operand, output, *indices)))
    return ragged_all_to_all_p.bind(*args, axis_name=axis_name, size=size, site=site, rows=rows,
                                    ctas=ctas)


def _result_shape(output, rows) -> tuple[int, ...]:
    return output.shape if rows is None else (rows,) + output.shape[1:]


def _abstract_eval(operand, output, *indices, rows, **_):
    return _lowering.out_aval(output, _result_shape(output, rows))


# ---- lowering -------------------------------------------------------------------

def _by_transport(operand, output, *indices, rows, ctas, attrs):
    """One jax_tma_ragged_all_to_all call on the whole buffers, the result
    aliased to output; with `rows`, a result of its own, of which the
    handler writes the slices alone (ffi/ppermute/ragged_all_to_all.h)."""
    shape = jax.ShapeDtypeStruct(_result_shape(output, rows), output.dtype)
    aliases = {1: 0} if rows is None else {}
    return jax.ffi.ffi_call(_TARGET, shape, input_output_aliases=aliases)(
        operand, output, *indices, ctas=np.int64(ctas), **attrs)


def _composed(operand, output, *indices, rows, axis_name):
    """composed, into zeros where the result has rows of its own."""
    if rows is not None:
        output = jnp.zeros(_result_shape(output, rows), output.dtype)
    return composed(operand, output, *indices, axis_name=axis_name)


def _ragged_lowering(ctx, *args, platform, axis_name, size, site, rows, ctas):
    """The jax_tma_ragged_all_to_all call where ppermute's transport allows
    it; the lax.all_to_all formulation otherwise, with the same result."""
    return lower_exchange(
        ctx, *args, op=_OP, target=_TARGET, platform=platform, axis_name=axis_name,
        size=size, site=site,
        by_transport=functools.partial(_by_transport, rows=rows, ctas=ctas),
        fallback=functools.partial(_composed, rows=rows, axis_name=axis_name),
        fallback_name=_FALLBACK)


# ---- vmap ---------------------------------------------------------------------

def _batcher(args, dims, *, axis_name, size, site, rows, ctas):
    """As lax's: the batch folded into the rows, batch b's slices read and
    written at rows b * rows on (the result's rows where it has its own),
    each index array ordered slice-major so that every slice keeps its
    destination. An offset that breaks a rule in its own batch is made -1,
    so that the handler refuses it (on the folded arrays) instead of
    reaching another batch's rows."""
    batch = next(a.shape[d] for a, d in zip(args, dims) if d is not None)

    def front(x, d):
        if d is None:
            return jnp.broadcast_to(x, (batch,) + x.shape)
        return jnp.moveaxis(x, d, 0)

    operand, output = front(args[0], dims[0]), front(args[1], dims[1])
    in_rows, out_rows = operand.shape[1], output.shape[1] if rows is None else rows
    io, ss, oo, rs = (front(a, d).T for a, d in zip(args[2:], dims[2:]))  # (N, batch)
    b = lax.iota(io.dtype, batch)[None, :]
    sent = jnp.maximum(ss, 0)  # a negative size the handler names itself
    io = jnp.where((io >= 0) & (io <= in_rows - sent), io + b * in_rows, -1)
    oo = jnp.where((oo >= 0) & (oo <= out_rows - sent), oo + b * out_rows, -1)
    y = bind(operand.reshape((-1,) + operand.shape[2:]),
              output.reshape((-1,) + output.shape[2:]),
              *(a.reshape(-1) for a in (io, ss, oo, rs)),
              axis_name=axis_name, size=size, site=site,
              rows=None if rows is None else batch * rows, ctas=ctas)
    return y.reshape((batch, out_rows) + output.shape[2:]), 0


# ---- AD ---------------------------------------------------------------------------

def _jvp(primals, tangents, **params):
    operand, output, *indices = primals
    d_operand, d_output, *_ = tangents
    y = ragged_all_to_all_p.bind(operand, output, *indices, **params)
    if type(d_operand) is ad.Zero and type(d_output) is ad.Zero:
        return y, ad.Zero(jax.typeof(y).to_tangent_aval())
    d_operand, d_output = ad.instantiate_zeros(d_operand), ad.instantiate_zeros(d_output)
    return y, ragged_all_to_all_p.bind(d_operand, d_output, *indices, **params)


def _transpose(ct, operand, output, input_offsets, send_sizes, output_offsets, recv_sizes,
               *, axis_name, size, site, rows, ctas):
    """lax's transpose: the cotangent's received rows go back along the
    reverse exchange (offsets swapped by an all_to_all, the sizes' roles
    swapped) into zeros; output's cotangent is ct but where slices landed
    (none where the result has rows of its own: output has none)."""
    want_operand, want_output = ad.is_undefined_primal(operand), ad.is_undefined_primal(output)
    if type(ct) is ad.Zero:
        return [ad.Zero(operand.aval) if want_operand else None,
                ad.Zero(output.aval) if want_output else None] + [None] * 4

    # Both offsets in one exchange: one call fewer to meet, and none beside
    # another that the CPU's thread pool could starve (docs/limits.md).
    both = all_to_all_p.bind(make_varying(jnp.stack([output_offsets, input_offsets], 1),
                                          axis_name),
                             axis_name=axis_name, split_axis=0, concat_axis=0, size=size,
                             site=site)
    landed = both[:, 0]  # where the slices received here landed
    operand_ct = output_ct = None
    if want_operand:
        zero = ad.zeros_like_aval(operand.aval)
        operand_ct = bind(ct, zero, landed, recv_sizes, both[:, 1], send_sizes,
                           axis_name=axis_name, size=size, site=site, ctas=ctas)
    if want_output and rows is not None:
        output_ct = ad.Zero(output.aval)
    elif want_output:
        out_rows = ct.shape[0]
        # +1 where a received slice starts, -1 where it ends: rows covered
        # by any slice have a positive running sum.
        edges = (jnp.zeros(out_rows + 1, np.int32)
                 .at[landed].add(1, mode="drop")
                 .at[landed + recv_sizes].add(-1, mode="drop"))
        written = (jnp.cumsum(edges)[:out_rows] > 0).reshape((out_rows,) + (1,) * (ct.ndim - 1))
        output_ct = jnp.where(written, jnp.zeros_like(ct), ct)
    return [operand_ct, output_ct] + [None] * 4


# ---- registration -----------------------------------------------------------

_lowering.register(ragged_all_to_all_p, _abstract_eval,
                   {p: functools.partial(_ragged_lowering, platform=p) for p in ("cpu", "cuda")},
                   batcher=_batcher, jitted=False)
ad.primitive_jvps[ragged_all_to_all_p] = _jvp
ad.primitive_transposes[ragged_all_to_all_p] = _transpose
