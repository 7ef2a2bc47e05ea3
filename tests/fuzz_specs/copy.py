"""The FFI fuzz's spec of jax_tma.copy (tests/test_ffi_fuzz.py runs it)."""

from __future__ import annotations

import math

import jax
import numpy as np

from fuzz_specs.common import PORTABLE, S, Call, Spec, pick, some_dtype, with_
from reference import random_array


def copy_call(rng, methods=PORTABLE, multiple=1, min_dim=0) -> Call:
    dtype = some_dtype(rng)
    shape = tuple(int(v) for v in rng.integers(min_dim, 5, int(rng.integers(0, 4))))
    if math.prod(shape) * dtype.itemsize % multiple:
        shape = (multiple,)
    x = random_array(rng, shape, dtype)
    attrs = {"method": pick(rng, methods)} if methods else {}
    return Call([x], [S(shape[::-1], dtype)], attrs)


def copy_reference(call: Call) -> list[np.ndarray]:
    return [call.operands[0].reshape(call.results[0].shape)]


COPY_NASTY = (
    (lambda c: with_(c, [np.ones(c.operands[0].shape, jax.numpy.int4)],
                     [S(c.results[0].shape, jax.numpy.int4)]), r"sub-byte|size"),
    (lambda c: with_(c, results=[S((2**20,), c.results[0].dtype)]), r"elements|size"),
    (lambda c: with_(c, [np.zeros((0, 3), c.operands[0].dtype)],
                     [S((3, 0), c.results[0].dtype)]), r"elements|size|shape"),
)


SPECS: dict[str, Spec] = {
    "jax_tma_copy": Spec(("jax_tma.copy",), copy_call, copy_reference, COPY_NASTY),
}
