"""Benchmarks of jax_tma ops against the XLA formulation a user would write.
Runs against the installed jax_tma; the reference kernels come from the
benchmarks' extension _jax_tma_bench (build with JAX_TMA_BENCH=ON).

    python benchmarks/run.py copy [--out results.json] [--sizes-mib 1 4 ...]
    python benchmarks/run.py window [--out results.json]
    python benchmarks/run.py im2col [--out results.json]
    python benchmarks/run.py tune-bulk [--out tune.json]   # pipeline-shape sweep
    python benchmarks/run.py ppermute [--out results.json]  # two GPUs
    python benchmarks/run.py broadcast [--out results.json]
    python benchmarks/run.py broadcast-once   # each method once, for ncu
    python benchmarks/run.py gather [--out results.json]

How cases are timed: benchmarks/harness.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

# Under `python -P` this folder is not on sys.path; it holds only the
# benchmark modules (no jax_tma to shadow the installed one).
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import jax  # noqa: E402

import harness  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/run.py")
    parser.add_argument("op", choices=["copy", "window", "im2col", "tune-bulk", "broadcast",
                                       "broadcast-once", "ppermute", "gather"])
    parser.add_argument("--sizes-mib", type=int, nargs="+",
                        default=[1, 4, 16, 32, 48, 64, 256, 1024, 4096])
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    gpus = jax.devices("cuda") if any(d.platform == "gpu" for d in jax.devices()) else []
    if not gpus:
        print("benchmarks/run.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.op == "tune-bulk":
        from bench_tune_bulk import tune_bulk
        harness.write_json(tune_bulk([4, 64, 1024]), args.out)
        return 0
    if args.op == "broadcast-once":
        from bench_broadcast import broadcast_once
        broadcast_once()
        return 0
    if args.op == "window":
        from bench_window import bench_window, window_table
        result = bench_window()
        text = window_table(result)
    elif args.op == "ppermute":
        if len(gpus) < 2:
            print("benchmarks/run.py ppermute: needs two CUDA GPUs", file=sys.stderr)
            return 2
        from bench_ppermute import bench_ppermute, ppermute_table
        result = bench_ppermute(args.sizes_mib)
        text = ppermute_table(result)
    elif args.op == "broadcast":
        from bench_broadcast import bench_broadcast, broadcast_table
        result = bench_broadcast()
        text = broadcast_table(result)
    elif args.op == "gather":
        from bench_gather import bench_gather, gather_table
        result = bench_gather()
        text = gather_table(result)
    elif args.op == "im2col":
        from bench_im2col import bench_im2col, im2col_table
        result = bench_im2col()
        text = im2col_table(result)
    else:
        from bench_copy import bench_copy, table
        result = bench_copy(args.sizes_mib)
        text = table(result)
    harness.stamp(result, args.op, gpus[0])
    harness.write_json(result, args.out)
    print(f"\n{result['device']}, {result['date']}, jax {result['jax']}")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
