"""What jax_tma.gather (_gather.py) and jax_tma.scatter (_scatter.py) share:
the checks of tables, indices and axis, the four primitives (each module
registers its own two), the partitioning that keeps every dim but `axis`
split, and the helpers of their vmap and AD rules, which bind each other's
primitive (gather's transpose is a scatter-add, scatter's a gather)."""

from __future__ import annotations

import math
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_tma import _checks, _ffi, _lowering

GatherMethod = Literal["auto", "tma", "simt"]
METHODS = ("auto", "tma", "simt")


# ---- checks ---------------------------------------------------------------------

def as_indices(op: str, indices: Any) -> jax.Array:
    """`indices` as an integer array (Python ints as jnp.asarray takes them),
    sub-byte integers widened to a byte for the handlers (every value kept)."""
    indices = _checks.as_array(op, "indices", indices)
    if not jnp.issubdtype(indices.dtype, jnp.integer):
        raise TypeError(f"{op}: indices must be integers, got dtype {indices.dtype}")
    return _checks.widen(indices)


def _axis(op: str, axis: Any, x: jax.Array) -> int:
    if x.ndim == 0:
        raise ValueError(f"{op}: x must have rank >= 1, got a 0-d array")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{op}: axis must be an int, got {axis!r}")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"{op}: axis {axis} is out of range for x of rank {x.ndim} "
                         f"(valid: {-x.ndim} to {x.ndim - 1})")
    return int(axis) % x.ndim


def check_tma_slab(op: str, method: str, x: jax.Array, wide, axis: int) -> None:
    """method='tma' moves each slab with one bulk copy: 16-byte multiples.
    `wide` is the dtype the slabs move as."""
    slab = x.shape[axis + 1:]
    nbytes = math.prod(slab) * np.dtype(wide).itemsize
    moved = "" if np.dtype(wide) == _checks.widen_dtype(x.dtype) else f", moved as {wide},"
    if method == "tma" and nbytes % _ffi.rules()["tma_align_bytes"]:
        raise ValueError(f"{op}: method='tma' moves slabs of a multiple of 16 bytes (the bulk-copy "
                         f"size rule), but x.shape[axis + 1:] = {slab} of {x.dtype}{moved} is "
                         f"{nbytes} B; use method='auto' or 'simt'")


def as_tables(op: str, x: Any, axis: Any) -> tuple[list[jax.Array], list[str], int, bool]:
    """x (an array, or a tuple or list of tables) as a list of arrays; the
    name each table's errors go by; the axis, normalised; and whether x was
    a sequence. The tables must agree in x.shape[:axis + 1]."""
    many = isinstance(x, (tuple, list))
    max_tables = _ffi.rules()["gather.max_tables"]
    if many and not 1 <= len(x) <= max_tables:
        raise ValueError(f"{op}: x must be an array or a tuple of 1 to {max_tables} arrays "
                         f"(tables sharing the indices), got {len(x)} tables")
    tables = [_checks.as_array(op, f"x[{t}]", a) for t, a in enumerate(x)] if many else \
        [_checks.as_array(op, "x", x)]
    names = [f"{op}: table {t}" for t in range(len(tables))] if many else [op]
    axes = [_axis(name, axis, t) for name, t in zip(names, tables)]
    lead = tables[0].shape[:axes[0] + 1]
    for t, (table, a) in enumerate(zip(tables, axes)):
        if a != axes[0] or table.shape[:a + 1] != lead:
            raise ValueError(f"{op}: the tables must agree in x.shape[:axis + 1] (axis={axis}): "
                             f"table 0 has {tuple(lead)}, table {t} "
                             f"{tuple(table.shape[:a + 1])}")
    return tables, names, axes[0], many


def adds_natively(dtype) -> bool:
    """Whether the handlers' add sums `dtype`: integers, f16, bf16, f32, f64,
    c64 and c128. Other floats (float8_*, float4_e2m1fn) are summed in
    float32 and rounded to their dtype once (XLA rounds after every add)."""
    return _checks.widen_dtype(dtype).name in _ffi.rules()["summed_dtypes"]


# ---- primitives -------------------------------------------------------------

# Both ops view each table x as (*batch, *outer, N, *slab) with N =
# x.shape[axis]; the tables of one call share x.shape[:axis + 1] and the
# indices, whose first `batch` dims equal the tables' (vmap folds into them).
# gather_p(indices, *xs): per table (*x.shape[:axis], *indices.shape[batch:],
# *slab); fills holds each table's fill element as bytes of its dtype.
# scatter_p(indices, *xs, *updates): the tables' shapes; each table's
# updates are shaped like its gathered slabs. Each lowers (per device, under
# custom_partitioning) to the *_local_p FFI call on its shard:
# gather_local_p(indices, *xs) (the fills its "fill" attribute),
# scatter_local_p(indices, order, *xs, *updates).
gather_p = Primitive("jax_tma_gather")
gather_local_p = Primitive("jax_tma_gather_local")
scatter_p = Primitive("jax_tma_scatter")
scatter_local_p = Primitive("jax_tma_scatter_local")
for _p in (gather_p, gather_local_p, scatter_p, scatter_local_p):
    _p.multiple_results = True


def gathered_shape(x_shape, idx_shape, axis, batch):
    return tuple(x_shape[:axis]) + tuple(idx_shape[batch:]) + tuple(x_shape[axis + 1:])


def halves(operands):
    """The tables and the per-table operands that follow them."""
    n = len(operands) // 2
    return operands[:n], operands[n:]


def bind_gather(indices, *xs, **params):
    """gather_p on operands cast to the union of their varying mesh axes
    (shard_map), which the results then carry."""
    return gather_p.bind(*_checks.align_varying(indices, *xs), **params)


def bind_scatter(indices, *operands, **params):
    """scatter_p(indices, *xs, *updates) as bind_gather binds gather_p."""
    return scatter_p.bind(*_checks.align_varying(indices, *operands), **params)


mesh_axes = _lowering.mesh_axes


def like(*avals):
    """The operand whose mesh a result takes: the first with one (a
    replicated constant has none). Operands are bound with the same varying
    mesh axes (bind_gather, bind_scatter), which the result keeps."""
    return next((a for a in avals if not a.sharding.mesh.empty), avals[0])


def lead_spec(op: str, indices, xs, axis: int, batch: int) -> list:
    """The split of x.shape[:axis] that every result shares, from the
    operands' explicit shardings (an Auto mesh and shard_map's manual axes
    leave specs empty): the tables', which must agree and leave `axis`
    whole, and on the batch dims the indices' where the tables have none
    (a table that vmap broadcast to the indices' batch)."""
    specs = [_lowering.spec_of(x) for x in xs]
    for t, spec in enumerate(specs):
        if spec[axis] is not None:
            name = f"{op}: table {t}" if len(xs) > 1 else op
            raise ValueError(
                f"{name}: x is split along axis {axis} over mesh axes {spec[axis]!r} (x is "
                f"sharded {P(*spec)}), but every device needs that whole dim to pick slabs from "
                "(as jnp.take and x.at[] do); replicate it first (jax.sharding.reshard)")
        if spec[:axis] != specs[0][:axis]:
            raise ValueError(f"{op}: the tables must be sharded alike in x.shape[:axis] "
                             f"(axis={axis}): table 0 has {P(*specs[0][:axis])}, table {t} "
                             f"{P(*spec[:axis])}")
    ispec = _lowering.spec_of(indices)
    lead = list(specs[0][:axis])
    for d in range(batch):  # vmap gives both the same split, or x's broadcast none
        if lead[d] is None:
            lead[d] = ispec[d]
    return lead


def distinct(op: str, spec: list, *operands) -> tuple:
    """`spec`, once each mesh axis splits one dim at most."""
    seen: set = set()
    for entry in spec:
        for a in mesh_axes(entry):
            if a in seen:
                shown = ", ".join(f"{name} {P(*_lowering.spec_of(v))}" for name, v in operands)
                raise ValueError(f"{op}: mesh axis {a!r} would split two dims of the result "
                                 f"{P(*spec)} ({shown}); reshard one of them first "
                                 "(jax.sharding.reshard)")
            seen.add(a)
    return tuple(spec)


# ---- partitioning: every dim but axis keeps its sharding ---------------------

_spec = _lowering.sharding_spec


def factors(x_ndims, idx_ndim, axis, batch):
    """Shardy factor names of the tables, the indices and the gathered slabs:
    the tables share those of their dims up to axis, and each has its own
    slab dims."""
    lead = [f"b{d}" for d in range(batch)] + [f"p{d}" for d in range(batch, axis)]
    xs = [lead + ["n"] + [f"s{t}_{d}" for d in range(axis + 1, nd)]
          for t, nd in enumerate(x_ndims)]
    idx = lead[:batch] + [f"i{d}" for d in range(batch, idx_ndim)]
    slabs = [lead + idx[batch:] + x[axis + 1:] for x in xs]
    return xs, idx, slabs


def shardings(mesh, x_shapes, idx_shape, axis, batch, split_indices):
    """The tables' shardings with axis unsplit and table 0's split of the dims
    before it, the indices' on batch dims it leaves whole (each table keeps
    its own slab dims' split, less mesh axes those dims use), the indices
    split like the batch dims and, with
    `split_indices` (a gather: each device picks its own indices' slabs),
    their other dims as they come less mesh axes the tables' dims use,
    else whole; and the matching shardings of the gathered slabs."""
    lead = _spec(x_shapes[0].sharding, len(x_shapes[0].shape))[:axis]
    used = {a for e in lead for a in mesh_axes(e)}

    def own(entry):
        kept = tuple(a for a in mesh_axes(entry) if a not in used)
        return None if not kept else kept[0] if len(kept) == 1 else kept

    idx_ndim = len(idx_shape.shape)
    idx_spec = _spec(idx_shape.sharding, idx_ndim)
    for d in range(batch):  # a batch dim table 0 leaves whole splits as the indices'
        if lead[d] is None:
            lead[d] = own(idx_spec[d])
            used |= set(mesh_axes(lead[d]))
    xs = [lead + [None] + [own(e) for e in _spec(s.sharding, len(s.shape))[axis + 1:]]
          for s in x_shapes]
    rest = [None] * (idx_ndim - batch)
    if split_indices:
        used |= {a for x in xs for e in x for a in mesh_axes(e)}
        rest = [own(e) for e in idx_spec[batch:]]
    idx = lead[:batch] + rest
    slabs = [lead + rest + x[axis + 1:] for x in xs]
    named = lambda specs: tuple(NamedSharding(mesh, P(*s)) for s in specs)  # noqa: E731
    return named(xs), NamedSharding(mesh, P(*idx)), named(slabs)


sharding_rule = _lowering.sharding_rule


def with_tma_check(op: str, rule):
    """The CUDA lowering of `rule`: a forced method='tma' first needs a GPU
    with TMA (an error naming `op` otherwise)."""
    def cuda(ctx, *args, method, **params):
        if method == "tma":
            _checks.require_tma(op, method)
        return rule(ctx, *args, method=method, **params)
    return cuda


partitioned = _lowering.partitioned


# ---- vmap -------------------------------------------------------------------

def by_group(n, in_group, bind):
    """Outputs and their vmapped dims for n tables bound in two groups: the
    tables where in_group(t) and the others, each group one call of
    bind(tables) -> (outputs, dim). The tables of one call share their dims
    up to axis, so tables that the vmap reaches and tables it does not
    cannot share one."""
    outs, dims = [None] * n, [None] * n
    for flag in (True, False):
        group = [t for t in range(n) if in_group(t) == flag]
        if group:
            ys, dim = bind(group, flag)
            for t, y in zip(group, ys):
                outs[t], dims[t] = y, dim
    return outs, dims


# ---- autodiff: linear in the tables (and updates); the indices are constants ----

def zero_fill(dtype) -> bytes:
    """A fill of 0 as jnp's zeros hold it (float8_e8m0fnu, which has no 0:
    0xFF, its NaN)."""
    return _checks.fill_bytes("jax_tma.gather", 0, dtype)


def zero_tangent(y) -> ad.Zero:
    return ad.Zero(jax.typeof(y).to_tangent_aval())


def zeros_of(aval, dtype):
    """Zeros of `dtype` with `aval`'s shape, sharding and varying mesh axes."""
    return ad.instantiate_zeros(ad.Zero(aval.update(dtype=np.dtype(dtype), weak_type=False)))


def resharded(a, spec) -> jax.Array:
    """`a` with the explicit PartitionSpec `spec` (one entry per dim); a
    no-op where it has it (always, but for explicit meshes)."""
    if _lowering.spec_of(jax.typeof(a)) == tuple(spec):
        return a
    return jax.sharding.reshard(a, P(*spec))
