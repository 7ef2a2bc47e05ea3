"""The benchmark harness's bookkeeping (no GPU needed): splitting a trace
into calls and taking each case's median over its turns. The harness lives in
benchmarks/ of the checkout, outside the installed package."""

import importlib
import os
import subprocess
import sys

import pytest

_BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "benchmarks")
if _BENCHMARKS not in sys.path:
    sys.path.insert(0, _BENCHMARKS)

import harness  # noqa: E402


def test_split_runs_cuts_at_the_largest_gaps():
    # Three calls: [0, 20) with an inner gap of 2, [100, 110), [200, 209).
    events = [(0, 10), (12, 20), (100, 110), (200, 205), (207, 209)]
    assert harness._split_runs(events, 3, busy=False) == pytest.approx([20e-9, 10e-9, 9e-9])
    # busy: the union of the activities, inner gaps and overlaps counted once
    overlapping = [(0, 10), (5, 20), (30, 40), (100, 110)]
    assert harness._split_runs(overlapping, 2, busy=True) == pytest.approx([30e-9, 10e-9])


def test_split_runs_needs_an_activity_per_call():
    with pytest.raises(RuntimeError, match="trace has 1 GPU activities for 2 calls"):
        harness._split_runs([(0, 1)], 2, busy=False)


def test_case_medians_drop_the_first_call_of_each_turn():
    plan = ["a", "a", "a", "b", "b", "b"] * 2
    runs = [99.0, 1.0, 3.0, 99.0, 5.0, 7.0, 99.0, 2.0, 4.0, 99.0, 6.0, 8.0]
    assert harness._case_medians(plan, runs, rep=3) == {"a": 2.5, "b": 6.5}
    # one call per turn: every call counts
    assert harness._case_medians(["a", "b", "a"], [1.0, 2.0, 3.0], rep=1) == {"a": 2.0, "b": 2.0}


def test_case_medians_need_a_run_per_planned_call():
    with pytest.raises(ValueError):
        harness._case_medians(["a", "a"], [1.0], rep=1)


@pytest.mark.parametrize("name", ["bench_copy", "bench_window", "bench_im2col", "bench_broadcast",
                                  "bench_ppermute", "bench_tune_bulk", "bench_gather",
                                  "plot_gather"])
def test_every_benchmark_module_imports(name):
    # Without the benchmarks' extension too: it is loaded when a benchmark runs.
    importlib.import_module(name)


def test_run_says_it_needs_a_gpu():
    run = subprocess.run([sys.executable, "-P", os.path.join(_BENCHMARKS, "run.py"), "copy"],
                         env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 2, run.stderr
    assert "benchmarks/run.py: needs a CUDA GPU" in run.stderr
