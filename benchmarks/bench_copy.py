"""The copy benchmark: every jax_tma.copy method against XLA's copy, the
seed-style TMA kernel and cudaMemcpyAsync, in two L2 regimes, with the serial
read/write bound from 256 MiB up and chained tiny copies.

    python benchmarks/run.py copy [--out results.json] [--sizes-mib 1 4 ...]
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

import jax_tma
from harness import MIB, time_cases, time_device
from references import ffi_reference, read_stream, register


def copy_cases() -> dict[str, Callable[[jax.Array], jax.Array]]:
    return {
        "auto": jax.jit(jax_tma.copy),
        "bulk": jax.jit(functools.partial(jax_tma.copy, method="bulk")),
        "simt": jax.jit(functools.partial(jax_tma.copy, method="simt")),
        "seed_tma": ffi_reference("jax_tma_bench_seed_copy"),
        "xla_copy": jax.jit(jnp.copy),
        "memcpy": ffi_reference("jax_tma_bench_memcpy"),
    }


# Written ahead of each call in the "after a write" regime: more than L2
# holds, so the copy starts with L2 full of another buffer's dirty lines.
_DIRTY_L2_BYTES = 192 * MIB


# From this size up the copy bench also times a read-only and a write-only
# stream of the same bytes. A DRAM channel carries reads and writes in turn,
# so no copy of n bytes takes less than t_read + t_write: the serial bound
# 2n / (t_read + t_write) (read + write counted).
_BOUND_MIN_BYTES = 256 * MIB


def bench_copy(sizes_mib: Sequence[int], chain_ops: int = 100) -> dict[str, Any]:
    """Every copy case at each size, in two L2 regimes: `repeat` (the case
    called again and again, so L2 holds its own previous output) and
    `after_write` (each call preceded by an unrelated 192 MiB write, as in a
    program where the copy follows other work)."""
    register()
    cases = copy_cases()
    stream_cases = {"read": read_stream, "write": ffi_reference("jax_tma_bench_write")}
    dirty = jax.jit(lambda: jnp.full((_DIRTY_L2_BYTES // 4,), 7, jnp.uint32))
    rows = []
    for mib in sizes_mib:
        nbytes = mib * MIB
        # Rotate through enough inputs that repeated calls do not hit L2.
        copies = max(1, min(64, (256 * MIB) // nbytes))
        key = jax.random.key(mib)
        inputs = [
            (jax.random.bits(k, (nbytes // 4,), jnp.uint32),)
            for k in jax.random.split(key, copies)
        ]
        # Small copies cost little: more rounds there steady their medians.
        rounds = 16 if nbytes <= 64 * MIB else 8 if nbytes <= 256 * MIB else 3
        row: dict[str, Any] = {"bytes": nbytes}
        for regime, before in (("repeat", None), ("after_write", dirty)):
            times = time_cases(cases, inputs, rounds, rep=4, before=before)
            row[regime] = {
                name: {"us": t * 1e6, "tbps": 2 * nbytes / t / 1e12,
                       "vs_memcpy": times["memcpy"] / t, "vs_xla": times["xla_copy"] / t}
                for name, t in times.items()
            }
        if nbytes >= _BOUND_MIN_BYTES:
            streams = time_cases(stream_cases, inputs, rounds, rep=4)
            bound = 2 * nbytes / (streams["read"] + streams["write"]) / 1e12
            row["serial_bound"] = {
                "read_tbps": nbytes / streams["read"] / 1e12,
                "write_tbps": nbytes / streams["write"] / 1e12,
                "copy_tbps": bound,
                **{f"{name}_fraction": row["repeat"][name]["tbps"] / bound
                   for name in ("bulk", "seed_tma", "memcpy")},
            }
        rows.append(row)
        del inputs
        print(_row_text(row), flush=True)

    chain = {}
    x = jax.random.bits(jax.random.key(0), (256,), jnp.uint32)  # 1 KiB
    for method in ("bulk", "simt"):

        def chained(a, method=method):
            for _ in range(chain_ops):
                a = jax_tma.copy(a, method=method)
            return a

        seconds = time_device(jax.jit(chained), [(x,)], 30)
        chain[method] = {"us_per_op": seconds * 1e6 / chain_ops, "ops": chain_ops}
    return {"rows": rows, "chained_tiny_copies": chain}


_COPY_CASES = ("auto", "bulk", "simt", "seed_tma", "xla_copy", "memcpy")


def _row_text(row: dict[str, Any]) -> str:
    size = f"{row['bytes'] // MIB} MiB"
    cells = [f"{size:>9}"]
    for name in _COPY_CASES:
        r = row["repeat"][name]
        cells.append(f"{r['tbps']:6.3f} ({r['vs_memcpy']:.3f}x)")
    cells.append(f"auto/XLA {row['repeat']['auto']['vs_xla']:.3f}x, after a write "
                 f"{row['after_write']['auto']['vs_xla']:.3f}x")
    return " | ".join(cells)


def table(result: dict[str, Any]) -> str:
    head = ["size", "auto TB/s (x memcpy)", "bulk", "simt", "seed-style TMA", "XLA jnp.copy",
            "cudaMemcpyAsync", "auto x XLA", "after a write: auto x XLA (bulk x memcpy)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in result["rows"]:
        cells = [f"{row['bytes'] // MIB} MiB"]
        for name in _COPY_CASES:
            r = row["repeat"][name]
            cells.append(f"{r['tbps']:.2f} ({r['vs_memcpy']:.3f}×)")
        after = row["after_write"]
        cells.append(f"{row['repeat']['auto']['vs_xla']:.3f}×")
        cells.append(f"{after['auto']['vs_xla']:.3f}× ({after['bulk']['vs_memcpy']:.3f}×)")
        lines.append("| " + " | ".join(cells) + " |")
    bounded = [row for row in result["rows"] if "serial_bound" in row]
    if bounded:
        lines += ["", "| size | read-only TB/s | write-only TB/s | serial bound "
                  "2n/(t_read+t_write) | bulk ÷ bound | seed-style ÷ bound | "
                  "cudaMemcpyAsync ÷ bound |", "|---|---|---|---|---|---|---|"]
        for row in bounded:
            b = row["serial_bound"]
            lines.append(f"| {row['bytes'] // MIB} MiB | {b['read_tbps']:.2f} | "
                         f"{b['write_tbps']:.2f} | {b['copy_tbps']:.2f} | "
                         f"{b['bulk_fraction']:.3f} | {b['seed_tma_fraction']:.3f} | "
                         f"{b['memcpy_fraction']:.3f} |")
    chain = result["chained_tiny_copies"]
    lines.append("")
    lines.append(
        f"{chain['bulk']['ops']} chained 1 KiB copies inside one `jit`: "
        f"{chain['bulk']['us_per_op']:.2f} µs per op (bulk), "
        f"{chain['simt']['us_per_op']:.2f} µs per op (simt)."
    )
    return "\n".join(lines)
