"""Argument checks and dtype handling that every op shares: the array and
option checks, per-dim int lists, sub-byte widening around the FFI call, and
the compute-capability check for methods that need TMA."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax import lax

from jax_tma import _ffi

MAX_DIM = 2**31 - 1  # the handlers index dims with int32

# Sub-byte dtypes have no fixed byte layout at the FFI boundary; the ops widen
# them losslessly (every value round-trips) around the call.
SUB_BYTE_WIDE = {
    "int2": np.int8,
    "int4": np.int8,
    "uint2": np.uint8,
    "uint4": np.uint8,
    "float4_e2m1fn": np.float32,
}


def as_array(op: str, name: str, x: Any) -> jax.Array:
    """`x` as a jax.Array; a TypeError naming `op` for anything but an array."""
    if not isinstance(x, (jax.Array, np.ndarray, np.generic)):
        raise TypeError(
            f"{op}: {name} must be an array (jax.Array or numpy.ndarray), got "
            f"{type(x).__name__} {x!r:.80}; wrap Python values in jnp.asarray"
        )
    return jax.numpy.asarray(x)


def check_choice(op: str, name: str, value: Any, choices: Sequence[str]) -> None:
    """A ValueError unless `value` is one of the strings `choices`."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(
            f"{op}: {name} must be one of {', '.join(map(repr, choices))}, got {value!r}"
        )


def per_dim_ints(op: str, name: str, value: Any, count: int, dims: str, *,
                 scalar_ok: bool = False) -> tuple[int, ...]:
    """`count` ints in [1, 2^31), one per dim; `dims` says which dims of x they
    follow, for the length error ("rank 2 (x.shape=(4, 5))"). With
    `scalar_ok` a single int serves every dim."""
    if scalar_ok and isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (value,) * count
    if isinstance(value, (int, np.integer, str)) or not isinstance(value, Sequence):
        kind = "an int or a sequence" if scalar_ok else "a sequence"
        raise TypeError(f"{op}: {name} must be {kind} of {count} ints, got {value!r}")
    if len(value) != count:
        raise ValueError(f"{op}: {name} has {len(value)} entries but x has {dims}")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{op}: {name}[{i}] must be an int, got {v!r}")
        if v < 1:
            raise ValueError(f"{op}: {name}[{i}] = {v} is below 1 ({name}={tuple(value)})")
        if v > MAX_DIM:
            raise ValueError(f"{op}: {name}[{i}] = {v} is over 2^31 - 1 ({name}={tuple(value)})")
    return tuple(int(v) for v in value)


def widen_dtype(dtype) -> np.dtype:
    """`dtype`, or its lossless byte-sized stand-in where it is sub-byte."""
    return np.dtype(SUB_BYTE_WIDE.get(np.dtype(dtype).name, dtype))


def widen(x: jax.Array) -> jax.Array:
    """`x`, with a sub-byte dtype converted to its lossless byte-sized stand-in."""
    wide = widen_dtype(x.dtype)
    return lax.convert_element_type(x, wide) if wide != x.dtype else x


def narrow(y: jax.Array, dtype: np.dtype) -> jax.Array:
    """The inverse of widen: `y` back in `dtype` where `dtype` is sub-byte."""
    return lax.convert_element_type(y, dtype) if dtype.name in SUB_BYTE_WIDE else y


def require_tma(op: str, method: str, need: str = "TMA") -> None:
    """A RuntimeError, at lowering for CUDA, where a visible device lacks TMA
    (compute capability below 9.0) and `method` cannot run without it; the
    wording follows the C++ launchers' (ffi/cuda/device_info.h)."""
    for i, (major, minor) in enumerate(_ffi.gpu_compute_capabilities()):
        if (major, minor) < (9, 0):
            raise RuntimeError(
                f"{op}: method={method!r} needs {need}, but device {i} has compute "
                f"capability {major}.{minor} (TMA needs >= 9.0); use method='auto' or 'simt'"
            )
