"""jax_tma.broadcast: n materialised replicas of an array along a new axis, as
a JAX primitive (jit, vmap folded into the call, linear AD whose transpose
sums the replicas, and partitioning of every input dim without collectives)."""

from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import ad, mlir
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_tma import _checks, _ffi, _lowering

BroadcastMethod = Literal["auto", "multicast", "dsmem", "store", "simt"]
_METHODS = ("auto", "multicast", "dsmem", "store", "simt")
_CLUSTERED = ("multicast", "dsmem")
_OP = "jax_tma.broadcast"


# ---- the public op ----------------------------------------------------------

def broadcast(
    x: jax.Array | np.ndarray,
    n: int,
    *,
    axis: int = 0,
    method: BroadcastMethod = "auto",
    cluster_size: int | None = None,
) -> jax.Array:
    """``n`` materialised replicas of ``x`` stacked along a new axis ``axis``:
    ``jnp.broadcast_to(jnp.expand_dims(x, axis), ...)`` as a real buffer,
    bit for bit.

    With ``axis=k + 1`` and a reshape it is ``jnp.repeat(x, n, axis=k)``,
    e.g. repeating the key/value heads of grouped-query attention
    (``examples/gqa_repeat_kv.py``). On Hopper GPUs each input tile is read
    from memory once, not once per replica: the tiles move through shared
    memory with the Tensor Memory Accelerator and are stored ``n`` times
    with tensor stores. Works under ``jit``, ``vmap`` (folded into one
    call), ``grad`` (the transpose sums the replica axis), ``shard_map`` and
    on sharded arrays (every dim of ``x`` may be split; the replica axis is
    never split and no collectives are inserted); on explicit mesh axes the
    result is typed as ``jnp.broadcast_to``'s, and in a shape-polymorphic
    ``jax.export`` any dim of ``x`` may be symbolic.

    ``method="auto"`` takes ``"store"`` for outputs over 8 MiB wherever the
    tensor-map rules hold (the replica, ``x.shape[axis:]``, a multiple of 16
    bytes), and ``"simt"`` for smaller outputs (there the store kernel has too
    few tiles to fill the GPU), every other shape and on GPUs without TMA
    (compute capability below 9.0).

    Args:
      x: an array of any shape and dtype (sub-byte types are widened around
        the call).
      n: the number of replicas, an int in ``[1, 2^31)``.
      axis: where the replica axis goes in the output, in
        ``[-(x.ndim + 1), x.ndim]`` (negative counts from the end).
      method: ``"auto"`` (the rule above), ``"store"`` (one CTA loads a
        tile and issues all ``n`` stores; no cluster), ``"multicast"`` (a
        thread-block cluster loads each tile once with
        ``cp.async.bulk.tensor .multicast::cluster``, every CTA receives it
        and stores its share of the replicas; it also needs at least
        ``cluster_size`` rows a tile, each CTA's slice a multiple of 128
        bytes), ``"dsmem"`` (CTA 0 of a cluster loads the tile and it
        travels SM to SM into the peers' shared memory) or ``"simt"`` (a
        vectorised CUDA kernel). The TMA methods need the replica to be a
        multiple of 16 bytes. On the CPU every method gives the same host
        copy.
      cluster_size: CTAs per cluster for ``"multicast"``/``"dsmem"``: 2, 4,
        8 or 16 (16 where the GPU allows non-portable clusters); ``None``
        means 2. Must be ``None`` for the other methods.

    Returns:
      An array of shape ``x.shape[:axis] + (n,) + x.shape[axis:]`` and
      ``x``'s dtype.

    Raises:
      TypeError: ``x`` is not an array or scalar, or ``n`` or ``axis`` is
        not an int.
      ValueError: ``n`` is outside ``[1, 2^31 - 1]``; ``axis`` is out of
        range; ``method`` is not one of the five names; ``cluster_size`` is
        given for a method without clusters, or is not 2, 4, 8 or 16.
      RuntimeError: ``"store"``, ``"multicast"`` or ``"dsmem"`` is lowered
        for a GPU without TMA (compute capability below 9.0).
      jax.errors.JaxRuntimeError: on a GPU, a forced TMA method that cannot
        run the shape, or a cluster size the device cannot launch; the
        message names the rule.

    Examples:
      >>> import jax, jax.numpy as jnp, jax_tma
      >>> x = jnp.arange(6).reshape(2, 3)
      >>> jax_tma.broadcast(x, 2, axis=1).tolist()
      [[[0, 1, 2], [0, 1, 2]], [[3, 4, 5], [3, 4, 5]]]
      >>> bool((jax.jit(jax_tma.broadcast, static_argnums=1)(x, 4)
      ...       == jnp.broadcast_to(x, (4, 2, 3))).all())
      True
      >>> bool((jax_tma.broadcast(x, 2, axis=2).reshape(2, 6) == jnp.repeat(x, 2, axis=1)).all())
      True
      >>> jax_tma.broadcast(x, 2, cluster_size=4)
      Traceback (most recent call last):
        ...
      ValueError: jax_tma.broadcast: cluster_size=4 needs method='multicast' or 'dsmem', got method='auto'
    """
    x = _checks.as_array(_OP, "x", x)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"{_OP}: n must be an int, got {n!r}")
    if not 1 <= n <= _checks.MAX_DIM:
        raise ValueError(f"{_OP}: n = {n} is outside [1, 2^31 - 1]")
    _checks.check_choice(_OP, "method", method, _METHODS)
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{_OP}: axis must be an int, got {axis!r}")
    if not -(x.ndim + 1) <= axis <= x.ndim:
        raise ValueError(
            f"{_OP}: axis {axis} is out of range for x of rank {x.ndim} "
            f"(valid: {-(x.ndim + 1)} to {x.ndim})"
        )
    axis = int(axis) % (x.ndim + 1)
    if cluster_size is not None and method not in _CLUSTERED:
        raise ValueError(
            f"{_OP}: cluster_size={cluster_size!r} needs method='multicast' or 'dsmem', "
            f"got method={method!r}"
        )
    sizes = _ffi.rules()["broadcast.cluster_sizes"]
    if cluster_size is not None and (isinstance(cluster_size, bool) or cluster_size not in sizes):
        raise ValueError(
            f"{_OP}: cluster_size must be {', '.join(map(str, sizes[:-1]))} or {sizes[-1]}, "
            f"got {cluster_size!r}"
        )
    _ffi.register()
    params = dict(n=int(n), axis=axis, method=method, cluster_size=int(cluster_size or 0))
    return _checks.narrow(broadcast_p.bind(_checks.widen(x), **params), x.dtype)


# ---- primitives -------------------------------------------------------------

# broadcast_p(x): y = x with a replica dim of size n inserted at axis.
# cluster_size is 0 when the launcher chooses. Its lowering partitions every
# dim of x (custom_partitioning) and each device runs broadcast_local_p, the
# FFI call, on its shard.
broadcast_p = Primitive("jax_tma_broadcast")
broadcast_local_p = Primitive("jax_tma_broadcast_local")


def _out_shape(shape, n, axis):
    return tuple(shape[:axis]) + (n,) + tuple(shape[axis:])


def _abstract(x, *, n, axis, method, cluster_size):
    # As jnp.broadcast_to types it: x's dims keep their mesh axes (and x's
    # varying axes and weak type carry over), the replica dim is whole.
    spec = _lowering.spec_of(x)
    out = _lowering.out_aval(x, _out_shape(x.shape, n, axis),
                             spec=spec[:axis] + (None,) + spec[axis:])
    return out.update(weak_type=x.weak_type)


# ---- lowering and partitioning ----------------------------------------------

def _local_lowering(ctx, x, *, n, axis, method, cluster_size):
    return jax.ffi.ffi_lowering("jax_tma_broadcast")(
        ctx, x, axis=np.int64(axis), method=method, cluster_size=np.int64(cluster_size))


def _replica_spec(x_spec, ndim: int, axis: int) -> P:
    """x's partition spec with an unsplit replica dim inserted at axis."""
    s = tuple(x_spec) + (None,) * (ndim - len(tuple(x_spec)))
    return P(*s[:axis], None, *s[axis:])


@functools.cache
def _partitioned(ndim: int, n: int, axis: int, method: str, cluster_size: int):
    """broadcast_local_p under custom_partitioning: every dim of x keeps its
    sharding, the replica dim is never split, no data moves between devices."""

    def local(x):
        return broadcast_local_p.bind(x, n=n, axis=axis, method=method, cluster_size=cluster_size)

    def x_sharding(mesh, arg_shapes):
        sharding = arg_shapes[0].sharding
        return sharding if isinstance(sharding, NamedSharding) else NamedSharding(mesh, P())

    def infer(mesh, arg_shapes, result_shape):
        return NamedSharding(mesh, _replica_spec(x_sharding(mesh, arg_shapes).spec, ndim, axis))

    def partition(mesh, arg_shapes, result_shape):
        return mesh, local, infer(mesh, arg_shapes, result_shape), (x_sharding(mesh, arg_shapes),)

    names = [f"d{i}" for i in range(ndim)]
    rule = " ".join(names) + " -> " + " ".join(names[:axis] + ["replica"] + names[axis:])
    f = custom_partitioning(local)
    f.def_partition(infer_sharding_from_operands=infer, partition=partition, sharding_rule=rule)
    return f


def _broadcast_lowering(ctx, x, *, n, axis, method, cluster_size):
    ndim = ctx.avals_in[0].ndim
    # A program for one device (or none yet) and a 0-d x have nothing to
    # split; symbolic dims (a shape-polymorphic export) have no partitioning
    # rule, and XLA keeps x whole.
    if ndim == 0 or _lowering.single_device(ctx) or not _lowering.static_shape(*ctx.avals_in):
        return _local_lowering(ctx, x, n=n, axis=axis, method=method, cluster_size=cluster_size)
    f = _partitioned(ndim, n, axis, method, cluster_size)
    return mlir.lower_fun(f, multiple_results=False)(ctx, x)


def _cuda_lowering(ctx, x, *, n, axis, method, cluster_size):
    if method in ("multicast", "dsmem", "store"):
        _checks.require_tma(
            _OP, method, "thread-block clusters and TMA" if method in _CLUSTERED else "TMA")
    return _broadcast_lowering(ctx, x, n=n, axis=axis, method=method, cluster_size=cluster_size)


# ---- vmap -------------------------------------------------------------------

def _batcher(args, dims, *, axis, **params):
    (x,), (d,) = args, dims
    x = jnp.moveaxis(x, d, 0)
    return broadcast_p.bind(x, axis=axis + 1, **params), 0


# ---- AD ---------------------------------------------------------------------

def _broadcast_transpose(ct, x, *, n, axis, method, cluster_size):
    # Linear: the tangent is broadcast too; the cotangent of x is the sum of
    # the replicas' cotangents.
    return [jnp.sum(ct, axis=axis, dtype=ct.dtype)]


# ---- registration -----------------------------------------------------------

_lowering.register(broadcast_p, _abstract, {"cpu": _broadcast_lowering, "cuda": _cuda_lowering},
                   batcher=_batcher)
_lowering.register(broadcast_local_p, _abstract, _local_lowering, jitted=False)
_lowering.require_devices_during_lowering(broadcast_p)
ad.deflinear2(broadcast_p, _broadcast_transpose)
