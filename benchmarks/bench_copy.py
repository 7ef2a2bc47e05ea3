"""The copy benchmark: every jax_tma.copy method against XLA's copy, the
simplest Pallas copy, the seed-style TMA kernel and cudaMemcpyAsync, in two
L2 regimes, with the serial read/write bound from 256 MiB up and chained
tiny copies.

    python benchmarks/run.py copy [--out-dir DIR] [--sizes-mib 1 4 ...]
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jax_tma
import pallas_kernels
from harness import MIB, Benchmark, Session, rotate_all
from references import xor_checksum

OP = "copy"
BYTES = ("read + write: a copy of n bytes counts 2n; the read-only and write-only streams of "
         "the serial bound count their one direction (n)")
# "bulk" is method="tma" (its name in every result file, from before the rename).
CASES = ("auto", "bulk", "simt", "seed_tma", "xla_copy", "pallas", "memcpy")
# The cases whose output, where it differs, is recorded rather than failing
# the benchmark (harness's `comparator`): neither jax_tma's nor a reference.
COMPARATORS = ("pallas",)
# Copies move bytes, jax_tma's and XLA's alike (XLA's copy is a memcpy
# whatever the element type): the sizes are timed on uint32 arrays, and one
# size on bfloat16 too, which shows whether the element type matters.
FULL = {"sizes": [m * MIB for m in (1, 4, 16, 32, 48, 64, 256, 1024, 4096)],
        "dtype_sizes": [(256 * MIB, "bfloat16")],
        # Each size's inputs (at most 64) rotate through this many bytes, so
        # that calls of 1 MiB (64 MiB of inputs) and up do not find their
        # input in L2 (50 MiB on H100).
        "rotate_bytes": 256 * MIB,
        # Written ahead of each call in the "after a write" regime: more than
        # L2 holds, so the copy starts with L2 full of another buffer's dirty
        # lines.
        "dirty_bytes": 192 * MIB,
        # From this size up the serial bound is measured too.
        "bound_min_bytes": 256 * MIB,
        "chain_ops": 100}
SMOKE = {"sizes": [64 << 10, 256 << 10], "dtype_sizes": [(64 << 10, "bfloat16")],
         "rotate_bytes": 1 * MIB, "dirty_bytes": 1 * MIB,
         "bound_min_bytes": 256 << 10, "chain_ops": 4}


def _rounds(s: Session, nbytes: int) -> int:
    # Small copies cost little: more rounds there steady their medians.
    if s.smoke:
        return 2
    return 16 if nbytes <= 64 * MIB else 8 if nbytes <= 256 * MIB else 3


def _inputs(key: jax.Array, nbytes: int, dtype: str, count: int) -> list[tuple[jax.Array]]:
    """`count` arrays of nbytes random bits each, as `dtype`; bfloat16 ones
    finite (an exponent of all ones loses its top bit), so that XLA's copy
    is checked bit for bit whatever it does with NaN payloads."""
    dtype = jnp.dtype(dtype)
    width = {2: jnp.uint16, 4: jnp.uint32}[dtype.itemsize]
    out = []
    for k in jax.random.split(key, count):
        bits = jax.random.bits(k, (nbytes // dtype.itemsize,), width)
        if dtype == jnp.bfloat16:
            exp = np.uint16(0x7F80)
            bits = jnp.where((bits & exp) == exp, bits & np.uint16(0xBFFF), bits)
        out.append((jax.lax.bitcast_convert_type(bits, dtype),))
    return out


def _rates(times: dict[str, dict[str, float]], nbytes: int) -> dict[str, dict[str, float]]:
    """Each case's times with TB/s and ratios to memcpy and XLA, by span."""
    span = {name: t["span_us"] for name, t in times.items()}
    return {name: {**t, "tbps": 2 * nbytes / span[name] / 1e6,
                   "vs_memcpy": span["memcpy"] / span[name],
                   "vs_xla": span["xla_copy"] / span[name]}
            for name, t in times.items()}


def bench_copy(s: Session, sizes: Sequence[int] | None = None) -> dict[str, Any]:
    """Every copy case at each size (bytes), in two L2 regimes: `repeat`
    (the cases called again and again, so L2 holds a previous output) and
    `after_write` (each call preceded by an unrelated write larger than L2,
    as in a program where the copy follows other work). From
    bound_min_bytes up, the serial bound: no copy of n bytes takes less than
    t_read + t_write of a read-only and a write-only stream of them."""
    p = SMOKE if s.smoke else FULL
    refs = s.refs
    fns = {"auto": jax.jit(jax_tma.copy),
           "bulk": jax.jit(functools.partial(jax_tma.copy, method="tma")),
           "simt": jax.jit(functools.partial(jax_tma.copy, method="simt")),
           "seed_tma": refs.seed_copy, "xla_copy": jax.jit(jnp.copy),
           "pallas": jax.jit(pallas_kernels.copy), "memcpy": refs.memcpy}
    dirty = jax.jit(lambda: jnp.full((p["dirty_bytes"] // 4,), 7, jnp.uint32))
    rows = []
    runs = [(n, "uint32") for n in sizes] if sizes else \
        [(n, "uint32") for n in p["sizes"]] + list(p["dtype_sizes"])
    for nbytes, dtype in runs:
        copies = max(1, min(64, p["rotate_bytes"] // nbytes))
        inputs = _inputs(jax.random.key(nbytes // 1024), nbytes, dtype, copies)
        x = inputs[0][0]
        for name, fn in fns.items():
            s.check(f"{name} {nbytes} B {dtype}", fn(x), x, comparator=name in COMPARATORS)
        cases = rotate_all(fns, inputs)
        rounds = _rounds(s, nbytes)
        row: dict[str, Any] = {"bytes": nbytes, "dtype": dtype, "inputs": copies}
        for regime, before in (("repeat", None), ("after_write", dirty)):
            # Fewer calls a wall-clock sample where their outputs would
            # crowd memory (a sample's outputs are all alive at once).
            timed = s.time(cases, rounds, rep=4, before=before,
                           before_name=f"a {p['dirty_bytes']} B write",
                           wall_calls=max(2, min(20, (8 << 30) // nbytes)))
            row[regime] = _rates(timed["cases"], nbytes)
            row[f"{regime}_protocol"] = timed["protocol"]
        if nbytes >= p["bound_min_bytes"] and dtype == "uint32":
            s.check(f"read stream {nbytes} B", refs.read_stream(x), jax.jit(xor_checksum)(x))
            s.check(f"write stream {nbytes} B", refs.write_stream(x),
                    jnp.full_like(x, 0x5A5A5A5A))
            streams = s.time(rotate_all({"read": refs.read_stream, "write": refs.write_stream},
                                        inputs), rounds, rep=4)
            t_read, t_write = (streams["cases"][k]["span_us"] for k in ("read", "write"))
            bound = 2 * nbytes / (t_read + t_write) / 1e6
            row["serial_bound"] = {
                "read_tbps": nbytes / t_read / 1e6, "write_tbps": nbytes / t_write / 1e6,
                "copy_tbps": bound, "protocol": streams["protocol"],
                **{f"{name}_fraction": row["repeat"][name]["tbps"] / bound
                   for name in ("bulk", "seed_tma", "memcpy")}}
        rows.append(row)
        del inputs, x, cases
        s.log(f"copy {nbytes / MIB:g} MiB {dtype}: " + ", ".join(
            f"{name} {row['repeat'][name]['tbps']:.3f} TB/s" for name in CASES))

    chain = {}
    x = jax.random.bits(jax.random.key(0), (256,), jnp.uint32)  # 1 KiB
    for case, method in (("bulk", "tma"), ("simt", "simt")):

        def chained(a, method=method):
            for _ in range(p["chain_ops"]):
                a = jax_tma.copy(a, method=method)
            return a

        fn = jax.jit(chained)
        s.check(f"{p['chain_ops']} chained 1 KiB copies ({method})", fn(x), x)
        timed = s.time({case: lambda fn=fn: fn(x)}, 30 if not s.smoke else 2, wall=False)
        t = timed["cases"][case]
        chain[case] = {"us_per_op": t["span_us"] / p["chain_ops"],
                         "busy_us_per_op": t["busy_us"] / p["chain_ops"],
                         "ops": p["chain_ops"], "protocol": timed["protocol"]}
    return {"op": OP, "bytes_convention": BYTES, "rows": rows, "chained_tiny_copies": chain,
            "pallas_kernel": pallas_kernels.describe("copy")}


BENCHMARKS = {"copy": Benchmark(
    lambda s, args: bench_copy(s, [int(m * MIB) for m in args.sizes_mib] if args.sizes_mib
                               else None), budget_s=60)}
