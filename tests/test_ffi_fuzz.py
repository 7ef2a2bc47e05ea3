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
JAX_TMA_FUZZ_SEED=<seed from its message>. Under --fuzz-budget (tests/conftest.py)
a target runs fewer than CASES cases, at least one."""

from __future__ import annotations

import math
import os
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import families
from families.copy import COPY_NASTY, copy_call, copy_reference
from fuzz import DTYPE_RULES, S, SHAPE_RULES, Call, Spec, i64, pick, some_dtype, with_
from jax_tma import _ffi, _jax_tma
from reference import ALL_DTYPES, as_bits, assert_bits_equal, random_array, skip_unless_required

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
_NASTY_INTS = (-1, 0, 1, 2, 3, 2**31 - 1, 2**31, -2**31, 2**32 + 1, 2**62, 2**63 - 1, -2**63)
_NASTY_STRS = ("", "AUTO", "auto ", "auto\0", "tma", "simt", "bulk", "multicast", "dsmem",
               "store", "x" * 300)


# ---- the specs: each family's (SPECS of tests/families/<family>.py), and the
# ---- CUDA-only benchmark references shaped like copy ---------------------------

def _write_reference(call: Call) -> list[np.ndarray]:
    y = call.results[0]
    return [np.full(math.prod(y.shape) * y.dtype.itemsize, 0x5A, np.uint8).view(y.dtype)
            .reshape(y.shape)]


def _read_reference(call: Call) -> list[np.ndarray]:
    # Flat first: an empty (0, 3) 1-byte array cannot be viewed as uint32 by rows.
    words = np.ascontiguousarray(call.operands[0]).reshape(-1).view(np.uint32)
    return [np.bitwise_xor.reduce(words.reshape(-1, 4), axis=0)]


# The benchmarks' 16-byte rules (seed copy, read stream) of sizes and addresses.
_BENCH_16B = r"multiples of 16"


SPECS: dict[str, Spec] = {
    **families.SPECS,
    # CUDA only, from the benchmarks' module: their references, errors named by target.
    "jax_tma_bench_memcpy": Spec(("jax_tma_bench_memcpy",), lambda rng: copy_call(rng, ()),
                                 copy_reference, COPY_NASTY),
    "jax_tma_bench_seed_copy": Spec(("jax_tma_bench_seed_copy",),
                                    lambda rng: copy_call(rng, (), multiple=16),
                                    copy_reference, COPY_NASTY,
                                    rules={"shape": _BENCH_16B, "dtype": _BENCH_16B}),
    "jax_tma_bench_write": Spec(("jax_tma_bench_write",), lambda rng: copy_call(rng, ()),
                                _write_reference, COPY_NASTY,
                                rules={"dtype": r"size of x"}),
    "jax_tma_bench_read": Spec(("jax_tma_bench_read",), lambda rng: with_(
        copy_call(rng, (), multiple=16), results=[S((4,), np.uint32)]), _read_reference,
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
        rule = {"shape": SHAPE_RULES, "dtype": DTYPE_RULES}[kind]
        return f"{_XLA['decode']}|{handler(rule + '|' + spec.rules.get(kind, rule))}"
    name = kind[len("attr:"):]
    rule = rf"\b{re.escape(name)}\b" + (f"|{spec.attr_rules[name]}" if name in spec.attr_rules
                                         else "")
    return f"{_XLA['decode']}|{handler(rule)}"


# ---- the mutation engine ----------------------------------------------------------

def _bad_attr(value, rng):
    """A wrong value of the attribute's own kind, or a value of another kind."""
    nasty = np.int64(pick(rng, _NASTY_INTS))
    if isinstance(value, str):
        options = [pick(rng, _NASTY_STRS), nasty, True]
    elif isinstance(value, bool):
        options = [not value, np.int64(1), "true"]
    elif isinstance(value, np.integer):
        options = [nasty, np.int64(int(rng.integers(-3, 9))), np.int32(value), np.float64(0.5),
                   np.array([value]), "0"]
    else:  # an int64 array
        wrong = value.copy()
        if wrong.size:
            wrong[rng.integers(wrong.size)] = nasty
        with np.errstate(over="ignore"):  # large words (fill) overflow float16: inf
            options = [wrong, np.full(value.size, nasty), i64(), value[:-1],
                       np.append(value, nasty), value.astype(np.int32), value.astype(np.float64),
                       (1, 2), np.array(value, np.float16), nasty]
    return pick(rng, options)


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
        s[i] = max(0, s[i] + pick(rng, (-1, 1, 2)))
    else:
        s = rng.integers(0, 5, int(rng.integers(0, 7))).tolist()
    return tuple(int(v) for v in s)


def _mutate(call: Call, spec: Spec, rng) -> tuple[str, str, Call]:
    """One random mutation of `call`: its kind (as _rule takes it), a
    description and the call."""
    c = with_(call)
    ops, res = c.operands, c.results
    attrs = [k for k in c.attrs if k not in spec.keep]
    kind = pick(rng, ("shape", "dtype", "dtype all", "attr value", "attr value", "attr value",
                      "missing attr", "extra attr", "missing operand", "extra operand",
                      "missing result", "extra result"))
    if kind == "shape" or kind == "dtype":
        i = int(rng.integers(len(ops) + len(res)))
        old = ops[i] if i < len(ops) else res[i - len(ops)]
        shape = _new_shape(old.shape, rng) if kind == "shape" else old.shape
        dtype = some_dtype(rng, ALL_DTYPES) if kind == "dtype" else old.dtype
        if i < len(ops):
            ops[i] = random_array(rng, shape, dtype)
            where = f"operand {i}"
        else:
            res[i - len(ops)] = S(shape, dtype)
            where = f"result {i - len(ops)}"
        return kind, f"{kind} of {where}: {old.shape} {old.dtype} -> {shape} {dtype}", c
    if kind == "dtype all":  # every array of the first operand's dtype, alike
        old, new = (ops or res)[0].dtype, some_dtype(rng, ALL_DTYPES)
        c.operands = [random_array(rng, a.shape, new) if a.dtype == old else a for a in ops]
        c.results = [S(r.shape, new) if r.dtype == old else r for r in res]
        return "dtype", f"dtype {old} -> {new} everywhere", c
    if kind == "attr value" and attrs:
        k = pick(rng, attrs)
        c.attrs[k] = _bad_attr(c.attrs[k], rng)
        return f"attr:{k}", f"attribute {k}: {call.attrs[k]!r} -> {c.attrs[k]!r:.80}", c
    if kind == "missing attr" and attrs:
        k = pick(rng, attrs)
        del c.attrs[k]
        return "attributes", f"no attribute {k}", c
    if kind == "extra attr":
        c.attrs["extra"] = pick(rng, (np.int64(1), "auto", True, i64(1, 2), np.float32(1)))
        return "attributes", f"extra attribute {c.attrs['extra']!r}", c
    if kind == "missing operand" and ops:
        del ops[rng.integers(len(ops))]
        return "operands", "an operand fewer", c
    if kind == "extra operand":
        ops.insert(int(rng.integers(len(ops) + 1)),
                   random_array(rng, _new_shape((), rng), some_dtype(rng, ALL_DTYPES)))
        return "operands", "an operand more", c
    if kind == "missing result" and res:
        del res[rng.integers(len(res))]
        return "results", "a result fewer", c
    res.append(S(_new_shape((), rng), some_dtype(rng, ALL_DTYPES)))
    return "results", "a result more", c


# ---- running a call -----------------------------------------------------------

def _run(platform: str, target: str, call: Call, what: str) -> list[np.ndarray]:
    """Runs the call on the platform's first device (has_side_effect keeps XLA
    from dropping calls whose results are empty); checks that the inputs are
    unchanged, whether it succeeds or raises. The program also returns a
    scalar of its own, read last: on a GPU an error of the handler reaches
    Python through the program's results, and a call of no results (one
    taken away) would have none to carry it."""
    device = jax.devices(platform)[0]
    args = [jax.device_put(a, device) for a in call.operands]
    fn = jax.ffi.ffi_call(target, call.results, has_side_effect=True)
    try:
        with jax.default_device(device):
            got, done = jax.jit(lambda *a: (fn(*a, **call.attrs), jnp.zeros((), jnp.uint8)))(*args)
            got = [np.asarray(y) for y in got]
            np.asarray(done)
            return got
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
    if platform == "cuda" and _breaks_a_device_checked_rule(target, spec, call, what):
        platform = "cpu"
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
        _check_bounds(spec, call, got, what)
        return
    else:
        want = spec.reference(call)
    assert len(got) == len(want), f"{what}: {len(got)} results, want {len(want)}"
    for g, w in zip(got, want):
        try:
            assert_bits_equal(g, w)
        except AssertionError as e:
            raise AssertionError(f"{what}: wrong result: {e}") from None
    if not spec.exact("cuda", call):  # the GPU's check, run here on bits that pass it
        _check_bounds(spec, call, got, what)


def _breaks_a_device_checked_rule(target: str, spec: Spec, call: Call, what: str) -> bool:
    """Whether the CPU handler refuses the call for a rule the GPU checks on
    the device (Spec.device_checked), where the GPU would trap."""
    if not spec.device_checked:
        return False
    try:
        _run("cpu", target, call, what)
    except jax.errors.JaxRuntimeError as e:
        return re.search(spec.device_checked, str(e), re.S) is not None
    except Exception:
        return False
    return False


def _check_bounds(spec: Spec, call: Call, got: list[np.ndarray], what: str) -> None:
    if spec.bounds is None:
        return
    try:
        spec.bounds(call, got)
    except AssertionError as e:
        raise AssertionError(f"{what}: outside the bounds of any order: {e}") from None


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


# The targets each platform has: on the CPU every family's; on CUDA those its
# manifest gives a CUDA handler (a family may have none yet) and the
# benchmarks' reference targets.
_CUDA_TARGETS = {t for family in _jax_tma.families().values() for t in family["cuda_targets"]}


def _on(platform: str, target: str) -> bool:
    bench = target.startswith("jax_tma_bench_")
    return not bench if platform == "cpu" else bench or target in _CUDA_TARGETS


FUZZ_CASES = [pytest.param(p.values[0], t, marks=p.marks, id=f"{p.values[0]}-{t}")
              for p in PLATFORMS for t in sorted(SPECS) if _on(p.values[0], t)]


@pytest.mark.quick
@pytest.mark.parametrize("platform,target", FUZZ_CASES)
def test_fuzz(platform, target, seed, fuzz_deadline):
    if target not in _registered(platform):
        # A GPU run (JAX_TMA_REQUIRE_GPU=1) must fuzz every target: there the
        # missing module is a failure.
        skip_unless_required(f"{target} is not registered for {platform}: the benchmarks' "
                             "module _jax_tma_bench is not built (JAX_TMA_BENCH=ON)")
    spec = SPECS[target]
    rng = np.random.default_rng(seed)
    where = f"{platform} {target}, seed {seed}"
    for case in range(CASES):
        if case and fuzz_deadline is not None and time.monotonic() > fuzz_deadline:
            break
        base = spec.baseline(rng)
        _check(platform, target, spec, base, f"{where}, case {case}: baseline")
        kind, what, call = _mutate(base, spec, rng)
        while spec.waits_for_peer(call):
            kind, what, call = _mutate(base, spec, rng)
        _check(platform, target, spec, call, f"{where}, case {case}: {what}", kind)
    for i, (nasty, rule) in enumerate(spec.nasty):  # from the last baseline, which ran
        _check(platform, target, spec, nasty(base), f"{where}, nasty case {i}", f"nasty:{rule}")


def _float_add(values, order=None, dtype=np.float32, flush=False):
    """A raw scatter-add call: one table row of `values[0]`, the other values
    its updates, all at index 0 (deterministic=False: the GPU's order), and
    its result summed in `order` of the updates in `dtype`, subnormal
    partial sums flushed where `flush`."""
    x = np.array([[values[0]]], dtype)
    u = np.array([[v] for v in values[1:]], dtype)
    call = Call([np.zeros(len(u), np.int32), np.zeros(0, np.int32), x, u], [S(x.shape, dtype)],
                dict(axis=np.int64(0), batch=np.int64(0), mode="add", deterministic=False,
                     method="auto"))
    acc = x[0, 0]
    for j in order if order is not None else range(len(u)):
        with np.errstate(over="ignore", invalid="ignore"):
            acc = dtype(acc + u[j, 0])
        if flush and abs(acc) < np.finfo(dtype).smallest_normal:
            acc = dtype(0.0)
    return call, [np.array([[acc]], dtype)]


def test_scatter_add_bounds_hold_any_order_and_nothing_else():
    """The fuzz's check of float scatter-adds the GPU sums in hardware order
    (deterministic=False): a sum in any order passes, with subnormals
    flushed too; a value further from the exact sum than n * eps * sum|terms|
    (n terms) plus the flushes' share does not, nor a NaN where there is
    none, nor a finite value where an infinity or NaN must come."""
    bounds = SPECS["jax_tma_scatter"].bounds
    values = [1.0, 1e8, -1e8, 3.0, 2.0**-20, 0.1]
    for order in ([0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [1, 0, 3, 2, 4]):
        call, got = _float_add(values, order)
        bounds(call, got)
    call, got = _float_add([0.0, 1e-39, -1e-39, 2e-39], flush=True)  # float32 subnormals
    bounds(call, got)
    call, got = _float_add(values)
    size = sum(abs(v) for v in values)
    far = got[0] + np.float32(2 * len(values) * np.finfo(np.float32).eps * size)
    for wrong in (far, np.full_like(got[0], np.nan)):
        with pytest.raises(AssertionError, match=r"component 0"):
            bounds(call, [wrong])
    for special, want in ((np.inf, np.inf), (np.nan, np.nan)):
        call, _ = _float_add([1.0, special, 2.0])
        with pytest.raises(AssertionError, match=r"want"):
            bounds(call, [np.array([[3.0]], np.float32)])
    call, _ = _float_add([np.inf, -np.inf])
    bounds(call, [np.array([[np.nan]], np.float32)])
    call, _ = _float_add([3e38, 3e38, -3e38])  # may overflow in one order
    bounds(call, [np.array([[np.inf]], np.float32)])
    bounds(call, [np.array([[3e38]], np.float32)])
