"""jax_tma.all_to_all: ``lax.all_to_all`` inside ``shard_map``, each chunk
pushed into its destination by jax_tma's peer transport (the one
``jax_tma.ppermute`` runs on), in one FFI call."""

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
from jax.interpreters import ad, mlir

from jax_tma import _checks, _ffi, _lowering
from jax_tma._ppermute import (bound_axes, call_site, instances, mesh_groups, mesh_of, timeout_ms,
                               transport)

_OP = "jax_tma.all_to_all"
_log = logging.getLogger("jax_tma")


# ---- the public op ----------------------------------------------------------

def all_to_all(x: Any, axis_name: str | Sequence[str], split_axis: int, concat_axis: int, *,
               axis_index_groups: Sequence[Sequence[int]] | None = None,
               tiled: bool = False) -> Any:
    """``lax.all_to_all`` inside ``shard_map``, with the same signature and
    the same result bit for bit: every device splits its block along
    ``split_axis`` into one chunk per position along ``axis_name``, sends
    chunk ``j`` to position ``j``, and concatenates the chunks it receives
    along ``concat_axis`` in the senders' order.

    Each chunk travels on jax_tma's peer transport, the one
    :func:`ppermute` runs on, in one call: every chunk at once, no NCCL. Up
    to 4 MiB a device, one kernel pushes each chunk into its destination's
    inbox (peer memory registered at the first call) and copies out what it
    received, one crossing of the link a call; above, each chunk is pushed
    straight into its destination's output, the one that stays copied in
    the same grid. Over peer access between
    GPUs of this process, over mapped allocations between GPUs of processes
    of one host, with ``memcpy`` between host devices (over the process
    link between processes). After the first call of a lowered all_to_all
    on a device, the participants meet only on the GPUs, so a call does no
    host synchronisation and replays from command buffers; waits are
    bounded as ppermute's (``JAX_TMA_PPERMUTE_TIMEOUT_S``). Where the transport cannot run (as for
    :func:`ppermute`: across hosts, a ``shard_map`` manual over only some
    mesh axes, symbolic dims, GPUs without peer access) and with
    ``axis_index_groups``, the op is ``lax.all_to_all``'s. Which one a call
    site got, and why, is logged at DEBUG level on the ``"jax_tma"`` logger
    when the call is lowered. A split or concat dim other than the first
    is moved there around the call (XLA transposes).

    Works under ``jit``, ``vmap`` and ``grad`` (the transpose is the reverse
    all-to-all); ``x`` may be a pytree, each leaf exchanged as
    ``lax.all_to_all`` exchanges it.

    Args:
      x: the local block, or a pytree of them (any dtype).
      axis_name: a mesh axis name of the enclosing ``shard_map`` or a tuple
        of them in the mesh's order.
      split_axis: the dim of ``x`` split into chunks (negative counts from
        the end).
      concat_axis: the dim along which the received chunks are
        concatenated; with ``tiled=False``, the position of the new dim of
        the positions along ``axis_name``.
      axis_index_groups: as in ``lax.all_to_all``; the call is then
        ``lax.all_to_all``'s.
      tiled: ``False``: ``x.shape[split_axis]`` equals the number of
        positions, and the result has that dim removed and one of the same
        size inserted at ``concat_axis``; ``True``: the dim is split into
        that many chunks and the chunks concatenated along ``concat_axis``.

    Returns:
      What ``lax.all_to_all`` returns: for ``tiled=False`` an array shaped
      ``np.insert(np.delete(x.shape, split_axis), concat_axis, n)``, for
      ``tiled=True`` ``x``'s shape with ``split_axis`` divided by ``n`` and
      ``concat_axis`` multiplied by it (``n``: the positions along
      ``axis_name``).

    Raises:
      TypeError: a leaf of ``x`` is not an array or scalar; ``axis_name``
        is not a name or a tuple of names; ``split_axis``, ``concat_axis``
        or ``tiled`` has the wrong type.
      NameError: ``axis_name`` is not bound here.
      ValueError: an axis out of range; ``x.shape[split_axis]`` not equal
        to (``tiled=False``) or not a multiple of (``tiled=True``) the
        number of positions; several axis names out of the mesh's order.

    Examples:
      >>> import jax, jax.numpy as jnp, jax_tma
      >>> from jax.sharding import Mesh, PartitionSpec as P
      >>> mesh = Mesh(jax.devices()[:1], ("i",))
      >>> f = jax.shard_map(lambda b: jax_tma.all_to_all(b, "i", 0, 1, tiled=True),
      ...                   mesh=mesh, in_specs=P("i"), out_specs=P("i"))
      >>> jax.jit(f)(jnp.arange(4.0).reshape(2, 2)).tolist()
      [[0.0, 1.0], [2.0, 3.0]]

    With two host devices (``--xla_force_host_platform_device_count=2``),
    blocks ``[[0, 1], [2, 3]]`` and ``[[4, 5], [6, 7]]`` exchanged with
    ``split_axis=0, concat_axis=1, tiled=True`` give ``[[0, 1, 4, 5]]`` and
    ``[[2, 3, 6, 7]]``, as ``lax.all_to_all`` does.
    """
    for name, value in (("split_axis", split_axis), ("concat_axis", concat_axis)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{_OP}: {name} must be an int, got {value!r}")
    if not isinstance(tiled, bool):
        raise TypeError(f"{_OP}: tiled must be a bool, got {tiled!r}")
    names, size = bound_axes(_OP, axis_name)
    if axis_index_groups is not None:
        _log.debug("%s over %s at %s: lax.all_to_all, because axis_index_groups is given",
                   _OP, names, call_site())
        return lax.all_to_all(x, axis_name, split_axis, concat_axis,
                              axis_index_groups=axis_index_groups, tiled=tiled)
    _ffi.register()
    site = call_site()
    leaves, tree = jax.tree_util.tree_flatten(x)
    out = [_exchange_leaf(_checks.as_array(_OP, "x", leaf), names, size, split_axis,
                          concat_axis, tiled, site) for leaf in leaves]
    return jax.tree_util.tree_unflatten(tree, out)


def _axis(name: str, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"{_OP}: {name} {axis} is out of range for a block of rank {rank}")
    return axis % rank


def _exchange_leaf(x: jax.Array, names: tuple[str, ...], size: int, split_axis: int,
                   concat_axis: int, tiled: bool, site: str) -> jax.Array:
    """One leaf, as lax.all_to_all's bind does it: the untiled exchange is
    the tiled one of a block with a dim of size 1 inserted at concat_axis,
    with the split dim squeezed out of the result."""
    split = _axis("split_axis", split_axis, x.ndim)
    concat = _axis("concat_axis", concat_axis, x.ndim)
    if tiled and x.shape[split] % size:
        raise ValueError(f"{_OP}: x.shape[{split}] = {x.shape[split]} is not a multiple of the "
                         f"{size} positions along {names} (tiled=True splits it into one chunk "
                         "a position)")
    if not tiled and x.shape[split] != size:
        raise ValueError(f"{_OP}: x.shape[{split}] = {x.shape[split]} must equal the {size} "
                         f"positions along {names} (tiled=False sends each position one slice)")
    if not tiled and split != concat:
        if split < concat:
            concat += 1
        else:
            split += 1
        x = lax.expand_dims(x, (concat,))
    y = _checks.narrow(all_to_all_p.bind(make_varying(_checks.widen(x), names),
                                         axis_name=names, split_axis=split,
                                         concat_axis=concat, size=size, site=site), x.dtype)
    return lax.squeeze(y, (split,)) if not tiled and split != concat else y


def make_varying(x: jax.Array, names: tuple[str, ...]) -> jax.Array:
    """`x` made varying over `names` where shard_map checks varying axes, as
    lax's collectives do before they bind (jax has no public form of it)."""
    from jax._src.lax import parallel

    insert = getattr(parallel, "insert_collective_pvary", None)
    return x if insert is None else insert(names, x)


# ---- the primitive: the tiled exchange ----------------------------------------

all_to_all_p = Primitive("jax_tma_all_to_all")


def _out_shape(shape, split_axis: int, concat_axis: int, size: int) -> tuple[int, ...]:
    out = list(shape)
    out[split_axis] //= size
    out[concat_axis] *= size
    return tuple(out)


def _abstract_eval(x, *, split_axis, concat_axis, size, **_):
    return _lowering.out_aval(x, _out_shape(x.shape, split_axis, concat_axis, size))


def _lax_exchange(x, *, axis_name, split_axis, concat_axis, **_):
    return lax.all_to_all(x, axis_name, split_axis, concat_axis, tiled=True)


def _by_transport(x, *, split_axis, concat_axis, size, attrs):
    """The tiled exchange as one jax_tma_all_to_all call on the canonical
    layout (ffi/ppermute/all_to_all.h): the split dim moved first and cut
    into `size` chunks; the result's chunk i, from position i, goes back to
    the split dim's place and is concatenated along concat_axis. Where both
    are dim 0, the moves are reshapes."""
    chunk = x.shape[split_axis] // size
    lead = jnp.moveaxis(x, split_axis, 0)
    canonical = lead.reshape((size, chunk) + lead.shape[1:])
    got = jax.ffi.ffi_call("jax_tma_all_to_all", jax.ShapeDtypeStruct(canonical.shape,
                                                                      canonical.dtype))(
        canonical, **attrs)
    pieces = jnp.moveaxis(got, 1, split_axis + 1)  # piece i: chunk i in x's layout
    out = jnp.moveaxis(pieces, 0, concat_axis)
    shape = out.shape
    return out.reshape(shape[:concat_axis] + (size * shape[concat_axis + 1],)
                       + shape[concat_axis + 2:])


def exchange_plan(ctx, *, axis_name, size, platform):
    """The attributes of a call that runs an exchange over groups of `size`
    positions along `axis_name` on ppermute's transport (instance, devices,
    sources, positions, parts, method, process, processes, links,
    timeout_ms: jax_tma_all_to_all's and jax_tma_ragged_all_to_all's, whose
    handlers decode them with DecodeExchangeGroup) where the transport can
    run every step (ppermute.transport), else None; and the reason."""
    steps, plan = [], None
    for k in range(1, size) if size > 1 else (0,):
        perm = tuple((i, (i + k) % size) for i in range(size))
        plan, why = transport(ctx, axis_name=axis_name, perm=perm, platform=platform,
                              zeros=False)
        if plan is None:
            return None, why
        if k:
            steps.append(plan[1])
    ordinals, _, links = plan
    mesh = mesh_of(ctx)
    positions = np.zeros(mesh.size, np.int64)
    for group in mesh_groups(mesh, axis_name):
        positions[group] = np.arange(len(group))
    first = next(instances)
    for _ in range(size - 2):  # step k meets under instance first + k - 1
        next(instances)
    attrs = dict(
        instance=np.int64(first), devices=ordinals,
        sources=np.concatenate(steps) if steps else np.zeros(0, np.int64),
        positions=positions, parts=np.int64(size), method="auto",
        process=np.int64(jax.process_index()),
        processes=np.array([d.process_index for d in mesh.devices.flat], np.int64),
        links="\n".join(links or ()), timeout_ms=np.int64(timeout_ms()))
    return attrs, why


# The GPU exchange's largest group: its steps travel as kernel parameters
# (ffi/peer/peer_copy.h's kMaxPeerLegs + 1).
_MAX_GPU_GROUP = 32


def lower_exchange(ctx, *args, op: str, target: str, platform: str, axis_name, size: int,
                   site: str, by_transport, fallback, fallback_name: str,
                   multiple_results: bool = False):
    """An exchange's lowering: `by_transport(*args, attrs=...)` (one call of
    FFI target `target`) where ppermute's transport can run every step
    (exchange_plan) and the target has a handler on `platform`, `fallback`
    (lax's formulation, the same result) otherwise. Which one the call site
    got, and why, is logged at DEBUG level on the "jax_tma" logger."""
    where = f"{op} over {axis_name} at {site}"
    if platform == "cuda" and target not in _ffi.cuda_targets():
        attrs, why = None, f"this build has no CUDA handler of {target}"
    elif platform == "cuda" and size > _MAX_GPU_GROUP:
        attrs, why = None, (f"a group of {size} devices; the GPU exchange runs in groups of at "
                            f"most {_MAX_GPU_GROUP} (ffi/peer/peer_copy.h, kMaxPeerLegs + 1)")
    else:
        attrs, why = exchange_plan(ctx, axis_name=axis_name, size=size, platform=platform)
    if attrs is None:
        _log.debug("%s: %s, because %s", where, fallback_name, why)
        return mlir.lower_fun(fallback, multiple_results=multiple_results)(ctx, *args)
    _log.debug("%s: %s (%s, %d steps)", where, target, why, size - 1)
    return mlir.lower_fun(functools.partial(by_transport, attrs=dict(attrs, site=site)),
                          multiple_results=multiple_results)(ctx, *args)


def _all_to_all_lowering(ctx, x, *, platform, **params):
    """The jax_tma_all_to_all call where ppermute's transport allows it;
    lax.all_to_all otherwise, with the same result."""
    return lower_exchange(
        ctx, x, op=_OP, target="jax_tma_all_to_all", platform=platform,
        axis_name=params["axis_name"], size=params["size"], site=params["site"],
        by_transport=functools.partial(_by_transport, split_axis=params["split_axis"],
                                       concat_axis=params["concat_axis"], size=params["size"]),
        fallback=functools.partial(_lax_exchange, **params), fallback_name="lax.all_to_all")


# ---- vmap and AD -------------------------------------------------------------

def _batcher(args, dims, *, split_axis, concat_axis, **params):
    (x,), (d,) = args, dims
    x = jnp.moveaxis(x, d, 0)
    return all_to_all_p.bind(x, split_axis=split_axis + 1, concat_axis=concat_axis + 1,
                             **params), 0


def _transpose(ct, x, *, split_axis, concat_axis, **params):
    # Chunk j of position i went to position j; the reverse exchange sends
    # every cotangent chunk back.
    return [all_to_all_p.bind(ct, split_axis=concat_axis, concat_axis=split_axis, **params)]


_lowering.register(all_to_all_p, _abstract_eval,
                   {p: functools.partial(_all_to_all_lowering, platform=p) for p in ("cpu", "cuda")},
                   batcher=_batcher, jitted=False)
ad.deflinear2(all_to_all_p, _transpose)
