"""The in-JAX peer: the simplest Pallas kernel a JAX user would write instead
of each jax_tma op the benchmarks time (copy, gather of pages and rows,
in-place scatter set, broadcast), each a few lines, untuned: a block of
BLOCK_BYTES (or one slab, where a slab is larger) per program, every block
dimension a power of two (Triton's tensors must be), Triton's default warps
and stages. On a GPU pallas_call lowers them through Triton (the default
Pallas GPU backend of jax 0.10 to 0.12); on the CPU (a smoke run) they run
in Pallas's interpreter.
"""

from __future__ import annotations

import math

import jax
from jax.experimental import pallas as pl

# What one program moves (its block), where a slab does not exceed it.
BLOCK_BYTES = 16 * 1024


def describe(kernel: str) -> str:
    """What `kernel` (copy, gather, scatter, broadcast) is, for a result file."""
    kib = f"{BLOCK_BYTES // 1024} KiB"
    rows = f"a block of rows per program ({kib} of rows, or one row where a row is larger)"
    return f"`pallas_kernels.{kernel}` (`benchmarks/pallas_kernels.py`): " + {
        "copy": f"a block of {kib} per program, `o_ref[...] = x_ref[...]`",
        "gather": f"{rows}, `o_ref[...] = x_ref[idx_ref[...], :]`",
        "scatter": f"{rows}, `o_ref[idx_ref[...], :] = u_ref[...]`, the table aliased to the "
                   f"output (in place)",
        "broadcast": f"a block of {kib} per program, read once and written to each of its n "
                     f"places, `o_ref[...] = x_ref[...]`",
    }[kernel] + "; on a GPU through Triton, with its default warps and stages"


def _interpret() -> bool:
    return jax.default_backend() == "cpu"


def _block(n: int, item_bytes: int) -> int:
    """Items of a block along a dim of n: the largest power of two that
    divides n and whose items of `item_bytes` fit BLOCK_BYTES (at least 1)."""
    fits = max(1, BLOCK_BYTES // item_bytes)
    return math.gcd(n, 1 << (fits.bit_length() - 1))


def _move(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def copy(x: jax.Array) -> jax.Array:
    """x, a block per program."""
    flat = x.reshape(-1)
    b = _block(flat.size, x.dtype.itemsize)
    spec = pl.BlockSpec((b,), lambda i: (i,))
    return pl.pallas_call(_move, out_shape=jax.ShapeDtypeStruct(flat.shape, x.dtype),
                          grid=(flat.size // b,), in_specs=[spec], out_specs=spec,
                          interpret=_interpret())(flat).reshape(x.shape)


def gather(x: jax.Array, idx: jax.Array) -> jax.Array:
    """x[idx] for a (rows, slab) table: each program loads the indices of
    its block of rows and gathers them (one row where a row fills a block)."""
    r = _block(idx.size, x.shape[1] * x.dtype.itemsize)

    def kernel(idx_ref, x_ref, o_ref):
        o_ref[...] = x_ref[idx_ref[...], :]

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((idx.size, x.shape[1]), x.dtype),
        grid=(idx.size // r,), in_specs=[pl.BlockSpec((r,), lambda i: (i,)), pl.BlockSpec()],
        out_specs=pl.BlockSpec((r, x.shape[1]), lambda i: (i, 0)),
        interpret=_interpret())(idx, x)


def scatter(x: jax.Array, idx: jax.Array, u: jax.Array) -> jax.Array:
    """x with rows idx set to u, in place (x aliased to the output: donate
    it), a block of rows per program as gather's."""
    r = _block(idx.size, x.shape[1] * x.dtype.itemsize)

    def kernel(idx_ref, u_ref, x_ref, o_ref):
        o_ref[idx_ref[...], :] = u_ref[...]

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(idx.size // r,),
        in_specs=[pl.BlockSpec((r,), lambda i: (i,)),
                  pl.BlockSpec((r, x.shape[1]), lambda i: (i, 0)), pl.BlockSpec()],
        out_specs=pl.BlockSpec(), input_output_aliases={2: 0}, interpret=_interpret())(idx, u, x)


def broadcast(x: jax.Array, n: int, axis: int) -> jax.Array:
    """n replicas of x along a new dim `axis`: x as (outer, inner) around
    it, each block copied to its n places, the replicas innermost."""
    outer, inner = math.prod(x.shape[:axis]), math.prod(x.shape[axis:])
    c = _block(inner, x.dtype.itemsize)
    r = _block(outer, x.dtype.itemsize * c)
    out = pl.pallas_call(
        _move, out_shape=jax.ShapeDtypeStruct((outer, n * inner), x.dtype),
        grid=(outer // r, inner // c, n), in_specs=[pl.BlockSpec((r, c), lambda i, j, k: (i, j))],
        out_specs=pl.BlockSpec((r, c), lambda i, j, k: (i, k * (inner // c) + j)),
        interpret=_interpret())(x.reshape(outer, inner))
    return out.reshape(*x.shape[:axis], n, *x.shape[axis:])
