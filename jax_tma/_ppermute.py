"""jax_tma.ppermute: ``lax.ppermute`` inside ``shard_map``, where each device
reads its source's block straight out of the peer GPU's memory with TMA bulk
copies (peer access) instead of going through NCCL."""

from __future__ import annotations

import functools
import itertools
import logging
import os
import socket
import threading
import uuid
from collections.abc import Sequence
from typing import Literal

import jax
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, mlir

from jax_tma import _checks, _ffi, _lowering

PpermuteMethod = Literal["auto", "tma", "simt"]
PpermuteDirection = Literal["auto", "pull", "push"]
_METHODS = ("auto", "tma", "simt")
_DIRECTIONS = ("auto", "pull", "push")
# direction="auto": on two NVLink-connected H200s (NV18) pushing measured
# 1.01-1.11x the pull bandwidth from 4 MiB to 1 GiB in two runs (368 vs 336
# GB/s per direction at 1 GiB): a write crosses the link once, a read makes a
# round trip.
_AUTO_DIRECTION = "push"
_OP = "jax_tma.ppermute"
_log = logging.getLogger("jax_tma")


# ---- the public op ----------------------------------------------------------

def ppermute(x: jax.Array, axis_name: str | Sequence[str],
             perm: Sequence[tuple[int, int]], *, method: PpermuteMethod = "auto",
             direction: PpermuteDirection = "auto") -> jax.Array:
    """``lax.ppermute`` through the GPUs' peer memory: inside ``shard_map``,
    every device receives the block of the device that sends to it.

    The block moves directly between the two GPUs' memories with the TMA
    bulk-copy pipeline of :func:`copy` (no staging buffer, no NCCL): the
    sender writes into its destination's output (push) or the receiver reads
    its source's input (pull). The GPUs may be in this process (peer access)
    or in other processes of this host under ``jax.distributed`` (each
    process maps the XLA allocations its peers hand it over a Unix socket,
    found through ``jax.distributed``'s key-value store). The first call of a
    lowered ppermute on a device meets its peers on the host to trade small
    mailboxes in device memory; every later call meets only on the GPUs —
    each device publishes its buffer and signals its copy through the
    mailboxes, numbered per call — so a call does no host synchronisation
    and replays from XLA's command buffers (CUDA graphs). Waits are bounded:
    a peer that never calls, exits or calls another permutation fails the
    first call within ``JAX_TMA_PPERMUTE_TIMEOUT_S`` seconds (default 30)
    with an error naming it; on a later call the waiting kernel traps, so the
    step fails instead of returning a block that never came, and the reason
    (call site, peer, what was awaited) is printed on stderr. Where the
    transport cannot run — a mesh across hosts, a ``shard_map`` manual over
    only some mesh axes, no concrete mesh at lowering, or GPUs of one
    process without peer access — the op lowers to ``lax.ppermute`` with the
    same result. On the CPU the host devices meet on every call and copy
    with ``memcpy``; host devices in several processes of one host send
    their blocks over the same sockets. Which transport a call site got, and
    why, is logged at DEBUG level on the ``"jax_tma"`` logger when the call
    is lowered. Works under ``jit``, ``vmap`` (one call over the batched
    block) and ``grad`` (the transpose is the inverse permutation; devices
    that sent nothing get a zero cotangent).

    ``method="auto"`` copies with the TMA bulk pipeline on GPUs with TMA and
    with the SIMT copy on older ones; ``direction="auto"`` pushes (a write
    crosses the link once, where a read makes a round trip).

    Args:
      x: the local block (any dtype and shape; sub-byte types are widened
        around the call).
      axis_name: a mesh axis name of the enclosing ``shard_map`` or a tuple
        of them in the mesh's order (positions run over those axes as in
        ``lax.ppermute``).
      perm: ``(source, destination)`` position pairs along ``axis_name``;
        each source and each destination at most once. Devices that receive
        nothing get zeros.
      method: ``"auto"`` (the rule above), ``"tma"`` (the TMA bulk copy) or
        ``"simt"`` (a plain vectorised copy); every method gives the same
        result. ``"bulk"``, the old name of ``"tma"``, still works and
        emits a ``DeprecationWarning``.
      direction: ``"auto"`` (push), ``"push"`` (each sender writes into its
        destination's output) or ``"pull"`` (each receiver reads its
        source's input); every direction gives the same result.

    Returns:
      The block received from the device that sends to this one (zeros
      where none does), with ``x``'s shape and dtype.

    Raises:
      TypeError: ``x`` is not an array or scalar; ``axis_name`` is not a
        name or a tuple of names; ``perm`` is not a sequence of int pairs.
      NameError: ``axis_name`` is not bound here (the call is not inside a
        ``shard_map`` over a mesh with that axis).
      ValueError: several axis names out of the mesh's order; ``method`` or
        ``direction`` is not one of its names; a ``perm`` position outside
        the axis; ``perm`` is not a permutation (a source or destination
        appears twice).
      jax.errors.JaxRuntimeError: a peer that fails, or does not arrive
        within ``JAX_TMA_PPERMUTE_TIMEOUT_S`` seconds (default 30).

    Examples:
      >>> import jax, jax.numpy as jnp, jax_tma
      >>> from jax.sharding import Mesh, PartitionSpec as P
      >>> mesh = Mesh(jax.devices()[:1], ("i",))
      >>> f = jax.shard_map(lambda b: jax_tma.ppermute(b, "i", [(0, 0)]),
      ...                   mesh=mesh, in_specs=P("i"), out_specs=P("i"))
      >>> jax.jit(f)(jnp.arange(4.0)).tolist()
      [0.0, 1.0, 2.0, 3.0]

    With two or more devices (GPUs, or host devices forced with
    ``--xla_force_host_platform_device_count``), ``perm=[(0, 1), (1, 0)]``
    swaps the blocks of devices 0 and 1, as ``lax.ppermute`` does.
    """
    x = _checks.as_array(_OP, "x", x)
    names, size = bound_axes(_OP, axis_name)
    method = _checks.check_method(_OP, method, _METHODS)
    _checks.check_choice(_OP, "direction", direction, _DIRECTIONS)
    pairs = _check_perm(perm, size)
    _ffi.register()
    params = dict(axis_name=tuple(names), perm=pairs, method=method, site=call_site(),
                  direction=_AUTO_DIRECTION if direction == "auto" else direction)
    return _checks.narrow(ppermute_p.bind(_checks.widen(x), **params), x.dtype)


# ---- checks -----------------------------------------------------------------

def bound_axes(op: str, axis_name) -> tuple[tuple[str, ...], int]:
    """`axis_name` (a mesh axis name or a tuple of them, in the mesh's order)
    as a tuple, and the number of positions along those axes, for the
    collective `op` inside shard_map."""
    names = (axis_name,) if isinstance(axis_name, str) else axis_name
    if not isinstance(names, (tuple, list)) or not names or not all(isinstance(a, str) for a in names):
        raise TypeError(f"{op}: axis_name must be a mesh axis name or a tuple of them, got {axis_name!r}")
    try:
        size = lax.axis_size(tuple(names))
    except NameError as e:
        raise NameError(
            f"{op}: axis name {axis_name!r} is not bound here; call {op.split('.')[-1]} inside "
            f"shard_map over a mesh that has that axis ({e})"
        ) from None
    mesh_axes = jax.sharding.get_abstract_mesh().axis_names
    in_order = [a for a in mesh_axes if a in names]
    if len(names) > 1 and in_order != list(names):
        raise ValueError(
            f"{op}: axis_name {tuple(names)} must list the mesh axes in the mesh's order "
            f"{tuple(in_order)} (positions along several axes run in mesh order)"
        )
    return tuple(names), size


def _check_perm(perm, size: int) -> tuple[tuple[int, int], ...]:
    try:
        pairs = tuple((int(s), int(d)) for s, d in perm)
        exact = all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool)
            for pair in perm for v in pair
        )
    except (TypeError, ValueError):
        exact = False
    if not exact:
        raise TypeError(f"{_OP}: perm must be a sequence of (source, destination) int pairs, got {perm!r:.200}")
    for s, d in pairs:
        if not (0 <= s < size and 0 <= d < size):
            raise ValueError(
                f"{_OP}: perm pair ({s}, {d}) is outside the axis: positions run 0..{size - 1} (axis size {size})"
            )
    for k, name in ((0, "source"), (1, "destination")):
        seen = [p[k] for p in pairs]
        dup = sorted({v for v in seen if seen.count(v) > 1})
        if dup:
            raise ValueError(
                f"{_OP}: perm is not a permutation: {name} {dup[0]} appears "
                f"{seen.count(dup[0])} times in {list(pairs)}"
            )
    return pairs


def call_site() -> str:
    """file:line of the innermost frame outside jax and jax_tma: the user's
    call of the op."""
    frame, _ = _checks.user_frame()
    return "an unknown call site" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"


# ---- primitives -------------------------------------------------------------

ppermute_p = Primitive("jax_tma_ppermute")


# ---- lowering and partitioning ----------------------------------------------

# Each lowering gets its own id: the handlers of one call meet under it.
instances = itertools.count(1)


def mesh_of(ctx) -> jax.sharding.Mesh | None:
    """The concrete mesh of the enclosing shard_map, or None where the
    lowering has only an abstract one."""
    mesh = getattr(ctx.module_context.axis_context, "mesh", None)
    if isinstance(mesh, jax.sharding.Mesh) and not mesh.empty:
        return mesh
    mesh = jax.sharding.get_mesh()
    if isinstance(mesh, jax.sharding.Mesh) and not mesh.empty:
        return mesh
    return None


def mesh_groups(mesh: jax.sharding.Mesh, axis_name: tuple[str, ...]) -> np.ndarray:
    """The logical ids of `mesh`'s devices (the flat order of
    ``mesh.devices``) by group along `axis_name`, one row a group: the
    devices that differ only in the named axes, ordered by position along
    them (mesh order), as lax's collectives number them."""
    ids = np.arange(mesh.size).reshape(mesh.devices.shape)
    named = sorted(mesh.axis_names.index(a) for a in axis_name)
    rest = [i for i in range(ids.ndim) if i not in named]
    return ids.transpose(rest + named).reshape(-1, int(np.prod([ids.shape[i] for i in named])))


def device_plan(mesh: jax.sharding.Mesh, axis_name: tuple[str, ...],
                perm: tuple[tuple[int, int], ...]) -> tuple[np.ndarray, np.ndarray]:
    """For every device of `mesh` in logical order (the flat order of
    ``mesh.devices``, which is XLA's device assignment): its device ordinal,
    and the logical id of the device whose block it receives (-1: none).

    Positions along `axis_name` follow ``lax.ppermute``: the devices that
    differ only in the named axes form a group, ordered by logical id."""
    groups = mesh_groups(mesh, axis_name)
    sources = np.full(mesh.size, -1, np.int64)
    for group in groups:
        for src, dst in perm:
            sources[group[dst]] = group[src]
    # What each handler is told it runs on: a host device's id (process 1's
    # are 2048, ... under jax.distributed), a GPU's CUDA ordinal in its
    # process (as that process published it, for another process's GPU).
    ordinals = np.array([_ordinal(d) for d in mesh.devices.flat], np.int64)
    return ordinals, sources


def _ordinal(device) -> int:
    if device.platform == "cpu":
        return device.id
    if device.local_hardware_id is not None:
        return device.local_hardware_id
    return _published_ordinals.get(device.id, device.id)


def peer_access(device: int, peer: int) -> bool:
    """Whether GPU `device` can map GPU `peer`'s memory."""
    return bool(_ffi._ext.can_access_peer(device, peer))


def _fallback(ctx, x, *, axis_name, perm):
    return mlir.lower_fun(
        functools.partial(lax.ppermute, axis_name=axis_name, perm=perm),
        multiple_results=False,
    )(ctx, x)


def transport(ctx, *, axis_name, perm, platform, zeros=True):
    """The devices' ordinals, sources and process links where the
    jax_tma_ppermute call can run (the mesh's processes on this host, the
    shard_map manual over every mesh axis and, on GPUs of this process, each
    receiver able to map its source's memory), else None; and the reason,
    for the debug log. zeros: devices that receive nothing are written
    zeros (all_to_all's receive at every step)."""
    mesh = mesh_of(ctx)
    manual = getattr(ctx.module_context.axis_context, "manual_axes", frozenset())
    if mesh is None:
        return None, "no concrete mesh at lowering"
    if zeros and any(_checks.fill_bytes(_OP, 0, ctx.avals_in[0].dtype)):
        return None, (f"{ctx.avals_in[0].dtype} has no zero bytes for the devices that "
                      "receive nothing (jnp's 0 of it is not all zero bits)")
    if not _lowering.static_shape(*ctx.avals_in):
        # XLA refines a shape-polymorphic module's shapes, but not those of
        # a custom call inside a manual computation.
        return None, "the block has symbolic dims (a shape-polymorphic export)"
    if set(manual) != set(mesh.axis_names):
        return None, f"the shard_map is manual over {sorted(manual)}, not every mesh axis {list(mesh.axis_names)}"
    if not set(axis_name) <= set(mesh.axis_names):
        return None, f"axis {axis_name} is not an axis of the mesh {list(mesh.axis_names)}"
    processes = sorted({d.process_index for d in mesh.devices.flat})
    links = None
    if processes != [jax.process_index()]:
        links, why = _process_links(processes)
        if links is None:
            return None, why
    ordinals, sources = device_plan(mesh, axis_name, perm)
    if platform == "cuda":
        # Within a process, each receiver must map its source's memory;
        # across processes the first call maps the peers' allocations.
        owners = [d.process_index for d in mesh.devices.flat]
        for i, s in enumerate(sources):
            if s < 0 or owners[i] != owners[s] or owners[i] != jax.process_index():
                continue
            for a, b in ((i, s), (s, i)):
                if not peer_access(int(ordinals[a]), int(ordinals[b])):
                    return None, f"GPU {ordinals[a]} cannot map GPU {ordinals[b]}'s memory"
    kind = "blocks over the process link" if platform == "cpu" and links else "peer copies"
    where = (f"{len(processes)} processes {processes}" if links is not None else "this process")
    return (ordinals, sources, links), f"{platform} {kind} between {mesh.size} devices of {where}"


# How long a call across processes waits for a peer (its block, its link).
TIMEOUT_ENV = "JAX_TMA_PPERMUTE_TIMEOUT_S"
_DEFAULT_TIMEOUT_S = 30.0
_link_lock = threading.Lock()
_own_link: list[str] = []  # this process's link name, once it listens
# Device id -> ordinal in its process, as the processes published them: JAX
# does not tell another process's GPU ordinals.
_published_ordinals: dict[int, int] = {}


def timeout_ms() -> int:
    raw = os.environ.get(TIMEOUT_ENV, str(_DEFAULT_TIMEOUT_S))
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < 2**31 / 1000:
        raise ValueError(f"{_OP}: {TIMEOUT_ENV}={raw!r} is not a number of seconds in "
                         f"(0, {2**31 // 1000})")
    return max(1, round(seconds * 1000))


def _host() -> str:
    """This machine, as far as abstract Unix sockets reach: its name and boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}/{boot}"


def _process_links(processes: list[int]) -> tuple[list[str] | None, str]:
    """The link name of every process by index (those not in `processes`
    empty), this process listening on its own; or None and why the
    processes cannot be linked. The names, each process's pid (which the
    link checks every connection against) and device ordinals (kept in
    `_published_ordinals`) travel through jax.distributed's key-value
    store."""
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None:
        return None, "jax.distributed is not initialized (its key-value store finds the peers)"
    me, host, timeout = jax.process_index(), _host(), timeout_ms()
    with _link_lock:
        if not _own_link:
            name = f"jax_tma.{uuid.uuid4().hex}"
            _ffi._ext.listen_link(name, me, timeout)
            threading.Thread(target=_log_link_refusals, name="jax_tma link refusals",
                             daemon=True).start()
            ordinals = " ".join(f"{d.id}:{_ordinal(d)}" for d in jax.local_devices())
            client.key_value_set(f"jax_tma/ppermute/link/{me}",
                                 f"{host}\n{name}\n{os.getpid()}\n{ordinals}")
            _own_link.append(name)
    names = [""] * (max(processes) + 1)
    for q in processes:
        try:
            value = client.blocking_key_value_get(f"jax_tma/ppermute/link/{q}", timeout)
        except Exception as e:  # jax raises its runtime error on a timeout
            raise RuntimeError(
                f"{_OP}: process {q} did not publish its link within {timeout / 1000:g} s "
                f"({TIMEOUT_ENV}): it does not run this program, or has not reached this "
                f"ppermute yet") from e
        their_host, names[q], pid, ordinals = value.split("\n")
        for pair in ordinals.split():
            device, ordinal = map(int, pair.split(":"))
            _published_ordinals[device] = ordinal
        if their_host != host:
            return None, (f"process {q} runs on another host ({their_host.split('/')[0]}); "
                          f"the process link joins the processes of one host")
        if q != me:
            _ffi._ext.know_link_peer(q, names[q], int(pid))
    return names, ""


def _log_link_refusals() -> None:
    """Logs each connection that the process link refused (or closed for
    breaking its wire format) once, at WARNING on the "jax_tma" logger, with
    the other side's pid and uid. The link's C++ threads only queue them and
    signal an eventfd, on which this daemon thread waits in os.read: no C++
    thread takes the GIL, and nothing holds up the interpreter's exit."""
    signal = _ffi._ext.link_refusal_signal()
    if signal < 0:
        _log.warning("%s: the process link has no eventfd to signal refusals with; "
                     "connections it refuses are not logged", _OP)
        return
    while True:
        os.read(signal, 8)
        for line in _ffi._ext.link_refusals():
            _log.warning("%s", line)


def _ppermute_lowering(ctx, x, *, axis_name, perm, method, direction, site, platform):
    """The jax_tma_ppermute call where `transport` allows it; lax.ppermute
    otherwise, with the same result. Which one a call site got, and why, is
    logged at DEBUG level on the "jax_tma" logger."""
    plan, why = transport(ctx, axis_name=axis_name, perm=perm, platform=platform)
    where = f"{_OP} over {axis_name} at {site}"
    if plan is None:
        _log.debug("%s: lax.ppermute, because %s", where, why)
        return _fallback(ctx, x, axis_name=axis_name, perm=perm)
    _log.debug("%s: jax_tma_ppermute (%s, method %s, %s)", where, why, method, direction)
    ordinals, sources, links = plan
    mesh = mesh_of(ctx)
    return jax.ffi.ffi_lowering("jax_tma_ppermute")(
        ctx, x, instance=np.int64(next(instances)), devices=ordinals,
        sources=sources, push=direction == "push", method=method,
        process=np.int64(jax.process_index()),
        processes=np.array([d.process_index for d in mesh.devices.flat], np.int64),
        links="\n".join(links or ()), site=site, timeout_ms=np.int64(timeout_ms()),
    )


# ---- vmap -------------------------------------------------------------------

def _ppermute_batcher(args, dims, **params):
    (x,), (d,) = args, dims
    return ppermute_p.bind(x, **params), d


# ---- AD ---------------------------------------------------------------------

def _inverse(perm):
    return tuple((dst, src) for src, dst in perm)


def _ppermute_transpose(ct, x, *, perm, **params):
    # A permutation is linear; its transpose sends every block back where it
    # came from (devices that sent nothing get a zero cotangent).
    return [ppermute_p.bind(ct, perm=_inverse(perm), **params)]


# ---- registration -----------------------------------------------------------

# The output has the input's shape, dtype and varying-mesh-axes.
_lowering.register(ppermute_p, lambda x, **_: x,
                   {p: functools.partial(_ppermute_lowering, platform=p) for p in ("cpu", "cuda")},
                   batcher=_ppermute_batcher, jitted=False)
ad.deflinear2(ppermute_p, _ppermute_transpose)
