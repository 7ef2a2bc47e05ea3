"""The im2col family's descriptor (tests/families/__init__.py says what each
name is for): jax_tma.im2col and its transpose col2im, with their NumPy
references and jnp/lax equivalents."""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_tma
from fuzz import (BYTE_DTYPES, PORTABLE, S, SHAPE_RULES, SUMMABLE, Call, Spec, i64, pick,
                  some_dtype, with_)
from ops_table import EXACT_TERMS, SUMMABLE as SUMMED, Case, Op, cotangent, dims_spec
from paths import CpuCall
from reference import ALL_DTYPES, random_array

MODULES = ("jax_tma._im2col",)


# ---- references -------------------------------------------------------------------

def tap_slices(kernel, strides, dilation, out_spatial):
    """Per tap (row-major over the kernel): the strided slices of the padded
    input that the tap reads for every output pixel."""
    for tap in np.ndindex(*kernel):
        # o == 0: an empty slice (k * d - s + 1 as a stop could be negative,
        # which NumPy reads from the end)
        yield tuple(slice(k * d, k * d + (o - 1) * s + 1, s) if o else slice(0, 0)
                    for k, s, d, o in zip(tap, strides, dilation, out_spatial))


def out_spatial(spatial, kernel, strides, pads, dilation):
    """0 where the dilated kernel is larger than the padded input (lax's rule)."""
    return tuple(max(0, (n + lo + hi - d * (k - 1) - 1) // s + 1)
                 for n, k, s, (lo, hi), d in zip(spatial, kernel, strides, pads, dilation))


def most_patches_per_pixel(spatial, kernel, strides, pads, dilation) -> int:
    """The most patches that hold one input pixel: the terms col2im (im2col's
    grad) sums into it."""
    most = 1
    outs = out_spatial(spatial, kernel, strides, pads, dilation)
    for n, k, s, (lo, _), d, o in zip(spatial, kernel, strides, pads, dilation, outs):
        hits = np.zeros(n, np.int64)
        for t in range(k):
            p = np.arange(o) * s + t * d - lo
            np.add.at(hits, p[(p >= 0) & (p < n)], 1)
        most *= int(hits.max(initial=0))
    return most


# (x shape, kernel, strides, dilation, padding, lax's patch shape): some
# spatial output dim is 0 where the dilated kernel spans more pixels than the
# padded input has; lax.conv_general_dilated_patches returns an empty array.
IM2COL_EMPTY_CASES = [
    ((2, 3, 4, 5, 5), 3, 1, 2, "VALID", (2, 0, 0, 1, 135)),            # the case
    ((2, 4, 3), 5, 1, 1, "VALID", (2, 0, 15)),                        # 1D
    ((1, 2, 3), 3, 3, 2, ((1, 0),), (1, 0, 9)),                       # 1D, padded, strided
    ((3, 2, 4), 7, 2, 3, "VALID", (3, 0, 28)),                        # 1D, kernel 19 > 2
    ((2, 5, 3, 2), (2, 3), 1, (1, 2), ((0, 0), (1, 0)), (2, 4, 0, 12)),  # 2D, last dim empty
    ((1, 2, 6, 3), (3, 2), (2, 1), 1, ((0, 0), (1, 1)), (1, 0, 7, 18)),  # 2D, first dim empty
    ((2, 5, 4, 5, 2), (2, 3, 2), 1, (1, 2, 1), ((1, 0), (0, 0), (0, 1)),
     (2, 5, 0, 5, 24)),                                               # 3D, middle dim empty
    ((1, 1, 1, 1, 4), 2, 1, 1, "VALID", (1, 0, 0, 0, 32)),             # 3D, every dim empty
    ((2, 0, 3), 3, 1, 1, "SAME", (2, 0, 9)),                           # empty input, SAME
]
IM2COL_EMPTY_IDS = [f"{len(c[0]) - 2}d-{'x'.join(map(str, c[5]))}" for c in IM2COL_EMPTY_CASES]


def im2col_reference(x, kernel, strides, pads, dilation, order="tap_major",
                     fill=None) -> np.ndarray:
    """NumPy jax_tma.im2col: (N, *S, C) -> (N, *O, K * C). Padded pixels hold
    `fill` converted as jnp converts a scalar (jax_tma.im2col's is 0, which
    is 0xFF in float8_e8m0fnu), or zero bytes with fill=None, as the raw
    jax_tma_im2col target writes them."""
    x = np.asarray(x)
    spatial = x.shape[1:-1]
    out = out_spatial(spatial, kernel, strides, pads, dilation)
    xp = np.zeros((x.shape[0],) + tuple(n + lo + hi for n, (lo, hi) in zip(spatial, pads))
                  + (x.shape[-1],), x.dtype)
    if fill is not None:
        xp[...] = np.asarray(fill).astype(x.dtype)
    xp[(slice(None),) + tuple(slice(lo, lo + n) for n, (lo, _) in zip(spatial, pads))] = x
    taps = [xp[(slice(None),) + sl] for sl in tap_slices(kernel, strides, dilation, out)]
    p = np.stack(taps, axis=-2)  # (N, *O, K, C)
    if order == "channel_major":
        p = np.swapaxes(p, -1, -2)
    return p.reshape(p.shape[:-2] + (p.shape[-2] * p.shape[-1],))  # -1 fails when empty


def col2im_reference(patches, input_shape, kernel, strides, pads, dilation,
                     order="tap_major") -> np.ndarray:
    """NumPy jax_tma.col2im with the op's exact arithmetic: taps added in
    increasing order from -0.0 (floats; a pixel no tap reads is +0.0),
    16-bit floats in float32 rounded once, integers wrap, NaN sums stored
    as np.nan (complex: per part)."""
    patches = np.asarray(patches)
    n, spatial, c = input_shape[0], tuple(input_shape[1:-1]), input_shape[-1]
    out = out_spatial(spatial, kernel, strides, pads, dilation)
    k = int(np.prod(kernel))
    p = patches.reshape((n,) + out + ((c, k) if order == "channel_major" else (k, c)))
    if order == "channel_major":
        p = np.swapaxes(p, -1, -2)
    wide = patches.dtype.name in ("float16", "bfloat16")
    acc_dtype = np.dtype(np.float32) if wide else patches.dtype
    padded = (n,) + tuple(s + lo + hi for s, (lo, hi) in zip(spatial, pads))
    floating = jnp.issubdtype(acc_dtype, jnp.inexact)
    acc = np.full(padded + (c,), complex(-0.0, -0.0) if acc_dtype.kind == "c" else
                  -0.0 if floating else 0, acc_dtype)
    hit = np.zeros(padded, bool)
    with np.errstate(over="ignore", invalid="ignore"):
        for t, sl in enumerate(tap_slices(kernel, strides, dilation, out)):
            acc[(slice(None),) + sl] += p[..., t, :].astype(acc_dtype)
            hit[(slice(None),) + sl] = True
    acc[~hit] = 0
    crop = acc[(slice(None),) + tuple(slice(lo, lo + s) for s, (lo, _) in zip(spatial, pads))]
    with np.errstate(over="ignore", invalid="ignore"):  # float16 sums may round to inf
        out = crop.astype(patches.dtype)
    if out.dtype.kind == "c":
        parts = out.view(np.float32 if out.dtype == np.complex64 else np.float64)
        parts[np.isnan(parts)] = np.nan
    elif out.dtype.kind != "i" and out.dtype.kind != "u":
        out[np.isnan(out)] = np.nan
        if out.dtype.name == "float8_e5m2":  # jnp's NaN of it (NumPy's is 0x7E)
            out.view(np.uint8)[np.isnan(out)] = 0x7F
    return out


def raw_im2col(x, out_shape, device, **attrs):
    """The raw jax_tma_im2col target on `device`, as exported HLO reaches it:
    identity geometry unless `attrs` say otherwise. has_side_effect: XLA
    drops a pure call whose result has no elements; this one always runs."""
    call = jax.ffi.ffi_call("jax_tma_im2col", jax.ShapeDtypeStruct(out_shape, x.dtype),
                            has_side_effect=True)
    r = len(out_shape) - 2
    base = dict(kernel=np.ones(r, np.int64), strides=np.ones(r, np.int64),
                dilation=np.ones(r, np.int64), pad_lo=np.zeros(r, np.int64),
                pad_hi=np.zeros(r, np.int64), channel_major=False, transpose=False,
                method="auto")
    base.update(attrs)
    return jax.block_until_ready(jax.jit(lambda a: call(a, **base))(jax.device_put(x, device)))


def im2col_jnp(x, kernel, strides, pads, dilation, order):
    """jax_tma.im2col as jnp.pad and one strided slice per kernel tap
    (tap_slices), stacked: any dtype, padding as jnp pads."""
    out = out_spatial(x.shape[1:-1], kernel, strides, pads, dilation)
    xp = jnp.pad(x, ((0, 0),) + tuple(pads) + ((0, 0),))
    taps = [xp[(slice(None),) + sl] for sl in tap_slices(kernel, strides, dilation,
                                                                      out)]
    p = jnp.stack(taps, axis=-2)
    if order == "channel_major":
        p = jnp.swapaxes(p, -1, -2)
    return p.reshape(p.shape[:-2] + (p.shape[-2] * p.shape[-1],))


def col2im_jnp(p, in_shape_tail, kernel, strides, pads, dilation, order):
    """jax_tma.col2im in lax: each tap's patch entries put back where they
    were read (lax.pad with interior padding, the transpose of a strided
    slice) and added in increasing tap order, the padding cropped. Every
    step derives from p, so the result keeps p's sharding and varying axes."""
    spatial, c = tuple(in_shape_tail[:-1]), in_shape_tail[-1]
    out = out_spatial(spatial, kernel, strides, pads, dilation)
    padded = tuple(n + lo + hi for n, (lo, hi) in zip(spatial, pads))
    if not all(out):  # no patches: nothing read, zeros
        return jnp.zeros((p.shape[0],) + tuple(in_shape_tail), p.dtype)
    k = math.prod(kernel)
    q = p.reshape(p.shape[:-1] + ((c, k) if order == "channel_major" else (k, c)))
    if order == "channel_major":
        q = jnp.swapaxes(q, -1, -2)
    acc = None
    for t, sl in enumerate(tap_slices(kernel, strides, dilation, out)):
        config = [(0, 0, 0)] + [(z.start, n - z.start - ((o - 1) * z.step + 1), z.step - 1)
                                for z, n, o in zip(sl, padded, out)] + [(0, 0, 0)]
        term = lax.pad(q[..., t, :], jnp.zeros((), p.dtype), config)
        acc = term if acc is None else acc + term
    return acc[(slice(None),) + tuple(slice(lo, lo + n) for n, (lo, _) in zip(spatial, pads))]


def same_pads(spatial, kernel, strides, dilation):
    """lax's "SAME" padding."""
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilation)]
    return tuple(tuple(p) for p in lax.padtype_to_pads(spatial, eff, strides, "SAME"))


# ---- the FFI fuzz -----------------------------------------------------------------

def _im2col_call(rng) -> Call:
    r = int(rng.integers(1, 4))
    kernel = rng.integers(1, 4, r)
    strides = rng.integers(1, 3, r)
    dilation = rng.integers(1, 3, r)
    lo, hi = rng.integers(0, 3, r), rng.integers(0, 3, r)
    span = dilation * (kernel - 1) + 1
    spatial = np.maximum(span - lo - hi, 0) + rng.integers(0, 3, r)
    out = (spatial + lo + hi - span) // strides + 1
    n, ch = int(rng.integers(1, 3)), int(rng.integers(1, 4))
    x_shape = (n, *spatial.tolist(), ch)
    p_shape = (n, *out.tolist(), int(np.prod(kernel)) * ch)
    transpose = bool(rng.integers(2))
    dtype = some_dtype(rng, SUMMABLE if transpose else BYTE_DTYPES)
    src, dst = (p_shape, x_shape) if transpose else (x_shape, p_shape)
    return Call([random_array(rng, src, dtype)], [S(dst, dtype)],
                dict(kernel=kernel, strides=strides, dilation=dilation, pad_lo=lo, pad_hi=hi,
                     channel_major=bool(rng.integers(2)), transpose=transpose,
                     method=pick(rng, PORTABLE)))


def _im2col_reference(call: Call) -> list[np.ndarray]:
    a = call.attrs
    pads = tuple(zip(a["pad_lo"].tolist(), a["pad_hi"].tolist()))
    geometry = (a["kernel"].tolist(), a["strides"].tolist(), pads, a["dilation"].tolist(),
                "channel_major" if a["channel_major"] else "tap_major")
    x = call.operands[0]
    if a["transpose"]:
        return [col2im_reference(x, call.results[0].shape, *geometry)]
    return [im2col_reference(x, *geometry)]


def _taps_overflow(transpose: bool) -> Callable[[Call], Call]:
    """Regression: 2^62 taps x 4 channels wrapped to 0 columns, so the patch
    buffer was empty while the loops wrote (im2col: SIGSEGV) or read and
    spun over 2^62 taps (col2im)."""
    x, p = S((1, 1, 1, 1, 4), np.float32), S((1, 1, 1, 1, 0), np.float32)
    src, dst = (p, x) if transpose else (x, p)
    return lambda c: Call([np.ones(src.shape, src.dtype)], [dst], dict(
        kernel=i64(2**30, 2**30, 4), strides=i64(1, 1, 1), dilation=i64(1, 1, 1),
        pad_lo=i64(0, 0, 0), pad_hi=i64(2**30 - 1, 2**30 - 1, 3), channel_major=False,
        transpose=transpose, method="auto"))


def _huge_kernel_no_channels(r: int) -> Callable[[Call], Call]:
    """C = 0 under a kernel of (2^31 - 1)^r taps. r = 2: the loops spun over
    2^62 empty taps (regression); r = 3: too many taps to count."""
    big = i64(*[2**31 - 1] * r)
    return lambda c: Call([np.ones((1,) * (r + 1) + (0,), np.float32)],
                          [S((1,) * (r + 1) + (0,), np.float32)],
                          dict(kernel=big, strides=big, dilation=i64(*[1] * r), pad_lo=big,
                               pad_hi=i64(*[0] * r), channel_major=False, transpose=False,
                               method="auto"))


# What the convolution geometry's checks name (a kernel, stride, dilation or
# padding value is checked against the others and the arrays' dims).
_IM2COL_GEOMETRY = (r"kernel|strides|dilation|padding|pad_lo|pad_hi|patch|pixels|spatial|"
                    r"columns|taps|rank")

_IM2COL_NASTY = (
    (_taps_overflow(False), r"columns|taps"),
    (_taps_overflow(True), r"columns|taps"),
    (_huge_kernel_no_channels(2), r"taps|kernel|columns"),
    (_huge_kernel_no_channels(3), r"taps|kernel|columns"),
    (lambda c: with_(c, kernel=np.full(len(c.attrs["kernel"]), 2**31 - 1)), _IM2COL_GEOMETRY),
    (lambda c: with_(c, dilation=np.full(len(c.attrs["kernel"]), 2**62)), r"dilation"),
    (lambda c: with_(c, pad_lo=np.full(len(c.attrs["kernel"]), -2**63)), r"padding|pad_lo"),
    (lambda c: with_(c, transpose=not c.attrs["transpose"]),
     _IM2COL_GEOMETRY + r"|cannot be summed"),
)


SPECS: dict[str, Spec] = {
    "jax_tma_im2col": Spec(
        ("jax_tma.im2col", "jax_tma.col2im"), _im2col_call, _im2col_reference, _IM2COL_NASTY,
        rules={"shape": r"patch|pixels|columns|taps", "dtype": r"cannot be summed"},
        attr_rules={**{k: _IM2COL_GEOMETRY for k in ("kernel", "strides", "dilation",
                                                     "pad_lo", "pad_hi")},
                    "transpose": _IM2COL_GEOMETRY + r"|cannot be summed|" + SHAPE_RULES}),
}


# ---- the paths --------------------------------------------------------------------

CPU_CALLS = {"im2col": CpuCall(lambda x: jax_tma.im2col(x[None, :, :, None], 3))}

GPU_CALLS = {
    "im2col.tma": lambda x, device: jax_tma.im2col(x.reshape(4, 8, 8, 4), 3, method="tma"),
    "im2col.simt": lambda x, device: jax_tma.im2col(x.reshape(4, 8, 8, 4), 3, method="simt"),
}


# ---- the mode tests ---------------------------------------------------------------

def build_im2col(rng, dtype, *, batch=8, even=True, method="auto", rank=None,
                 empty=False) -> Case:
    """Random 1D-3D geometry; `empty` allows an output dim of 0 (a dilated
    kernel larger than the padded input). At most EXACT_TERMS patches hold
    one pixel: col2im's sums of cotangent() values (im2col's grad) then give
    the same bits in any order (float8_e8m0fnu, rounding 1 + 1 + ... after
    every add as jnp does, leaves the sum rounded once from 6 terms on)."""
    r = int(rank or rng.integers(1, 4))
    c = int(rng.integers(1, 4))
    order = str(rng.choice(["tap_major", "channel_major"]))
    while True:
        spatial = tuple(int(rng.integers(2, 6)) for _ in range(r))
        kernel = tuple(int(rng.integers(1, 3)) for _ in range(r))
        strides = tuple(int(rng.integers(1, 3)) for _ in range(r))
        dilation = tuple(int(rng.integers(1, 3)) for _ in range(r))
        kind = int(rng.integers(0, 3))
        if kind == 0:
            padding, pads = "VALID", ((0, 0),) * r
        elif kind == 1:
            padding = "SAME"
            pads = same_pads(spatial, kernel, strides, dilation)
        else:
            padding = pads = tuple((int(rng.integers(0, 3)), int(rng.integers(0, 3)))
                                   for _ in range(r))
        out = out_spatial(spatial, kernel, strides, pads, dilation)
        if (empty or all(out)) and \
                most_patches_per_pixel(spatial, kernel, strides, pads, dilation) <= EXACT_TERMS:
            break
    shape = (batch,) + spatial + (c,)
    geo = dict(strides=strides, padding=padding, dilation=dilation, order=order)
    draw = lambda rr: (random_array(rr, shape, dtype),)  # noqa: E731

    def expect(x):  # padded pixels: jnp's zero (float8_e8m0fnu's is 0xFF)
        return im2col_reference(x, kernel, strides, pads, dilation, order, fill=0)

    return Case(
        op="im2col", dtype=np.dtype(dtype), args=draw(rng),
        ours=lambda x: jax_tma.im2col(x, kernel, method=method, **geo),
        ref=lambda x: im2col_jnp(x, kernel, strides, pads, dilation, order),
        expect=expect, draw=draw, diff=(0,), batch=(0,), split=(0,),
        in_specs=lambda dims: (dims_spec(len(shape), dims),),
        symbolic=(("b",) + (None,) * (r + 1),),
        params=dict(kernel=kernel, pads=pads, geo=geo, spatial=spatial, c=c),
    )


def build_col2im(rng, dtype, *, batch=8, even=True, method="auto", rank=None,
                 empty=False) -> Case:
    base = build_im2col(rng, np.float32, batch=batch, even=even, rank=rank, empty=empty)
    kernel, pads, geo = base.params["kernel"], base.params["pads"], base.params["geo"]
    tail = base.params["spatial"] + (base.params["c"],)
    strides, dilation, order = geo["strides"], geo["dilation"], geo["order"]
    p_shape = jax.eval_shape(base.ours, *base.args).shape
    floating = jnp.issubdtype(dtype, jnp.inexact)
    # Sums of cotangent-like values are exact: any adding order gives the same bits.
    draw = (lambda rr: (cotangent(rr, p_shape, dtype),)) if floating else \
        (lambda rr: (random_array(rr, p_shape, dtype),))
    return Case(
        op="col2im", dtype=np.dtype(dtype), args=draw(rng),
        ours=lambda p: jax_tma.col2im(p, (p.shape[0],) + tail, kernel, method=method, **geo),
        ref=lambda p: col2im_jnp(p, tail, kernel, strides, pads, dilation, order),
        expect=lambda p: col2im_reference(p, (p.shape[0],) + tail, kernel, strides, pads,
                                          dilation, order),
        draw=draw, diff=(0,), batch=(0,), split=(0,),
        in_specs=lambda dims: (dims_spec(len(p_shape), dims),),
        symbolic=(("b",) + (None,) * (len(p_shape) - 1),),
        params=dict(kernel=kernel, pads=pads, geo=geo, tail=tail),
    )


# The fuzz draws geometries with an empty output dim too.
OPS = (Op("im2col", build_im2col, ALL_DTYPES, fuzz_kw={"empty": True}),
       Op("col2im", build_col2im, SUMMED, fuzz_kw={"empty": True}))
