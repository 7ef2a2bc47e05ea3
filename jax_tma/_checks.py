"""Argument checks and dtype handling that every op shares: the array and
option checks (with the method vocabulary), per-dim int lists, sub-byte
widening around the FFI call, the compute-capability check for methods that
need TMA, and the user's frame for call sites and warnings."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from types import FrameType
from typing import Any

import jax
import numpy as np
from jax import lax

from jax_tma import _devices, _ffi

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
    """`x` as a jax.Array, as jnp.asarray gives it: arrays, NumPy scalars and
    Python scalars (bool, int, float, complex, weakly typed as in jnp); a
    TypeError naming `op` for anything else."""
    if not isinstance(x, (jax.Array, np.ndarray, np.generic, bool, int, float, complex)):
        raise TypeError(
            f"{op}: {name} must be an array (jax.Array or numpy.ndarray) or a scalar, got "
            f"{type(x).__name__} {x!r:.80}"
        )
    return jax.numpy.asarray(x)


def fill_bytes(op: str, fill: Any, dtype: Any) -> bytes:
    """The bytes of one element of `dtype` (widened where sub-byte) holding
    `fill`, converted as jnp converts a scalar into an array of `dtype`
    (float8_e8m0fnu's 0 is 0xFF; a NaN of float8_e5m2 is 0x7F, as jnp.pad
    and jnp.take write it, where NumPy's conversion gives 0x7E). `fill` is a
    concrete scalar: a Python or NumPy number or a 0-d array that is not
    traced; or the string "nan" (any case), NaN in both parts of a complex
    dtype (a NaN number converts as jnp.pad converts it: NaN + 0j). One rule
    for every op with a fill: NaN needs a floating or complex dtype (an
    integer has no NaN, and NaN's conversion to one is platform-defined)."""
    dtype = np.dtype(dtype)
    if isinstance(fill, jax.core.Tracer):
        raise TypeError(f"{op}: fill must be a concrete scalar (it sets the bits written out "
                        f"of bounds when the call is compiled), got a traced value {fill}")
    if isinstance(fill, str):
        if fill.lower() != "nan":
            raise ValueError(f"{op}: fill must be a number or 'nan', got {fill!r:.80}")
        fill = complex(np.nan, np.nan) if dtype.kind == "c" else np.nan
    if np.ndim(fill) != 0:
        raise TypeError(f"{op}: fill must be a scalar number, got {fill!r:.80}")
    number = np.asarray(fill)
    if (jax.numpy.issubdtype(number.dtype, jax.numpy.inexact) and np.isnan(number)
            and not jax.numpy.issubdtype(dtype, jax.numpy.inexact)):
        raise ValueError(f"{op}: fill=NaN needs a floating dtype, x has dtype {dtype}")
    if isinstance(fill, int) and not isinstance(fill, bool) and not \
            np.iinfo(np.int64).min <= fill <= np.iinfo(np.uint64).max:
        if not jax.numpy.issubdtype(dtype, jax.numpy.inexact):
            raise OverflowError(f"{op}: fill {fill} does not fit x's dtype {dtype}")
        fill = float(fill)  # as jnp does for an inexact dtype
    value = np.asarray(fill)
    # ml_dtypes scalars (bfloat16, float8_*, int4, ...) are numbers of kind V.
    if value.dtype.kind not in "biufc" and not jax.numpy.issubdtype(value.dtype, np.number):
        raise TypeError(f"{op}: fill must be a number, got {fill!r:.80}")
    if value.dtype.kind == "c" and dtype.kind != "c":
        raise TypeError(f"{op}: a complex fill {fill!r} needs a complex x, x has dtype {dtype}")
    with np.errstate(invalid="ignore", over="ignore"):
        converted = np.asarray(value.astype(dtype))
    if dtype.name == "float8_e5m2" and np.isnan(converted):
        converted = (converted.view(np.uint8) | 0x7F).view(dtype)  # XLA's quiet NaN
    return converted.astype(widen_dtype(dtype)).tobytes()


def varying_axes(x: Any) -> frozenset:
    """The manual mesh axes along which `x` varies inside shard_map (its
    vma); empty outside shard_map."""
    aval = jax.typeof(x)
    mat = getattr(aval, "mat", None)
    return frozenset(getattr(mat, "varying", None) or getattr(aval, "vma", ()) or ())


def align_varying(*xs: jax.Array) -> list[jax.Array]:
    """`xs`, each made varying (jax.lax.pcast) along the mesh axes any of
    them varies along, as jax does for its own primitives' operands inside
    shard_map: then the results vary where the operands do, and the
    transpose of the cast sums the cotangents of replicated operands."""
    union = frozenset().union(*(varying_axes(x) for x in xs))
    out = []
    for x in xs:
        missing = tuple(a for a in sorted(union, key=str) if a not in varying_axes(x))
        out.append(jax.lax.pcast(x, missing, to="varying") if missing else x)
    return out


def check_choice(op: str, name: str, value: Any, choices: Sequence[str]) -> None:
    """A ValueError unless `value` is one of the strings `choices`."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(
            f"{op}: {name} must be one of {', '.join(map(repr, choices))}, got {value!r}"
        )


def check_method(op: str, method: Any, choices: Sequence[str]) -> str:
    """`method` checked against `choices` (a ValueError naming them). "bulk",
    the first name of the whole-buffer ops' TMA method, is still read as
    "tma", after a DeprecationWarning at the user's line."""
    if isinstance(method, str) and method == "bulk":
        _, level = user_frame()
        warnings.warn(f"{op}: method='bulk' is deprecated, use method='tma' (the same TMA "
                      "bulk copy, the same result)", DeprecationWarning, stacklevel=level)
        return "tma"
    check_choice(op, "method", method, choices)
    return method


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
    tma = _ffi.rules()["tma_min_compute_capability"]
    for i, (major, minor) in enumerate(_devices.gpu_compute_capabilities()):
        if (major, minor) < tma:
            raise RuntimeError(
                f"{op}: method={method!r} needs {need}, but device {i} has compute "
                f"capability {major}.{minor} (TMA needs >= {tma[0]}.{tma[1]}); "
                "use method='auto' or 'simt'"
            )


# Frames in these folders are jax's or jax_tma's, not the user's.
_LIBRARIES = tuple(os.path.dirname(f) + os.sep for f in (jax.__file__, __file__))


def user_frame() -> tuple[FrameType | None, int]:
    """The innermost frame outside jax and jax_tma (the user's call of an op,
    under jit too) and its depth counted from the caller of user_frame (1:
    that caller; warnings.warn's stacklevel when the caller warns); None
    where every frame is a library's."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARIES):
        frame, level = frame.f_back, level + 1
    return frame, level
