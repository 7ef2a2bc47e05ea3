"""What the cases of the mode tests (tests/test_mode_*.py, test_sharding.py,
test_multi_gpu.py) are made of: a Case is one op on random inputs of a dtype
from `rng`, the jax_tma call, its jnp/lax equivalent, the NumPy result
(fills as jnp writes them), the operands a gradient takes and the dims a
mesh may split; an Op builds them. Each family's descriptor
(tests/families/<family>.py) lists its ops' Op entries (OPS), and
families.OPS is every family's. Here too: the comparisons and transforms
that every mode test applies alike, and the small shims that hide the
differences between jax 0.10 and 0.12."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import reference
from reference import ALL_DTYPES

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


# The 2 x 4 mesh that a collective's cases permute over, and the spec that splits
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


# Complex fills of two different halves (each half its own 8 bytes of
# complex128's fill pattern), for the fill tests of complex dtypes.
COMPLEX_FILLS = [complex(1, -2), complex(float("nan"), 0), np.complex64(-0.0 - 0.0j)]


def check_fills(op, x, fills, expect) -> None:
    """op(x, fill) for every fill in one program, each against expect(fill);
    one failure message naming every fill that failed (at trace time too)."""
    errors, ok = [], []
    for fill in fills:
        try:
            jax.eval_shape(lambda a: op(a, fill), x)
            ok.append(fill)
        except Exception as e:  # noqa: BLE001 (reported below, per fill)
            errors.append(f"fill={fill!r}: {type(e).__name__}: {e}")
    got = jax.jit(lambda a: [op(a, f) for f in ok])(x)
    for fill, y in zip(ok, got):
        try:
            reference.assert_bits_equal(y, expect(fill))
        except AssertionError as e:
            errors.append(f"fill={fill!r}: {e}")
    assert not errors, "\n".join(errors)

# ---- cases and ops -------------------------------------------------------------------

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
    in_specs(dims) the operands' specs for a {dim of args[0]: mesh axes};
    split_locally: those of them that it splits with no data moving
    between devices (None: all of them).
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
    split_locally: tuple[int, ...] | None = None
    symbolic: tuple = ()
    params: dict = dataclasses.field(default_factory=dict)

    def want(self, *args) -> np.ndarray:
        return self.expect(*(args or self.args))

    def local_split(self) -> tuple[int, ...]:
        return self.split if self.split_locally is None else self.split_locally

    def batch_specs(self, axes=MESH_AXES) -> tuple:
        return self.in_specs({0: axes})


def dims_spec(ndim: int, dims: dict) -> P:
    """The PartitionSpec of an array of rank `ndim` split as {dim: mesh axes}."""
    return P(*[dims.get(d) for d in range(ndim)])


def dim_size(rng, even: bool, lo: int = 1, hi: int = 6) -> int:
    """A dim size: 4 or 8 where a mesh axis of 2 or 4 must divide it."""
    return int(rng.choice([4, 8])) if even else int(rng.integers(lo, hi + 1))


def extra_rank(rng, even: bool) -> int:
    """How many dims beside the batch dim: at least one where a mesh splits two."""
    return int(rng.integers(1 if even else 0, 3))


def on_mesh(local, spec):
    """`local` as shard_map of the context mesh (jax.set_mesh) or, without
    one, of an Auto 2 x 4 mesh of host devices: a collective's call, every
    operand and the result split by `spec`."""
    def run(*xs):
        mesh = None if not jax.sharding.get_abstract_mesh().empty else cpu_mesh()
        return shard_map(local, mesh=mesh, in_specs=spec, out_specs=spec)(*xs)
    return run


@dataclasses.dataclass(frozen=True)
class Op:
    """An op of the mode tests: build(rng, dtype, *, batch=8, even=True,
    method="auto", **fuzz_kw) -> Case (even: the dims a mesh may split are
    4 or 8 long), the dtypes and methods it takes. collective: it runs only
    inside shard_map (its Case's params hold the shard_map body, "local",
    and its reference, "local_ref"), whose batch is 8 blocks. min_batch:
    the smallest batch the fuzz draws. fuzz_kw: what the fuzz also passes
    build. export_variants: exports beside "concrete" and "symbolic", each
    keeping the symbolic dims of Case.symbolic with these names alone.
    symbolic_export: why a shape-polymorphic export of the op is not
    tested (docs/limits.md says it), or None where it is."""

    name: str
    build: Callable[..., Case]
    dtypes: tuple
    methods: tuple[str, ...] = ("auto", "simt")
    collective: bool = False
    min_batch: int = 0
    fuzz_kw: Mapping[str, object] = dataclasses.field(default_factory=dict)
    export_variants: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    symbolic_export: str | None = None


# Sub-byte dtypes in two of XLA's kernels: its CPU collective-permute overruns
# their buffers (AddressSanitizer: heap-buffer-overflow in
# InProcessCommunicator::CollectivePermute, reading and writing 2-6 bytes of
# 1-2 byte blocks, jaxlib 0.10.2; glibc's heap checks aborted jax 0.11.2 on
# the GPU machine), and its GPU scatter with unique indices loses updates of
# elements that share a byte (uint2 x.at[i].set on an H100, jax 0.11.2: 6 of
# 18 elements left as x had them, where NumPy and jax_tma wrote them). The
# references run those two as these wider types, which hold the values exactly.
SUB_BYTE_WIDE = {"int2": np.int8, "int4": np.int8, "uint2": np.uint8, "uint4": np.uint8,
                 "float4_e2m1fn": np.float32}


# ---- comparisons -----------------------------------------------------------------------

def _is_nan(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "c":
        return np.isnan(a.real) | np.isnan(a.imag)
    if jnp.issubdtype(a.dtype, jnp.inexact):
        with np.errstate(invalid="ignore"):
            return np.isnan(a.astype(np.float64))
    return np.zeros(a.shape, bool)


def _flushed(actual: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Where jnp gave a zero for a subnormal of `actual`."""
    if not jnp.issubdtype(want.dtype, jnp.floating):
        return np.zeros(want.shape, bool)
    a = np.abs(actual.astype(np.float64))
    return (want.astype(np.float64) == 0) & (a > 0) & (a < float(jnp.finfo(want.dtype).smallest_normal))


def assert_like_jnp(actual, jnp_result, exact: bool = True, flushed_ok: bool = False) -> None:
    """`actual` against the jnp equivalent's result: same dtype and shape; bit
    for bit where jnp's element is not NaN (jnp quiets some formats' NaN
    payloads on the CPU), NaN where it is NaN. exact=False (sums in another
    order): close in value instead. flushed_ok: a zero of jnp's where ours
    has a subnormal passes. XLA:CPU runs with subnormals flushed (MXCSR DAZ)
    and some of its paths flush what they move (jnp's gather of bfloat16 in
    shard_map, jax 0.11.2); for callers that hold `actual` to NumPy bit for
    bit too."""
    actual, want = np.asarray(actual), np.asarray(jnp_result)
    assert actual.dtype == want.dtype, f"dtype {actual.dtype}, jnp gives {want.dtype}"
    assert actual.shape == want.shape, f"shape {actual.shape}, jnp gives {want.shape}"
    nan = _is_nan(want)
    assert np.array_equal(_is_nan(actual), nan), \
        f"NaNs at other places than jnp's{reference.seed_note()}"
    if exact:
        keep = ~nan & ~_flushed(actual, want) if flushed_ok else ~nan
        reference.assert_bits_equal(actual[keep], want[keep])
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


def ours_and_ref(case: Case, ours, ref, *args):
    """(ours(*args), ref(*args)), compiled as one program (one compilation),
    but for a collective as two: on the CPU, XLA keeps its own collectives
    in program order, not jax_tma's custom calls, and runs the independent
    branches of a large program on its intra-op thread pool, where the
    blocking exchanges of two branches can starve each other until XLA
    aborts the process (ragged_all_to_all's vjp beside the lax
    formulation's, 2 cores, jax 0.12.0.1; docs/limits.md)."""
    if case.collective:
        return jax.jit(ours)(*args), jax.jit(ref)(*args)
    return jax.jit(lambda *a: (ours(*a), ref(*a)))(*args)


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
