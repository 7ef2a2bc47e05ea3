"""The FFI fuzz's spec of jax_tma.window and its transpose (tests/test_ffi_fuzz.py runs it)."""

from __future__ import annotations

import itertools
import math

import numpy as np

from fuzz_specs.common import (PORTABLE, S, SHAPE_RULES, Call, Spec, fill_patterns, pick,
                               random_fill, some_dtype, with_)
from reference import random_array


def _window_call(rng) -> Call:
    """A forward window or its transpose, with 0-2 batch dims, src batched or
    shared, and the start as one scalar per dim, a shared (r,) array or a
    batched (*batch, r) array: every layout the handler accepts."""
    r = int(rng.integers(1, 4))
    batch = tuple(int(v) for v in rng.integers(1, 3, int(rng.integers(0, 3))))
    x_shape = tuple(int(v) for v in rng.integers(1, 6, r))
    box = tuple(int(v) for v in rng.integers(1, 5, r))
    transpose = bool(rng.integers(2))
    src_batched = transpose or bool(rng.integers(2))
    src_shape, dst_shape = (box, x_shape) if transpose else (x_shape, box)
    dtype = some_dtype(rng)
    src = random_array(rng, (batch if src_batched else ()) + src_shape, dtype)
    start_dtype = pick(rng, (np.int32, np.int64))
    layout = int(rng.integers(3)) if batch else int(rng.integers(2))
    shape = (batch if layout == 2 else ()) + (r,)
    start = rng.integers(-3, max(x_shape) + 3, shape).astype(start_dtype)
    starts = list(start.reshape(r, 1)) if layout == 0 else [start]
    fill = np.zeros(2, np.int64) if transpose else random_fill(rng, [dtype])
    return Call([src] + starts, [S(batch + dst_shape, dtype)],
                dict(strides=rng.integers(1, 4, r), fill=fill,
                     transpose=transpose, method=pick(rng, PORTABLE),
                     # any value is valid: it only steers auto's kernel choice
                     inner_start=np.int64(pick(rng, (-2**63, int(rng.integers(-40, 40)))))))


def _window_reference(call: Call) -> list[np.ndarray]:
    """dst[b, i] = src[b, start + i * strides] (transpose: src[b, (i - start) /
    strides] where that divides), else the fill pattern; bytes throughout."""
    x, *starts = call.operands
    y = call.results[0]
    strides, transpose = call.attrs["strides"], call.attrs["transpose"]
    r = len(strides)
    eb = x.dtype.itemsize
    start = np.concatenate([s.astype(np.int64).reshape(-1) for s in starts]).reshape(-1, r)
    start = start.clip(-2**62, 2**62)
    src = x.view(np.uint8).reshape((math.prod(x.shape[:x.ndim - r]),) + x.shape[x.ndim - r:]
                                   + (eb,))
    fill = fill_patterns(call)[0][:eb]
    box = y.shape[len(y.shape) - r:]
    out = np.empty((math.prod(y.shape[:len(y.shape) - r]),) + box + (eb,), np.uint8)
    for b in range(len(out)):
        s, xb = start[b % len(start)], src[b % len(src)]
        coords, inside = [], np.ones(box, bool)
        for d in range(r):
            i = np.arange(box[d])
            if transpose:
                rel = i - s[d]
                c = np.where(rel % strides[d] == 0, rel // strides[d], -1)
            else:
                c = s[d] + i * strides[d]
            ok = (c >= 0) & (c < xb.shape[d])
            inside &= ok.reshape((-1,) + (1,) * (r - 1 - d))
            coords.append(np.where(ok, c, 0))
        out[b] = fill
        if xb.size:
            out[b][inside] = xb[np.ix_(*coords)][inside]
    return [out.reshape(y.shape + (eb,)).view(y.dtype).reshape(y.shape)]


def _zero_box(c: Call) -> Call:  # regression: divided by zero (SIGFPE)
    y = c.results[0]
    return with_(c, results=[S(y.shape[:-1] + (0,), y.dtype)])


def _extreme_starts(c: Call) -> Call:  # the handler clamps them to +-2^62
    ends = itertools.cycle((-2**63, 2**63 - 1))
    return with_(c, c.operands[:1] + [np.full(s.shape, next(ends), np.int64)
                                      for s in c.operands[1:]])


_WINDOW_NASTY = (
    (_zero_box, SHAPE_RULES + r"|box"),
    (lambda c: with_(c, strides=np.full(len(c.attrs["strides"]), 2**31 - 1)), r"strides"),
    (lambda c: with_(c, strides=np.full(17, 1)), r"strides|spatial rank"),
    (lambda c: with_(c, fill=np.array([2**63 - 1, 0], np.int64)), r"fill"),  # 16-byte: valid
    (_extreme_starts, r"start"),
    (lambda c: with_(c, c.operands + c.operands[1:]), r"start"),
)


SPECS: dict[str, Spec] = {
    "jax_tma_window": Spec(
        ("jax_tma.window",), _window_call, _window_reference, _WINDOW_NASTY,
        rules={"shape": r"start|cotangent",
               "dtype": r"start must be|start operands mix|fill is not one",
               # A start operand more or fewer shifts the others: the handler
               # meets the first operand out of place (a transpose whose
               # cotangent went missing takes a start array for an unbatched one).
               "operands": r"start|input rank|element type|cotangent"},
        # strides has an entry per spatial dim: its length sets the rank that
        # the arrays and starts are checked against.
        attr_rules={"fill": r"fills", "strides": r"rank|batch dim|start|entries",
                    "transpose": r"fill|cotangent|start|rank|batch|\bdims?\b|entries"}),
}
