"""The bulk copy's pipeline-shape sweep, through the raw launch hook of the
benchmarks' extension (the source of kDefaultBulkCopyConfig).

    python benchmarks/run.py tune-bulk [--out tune.json]
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from harness import MIB, time_device
from references import load_extension


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
    ext = load_extension()

    def raw_copy(*args):
        # The hook returns at once; waiting keeps every call a separate run
        # of GPU activity in the trace, as time_device expects.
        ext.raw_copy(*args)
        ext.synchronize(0)

    out = []
    for mib in sizes_mib:
        nbytes = mib * MIB
        x = jax.random.bits(jax.random.key(1), (nbytes // 4,), jnp.uint32)
        y = jnp.zeros_like(x)
        jax.block_until_ready((x, y))
        src, dst = x.unsafe_buffer_pointer(), y.unsafe_buffer_pointer()
        for chunk, stages, per_cta, dynamic in shapes:
            launch = functools.partial(raw_copy, "bulk", 0, dst, src, nbytes,
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
