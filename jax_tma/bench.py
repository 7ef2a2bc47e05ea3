"""Benchmarks of jax_tma ops against the XLA formulation a user would write.

    python -m jax_tma.bench copy [--out results.json] [--sizes-mib 1 4 ...]
    python -m jax_tma.bench window [--out results.json]
    python -m jax_tma.bench im2col [--out results.json]
    python -m jax_tma.bench tune-bulk [--out tune.json]   # pipeline-shape sweep
    python -m jax_tma.bench ppermute [--out results.json]  # two GPUs
    python -m jax_tma.bench broadcast [--out results.json]
    python -m jax_tma.bench broadcast-once   # each method once, for ncu

Times device work, not Python dispatch: each case runs under
``jax.profiler`` and its duration is the span of its GPU activity (kernels
and memcpys, read from the trace) per call; the median over calls is
reported (copy: the cases take turns, see time_cases). Bandwidth counts
every byte read plus every byte written.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import glob
import itertools
import json
import math
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

import jax_tma
from jax_tma import _ffi

MIB = 1 << 20


def _device_events(trace_dir: str) -> list[tuple[int, int]]:
    """(start_ns, end_ns) of every GPU activity in the trace."""
    from jax.profiler import ProfileData

    paths = glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)
    if not paths:
        raise RuntimeError(f"no profile written under {trace_dir}")
    events = []
    for plane in ProfileData.from_file(paths[0]).planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            # "Stream #N(...)" lines hold the activities themselves; other
            # lines (XLA Ops, XLA Modules, ...) are annotations over them.
            if not line.name.startswith("Stream"):
                continue
            for e in line.events:
                events.append((int(e.start_ns), int(e.start_ns + e.duration_ns)))
    return sorted(events)


def _split_runs(events: list[tuple[int, int]], runs: int, busy: bool) -> list[float]:
    """Splits time-sorted activities into `runs` calls at the runs-1 largest
    idle gaps (calls are separated by a host round trip); returns each
    call's device span, or with `busy` the time its GPU was busy (the span
    less idle gaps inside the call), in seconds."""
    if len(events) < runs:
        raise RuntimeError(f"trace has {len(events)} GPU activities for {runs} calls")
    gaps = []
    end = events[0][1]
    for i in range(1, len(events)):
        gaps.append((events[i][0] - end, i))
        end = max(end, events[i][1])
    cuts = sorted(i for _, i in sorted(gaps, reverse=True)[: runs - 1])
    out = []
    for lo, hi in zip([0] + cuts, cuts + [len(events)]):
        group = events[lo:hi]
        if not busy:
            out.append((max(e for _, e in group) - group[0][0]) * 1e-9)
            continue
        total, reach = 0, group[0][0]
        for start, stop in group:  # union of the activity intervals
            total += max(0, stop - max(start, reach))
            reach = max(reach, stop)
        out.append(total * 1e-9)
    return out


def time_cases(cases: dict[str, Callable[..., Any]], inputs: Sequence[tuple], rounds: int,
               rep: int = 1, busy: bool = False,
               before: Callable[[], Any] | None = None) -> dict[str, float]:
    """Median device seconds per call of each case: the span of its GPU
    activity, or with `busy` only the time the GPU was busy.

    The cases take turns: each round runs every case `rep` times in a row,
    cycling through `inputs`, so that slow drift (clocks, temperature) hits
    every case alike. With rep > 1 the first call of each turn, which pays
    for what the previous case left in L2, is not counted. `before`, if
    given, runs (untimed) ahead of every call, e.g. to set the L2 state."""
    for fn in cases.values():
        for args in inputs:
            jax.block_until_ready(fn(*args))
    plan = [name for _ in range(rounds) for name in cases for _ in range(rep)]
    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d)
        for i, name in enumerate(plan):
            if before is not None:
                jax.block_until_ready(before())
            jax.block_until_ready(cases[name](*inputs[i % len(inputs)]))
        jax.profiler.stop_trace()
        events = _device_events(d)
    stride = 1 if before is None else 2
    return _case_medians(plan, _split_runs(events, stride * len(plan), busy)[stride - 1::stride],
                         rep)


def _case_medians(plan: Sequence[str], runs: Sequence[float], rep: int) -> dict[str, float]:
    """Median of each case's runs, `plan` naming the case of each run in
    turns of `rep`; with rep > 1 the first run of every turn is left out."""
    samples: dict[str, list[float]] = {}
    for i, (name, seconds) in enumerate(zip(plan, runs, strict=True)):
        samples.setdefault(name, [])
        if rep == 1 or i % rep:
            samples[name].append(seconds)
    return {name: statistics.median(x) for name, x in samples.items()}


def time_device(fn: Callable[..., Any], inputs: Sequence[tuple], calls: int,
                busy: bool = False) -> float:
    """Median device seconds per call of `fn` over `calls` calls, cycling
    through `inputs` (see time_cases)."""
    return time_cases({"": fn}, inputs, calls, busy=busy)[""]


def _ffi_reference(target: str) -> Callable[[jax.Array], jax.Array]:
    """A jitted call of one of the CUDA-only benchmark reference targets."""

    def f(x):
        return jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    return jax.jit(f)


def copy_cases() -> dict[str, Callable[[jax.Array], jax.Array]]:
    return {
        "auto": jax.jit(jax_tma.copy),
        "bulk": jax.jit(functools.partial(jax_tma.copy, method="bulk")),
        "simt": jax.jit(functools.partial(jax_tma.copy, method="simt")),
        "seed_tma": _ffi_reference("jax_tma_bench_seed_copy"),
        "xla_copy": jax.jit(jnp.copy),
        "memcpy": _ffi_reference("jax_tma_bench_memcpy"),
    }


# Written ahead of each call in the "after a write" regime: more than L2
# holds, so the copy starts with L2 full of another buffer's dirty lines.
_DIRTY_L2_BYTES = 192 * MIB

# From this size up the copy bench also times a read-only and a write-only
# stream of the same bytes. A DRAM channel carries reads and writes in turn,
# so no copy of n bytes takes less than t_read + t_write: the serial bound
# 2n / (t_read + t_write) (read + write counted).
_BOUND_MIN_BYTES = 256 * MIB


@jax.jit
def _read_stream(x: jax.Array) -> jax.Array:
    """The read-only reference: a 16-B XOR checksum of x (CUDA only)."""
    return jax.ffi.ffi_call("jax_tma_bench_read", jax.ShapeDtypeStruct((4,), jnp.uint32))(x)


def bench_copy(sizes_mib: Sequence[int], chain_ops: int = 100) -> dict[str, Any]:
    """Every copy case at each size, in two L2 regimes: `repeat` (the case
    called again and again, so L2 holds its own previous output) and
    `after_write` (each call preceded by an unrelated 192 MiB write, as in a
    program where the copy follows other work)."""
    _ffi.register()
    cases = copy_cases()
    stream_cases = {"read": _read_stream, "write": _ffi_reference("jax_tma_bench_write")}
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


def bench_window() -> dict[str, Any]:
    """jax_tma.window against the XLA formulation of each case, with the copy
    ceiling (cudaMemcpyAsync of the same bytes) from the same run. Bytes:
    every output element written once plus the input elements it reads."""
    _ffi.register()
    f32 = 4
    n = 8192
    key = jax.random.key(7)
    x = jax.random.normal(key, (n, n), jnp.float32)
    i, j = jnp.int32(1234), jnp.int32(2345)
    cases = [
        ("window 4096^2 at a traced offset of 8192^2 f32 vs lax.dynamic_slice",
         lambda m: jax.jit(lambda x, i, j: jax_tma.window(x, (i, j), (4096, 4096), method=m)),
         jax.jit(lambda x, i, j: jax.lax.dynamic_slice(x, (i, j), (4096, 4096))),
         (x, i, j), 2 * 4096 * 4096 * f32),
        ("the same at a 16-B aligned offset (1234, 2344)",
         lambda m: jax.jit(lambda x, i, j: jax_tma.window(x, (i, j), (4096, 4096), method=m)),
         jax.jit(lambda x, i, j: jax.lax.dynamic_slice(x, (i, j), (4096, 4096))),
         (x, i, jnp.int32(2344)), 2 * 4096 * 4096 * f32),
        ("x[::2, ::2] of 8192^2 f32 vs XLA strided slice",
         lambda m: jax.jit(lambda x: jax_tma.window(x, (0, 0), (4096, 4096), strides=(2, 2),
                                                    method=m)),
         jax.jit(lambda x: x[::2, ::2]),
         (x,), 2 * 4096 * 4096 * f32),
        ("pad 8192^2 -> 8320^2 f32 (negative start) vs jnp.pad",
         lambda m: jax.jit(lambda x: jax_tma.window(x, (-64, -64), (8320, 8320), method=m)),
         jax.jit(lambda x: jnp.pad(x, 64)),
         (x,), (n * n + 8320 * 8320) * f32),
        ("copy(method='tiled') vs copy(method='bulk'), 8192^2 f32",
         lambda m: jax.jit(functools.partial(jax_tma.copy, method="tiled" if m == "auto" else m)),
         jax.jit(functools.partial(jax_tma.copy, method="bulk")),
         (x,), 2 * n * n * f32),
    ]
    memcpy = _ffi_reference("jax_tma_bench_memcpy")
    rows = []
    for name, ours, xla, args, nbytes in cases:
        # GPU busy time: in a two-op program (start assembled from traced
        # scalars, then the window) the GPU idles while the host encodes the
        # tensor maps; larger programs hide that behind asynchronous dispatch.
        t_ours = time_device(ours("auto"), [args], 20, busy=True)
        t_simt = time_device(ours("simt"), [args], 20, busy=True)
        t_xla = time_device(xla, [args], 20, busy=True)
        ceiling_in = jax.random.bits(key, (nbytes // 8,), jnp.uint32)  # nbytes/2 copied
        t_copy = time_device(memcpy, [(ceiling_in,)], 20, busy=True)
        t_span = time_device(ours("auto"), [args], 20)
        row = {
            "case": name, "bytes": nbytes,
            "jax_tma_us": t_ours * 1e6, "jax_tma_span_us": t_span * 1e6,
            "simt_us": t_simt * 1e6, "xla_us": t_xla * 1e6,
            "memcpy_us": t_copy * 1e6,
            "jax_tma_tbps": nbytes / t_ours / 1e12, "simt_tbps": nbytes / t_simt / 1e12,
            "xla_tbps": nbytes / t_xla / 1e12, "memcpy_tbps": nbytes / t_copy / 1e12,
        }
        row["vs_xla"] = t_xla / t_ours
        row["vs_ceiling"] = t_copy / t_ours
        rows.append(row)
        print(f"{name}: jax_tma {row['jax_tma_tbps']:.3f} TB/s (simt {row['simt_tbps']:.3f}), "
              f"XLA {row['xla_tbps']:.3f} TB/s ({row['vs_xla']:.2f}x), ceiling "
              f"{row['memcpy_tbps']:.3f} TB/s ({row['vs_ceiling']:.2f}x)", flush=True)
    return {"rows": rows}


def window_table(result: dict[str, Any]) -> str:
    lines = ["| case | jax_tma auto TB/s | (span) | jax_tma simt TB/s | XLA TB/s | auto vs XLA | "
             "auto vs copy ceiling |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        span = r["bytes"] / r["jax_tma_span_us"] / 1e6
        lines.append(f"| {r['case']} | {r['jax_tma_tbps']:.3f} | {span:.3f} | "
                     f"{r['simt_tbps']:.3f} | {r['xla_tbps']:.3f} | {r['vs_xla']:.2f}x | "
                     f"{r['vs_ceiling']:.2f}x |")
    return "\n".join(lines)


def bench_ppermute(sizes_mib: Sequence[int], chain: int = 8) -> dict[str, Any]:
    """jax_tma.ppermute (TMA bulk pull and push, SIMT pull, auto) against
    lax.ppermute (NCCL) on the first two GPUs, swapping blocks (both
    directions at once); GB/s per direction.
    Each jitted program chains `chain` permutations; the time per op is the
    program's device span (both GPUs) over `chain`. Bandwidth: block bytes
    per op, which is what crosses the link in each direction."""
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    _ffi.register()
    mesh = Mesh(np.array(jax.devices("cuda")[:2]), ("i",))
    perm = [(0, 1), (1, 0)]

    def chained(pp):
        def body(b):
            for _ in range(chain):
                b = pp(b, "i", perm)
            return b
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))

    impls = {
        "pull": chained(functools.partial(jax_tma.ppermute, method="bulk", direction="pull")),
        "push": chained(functools.partial(jax_tma.ppermute, method="bulk", direction="push")),
        "simt_pull": chained(functools.partial(jax_tma.ppermute, method="simt", direction="pull")),
        "auto": chained(jax_tma.ppermute),
        "nccl": chained(jax.lax.ppermute),
    }
    rows = []
    for mib in sizes_mib:
        block = mib * MIB
        x = jax.device_put(jax.random.bits(jax.random.key(mib), (2 * block // 4,), jnp.uint32),
                           NamedSharding(mesh, P("i")))
        want = np.asarray(impls["nccl"](x))
        row: dict[str, Any] = {"block_mib": mib}
        for name, f in impls.items():
            np.testing.assert_array_equal(np.asarray(f(x)), want)
            t = time_device(f, [(x,)], 10) / chain
            row[f"{name}_us"] = t * 1e6
            row[f"{name}_gbps"] = block / t / 1e9
        for name in impls:
            row[f"{name}_vs_nccl"] = row["nccl_us"] / row[f"{name}_us"]
        rows.append(row)
        print(f"{mib} MiB per device, GB/s per direction: " + ", ".join(
            f"{name} {row[name + '_gbps']:.1f} ({row[name + '_vs_nccl']:.2f}x NCCL)"
            for name in impls), flush=True)
    return {"rows": rows, "chain": chain, "perm": perm}


def ppermute_table(result: dict[str, Any]) -> str:
    lines = ["| block per GPU | pull (TMA bulk) | push (TMA bulk) | pull (SIMT) | auto | "
             "lax.ppermute (NCCL) | auto vs NCCL |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['block_mib']} MiB | {r['pull_gbps']:.1f} | {r['push_gbps']:.1f} | "
                     f"{r['simt_pull_gbps']:.1f} | {r['auto_gbps']:.1f} | {r['nccl_gbps']:.1f} | "
                     f"{r['auto_vs_nccl']:.2f}x |")
    return "\n".join(lines)


BROADCAST_CASES = (
    # name, x shape, axis, n
    ("8 replicas of 4096^2 bf16 (axis=0)", (4096, 4096), 0, 8),
    ("8 replicas of each row of 4096^2 bf16 (axis=1)", (4096, 4096), 1, 8),
    ("GQA repeat K/V heads: (4, 4096, 8, 128) bf16 x4 (axis=3)", (4, 4096, 8, 128), 3, 4),
)


def broadcast_methods() -> list[tuple[str, str, int | None]]:
    """(label, method, cluster_size) of every broadcast variant."""
    out = [("auto", "auto", None), ("store", "store", None), ("simt", "simt", None)]
    for method in ("multicast", "dsmem"):
        out += [(f"{method}/{c}", method, c) for c in (2, 4, 8, 16)]
    return out


def _broadcast_fn(n: int, axis: int, method: str, cluster_size: int | None):
    return jax.jit(functools.partial(jax_tma.broadcast, n=n, axis=axis, method=method,
                                     cluster_size=cluster_size))


def _xla_broadcast(shape: tuple[int, ...], n: int, axis: int):
    out = tuple(shape[:axis]) + (n,) + tuple(shape[axis:])
    return jax.jit(lambda x: jnp.broadcast_to(jnp.expand_dims(x, axis), out))


def bench_broadcast() -> dict[str, Any]:
    """Every broadcast method and cluster size against XLA's materialised
    jnp.broadcast_to and the copy ceiling (cudaMemcpyAsync of the same bytes),
    in one run. Bytes: the input read once plus the output written once.
    Then the dsmem path's SM-to-SM push bandwidth: n=1 (one store per tile,
    cluster - 1 pushes of it), pushed bytes over the kernel's time."""
    _ffi.register()
    memcpy = _ffi_reference("jax_tma_bench_memcpy")
    key = jax.random.key(11)
    rows = []
    for name, shape, axis, n in BROADCAST_CASES:
        x = jax.random.bits(key, shape, jnp.uint16).view(jnp.bfloat16)
        in_bytes = x.size * 2
        nbytes = in_bytes * (n + 1)
        row: dict[str, Any] = {"case": name, "shape": shape, "axis": axis, "n": n,
                               "bytes": nbytes, "us": {}}
        for label, method, cluster in broadcast_methods():
            row["us"][label] = time_device(_broadcast_fn(n, axis, method, cluster), [(x,)], 20,
                                           busy=True) * 1e6
        row["us"]["xla"] = time_device(_xla_broadcast(shape, n, axis), [(x,)], 20,
                                       busy=True) * 1e6
        ceiling_in = jax.random.bits(key, (nbytes // 8,), jnp.uint32)  # nbytes/2 copied
        row["us"]["memcpy"] = time_device(memcpy, [(ceiling_in,)], 20, busy=True) * 1e6
        del ceiling_in
        row["tbps"] = {k: nbytes / v / 1e6 for k, v in row["us"].items()}
        ours = [k for k, _, _ in broadcast_methods() if k != "auto"]
        row["best"] = min(ours, key=lambda k: row["us"][k])
        row["best_vs_xla"] = row["us"]["xla"] / row["us"][row["best"]]
        row["auto_vs_best"] = row["us"][row["best"]] / row["us"]["auto"]
        rows.append(row)
        print(f"{name}: " + ", ".join(f"{k} {v:.1f} us ({row['tbps'][k]:.2f} TB/s)"
                                      for k, v in row["us"].items()), flush=True)
        print(f"  best {row['best']} {row['best_vs_xla']:.2f}x XLA; auto at "
              f"{row['auto_vs_best']:.3f} of best", flush=True)
    x = jax.random.bits(key, (4096, 4096), jnp.uint16).view(jnp.bfloat16)
    push = []
    for cluster in (2, 4, 8, 16):
        seconds = time_device(_broadcast_fn(1, 0, "dsmem", cluster), [(x,)], 20, busy=True)
        pushed = x.size * 2 * (cluster - 1)
        push.append({"cluster_size": cluster, "us": seconds * 1e6, "pushed_bytes": pushed,
                     "push_tbps": pushed / seconds / 1e12})
        print(f"dsmem push, cluster {cluster}: {pushed / seconds / 1e12:.2f} TB/s "
              f"({seconds * 1e6:.1f} us)", flush=True)
    return {"rows": rows, "dsmem_push": push}


def broadcast_once() -> None:
    """Runs every broadcast variant and XLA's broadcast_to once on the first
    case, in the order printed: the kernels an ncu run sees, in order."""
    _ffi.register()
    name, shape, axis, n = BROADCAST_CASES[0]
    x = jax.random.bits(jax.random.key(3), shape, jnp.uint16).view(jnp.bfloat16)
    variants = [(label, _broadcast_fn(n, axis, m, c)) for label, m, c in broadcast_methods()]
    variants.append(("xla", _xla_broadcast(shape, n, axis)))
    for label, fn in variants:
        jax.block_until_ready(fn(x))
        print(f"ran {label} ({name})", flush=True)


def broadcast_table(result: dict[str, Any]) -> str:
    labels = [k for k, _, _ in broadcast_methods()] + ["xla", "memcpy"]
    lines = ["| case | " + " | ".join(labels) + " | best ÷ XLA time | auto vs best |",
             "|" + "---|" * (len(labels) + 3)]
    for r in result["rows"]:
        cells = [f"{r['us'][k]:.1f} µs ({r['tbps'][k]:.2f})" for k in labels]
        lines.append(f"| {r['case']} | " + " | ".join(cells) +
                     f" | {r['best']} {r['best_vs_xla']:.2f}× | {r['auto_vs_best']:.3f} |")
    lines.append("")
    lines.append("| dsmem cluster size | 2 | 4 | 8 | 16 |")
    lines.append("|---|---|---|---|---|")
    lines.append("| SM-to-SM push TB/s (n=1, 32 MiB input) | " +
                 " | ".join(f"{p['push_tbps']:.2f}" for p in result["dsmem_push"]) + " |")
    return "\n".join(lines)


def _slice_concat_im2col(x: jax.Array, kernel: Sequence[int]) -> jax.Array:
    """The XLA formulation of a stride-1 SAME im2col (tap-major): pad once,
    then concatenate one shifted slice per kernel tap."""
    spatial = x.shape[1:-1]
    pads = [((k - 1) // 2, k - 1 - (k - 1) // 2) for k in kernel]
    xp = jnp.pad(x, ((0, 0), *pads, (0, 0)))
    taps = [xp[(slice(None),) + tuple(slice(o, o + n) for o, n in zip(tap, spatial))]
            for tap in itertools.product(*(range(k) for k in kernel))]
    return jnp.concatenate(taps, axis=-1)


def bench_im2col() -> dict[str, Any]:
    """jax_tma.im2col (auto, forced TMA, SIMT) against XLA's
    conv_general_dilated_patches and the slice-and-concatenate formulation,
    and col2im against XLA's gradients of both, with the copy ceiling
    (cudaMemcpyAsync of the same bytes) from the same run. Bytes: the input
    read once plus the patch matrix written once (col2im: the reverse)."""
    _ffi.register()
    memcpy = _ffi_reference("jax_tma_bench_memcpy")
    cases = [((64, 56, 56, 64), jnp.bfloat16), ((32, 28, 28, 256), jnp.bfloat16),
             ((16, 224, 224, 4), jnp.float32)]
    rows = []
    for shape, dtype in cases:
        kernel = (3,) * (len(shape) - 2)
        key = jax.random.key(len(rows))
        inputs = [(jax.random.normal(k, shape, jnp.float32).astype(dtype),)
                  for k in jax.random.split(key, 2)]
        x = inputs[0][0]
        out_shape = jax.eval_shape(lambda a: _slice_concat_im2col(a, kernel), x).shape
        itemsize = jnp.dtype(dtype).itemsize
        nbytes = (math.prod(shape) + math.prod(out_shape)) * itemsize
        dims = {4: ("NHWC", "HWIO", "NHWC")}[len(shape)]
        im2col = {m: jax.jit(functools.partial(jax_tma.im2col, kernel_size=kernel,
                                               padding="SAME", method=m))
                  for m in ("auto", "tma", "simt")}
        xla_patches = jax.jit(lambda a: jax.lax.conv_general_dilated_patches(
            a, kernel, (1,) * len(kernel), "SAME", dimension_numbers=dims))
        xla_concat = jax.jit(lambda a: _slice_concat_im2col(a, kernel))
        times = {}
        for name, fn in [*(("im2col_" + m, f) for m, f in im2col.items()),
                         ("xla_patches", xla_patches), ("xla_slice_concat", xla_concat)]:
            times[name] = time_device(fn, inputs, 10, busy=True)
        # col2im: the patch matrix in, x out, against XLA's transposes.
        cts = [(jax.random.normal(k, out_shape, jnp.float32).astype(dtype),)
               for k in jax.random.split(jax.random.fold_in(key, 1), 2)]
        col2im = jax.jit(functools.partial(jax_tma.col2im, input_shape=shape,
                                           kernel_size=kernel, padding="SAME"))
        grad_concat = jax.jit(lambda c: jax.linear_transpose(
            lambda a: _slice_concat_im2col(a, kernel), x)(c)[0])
        grad_patches = jax.jit(lambda c: jax.linear_transpose(
            lambda a: jax.lax.conv_general_dilated_patches(
                a, kernel, (1,) * len(kernel), "SAME", dimension_numbers=dims), x)(c)[0])
        for name, fn in [("col2im", col2im), ("xla_grad_slice_concat", grad_concat),
                         ("xla_grad_patches", grad_patches)]:
            times[name] = time_device(fn, cts, 10, busy=True)
        del cts
        ceiling_in = jax.random.bits(key, (nbytes // 8,), jnp.uint32)  # nbytes/2 copied
        times["memcpy"] = time_device(memcpy, [(ceiling_in,)], 10, busy=True)
        del ceiling_in, inputs
        row: dict[str, Any] = {"shape": list(shape), "dtype": jnp.dtype(dtype).name,
                               "kernel": list(kernel), "padding": "SAME", "bytes": nbytes}
        for name, t in times.items():
            row[name + "_us"] = t * 1e6
            row[name + "_tbps"] = nbytes / t / 1e12
        t_auto = times["im2col_auto"]
        row["auto_vs_xla_patches"] = times["xla_patches"] / t_auto
        row["auto_vs_xla_slice_concat"] = times["xla_slice_concat"] / t_auto
        row["auto_vs_ceiling"] = times["memcpy"] / t_auto
        row["col2im_vs_xla_grad_slice_concat"] = times["xla_grad_slice_concat"] / times["col2im"]
        row["col2im_vs_xla_grad_patches"] = times["xla_grad_patches"] / times["col2im"]
        rows.append(row)
        print(f"{shape} {row['dtype']}: auto {t_auto * 1e3:.4f} ms "
              f"(tma {times['im2col_tma'] * 1e3:.4f}, simt {times['im2col_simt'] * 1e3:.4f}), "
              f"XLA patches {times['xla_patches'] * 1e3:.4f} ms "
              f"({row['auto_vs_xla_patches']:.1f}x), slice-concat "
              f"{times['xla_slice_concat'] * 1e3:.4f} ms ({row['auto_vs_xla_slice_concat']:.2f}x), "
              f"{row['im2col_auto_tbps']:.3f} TB/s = {row['auto_vs_ceiling']:.2f}x memcpy "
              f"{row['memcpy_tbps']:.3f} TB/s; col2im {times['col2im'] * 1e3:.4f} ms vs XLA grad "
              f"{row['col2im_vs_xla_grad_slice_concat']:.2f}x (slice-concat), "
              f"{row['col2im_vs_xla_grad_patches']:.1f}x (patches)", flush=True)
    return {"rows": rows}


def im2col_table(result: dict[str, Any]) -> str:
    lines = ["| input | jax_tma auto ms (TB/s) | tma ms | simt ms | XLA patches ms | "
             "XLA slice-concat ms | auto vs patches | auto vs slice-concat | auto vs copy "
             "ceiling | col2im ms | col2im vs XLA grad (slice-concat / patches) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        ms = {k[:-3]: v / 1e3 for k, v in r.items() if k.endswith("_us")}
        lines.append(
            f"| {tuple(r['shape'])} {r['dtype']} 3x3 SAME | {ms['im2col_auto']:.4f} "
            f"({r['im2col_auto_tbps']:.2f}) | {ms['im2col_tma']:.4f} | {ms['im2col_simt']:.4f} | "
            f"{ms['xla_patches']:.3f} | {ms['xla_slice_concat']:.4f} | "
            f"{r['auto_vs_xla_patches']:.1f}x | {r['auto_vs_xla_slice_concat']:.2f}x | "
            f"{r['auto_vs_ceiling']:.2f}x | {ms['col2im']:.4f} | "
            f"{r['col2im_vs_xla_grad_slice_concat']:.2f}x / {r['col2im_vs_xla_grad_patches']:.1f}x |")
    return "\n".join(lines)


def tune_bulk(sizes_mib: Sequence[int]) -> dict[str, Any]:
    """Times the bulk kernel for pipeline shapes (chunk bytes, stages, chunks
    per CTA, static or dynamic schedule) through the raw launch hook."""
    shapes = [
        (chunk, stages, stages * rounds, False)
        for chunk in (16384, 32768, 49152, 65536)
        for stages in (2, 3, 4)
        for rounds in (1, 2, 4, 8, 32)
        if chunk * stages <= 200 * 1024
    ] + [(chunk, stages, stages, True)  # one static round, then claims
         for chunk, stages in ((8192, 8), (8192, 16), (16384, 8), (16384, 12))]
    out = []
    for mib in sizes_mib:
        nbytes = mib * MIB
        x = jax.random.bits(jax.random.key(1), (nbytes // 4,), jnp.uint32)
        y = jnp.zeros_like(x)
        jax.block_until_ready((x, y))
        src, dst = x.unsafe_buffer_pointer(), y.unsafe_buffer_pointer()
        for chunk, stages, per_cta, dynamic in shapes:
            launch = functools.partial(_ffi._ext._raw_copy, "bulk", 0, dst, src, nbytes,
                                       chunk, stages, per_cta, dynamic)
            seconds = time_device(launch, [()], 10)
            out.append({"bytes": nbytes, "chunk": chunk, "stages": stages,
                        "chunks_per_cta": per_cta, "dynamic": dynamic, "us": seconds * 1e6,
                        "tbps": 2 * nbytes / seconds / 1e12})
        best = sorted((r for r in out if r["bytes"] == nbytes), key=lambda r: r["us"])[:6]
        for r in best:
            print(f"{mib:5d} MiB chunk={r['chunk']:6d} stages={r['stages']} "
                  f"chunks/CTA={r['chunks_per_cta']} dynamic={r['dynamic']}: "
                  f"{r['tbps']:.3f} TB/s", flush=True)
        del x, y
    return {"rows": out}


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jax_tma.bench")
    parser.add_argument("op", choices=["copy", "window", "im2col", "tune-bulk", "broadcast",
                                       "broadcast-once", "ppermute"])
    parser.add_argument("--sizes-mib", type=int, nargs="+",
                        default=[1, 4, 16, 32, 48, 64, 256, 1024, 4096])
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    gpus = jax.devices("cuda") if any(d.platform == "gpu" for d in jax.devices()) else []
    if not gpus:
        print("jax_tma.bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.op == "tune-bulk":
        result = tune_bulk([4, 64, 1024])
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
        return 0
    if args.op == "broadcast-once":
        broadcast_once()
        return 0
    if args.op == "window":
        result = bench_window()
        text = window_table(result)
    elif args.op == "ppermute":
        if len(gpus) < 2:
            print("jax_tma.bench ppermute: needs two CUDA GPUs", file=sys.stderr)
            return 2
        result = bench_ppermute(args.sizes_mib)
        text = ppermute_table(result)
    elif args.op == "broadcast":
        result = bench_broadcast()
        text = broadcast_table(result)
    elif args.op == "im2col":
        result = bench_im2col()
        text = im2col_table(result)
    else:
        result = bench_copy(args.sizes_mib)
        text = table(result)
    result.update(
        op=args.op,
        device=gpus[0].device_kind,
        date=datetime.date.today().isoformat(),
        jax=jax.__version__,
        build=jax_tma.build_info(),
        bytes_convention=("read + write (every byte read once plus every byte written once); "
                          "the copy bench's read-only and write-only rates count one direction"),
        timing=("median per call from a jax.profiler trace: device span (copy: cases "
                "interleaved, 4 calls per turn, the first not counted; ppermute, "
                "over both GPUs, divided by the ops chained in the program); "
                "GPU busy time, span also recorded (window, broadcast); GPU busy time (im2col)"),
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(f"\n{result['device']}, {result['date']}, jax {result['jax']}")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
