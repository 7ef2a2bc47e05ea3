"""Benchmarks of jax_tma ops against the XLA formulation a user would write.
Runs against the installed jax_tma; the reference kernels come from the
benchmarks' extension _jax_tma_bench (build with JAX_TMA_BENCH=ON).

    python benchmarks/run.py all --out-dir benchmarks/results   # every op, one JSON each
    python benchmarks/run.py copy window ... [--out-dir DIR]    # some ops
    python benchmarks/run.py all --smoke [--out-dir DIR]  # the code path on the CPU, tiny sizes
    python benchmarks/run.py stamp   # benchmarks/tree_stamp.json, for a copy without .git
    python benchmarks/run.py wheel --out-dir DIR   # one gather case, against another install
    python benchmarks/run.py sanitizer --tsv FILE --out-dir DIR   # gpu_check.sh's sanitize lines

Ops: copy, window, im2col, broadcast, broadcast-ncu (DRAM bytes from ncu),
tune-bulk (the bulk pipeline-shape sweep), gather (gather and scatter),
ppermute (two GPUs; in `all` where two are visible); outside `all`: wheel
(the use case's page gather alone, which gpu_check.sh runs against the
wheel) and sanitizer (compute-sanitizer's results as a result file, from
the lines gpu_check.sh's sanitize stage writes). Each result JSON (<op>_<devices>_<date>.json)
records the commit it was measured at and refuses a dirty tree (unless
--allow-dirty, which marks it), the devices, versions and how it was timed;
benchmarks/report.py renders the README's tables from them. How cases are
timed: benchmarks/harness.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

# Under `python -P` this folder is not on sys.path; it holds only the
# benchmark modules (no jax_tma to shadow the installed one).
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import jax  # noqa: E402

import provenance  # noqa: E402
import report  # noqa: E402
from harness import MIB, Session, write_result  # noqa: E402

# Seconds each op should take on one H100 (all of them: under 10 minutes);
# a run over its budget says so.
BUDGET_S = {"copy": 60, "window": 20, "im2col": 40, "broadcast": 30, "broadcast-ncu": 30,
            "tune-bulk": 20, "gather": 120, "ppermute": 120, "wheel": 30}
# What `all` runs (wheel is for another install; sanitizer is not timed).
OPS = tuple(op for op in BUDGET_S if op != "wheel")
# What a smoke run (CPU) cannot run.
_NOT_IN_SMOKE = {"broadcast-ncu": "needs ncu and a GPU"}


def _runner(op: str, args: argparse.Namespace) -> Callable[[Session], dict[str, Any]]:
    sizes = [int(m * MIB) for m in args.sizes_mib] if args.sizes_mib else None
    if op == "copy":
        from bench_copy import bench_copy
        return lambda s: bench_copy(s, sizes)
    if op == "window":
        from bench_window import bench_window
        return bench_window
    if op == "im2col":
        from bench_im2col import bench_im2col
        return bench_im2col
    if op == "broadcast":
        from bench_broadcast import bench_broadcast
        return bench_broadcast
    if op == "broadcast-ncu":
        from bench_broadcast import bench_broadcast_ncu
        return lambda s: bench_broadcast_ncu()
    if op == "tune-bulk":
        from bench_tune_bulk import tune_bulk
        return tune_bulk
    if op == "gather":
        from bench_gather import bench_gather
        return bench_gather
    if op == "wheel":
        from bench_gather import bench_wheel
        return bench_wheel
    from bench_ppermute import bench_ppermute
    return lambda s: bench_ppermute(s, args.sizes_mib)


def _expand(ops: Sequence[str], devices: Sequence[jax.Device], smoke: bool) -> list[str]:
    wanted = [op for name in ops for op in (OPS if name == "all" else (name,))]
    out = []
    for op in dict.fromkeys(wanted):
        if smoke and op in _NOT_IN_SMOKE:
            print(f"run.py: {op} skipped in a smoke run ({_NOT_IN_SMOKE[op]})", file=sys.stderr)
        elif op == "ppermute" and len(devices) < 2:
            if "all" not in ops:
                raise SystemExit("benchmarks/run.py ppermute: needs two devices")
            print("run.py: ppermute skipped (needs two devices)", file=sys.stderr)
        else:
            out.append(op)
    return out


def _sanitizer(args: argparse.Namespace) -> int:
    """The sanitizer result file from gpu_check.sh's lines (sanitizer.py)."""
    import sanitizer

    if not args.tsv:
        print("benchmarks/run.py sanitizer: --tsv FILE is needed", file=sys.stderr)
        return 2
    with open(args.tsv) as f:
        result = sanitizer.summarize(f.read())
    gpus = [d for d in jax.devices() if d.platform == "gpu"] or jax.devices()
    try:
        result["provenance"] = provenance.collect(gpus[:1], args.allow_dirty or not args.out_dir)
    except provenance.DirtyTree as e:
        print(f"benchmarks/run.py: {e}", file=sys.stderr)
        return 3
    result["timing_method"] = "compute-sanitizer exit status and summary lines (not timed)"
    if args.out_dir:
        print(f"wrote {write_result(result, args.out_dir)}")
    print(report.render(result), flush=True)
    return 0 if result["passed"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/run.py")
    parser.add_argument("ops", nargs="+", choices=("all", "wheel") + OPS + (
        "stamp", "broadcast-once", "sanitizer"))
    parser.add_argument("--out-dir", help="write one result JSON per op here, replacing the "
                                          "op's earlier results there")
    parser.add_argument("--smoke", action="store_true",
                        help="run the code paths with tiny sizes and a wall clock (works on "
                             "the CPU; the results measure nothing)")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="measure a tree that differs from its commit (marked dirty)")
    parser.add_argument("--sizes-mib", type=float, nargs="+",
                        help="sizes for copy (bytes) and ppermute (block per device), in MiB")
    parser.add_argument("--tsv", help="sanitizer: the lines gpu_check.sh's sanitize stage wrote")
    args = parser.parse_args(argv)
    if args.ops == ["sanitizer"]:
        return _sanitizer(args)
    if args.ops == ["stamp"]:
        print(provenance.make_stamp())
        return 0
    if args.ops == ["broadcast-once"]:
        from bench_broadcast import run_once
        print("broadcast-once variants: " + json.dumps(run_once()), flush=True)
        return 0
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus and not args.smoke:
        print("benchmarks/run.py: needs a CUDA GPU (--smoke runs the code paths on the CPU "
              "with tiny sizes)", file=sys.stderr)
        return 2
    devices = gpus or jax.devices()
    ops = _expand(args.ops, devices, args.smoke)
    try:
        if args.out_dir:  # before any time is spent
            provenance.collect(devices[:1], args.allow_dirty)
        from references import load
        refs = load(args.smoke)
    except (provenance.DirtyTree, ImportError) as e:
        print(f"benchmarks/run.py: {e}", file=sys.stderr)
        return 3
    elapsed, failed = {}, []
    for op in ops:
        s = Session(args.smoke, refs)
        s.log(f"{op}: start (budget {BUDGET_S[op]} s)")
        start = time.monotonic()
        try:
            result = _runner(op, args)(s)
            used = devices[:2] if op == "ppermute" else devices[:1]
            result.update(
                timing_method="ncu" if op == "broadcast-ncu" else s.timing_method,
                checked_bit_exact=s.checked, comparator_differs=s.differs, smoke=args.smoke,
                # Printed only, a dirty tree's result is marked, not refused.
                provenance=provenance.collect(used, args.allow_dirty or not args.out_dir))
        except Exception:  # noqa: BLE001  (the other ops still run)
            traceback.print_exc()
            failed.append(op)
            continue
        elapsed[op] = result["elapsed_s"] = round(time.monotonic() - start, 1)
        if args.out_dir:
            s.log(f"{op}: wrote {write_result(result, args.out_dir)}")
        print(report.render(result), flush=True)
    print("\n== elapsed ==")
    for op, seconds in elapsed.items():
        over = "  OVER BUDGET" if seconds > BUDGET_S[op] and not args.smoke else ""
        print(f"{op:14s} {seconds:7.1f} s (budget {BUDGET_S[op]} s){over}")
    if failed:
        print(f"FAILED: {' '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
