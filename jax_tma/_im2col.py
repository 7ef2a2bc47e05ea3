"""jax_tma.im2col / jax_tma.col2im: convolution patches of channels-last
1D/2D/3D inputs and their transpose (overlapping patches sum), as JAX
primitives (jit, vmap folded into the batch dim, linear AD in both
directions, the batch dim N partitioned without collectives)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, mlir

from jax_tma import _checks, _ffi, _lowering

Im2colMethod = Literal["auto", "tma", "simt"]
PatchOrder = Literal["tap_major", "channel_major"]
Padding = str | Sequence[tuple[int, int]]
_METHODS = ("auto", "tma", "simt")
_ORDERS = ("tap_major", "channel_major")
_OP = "jax_tma.im2col"
_OP_T = "jax_tma.col2im"
_MAX_ROW = 2**63 - 1  # XLA dims are int64


# ---- the public ops -----------------------------------------------------------

def im2col(
    x: jax.Array | np.ndarray,
    kernel_size: int | Sequence[int],
    *,
    strides: int | Sequence[int] = 1,
    padding: Padding = "VALID",
    dilation: int | Sequence[int] = 1,
    order: PatchOrder = "tap_major",
    method: Im2colMethod = "auto",
) -> jax.Array:
    """The patch matrix of a convolution over channels-last ``x``.

    For ``x`` of shape ``(N, *S, C)`` (NWC, NHWC or NDHWC) returns
    ``(N, *O, prod(kernel_size) * C)`` where ``O`` is the convolution's output
    size. With ``order="tap_major"`` (default) the last axis runs over
    (kernel taps..., channel), so ``im2col(x, k, ...) @ w.reshape(-1, O)``
    equals ``lax.conv_general_dilated(x, w, ...)`` for HWIO weights ``w``;
    ``order="channel_major"`` gives ``lax.conv_general_dilated_patches``'s
    (channel, taps...) order, bit for bit. Padded pixels read as zero, as jnp
    writes it in ``x``'s dtype (``float8_e8m0fnu``, which has no zero, gets
    its NaN 0xFF as from ``jnp.pad``); values are moved bit for bit (any
    dtype). Where the dilated kernel is larger than the padded input, that
    output dim is 0 and the result is empty, as with
    ``lax.conv_general_dilated_patches``.

    Works under ``jit``, ``vmap`` (extra batch dims folded into ``N``, one
    call), ``grad`` (the transpose is :func:`col2im`), ``shard_map`` and on
    arrays sharded along ``N`` (no collectives; the spatial dims are
    replicated); on explicit mesh axes the result is typed as
    ``lax.conv_general_dilated_patches``'s. In a shape-polymorphic
    ``jax.export`` only ``N`` may be symbolic.

    ``method="auto"`` always takes the SIMT kernel (16-byte accesses,
    several taps in flight per thread); the TMA im2col path runs only when
    asked for.

    Args:
      x: ``(N, *S, C)`` with 1 to 3 spatial dims, any dtype (sub-byte types
        are widened around the call).
      kernel_size: the kernel's spatial size: an int or one int >= 1 per
        spatial dim.
      strides: convolution strides >= 1 (an int or one per spatial dim).
      padding: ``"VALID"``, ``"SAME"`` or ``"SAME_LOWER"`` (lax's
        conventions: ``SAME`` pads an odd excess more on the high side,
        ``SAME_LOWER`` on the low side) or one ``(low, high)`` pair of ints
        >= 0 per spatial dim (asymmetric, larger than the kernel allowed).
      dilation: kernel dilation >= 1 (an int or one per spatial dim).
      order: ``"tap_major"`` or ``"channel_major"``.
      method: ``"auto"`` (the rule above), ``"tma"`` (the TMA im2col mode:
        ``cuTensorMapEncodeIm2col`` with the padding and dilation in the
        pixel-box corners, one ``cp.async.bulk.tensor`` im2col load per
        kernel tap and a tiled tensor store of it; tap-major order,
        channels x element size a multiple of 16 bytes, strides up to 8,
        the pixel-box corners in the hardware's range) or ``"simt"``. On the
        CPU every method gives the same result.

    Returns:
      ``(N, *O, prod(kernel_size) * C)`` with ``x``'s dtype.

    Raises:
      TypeError: ``x`` is not an array or scalar; ``kernel_size``,
        ``strides`` or ``dilation`` is not an int or a sequence of ints; a
        spatial dim or ``C`` is symbolic.
      ValueError: ``x`` is not of rank 3, 4 or 5; ``kernel_size``,
        ``strides`` or ``dilation`` has not one entry per spatial dim or an
        entry below 1; ``padding`` is not ``"VALID"``, ``"SAME"``,
        ``"SAME_LOWER"`` or one pair of ints >= 0 per spatial dim; a patch row would exceed
        2^63 - 1 entries; ``order`` or ``method`` is not one of its names;
        under an explicit mesh, ``x``'s channel dim is split, or a spatial
        split does not divide the output; ``method="tma"`` with
        ``order="channel_major"`` (no TMA path on any device: refused on the
        CPU too, as on a GPU).
      jax.errors.JaxRuntimeError: on a GPU, ``method="tma"`` where a
        hardware rule is broken or the GPU has no TMA; the message names
        the rule.

    Examples:
      >>> import jax, jax.numpy as jnp, jax_tma
      >>> from jax import lax
      >>> x = jnp.arange(8.0).reshape(1, 4, 2)      # N=1, W=4, C=2
      >>> jax_tma.im2col(x, 2, strides=2)[0].tolist()
      [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
      >>> img = jnp.arange(2 * 5 * 5 * 3.0).reshape(2, 5, 5, 3)
      >>> patches = jax_tma.im2col(img, 3, padding="SAME", order="channel_major")
      >>> xla = lax.conv_general_dilated_patches(img, (3, 3), (1, 1), "SAME",
      ...                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))
      >>> patches.shape, bool((patches == xla).all())
      ((2, 5, 5, 27), True)
      >>> jax_tma.im2col(img, 3, padding=((-1, 0), (0, 0)))
      Traceback (most recent call last):
        ...
      ValueError: jax_tma.im2col: padding[0] = (-1, 0) is negative (padding must be >= 0; crop x first)
    """
    x = _checks.as_array(_OP, "x", x)
    kernel, strides, pads, dilation, _ = _geometry(_OP, x.shape, kernel_size, strides,
                                                   padding, dilation)
    _options(_OP, order, method)
    if method == "tma" and order == "channel_major":  # on every platform, as the handlers
        raise ValueError(f"{_OP}: method='tma' cannot run this im2col: "
                         f"{_ffi.rules()['im2col.tma_channel_major']}")
    _ffi.register()
    y = im2col_p.bind(_checks.widen(x), kernel=kernel, strides=strides, padding=pads,
                      dilation=dilation, order=order, method=method)
    return _checks.narrow(y, x.dtype)


def col2im(
    patches: jax.Array | np.ndarray,
    input_shape: Sequence[int],
    kernel_size: int | Sequence[int],
    *,
    strides: int | Sequence[int] = 1,
    padding: Padding = "VALID",
    dilation: int | Sequence[int] = 1,
    order: PatchOrder = "tap_major",
    method: Im2colMethod = "auto",
) -> jax.Array:
    """The transpose of :func:`im2col`: every patch entry added back onto the
    input pixel it was read from (overlapping patches sum; padding drops).

    ``patches`` has the shape ``im2col`` gives for an input of shape
    ``input_shape`` with the same geometry; the result has ``input_shape``.
    Each input element sums its patch entries in increasing tap order: in
    float32 for floats narrower than 32 bits (16-bit, 8-bit and 4-bit
    formats; rounded once to the element type as XLA converts: to nearest
    even, past the format's range to its inf, else its NaN, else its largest
    value), in the element type otherwise (integers wrap, sub-byte ones at
    their width; subnormals kept); a NaN result is stored as ``np.nan``'s
    bits in the element type, so CPU and GPU results are identical bit for
    bit. A float sum starts from -0.0 (IEEE's additive identity): an element
    whose entries are all -0.0 is -0.0 (as XLA's grad of a lone slice gives
    a -0.0 cotangent back), one that no patch reads is +0.0. ``jax.grad`` of ``im2col`` is this op, and
    this op's is ``im2col``.
    An empty ``patches`` (an output dim of 0: the dilated kernel is larger
    than the padded input) gives zeros (``float8_e8m0fnu``: its NaN, jnp's
    zero there). Works under ``jit``, ``vmap``, ``grad``, ``shard_map`` and
    on arrays sharded along ``N``, as :func:`im2col` does.

    ``method="auto"`` and ``"simt"`` are the same: a gather kernel in which
    each input element sums its own entries (no atomics, so the order of
    the sums is fixed). There is no TMA path: the hardware's reduce-add
    tensor store would sum in an unspecified order.

    Args:
      patches: ``(N, *O, prod(kernel_size) * C)``; any numeric dtype (not
        bool).
      input_shape: ``(N, *S, C)`` of the input of the matching ``im2col``,
        ints >= 0; ``N`` may be a symbolic dim of a shape-polymorphic export.
      kernel_size: as for :func:`im2col`.
      strides: as for :func:`im2col`.
      padding: as for :func:`im2col`.
      dilation: as for :func:`im2col`.
      order: as for :func:`im2col`.
      method: ``"auto"`` or ``"simt"`` (the rule above).

    Returns:
      An array of shape ``input_shape`` and ``patches``' dtype.

    Raises:
      TypeError: ``patches`` is not an array or is of dtype bool;
        ``input_shape`` is not a sequence of ints >= 0; the geometry's
        arguments are of the wrong kind (as for :func:`im2col`).
      ValueError: ``method="tma"`` (col2im has no TMA path) or another
        unknown name; ``patches.shape`` is not what ``im2col`` gives for
        ``input_shape``; a geometry rule of :func:`im2col` is broken.

    Examples:
      >>> import jax, jax.numpy as jnp, jax_tma
      >>> p = jnp.ones((1, 3, 2))                   # 3 windows of 2 taps, C=1
      >>> jax_tma.col2im(p, (1, 4, 1), 2)[0, :, 0].tolist()   # taps that read each pixel
      [1.0, 2.0, 2.0, 1.0]
      >>> x = jnp.arange(4.0).reshape(1, 4, 1)
      >>> g = jax.grad(lambda x: jax_tma.im2col(x, 2).sum())(x)
      >>> bool((g == jax_tma.col2im(jnp.ones((1, 3, 2)), x.shape, 2)).all())
      True
      >>> jax_tma.col2im(p, (1, 5, 1), 2)
      Traceback (most recent call last):
        ...
      ValueError: jax_tma.col2im: patches.shape=(1, 3, 2) but im2col of input_shape=(1, 5, 1) gives (1, 4, 2)
    """
    patches = _checks.as_array(_OP_T, "patches", patches)
    if (not isinstance(input_shape, Sequence) or isinstance(input_shape, str)
            or any(not jax.export.is_symbolic_dim(v) and (
                isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0)
                   for v in input_shape)):
        raise TypeError(f"{_OP_T}: input_shape must be a sequence of ints >= 0, "
                        f"got {input_shape!r}")
    input_shape = tuple(v if jax.export.is_symbolic_dim(v) else int(v) for v in input_shape)
    kernel, strides, pads, dilation, o = _geometry(_OP_T, input_shape, kernel_size, strides,
                                                   padding, dilation)
    _options(_OP_T, order, method)
    if method == "tma":
        raise ValueError(f"{_OP_T}: method must be 'auto' or 'simt', got 'tma' (col2im has "
                         f"no TMA path: the gather kernel is deterministic for every dtype)")
    want = (input_shape[0], *o, math.prod(kernel) * input_shape[-1])
    if tuple(patches.shape) != want:
        raise ValueError(f"{_OP_T}: patches.shape={tuple(patches.shape)} but im2col of "
                         f"input_shape={input_shape} gives {want}")
    if patches.dtype == np.bool_:
        raise TypeError(f"{_OP_T}: patches of dtype bool cannot be summed (integer, float or "
                        f"complex)")
    _ffi.register()
    y = col2im_p.bind(_checks.widen(patches), in_spatial=tuple(input_shape[1:-1]),
                      kernel=kernel, strides=strides, padding=pads, dilation=dilation,
                      order=order, method=method)
    return _checks.narrow(y, patches.dtype)


# ---- argument checks ----------------------------------------------------------

def _pads(op: str, padding: Any, spatial, kernel, strides, dilation) -> tuple[tuple[int, int], ...]:
    r = len(spatial)
    if isinstance(padding, str):
        mode = padding.upper()
        if mode == "VALID":
            return ((0, 0),) * r
        if mode in ("SAME", "SAME_LOWER"):
            # lax's SAME: output ceil(S / s), the excess split with the
            # smaller half low; SAME_LOWER puts the larger half low.
            out = []
            for s, k, st, d in zip(spatial, kernel, strides, dilation):
                total = max((-(-s // st) - 1) * st + d * (k - 1) + 1 - s, 0)
                small, large = total // 2, total - total // 2
                out.append((small, large) if mode == "SAME" else (large, small))
            return tuple(out)
        raise ValueError(f"{op}: padding must be 'VALID', 'SAME', 'SAME_LOWER' or {r} "
                         f"(low, high) pairs, got {padding!r}")
    if not isinstance(padding, Sequence) or len(padding) != r:
        raise ValueError(f"{op}: padding must be 'VALID', 'SAME', 'SAME_LOWER' or {r} "
                         f"(low, high) pairs, got {padding!r}")
    out = []
    for i, pair in enumerate(padding):
        if (not isinstance(pair, Sequence) or isinstance(pair, str) or len(pair) != 2
                or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in pair)):
            raise ValueError(f"{op}: padding[{i}] must be a (low, high) pair of ints, "
                             f"got {pair!r}")
        lo, hi = int(pair[0]), int(pair[1])
        if lo < 0 or hi < 0:
            raise ValueError(f"{op}: padding[{i}] = {(lo, hi)} is negative (padding must be "
                             f">= 0; crop x first)")
        if lo > _checks.MAX_DIM or hi > _checks.MAX_DIM:
            raise ValueError(f"{op}: padding[{i}] = {(lo, hi)} is over 2^31 - 1")
        out.append((lo, hi))
    return tuple(out)


def _geometry(op: str, shape, kernel_size, strides, padding, dilation):
    """Checks the geometry for an input of `shape` (N, *S, C); returns the
    normalised kernel, strides, padding, dilation and output spatial dims."""
    rank = len(shape)
    if rank not in (3, 4, 5):
        raise ValueError(f"{op}: x must have rank 3, 4 or 5 (NWC, NHWC or NDHWC), got rank "
                         f"{rank} (x.shape={tuple(shape)})")
    r = rank - 2
    if not all(isinstance(d, (int, np.integer)) for d in shape[1:]):
        raise TypeError(f"{op}: only the batch dim N may be symbolic: the spatial dims and C "
                        f"set the patch geometry at trace time and must be ints, got "
                        f"x.shape={tuple(shape)}")
    spatial = tuple(shape[1:-1])
    dims = f"{r} spatial dims (x.shape={tuple(shape)})"
    kernel = _checks.per_dim_ints(op, "kernel_size", kernel_size, r, dims, scalar_ok=True)
    strides = _checks.per_dim_ints(op, "strides", strides, r, dims, scalar_ok=True)
    dilation = _checks.per_dim_ints(op, "dilation", dilation, r, dims, scalar_ok=True)
    pads = _pads(op, padding, spatial, kernel, strides, dilation)
    # A dilated kernel larger than the padded input is allowed: that output
    # dim is 0 and the patch matrix empty, as in lax.conv_general_dilated_patches.
    # Its row length must still be an XLA dimension (int64).
    if math.prod(kernel) * max(shape[-1], 1) > _MAX_ROW:
        raise ValueError(f"{op}: a patch row has prod(kernel_size) * C = {math.prod(kernel)} * "
                         f"{shape[-1]} entries, over 2^63 - 1 (kernel_size={kernel}, "
                         f"x.shape={tuple(shape)})")
    return kernel, strides, pads, dilation, out_spatial(spatial, kernel, strides, pads, dilation)


def _options(op: str, order: Any, method: Any) -> None:
    _checks.check_choice(op, "order", order, _ORDERS)
    _checks.check_choice(op, "method", method, _METHODS)


# ---- primitives -------------------------------------------------------------

# Both primitives carry the static geometry: kernel, strides, dilation and
# padding (pairs) per spatial dim, the patch order and the method.
# im2col_p(x): (N, *S, C) -> (N, *O, K*C); col2im_p(p): (N, *O, K*C) ->
# (N, *S, C) with S given by `in_spatial`.
im2col_p = Primitive("jax_tma_im2col")
col2im_p = Primitive("jax_tma_col2im")


def out_spatial(in_spatial, kernel, strides, padding, dilation) -> tuple[int, ...]:
    """Output extent per spatial dim: floor((S + lo + hi - d(k-1) - 1) / s) + 1,
    or 0 where the dilated kernel is larger than the padded input (lax's rule)."""
    return tuple(max(0, (s + lo + hi - d * (k - 1) - 1) // st + 1)
                 for s, k, st, (lo, hi), d in zip(in_spatial, kernel, strides, padding, dilation))


def _result_spec(op: str, a, out_shape, name: str, last: str) -> tuple:
    """The PartitionSpec of a result shaped `out_shape` = (N, *spatial, last)
    from the operand aval `a` of the same rank, as lax.conv_general_dilated_patches
    types it on explicit mesh axes: N keeps its axes, a spatial dim keeps its
    axes where the result's extent divides among them; the last dim must be
    whole (a patch row holds every channel of its taps)."""
    spec, mesh = _lowering.spec_of(a), a.sharding.mesh
    if spec[-1] is not None:
        whole = jax.sharding.PartitionSpec(*spec[:-1], None)
        raise ValueError(f"{op}: {name}'s {last} dim is split along mesh axes {spec[-1]!r} "
                         f"({name}: {a.str_short()}), but a patch row holds every channel of "
                         f"its taps, so that dim must be whole; reshard {name} to {whole} first")
    for d in range(1, len(out_shape) - 1):
        axes = spec[d]
        names = axes if isinstance(axes, tuple) else (axes,)
        parts = math.prod(mesh.shape[n] for n in names) if axes is not None else 1
        if out_shape[d] % parts:
            raise ValueError(f"{op}: {name}'s dim {d} is split along mesh axes {axes!r} "
                             f"({parts} parts), but the result's dim {d} has {out_shape[d]} "
                             f"elements, not a multiple of {parts} ({name}: {a.str_short()}); "
                             f"reshard that dim of {name} whole first")
    return spec[:-1] + (None,)


def _im2col_abstract(x, *, kernel, strides, padding, dilation, order, method):
    o = out_spatial(x.shape[1:-1], kernel, strides, padding, dilation)
    shape = (x.shape[0], *o, math.prod(kernel) * x.shape[-1])
    return _lowering.out_aval(x, shape, spec=_result_spec(_OP, x, shape, "x", "channel"))


def _col2im_abstract(p, *, in_spatial, kernel, strides, padding, dilation, order, method):
    shape = (p.shape[0], *in_spatial, p.shape[-1] // math.prod(kernel))
    return _lowering.out_aval(p, shape, spec=_result_spec(_OP_T, p, shape, "patches",
                                                          "taps x channels"))


# ---- lowering and partitioning ----------------------------------------------

def _call_lowering(ctx, x, *, kernel, strides, padding, dilation, order, method, transpose):
    # Every handler treats the images of the batch independently: XLA splits
    # N across devices without collectives (the spatial dims stay whole).
    rule = _lowering.batch_partitioned_lowering("jax_tma_im2col", 1)
    return rule(
        ctx, x,
        kernel=np.asarray(kernel, np.int64),
        strides=np.asarray(strides, np.int64),
        dilation=np.asarray(dilation, np.int64),
        pad_lo=np.asarray([lo for lo, _ in padding], np.int64),
        pad_hi=np.asarray([hi for _, hi in padding], np.int64),
        channel_major=order == "channel_major",
        transpose=transpose,
        method=method,
    )


def _as_uint(element: bytes) -> np.generic:
    """One element's bytes as the unsigned int of the same width."""
    return np.frombuffer(element, f"<u{len(element)}")[0]


def _im2col_with_zero_bits(x, *, zero, **params):
    # The handlers pad with zero bytes: x's bits XOR jnp's zero map jnp's
    # zero to zero bytes and back, and leave every other value distinct.
    bits = lax.bitcast_convert_type(x, zero.dtype)
    return lax.bitcast_convert_type(im2col_p.bind(bits ^ zero, **params) ^ zero, x.dtype)


def _im2col_lowering(ctx, x, **params):
    zero = _checks.fill_bytes(_OP, 0, ctx.avals_in[0].dtype)
    if any(zero):  # float8_e8m0fnu has no zero: jnp writes its NaN, 0xFF
        f = functools.partial(_im2col_with_zero_bits, zero=_as_uint(zero), **params)
        return mlir.lower_fun(f, multiple_results=False)(ctx, x)
    return _call_lowering(ctx, x, transpose=False, **params)


def _col2im_in_float32(p, **params):
    # Float types the handlers cannot add: summed in float32 (taps in
    # increasing order, as the handlers add) and rounded once. A NaN result
    # (float8_e4m3fn's overflow keeps the sum's sign) is stored as the
    # handlers store a NaN sum: NaN converted as jnp converts it (float8_e5m2:
    # 0x7F). The choice is made on the bits: XLA's CPU select of float8_e5m2
    # values rewrites a NaN as 0x7F.
    y = col2im_p.bind(p.astype(np.float32), **params).astype(p.dtype)
    nan = _as_uint(_checks.fill_bytes(_OP_T, np.nan, p.dtype))
    bits = lax.bitcast_convert_type(y, nan.dtype)
    return lax.bitcast_convert_type(jnp.where(jnp.isnan(y), nan, bits), p.dtype)


def _col2im_lowering(ctx, p, *, in_spatial, **params):
    dtype = ctx.avals_in[0].dtype
    # Float types the handlers do not add are summed in float32 around them
    # (sub-byte integers reach here widened to 8 bits).
    if dtype.name not in _ffi.rules()["summed_dtypes"] and jnp.issubdtype(dtype, jnp.floating):
        f = functools.partial(_col2im_in_float32, in_spatial=in_spatial, **params)
        return mlir.lower_fun(f, multiple_results=False)(ctx, p)
    return _call_lowering(ctx, p, transpose=True, **params)


# ---- vmap: the vmapped dim is folded into N ---------------------------------

def _fold_batcher(prim):
    def batcher(args, dims, **params):
        (x,), (d,) = args, dims
        x = jax.numpy.moveaxis(x, d, 0)
        b, n = x.shape[:2]
        y = prim.bind(x.reshape((b * n,) + x.shape[2:]), **params)
        return y.reshape((b, n) + y.shape[1:]), 0
    return batcher


# ---- autodiff: both are linear, each the other's transpose ------------------

def _im2col_transpose(ct, x, **params):
    if type(ct) is ad.Zero:
        return [ad.Zero(x.aval)]
    return [col2im_p.bind(ct, in_spatial=tuple(x.aval.shape[1:-1]), **params)]


def _col2im_transpose(ct, p, *, in_spatial, **params):
    if type(ct) is ad.Zero:
        return [ad.Zero(p.aval)]
    return [im2col_p.bind(ct, **params)]


# ---- registration -----------------------------------------------------------

_lowering.register(im2col_p, _im2col_abstract, _im2col_lowering, batcher=_fold_batcher(im2col_p))
_lowering.register(col2im_p, _col2im_abstract, _col2im_lowering, batcher=_fold_batcher(col2im_p))
ad.deflinear2(im2col_p, _im2col_transpose)
ad.deflinear2(col2im_p, _col2im_transpose)
