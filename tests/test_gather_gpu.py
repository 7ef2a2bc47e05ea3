"""jax_tma.gather / jax_tma.scatter on a CUDA GPU: every method (tma, simt,
auto) bit-exact against the CPU handler, gathered into poisoned outputs;
slab sizes across the bulk path's tiling (rows per stage, pieces of large
slabs); scatter in place; duplicates (set: one of the updates; add: integers
exact, deterministic=True identical to the CPU); vmap and grad; > 4 GiB."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_tma
from paths import paths_ran, run_on_path
from reference import (ALL_DTYPES, BIG_MEMORY, SUB_BYTE_BITS, assert_bits_equal, cpu_device,
                       random_array, skip_unless_required)

pytestmark = pytest.mark.gpu
METHODS = ["auto", "tma", "simt"]
POISON = 0xA5
BYTE_DTYPES = [d for d in ALL_DTYPES if d.name not in SUB_BYTE_BITS]
# (table rows, slab shape): slabs of 16 B to 96 KiB (bulk units of 64 rows,
# of a few rows, one row, and pieces), and off the 16-byte grid.
SLABS = [(300, (4,)), (97, (128,)), (64, (2048,)), (20, (8192,)), (9, (24 * 1024 + 4,)),
         (50, (3,)), (40, (5, 7))]


def slab_cases(dtype):
    """(method, rows, slab) for every slab, leaving out method="tma" where
    the slab is off the 16-byte grid (that ValueError has its CPU test)."""
    return [(m, rows, slab) for rows, slab in SLABS for m in METHODS
            if m != "tma" or tma_ok(slab, dtype)]


def on(device, a):
    return jax.device_put(a, device)


def tma_ok(shape, dtype) -> bool:
    return int(np.prod(shape)) * np.dtype(dtype).itemsize % 16 == 0


@functools.cache
def _gather_into_donated(method, fill):
    # A donated poisoned buffer of the output's shape becomes the output:
    # any element the kernel misses stays poisoned.
    return jax.jit(lambda x, i, poison: jax_tma.gather(x, i, fill=fill, method=method),
                   donate_argnums=2, keep_unused=True)


def gather_poisoned(x, idx, method, device, fill=0):
    """The gather written straight into a donated buffer of POISON bytes;
    asserts that XLA did write it there (the alias in the compiled program,
    and the output's address), as reference.into_poison does."""
    f = _gather_into_donated(method, fill)
    out = jax.eval_shape(lambda a, i: jax_tma.gather(a, i), x, idx)
    raw = np.full(int(np.prod(out.shape)) * out.dtype.itemsize, POISON, np.uint8)
    poison = on(device, raw.view(out.dtype).reshape(out.shape))
    xd, idxd = on(device, x), on(device, idx)
    if not raw.size:
        return f(xd, idxd, poison)
    hlo = f.lower(xd, idxd, poison).compile().as_text()
    assert "input_output_alias" in hlo and not re.search(r"\bcopy(-start)?\(", hlo), \
        "XLA does not write the gather straight into the donated buffer"
    ptr = poison.unsafe_buffer_pointer()
    y = f(xd, idxd, poison)
    assert y.unsafe_buffer_pointer() == ptr, "XLA did not reuse the poisoned buffer"
    return y


def cpu(f, *args):
    return f(*[on(cpu_device(), a) for a in args])


@pytest.mark.parametrize("method,rows,slab", slab_cases(np.float32), ids=str)
def test_gather_slab_sizes_into_poison(gpu, rng, method, rows, slab):
    x = random_array(rng, (rows,) + slab, np.float32)
    idx = rng.integers(-rows - 3, rows + 3, (37,)).astype(np.int32)
    want = cpu(functools.partial(jax_tma.gather, fill=np.float32(-2.5)), x, idx)
    assert_bits_equal(gather_poisoned(x, idx, method, gpu, fill=np.float32(-2.5)), want)


# 4 MiB moved: more vectors than one resident wave has threads, so that the
# SIMT path takes its tiled kernel for slabs of narrower vectors than 16 B
# (the cases above are small calls: flat in every vector).
LARGE_BYTES = 4 << 20


@pytest.mark.parametrize("method,rows,slab", slab_cases(np.float32), ids=str)
def test_gather_large_calls_into_poison(gpu, rng, method, rows, slab):
    x = random_array(rng, (rows,) + slab, np.float32)
    count = LARGE_BYTES // (int(np.prod(slab)) * 4)
    idx = rng.integers(-rows - 3, rows + 3, (count,)).astype(np.int32)
    want = cpu(functools.partial(jax_tma.gather, fill=np.float32(-2.5)), x, idx)
    assert_bits_equal(gather_poisoned(x, idx, method, gpu, fill=np.float32(-2.5)), want)


@pytest.mark.parametrize("method,rows,slab", slab_cases(np.int16), ids=str)
def test_scatter_set_large_calls(gpu, rng, method, rows, slab):
    count = LARGE_BYTES // (int(np.prod(slab)) * 2)
    x = random_array(rng, (count + 5,) + slab, np.int16)
    idx = rng.permutation(count + 5)[:count].astype(np.int32)  # unique rows
    u = random_array(rng, idx.shape + slab, np.int16)
    want = cpu(functools.partial(jax_tma.scatter, method=method), x, idx, u)
    f = jax.jit(functools.partial(jax_tma.scatter, method=method), donate_argnums=0)
    assert_bits_equal(f(on(gpu, x), on(gpu, idx), on(gpu, u)), want)


@pytest.mark.parametrize("dtype", BYTE_DTYPES, ids=str)
@pytest.mark.parametrize("method", METHODS)
def test_gather_every_dtype(gpu, rng, dtype, method):
    x = random_array(rng, (33, 4, 8), dtype)
    idx = rng.integers(-36, 36, (5, 7)).astype(np.int64)
    fill = np.asarray(random_array(rng, (), dtype)).item()
    for axis in (0, 1):
        if method == "tma" and axis == 1 and not tma_ok((8,), dtype):
            continue
        f = functools.partial(jax_tma.gather, axis=axis, fill=fill, method=method)
        assert_bits_equal(jax.jit(f)(on(gpu, x), on(gpu, idx)), cpu(jax.jit(f), x, idx))


# One table of 16-byte slabs without batch dims takes the flat kernel's
# instantiation for its index type (32-bit rows, a narrow call); each index
# type at its extremes, wrapped and out of range, against the CPU handler.
# Set: every update the same row, so that duplicates leave the same bits.
@pytest.mark.parametrize("op", ["gather", "set", "add"])
@pytest.mark.parametrize("idx_dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8,
                                       np.uint16, np.uint32, np.uint64], ids=str)
def test_every_index_type_at_its_extremes(gpu, rng, idx_dtype, op):
    n = 100
    info = np.iinfo(idx_dtype)
    values = [v for v in (0, n - 1, n, n + 1, 1, 50, -1, -n, -n - 1, info.max, info.min,
                          info.max - 1, info.min + 1) if info.min <= v <= info.max]
    idx = np.array(values, idx_dtype)
    x = rng.integers(-4, 5, (n, 4)).astype(np.float32)  # small integers: adds are exact
    u = np.broadcast_to(rng.integers(-4, 5, (1, 4)), (idx.size, 4)) if op == "set" else \
        rng.integers(-4, 5, (idx.size, 4))
    if op == "gather":
        f = jax.jit(functools.partial(jax_tma.gather, fill=7))
        args = (x, idx)
    else:
        f = jax.jit(functools.partial(jax_tma.scatter, mode=op))
        args = (x, idx, u.astype(np.float32))
    with paths_ran() as ran:
        got = jax.block_until_ready(f(*[on(gpu, a) for a in args]))
    assert ran == {("gather" if op == "gather" else "scatter") + ".simt": 1}, ran
    assert_bits_equal(got, cpu(f, *args))


def test_gather_batched_and_outer_dims(gpu, rng):
    x = random_array(rng, (3, 2, 40, 64), jnp.bfloat16)
    idx = rng.integers(-42, 42, (3, 9)).astype(np.int32)
    for method in METHODS:
        f = jax.jit(jax.vmap(functools.partial(jax_tma.gather, axis=1, method=method)))
        assert_bits_equal(f(on(gpu, x), on(gpu, idx)), cpu(f, x, idx))


@pytest.mark.parametrize("method,rows,slab", slab_cases(np.int16), ids=str)
def test_scatter_set_unique_matches_cpu_in_place(gpu, rng, method, rows, slab):
    x = random_array(rng, (rows,) + slab, np.int16)
    # unique rows, half of them as negative indices, and two past the ends
    idx = rng.permutation(rows)[: min(rows, 30)]
    idx = np.where(rng.integers(0, 2, idx.shape) == 1, idx - rows, idx)
    idx = np.concatenate([idx, [rows, -rows - 1]]).astype(np.int32)
    u = random_array(rng, idx.shape + slab, np.int16)
    f = jax.jit(functools.partial(jax_tma.scatter, method=method), donate_argnums=0)
    want = cpu(functools.partial(jax_tma.scatter, method=method), x, idx, u)
    xd = on(gpu, x)
    text = f.lower(xd, on(gpu, idx), on(gpu, u)).compile().as_text()
    assert not re.search(r"\bcopy(-start)?\(", text), "a copy of the donated x"
    ptr = xd.unsafe_buffer_pointer()
    y = f(xd, on(gpu, idx), on(gpu, u))
    assert y.unsafe_buffer_pointer() == ptr
    assert_bits_equal(y, want)


@pytest.mark.parametrize("method", ["auto", "tma", "simt"])
def test_scatter_set_duplicates_leave_one_update_per_element(gpu, rng, method):
    x = random_array(rng, (8, 256), np.uint32)
    idx = rng.integers(0, 8, (64,)).astype(np.int32)
    u = random_array(rng, (64, 256), np.uint32)
    y = np.asarray(jax.jit(functools.partial(jax_tma.scatter, method=method))(
        on(gpu, x), on(gpu, idx), on(gpu, u)))
    for row in range(8):
        cands = u[idx == row]
        if not cands.size:
            assert_bits_equal(y[row], x[row])
            continue
        assert ((y[row][None] == cands).any(axis=0)).all(), f"row {row}: not one of its updates"


# No bulk add for 8/16-bit integers: method="tma" is left out there (the
# error has its CPU test).
@pytest.mark.parametrize("method,dtype", [(m, d) for d in (np.int8, np.uint16, np.int32, np.uint64)
                                          for m in METHODS
                                          if m != "tma" or np.dtype(d).itemsize >= 4], ids=str)
def test_scatter_add_integers_exact(gpu, rng, dtype, method):
    cols = 64 if np.dtype(dtype).itemsize >= 4 else 48
    x = random_array(rng, (16, cols), dtype)
    idx = rng.integers(-18, 18, (300,)).astype(np.int32)
    u = random_array(rng, (300, cols), dtype)
    f = jax.jit(functools.partial(jax_tma.scatter, mode="add", method=method))
    assert_bits_equal(f(on(gpu, x), on(gpu, idx), on(gpu, u)), cpu(f, x, idx, u))


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, np.float32, np.float64,
                                   np.complex64, np.complex128], ids=str)
@pytest.mark.parametrize("method", ["auto", "tma", "simt"])
def test_scatter_add_floats_exact_on_small_integers(gpu, rng, dtype, method):
    # Small integer values: every partial sum (|s| < 128) is exact in every
    # format, so any summation order gives the CPU's bits.
    x = rng.integers(-4, 5, (16, 64)).astype(dtype)
    idx = rng.integers(-18, 18, (200,)).astype(np.int32)
    u = rng.integers(-4, 5, (200, 64)).astype(dtype)
    f = jax.jit(functools.partial(jax_tma.scatter, mode="add", method=method))
    assert_bits_equal(f(on(gpu, x), on(gpu, idx), on(gpu, u)), cpu(f, x, idx, u))


@pytest.mark.parametrize("method", METHODS)
def test_scatter_add_f32_close_to_cpu(gpu, rng, method):
    x = rng.standard_normal((16, 64)).astype(np.float32)
    idx = rng.integers(-18, 18, (200,)).astype(np.int32)
    u = rng.standard_normal((200, 64)).astype(np.float32)
    f = jax.jit(functools.partial(jax_tma.scatter, mode="add", method=method))
    np.testing.assert_allclose(f(on(gpu, x), on(gpu, idx), on(gpu, u)), cpu(f, x, idx, u),
                               rtol=1e-5, atol=1e-5)


# float8 has no add (mode="add" cannot sum it: its CPU test), so only set.
@pytest.mark.parametrize("dtype,mode", [
    (d, m) for d in (jnp.float16, jnp.bfloat16, np.float32, np.float64, np.complex64, np.int8,
                     jnp.float8_e4m3fn)
    for m in ("set", "add") if not (m == "add" and np.dtype(d).name.startswith("float8"))],
    ids=str)
def test_deterministic_scatter_is_identical_to_cpu(gpu, rng, dtype, mode):
    x = random_array(rng, (2, 12, 40), dtype, finite=True)
    idx = rng.integers(-14, 14, (2, 500)).astype(np.int32)
    u = random_array(rng, (2, 500, 40), dtype, finite=True)
    f = jax.jit(jax.vmap(functools.partial(jax_tma.scatter, mode=mode, deterministic=True)))
    got = f(on(gpu, x), on(gpu, idx), on(gpu, u))
    assert_bits_equal(got, cpu(f, x, idx, u))
    assert_bits_equal(f(on(gpu, x), on(gpu, idx), on(gpu, u)), got)  # and run to run


def test_grad_on_gpu_matches_cpu(gpu, rng):
    x = rng.standard_normal((50, 32)).astype(np.float32)
    u = rng.standard_normal((20, 32)).astype(np.float32)
    idx = rng.integers(-52, 52, (20,)).astype(np.int32)

    def loss(a, v):
        y = jax_tma.scatter(a, idx, v)
        return (jax_tma.gather(y, idx[::-1]) ** 2).sum() + (y * 3).sum()

    g = jax.jit(jax.grad(loss, argnums=(0, 1)))
    for got, want in zip(g(on(gpu, x), on(gpu, u)), cpu(g, x, u)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@BIG_MEMORY
def test_over_4_gib_table(gpu, rng):
    # 4.5 GiB of 32 KiB pages: row offsets past 2^32 bytes and 2^31 elements.
    page = 32 * 1024
    rows = (9 << 30) // (2 * page)
    free = gpu.memory_stats().get("bytes_limit", 0) - gpu.memory_stats().get("bytes_in_use", 0)
    if free < 2 * rows * page + (1 << 30):
        skip_unless_required(f"needs {2 * rows * page / 2**30:.1f} GiB of free GPU memory")
    table = jax.jit(lambda: jnp.broadcast_to(jnp.arange(rows, dtype=jnp.uint32)[:, None],
                                             (rows, page // 4)))()
    idx = np.array([rows - 1, 0, rows // 2, -1, rows, 12345], np.int64)
    for method in ("tma", "simt"):
        y = np.asarray(jax.jit(functools.partial(jax_tma.gather, method=method))(table, idx))
        want = np.array([rows - 1, 0, rows // 2, rows - 1, 0, 12345], np.uint32)
        np.testing.assert_array_equal(y[:, ::97], np.broadcast_to(want[:, None], y[:, ::97].shape)
                                      * (np.arange(6) != 4)[:, None])
    upd = jnp.full((3, page // 4), 7, jnp.uint32)
    y = jax.jit(functools.partial(jax_tma.scatter, mode="add"), donate_argnums=0)(
        table, np.array([rows - 1, -1, 5]), upd)
    np.testing.assert_array_equal(np.asarray(y[-1, :8]), rows - 1 + 14)
    np.testing.assert_array_equal(np.asarray(y[5, :8]), 5 + 7)
    del y


def test_raw_handler_rejects_tma_for_odd_slabs(gpu):
    call = jax.ffi.ffi_call("jax_tma_gather", jax.ShapeDtypeStruct((2, 3), np.float32))
    f = jax.jit(lambda a, i: call(i, a, axis=np.int64(0), batch=np.int64(0),
                                  fill=np.zeros(2, np.int64), method="tma"))
    with pytest.raises(Exception, match=r"jax_tma\.gather: method='tma' cannot move this call: "
                                        r"slabs of 12 B are not a multiple of 16 B"):
        jax.block_until_ready(f(on(gpu, np.ones((4, 3), np.float32)), on(gpu, np.array([0, 1]))))


# "auto" (kAutoSimtMaxSlabBytes in ffi/gather/gather_plan.h) takes the SIMT
# kernel for gathers and sets of slabs of at most 4 KiB, for gathers of at
# most 64 MiB and for calls of at most a vector for each thread of a
# resident wave (on a 132-SM GPU, 135,168 vectors of 16 B); the bulk path
# for larger slabs in larger calls. Adds of f32, f16 and bf16 in 16-byte
# vectors take the SIMT kernel's vector reductions, other adds the bulk
# reduction where it has their type.
_PAGES = (40, 2048, 8200)  # table rows, f32 elements a slab (8 KiB), indices: 64.1 MiB
_SETS = (40, 2048, 1024)   # 8 KiB slabs, 8 MiB: more vectors than a wave
_SMALL = (40, 2048, 9)     # 8 KiB slabs, 72 KiB
_WIDE = (40, 128, 16384)   # 512 B slabs, 8 MiB


@pytest.mark.parametrize("path, shape, call", [
    ("gather.tma", _PAGES, lambda x, i, u: jax_tma.gather(x, i)),
    ("gather.simt", _SETS, lambda x, i, u: jax_tma.gather(x, i)),
    ("gather.simt", _WIDE, lambda x, i, u: jax_tma.gather(x, i)),
    ("gather.simt", _WIDE, lambda x, i, u: jax_tma.gather(x[:, :3], i)),       # 12 B slabs
    ("gather.simt", _PAGES, lambda x, i, u: jax_tma.gather(x, i, method="simt")),
    ("scatter.tma", _SETS, lambda x, i, u: jax_tma.scatter(x, i, u)),
    ("scatter.simt", _SMALL, lambda x, i, u: jax_tma.scatter(x, i, u)),
    ("scatter.simt", _WIDE, lambda x, i, u: jax_tma.scatter(x, i, u)),
    ("scatter.simt", _WIDE, lambda x, i, u: jax_tma.scatter(x, i, u, mode="add")),
    ("scatter.simt", _WIDE, lambda x, i, u: jax_tma.scatter(x.astype(jnp.bfloat16), i,
                                                            u.astype(jnp.bfloat16), mode="add")),
    ("scatter.tma", _WIDE, lambda x, i, u: jax_tma.scatter(x.astype(jnp.int32), i,
                                                            u.astype(jnp.int32), mode="add")),
    ("scatter.simt", _WIDE, lambda x, i, u: jax_tma.scatter(x.astype(jnp.int8), i,
                                                            u.astype(jnp.int8), mode="add")),
    ("scatter.ordered", _WIDE, lambda x, i, u: jax_tma.scatter(x, i, u, mode="add",
                                                               deterministic=True)),
], ids=["gather-8K-64M", "gather-8K-8M", "gather-512B", "gather-12B", "gather-simt",
        "set-8K", "set-8K-small", "set-512B", "add-f32", "add-bf16", "add-int32", "add-int8",
        "deterministic"])
def test_auto_takes_the_path_it_should(gpu, rng, path, shape, call):
    rows, width, count = shape
    x = on(gpu, rng.standard_normal((rows, width)).astype(np.float32))
    i = on(gpu, rng.integers(-rows - 2, rows + 2, (count,)).astype(np.int32))
    u = on(gpu, rng.standard_normal((count, width)).astype(np.float32))
    run_on_path(path, jax.jit(call), x, i, u)  # a fresh executable: its handler runs


# Tables sharing one index array: the tables whose geometry and plan agree
# (FusesWith in ffi/gather/gather_plan.h) move in one launch, a grid row
# each; the others in a launch of their own. Two f32 pools of the same
# pages and an int32 table of 16-byte rows: two launches, every table bit-exact against the
# CPU handler.
# deterministic=True with method='tma' is an error (its CPU test): not here.
@pytest.mark.parametrize("op,method", [(op, m) for op in ("gather", "set", "add", "deterministic")
                                       for m in METHODS
                                       if not (op == "deterministic" and m == "tma")], ids=str)
def test_tables_sharing_indices_move_in_one_launch(gpu, rng, method, op):
    rows, count = 300, 200
    shapes = [((rows, 4, 64), np.float32), ((rows, 4, 64), np.float32), ((rows, 4), np.int32)]
    # Small integers: float adds are exact in any order.
    tables = [rng.integers(-4, 5, s).astype(d) for s, d in shapes]
    idx = (rng.permutation(rows)[:count] if op == "set" else
           rng.integers(-rows - 2, rows + 2, (count,))).astype(np.int32)
    updates = [rng.integers(-4, 5, (count,) + s[1:]).astype(d) for s, d in shapes]
    if op == "gather":
        f = jax.jit(functools.partial(jax_tma.gather, fill=3, method=method))
        args = (tables, idx)
    else:
        f = jax.jit(functools.partial(jax_tma.scatter, mode="set" if op == "set" else "add",
                                      deterministic=op == "deterministic", method=method))
        args = (tables, idx, updates)
    with paths_ran() as ran:
        got = jax.block_until_ready(f(*jax.tree.map(functools.partial(on, gpu), args)))
    want = f(*jax.tree.map(functools.partial(on, cpu_device()), args))
    name = "gather." if op == "gather" else "scatter."
    assert sum(n for k, n in ran.items() if k.startswith(name)) == 2, ran
    assert len(got) == 3
    for g, w in zip(got, want):
        assert_bits_equal(g, w)
