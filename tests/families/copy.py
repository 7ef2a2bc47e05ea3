"""The copy family's descriptor (tests/families/__init__.py says what each
name is for): jax_tma.copy, whose method="tiled" runs through window's
primitive."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

import jax_tma
from fuzz import PORTABLE, S, Call, Spec, pick, some_dtype, with_
from ops_table import Case, Op, dim_size, dims_spec, extra_rank
from paths import CpuCall
from reference import ALL_DTYPES, random_array

MODULES = ("jax_tma._copy",)


# ---- the FFI fuzz -----------------------------------------------------------------

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


# ---- the paths --------------------------------------------------------------------

CPU_CALLS = {"copy": CpuCall(lambda x: jax_tma.copy(x, method="tma"))}

GPU_CALLS = {
    "copy.tma": lambda x, device: jax_tma.copy(x, method="tma"),
    "copy.simt": lambda x, device: jax_tma.copy(x, method="simt"),
}


# ---- the mode tests ---------------------------------------------------------------

def build_copy(rng, dtype, *, batch=8, even=True, method="auto") -> Case:
    shape = (batch,) + tuple(dim_size(rng, even) for _ in range(extra_rank(rng, even)))
    draw = lambda r: (random_array(r, shape, dtype),)  # noqa: E731
    return Case(
        op="copy", dtype=np.dtype(dtype), args=draw(rng),
        ours=lambda x: jax_tma.copy(x, method=method), ref=jnp.copy,
        expect=lambda x: np.array(x), draw=draw, diff=(0,), batch=(0,),
        split=tuple(range(len(shape))), in_specs=lambda dims: (dims_spec(len(shape), dims),),
        symbolic=((("b",) + tuple(f"d{i}" for i in range(1, len(shape)))),),
    )


OPS = (Op("copy", build_copy, ALL_DTYPES),)
