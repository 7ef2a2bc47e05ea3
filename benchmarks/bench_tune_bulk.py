"""The bulk copy's pipeline-shape sweep, through the raw launch hook of the
benchmarks' extension: every shape at each size, interleaved, on buffers
rotated through more than L2; says which shape is best and where the shapes
jax_tma ships rank.

    python benchmarks/run.py tune-bulk [--out-dir DIR]
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from harness import MIB, Benchmark, Session, rotate_all

OP = "tune-bulk"
BYTES = "read + write: a copy of n bytes counts 2n"
# Sizes, and the bytes that source and destination buffers each rotate
# through: more than L2 holds (50 MiB on H100), so that no call finds its
# input, or the output of the call before it, in L2.
FULL = {"sizes": [4 * MIB, 64 * MIB, 1024 * MIB], "rotate_bytes": 256 * MIB}
SMOKE = {"sizes": [64 << 10, 256 << 10], "rotate_bytes": 1 * MIB}
POISON = 0xA5A5A5A5


def shapes(shipped: dict[str, tuple]) -> list[tuple[int, int, int, bool]]:
    """(chunk bytes, stages, chunks per CTA, dynamic) of every swept shape,
    the shipped ones included."""
    out = [(chunk, stages, stages * rounds, False)
           for chunk in (16384, 32768, 49152, 65536)
           for stages in (2, 3, 4)
           for rounds in (1, 2, 4, 8, 32)
           if chunk * stages <= 200 * 1024]
    out += [(chunk, stages, static, True)  # `static` chunks each, then claims
            for chunk, stages in ((8192, 8), (8192, 16), (16384, 8), (16384, 12), (4096, 16), (8192, 12), (16384, 6), (16384, 4), (32768, 3), (32768, 6), (12288, 16))
            for static in (4, stages)]
    for config in shipped.values():
        if tuple(config) not in out:
            out.append(tuple(config))
    return out


def _label(shape: Sequence) -> str:
    chunk, stages, per_cta, dynamic = shape
    return f"{chunk // 1024} KiB x {stages} stages, {per_cta} per CTA" + (
        ", dynamic" if dynamic else "")


def tune_bulk(s: Session) -> dict[str, Any]:
    ext = s.refs.ext
    shipped = {k: tuple(v) for k, v in ext.shipped_bulk_configs(0).items()}
    swept = shapes(shipped)

    def launch(shape, dst, src, nbytes):
        # The hook returns at once; waiting keeps every call a separate run
        # of GPU activity in the trace, as the harness expects.
        ext.raw_copy("tma", 0, dst, src, nbytes, *shape)
        ext.synchronize(0)

    p = SMOKE if s.smoke else FULL
    rows, summary = [], []
    for nbytes in p["sizes"]:
        pairs = max(1, min(64, p["rotate_bytes"] // nbytes))
        keys = jax.random.split(jax.random.key(1), pairs)
        srcs = [jax.random.bits(k, (nbytes // 4,), jnp.uint32) for k in keys]
        dsts = [jnp.zeros_like(srcs[0]) for _ in range(pairs)]
        jax.block_until_ready((srcs, dsts))
        ptrs = [(d.unsafe_buffer_pointer(), x.unsafe_buffer_pointer(), nbytes)
                for d, x in zip(dsts, srcs)]
        for shape in swept:
            poison = jnp.full_like(srcs[0], POISON)
            jax.block_until_ready(poison)
            launch(shape, poison.unsafe_buffer_pointer(), ptrs[0][1], nbytes)
            s.check(f"bulk {_label(shape)}, {nbytes} B", poison, srcs[0])
            del poison
        timed = s.time(rotate_all({_label(shape): functools.partial(launch, shape)
                                   for shape in swept}, ptrs), 2 if s.smoke else 10,
                       wall=False)  # each launch waits for the device: no wall clock
        ranked = sorted(swept, key=lambda sh: timed["cases"][_label(sh)]["span_us"])
        for rank, shape in enumerate(ranked, 1):
            t = timed["cases"][_label(shape)]
            rows.append({"bytes": nbytes, "chunk": shape[0], "stages": shape[1],
                         "chunks_per_cta": shape[2], "dynamic": shape[3], "rank": rank, **t,
                         "tbps": 2 * nbytes / t["span_us"] / 1e6})
        # What jax_tma.copy(method="tma") launches at this size.
        uses = "dynamic" if nbytes >= ext.dynamic_bulk_min_bytes else "static"
        best, ours = ranked[0], shipped[uses]
        t_best = timed["cases"][_label(best)]["span_us"]
        entry = {"bytes": nbytes, "buffers": pairs, "protocol": timed["protocol"],
                 "shapes": len(swept), "best": _label(best),
                 "best_tbps": 2 * nbytes / t_best / 1e6, "shipped": _label(ours),
                 "shipped_schedule": uses, "shipped_rank": ranked.index(ours) + 1,
                 "shipped_vs_best": t_best / timed["cases"][_label(ours)]["span_us"]}
        summary.append(entry)
        s.log(f"tune-bulk {nbytes / MIB:g} MiB: best {entry['best']} "
              f"({entry['best_tbps']:.3f} TB/s); shipped {uses} {entry['shipped']} ranks "
              f"{entry['shipped_rank']} of {len(swept)} ({entry['shipped_vs_best']:.3f}x best)")
        del srcs, dsts
    return {"op": OP, "bytes_convention": BYTES, "rows": rows, "summary": summary,
            "shipped_configs": {k: _label(v) for k, v in shipped.items()}}


# The bulk pipeline-shape sweep.
BENCHMARKS = {"tune-bulk": Benchmark(lambda s, args: tune_bulk(s), budget_s=20)}
