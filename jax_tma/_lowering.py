"""Lowering helpers every op shares: an eager implementation through jit,
result avals that keep an operand's sharding and varying mesh axes, FFI
lowerings that XLA partitions without collectives (batch-partitionable
calls with Shardy rules), and the fill attribute."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.extend.mlir.dialects import stablehlo as hlo
from jax.interpreters import batching, mlir


# A fill of zero bytes, whatever the dtype (the transposes' and tangents').
ZERO_BITS = b"\0"


def fill_attr(fills: Sequence[bytes]) -> np.ndarray:
    """The "fill" attribute of a call (ffi/fill.h): each output's fill
    element (`fills`, its bytes) repeated to 16 bytes, as two little-endian
    int64 words."""
    return np.frombuffer(b"".join(f * (16 // len(f)) for f in fills), "<i8").astype(np.int64)


@functools.cache
def _jitted_bind(prim, params: tuple):
    return jax.jit(functools.partial(prim.bind, **dict(params)))


def def_jitted_impl(prim) -> None:
    """Gives `prim` an eager implementation that runs it under jit: the FFI
    call exists only as a lowering. One compiled program per set of params.
    Under `jax.disable_jit()` the primitive still compiles (as jax's own
    primitives do): without jit its bind would call this impl again."""

    def impl(*args, **params):
        with jax.disable_jit(False):
            return _jitted_bind(prim, tuple(sorted(params.items())))(*args)

    prim.def_impl(impl)


def register(prim, abstract_eval, lowering, *, batcher=None, jitted: bool = True) -> None:
    """Registers `prim`'s abstract evaluation, its eager implementation
    through jit (def_jitted_impl) where `jitted`, its lowering (one rule for
    every platform, or {"cpu": rule, "cuda": rule}) and its vmap rule; the
    op modules' registration blocks call it, then register their AD rules."""
    prim.def_abstract_eval(abstract_eval)
    if jitted:
        def_jitted_impl(prim)
    rules = lowering if isinstance(lowering, dict) else {"cpu": lowering, "cuda": lowering}
    for platform, rule in rules.items():
        mlir.register_lowering(prim, rule, platform=platform)
    if batcher is not None:
        batching.primitive_batchers[prim] = batcher


def out_aval(like, shape: Sequence[Any], dtype=None, spec: Sequence[Any] | None = None):
    """An abstract result shaped `shape` that keeps everything else of `like`
    (an operand's aval): its varying mesh axes (shard_map's vma), memory
    space and mesh. `spec` gives the result's PartitionSpec, one entry per
    dim (default: `like`'s own, which needs the same rank); explicit mesh
    axes in it are the result's sharding type, as jax's own rules give."""
    sharding = like.sharding
    if spec is None:
        spec = tuple(sharding.spec) + (None,) * (len(shape) - len(sharding.spec))
    sharding = sharding.update(spec=jax.sharding.PartitionSpec(*spec))
    return like.update(shape=tuple(shape), dtype=like.dtype if dtype is None else dtype,
                       weak_type=False, sharding=sharding)


def spec_of(aval) -> tuple:
    """`aval`'s PartitionSpec as one entry per dim (None where unsharded)."""
    spec = tuple(aval.sharding.spec)
    return spec + (None,) * (len(aval.shape) - len(spec))


def static_shape(*avals) -> bool:
    """Whether every dim of every aval is a plain int (no symbolic dims of a
    shape-polymorphic export)."""
    return all(isinstance(d, int) for a in avals for d in a.shape)


def require_devices_during_lowering(prim) -> None:
    """Asks jax to hand `prim`'s lowering the program's devices, which
    custom_partitioning needs. jax has no public way to ask (checked 0.10.2
    to 0.12.0.1); without it every program takes the single-device path
    (still exact: XLA gathers the operands)."""
    try:
        from jax._src import dispatch

        dispatch.prim_requires_devices_during_lowering.add(prim)
    except (ImportError, AttributeError):
        pass


def single_device(ctx) -> bool:
    """Whether the program being lowered runs on one device (or has no device
    assignment yet): nothing to partition, the FFI call is lowered directly."""
    devices = getattr(ctx.module_context.axis_context, "device_assignment", ())
    return devices is None or len(devices) <= 1


def partitioned(ctx) -> bool:
    """Whether a call is lowered through custom_partitioning: a program on
    several devices, with static shapes (symbolic dims of a
    shape-polymorphic export have no partitioning rule; XLA keeps such
    operands whole)."""
    return not single_device(ctx) and static_shape(*ctx.avals_in, *ctx.avals_out)


def mesh_axes(entry) -> tuple:
    """The mesh axes of one PartitionSpec entry (None, a name or a tuple)."""
    return () if entry is None else entry if isinstance(entry, tuple) else (entry,)


def sharding_spec(sharding, ndim: int) -> list:
    """A custom_partitioning operand's PartitionSpec as one entry per dim
    (None where unsharded); a sharding that is not a NamedSharding counts as
    replicated."""
    spec = tuple(sharding.spec) if isinstance(sharding, jax.sharding.NamedSharding) else ()
    return list(spec) + [None] * (ndim - len(spec))


def sharding_rule(*operands, results) -> str:
    """A custom_partitioning sharding_rule: each operand and result a list of
    factor names, one per dim."""
    join = lambda groups: ", ".join(" ".join(g) for g in groups)  # noqa: E731
    return f"{join(operands)} -> {join(results)}"


def _sdy_rule(shapes_in: Sequence[Sequence[int]],
              shapes_out: Sequence[Sequence[int]], batch: int):
    """An sdy.op_sharding_rule where the first `batch` dims of every operand
    and result are shared factors and the rest are private to each tensor."""
    # Shardy spells factors i..z, then z_1, z_2, ...
    names = iter(chr(ord("i") + n) if n < 18 else f"z_{n - 17}" for n in range(10_000))
    sizes: dict[str, int] = {}
    shared = [next(names) for _ in range(batch)]
    for name, size in zip(shared, shapes_in[0][:batch]):
        sizes[name] = size

    def mapping(shape: Sequence[int]) -> str:
        own = [next(names) for _ in shape[batch:]]
        sizes.update(zip(own, shape[batch:]))
        return "[" + ", ".join(shared + own) + "]"

    lhs = ", ".join(mapping(s) for s in shapes_in)
    rhs = ", ".join(mapping(s) for s in shapes_out)
    factors = ", ".join(f"{k}={v}" for k, v in sizes.items())
    return mlir.ir.Attribute.parse(
        f"#sdy.op_sharding_rule<({lhs})->({rhs}) {{{factors}}}>"
    )


def batch_partitioned_lowering(target: str, num_batch_dims: int):
    """An FFI lowering whose first `num_batch_dims` dimensions (of every
    operand and result) XLA partitions without collectives; each device's
    handler sees only its shard."""
    base = jax.ffi.ffi_lowering

    def rule(ctx, *args, **attrs):
        extra = {
            "mhlo.frontend_attributes": mlir.ir_attribute(
                {"num_batch_dims": str(num_batch_dims)}
            )
        }
        # A Shardy rule names each factor's size; symbolic dims (a
        # shape-polymorphic export) have none, and then the call has no rule
        # (Shardy keeps its operands whole), as jax's own linalg calls do.
        if jax.config.jax_use_shardy_partitioner and static_shape(*ctx.avals_in, *ctx.avals_out):
            extra["sdy.sharding_rule"] = _sdy_rule(
                [a.shape for a in ctx.avals_in],
                [a.shape for a in ctx.avals_out],
                num_batch_dims,
            )
        return base(target, extra_attributes=extra)(ctx, *args, **attrs)

    return rule


def elementwise_lowering(target: str):
    """An FFI lowering for a handler that treats all elements alike, so XLA may
    split every dimension. XLA's batch partitioner wants at least one
    non-batch dimension, so operands and results get a trailing unit
    dimension (a bitcast) around the call."""

    def unit(aval):
        return jax.core.ShapedArray(tuple(aval.shape) + (1,), aval.dtype)

    def rule(ctx, *args, **attrs):
        if not static_shape(*ctx.avals_in, *ctx.avals_out):
            # Symbolic dims: no partitioning rule to give, so no unit dims.
            return jax.ffi.ffi_lowering(target)(ctx, *args, **attrs)
        avals_in = [unit(a) for a in ctx.avals_in]
        avals_out = [unit(a) for a in ctx.avals_out]
        wide = [hlo.reshape(mlir.aval_to_ir_type(ctx.module_context, a), x) for a, x in zip(avals_in, args)]
        inner = batch_partitioned_lowering(target, len(ctx.avals_in[0].shape))
        outs = inner(ctx.replace(avals_in=avals_in, avals_out=avals_out), *wide, **attrs)
        return [
            hlo.reshape(mlir.aval_to_ir_type(ctx.module_context, a), y) for a, y in zip(ctx.avals_out, outs)
        ]

    return rule
