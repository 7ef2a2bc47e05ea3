"""The window family's descriptor (tests/families/__init__.py says what each
name is for): jax_tma.window and its transpose, with the NumPy references
of both and their jnp equivalent."""

from __future__ import annotations

import itertools
import math

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

import jax_tma
from fuzz import (PORTABLE, S, SHAPE_RULES, Call, Spec, fill_patterns, pick, random_fill,
                  some_dtype, with_)
from ops_table import Case, Op, as_ints, dim_size, dims_spec, pad_fill
from paths import CpuCall
from reference import ALL_DTYPES, random_array

MODULES = ("jax_tma._window",)


# ---- references -------------------------------------------------------------------

def window_reference(x: np.ndarray, start, shape, strides=None, fill_nan=False,
                     fill=0) -> np.ndarray:
    """NumPy jax_tma.window: out[i] = x[start + i * strides] inside x, else
    `fill` converted as jnp converts a scalar (np.asarray(fill).astype), or
    with `fill_nan` the dtype's NaN (complex: NaN in both parts)."""
    x = np.asarray(x)
    if fill_nan:
        fill = complex(np.nan, np.nan) if x.dtype.kind == "c" else np.nan
    strides = strides or (1,) * x.ndim
    # Python ints: starts of any size (int64, uint64) without overflow.
    idx = [np.array([int(s) + i * st for i in range(n)], object)
           for s, n, st in zip(start, shape, strides)]
    grids = np.meshgrid(*idx, indexing="ij") if idx else []
    inside = np.ones(tuple(shape), bool)
    for g, dim in zip(grids, x.shape):
        inside &= (g >= 0) & (g < dim)
    out = np.empty(tuple(shape), x.dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        out[...] = np.asarray(fill).astype(x.dtype)
    if x.dtype.name == "float8_e5m2" and fill != fill:
        out.view(np.uint8)[...] = 0x7F  # jnp's NaN of float8_e5m2 (NumPy's is 0x7E)
    if x.size:
        clipped = tuple(np.clip(g, 0, max(dim - 1, 0)).astype(np.int64)
                        for g, dim in zip(grids, x.shape))
        out[inside] = x[clipped][inside]
    return out


def jnp_fill_value(fill):
    """window's fill in the form jnp.pad takes ("nan" is NaN)."""
    return float("nan") if isinstance(fill, str) else fill


def _clamped_starts(x_shape, start, shape, strides) -> list[int]:
    """Python-int starts moved into [-extent - 1, dim + 1], which reads the
    same (a start outside reads fill alone), so NumPy's int64 cannot wrap."""
    return [min(max(int(v), -((n - 1) * st + 1) - 1), dim + 1)
            for v, n, st, dim in zip(start, shape, strides, x_shape)]


def window_fill_bits(fill, dtype) -> np.ndarray:
    """window's fill element: as jnp.pad converts `fill`, but the string
    "nan", which its docstring makes NaN in both parts of a complex dtype."""
    dtype = np.dtype(dtype)
    if isinstance(fill, str) and dtype.kind == "c":
        return np.array([complex(np.nan, np.nan)], dtype)
    return pad_fill(jnp_fill_value(fill), dtype)


def window_expect(x, start, shape, strides, fill=0) -> np.ndarray:
    """jax_tma.window in NumPy for starts of any size (Python ints):
    window_reference, out-of-bounds elements window_fill_bits."""
    start = _clamped_starts(x.shape, start, shape, strides)
    out = window_reference(x, start, shape, strides)
    inside = window_reference(np.ones(x.shape, bool), start, shape, strides)
    out[~inside] = window_fill_bits(fill, x.dtype)[0]
    return out


def window_grad_expect(x_shape, ct, start, shape, strides) -> np.ndarray:
    """window's transpose in NumPy: each cotangent element added onto the
    element of x it was read from (none for those read as fill)."""
    start = _clamped_starts(x_shape, start, shape, strides)
    flat = window_reference(np.arange(math.prod(x_shape)).reshape(x_shape), start, shape,
                            strides)
    inside = window_reference(np.ones(x_shape, bool), start, shape, strides)
    g = np.zeros(math.prod(x_shape), ct.dtype)
    np.add.at(g, flat[inside], np.asarray(ct)[inside])
    return g.reshape(x_shape)


def window_jnp(x, starts: dict, shape, strides, fill):
    """jax_tma.window as jnp.pad + lax.dynamic_slice + a strided slice, per
    windowed dim d (starts: d -> traced or concrete integer scalar of any
    integer dtype; other dims are taken whole)."""
    fill = jnp_fill_value(fill)
    for d, s in starts.items():
        ext = (shape[d] - 1) * strides[d] + 1
        pads = [(0, 0)] * x.ndim
        pads[d] = (ext, ext)
        xp = jnp.pad(x, pads, constant_values=fill)
        s = jnp.asarray(s)
        if s.dtype == np.uint64:  # past int64: any start past the end reads fill alike
            s = jnp.minimum(s, np.uint64(2**62))
        s = jnp.clip(s.astype(np.int64), -ext, x.shape[d]) + ext
        x = lax.slice_in_dim(lax.dynamic_slice_in_dim(xp, s, ext, d), 0, ext, strides[d], d)
    return x


# ---- the FFI fuzz -----------------------------------------------------------------

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
    # A static start is the operand's (the handlers read it in its place),
    # or unknown; batched starts are all unknown.
    static = [-2**63 if layout == 2 or rng.integers(2) else int(v) for v in start.reshape(-1)[:r]]
    return Call([src] + starts, [S(batch + dst_shape, dtype)],
                dict(strides=rng.integers(1, 4, r), fill=fill,
                     transpose=transpose, method=pick(rng, PORTABLE),
                     static_start=np.array(static, np.int64)))


def _window_reference(call: Call) -> list[np.ndarray]:
    """dst[b, i] = src[b, start + i * strides] (transpose: src[b, (i - start) /
    strides] where that divides), else the fill pattern; bytes throughout. The
    start is static_start where that gives every one, else the operands'."""
    x, *starts = call.operands
    y = call.results[0]
    strides, transpose = call.attrs["strides"], call.attrs["transpose"]
    r = len(strides)
    eb = x.dtype.itemsize
    start = np.concatenate([s.astype(np.int64).reshape(-1) for s in starts]).reshape(-1, r)
    static = call.attrs["static_start"]
    if (static != -2**63).all():  # every start static: the handlers read these, not the operands
        start = static.reshape(1, r)
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
               # cotangent went missing takes a start array for an unbatched
               # one; an array put first is the input, whose batch dims then
               # differ from the output's).
               "operands": r"start|input rank|element type|cotangent|batch dims"},
        # strides has an entry per spatial dim: its length sets the rank that
        # the arrays and starts are checked against.
        attr_rules={"fill": r"fills", "strides": r"rank|batch dim|start|entries",
                    "transpose": r"fill|cotangent|start|rank|batch|\bdims?\b|entries"}),
}


# ---- the paths --------------------------------------------------------------------

CPU_CALLS = {"window": CpuCall(lambda x: jax_tma.window(x, (1, -2), (4, 8)))}

GPU_CALLS = {
    "window.tiled": lambda x, device: jax_tma.window(x, (1, -2), (4, 8), method="tma"),
    "window.simt": lambda x, device: jax_tma.window(x, (1, -2), (4, 8), method="simt"),
}


# ---- the mode tests ---------------------------------------------------------------

def build_window(rng, dtype, *, batch=8, even=True, method="auto",
                 start_dtype=np.int32) -> Case:
    """x (B, R, W, C): dims 1 and 2 windowed from traced starts (a 2-array
    of `start_dtype`), B and C taken whole (the dims a mesh may split)."""
    r, w, c = int(rng.integers(3, 9)), int(rng.integers(3, 8)), dim_size(rng, even, 1, 4)
    shape = (batch, r, w, c)
    box = (int(rng.integers(1, r + 2)), int(rng.integers(1, w + 2)))
    strides = (1, int(rng.integers(1, 3)), int(rng.integers(1, 3)), 1)
    floating = jnp.issubdtype(dtype, jnp.inexact)
    fills = ["nan", float("nan"), 0.0, 0, -0.0] if floating else [0]
    if np.dtype(dtype).kind == "c":
        fills.append(complex(1.5, -2))
    fill = fills[int(rng.integers(0, len(fills)))]

    def draw(rr):
        starts = [int(rr.integers(-box[0] - 1, r + 2)), int(rr.integers(-box[1] - 1, w + 2))]
        return random_array(rr, shape, dtype), np.array(starts).astype(start_dtype)

    def box_of(x):
        return (x.shape[0], box[0], box[1], x.shape[3])

    def ours(x, s):
        return jax_tma.window(x, (0, s[0], s[1], 0), box_of(x), strides=strides, fill=fill,
                              method=method)

    def ref(x, s):
        return window_jnp(x, {1: s[0], 2: s[1]}, box_of(x), strides, fill)

    def expect(x, s):
        return window_expect(x, [0, *as_ints(s), 0], box_of(x), strides, fill)

    return Case(
        op="window", dtype=np.dtype(dtype), args=draw(rng), ours=ours, ref=ref, expect=expect,
        # C is taken whole but lies after the windowed dims: splitting it
        # gathers x (the lowering splits leading dims alone).
        draw=draw, diff=(0,), batch=(0,), split=(0, 3), split_locally=(0,),
        in_specs=lambda dims: (dims_spec(4, dims), P()), index=1,
        symbolic=(("b", "r", "w", "c"), (None,)),
        params=dict(box=box, strides=strides, fill=fill),
    )


# The batch dim is a window dim too: its box entry, x.shape[0], is >= 1.
# "symbolic-x": symbolic dims of x, but an all-int box too.
OPS = (Op("window", build_window, ALL_DTYPES, min_batch=1,
          export_variants={"symbolic-x": ("r", "w")}),)
