"""The gather family's descriptor (tests/families/__init__.py says what each
name is for): jax_tma.gather and jax_tma.scatter, with their NumPy
references."""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.sharding import PartitionSpec as P

import jax_tma
from fuzz import (BYTE_DTYPES, PORTABLE, S, SHAPE_RULES, SUMMABLE, Call, Spec, fill_patterns,
                  pick, random_fill, some_dtype, with_)
from ops_table import (EXACT_TERMS, SUB_BYTE_WIDE, SUMMABLE as SUMMED, Case, Op, as_ints,
                       cotangent, dim_size, dims_spec, extra_rank, int_extremes, take_fill)
from paths import CpuCall
from reference import ALL_DTYPES, random_array

MODULES = ("jax_tma._gather", "jax_tma._scatter", "jax_tma._gather_common")


# ---- references -------------------------------------------------------------------

def wrap_rows(idx, n: int) -> tuple[np.ndarray, np.ndarray]:
    """jnp.take's reading of integer indices along a dim of size n: negative
    ones wrap once; (rows, inside), rows 0 where outside."""
    rows = [i + n if -n <= i < 0 else i for i in as_ints(idx)]
    inside = np.array([0 <= r < n for r in rows], bool)
    rows = np.array([r if ok else 0 for r, ok in zip(rows, inside)], np.int64)
    return rows, inside


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


# ---- the FFI fuzz -----------------------------------------------------------------

_INDEX_DTYPES = tuple(np.dtype(d) for d in (np.int8, np.int16, np.int32, np.int64, np.uint8,
                                            np.uint16, np.uint32, np.uint64))


def _tables_of(call: Call, lead: int) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """The indices, the tables and their updates (none for a gather) of a
    gather (lead=1: indices, x_0..x_{n-1}) or scatter call (lead=2: indices,
    order, x_0.., updates_0..), n = the results."""
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
    idx_dtype = pick(rng, _INDEX_DTYPES)
    lo = 0 if idx_dtype.kind == "u" else -n - 2
    idx = rng.integers(lo, n + 2, idx_shape).astype(idx_dtype)
    xs, slab_shapes = [], []
    for dtype in dtypes:
        x_shape = lead[:axis + 1] + tuple(int(v) for v in rng.integers(0, 5, r - axis - 1))
        xs.append(random_array(rng, x_shape, dtype))
        slab_shapes.append(x_shape[:axis] + idx_shape[batch:] + x_shape[axis + 1:])
    attrs = dict(axis=np.int64(axis), batch=np.int64(batch), method=pick(rng, PORTABLE))
    return idx, xs, attrs, slab_shapes


def _table_count(rng) -> int:
    return int(rng.choice([1, 1, 2, 3]))


def _gather_call(rng) -> Call:
    dtypes = [some_dtype(rng) for _ in range(_table_count(rng))]
    idx, xs, attrs, out_shapes = _slab_call(rng, dtypes)
    return Call([idx, *xs], [S(o, d) for o, d in zip(out_shapes, dtypes)],
                {**attrs, "fill": random_fill(rng, dtypes)})


def _gather_reference(call: Call) -> list[np.ndarray]:
    idx, xs, _ = _tables_of(call, 1)
    outs = []
    for x, fill, y in zip(xs, fill_patterns(call), call.results):
        b, p, n, m, s = _slab_geometry(call, x)
        table = np.ascontiguousarray(x).view(np.uint8).reshape(b, p, n, s)
        rows = _table_rows(idx, n, int(call.attrs["batch"]))
        out = np.empty((b, p, m, s), np.uint8)
        out[...] = np.resize(fill, s)
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
    mode = pick(rng, ("set", "add"))
    dtypes = [some_dtype(rng, SUMMABLE if mode == "add" else BYTE_DTYPES)
              for _ in range(_table_count(rng))]
    idx, xs, attrs, upd_shapes = _slab_call(rng, dtypes)
    axis, batch = int(attrs["axis"]), int(attrs["batch"])
    n = xs[0].shape[axis]
    # Floats add in a defined order only with deterministic=True; without it
    # the GPU's sums are held to the bounds of any order (_scatter_bounds).
    deterministic = bool(rng.integers(2))
    if not deterministic and mode == "set":  # one update per row: any winner is the same one
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
    idx, xs, _ = _tables_of(call, 2)
    if platform == "cpu" or not xs:  # no results: nothing to compare
        return True
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


def _parts(a: np.ndarray) -> np.ndarray:
    """A float array as the components its sums add (complex: two parts)."""
    if a.dtype.kind == "c":
        return a.view(np.float32 if a.dtype == np.complex64 else np.float64)
    return a


def sum_bound(terms: list[float], dtype) -> tuple[float, float, bool]:
    """What a sum of `terms` (the float64 values of one component) may give
    in `dtype` (a float type, or a complex one's part) in
    any order of adding, each add rounded to `dtype` and its operands and
    result perhaps flushed to zero where subnormal: (the exact sum, the
    largest distance from it, whether an add may overflow). Each of the
    k = len(terms) - 1 adds rounds by at most eps / 2 of a partial sum,
    which is at most A = sum(|terms|), and the comparison rounds once more:
    (k + 1) * eps / 2 * A; the bound takes twice that, n * eps * A (n the
    number of terms). Each add may flush its two operands and its result,
    each by less than the smallest normal: (2k + 1) * tiny."""
    info = ml_dtypes.finfo(dtype)
    total, size = math.fsum(terms), math.fsum(abs(t) for t in terms)
    k = len(terms) - 1
    bound = len(terms) * float(info.eps) * size + (2 * k + 1) * float(info.smallest_normal)
    return total, bound, size * (1 + len(terms) * float(info.eps)) >= float(info.max)


def _check_sum(got: float, terms: list[float], dtype, where: str) -> None:
    """`got` is a sum of `terms` in some order (sum_bound); NaN where a term
    is NaN or infinities of both signs meet, that infinity where one does."""
    nan = any(math.isnan(t) for t in terms)
    infs = {t for t in terms if math.isinf(t)}
    if nan or len(infs) == 2:
        assert math.isnan(got), f"{where}: {got}, want NaN (terms {terms})"
        return
    if infs:
        assert got == infs.pop(), f"{where}: {got}, want {terms} summed to an infinity"
        return
    total, bound, overflow = sum_bound(terms, dtype)
    if overflow and math.isinf(got):
        return
    assert abs(got - total) <= bound, \
        f"{where}: {got!r} is {abs(got - total)!r} from the sum {total!r} of {terms} (bound {bound!r})"


def _scatter_bounds(call: Call, got: list[np.ndarray]) -> None:
    """What a scatter whose order the hardware picks may give: a table row
    no index names is x's row bit for bit; under set, each element of a row
    is that element of one of its updates (bit for bit); under add, each
    element is x's plus its updates' in some order, within sum_bound.
    Deterministic calls whose `order` is not the stable argsort (a fuzzed
    one: the wrapper computes it, a user never passes it) apply the updates
    it names, an entry outside [0, M) none and a repeated one again: under
    set an element may also keep x's value, under add a named row holds
    anything (what such a call must keep is memory safety and x's other
    rows)."""
    idx, xs, upds = _tables_of(call, 2)
    garbled = False
    if call.attrs.get("deterministic") is True and xs:
        order = call.operands[1]
        want = _sorted_order(idx, xs[0].shape[int(call.attrs["axis"])], int(call.attrs["batch"]))
        garbled = not (order.dtype.kind == "i" and order.size == want.size
                       and np.array_equal(order.reshape(-1).astype(np.int64), want.reshape(-1)))
    for t, (x, upd, y) in enumerate(zip(xs, upds, got)):
        b, p, n, m, s = _slab_geometry(call, x)
        if s == 0 or p == 0:  # no element to compare
            continue
        table = np.ascontiguousarray(x).view(np.uint8).reshape(b, p, n, s)
        slabs = np.ascontiguousarray(upd).view(np.uint8).reshape(b, p, m, s)
        out = np.ascontiguousarray(y).view(np.uint8).reshape(b, p, n, s)
        rows = _table_rows(idx, n, int(call.attrs["batch"]))
        add = call.attrs["mode"] == "add"
        for i in range(b):
            for r in range(n):
                hits = [j for j in range(m) if rows[i, j] == r]
                where = f"table {t}, batch entry {i}, row {r}"
                if not hits:
                    assert np.array_equal(out[i, :, r], table[i, :, r]), f"{where}: not x's row"
                elif add and garbled:
                    continue
                elif not add:
                    e = x.dtype.itemsize
                    mine = out[i, :, r].reshape(p, -1, e)
                    ok = np.zeros(mine.shape[:2], bool)
                    if garbled:
                        ok |= (mine == table[i, :, r].reshape(p, -1, e)).all(axis=-1)
                    for j in hits:
                        ok |= (mine == slabs[i, :, j].reshape(p, -1, e)).all(axis=-1)
                    assert ok.all(), f"{where}: an element is none of its updates'"
                elif x.dtype.kind in "iu":
                    continue  # exact: the reference checks these bits
                else:
                    part = _parts(np.zeros(1, x.dtype)).dtype
                    view = lambda a: _parts(a.view(x.dtype)).astype(np.float64)  # noqa: E731
                    mine = view(out[i, :, r].copy())
                    terms = [view(table[i, :, r].copy())] + [view(slabs[i, :, j].copy())
                                                             for j in hits]
                    for e, g in enumerate(mine.reshape(-1)):
                        _check_sum(float(g), [float(a.reshape(-1)[e]) for a in terms], part,
                                   f"{where}, component {e}")


def _one_table(c: Call) -> Call:
    """Gather call c with its first table alone."""
    idx, xs, _ = _tables_of(c, 1)
    return with_(c, [idx, xs[0]], c.results[:1], fill=c.attrs["fill"][:2])


def _gathered(x: np.ndarray, axis: int, count: int) -> S:
    return S(x.shape[:axis] + (count,) + x.shape[axis + 1:], x.dtype)


# What gather's and scatter's handlers say of the operands and outputs they take.
_TAKES = r"takes indices"

_GATHER_NASTY = (
    # extreme indices: in range or a fill, never out of bounds
    (lambda c: (lambda o: with_(o, [np.array([-2**63, 2**63 - 1, 0], np.int64)] + o.operands[1:],
                                [_gathered(o.operands[1], int(o.attrs["axis"]), 3)],
                                batch=np.int64(0)))(_one_table(c)), r"indices|output"),
    (lambda c: with_(c, batch=np.int64(int(c.attrs["axis"]) + 1)), r"batch"),
    (lambda c: with_(c, axis=np.int64(-1)), r"axis"),
    (lambda c: with_(c, fill=c.attrs["fill"][:-1]), r"fill"),
    # a valid pattern for 16-byte elements alone
    (lambda c: with_(c, fill=np.array([1, 0] * len(c.results), np.int64)), r"fill"),
    (lambda c: with_(c, [np.zeros(3, np.int32), np.zeros((2**40, 0), np.float32)],
                     [S((3, 0), np.float32)], axis=np.int64(0), batch=np.int64(0),
                     fill=np.zeros(2, np.int64)), SHAPE_RULES),
    (lambda c: with_(c, method="tma"), r"method"),
    (lambda c: with_(c, c.operands[:-1]), _TAKES),                    # a table short
    (lambda c: with_(c, results=c.results + c.results[:1]), _TAKES),  # an output too many
    (lambda c: with_(c, c.operands[:1] + c.operands[1:] * 9,  # more than 8 tables
                     results=c.results * 9), _TAKES),
)

_SCATTER_NASTY = (
    (lambda c: with_(c, [c.operands[0], np.array([2**31 - 1, -5] * 3, np.int32)]
                     + c.operands[2:], deterministic=True), r"order"),
    (lambda c: (with_(c, mode="add", deterministic=True)
                if any(x.dtype == np.bool_ for x in _tables_of(c, 2)[1]) else c),
     r"mode|summed|\bsum\b|order"),
    (lambda c: with_(c, method="tma", deterministic=True), r"method|deterministic|order"),
    (lambda c: with_(c, method="tma"), r"method"),
    (lambda c: with_(c, [np.array([-2**63, 2**63 - 1], np.int64)] + c.operands[1:],
                     batch=np.int64(0)), r"indices|updates|order|" + SHAPE_RULES),
    (lambda c: with_(c, c.operands[:-1]), _TAKES),                    # an update short
    (lambda c: with_(c, results=c.results[:-1] or c.results * 2), _TAKES),
)


# The slab ops' attributes: a wrong axis or batch leaves the arrays' dims
# unexplained (an output or updates rank or dim, indices dims).
_SLAB_DIMS = r"axis|batch|rank|\bdims?\b|shape|indices|updates|\belements?\b"

SPECS: dict[str, Spec] = {
    "jax_tma_gather": Spec(
        ("jax_tma.gather",), _gather_call, _gather_reference, _GATHER_NASTY,
        # A table of another dtype may no longer match its fill pattern.
        rules={"shape": r"axis", "dtype": r"indices must be integers|fill is not one",
               "operands": _TAKES, "results": _TAKES},
        attr_rules={"axis": _SLAB_DIMS, "batch": _SLAB_DIMS}),
    "jax_tma_scatter": Spec(
        ("jax_tma.scatter",), _scatter_call, _scatter_reference, _SCATTER_NASTY,
        rules={"shape": r"order|axis|updates", "dtype": r"integers|order|updates|summed",
               "operands": _TAKES, "results": _TAKES},
        attr_rules={"axis": _SLAB_DIMS + r"|order", "batch": _SLAB_DIMS + r"|order",
                    "deterministic": r"order",
                    "mode": r"summed|\bsum\b|order"},
        exact=_scatter_exact, bounds=_scatter_bounds),
}


# ---- the paths --------------------------------------------------------------------

CPU_CALLS = {
    "gather": CpuCall(lambda x: jax_tma.gather(x, jnp.array([3, -1, 9]), method="tma")),
    "scatter": CpuCall(lambda x: jax_tma.scatter(x, jnp.array([3, -1, 9]), x[:3], mode="add")),
}

GPU_CALLS = {
    "gather.tma": lambda x, device: jax_tma.gather(x, jnp.array([3, -1, 9, 70]), method="tma"),
    "gather.simt": lambda x, device: jax_tma.gather(x, jnp.array([3, -1, 9, 70]), method="simt"),
    "scatter.tma": lambda x, device: jax_tma.scatter(x, jnp.array([3, -1, 70]), x[:3],
                                                     method="tma"),
    "scatter.simt": lambda x, device: jax_tma.scatter(x, jnp.array([3, -1, 70]), x[:3],
                                                      method="simt"),
    "scatter.ordered": lambda x, device: jax_tma.scatter(x, jnp.array([3, 3, 7]), x[:3],
                                                         mode="add", deterministic=True),
}


# ---- the mode tests ---------------------------------------------------------------

def _at(axis: int, idx):
    return (slice(None),) * axis + (idx,)


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
    slab = tuple(dim_size(rng, even) for _ in range(extra_rank(rng, even)))
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
        return random_array(rr, shape, dtype), _indices(rr, r, idx_shape, index_dtype)

    def in_specs(dims):
        return (dims_spec(len(shape), dims), P())

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


def build_scatter(rng, dtype, *, batch=8, even=True, method="auto", mode=None,
                  index_dtype=np.int32) -> Case:
    """x (B, R, *slab) updated along dim 1; set with distinct slabs (jnp
    leaves duplicates unspecified), add with duplicates."""
    mode = mode or ("add" if np.dtype(dtype) in SUMMABLE and rng.integers(0, 2) else "set")
    slab = tuple(dim_size(rng, even) for _ in range(extra_rank(rng, even)))
    r = int(rng.integers(1, 8))
    shape = (batch, r) + slab
    k = int(rng.integers(1, 6))
    axis = 1 if rng.integers(0, 2) else 1 - len(shape)
    floating = jnp.issubdtype(dtype, jnp.inexact)
    u_shape = (batch, k) + slab

    def draw(rr):
        # adds of exact values: any order gives the same bits
        data = (lambda s: cotangent(rr, s, dtype)) if floating and mode == "add" else \
            (lambda s: random_array(rr, s, dtype))
        return data(shape), _indices(rr, r, (k,), index_dtype, unique=mode == "set"), \
            data(u_shape)

    def in_specs(dims):
        return (dims_spec(len(shape), dims), P(),
                dims_spec(len(shape), {d: a for d, a in dims.items() if d != 1}))

    def ref(x, i, u):
        # set: distinct slabs, as the hint says (jax's grad of a plain set
        # cannot resolve the sharding of its internal ids on Explicit meshes),
        # sub-byte dtypes through SUB_BYTE_WIDE
        x = jnp.asarray(x)
        if mode == "add":
            return x.at[_at(axis % x.ndim, i)].add(u, mode="drop")
        wide = SUB_BYTE_WIDE.get(x.dtype.name, x.dtype)
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


OPS = (Op("gather", build_gather, ALL_DTYPES),
       Op("scatter-set", functools.partial(build_scatter, mode="set"), ALL_DTYPES),
       Op("scatter-add", functools.partial(build_scatter, mode="add"), SUMMED))
