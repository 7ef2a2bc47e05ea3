"""The FFI fuzz's spec of jax_tma.im2col and col2im (tests/test_ffi_fuzz.py runs it)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fuzz_specs.common import (BYTE_DTYPES, PORTABLE, S, SHAPE_RULES, SUMMABLE, Call, Spec, i64,
                               pick, some_dtype, with_)
from reference import col2im_reference, im2col_reference, random_array


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
