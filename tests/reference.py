"""Test references: fresh random inputs for every dtype JAX has (uniform bits
with special values mixed in), bit-level comparison (as unsigned integers of
the same width) whose failures name the random seed, and the list of
collective ops that the sharding tests forbid."""

from __future__ import annotations

import functools
import os
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

_CANDIDATES = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
    "uint64", "float16", "bfloat16", "float32", "float64", "complex64",
    "complex128", "float8_e4m3fn", "float8_e5m2", "float8_e4m3b11fnuz",
    "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e3m4", "float8_e4m3",
    "float8_e8m0fnu", "int4", "uint4", "int2", "uint2", "float4_e2m1fn",
)
ALL_DTYPES = tuple(
    np.dtype(getattr(jnp, n)) for n in _CANDIDATES if hasattr(jnp, n)
)
SUB_BYTE_BITS = {"int2": 2, "uint2": 2, "int4": 4, "uint4": 4, "float4_e2m1fn": 4}

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


# ---- seeds: every random input of a test comes from the `rng` fixture ------

class SeededGenerator(np.random.Generator):
    """A NumPy Generator that knows the seed it started from."""

    def __init__(self, seed: int):
        super().__init__(np.random.PCG64(seed))
        self.seed = seed


_active_seed: int | None = None


def set_active_seed(seed: int | None) -> None:
    """The seed of the running test's `rng` fixture (None outside one); the
    comparison helpers below name it in their failure messages."""
    global _active_seed
    _active_seed = seed


def seed_note() -> str:
    """' [rng seed S: rerun with JAX_TMA_SEED=S]' while a test's `rng` is live."""
    if _active_seed is None:
        return ""
    return f" [rng seed {_active_seed}: rerun with JAX_TMA_SEED={_active_seed}]"


# The tests that take several GiB of GPU memory. A process's allocator keeps
# the memory it grew to (61 GiB for these three on an H100), so
# scripts/gpu_check.sh runs them on their own first, in a pytest that then
# exits, and the parallel workers after them.
BIG_MEMORY = pytest.mark.big_gpu_memory


def skip_unless_required(reason: str) -> None:
    """pytest.skip, except on a GPU run (JAX_TMA_REQUIRE_GPU=1), which must run
    every GPU test: there the missing feature is a failure."""
    if os.environ.get("JAX_TMA_REQUIRE_GPU") == "1":
        pytest.fail(f"JAX_TMA_REQUIRE_GPU=1 but this test cannot run: {reason}")
    pytest.skip(reason)


# ---- random inputs with special values -------------------------------------

# Share of the elements (of the words, for complex: each part on its own)
# that random_array replaces with special values, at random positions.
SPECIAL_FRACTION = 0.05


def _float_layout(dtype: np.dtype) -> tuple[int, int, bool]:
    """(bits, mantissa bits, has a sign bit) of a float format."""
    bits = SUB_BYTE_BITS.get(dtype.name, dtype.itemsize * 8)
    info = ml_dtypes.finfo(dtype)
    return bits, int(info.nmant), float(info.min) < 0


@functools.cache
def _float_specials(name: str, finite: bool) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """The special values of float format `name` as bit patterns (unsigned
    words of its storage width), by category; random_array picks a category
    uniformly, then a member. Categories (each only where the format has
    members): "zero" (+0, -0), "inf", "nan" (per sign, quiet and signalling:
    the smallest and largest payload), "subnormal" (smallest and largest, both
    signs), "extreme" (largest finite and smallest normal, both signs).
    Also, for formats up to 16 bits, every NaN pattern (random payloads are
    drawn from it); None for 32/64 bits (see _random_nans). `finite` leaves
    out "inf" and "nan"."""
    dtype = np.dtype(getattr(jnp, name))
    bits, nmant, signed = _float_layout(dtype)
    store = _UINT[dtype.itemsize]
    sign_bit = (1 << (bits - 1)) if signed else 0
    if bits <= 16:  # every pattern
        pats = np.arange(1 << bits, dtype=np.uint64)
    else:  # IEEE binary32/64: the candidates, from the layout
        expm = ((1 << (bits - 1 - nmant)) - 1) << nmant  # exponent all ones
        mant = (1 << nmant) - 1
        quiet = 1 << (nmant - 1)  # the top mantissa bit: set in a quiet NaN
        base = [0, expm, 1, mant, 1 << nmant, expm - 1,
                expm | quiet, expm | quiet | mant, expm | 1, expm | (quiet - 1)]
        pats = np.array(base + [p | sign_bit for p in base], np.uint64)
    with np.errstate(invalid="ignore"):
        vals = pats.astype(store).view(dtype).astype(np.float64)
    neg = (pats & np.uint64(sign_bit)) != 0
    is_quiet = (((pats >> np.uint64(nmant - 1)) & np.uint64(1)) == 1 if nmant
                else np.zeros(pats.size, bool))
    info = ml_dtypes.finfo(dtype)
    tiny = float(info.smallest_normal)
    nan = np.isnan(vals)
    sub = np.isfinite(vals) & (vals != 0) & (np.abs(vals) < tiny)
    cats = {"zero": pats[vals == 0]}
    if not finite:
        cats["inf"] = pats[np.isinf(vals)]
        cats["nan"] = np.array([g[i] for s in (False, True) for q in (False, True)
                                for g in [np.sort(pats[nan & (neg == s) & (is_quiet == q)])]
                                if g.size for i in (0, -1)], np.uint64)
    cats["subnormal"] = np.array([pats[m][f(np.abs(vals[m]))] for s in (False, True)
                                  for m in [sub & (neg == s)] if m.any()
                                  for f in (np.argmin, np.argmax)], np.uint64)
    extreme = (vals == float(info.max)) | (vals == float(info.min)) | (np.abs(vals) == tiny)
    cats["extreme"] = pats[np.isfinite(vals) & extreme]
    cats = {k: np.unique(v).astype(store) for k, v in cats.items() if v.size}
    pool = pats[nan].astype(store) if bits <= 16 and not finite else None
    return cats, pool


def _random_nans(rng: np.random.Generator, name: str, k: int, pool) -> np.ndarray:
    """k NaN bit patterns with random signs and payloads (quiet or signalling)."""
    if pool is not None:
        return pool[rng.integers(0, pool.size, k)]
    dtype = np.dtype(getattr(jnp, name))
    bits, m, _ = _float_layout(dtype)
    u = _UINT[dtype.itemsize]
    expm = u(((1 << (bits - 1 - m)) - 1) << m)
    sign = rng.integers(0, 2, k, dtype=u) << u(bits - 1)
    return sign | expm | rng.integers(1, 1 << m, k, dtype=u)


def _mix_float_specials(rng: np.random.Generator, words: np.ndarray, name: str,
                        finite: bool) -> None:
    """Replaces about SPECIAL_FRACTION of `words` (float format `name`, as
    unsigned words) in place with special values; `finite` first redraws
    the infinities and NaNs of the uniform draw."""
    dtype = np.dtype(getattr(jnp, name))
    if finite:
        top = ((1 << SUB_BYTE_BITS[name]) - 1 if name in SUB_BYTE_BITS
               else np.iinfo(words.dtype).max)
        with np.errstate(invalid="ignore"):
            while (bad := np.flatnonzero(~np.isfinite(words.view(dtype).astype(np.float64)))).size:
                words[bad] = rng.integers(0, top, bad.size, dtype=words.dtype, endpoint=True)
    cats, pool = _float_specials(name, finite)
    k = int(rng.binomial(words.size, SPECIAL_FRACTION)) if words.size else 0
    if not k:
        return
    names = list(cats)
    which = rng.integers(0, len(names), k)
    vals = np.empty(k, words.dtype)
    for c, label in enumerate(names):
        sel = np.flatnonzero(which == c)
        vals[sel] = cats[label][rng.integers(0, cats[label].size, sel.size)]
        if label == "nan":  # half of the NaNs get random payloads
            sel = sel[rng.random(sel.size) < 0.5]
            vals[sel] = _random_nans(rng, name, sel.size, pool)
    words[rng.integers(0, words.size, k)] = vals


def _mix_int_specials(rng: np.random.Generator, values: np.ndarray, lo: int, hi: int) -> None:
    """Replaces about SPECIAL_FRACTION of `values` in place with the range's
    edges and the values next to zero: lo, hi, 0, 1 and -1 (when signed)."""
    specials = np.array(sorted({lo, hi, 0, 1} | ({-1} if lo < 0 else set())), values.dtype)
    k = int(rng.binomial(values.size, SPECIAL_FRACTION)) if values.size else 0
    if k:
        values[rng.integers(0, values.size, k)] = specials[rng.integers(0, specials.size, k)]


def random_array(rng: np.random.Generator, shape, dtype, *, finite: bool = False) -> np.ndarray:
    """Random bits of `dtype`, with about SPECIAL_FRACTION of the elements
    (complex: of each part) replaced at random positions by special values:
    floats get +-0, +-inf, NaNs (quiet and signalling, both signs, varied
    payloads), the smallest and largest subnormals, the largest finite and
    smallest normal values, as far as the format has them; integers their
    minimum, maximum, 0, 1 and -1. `finite=True` (for tests that compute
    with the values) leaves out infinities and NaNs, the special ones and
    those of the uniform draw."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    if dtype == np.bool_:
        return rng.integers(0, 2, n, dtype=np.uint8).view(np.bool_).reshape(shape)
    bits = SUB_BYTE_BITS.get(dtype.name)
    if bits is not None:
        if dtype.name.startswith("float"):
            raw = rng.integers(0, 1 << bits, n, dtype=np.uint8)
            _mix_float_specials(rng, raw, dtype.name, finite)
            return raw.view(dtype).reshape(shape)
        signed = dtype.name.startswith("int")
        lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if signed else (0, 1 << bits)
        values = rng.integers(lo, hi, n)
        _mix_int_specials(rng, values, lo, hi - 1)
        return values.astype(dtype).reshape(shape)
    width = dtype.itemsize if dtype.kind != "c" else dtype.itemsize // 2
    words = n * (dtype.itemsize // width)
    raw = rng.integers(0, np.iinfo(_UINT[width]).max, words, dtype=_UINT[width],
                       endpoint=True)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        _mix_int_specials(rng, raw.view(dtype), int(info.min), int(info.max))
    elif dtype.kind == "c":
        _mix_float_specials(rng, raw, "float32" if width == 4 else "float64", finite)
    else:
        _mix_float_specials(rng, raw, dtype.name, finite)
    return raw.view(dtype).reshape(shape)


def as_bits(a) -> np.ndarray:
    """The array's bytes, flattened, as unsigned ints of the element width
    (complex: two words per element; sub-byte types: the value bits)."""
    a = np.asarray(a).reshape(-1)
    bits = SUB_BYTE_BITS.get(a.dtype.name)
    if bits is not None:
        return a.view(np.uint8) & np.uint8((1 << bits) - 1)
    if a.dtype.kind == "c":
        return a.view(_UINT[a.dtype.itemsize // 2])
    return a.view(_UINT[a.dtype.itemsize])


def assert_bits_equal(actual, expected) -> None:
    """actual == expected bit for bit (dtype, shape and every word); a
    failure names the running test's rng seed."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, \
        f"dtype {actual.dtype}, want {expected.dtype}{seed_note()}"
    assert actual.shape == expected.shape, \
        f"shape {actual.shape}, want {expected.shape}{seed_note()}"
    a, e = as_bits(actual), as_bits(expected)
    if not np.array_equal(a, e):
        bad = np.flatnonzero(a != e)
        raise AssertionError(
            f"{bad.size} of {a.size} words differ; first at flat index "
            f"{bad[0]}: got {a[bad[0]]:#x}, want {e[bad[0]]:#x}{seed_note()}"
        )


POISON = 0xA5


@functools.cache
def _into_donated(fn):
    # Donating a poisoned buffer of the output's shape lets XLA hand it to
    # `fn` as its output buffer: any element the kernel misses stays poisoned.
    return jax.jit(lambda x, poison: fn(x), donate_argnums=1, keep_unused=True)


def into_poison(fn, x: np.ndarray, device, path: str | None = None) -> jax.Array:
    """fn(x) on `device` (fn returning an array shaped like x) written
    straight into a buffer of POISON bytes; asserts that XLA did reuse it and,
    given `path` ("copy.tma"), that the handler took that path."""
    f = _into_donated(fn)
    xd = jax.device_put(x, device)
    poison = jax.device_put(np.full(x.nbytes, POISON, np.uint8).view(x.dtype).reshape(x.shape),
                            device)
    if not x.size:
        return f(xd, poison)
    hlo = f.lower(xd, poison).compile().as_text()
    assert "input_output_alias" in hlo and not re.search(r"\bcopy(-start)?\(", hlo), \
        "XLA does not write the result straight into the donated buffer"
    ptr = poison.unsafe_buffer_pointer()
    if path is None:
        y = f(xd, poison)
    else:
        from paths import run_on_path  # jax_tma loads with it: not at conftest's import
        y = run_on_path(path, f, xd, poison)
    assert y.unsafe_buffer_pointer() == ptr, "XLA did not reuse the poisoned buffer"
    return y


# Every HLO op that moves data between devices, as it appears in compiled
# HLO text; the async forms (all-gather-start, send-done, ...) and
# ragged-all-to-all contain these names.
COLLECTIVE_OPS = ("all-gather", "all-reduce", "all-to-all", "reduce-scatter",
                  "collective-permute", "collective-broadcast", "send", "recv")
# A whole word (so "send" does not match inside "sender"), -start/-done allowed.
_COLLECTIVE_RE = re.compile(r"(?<![\w])(" + "|".join(map(re.escape, COLLECTIVE_OPS))
                            + r")(?:-start|-done)?(?![\w])")


def collectives_in(hlo_text: str) -> list[str]:
    """The collective ops (COLLECTIVE_OPS, async forms included) in HLO text."""
    return sorted({m.group(0) for m in _COLLECTIVE_RE.finditer(hlo_text)})


def assert_no_collectives(hlo_text: str) -> None:
    found = collectives_in(hlo_text)
    assert not found, f"collectives in the compiled HLO: {found}"


def cpu_device():
    return jax.local_devices(backend="cpu")[0]


def cpu_mesh(shape, names, axis_type=None):
    """A mesh over the forced host devices (tests/conftest.py makes 8), of
    one axis type (Auto by default), whatever the default backend is."""
    from jax.sharding import AxisType, Mesh
    devices, need = jax.devices("cpu"), int(np.prod(shape))
    if len(devices) < need:
        raise RuntimeError(f"the test needs {need} host devices (tests/conftest.py forces 8), "
                           f"jax sees {len(devices)}")
    return Mesh(np.array(devices[:need]).reshape(shape), names,
                axis_types=(axis_type or AxisType.Auto,) * len(names))


def use_mesh(mesh):
    """jax.set_mesh where this jax has it (0.12), else jax.sharding.use_mesh."""
    return (getattr(jax, "set_mesh", None) or jax.sharding.use_mesh)(mesh)


# ---- moe_dispatch / moe_combine: issue 43's contract, device by device -------

def moe_dispatch_reference(x, expert_ids, n: int, num_experts: int, capacity: int | None = None):
    """The contract of jax_tma.moe_dispatch for `x` (n·T, H) and `expert_ids`
    (n·T, k) split into `n` blocks along dim 0 (a 1-D mesh): device d owns
    experts d·E/n on and receives, expert by expert, the rows of every
    choice of them in (source, token, choice) order, the first `capacity`
    of each expert (all for None). Returns (recv, group_sizes, dropped,
    placed): recv[d] the rows device d receives (its received total of
    them), group_sizes (n, E/n), dropped (n·T, k) bool, and placed {(s, t,
    j): (d, row)} for every kept choice (ids outside [0, E) are masked)."""
    ids = np.asarray(expert_ids).astype(np.int64).reshape(n, -1, np.shape(expert_ids)[1])
    blocks = np.asarray(x).reshape((n, -1) + np.shape(x)[1:])
    local = num_experts // n
    tokens, k = ids.shape[1:]
    recv, sizes = [], np.zeros((n, local), np.int32)
    dropped, placed = np.zeros(ids.shape, bool), {}
    for d in range(n):
        rows = []
        for e in range(d * local, (d + 1) * local):
            for s, t, j in zip(*np.nonzero(ids == e)):  # row-major: (source, token, choice)
                if capacity is not None and sizes[d, e - d * local] == capacity:
                    dropped[s, t, j] = True
                    continue
                placed[(s, t, j)] = (d, len(rows))
                rows.append(blocks[s, t])
                sizes[d, e - d * local] += 1
        recv.append(np.array(rows, blocks.dtype).reshape((len(rows),) + blocks.shape[2:]))
    return recv, sizes, dropped.reshape(n * tokens, k), placed


def moe_combine_reference(y, weights, placed, n: int) -> np.ndarray:
    """The sums of jax_tma.moe_combine for `y` (n·S, H) and `weights` (n·T,
    k), each split into `n` blocks, and `placed` of moe_dispatch_reference,
    in the order its docstring fixes: on each expert's device, the rounded
    products of the token's choices there in ascending j, summed in float32
    (float64 for float64 y), rounded to y's dtype; at home, those rows in
    the order of each device's first kept choice, summed, then rounded
    (+0.0 for a token with no kept choice). Rounding to y's dtype is XLA's
    conversion on the CPU."""
    y = np.asarray(y)
    acc = np.float64 if y.dtype == np.float64 else np.float32
    rows = np.asarray(jax.device_put(y, cpu_device()).astype(acc)).reshape((n, -1) + y.shape[1:])
    w = np.asarray(weights).astype(acc)
    w = w.reshape(n, -1, w.shape[1])

    def rounded(a):  # both conversions XLA's (ml_dtypes gives NaNs another sign)
        return np.asarray(jax.device_put(a, cpu_device()).astype(y.dtype).astype(acc))

    out = np.zeros((n, w.shape[1]) + y.shape[1:], acc)
    for s in range(n):
        for t in range(w.shape[1]):
            partial: dict[int, np.ndarray] = {}  # insertion order: first kept choice
            for j in range(w.shape[2]):
                if (s, t, j) in placed:
                    d, row = placed[(s, t, j)]
                    term = w[s, t, j] * rows[d, row]
                    partial[d] = partial[d] + term if d in partial else term
            for i, p in enumerate(partial.values()):
                out[s, t] = out[s, t] + rounded(p) if i else rounded(p)
    return np.asarray(jax.device_put(out.reshape((-1,) + y.shape[1:]), cpu_device()).astype(y.dtype))
