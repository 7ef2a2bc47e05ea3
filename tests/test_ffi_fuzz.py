"""Fuzz at the FFI boundary: every registered jax_tma target is called raw, the
way exported HLO reaches a handler (jax.ffi.ffi_call, none of the Python
wrappers' checks), first correctly, then with one random mutation of that call
(shapes, ranks, dtypes, attribute values and types, attributes, operands and
results missing or extra) and a few hand-picked nasty calls. Every call must
give the reference result or raise an error that names the rule the mutation
broke: the handler's own errors name the op and then the rule (each kind of
mutation has the rules it may break: _rule); XLA's binding layer rejects some
calls before the handler runs, with messages of its own for each kind (_XLA).
Inputs must come back bit for bit. Calls run in-process, so a crash fails the
run and an ASan build catches out-of-bounds access. Rerun a failure with
JAX_TMA_FUZZ_SEED=<seed from its message>."""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import re
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pytest

from jax_tma import _ffi, _jax_tma
from reference import (ALL_DTYPES, SUB_BYTE_BITS, as_bits, assert_bits_equal,
                       broadcast_reference, col2im_reference, im2col_reference, random_array,
                       skip_unless_required)

S = jax.ShapeDtypeStruct
CASES = 40

# XLA's own rejections, before the handler runs (the same in jaxlib 0.10.2 and
# 0.12.0.1), by the kind of mutation that meets them: operand, result and
# attribute counts at execute; a typed binding (an attribute's kind, a typed
# buffer) that cannot decode at execute, attribute kinds it cannot encode at
# compile. None names the target or op.
_XLA = {
    "attributes": r"Wrong number of attributes: expected",
    "operands": r"Wrong number of arguments: expected",
    "results": r"Wrong number of results: expected",
    "decode": r"Failed to decode all FFI handler operands"
              r"|Unsupported (array element )?(attribute )?type for attribute",
}
# JAX's own rejection while lowering: a uint64 attribute >= 2^63 (a fill
# pattern with the top bit set) fails in its MLIR attribute builder with
# RuntimeError("std::bad_cast"); such a value never reaches a handler.
_BAD_CAST = "std::bad_cast"
# The rules of an array's form that every handler checks, as they word them:
# a shape (ranks, dims, element counts, sizes) and an element type.
_SHAPE_RULES = r"rank|\bdims?\b|\belements?\b|entries|shape|\bsize|batch"
_DTYPE_RULES = r"element type|sub-byte"

_BYTE_DTYPES = tuple(d for d in ALL_DTYPES if d.name not in SUB_BYTE_BITS)
_SUMMABLE = tuple(d for d in _BYTE_DTYPES  # what col2im adds
                  if d.kind in "iuc" or d.name in ("float16", "bfloat16", "float32", "float64"))
# Baselines take the methods that run on every device; the forced hardware
# methods (which may refuse a geometry, naming the rule) come in as mutations.
_PORTABLE = ("auto", "simt")
_NASTY_INTS = (-1, 0, 1, 2, 3, 2**31 - 1, 2**31, -2**31, 2**32 + 1, 2**62, 2**63 - 1, -2**63)
_NASTY_STRS = ("", "AUTO", "auto ", "auto\0", "tma", "simt", "bulk", "multicast", "dsmem",
               "store", "x" * 300)
# The ppermute meeting state is per instance id and lives as long as the
# process; lowerings number theirs from 1 and test_ppermute's raw calls from
# 10^12, so the fuzz takes its own range and never mutates the value.
_instances = itertools.count(2**62)


@dataclasses.dataclass
class Call:
    operands: list[np.ndarray]
    results: list[S]
    attrs: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Spec:
    ops: tuple[str, ...]                                  # names the handler's errors start with
    baseline: Callable[[np.random.Generator], Call]       # a correct call
    reference: Callable[[Call], list[np.ndarray]]         # the results of an accepted call
    # hand-picked calls, from a baseline, each with the rule it breaks (a
    # pattern of the handler's error after the op's name)
    nasty: tuple[tuple[Callable[[Call], Call], str], ...] = ()
    # The op's own wording of the rules a kind of mutation ("shape", "dtype",
    # "operands", "results") breaks, beyond _SHAPE_RULES / _DTYPE_RULES and
    # XLA's; and, by attribute, what else a wrong value of it breaks (the
    # attribute's own name always counts).
    rules: dict[str, str] = dataclasses.field(default_factory=dict)
    attr_rules: dict[str, str] = dataclasses.field(default_factory=dict)
    keep: tuple[str, ...] = ()                            # attributes never mutated
    waits_for_peer: Callable[[Call], bool] = lambda call: False  # would block until a timeout
    # Whether an accepted call's results are defined bit for bit on the
    # platform (else only: no crash, inputs unchanged, the right shapes).
    exact: Callable[[str, Call], bool] = lambda platform, call: True


def _dtype(rng, pool=_BYTE_DTYPES) -> np.dtype:
    return pool[int(rng.integers(len(pool)))]


def _pick(rng, options):
    return options[int(rng.integers(len(options)))]


def _with(call: Call, operands=None, results=None, **attrs) -> Call:
    return Call(list(call.operands if operands is None else operands),
                list(call.results if results is None else results), {**call.attrs, **attrs})


def _i64(*values) -> np.ndarray:
    return np.array(values, np.int64)


# ---- copy, and the CUDA-only benchmark references shaped like it -------------

def _copy_call(rng, methods=_PORTABLE, multiple=1, min_dim=0) -> Call:
    dtype = _dtype(rng)
    shape = tuple(int(v) for v in rng.integers(min_dim, 5, int(rng.integers(0, 4))))
    if math.prod(shape) * dtype.itemsize % multiple:
        shape = (multiple,)
    x = random_array(rng, shape, dtype)
    attrs = {"method": _pick(rng, methods)} if methods else {}
    return Call([x], [S(shape[::-1], dtype)], attrs)


def _copy_reference(call: Call) -> list[np.ndarray]:
    return [call.operands[0].reshape(call.results[0].shape)]


def _write_reference(call: Call) -> list[np.ndarray]:
    y = call.results[0]
    return [np.full(math.prod(y.shape) * y.dtype.itemsize, 0x5A, np.uint8).view(y.dtype)
            .reshape(y.shape)]


def _read_reference(call: Call) -> list[np.ndarray]:
    # Flat first: an empty (0, 3) 1-byte array cannot be viewed as uint32 by rows.
    words = np.ascontiguousarray(call.operands[0]).reshape(-1).view(np.uint32)
    return [np.bitwise_xor.reduce(words.reshape(-1, 4), axis=0)]


_COPY_NASTY = (
    (lambda c: _with(c, [np.ones(c.operands[0].shape, jax.numpy.int4)],
                     [S(c.results[0].shape, jax.numpy.int4)]), r"sub-byte|size"),
    (lambda c: _with(c, results=[S((2**20,), c.results[0].dtype)]), r"elements|size"),
    (lambda c: _with(c, [np.zeros((0, 3), c.operands[0].dtype)],
                     [S((3, 0), c.results[0].dtype)]), r"elements|size|shape"),
)


# ---- window -------------------------------------------------------------------

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
    dtype = _dtype(rng)
    src = random_array(rng, (batch if src_batched else ()) + src_shape, dtype)
    start_dtype = _pick(rng, (np.int32, np.int64))
    layout = int(rng.integers(3)) if batch else int(rng.integers(2))
    shape = (batch if layout == 2 else ()) + (r,)
    start = rng.integers(-3, max(x_shape) + 3, shape).astype(start_dtype)
    starts = list(start.reshape(r, 1)) if layout == 0 else [start]
    fill = 0 if transpose else _pick(rng, (0, int(rng.integers(2**63))))
    return Call([src] + starts, [S(batch + dst_shape, dtype)],
                dict(strides=rng.integers(1, 4, r), fill_bits=np.uint64(fill),
                     transpose=transpose, method=_pick(rng, _PORTABLE),
                     # any value is valid: it only steers auto's kernel choice
                     inner_start=np.int64(_pick(rng, (-2**63, int(rng.integers(-40, 40)))))))


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
    fill = np.frombuffer(int(call.attrs["fill_bits"]).to_bytes(8, "little") * 2, np.uint8)[:eb]
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
    return _with(c, results=[S(y.shape[:-1] + (0,), y.dtype)])


def _extreme_starts(c: Call) -> Call:  # the handler clamps them to +-2^62
    ends = itertools.cycle((-2**63, 2**63 - 1))
    return _with(c, c.operands[:1] + [np.full(s.shape, next(ends), np.int64)
                                      for s in c.operands[1:]])


_WINDOW_NASTY = (
    (_zero_box, _SHAPE_RULES + r"|box"),
    (lambda c: _with(c, strides=np.full(len(c.attrs["strides"]), 2**31 - 1)), r"strides"),
    (lambda c: _with(c, strides=np.full(17, 1)), r"strides|spatial rank"),
    (lambda c: _with(c, fill_bits=np.uint64(2**63)), r"fill"),  # or JAX's bad_cast
    (_extreme_starts, r"start"),
    (lambda c: _with(c, c.operands + c.operands[1:]), r"start"),
)


# ---- im2col / col2im ------------------------------------------------------------

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
    dtype = _dtype(rng, _SUMMABLE if transpose else _BYTE_DTYPES)
    src, dst = (p_shape, x_shape) if transpose else (x_shape, p_shape)
    return Call([random_array(rng, src, dtype)], [S(dst, dtype)],
                dict(kernel=kernel, strides=strides, dilation=dilation, pad_lo=lo, pad_hi=hi,
                     channel_major=bool(rng.integers(2)), transpose=transpose,
                     method=_pick(rng, _PORTABLE)))


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
        kernel=_i64(2**30, 2**30, 4), strides=_i64(1, 1, 1), dilation=_i64(1, 1, 1),
        pad_lo=_i64(0, 0, 0), pad_hi=_i64(2**30 - 1, 2**30 - 1, 3), channel_major=False,
        transpose=transpose, method="auto"))


def _huge_kernel_no_channels(r: int) -> Callable[[Call], Call]:
    """C = 0 under a kernel of (2^31 - 1)^r taps. r = 2: the loops spun over
    2^62 empty taps (regression); r = 3: too many taps to count."""
    big = _i64(*[2**31 - 1] * r)
    return lambda c: Call([np.ones((1,) * (r + 1) + (0,), np.float32)],
                          [S((1,) * (r + 1) + (0,), np.float32)],
                          dict(kernel=big, strides=big, dilation=_i64(*[1] * r), pad_lo=big,
                               pad_hi=_i64(*[0] * r), channel_major=False, transpose=False,
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
    (lambda c: _with(c, kernel=np.full(len(c.attrs["kernel"]), 2**31 - 1)), _IM2COL_GEOMETRY),
    (lambda c: _with(c, dilation=np.full(len(c.attrs["kernel"]), 2**62)), r"dilation"),
    (lambda c: _with(c, pad_lo=np.full(len(c.attrs["kernel"]), -2**63)), r"padding|pad_lo"),
    (lambda c: _with(c, transpose=not c.attrs["transpose"]),
     _IM2COL_GEOMETRY + r"|cannot be summed"),
)


# ---- broadcast ----------------------------------------------------------------

def _broadcast_call(rng) -> Call:
    dtype = _dtype(rng)
    x = random_array(rng, tuple(int(v) for v in rng.integers(0, 4, int(rng.integers(0, 4)))),
                     dtype)
    axis = int(rng.integers(x.ndim + 1))
    method, cluster = _pick(rng, (("auto", 0), ("simt", 0), ("simt", 1)))
    y = x.shape[:axis] + (int(rng.integers(0, 4)),) + x.shape[axis:]
    return Call([x], [S(y, dtype)], dict(axis=np.int64(axis), method=method,
                                          cluster_size=np.int64(cluster)))


def _broadcast_reference(call: Call) -> list[np.ndarray]:
    axis = int(call.attrs["axis"])
    return [broadcast_reference(call.operands[0], call.results[0].shape[axis], axis)]


_BROADCAST_NASTY = (
    (lambda c: _with(c, axis=np.int64(-1)), r"axis"),
    (lambda c: _with(c, axis=np.int64(2**63 - 1)), r"axis"),
    (lambda c: _with(c, method="multicast", cluster_size=np.int64(32)), r"cluster_size"),
    # The forced hardware methods may refuse a geometry (on a GPU), naming it.
    (lambda c: _with(c, method="multicast", cluster_size=np.int64(16)), r"method|cluster"),
    (lambda c: _with(c, method="dsmem", cluster_size=np.int64(2)), r"method|cluster"),
    (lambda c: _with(c, method="store", cluster_size=np.int64(1)), r"method|cluster"),
    (lambda c: _with(c, results=[S((0,) + c.operands[0].shape, c.operands[0].dtype)],
                     axis=np.int64(0)), _SHAPE_RULES),
)


# ---- ppermute (one device: a raw call reaches the handler's own checks) -------

def _ppermute_call(rng) -> Call:
    """This device (ordinal 0) receiving its own block or zeros, alone or
    beside devices that it exchanges nothing with."""
    c = _copy_call(rng, min_dim=1)  # non-empty: the call reaches the meeting
    c.results[0] = S(c.operands[0].shape, c.results[0].dtype)
    n = int(rng.integers(1, 4))
    me = int(rng.integers(n))
    sources = np.full(n, -1, np.int64)
    sources[me] = _pick(rng, (me, -1))
    return _with(c, instance=np.int64(next(_instances)),
                 devices=np.insert(rng.choice(np.arange(1, 64), n - 1, replace=False), me, 0),
                 sources=sources, push=bool(rng.integers(2)), process=np.int64(0),
                 processes=np.zeros(n, np.int64), links="", site="fuzz",
                 timeout_ms=np.int64(1000))


def _ppermute_plan(call: Call) -> tuple[int, np.ndarray] | None:
    """(this device's position, sources) when the handler would accept the
    devices, sources and processes attributes (every device of this process,
    process 0), else None."""
    devices, sources, processes = (call.attrs.get(k) for k in ("devices", "sources", "processes"))
    if not all(isinstance(v, np.ndarray) and v.dtype == np.int64
               for v in (devices, sources, processes)):
        return None
    devices, sources, processes = devices.reshape(-1), sources.reshape(-1), processes.reshape(-1)
    n = len(devices)
    taken = sources[sources >= 0]
    ok = (n > 0 and len(sources) == n and len(set(devices.tolist())) == n and 0 in devices
          and ((sources >= -1) & (sources < n)).all() and len(set(taken.tolist())) == len(taken)
          and len(processes) == n and not processes.any() and call.attrs.get("process") == 0)
    return (devices.tolist().index(0), sources) if ok else None


def _ppermute_waits_for_peer(call: Call) -> bool:
    """Whether device 0 would wait for a peer that never runs (timeout_ms, then an
    error): its source or its receiver is another device."""
    plan = _ppermute_plan(call)
    if plan is None:
        return False
    me, sources = plan
    return sources[me] not in (-1, me) or any(s == me for i, s in enumerate(sources) if i != me)


def _ppermute_reference(call: Call) -> list[np.ndarray]:
    me, sources = _ppermute_plan(call)
    y = _copy_reference(call)[0]
    return [y if sources[me] == me else np.zeros_like(y)]


def _reused_instance(c: Call) -> Call:
    """The instance of the last baseline, which ran, now among one device
    more: the handler's meeting state refuses the other size."""
    return _with(c, devices=np.append(c.attrs["devices"], 64),
                 sources=np.append(c.attrs["sources"], -1),
                 processes=np.append(c.attrs["processes"], 0))


_PPERMUTE_NASTY = (
    (_reused_instance, r"instance"),
    (lambda c: _with(c, instance=np.int64(-2**63), devices=_i64(0), sources=_i64(0),
                     processes=_i64(0)), r"instance"),
    (lambda c: _with(c, devices=_i64(2**63 - 1, 0), sources=_i64(-2**63, 1),
                     processes=_i64(0, 0)), r"sources"),
    (lambda c: _with(c, devices=_i64(), sources=_i64(), processes=_i64()), r"devices|sources"),
    (lambda c: _with(c, processes=np.ones_like(c.attrs["processes"])), r"among the devices"),
    (lambda c: _with(c, devices=np.append(c.attrs["devices"], 65),
                     sources=np.append(c.attrs["sources"], -1),
                     processes=np.append(c.attrs["processes"], 7), links="a"),
     r"process 7 has no link name \(1 given\)"),
)


# ---- gather / scatter ---------------------------------------------------------

_INDEX_DTYPES = tuple(np.dtype(d) for d in (np.int8, np.int16, np.int32, np.int64, np.uint8,
                                            np.uint16, np.uint32, np.uint64))


def _tables_of(call: Call, lead: int) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """The indices, the tables and their fills / updates of a gather (lead=1:
    indices, x_0..x_{n-1}, fill_0..) or scatter call (lead=2: indices, order,
    x_0.., updates_0..), n = the results."""
    n = len(call.results)
    rest = call.operands[lead:]
    return call.operands[0], rest[:n], rest[n:2 * n]


def _slab_geometry(call: Call, x: np.ndarray) -> tuple[int, int, int, int, int]:
    """(B, P, N, M, slab bytes) of table x of a gather or scatter call
    (gather_common.h)."""
    idx = call.operands[0]
    axis, batch = int(call.attrs["axis"]), int(call.attrs["batch"])
    return (math.prod(x.shape[:batch]), math.prod(x.shape[batch:axis]), x.shape[axis],
            math.prod(idx.shape[batch:]), math.prod(x.shape[axis + 1:]) * x.dtype.itemsize)


def _table_rows(idx: np.ndarray, n: int, batch: int) -> np.ndarray:
    """(B, M) rows the indices pick: negatives wrap once, -1 out of range."""
    flat = idx.reshape(math.prod(idx.shape[:batch]), math.prod(idx.shape[batch:]))
    if flat.dtype.kind == "u":
        return np.where(flat < np.uint64(n), flat, 0).astype(np.int64) - (flat >= np.uint64(n))
    v = flat.astype(np.int64)
    v = np.where(v < 0, v + n, v)
    return np.where((v >= 0) & (v < n), v, -1)


def _slab_call(rng, dtypes) -> tuple[np.ndarray, list[np.ndarray], dict, list[tuple[int, ...]]]:
    """Indices, a table of each dtype (1 to 3: their dims up to axis shared,
    their slab dims their own), the axis/batch attributes and each table's
    gathered slabs' shape."""
    r = int(rng.integers(1, 4))
    lead = tuple(int(v) for v in rng.integers(0, 5, r))
    axis = int(rng.integers(r))
    batch = int(rng.integers(axis + 1))
    idx_shape = lead[:batch] + tuple(int(v) for v in rng.integers(0, 4, int(rng.integers(0, 3))))
    n = lead[axis]
    idx_dtype = _pick(rng, _INDEX_DTYPES)
    lo = 0 if idx_dtype.kind == "u" else -n - 2
    idx = rng.integers(lo, n + 2, idx_shape).astype(idx_dtype)
    xs, slab_shapes = [], []
    for dtype in dtypes:
        x_shape = lead[:axis + 1] + tuple(int(v) for v in rng.integers(0, 5, r - axis - 1))
        xs.append(random_array(rng, x_shape, dtype))
        slab_shapes.append(x_shape[:axis] + idx_shape[batch:] + x_shape[axis + 1:])
    attrs = dict(axis=np.int64(axis), batch=np.int64(batch), method=_pick(rng, _PORTABLE))
    return idx, xs, attrs, slab_shapes


def _table_count(rng) -> int:
    return int(rng.choice([1, 1, 2, 3]))


def _gather_call(rng) -> Call:
    dtypes = [_dtype(rng) for _ in range(_table_count(rng))]
    idx, xs, attrs, out_shapes = _slab_call(rng, dtypes)
    return Call([idx, *xs, *(random_array(rng, (), d) for d in dtypes)],
                [S(o, d) for o, d in zip(out_shapes, dtypes)], attrs)


def _gather_reference(call: Call) -> list[np.ndarray]:
    idx, xs, fills = _tables_of(call, 1)
    outs = []
    for x, fill, y in zip(xs, fills, call.results):
        b, p, n, m, s = _slab_geometry(call, x)
        eb = x.dtype.itemsize
        table = np.ascontiguousarray(x).view(np.uint8).reshape(b, p, n, s)
        rows = _table_rows(idx, n, int(call.attrs["batch"]))
        out = np.empty((b, p, m, s), np.uint8)
        out[...] = np.tile(np.ascontiguousarray(fill).reshape(1).view(np.uint8), s // eb)
        for i, j in zip(*np.nonzero(rows >= 0)):
            out[i, :, j] = table[i, :, rows[i, j]]
        outs.append(out.view(y.dtype).reshape(y.shape))
    return outs


def _sorted_order(idx: np.ndarray, n: int, batch: int) -> np.ndarray:
    """What deterministic scatter passes as `order`: per batch entry the
    stable argsort of the rows (out-of-range ones as n)."""
    rows = _table_rows(idx, n, batch)
    keys = np.where(rows >= 0, rows, n)
    return np.argsort(keys, axis=-1, kind="stable").astype(np.int32).reshape(
        idx.shape[:batch] + (keys.shape[-1],))


def _scatter_call(rng) -> Call:
    mode = _pick(rng, ("set", "add"))
    dtypes = [_dtype(rng, _SUMMABLE if mode == "add" else _BYTE_DTYPES)
              for _ in range(_table_count(rng))]
    idx, xs, attrs, upd_shapes = _slab_call(rng, dtypes)
    axis, batch = int(attrs["axis"]), int(attrs["batch"])
    n = xs[0].shape[axis]
    # Floats add in a defined order only with deterministic=True.
    deterministic = (mode == "add" and any(d.kind not in "iu" for d in dtypes)) or \
        bool(rng.integers(2))
    if not deterministic:  # one update per row: any winner is the same one
        rows = _table_rows(idx, n, batch)
        for row in rows:
            _, first = np.unique(row, return_index=True)
            dup = np.setdiff1d(np.arange(row.size), first)
            row[dup] = -1
        flat = idx.reshape(rows.shape)
        flat[rows < 0] = n + 1 if idx.dtype.kind == "u" else -n - 1
    order = _sorted_order(idx, n, batch) if deterministic else np.zeros(0, np.int32)
    attrs.update(mode=mode, deterministic=deterministic)
    return Call([idx, order, *xs, *(random_array(rng, u, d) for u, d in zip(upd_shapes, dtypes))],
                [S(x.shape, x.dtype) for x in xs], attrs)


def _add_parts(a: np.ndarray, u: np.ndarray) -> np.ndarray:
    """a + u as the handlers add: integers wrap, 16-bit floats in f32 rounded
    once, a NaN sum stored as the canonical quiet NaN; complex by parts."""
    if a.dtype.kind in "iu":
        w = _UNSIGNED[a.dtype.itemsize]
        return (a.view(w) + u.view(w)).view(a.dtype)
    if a.dtype.kind == "c":
        part = np.float32 if a.dtype == np.complex64 else np.float64
        return _add_parts(a.view(part), u.view(part)).view(a.dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        out = (a.astype(np.float64) + u.astype(np.float64)).astype(a.dtype) \
            if a.dtype.itemsize == 8 else \
            (a.astype(np.float32) + u.astype(np.float32)).astype(a.dtype)
    out[np.isnan(out)] = np.nan
    return out


_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _scatter_reference(call: Call) -> list[np.ndarray]:
    """Every update applied in index order (the CPU handler's order)."""
    idx, xs, upds = _tables_of(call, 2)
    outs = []
    for x, upd in zip(xs, upds):
        b, p, n, m, s = _slab_geometry(call, x)
        eb = x.dtype.itemsize
        out = np.ascontiguousarray(x).copy()
        table = out.reshape(b, p, n, s // eb)
        slabs = np.ascontiguousarray(upd).reshape(b, p, m, s // eb)
        rows = _table_rows(idx, n, int(call.attrs["batch"]))
        for i in range(b):
            for j in range(m):
                if rows[i, j] < 0:
                    continue
                if call.attrs["mode"] == "set":
                    table[i, :, rows[i, j]] = slabs[i, :, j]
                else:
                    table[i, :, rows[i, j]] = _add_parts(table[i, :, rows[i, j]], slabs[i, :, j])
        outs.append(out)
    return outs


def _scatter_exact(platform: str, call: Call) -> bool:
    """The CPU applies updates in index order whatever the call; the GPU only
    with deterministic=True and the stable order, or where the order cannot
    matter (integer adds; sets of one update per row)."""
    if platform == "cpu":
        return True
    idx, xs, _ = _tables_of(call, 2)
    order = call.operands[1]
    axis, batch = int(call.attrs["axis"]), int(call.attrs["batch"])
    n = xs[0].shape[axis]
    if call.attrs.get("deterministic") is True:
        want = _sorted_order(idx, n, batch)
        return order.dtype == np.int32 and np.array_equal(order.reshape(-1), want.reshape(-1))
    if call.attrs.get("mode") == "add":  # floats: hardware order, f32 subnormals flushed
        return all(x.dtype.kind in "iu" for x in xs)
    rows = _table_rows(idx, n, batch)
    return all(np.unique(r[r >= 0]).size == (r >= 0).sum() for r in rows)


def _one_table(c: Call) -> Call:
    """Gather call c with its first table alone."""
    idx, xs, fills = _tables_of(c, 1)
    return _with(c, [idx, xs[0], fills[0]], c.results[:1])


def _gathered(x: np.ndarray, axis: int, count: int) -> S:
    return S(x.shape[:axis] + (count,) + x.shape[axis + 1:], x.dtype)


# What gather's and scatter's handlers say of the operands and outputs they take.
_TAKES = r"takes indices"

_GATHER_NASTY = (
    # extreme indices: in range or a fill, never out of bounds
    (lambda c: (lambda o: _with(o, [np.array([-2**63, 2**63 - 1, 0], np.int64)] + o.operands[1:],
                                [_gathered(o.operands[1], int(o.attrs["axis"]), 3)],
                                batch=np.int64(0)))(_one_table(c)), r"indices|output"),
    (lambda c: _with(c, batch=np.int64(int(c.attrs["axis"]) + 1)), r"batch"),
    (lambda c: _with(c, axis=np.int64(-1)), r"axis"),
    (lambda c: _with(c, c.operands[:-1] + [np.zeros(2, c.operands[-1].dtype)]), r"fill"),
    (lambda c: _with(c, [np.zeros(3, np.int32), np.zeros((2**40, 0), np.float32),
                         np.zeros((), np.float32)], [S((3, 0), np.float32)], axis=np.int64(0),
                     batch=np.int64(0)), _SHAPE_RULES),
    (lambda c: _with(c, method="tma"), r"method"),
    (lambda c: _with(c, c.operands[:-1]), _TAKES),                    # a fill short
    (lambda c: _with(c, results=c.results + c.results[:1]), _TAKES),  # an output too many
    (lambda c: _with(c, c.operands[:1] + c.operands[1:] * 9,  # more than 8 tables
                     results=c.results * 9), _TAKES),
)

_SCATTER_NASTY = (
    (lambda c: _with(c, [c.operands[0], np.array([2**31 - 1, -5] * 3, np.int32)]
                     + c.operands[2:], deterministic=True), r"order"),
    (lambda c: (_with(c, mode="add", deterministic=True)
                if any(x.dtype == np.bool_ for x in _tables_of(c, 2)[1]) else c),
     r"mode|summed|\bsum\b|order"),
    (lambda c: _with(c, method="tma", deterministic=True), r"method|deterministic|order"),
    (lambda c: _with(c, method="tma"), r"method"),
    (lambda c: _with(c, [np.array([-2**63, 2**63 - 1], np.int64)] + c.operands[1:],
                     batch=np.int64(0)), r"indices|updates|order|" + _SHAPE_RULES),
    (lambda c: _with(c, c.operands[:-1]), _TAKES),                    # an update short
    (lambda c: _with(c, results=c.results[:-1] or c.results * 2), _TAKES),
)


# The slab ops' attributes: a wrong axis or batch leaves the arrays' dims
# unexplained (an output or updates rank or dim, indices dims).
_SLAB_DIMS = r"axis|batch|rank|\bdims?\b|shape|indices|updates|\belements?\b"
# The benchmarks' 16-byte rules (seed copy, read stream) of sizes and addresses.
_BENCH_16B = r"multiples of 16"

SPECS: dict[str, Spec] = {
    "jax_tma_gather": Spec(
        ("jax_tma.gather",), _gather_call, _gather_reference, _GATHER_NASTY,
        rules={"shape": r"fill|axis", "dtype": r"indices must be integers|fill must be",
               "operands": _TAKES, "results": _TAKES},
        attr_rules={"axis": _SLAB_DIMS, "batch": _SLAB_DIMS}),
    "jax_tma_scatter": Spec(
        ("jax_tma.scatter",), _scatter_call, _scatter_reference, _SCATTER_NASTY,
        rules={"shape": r"order|axis|updates", "dtype": r"integers|order|updates|summed",
               "operands": _TAKES, "results": _TAKES},
        attr_rules={"axis": _SLAB_DIMS + r"|order", "batch": _SLAB_DIMS + r"|order",
                    "deterministic": r"order",
                    "mode": r"summed|\bsum\b|order"},
        exact=_scatter_exact),
    "jax_tma_copy": Spec(("jax_tma.copy",), _copy_call, _copy_reference, _COPY_NASTY),
    "jax_tma_window": Spec(
        ("jax_tma.window",), _window_call, _window_reference, _WINDOW_NASTY,
        rules={"shape": r"start|cotangent", "dtype": r"start must be|start operands mix",
               # A start operand more or fewer shifts the others: the handler
               # meets the first operand out of place (a transpose whose
               # cotangent went missing takes a start array for an unbatched one).
               "operands": r"start|input rank|element type|cotangent"},
        # strides has an entry per spatial dim: its length sets the rank that
        # the arrays and starts are checked against.
        attr_rules={"fill_bits": r"fill", "strides": r"rank|batch dim|start|entries",
                    "transpose": r"fill|cotangent|start|rank|batch|\bdims?\b|entries"}),
    "jax_tma_im2col": Spec(
        ("jax_tma.im2col", "jax_tma.col2im"), _im2col_call, _im2col_reference, _IM2COL_NASTY,
        rules={"shape": r"patch|pixels|columns|taps", "dtype": r"cannot be summed"},
        attr_rules={**{k: _IM2COL_GEOMETRY for k in ("kernel", "strides", "dilation",
                                                     "pad_lo", "pad_hi")},
                    "transpose": _IM2COL_GEOMETRY + r"|cannot be summed|" + _SHAPE_RULES}),
    "jax_tma_broadcast": Spec(
        ("jax_tma.broadcast",), _broadcast_call, _broadcast_reference, _BROADCAST_NASTY,
        attr_rules={"axis": r"output dim|rank", "method": r"cluster"}),
    "jax_tma_ppermute": Spec(
        ("jax_tma.ppermute",), _ppermute_call, _ppermute_reference, _PPERMUTE_NASTY,
        attr_rules={"devices": r"devices?\b|sources", "sources": r"sources?\b|position|devices",
                    "process": r"among the devices", "processes": r"process"},
        keep=("instance",), waits_for_peer=_ppermute_waits_for_peer),
    # CUDA only, from the benchmarks' module: their references, errors named by target.
    "jax_tma_bench_memcpy": Spec(("jax_tma_bench_memcpy",), lambda rng: _copy_call(rng, ()),
                                 _copy_reference, _COPY_NASTY),
    "jax_tma_bench_seed_copy": Spec(("jax_tma_bench_seed_copy",),
                                    lambda rng: _copy_call(rng, (), multiple=16),
                                    _copy_reference, _COPY_NASTY,
                                    rules={"shape": _BENCH_16B, "dtype": _BENCH_16B}),
    "jax_tma_bench_write": Spec(("jax_tma_bench_write",), lambda rng: _copy_call(rng, ()),
                                _write_reference, _COPY_NASTY,
                                rules={"dtype": r"size of x"}),
    "jax_tma_bench_read": Spec(("jax_tma_bench_read",), lambda rng: _with(
        _copy_call(rng, (), multiple=16), results=[S((4,), np.uint32)]), _read_reference,
        rules={"shape": _BENCH_16B + r"|checksum", "dtype": _BENCH_16B + r"|checksum"}),
}


def _rule(spec: Spec, kind: str) -> str:
    """The pattern an error of a call mutated in `kind` ("shape", "dtype",
    "operands", "results", "attributes", "attr:NAME", or "nasty:PATTERN")
    must match: XLA's rejection of that kind, or the handler's error naming
    the op and then the rule."""
    ops = "|".join(map(re.escape, spec.ops))

    def handler(rule: str) -> str:
        return rf"(?:{ops}): .*?(?:{rule})"

    if kind.startswith("nasty:"):
        return f"{_XLA['decode']}|{handler(kind[len('nasty:'):])}"
    if kind == "attributes":
        return _XLA["attributes"]
    if kind in ("operands", "results"):
        return _XLA[kind] + (f"|{handler(spec.rules[kind])}" if kind in spec.rules else "")
    if kind in ("shape", "dtype"):
        rule = {"shape": _SHAPE_RULES, "dtype": _DTYPE_RULES}[kind]
        return f"{_XLA['decode']}|{handler(rule + '|' + spec.rules.get(kind, rule))}"
    name = kind[len("attr:"):]
    rule = rf"\b{re.escape(name)}\b" + (f"|{spec.attr_rules[name]}" if name in spec.attr_rules
                                         else "")
    return f"{_XLA['decode']}|{handler(rule)}"


# ---- the mutation engine ----------------------------------------------------------

def _bad_attr(value, rng):
    """A wrong value of the attribute's own kind, or a value of another kind."""
    nasty = np.int64(_pick(rng, _NASTY_INTS))
    if isinstance(value, str):
        options = [_pick(rng, _NASTY_STRS), nasty, True]
    elif isinstance(value, bool):
        options = [not value, np.int64(1), "true"]
    elif isinstance(value, np.uint64):
        options = [np.uint64(_pick(rng, (0, 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1))), nasty]
    elif isinstance(value, np.integer):
        options = [nasty, np.int64(int(rng.integers(-3, 9))), np.int32(value), np.float64(0.5),
                   np.array([value]), "0"]
    else:  # an int64 array
        wrong = value.copy()
        if wrong.size:
            wrong[rng.integers(wrong.size)] = nasty
        options = [wrong, np.full(value.size, nasty), _i64(), value[:-1], np.append(value, nasty),
                   value.astype(np.int32), value.astype(np.float64), (1, 2),
                   np.array(value, np.float16), nasty]
    return _pick(rng, options)


def _new_shape(shape, rng) -> tuple[int, ...]:
    """A rank one off, a dim a little off, or any small shape."""
    s = list(shape)
    how = int(rng.integers(4))
    if how == 0 and s:
        del s[rng.integers(len(s))]
    elif how == 1:
        s.insert(int(rng.integers(len(s) + 1)), int(rng.integers(0, 4)))
    elif how == 2 and s:
        i = int(rng.integers(len(s)))
        s[i] = max(0, s[i] + _pick(rng, (-1, 1, 2)))
    else:
        s = rng.integers(0, 5, int(rng.integers(0, 7))).tolist()
    return tuple(int(v) for v in s)


def _mutate(call: Call, spec: Spec, rng) -> tuple[str, str, Call]:
    """One random mutation of `call`: its kind (as _rule takes it), a
    description and the call."""
    c = _with(call)
    ops, res = c.operands, c.results
    attrs = [k for k in c.attrs if k not in spec.keep]
    kind = _pick(rng, ("shape", "dtype", "dtype all", "attr value", "attr value", "attr value",
                       "missing attr", "extra attr", "missing operand", "extra operand",
                       "missing result", "extra result"))
    if kind == "shape" or kind == "dtype":
        i = int(rng.integers(len(ops) + len(res)))
        old = ops[i] if i < len(ops) else res[i - len(ops)]
        shape = _new_shape(old.shape, rng) if kind == "shape" else old.shape
        dtype = _dtype(rng, ALL_DTYPES) if kind == "dtype" else old.dtype
        if i < len(ops):
            ops[i] = random_array(rng, shape, dtype)
            where = f"operand {i}"
        else:
            res[i - len(ops)] = S(shape, dtype)
            where = f"result {i - len(ops)}"
        return kind, f"{kind} of {where}: {old.shape} {old.dtype} -> {shape} {dtype}", c
    if kind == "dtype all":  # every array of the first operand's dtype, alike
        old, new = (ops or res)[0].dtype, _dtype(rng, ALL_DTYPES)
        c.operands = [random_array(rng, a.shape, new) if a.dtype == old else a for a in ops]
        c.results = [S(r.shape, new) if r.dtype == old else r for r in res]
        return "dtype", f"dtype {old} -> {new} everywhere", c
    if kind == "attr value" and attrs:
        k = _pick(rng, attrs)
        c.attrs[k] = _bad_attr(c.attrs[k], rng)
        return f"attr:{k}", f"attribute {k}: {call.attrs[k]!r} -> {c.attrs[k]!r:.80}", c
    if kind == "missing attr" and attrs:
        k = _pick(rng, attrs)
        del c.attrs[k]
        return "attributes", f"no attribute {k}", c
    if kind == "extra attr":
        c.attrs["extra"] = _pick(rng, (np.int64(1), "auto", True, _i64(1, 2), np.float32(1)))
        return "attributes", f"extra attribute {c.attrs['extra']!r}", c
    if kind == "missing operand" and ops:
        del ops[rng.integers(len(ops))]
        return "operands", "an operand fewer", c
    if kind == "extra operand":
        ops.insert(int(rng.integers(len(ops) + 1)),
                   random_array(rng, _new_shape((), rng), _dtype(rng, ALL_DTYPES)))
        return "operands", "an operand more", c
    if kind == "missing result" and res:
        del res[rng.integers(len(res))]
        return "results", "a result fewer", c
    res.append(S(_new_shape((), rng), _dtype(rng, ALL_DTYPES)))
    return "results", "a result more", c


# ---- running a call -----------------------------------------------------------

def _run(platform: str, target: str, call: Call, what: str) -> list[np.ndarray]:
    """Runs the call on the platform's first device (has_side_effect keeps XLA
    from dropping calls whose results are empty); checks that the inputs are
    unchanged, whether it succeeds or raises."""
    device = jax.devices(platform)[0]
    args = [jax.device_put(a, device) for a in call.operands]
    fn = jax.ffi.ffi_call(target, call.results, has_side_effect=True)
    try:
        with jax.default_device(device):
            return [np.asarray(y) for y in jax.jit(lambda *a: fn(*a, **call.attrs))(*args)]
    finally:
        for i, (before, after) in enumerate(zip(call.operands, args)):
            assert np.array_equal(as_bits(before), as_bits(after)), \
                f"{what}: operand {i} was modified"


def _check(platform: str, target: str, spec: Spec, call: Call, what: str,
           kind: str | None = None) -> None:
    """The call gives the reference results or, where it was mutated in
    `kind` (None: a correct call, which must run), raises the error of the
    rule that kind breaks (_rule): XLA's, the handler's naming the op, or
    for an attribute's value JAX's own bad_cast."""
    try:
        got = _run(platform, target, call, what)
    except AssertionError:
        raise
    except Exception as e:
        msg = str(e)
        assert kind is not None, f"{what}: {type(e).__name__}: {msg}"
        if type(e) is RuntimeError and msg == _BAD_CAST:
            assert kind.startswith(("attr:", "nasty:")), f"{what}: {type(e).__name__}: {msg}"
            return
        rule = _rule(spec, kind)
        assert isinstance(e, jax.errors.JaxRuntimeError) and re.search(rule, msg, re.S), \
            f"{what}: {type(e).__name__}: {msg}\n  (mutated: {kind}; expected /{rule}/)"
        return
    if all(math.prod(r.shape) == 0 for r in call.results):  # geometry beyond the reference
        want = [np.zeros(r.shape, r.dtype) for r in call.results]
    elif not spec.exact(platform, call):
        assert [g.shape for g in got] == [tuple(r.shape) for r in call.results], what
        return
    else:
        want = spec.reference(call)
    assert len(got) == len(want), f"{what}: {len(got)} results, want {len(want)}"
    for g, w in zip(got, want):
        try:
            assert_bits_equal(g, w)
        except AssertionError as e:
            raise AssertionError(f"{what}: wrong result: {e}") from None


# ---- the tests ----------------------------------------------------------------------

PLATFORMS = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)]


def _registered(platform: str) -> set[str]:
    """jax_tma's targets on `platform` and, on CUDA, the benchmarks' reference
    targets where their optional module _jax_tma_bench (JAX_TMA_BENCH=ON) is
    importable; every one registered with XLA."""
    _ffi.register()
    if platform == "cpu":
        return set(_jax_tma.cpu_registrations())
    names = set(_jax_tma.cuda_registrations())
    try:
        import _jax_tma_bench
    except ImportError:
        return names
    for name, capsule in _jax_tma_bench.cuda_registrations().items():
        jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
        names.add(name)
    return names


@pytest.fixture
def seed(rng) -> int:
    return int(os.environ.get("JAX_TMA_FUZZ_SEED", rng.bit_generator.seed_seq.entropy))


@pytest.mark.parametrize("platform", PLATFORMS)
def test_every_registered_target_has_a_spec(platform):
    missing = _registered(platform) - set(SPECS)
    assert not missing, f"registered {platform} targets without a fuzz spec in SPECS: {missing}"


# The benchmarks' reference targets exist on CUDA only.
FUZZ_CASES = [pytest.param(p.values[0], t, marks=p.marks, id=f"{p.values[0]}-{t}")
              for p in PLATFORMS for t in sorted(SPECS)
              if p.values[0] == "cuda" or not t.startswith("jax_tma_bench_")]


@pytest.mark.parametrize("platform,target", FUZZ_CASES)
def test_fuzz(platform, target, seed):
    if target not in _registered(platform):
        # A GPU run (JAX_TMA_REQUIRE_GPU=1) must fuzz every target: there the
        # missing module is a failure.
        skip_unless_required(f"{target} is not registered for {platform}: the benchmarks' "
                             "module _jax_tma_bench is not built (JAX_TMA_BENCH=ON)")
    spec = SPECS[target]
    rng = np.random.default_rng(seed)
    where = f"{platform} {target}, seed {seed}"
    for case in range(CASES):
        base = spec.baseline(rng)
        _check(platform, target, spec, base, f"{where}, case {case}: baseline")
        kind, what, call = _mutate(base, spec, rng)
        while spec.waits_for_peer(call):
            kind, what, call = _mutate(base, spec, rng)
        _check(platform, target, spec, call, f"{where}, case {case}: {what}", kind)
    for i, (nasty, rule) in enumerate(spec.nasty):  # from the last baseline, which ran
        _check(platform, target, spec, nasty(base), f"{where}, nasty case {i}", f"nasty:{rule}")
