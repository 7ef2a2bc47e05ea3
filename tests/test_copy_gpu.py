"""jax_tma.copy on a CUDA GPU: every dtype and method bit-exact into
poisoned outputs, every alignment of source and destination through the raw
launch hook, the pipeline configurations, random sizes, and > 4 GiB; and the
benchmark's stream references. The raw hook and the references come from the
benchmarks' extension _jax_tma_bench (built with JAX_TMA_BENCH=ON)."""

import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_tma
from jax_tma import _ffi
from paths import run_on_path
from reference import (ALL_DTYPES, BIG_MEMORY, POISON, assert_bits_equal, into_poison,
                       random_array, seed_note, skip_unless_required)

_BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "benchmarks")
if _BENCHMARKS not in sys.path:
    sys.path.insert(0, _BENCHMARKS)
import references  # noqa: E402  (benchmarks/references.py)

pytestmark = pytest.mark.gpu
METHODS = ["auto", "tma", "simt"]


@functools.cache
def _copy_fn(method):
    return functools.partial(jax_tma.copy, method=method)


def copy_path(method: str, nbytes: int) -> str:
    """The kernel jax_tma.copy runs on a TMA GPU: auto takes SIMT at every
    size (the fastest measured on an H100 and an H200)."""
    return "copy.tma" if method == "tma" else "copy.simt"


def copy_poisoned(x: np.ndarray, method: str, device) -> jax.Array:
    """Copies `x` into a poisoned output buffer and checks that the kernel
    `method` claims ran."""
    return into_poison(_copy_fn(method), x, device, path=copy_path(method, x.nbytes))


@pytest.mark.parametrize("dtype", [d for d in ALL_DTYPES if d.itemsize * 8 >= 8
                                   and d.name not in ("int2", "uint2", "int4", "uint4",
                                                      "float4_e2m1fn")], ids=str)
@pytest.mark.parametrize("method", METHODS)
def test_every_dtype_into_poison(gpu, rng, dtype, method):
    for shape in [(), (1,), (3, 5, 7), (257, 129), (1 << 20) + 3]:
        x = random_array(rng, shape, dtype)
        assert_bits_equal(copy_poisoned(x, method, gpu), x)


@pytest.mark.parametrize("name", ["int2", "uint2", "int4", "uint4", "float4_e2m1fn"])
def test_sub_byte_dtypes(gpu, rng, name):
    if not hasattr(jnp, name):
        skip_unless_required(f"this jax has no {name}")
    x = random_array(rng, (1001,), getattr(jnp, name))
    assert_bits_equal(jax.jit(jax_tma.copy)(jax.device_put(x, gpu)), x)


@pytest.mark.parametrize("method", METHODS)
def test_random_sizes(gpu, rng, method):
    sizes = list(rng.integers(0, 4096, 20)) + list(rng.integers(4096, 50_000_000, 8))
    for n in sizes:
        x = random_array(rng, (int(n),), np.uint8)
        assert_bits_equal(copy_poisoned(x, method, gpu), x)


def test_transformations_on_gpu(gpu, rng):
    x = jax.device_put(rng.standard_normal((4, 33, 17)).astype(np.float32), gpu)
    assert_bits_equal(jax.vmap(jax_tma.copy, in_axes=1, out_axes=1)(x), np.asarray(x))
    g = jax.jit(jax.grad(lambda a: (jax_tma.copy(a) * a).sum()))(x)
    np.testing.assert_array_equal(g, 2 * np.asarray(x))


def _raw(ext, method, dst, src, nbytes, **config):
    ext.raw_copy(method, 0, dst, src, nbytes, **config)
    ext.synchronize(0)  # the hook returns at once


def _raw_case(ext, gpu, rng, method, src_off, dst_off, nbytes, **config):
    """Copies nbytes from src+src_off to dst+dst_off inside larger buffers;
    checks the bytes and that nothing around the destination changed."""
    pad = 64
    src_host = rng.integers(0, 256, nbytes + 2 * pad, dtype=np.uint8)
    src = jax.device_put(src_host, gpu)
    dst = jax.device_put(np.full(nbytes + 2 * pad, POISON, np.uint8), gpu)
    jax.block_until_ready((src, dst))
    _raw(ext, method, dst.unsafe_buffer_pointer() + dst_off, src.unsafe_buffer_pointer() + src_off,
         nbytes, **config)
    want = np.full(nbytes + 2 * pad, POISON, np.uint8)
    want[dst_off:dst_off + nbytes] = src_host[src_off:src_off + nbytes]
    got = np.asarray(dst)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (
        f"{method} src_off={src_off} dst_off={dst_off} n={nbytes}: {bad.size} bytes wrong, "
        f"first at {bad[0]} (dst region starts at {dst_off}){seed_note()}")


@pytest.mark.parametrize("method", ["tma", "simt"])
def test_every_alignment_pair(gpu, bench_ext, rng, method):
    # Same and different misalignment modulo 16, short and long copies.
    for src_off in range(0, 17, 3):
        for dst_off in range(0, 17, 3):
            for n in (0, 1, 15, 16, 17, 100, 4099, 300_001, (1 << 22) + 4099):
                _raw_case(bench_ext, gpu, rng, method, src_off, dst_off, n)
            if method == "simt":  # more 16-B vectors than one pass of the grid copies
                _raw_case(bench_ext, gpu, rng, method, src_off, dst_off, (20 << 20) + 4099)


@pytest.mark.parametrize("stages,chunk,per_cta,dynamic", [
    (2, 1024, 1, False), (3, 4096, 2, False), (8, 16384, 1, False), (6, 16384, 13, False),
    (4, 32768, 64, False), (2, 65536, 3, False),
    # dynamic: small enough that CTAs claim chunks past their first ones
    (2, 1024, 1, True), (4, 4096, 1, True), (16, 8192, 16, True)])
def test_bulk_pipeline_configs(gpu, bench_ext, rng, stages, chunk, per_cta, dynamic):
    for n in (16, 1024 * 1024 + 48, 7_000_016, 33_554_432 + 5):
        _raw_case(bench_ext, gpu, rng, "tma", 5, 5, n, chunk_bytes=chunk, stages=stages,
                  chunks_per_cta=per_cta, dynamic=dynamic)


def test_dynamic_schedule_call_sites(gpu, rng):
    # From copy.dynamic_bulk_min_bytes up a call site's bulk copy claims
    # chunks from its own work counter, which the last CTA zeroes: running a
    # site again, and two sites in one program, must stay exact.
    n = _ffi.rules()["copy.dynamic_bulk_min_bytes"] + 4099
    for method in ("tma", "auto"):  # auto: the SIMT kernel's one-vector shape
        for _ in range(2):
            x = random_array(rng, (n,), np.uint8)
            assert_bits_equal(copy_poisoned(x, method, gpu), x)
    a, b = random_array(rng, (n,), np.uint8), random_array(rng, (n + 16,), np.uint8)
    both = jax.jit(lambda p, q: (jax_tma.copy(p, method="tma"), jax_tma.copy(q, method="tma")))
    for _ in range(2):
        ya, yb = both(jax.device_put(a, gpu), jax.device_put(b, gpu))
        assert_bits_equal(ya, a)
        assert_bits_equal(yb, b)


def test_raw_hook_rejects_bad_config(gpu, bench_ext):
    x = jax.device_put(np.zeros(64, np.uint8), gpu)
    p = x.unsafe_buffer_pointer()
    with pytest.raises(Exception, match=r"bad pipeline config: chunk_bytes=100 "):
        _raw(bench_ext, "tma", p, p, 32, chunk_bytes=100)
    with pytest.raises(Exception, match=r"stages=1 \(2\.\.16\)"):
        _raw(bench_ext, "tma", p, p, 32, stages=1)


@BIG_MEMORY
@pytest.mark.parametrize("method", ["tma", "simt"])
def test_over_4_gib_and_2_pow_31_elements(gpu, rng, method):
    # 2^31 + 7 uint16 elements: more than 2^31 elements and more than 4 GiB.
    n = (1 << 31) + 7
    x = jax.random.bits(jax.random.key(int(rng.integers(2**31))), (n,), jnp.uint16)
    x = jax.device_put(x, gpu)
    y = run_on_path(f"copy.{method}", jax.jit(functools.partial(jax_tma.copy, method=method)), x)
    assert bool(jax.jit(lambda a, b: jnp.array_equal(a, b))(x, y))
    # and the very end, read back on the host
    np.testing.assert_array_equal(np.asarray(y[-4096:]), np.asarray(x[-4096:]))
    del x, y


def test_build_info_sees_a_tma_gpu(gpu):
    info = jax_tma.build_info()
    assert info["cuda_compiled"]
    assert info["gpus"] and all(g["tma"] for g in info["gpus"]), info
    # An H100 or H200 runs its own measured plans (the machines these tests
    # run on); any GPU runs those of a measured one.
    measured = ("NVIDIA H100 80GB HBM3", "NVIDIA H200")
    for g in info["gpus"]:
        assert g["plans_from"] in measured, g
        if g["name"] in measured:
            assert g["plans_from"] == g["name"], g


def test_bench_stream_references(gpu, bench_ext, rng):
    # The copy bench's serial bound times these: the read stream must read
    # every byte (its checksum is the XOR of all 16-B vectors) and the write
    # stream must write every byte.
    references.register()
    for n in (0, 16, 4096 + 48, (3 << 20) + 16):
        x = random_array(rng, (n,), np.uint8)
        want = np.bitwise_xor.reduce(x.view(np.uint32).reshape(-1, 4), axis=0) if n else \
            np.zeros(4, np.uint32)
        np.testing.assert_array_equal(
            np.asarray(references.read_stream(jax.device_put(x, gpu))), want)
        y = references.ffi_reference("jax_tma_bench_write")(jax.device_put(x, gpu))
        assert (np.asarray(y) == 0x5A).all()


def test_bench_references_reject_bad_input(gpu, bench_ext):
    references.register()
    odd = jax.device_put(np.zeros(20, np.uint8), gpu)
    with pytest.raises(Exception, match=r"jax_tma_bench_seed_copy: addresses and size must be "
                                        r"multiples of 16 B"):
        references.ffi_reference("jax_tma_bench_seed_copy")(odd).block_until_ready()
    with pytest.raises(Exception, match=r"jax_tma_bench_read: address and size must be "
                                        r"multiples of 16 B"):
        references.read_stream(odd).block_until_ready()
    x = jax.device_put(np.zeros(32, np.uint8), gpu)
    for shape in ((3,), (4, 1)):
        with pytest.raises(Exception, match=r"jax_tma_bench_read: the checksum is a \(4,\) uint32 array"):
            jax.ffi.ffi_call("jax_tma_bench_read",
                             jax.ShapeDtypeStruct(shape, jnp.uint32))(x).block_until_ready()
    with pytest.raises(Exception, match=r"jax_tma_bench_write: y must have the size of x"):
        jax.ffi.ffi_call("jax_tma_bench_write",
                         jax.ShapeDtypeStruct((16,), jnp.uint8))(x).block_until_ready()
