"""One table of every jax_tma op for the mode tests (tests/test_mode_*.py): per
op, random inputs of a dtype from `rng`, the jax_tma call, its jnp/lax
equivalent, the NumPy result (bits from reference.py's helpers, fills as jnp
writes them), the operands a gradient takes and the dims a mesh may split;
and the small shims that hide the differences between jax 0.10 and 0.12."""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_tma
import reference
from reference import (ALL_DTYPES, broadcast_reference, col2im_reference,
                       im2col_reference, ppermute_reference, random_array, window_reference)

# ---- jax versions ------------------------------------------------------------------

def set_mesh(mesh):
    """jax.set_mesh (jax >= 0.7), else jax.sharding.use_mesh: `mesh` as the
    context mesh, which Explicit-axis shardings need."""
    if hasattr(jax, "set_mesh"):
        return jax.set_mesh(mesh)
    return jax.sharding.use_mesh(mesh)


def shard_map(f, *, mesh, in_specs, out_specs):
    """jax.shard_map with its default checks (check_vma on); the older
    jax.experimental form where jax has no jax.shard_map."""
    if hasattr(jax, "shard_map"):
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    from jax.experimental.shard_map import shard_map as legacy  # pragma: no cover
    return legacy(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)


def cpu_mesh(shape=(2, 4), names=("a", "b"), axis_type=AxisType.Auto) -> Mesh:
    """The mode tests' mesh: 2 x 4 host devices, axes "a" and "b"."""
    return reference.cpu_mesh(shape, names, axis_type)


def explicit_mesh() -> Mesh:
    """A 2 x 4 mesh of Explicit axes "a" and "b", as jax.make_mesh makes by default."""
    return cpu_mesh(axis_type=AxisType.Explicit)


# The 2 x 4 mesh that ppermute's cases permute over, and the spec that splits
# a batch dim over all 8 of its devices.
MESH_AXES = ("a", "b")
BATCH = P(MESH_AXES)


# ---- dtypes ------------------------------------------------------------------------

INT_DTYPES = tuple(d for d in ALL_DTYPES if jnp.issubdtype(d, jnp.integer))
FLOAT_DTYPES = tuple(d for d in ALL_DTYPES if jnp.issubdtype(d, jnp.inexact))
# What col2im and scatter(mode="add") sum (their docstrings): other dtypes are
# refused at trace time with a TypeError.
SUMMABLE = tuple(np.dtype(d) for d in (np.int8, np.int16, np.int32, np.int64, np.uint8,
                                       np.uint16, np.uint32, np.uint64, jnp.bfloat16,
                                       np.float16, np.float32, np.float64, np.complex64,
                                       np.complex128))


def int_extremes(dtype) -> list[int]:
    """The values at the edges of integer `dtype` and next to zero:
    min, min + 1, -1, 0, 1, 2, max - 1, max (those the type holds)."""
    info = ml_dtypes.iinfo(dtype)
    lo, hi = int(info.min), int(info.max)
    return sorted({v for v in (lo, lo + 1, -1, 0, 1, 2, hi - 1, hi) if lo <= v <= hi})


def as_ints(a) -> list[int]:
    """The elements of integer array `a` as Python ints (no wrap-around)."""
    return [int(v) for v in np.asarray(a).reshape(-1)]


# How many cotangent() terms a grad may sum into one element exactly.
EXACT_TERMS = 4


def cotangent(rng, shape, dtype) -> np.ndarray:
    """A cotangent whose sums over a few (up to EXACT_TERMS) terms are exact in
    `dtype`, so that every order of adding gives the same bits: +-1 and
    +-2 where the format has a sign and 2+ mantissa bits, +-1 in float4,
    1 in float8_e8m0fnu (powers of two only); complex: each part so."""
    dtype = np.dtype(dtype)
    part = np.dtype(np.float32 if dtype == np.complex64 else np.float64) \
        if dtype.kind == "c" else dtype
    info = ml_dtypes.finfo(part)
    if float(info.min) >= 0:
        values = [1.0]
    elif int(info.nmant) < 2:
        values = [-1.0, 1.0]
    else:
        values = [-2.0, -1.0, 1.0, 2.0]
    pick = rng.choice(values, size=shape)
    if dtype.kind == "c":
        pick = pick + 1j * rng.choice(values, size=shape)
    return np.asarray(pick).astype(dtype)


# ---- fills as jnp writes them ------------------------------------------------------

_FILLS: dict = {}


def _jnp_fill(kind: str, fill, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    key = (kind, repr(fill), type(fill).__name__, dtype.name)
    if key not in _FILLS:
        # jnp converts a fill past the dtype's range to inf, warning as NumPy does
        with jax.default_device(reference.cpu_device()), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            if kind == "pad":  # on data: padding an empty operand gives other float8 NaN bits
                out = jnp.pad(jnp.ones((1,), dtype), (0, 1), constant_values=fill)[1:]
            else:
                out = jnp.take(jnp.ones((1,), dtype), jnp.array([1]), mode="fill",
                               fill_value=fill)
        _FILLS[key] = np.asarray(out)
    return _FILLS[key]


def pad_fill(fill, dtype) -> np.ndarray:
    """What jnp.pad(..., constant_values=fill) writes in `dtype`: a (1,) array."""
    return _jnp_fill("pad", fill, dtype)


def take_fill(fill, dtype) -> np.ndarray:
    """What jnp.take(..., mode="fill", fill_value=fill) writes in `dtype`: a
    (1,) array. From jnp.pad where it takes the value (the same conversion):
    jnp.take's compiled programs are cached by fill_value, and -0.0 == 0.0,
    so one process's jnp.take(fill_value=0.0) can give -0.0."""
    try:
        return _jnp_fill("pad", fill, dtype)
    except OverflowError:  # a Python int past int64, which jnp.take converts
        return _jnp_fill("take", fill, dtype)


def jnp_fill_value(fill):
    """window's fill in the form jnp.pad takes ("nan" is NaN)."""
    return float("nan") if isinstance(fill, str) else fill


# ---- NumPy results that reference.py has no helper for ----------------------------

def wrap_rows(idx, n: int) -> tuple[np.ndarray, np.ndarray]:
    """jnp.take's reading of integer indices along a dim of size n: negative
    ones wrap once; (rows, inside), rows 0 where outside."""
    rows = [i + n if -n <= i < 0 else i for i in as_ints(idx)]
    inside = np.array([0 <= r < n for r in rows], bool)
    rows = np.array([r if ok else 0 for r, ok in zip(rows, inside)], np.int64)
    return rows, inside


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
    reference.window_reference, out-of-bounds elements window_fill_bits."""
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


def gather_reference(x, idx, axis: int, fill_bits) -> np.ndarray:
    """jax_tma.gather in NumPy: the slabs of x along axis at idx (wrapped
    once), `fill_bits` (jnp's fill) for indices out of range."""
    x, idx = np.asarray(x), np.asarray(idx)
    n = x.shape[axis]
    rows, inside = wrap_rows(idx, n)
    xm = np.moveaxis(x, axis, 0)
    out = np.empty((rows.size,) + xm.shape[1:], x.dtype)
    if n:
        out[...] = xm[rows]
    out[~inside] = fill_bits[0] if np.ndim(fill_bits) else fill_bits
    out = out.reshape(idx.shape + xm.shape[1:])
    return np.ascontiguousarray(np.moveaxis(out, list(range(idx.ndim)),
                                            list(range(axis, axis + idx.ndim))))


def _canonical_nans(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "c":
        parts = a.view(np.float32 if a.dtype == np.complex64 else np.float64)
        parts[np.isnan(parts)] = np.nan
    elif a.dtype.kind == "f" or a.dtype.name in ("bfloat16",):
        a[np.isnan(a.astype(np.float64))] = np.nan
    return a


def scatter_reference(x, idx, u, axis: int, mode: str) -> np.ndarray:
    """jax_tma.scatter on the CPU in NumPy: updates applied in index order
    (the last of duplicates wins a set); adds round to the dtype after each
    add (16-bit floats add in float32), integers wrap, a NaN sum is the
    canonical quiet NaN; indices out of range (after one wrap) dropped."""
    x, u = np.asarray(x), np.asarray(u)
    idx = np.asarray(idx)
    out = np.array(np.moveaxis(x, axis, 0))
    um = np.moveaxis(u.reshape(x.shape[:axis] + (idx.size,) + x.shape[axis + 1:]), axis, 0)
    rows, inside = wrap_rows(idx, x.shape[axis])
    acc = np.float32 if x.dtype.name in ("float16", "bfloat16") else x.dtype
    with np.errstate(over="ignore", invalid="ignore"):
        for i, (r, ok) in enumerate(zip(rows, inside)):
            if not ok:
                continue
            if mode == "set":
                out[r] = um[i]
            else:
                out[r] = _canonical_nans((out[r].astype(acc) + um[i].astype(acc)).astype(x.dtype))
    return np.ascontiguousarray(np.moveaxis(out, 0, axis))


# ---- jnp/lax equivalents that take more than one line --------------------------------

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


def im2col_jnp(x, kernel, strides, pads, dilation, order):
    """jax_tma.im2col as jnp.pad and one strided slice per kernel tap
    (reference.py's tap slices), stacked: any dtype, padding as jnp pads."""
    out = reference._out_spatial(x.shape[1:-1], kernel, strides, pads, dilation)
    xp = jnp.pad(x, ((0, 0),) + tuple(pads) + ((0, 0),))
    taps = [xp[(slice(None),) + sl] for sl in reference._tap_slices(kernel, strides, dilation,
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
    out = reference._out_spatial(spatial, kernel, strides, pads, dilation)
    padded = tuple(n + lo + hi for n, (lo, hi) in zip(spatial, pads))
    if not all(out):  # no patches: nothing read, zeros
        return jnp.zeros((p.shape[0],) + tuple(in_shape_tail), p.dtype)
    k = math.prod(kernel)
    q = p.reshape(p.shape[:-1] + ((c, k) if order == "channel_major" else (k, c)))
    if order == "channel_major":
        q = jnp.swapaxes(q, -1, -2)
    acc = None
    for t, sl in enumerate(reference._tap_slices(kernel, strides, dilation, out)):
        config = [(0, 0, 0)] + [(z.start, n - z.start - ((o - 1) * z.step + 1), z.step - 1)
                                for z, n, o in zip(sl, padded, out)] + [(0, 0, 0)]
        term = lax.pad(q[..., t, :], jnp.zeros((), p.dtype), config)
        acc = term if acc is None else acc + term
    return acc[(slice(None),) + tuple(slice(lo, lo + n) for n, (lo, _) in zip(spatial, pads))]


def _at(axis: int, idx):
    return (slice(None),) * axis + (idx,)


def same_pads(spatial, kernel, strides, dilation):
    """lax's "SAME" padding."""
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilation)]
    return tuple(tuple(p) for p in lax.padtype_to_pads(spatial, eff, strides, "SAME"))


# ---- the table -------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Case:
    """One op on one set of operands.

    args: the operands (NumPy). ours/ref: jax_tma's call and its jnp/lax
    equivalent, functions of the operands that read every size they need
    from the operands' shapes (so they run on a shard_map block or on a
    symbolic shape). expect: the NumPy result for given operands, fills as
    jnp writes them. draw: fresh operands of the same shapes and dtypes.
    diff: the operands a gradient is taken with respect to. batch: the
    operands whose dim 0 is the batch dim, dim 0 of the result too, which
    a mesh or a vmap may split with no data moving between blocks.
    index: the operand that says where to read or write (window's starts,
    gather's and scatter's indices), if any.
    split: the dims of args[0] that a mesh may split (batch first), and
    in_specs(dims) the operands' specs for a {dim of args[0]: mesh axes}.
    exact: the jnp equivalent gives the same bits (but NaN payloads);
    False where it adds in another order. symbolic: per operand, per dim,
    a name for a shape-polymorphic export (None: concrete)."""

    op: str
    dtype: np.dtype
    args: tuple
    ours: Callable
    ref: Callable
    expect: Callable[..., np.ndarray]
    draw: Callable
    diff: tuple[int, ...]
    batch: tuple[int, ...]
    split: tuple[int, ...]
    in_specs: Callable[[dict], tuple]
    exact: bool = True
    collective: bool = False
    index: int | None = None
    symbolic: tuple = ()
    params: dict = dataclasses.field(default_factory=dict)

    def want(self, *args) -> np.ndarray:
        return self.expect(*(args or self.args))

    def batch_specs(self, axes=MESH_AXES) -> tuple:
        return self.in_specs({0: axes})


def _spec(ndim: int, dims: dict) -> P:
    return P(*[dims.get(d) for d in range(ndim)])


def _size(rng, even: bool, lo: int = 1, hi: int = 6) -> int:
    """A dim size: 4 or 8 where a mesh axis of 2 or 4 must divide it."""
    return int(rng.choice([4, 8])) if even else int(rng.integers(lo, hi + 1))


def _rank(rng, even: bool) -> int:
    """How many dims beside the batch dim: at least one where a mesh splits two."""
    return int(rng.integers(1 if even else 0, 3))


def _data(rng, shape, dtype, finite=False):
    return random_array(rng, shape, dtype, finite=finite)


def build_copy(rng, dtype, *, batch=8, even=True, method="auto") -> Case:
    shape = (batch,) + tuple(_size(rng, even) for _ in range(_rank(rng, even)))
    draw = lambda r: (_data(r, shape, dtype),)  # noqa: E731
    return Case(
        op="copy", dtype=np.dtype(dtype), args=draw(rng),
        ours=lambda x: jax_tma.copy(x, method=method), ref=jnp.copy,
        expect=lambda x: np.array(x), draw=draw, diff=(0,), batch=(0,),
        split=tuple(range(len(shape))), in_specs=lambda dims: (_spec(len(shape), dims),),
        symbolic=((("b",) + tuple(f"d{i}" for i in range(1, len(shape)))),),
    )


def build_window(rng, dtype, *, batch=8, even=True, method="auto",
                 start_dtype=np.int32) -> Case:
    """x (B, R, W, C): dims 1 and 2 windowed from traced starts (a 2-array
    of `start_dtype`), B and C taken whole (the dims a mesh may split)."""
    r, w, c = int(rng.integers(3, 9)), int(rng.integers(3, 8)), _size(rng, even, 1, 4)
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
        return _data(rr, shape, dtype), np.array(starts).astype(start_dtype)

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
        draw=draw, diff=(0,), batch=(0,), split=(0, 3),
        in_specs=lambda dims: (_spec(4, dims), P()), index=1,
        symbolic=(("b", "r", "w", "c"), (None,)),
        params=dict(box=box, strides=strides, fill=fill),
    )


def build_im2col(rng, dtype, *, batch=8, even=True, method="auto", rank=None,
                 empty=False) -> Case:
    """Random 1D-3D geometry; `empty` allows an output dim of 0 (a dilated
    kernel larger than the padded input)."""
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
        if empty or all(reference._out_spatial(spatial, kernel, strides, pads, dilation)):
            break
    shape = (batch,) + spatial + (c,)
    geo = dict(strides=strides, padding=padding, dilation=dilation, order=order)
    draw = lambda rr: (_data(rr, shape, dtype),)  # noqa: E731

    def expect(x):  # padded pixels: jnp's zero (float8_e8m0fnu's is 0xFF)
        return im2col_reference(x, kernel, strides, pads, dilation, order, fill=0)

    return Case(
        op="im2col", dtype=np.dtype(dtype), args=draw(rng),
        ours=lambda x: jax_tma.im2col(x, kernel, method=method, **geo),
        ref=lambda x: im2col_jnp(x, kernel, strides, pads, dilation, order),
        expect=expect, draw=draw, diff=(0,), batch=(0,), split=(0,),
        in_specs=lambda dims: (_spec(len(shape), dims),),
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
        (lambda rr: (_data(rr, p_shape, dtype),))
    return Case(
        op="col2im", dtype=np.dtype(dtype), args=draw(rng),
        ours=lambda p: jax_tma.col2im(p, (p.shape[0],) + tail, kernel, method=method, **geo),
        ref=lambda p: col2im_jnp(p, tail, kernel, strides, pads, dilation, order),
        expect=lambda p: col2im_reference(p, (p.shape[0],) + tail, kernel, strides, pads,
                                          dilation, order),
        draw=draw, diff=(0,), batch=(0,), split=(0,),
        in_specs=lambda dims: (_spec(len(p_shape), dims),),
        symbolic=(("b",) + (None,) * (len(p_shape) - 1),),
        params=dict(kernel=kernel, pads=pads, geo=geo, tail=tail),
    )


def build_broadcast(rng, dtype, *, batch=8, even=True, method="auto") -> Case:
    shape = (batch,) + tuple(_size(rng, even) for _ in range(_rank(rng, even)))
    n = int(rng.integers(1, 4))
    axis = int(rng.integers(1, len(shape) + 1))  # the batch dim stays dim 0
    if rng.integers(0, 2):
        axis -= len(shape) + 1  # the same axis, counted from the end
    draw = lambda rr: (_data(rr, shape, dtype),)  # noqa: E731
    return Case(
        op="broadcast", dtype=np.dtype(dtype), args=draw(rng),
        ours=lambda x: jax_tma.broadcast(x, n, axis=axis, method=method),
        ref=lambda x: jnp.broadcast_to(jnp.expand_dims(x, axis),
                                       jnp.expand_dims(x, axis).shape[:axis % (x.ndim + 1)]
                                       + (n,) + x.shape[axis % (x.ndim + 1):]),
        expect=lambda x: broadcast_reference(x, n, axis), draw=draw, diff=(0,), batch=(0,),
        split=tuple(range(len(shape))), in_specs=lambda dims: (_spec(len(shape), dims),),
        symbolic=((("b",) + tuple(f"d{i}" for i in range(1, len(shape)))),),
        params=dict(n=n, axis=axis),
    )


def _indices(rng, n, shape, dtype, unique=False):
    """Indices along a dim of size n: in range, wrapped negatives and out of
    range; `unique`: no two name the same slab (for set, whose duplicates
    jnp leaves unspecified); else at most EXACT_TERMS name one slab, so that
    the sums a gather's grad makes of cotangent() terms are exact."""
    count = math.prod(shape)
    if unique:
        rows = rng.permutation(n)[: min(count, n)]
        rows = np.where(rng.integers(0, 2, rows.shape) == 1, rows - n, rows)
        extra = np.arange(n, n + count - rows.size) + 1
        vals = rng.permutation(np.concatenate([rows, extra]))
    else:
        vals = rng.integers(-n - 2, n + 2, count)
        inside = (vals >= -n) & (vals < n)
        rows = np.where(inside, vals % n, -1)
        seen = np.array([np.count_nonzero(rows[:i] == rows[i]) for i in range(count)], int)
        vals = np.where(inside & (seen >= EXACT_TERMS), n, vals)  # past the end: filled
    return vals.reshape(shape).astype(dtype)


def build_gather(rng, dtype, *, batch=8, even=True, method="auto",
                 index_dtype=np.int32) -> Case:
    """x (B, R, *slab) gathered along dim 1 (axis 1 or its negative form)."""
    slab = tuple(_size(rng, even) for _ in range(_rank(rng, even)))
    r = int(rng.integers(1, 8))
    shape = (batch, r) + slab
    idx_shape = tuple(int(rng.integers(1, 5)) for _ in range(int(rng.integers(0, 3))))
    axis = 1 if rng.integers(0, 2) else 1 - len(shape)
    floating = jnp.issubdtype(dtype, jnp.inexact)
    if floating:
        # no -0.0: jnp.take caches programs by fill_value, where -0.0 == 0.0
        # (test_mode_float_dtypes.py tests it against jnp.pad's bits)
        fill = [0, 0.0, float("nan"), 1.5, -2.0][int(rng.integers(0, 5))]
    elif dtype == np.bool_:
        fill = bool(rng.integers(0, 2))
    else:
        # by index: NumPy makes a list holding 2**64 - 1 a float64 array
        extremes = int_extremes(dtype)
        fill = extremes[int(rng.integers(0, len(extremes)))]

    def draw(rr):
        return _data(rr, shape, dtype), _indices(rr, r, idx_shape, index_dtype)

    def in_specs(dims):
        return (_spec(len(shape), dims), P())

    return Case(
        op="gather", dtype=np.dtype(dtype), args=draw(rng),
        ours=lambda x, i: jax_tma.gather(x, i, axis=axis, fill=fill, method=method),
        ref=lambda x, i: jnp.take(x, i, axis=axis, mode="fill", fill_value=fill),
        expect=lambda x, i: gather_reference(x, i, axis % len(shape), take_fill(fill, dtype)),
        draw=draw, diff=(0,), batch=(0,), split=(0,) + tuple(range(2, len(shape))),
        in_specs=in_specs, exact=True, index=1,
        symbolic=(("b", None) + tuple(f"d{i}" for i in range(2, len(shape))),
                  tuple(f"k{i}" for i in range(len(idx_shape)))),
        params=dict(axis=axis, fill=fill),
    )


# Sub-byte dtypes in two of XLA's kernels: its CPU collective-permute overruns
# their buffers (AddressSanitizer: heap-buffer-overflow in
# InProcessCommunicator::CollectivePermute, reading and writing 2-6 bytes of
# 1-2 byte blocks, jaxlib 0.10.2; glibc's heap checks aborted jax 0.11.2 on
# the GPU machine), and its GPU scatter with unique indices loses updates of
# elements that share a byte (uint2 x.at[i].set on an H100, jax 0.11.2: 6 of
# 18 elements left as x had them, where NumPy and jax_tma wrote them). The
# references run those two as these wider types, which hold the values exactly.
_SUB_BYTE_WIDE = {"int2": np.int8, "int4": np.int8, "uint2": np.uint8, "uint4": np.uint8,
                  "float4_e2m1fn": np.float32}


def build_scatter(rng, dtype, *, batch=8, even=True, method="auto", mode=None,
                  index_dtype=np.int32) -> Case:
    """x (B, R, *slab) updated along dim 1; set with distinct slabs (jnp
    leaves duplicates unspecified), add with duplicates."""
    mode = mode or ("add" if np.dtype(dtype) in SUMMABLE and rng.integers(0, 2) else "set")
    slab = tuple(_size(rng, even) for _ in range(_rank(rng, even)))
    r = int(rng.integers(1, 8))
    shape = (batch, r) + slab
    k = int(rng.integers(1, 6))
    axis = 1 if rng.integers(0, 2) else 1 - len(shape)
    floating = jnp.issubdtype(dtype, jnp.inexact)
    u_shape = (batch, k) + slab

    def draw(rr):
        # adds of exact values: any order gives the same bits
        data = (lambda s: cotangent(rr, s, dtype)) if floating and mode == "add" else \
            (lambda s: _data(rr, s, dtype))
        return data(shape), _indices(rr, r, (k,), index_dtype, unique=mode == "set"), \
            data(u_shape)

    def in_specs(dims):
        return (_spec(len(shape), dims), P(),
                _spec(len(shape), {d: a for d, a in dims.items() if d != 1}))

    def ref(x, i, u):
        # set: distinct slabs, as the hint says (jax's grad of a plain set
        # cannot resolve the sharding of its internal ids on Explicit meshes),
        # sub-byte dtypes through _SUB_BYTE_WIDE
        if mode == "add":
            return jnp.asarray(x).at[_at(axis % x.ndim, i)].add(u, mode="drop")
        x = jnp.asarray(x)
        wide = _SUB_BYTE_WIDE.get(x.dtype.name, x.dtype)
        at = x.astype(wide).at[_at(axis % x.ndim, i)]
        return at.set(jnp.asarray(u).astype(wide), mode="drop", unique_indices=True).astype(x.dtype)

    return Case(
        op=f"scatter-{mode}", dtype=np.dtype(dtype), args=draw(rng),
        ours=lambda x, i, u: jax_tma.scatter(x, i, u, axis=axis, mode=mode, method=method),
        ref=ref, expect=lambda x, i, u: scatter_reference(x, i, u, axis % len(shape), mode),
        draw=draw, diff=(0, 2), batch=(0, 2), split=(0,) + tuple(range(2, len(shape))),
        in_specs=in_specs, exact=mode == "set" or not floating, index=1,
        symbolic=(("b", None) + tuple(f"d{i}" for i in range(2, len(shape))), ("k",),
                  ("b", "k") + tuple(f"d{i}" for i in range(2, len(shape)))),
        params=dict(axis=axis, mode=mode),
    )


def _on_mesh(local, spec):
    """`local` as shard_map of the context mesh (jax.set_mesh) or, without
    one, of an Auto 2 x 4 mesh of host devices."""
    def run(x):
        mesh = None if not jax.sharding.get_abstract_mesh().empty else cpu_mesh()
        return shard_map(local, mesh=mesh, in_specs=spec, out_specs=spec)(x)
    return run


def _lax_ppermute(b, perm):
    """lax.ppermute over MESH_AXES, sub-byte dtypes through _SUB_BYTE_WIDE."""
    wide = _SUB_BYTE_WIDE.get(b.dtype.name)
    if wide is None:
        return lax.ppermute(b, MESH_AXES, perm)
    return lax.ppermute(b.astype(wide), MESH_AXES, perm).astype(b.dtype)


def build_ppermute(rng, dtype, *, batch=16, even=True, method="auto") -> Case:
    """A (batch, ...) array split over all 8 devices of the 2 x 4 mesh,
    blocks moved along a random partial permutation of the 8 positions."""
    shape = (batch,) + tuple(_size(rng, even) for _ in range(_rank(rng, even)))
    k = int(rng.integers(1, 9))
    perm = tuple(zip(map(int, rng.permutation(8)[:k]), map(int, rng.permutation(8)[:k])))
    draw = lambda rr: (_data(rr, shape, dtype),)  # noqa: E731
    local = lambda b: jax_tma.ppermute(b, MESH_AXES, perm, method=method)  # noqa: E731
    local_ref = lambda b: _lax_ppermute(b, perm)  # noqa: E731

    def expect(x):
        out = ppermute_reference(x, 8, perm)
        received = ppermute_reference(np.ones(x.shape, bool), 8, perm)
        out[~received] = take_fill(0, x.dtype)[0]  # lax's zeros (float8_e8m0fnu: 0xFF)
        return out
    return Case(
        op="ppermute", dtype=np.dtype(dtype), args=draw(rng),
        ours=_on_mesh(local, BATCH), ref=_on_mesh(local_ref, BATCH),
        expect=expect, draw=draw, diff=(0,), batch=(0,),
        split=(0,), in_specs=lambda dims: (_spec(len(shape), dims),), collective=True,
        symbolic=(("8*b",) + tuple(f"d{i}" for i in range(1, len(shape))),),
        params=dict(perm=perm, local=local, local_ref=local_ref),
    )


@dataclasses.dataclass(frozen=True)
class Op:
    name: str
    build: Callable[..., Case]
    dtypes: tuple
    methods: tuple[str, ...] = ("auto", "simt")


OPS = (
    Op("copy", build_copy, ALL_DTYPES),
    Op("window", build_window, ALL_DTYPES),
    Op("im2col", build_im2col, ALL_DTYPES),
    Op("col2im", build_col2im, SUMMABLE),
    Op("broadcast", build_broadcast, ALL_DTYPES),
    Op("gather", build_gather, ALL_DTYPES),
    Op("scatter-set", functools.partial(build_scatter, mode="set"), ALL_DTYPES),
    Op("scatter-add", functools.partial(build_scatter, mode="add"), SUMMABLE),
    Op("ppermute", build_ppermute, ALL_DTYPES, ("auto", "tma", "simt")),
)
OP_NAMES = tuple(o.name for o in OPS)
BY_NAME = {o.name: o for o in OPS}
# The ops that run outside shard_map (ppermute runs only inside one).
LOCAL_OPS = tuple(o.name for o in OPS if o.name != "ppermute")


def build(name: str, rng, dtype=np.float32, **kw) -> Case:
    return BY_NAME[name].build(rng, np.dtype(dtype), **kw)


# ---- comparisons -----------------------------------------------------------------------

def _is_nan(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "c":
        return np.isnan(a.real) | np.isnan(a.imag)
    if jnp.issubdtype(a.dtype, jnp.inexact):
        with np.errstate(invalid="ignore"):
            return np.isnan(a.astype(np.float64))
    return np.zeros(a.shape, bool)


def assert_like_jnp(actual, jnp_result, exact: bool = True) -> None:
    """`actual` against the jnp equivalent's result: same dtype and shape; bit
    for bit where jnp's element is not NaN (jnp quiets some formats' NaN
    payloads on the CPU), NaN where it is NaN. exact=False (sums in another
    order): close in value instead."""
    actual, want = np.asarray(actual), np.asarray(jnp_result)
    assert actual.dtype == want.dtype, f"dtype {actual.dtype}, jnp gives {want.dtype}"
    assert actual.shape == want.shape, f"shape {actual.shape}, jnp gives {want.shape}"
    nan = _is_nan(want)
    assert np.array_equal(_is_nan(actual), nan), \
        f"NaNs at other places than jnp's{reference.seed_note()}"
    if exact:
        reference.assert_bits_equal(actual[~nan], want[~nan])
    else:
        wide = np.complex128 if want.dtype.kind == "c" else np.float64
        np.testing.assert_allclose(actual[~nan].astype(wide), want[~nan].astype(wide),
                                   rtol=2e-2, atol=1e-6, err_msg=reference.seed_note())


def put(args, mesh, specs):
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, specs))


# ---- transforms that every mode test applies alike -----------------------------------

def vjp(case: Case, fn, args, ct):
    """(fn(*args), the cotangents of case.diff's operands) for cotangent ct."""
    def f(*d):
        full = list(args)
        for i, v in zip(case.diff, d):
            full[i] = v
        return fn(*full)

    y, pull = jax.vjp(f, *(args[i] for i in case.diff))
    return y, pull(ct)


def ref_grads(case: Case, args, ct):
    """The jnp equivalent's grads for cotangent ct, and (float8_e8m0fnu only;
    else the same) those taken in float32 and converted as jnp converts
    (0 -> 0xFF): for assert_grads_like_jnp."""
    grads = vjp(case, case.ref, args, ct)[1]
    if case.dtype.name != "float8_e8m0fnu":
        return grads, grads
    wide = [a.astype(np.float32) if i in case.diff else a for i, a in enumerate(args)]
    exact = vjp(case, case.ref, wide, ct.astype(np.float32))[1]
    return grads, tuple(g.astype(case.dtype) for g in exact)


def assert_grads_like_jnp(got, jnp_grad, exact) -> None:
    """A grad against the jnp equivalent's (assert_like_jnp). float8_e8m0fnu
    has no zero: jnp's 0 is its NaN, so jnp's sums from zero are NaN whatever
    is added, and where that happens depends on how the jnp code is written.
    There, where jnp's grad is NaN, `got` may be NaN or `exact` (the grad
    taken in float32 and converted: 0 is NaN); elsewhere it is jnp's, bit
    for bit."""
    got, jnp_grad, exact = np.asarray(got), np.asarray(jnp_grad), np.asarray(exact)
    if got.dtype.name != "float8_e8m0fnu":
        return assert_like_jnp(got, jnp_grad)
    assert got.shape == jnp_grad.shape and got.dtype == jnp_grad.dtype, \
        f"{jax.typeof(got)}, jnp gives {jax.typeof(jnp_grad)}"
    g, j, e = (reference.as_bits(a) for a in (got, jnp_grad, exact))
    nan = j == 0xFF
    ok = np.where(nan, (g == 0xFF) | (g == e), g == j)
    if not ok.all():
        i = np.flatnonzero(~ok)[0]
        raise AssertionError(f"{(~ok).sum()} of {ok.size} elements differ; first at flat index "
                             f"{i}: got {g[i]:#x}, jnp {j[i]:#x}, exact {e[i]:#x}"
                             f"{reference.seed_note()}")


def out_struct(case: Case):
    return jax.eval_shape(case.ours, *case.args)


def local_fns(case: Case):
    """(ours, ref) as they run on one block inside shard_map over the 2 x 4 mesh."""
    if case.collective:
        return case.params["local"], case.params["local_ref"]
    return case.ours, case.ref


def stacked(case: Case, rng, k: int = 2, batched=None):
    """Operands for jax.vmap: k fresh draws stacked along a new dim 0 for
    the operands in `batched` (default all), the first draw's for the
    others; (operands, in_axes, the NumPy result of each draw stacked)."""
    batched = tuple(range(len(case.args))) if batched is None else tuple(batched)
    draws = [case.draw(rng) for _ in range(k)]
    args = tuple(np.stack([d[i] for d in draws]) if i in batched else draws[0][i]
                 for i in range(len(case.args)))
    in_axes = tuple(0 if i in batched else None for i in range(len(case.args)))
    want = np.stack([case.want(*(d[i] if i in batched else draws[0][i]
                                 for i in range(len(case.args)))) for d in draws])
    return args, in_axes, want
