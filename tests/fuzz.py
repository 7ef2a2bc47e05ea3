"""What every family's FFI fuzz spec (SPECS of its descriptor,
tests/families/<family>.py) is built from: the call, the spec, the random
pickers and the rules every handler words alike. tests/test_ffi_fuzz.py
runs the specs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jax_tma import _lowering
from reference import ALL_DTYPES, SUB_BYTE_BITS, random_array

S = jax.ShapeDtypeStruct

# The rules of an array's form that every handler checks, as they word them:
# a shape (ranks, dims, element counts, sizes) and an element type.
SHAPE_RULES = r"rank|\bdims?\b|\belements?\b|entries|shape|\bsize|batch"
DTYPE_RULES = r"element type|sub-byte"

BYTE_DTYPES = tuple(d for d in ALL_DTYPES if d.name not in SUB_BYTE_BITS)
SUMMABLE = tuple(d for d in BYTE_DTYPES  # what col2im and scatter's add sum
                 if d.kind in "iuc" or d.name in ("float16", "bfloat16", "float32", "float64"))
# Baselines take the methods that run on every device; the forced hardware
# methods (which may refuse a geometry, naming the rule) come in as mutations.
PORTABLE = ("auto", "simt")


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
    # "operands", "results") breaks, beyond SHAPE_RULES / DTYPE_RULES and
    # XLA's; and, by attribute, what else a wrong value of it breaks (the
    # attribute's own name always counts).
    rules: dict[str, str] = dataclasses.field(default_factory=dict)
    attr_rules: dict[str, str] = dataclasses.field(default_factory=dict)
    keep: tuple[str, ...] = ()                            # attributes never mutated
    waits_for_peer: Callable[[Call], bool] = lambda call: False  # would block until a timeout
    # Whether an accepted call's results are defined bit for bit on the
    # platform (else: no crash, inputs unchanged, the right shapes, and the
    # values within `bounds`).
    exact: Callable[[str, Call], bool] = lambda platform, call: True
    # For results not defined bit for bit (an order of float sums the
    # hardware picks): raises AssertionError where a value lies outside what
    # any order allows. It also runs on the bits of platforms where they are
    # defined, wherever the GPU's would not be, so that the CPU runs it.
    bounds: Callable[[Call, list[np.ndarray]], None] | None = None
    # The handler's rules (a pattern of their errors) that the GPU checks in
    # its kernel, on values on the device, where a broken one traps and ends
    # the process's CUDA context: a call whose CPU run breaks one of them is
    # held to the CPU's error instead (the GPU's trap, and its message, are
    # tested in a process of their own: tests/test_multi_gpu.py).
    device_checked: str = ""


def random_fill(rng, dtypes) -> np.ndarray:
    """A "fill" attribute (ffi/fill.h) for outputs of `dtypes`: random bits
    or zero for each."""
    return _lowering.fill_attr([random_array(rng, (), d).tobytes() if rng.integers(2)
                                else bytes(1) for d in dtypes])


def fill_patterns(call: Call) -> list[np.ndarray]:
    """Each output's fill element repeated to 16 bytes, from the call's
    "fill" attribute."""
    words = np.asarray(call.attrs["fill"], "<i8")
    return [words[2 * t:2 * t + 2].view(np.uint8) for t in range(len(words) // 2)]


def some_dtype(rng, pool=BYTE_DTYPES) -> np.dtype:
    return pool[int(rng.integers(len(pool)))]


def pick(rng, options):
    return options[int(rng.integers(len(options)))]


def with_(call: Call, operands=None, results=None, **attrs) -> Call:
    return Call(list(call.operands if operands is None else operands),
                list(call.results if results is None else results), {**call.attrs, **attrs})


def i64(*values) -> np.ndarray:
    return np.array(values, np.int64)
