"""Benchmarks of jax_tma ops against the XLA formulation a user would write.
Runs against the installed jax_tma; the reference kernels come from the
benchmarks' extension _jax_tma_bench (build with JAX_TMA_BENCH=ON).

    python benchmarks/run.py all --out-dir benchmarks/results   # every op, one JSON each
    python benchmarks/run.py OP ... [--out-dir DIR]    # some ops, `all`'s or others
    python benchmarks/run.py all --smoke [--out-dir DIR]  # the code path on the CPU, tiny sizes
    python benchmarks/run.py stamp   # benchmarks/tree_stamp.json, for a copy without .git
    python benchmarks/run.py sanitizer --tsv FILE --out-dir DIR   # gpu_check.sh's sanitize lines

Ops: those the bench_*.py modules list in their BENCHMARKS (harness.Benchmark:
the function, its time budget, whether `all` runs it, the devices it needs);
`all` skips one that needs more devices than are visible. Besides them:
sanitizer (compute-sanitizer's results as a result file, from the lines
gpu_check.sh's sanitize stage writes). Each result JSON (<op>_<devices>_<date>.json)
records the commit it was measured at and refuses a dirty tree (unless
--allow-dirty, which marks it), the devices, versions and how it was timed;
benchmarks/report.py renders the README's tables from them, an op's with the
render_<name>.py of its bench_<name>.py. How cases are timed:
benchmarks/harness.py.
"""

from __future__ import annotations

import argparse
import glob
import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Sequence

# Under `python -P` this folder is not on sys.path; it holds only the
# benchmark modules (no jax_tma to shadow the installed one).
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import jax  # noqa: E402

import provenance  # noqa: E402
import report  # noqa: E402
from harness import Benchmark, Session  # noqa: E402


def _collect() -> dict[str, Benchmark]:
    """Every op of the bench_*.py modules (their BENCHMARKS), by name, in
    the modules' alphabetical order."""
    ops: dict[str, Benchmark] = {}
    for path in sorted(glob.glob(os.path.join(_HERE, "bench_*.py"))):
        module = importlib.import_module(os.path.basename(path)[:-len(".py")])
        for op, bench in module.BENCHMARKS.items():
            if op in ops:
                raise RuntimeError(f"benchmarks/{os.path.basename(path)}: op {op!r} is taken")
            ops[op] = bench
    return ops


BENCHMARKS = _collect()
# What `all` runs (sanitizer is not timed and not among them), and the groups
# (harness.Benchmark.group): a name for each, its ops.
OPS = tuple(op for op, bench in BENCHMARKS.items() if bench.in_all)
GROUPS = {"all": OPS}
for _op, _bench in BENCHMARKS.items():
    if _bench.group:
        GROUPS[_bench.group] = GROUPS.get(_bench.group, ()) + (_op,)


def _expand(ops: Sequence[str], devices: Sequence[jax.Device], smoke: bool) -> list[str]:
    wanted = [op for name in ops for op in GROUPS.get(name, (name,))]
    out = []
    for op in dict.fromkeys(wanted):
        bench = BENCHMARKS[op]
        if smoke and bench.not_in_smoke:
            print(f"run.py: {op} skipped in a smoke run ({bench.not_in_smoke})", file=sys.stderr)
        elif len(devices) < bench.devices:
            if op in ops:  # asked for by name, not through a group
                raise SystemExit(f"benchmarks/run.py {op}: needs {bench.devices} devices")
            print(f"run.py: {op} skipped (needs {bench.devices} devices)", file=sys.stderr)
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
        print(f"wrote {report.write_result(result, args.out_dir)}")
    print(report.render(result), flush=True)
    return 0 if result["passed"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/run.py")
    once = {f"{op}-once": bench.once for op, bench in BENCHMARKS.items() if bench.once}
    parser.add_argument("ops", nargs="+", choices=tuple(GROUPS) + tuple(BENCHMARKS) + tuple(once)
                        + ("stamp", "sanitizer"))
    parser.add_argument("--out-dir", help="write one result JSON per op here, replacing the "
                                          "op's earlier results there")
    parser.add_argument("--smoke", action="store_true",
                        help="run the code paths with tiny sizes and a wall clock (works on "
                             "the CPU; the results measure nothing)")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="measure a tree that differs from its commit (marked dirty)")
    parser.add_argument("--sizes-mib", type=float, nargs="+",
                        help="the sizes of the ops that take them, in MiB")
    parser.add_argument("--quick", action="store_true",
                        help="a quick pass of the ops that have one (fewer sizes and "
                             "repetitions; the result records it)")
    parser.add_argument("--tsv", help="sanitizer: the lines gpu_check.sh's sanitize stage wrote")
    args = parser.parse_args(argv)
    if args.ops == ["sanitizer"]:
        return _sanitizer(args)
    if args.ops == ["stamp"]:
        print(provenance.make_stamp())
        return 0
    if len(args.ops) == 1 and args.ops[0] in once:
        print(f"{args.ops[0]} variants: " + json.dumps(once[args.ops[0]]()), flush=True)
        return 0
    if any(BENCHMARKS[op].own_processes for name in args.ops for op in GROUPS.get(name, (name,))
           if op in BENCHMARKS):
        # Before the GPUs' first use: this process takes memory as its ops need
        # it, and the ops with processes of their own run first, while it
        # holds none.
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus and not args.smoke:
        print("benchmarks/run.py: needs a CUDA GPU (--smoke runs the code paths on the CPU "
              "with tiny sizes)", file=sys.stderr)
        return 2
    devices = gpus or jax.devices()
    ops = sorted(_expand(args.ops, devices, args.smoke),
                 key=lambda op: not BENCHMARKS[op].own_processes)
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
        bench = BENCHMARKS[op]
        s.log(f"{op}: start (budget {bench.budget_s} s)")
        start = time.monotonic()
        try:
            result = bench.run(s, args)
            result.update(
                timing_method=bench.timing_method or s.timing_method,
                checked_bit_exact=s.checked, comparator_differs=s.differs, smoke=args.smoke,
                # Printed only, a dirty tree's result is marked, not refused.
                provenance=provenance.collect(
                    gpus if bench.every_device and gpus else devices[:bench.devices],
                    args.allow_dirty or not args.out_dir))
        except Exception:  # noqa: BLE001  (the other ops still run)
            traceback.print_exc()
            failed.append(op)
            continue
        elapsed[op] = result["elapsed_s"] = round(time.monotonic() - start, 1)
        if args.out_dir:
            s.log(f"{op}: wrote {report.write_result(result, args.out_dir)}")
        print(report.render(result), flush=True)
    print("\n== elapsed ==")
    for op, seconds in elapsed.items():
        budget = BENCHMARKS[op].budget_s
        over = "  OVER BUDGET" if seconds > budget and not args.smoke else ""
        print(f"{op:14s} {seconds:7.1f} s (budget {budget} s){over}")
    if failed:
        print(f"FAILED: {' '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
