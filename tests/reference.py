"""Test references: fresh random inputs for every dtype JAX has, and
bit-level comparison (as unsigned integers of the same width)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

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


def random_array(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Random bits (NaN payloads, -0.0, subnormals included) of `dtype`."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    if dtype == np.bool_:
        return rng.integers(0, 2, n, dtype=np.uint8).view(np.bool_).reshape(shape)
    bits = SUB_BYTE_BITS.get(dtype.name)
    if bits is not None:
        if dtype.name.startswith("float"):
            raw = rng.integers(0, 1 << bits, n, dtype=np.uint8)
            return raw.view(dtype).reshape(shape)
        signed = dtype.name.startswith("int")
        lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if signed else (0, 1 << bits)
        return rng.integers(lo, hi, n).astype(dtype).reshape(shape)
    width = dtype.itemsize if dtype.kind != "c" else dtype.itemsize // 2
    words = n * (dtype.itemsize // width)
    raw = rng.integers(0, np.iinfo(_UINT[width]).max, words, dtype=_UINT[width],
                       endpoint=True)
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
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    a, e = as_bits(actual), as_bits(expected)
    if not np.array_equal(a, e):
        bad = np.flatnonzero(a != e)
        raise AssertionError(
            f"{bad.size} of {a.size} words differ; first at flat index "
            f"{bad[0]}: got {a[bad[0]]:#x}, want {e[bad[0]]:#x}"
        )


def cpu_device():
    return jax.devices("cpu")[0]


def window_reference(x: np.ndarray, start, shape, strides=None, fill_nan=False) -> np.ndarray:
    """NumPy jax_tma.window: out[i] = x[start + i * strides] inside x, else the
    fill (0, or the dtype's NaN as NumPy writes it; complex: NaN in both parts)."""
    x = np.asarray(x)
    strides = strides or (1,) * x.ndim
    idx = [np.asarray(s) + np.arange(n) * st for s, n, st in zip(start, shape, strides)]
    grids = np.meshgrid(*idx, indexing="ij") if idx else []
    inside = np.ones(tuple(shape), bool)
    for g, dim in zip(grids, x.shape):
        inside &= (g >= 0) & (g < dim)
    out = np.zeros(tuple(shape), x.dtype)
    if fill_nan:
        out[...] = complex(np.nan, np.nan) if out.dtype.kind == "c" else np.nan
    if x.size:
        clipped = tuple(np.clip(g, 0, max(dim - 1, 0)) for g, dim in zip(grids, x.shape))
        out[inside] = x[clipped][inside]
    return out


def ppermute_reference(x: np.ndarray, n: int, perm) -> np.ndarray:
    """lax.ppermute's result for `x` split into `n` blocks along dim 0 (a
    1-D mesh): block d is the block of the device sending to d, else zeros."""
    blocks = np.split(np.asarray(x), n)
    out = [np.zeros_like(b) for b in blocks]
    for src, dst in perm:
        out[dst] = blocks[src]
    return np.concatenate(out)


def broadcast_reference(x: np.ndarray, n: int, axis: int) -> np.ndarray:
    """NumPy jax_tma.broadcast: n copies of x stacked along a new axis."""
    x = np.asarray(x)
    axis = axis % (x.ndim + 1)
    return np.ascontiguousarray(np.repeat(np.expand_dims(x, axis), n, axis=axis))


def _tap_slices(kernel, strides, dilation, out_spatial):
    """Per tap (row-major over the kernel): the strided slices of the padded
    input that the tap reads for every output pixel."""
    for tap in np.ndindex(*kernel):
        # o == 0: an empty slice (k * d - s + 1 as a stop could be negative,
        # which NumPy reads from the end)
        yield tuple(slice(k * d, k * d + (o - 1) * s + 1, s) if o else slice(0, 0)
                    for k, s, d, o in zip(tap, strides, dilation, out_spatial))


def _out_spatial(spatial, kernel, strides, pads, dilation):
    """0 where the dilated kernel is larger than the padded input (lax's rule)."""
    return tuple(max(0, (n + lo + hi - d * (k - 1) - 1) // s + 1)
                 for n, k, s, (lo, hi), d in zip(spatial, kernel, strides, pads, dilation))


# (x shape, kernel, strides, dilation, padding, lax's patch shape): some
# spatial output dim is 0 where the dilated kernel spans more pixels than the
# padded input has; lax.conv_general_dilated_patches returns an empty array.
IM2COL_EMPTY_CASES = [
    ((2, 3, 4, 5, 5), 3, 1, 2, "VALID", (2, 0, 0, 1, 135)),            # the case
    ((2, 4, 3), 5, 1, 1, "VALID", (2, 0, 15)),                        # 1D
    ((1, 2, 3), 3, 3, 2, ((1, 0),), (1, 0, 9)),                       # 1D, padded, strided
    ((3, 2, 4), 7, 2, 3, "VALID", (3, 0, 28)),                        # 1D, kernel 19 > 2
    ((2, 5, 3, 2), (2, 3), 1, (1, 2), ((0, 0), (1, 0)), (2, 4, 0, 12)),  # 2D, last dim empty
    ((1, 2, 6, 3), (3, 2), (2, 1), 1, ((0, 0), (1, 1)), (1, 0, 7, 18)),  # 2D, first dim empty
    ((2, 5, 4, 5, 2), (2, 3, 2), 1, (1, 2, 1), ((1, 0), (0, 0), (0, 1)),
     (2, 5, 0, 5, 24)),                                               # 3D, middle dim empty
    ((1, 1, 1, 1, 4), 2, 1, 1, "VALID", (1, 0, 0, 0, 32)),             # 3D, every dim empty
    ((2, 0, 3), 3, 1, 1, "SAME", (2, 0, 9)),                           # empty input, SAME
]
IM2COL_EMPTY_IDS = [f"{len(c[0]) - 2}d-{'x'.join(map(str, c[5]))}" for c in IM2COL_EMPTY_CASES]


def im2col_reference(x, kernel, strides, pads, dilation, order="tap_major") -> np.ndarray:
    """NumPy jax_tma.im2col: (N, *S, C) -> (N, *O, K * C), padded pixels zero."""
    x = np.asarray(x)
    spatial = x.shape[1:-1]
    out = _out_spatial(spatial, kernel, strides, pads, dilation)
    xp = np.zeros((x.shape[0],) + tuple(n + lo + hi for n, (lo, hi) in zip(spatial, pads))
                  + (x.shape[-1],), x.dtype)
    xp[(slice(None),) + tuple(slice(lo, lo + n) for n, (lo, _) in zip(spatial, pads))] = x
    taps = [xp[(slice(None),) + sl] for sl in _tap_slices(kernel, strides, dilation, out)]
    p = np.stack(taps, axis=-2)  # (N, *O, K, C)
    if order == "channel_major":
        p = np.swapaxes(p, -1, -2)
    return p.reshape(p.shape[:-2] + (p.shape[-2] * p.shape[-1],))  # -1 fails when empty


def col2im_reference(patches, input_shape, kernel, strides, pads, dilation,
                     order="tap_major") -> np.ndarray:
    """NumPy jax_tma.col2im with the op's exact arithmetic: taps added in
    increasing order, 16-bit floats in float32 rounded once, integers wrap,
    NaN sums stored as np.nan (complex: per part)."""
    patches = np.asarray(patches)
    n, spatial, c = input_shape[0], tuple(input_shape[1:-1]), input_shape[-1]
    out = _out_spatial(spatial, kernel, strides, pads, dilation)
    k = int(np.prod(kernel))
    p = patches.reshape((n,) + out + ((c, k) if order == "channel_major" else (k, c)))
    if order == "channel_major":
        p = np.swapaxes(p, -1, -2)
    acc_dtype = np.float32 if patches.dtype.name in ("float16", "bfloat16") else patches.dtype
    acc = np.zeros((n,) + tuple(s + lo + hi for s, (lo, hi) in zip(spatial, pads)) + (c,),
                   acc_dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        for t, sl in enumerate(_tap_slices(kernel, strides, dilation, out)):
            acc[(slice(None),) + sl] += p[..., t, :].astype(acc_dtype)
    crop = acc[(slice(None),) + tuple(slice(lo, lo + s) for s, (lo, _) in zip(spatial, pads))]
    with np.errstate(over="ignore", invalid="ignore"):  # float16 sums may round to inf
        out = crop.astype(patches.dtype)
    if out.dtype.kind == "c":
        parts = out.view(np.float32 if out.dtype == np.complex64 else np.float64)
        parts[np.isnan(parts)] = np.nan
    elif out.dtype.kind != "i" and out.dtype.kind != "u":
        out[np.isnan(out)] = np.nan
    return out
