"""The benchmarks (benchmarks/ of the checkout, outside the installed
package): the harness's bookkeeping and its three clocks, a smoke run of
every benchmark's code path on the CPU rendered by report.py, the benchmark
sections of the README and docs/ against the committed results (a hand edit
fails here) and those results against the code (a change after their commit
fails here), provenance, the ncu listing parser, the sanitizer summary, the
HLO kernel count; on a GPU, the reference kernels that the copy benchmark
times jax_tma against and the fusion of XLA's decode-step gathers that
docs/ops/gather.md states."""

import glob
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_tma
from reference import (assert_bits_equal, into_poison, moe_combine_reference,
                       moe_dispatch_reference, random_array)

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_BENCHMARKS = os.path.join(_ROOT, "benchmarks")
if _BENCHMARKS not in sys.path:
    sys.path.insert(0, _BENCHMARKS)

import harness  # noqa: E402
import ncu  # noqa: E402
import pallas_kernels  # noqa: E402
import provenance  # noqa: E402
import render_gather  # noqa: E402
import report  # noqa: E402
import tables  # noqa: E402


def test_split_runs_cuts_at_the_largest_gaps():
    # Three calls: [0, 20) with an inner gap of 2, [100, 110), [200, 209).
    events = [(0, 10), (12, 20), (100, 110), (200, 205), (207, 209)]
    runs = harness._split_runs(events, 3)
    assert [s for s, _ in runs] == pytest.approx([20e-9, 10e-9, 9e-9])  # span
    assert [b for _, b in runs] == pytest.approx([18e-9, 10e-9, 7e-9])  # busy
    # busy: the union of the activities, inner gaps and overlaps counted once
    overlapping = [(0, 10), (5, 20), (30, 40), (100, 110)]
    assert [b for _, b in harness._split_runs(overlapping, 2)] == pytest.approx([30e-9, 10e-9])


def test_split_runs_needs_an_activity_per_call():
    with pytest.raises(RuntimeError, match="trace has 1 GPU activities for 2 calls"):
        harness._split_runs([(0, 1)], 2)


def test_split_calls_keeps_a_call_whole_whatever_its_idle_gaps():
    # Two calls of a case whose kernels idle 500 ns apart, then a call of one
    # kernel 20 ns after: the gap split would cut the first call in two and
    # merge the last two; the host windows keep each call whole. The
    # activity at 560 runs between windows (an untimed `before`): left out.
    events = [(10, 20), (520, 530), (560, 570), (600, 610), (1100, 1120), (1140, 1150)]
    windows = [(0, 540), (590, 1125), (1130, 1160)]
    runs = harness._split_calls(sorted(events), windows)
    assert [r[0] for r in runs] == pytest.approx([520e-9, 520e-9, 10e-9])  # span
    assert [r[1] for r in runs] == pytest.approx([20e-9, 30e-9, 10e-9])  # busy
    assert [r[2] for r in runs] == [None] * 3  # no GPU named: no launch gap
    # the gap split: the first call's first kernel alone, the last two merged
    assert [b for _, b in harness._split_runs(sorted(events), 3)] == pytest.approx(
        [10e-9, 30e-9, 30e-9])


def test_launch_gap_is_how_far_apart_the_gpus_began():
    # A call whose GPU 1 begins 300 ns after GPU 0 (its later activities do
    # not move that), then a call on one GPU alone: no gap.
    A = harness._Activity
    acts = [A(100, 150, "/device:GPU:0", "s", "k"), A(400, 900, "/device:GPU:1", "s", "k"),
            A(500, 600, "/device:GPU:0", "s", "k"), A(2000, 2100, "/device:GPU:0", "s", "k")]
    runs = harness._split_calls(acts, [(0, 1000), (1900, 2200)])
    assert runs[0] == pytest.approx((800e-9, 550e-9, 300e-9))
    assert runs[1][2] is None
    # The medians carry it where every counted call has one.
    plan = ["a", "a", "b"]
    got = harness._case_medians(plan, [(1e-6, 1e-6, 2e-6), (1e-6, 1e-6, 4e-6),
                                       (1e-6, 1e-6, None)], rep=1)
    assert got["a"]["launch_gap_us"] == pytest.approx(3.0)
    assert "launch_gap_us" not in got["b"]


def test_split_calls_needs_an_activity_in_every_window():
    with pytest.raises(RuntimeError, match="1 of 2 traced calls have no GPU activity inside "
                                          r"their window \(the first: call 1\)"):
        harness._split_calls([(5, 6)], [(0, 10), (20, 30)])


def test_timeline_is_the_call_of_median_span_activity_by_activity(monkeypatch):
    # Three traced calls of spans 30, 10 and 20 ns: the last is the median.
    # Its activities, GPU by GPU, in µs from its first one; the host window's
    # start on the same clock; an activity between windows is left out.
    A = harness._Activity
    acts = [A(10, 40, "/device:GPU:0", "Stream #1", "void ns::K<2>(int)"),
            A(100, 110, "/device:GPU:0", "Stream #1", "K"), A(150, 160, "/device:GPU:0", "S", "x"),
            A(205, 215, "/device:GPU:1", "Stream #2", "fusion"),
            A(210, 225, "/device:GPU:0", "Stream #1", "K")]
    monkeypatch.setattr(harness, "_activities", lambda d: acts)
    monkeypatch.setattr(harness, "_call_windows", lambda d: [(0, 50), (90, 120), (200, 230)])
    monkeypatch.setattr(jax.profiler, "start_trace", lambda d: None)
    monkeypatch.setattr(jax.profiler, "stop_trace", lambda: None)
    calls = []
    t = harness.Session(smoke=False, refs=None).timeline(lambda: calls.append(1), 3)
    assert len(calls) == 4  # one untraced, then the three traced
    assert t["span_us"] == pytest.approx(0.020) and t["host_window_us"] == pytest.approx(-0.005)
    assert [(a["gpu"], a["name"]) for a in t["activities"]] == [("GPU:1", "fusion"),
                                                                ("GPU:0", "K")]
    assert [x for a in t["activities"] for x in (a["start_us"], a["end_us"])] == pytest.approx(
        [0.0, 0.010, 0.005, 0.020])
    assert harness.Session(smoke=True, refs=None).timeline(lambda: None, 3) is None


def test_call_windows_are_the_host_annotations(tmp_path):
    f = jax.jit(lambda x: x + 1)
    x = jnp.arange(8)
    jax.block_until_ready(f(x))
    jax.profiler.start_trace(str(tmp_path))
    for _ in range(3):
        with jax.profiler.TraceAnnotation(harness.CALL_ANNOTATION):
            jax.block_until_ready(f(x))
    jax.block_until_ready(f(x))  # outside every window
    jax.profiler.stop_trace()
    windows = harness._call_windows(str(tmp_path))
    assert len(windows) == 3
    assert all(a < b <= c for (a, b), (c, _) in zip(windows, windows[1:]))


def test_case_medians_drop_the_first_call_of_each_turn():
    plan = ["a", "a", "a", "b", "b", "b"] * 2
    span = [99.0, 1.0, 3.0, 99.0, 5.0, 7.0, 99.0, 2.0, 4.0, 99.0, 6.0, 8.0]
    runs = [(t * 1e-6, t * 0.5e-6) for t in span]
    got = harness._case_medians(plan, runs, rep=3)
    assert got == {"a": pytest.approx({"span_us": 2.5, "busy_us": 1.25}),
                   "b": pytest.approx({"span_us": 6.5, "busy_us": 3.25})}
    # one call per turn: every call counts
    one = harness._case_medians(["a", "b", "a"], [(1e-6, 1e-6), (2e-6, 2e-6), (3e-6, 3e-6)], 1)
    assert one["a"]["span_us"] == pytest.approx(2.0)


def test_wall_clock_dispatches_a_sample_then_waits_once(monkeypatch):
    calls, waits = [], []
    monkeypatch.setattr(harness.jax, "block_until_ready", lambda x: waits.append(x) or x)
    got = harness._wall_clock({"a": lambda: calls.append("a") or 1,
                               "b": lambda: calls.append("b") or 2}, calls=3, samples=2)
    assert calls == ["a"] * 3 + ["b"] * 3 + ["a"] * 3 + ["b"] * 3  # cases take turns
    assert waits == [1, 2, 1, 2]  # one sync per sample, on its last call
    assert set(got) == {"a", "b"} and all(v >= 0 for v in got.values())


def test_session_time_gives_three_clocks_unless_told_otherwise():
    s = harness.Session(smoke=True, refs=None)
    cases = {"a": lambda: jnp.zeros(4), "b": lambda: jnp.ones(4)}
    timed = s.time(cases, rounds=2, rep=2)
    assert set(timed["cases"]["a"]) == {"busy_us", "span_us", "wall_us"}
    assert timed["protocol"]["wall"] == {"calls": 2, "samples": 2}
    for kwargs in ({"wall": False}, {"before": lambda: None, "before_name": "nothing"}):
        timed = s.time(cases, rounds=2, **kwargs)
        assert set(timed["cases"]["a"]) == {"busy_us", "span_us"}
        assert timed["protocol"]["wall"] is None


def test_a_target_needs_busy_time_and_span_to_agree():
    def row(busy, span):
        return {"times": {"auto": {"busy_us": 100.0, "span_us": 100.0},
                          "xla": {"busy_us": busy, "span_us": span}}}
    assert tables.target_met(row(120.0, 125.0), "xla", 1.2)
    assert not tables.target_met(row(130.0, 110.0), "xla", 1.2)  # span disagrees
    assert not tables.target_met(row(110.0, 130.0), "xla", 1.2)  # busy disagrees


def test_the_wall_clock_shows_from_100_us():
    assert tables.us_text({"busy_us": 99.9, "span_us": 100.0, "wall_us": 130.0}) == \
        "99.9 / 100.0 / —"
    assert tables.us_text({"busy_us": 100.0, "span_us": 100.0, "wall_us": 130.0}) == \
        "100.0 / 100.0 / 130.0"
    assert tables.us_text({"busy_us": 300.0, "span_us": 300.0}) == "300.0 / 300.0 / —"
    times = {"auto": {"busy_us": 200.0, "span_us": 210.0, "wall_us": 220.0},
             "xla": {"busy_us": 300.0, "span_us": 315.0, "wall_us": 440.0},
             "fast": {"busy_us": 50.0, "span_us": 50.0, "wall_us": 60.0}}
    assert [tables.ratio_text(times, "auto", "xla", c)
            for c in ("busy_us", "span_us", "wall_us")] == ["1.50", "1.50", "2.00"]
    assert tables.ratio_text(times, "auto", "fast", "wall_us") == "—"


def test_case_medians_need_a_run_per_planned_call():
    with pytest.raises(ValueError):
        harness._case_medians(["a", "a"], [(1.0, 1.0)], rep=1)


def test_session_check_is_bit_exact():
    s = harness.Session(smoke=True, refs=None)
    x = jnp.array([0.0, 1.0, np.nan], jnp.float32)
    s.check("same", x, x)
    # -0.0 == 0.0 as floats, not as bits
    with pytest.raises(AssertionError, match=r"case minus zero: output is not bit-exact: 1 of 3 "
                                             r"elements differ, the first at flat index 0"):
        s.check("minus zero", x.at[0].set(-0.0), x)
    with pytest.raises(AssertionError, match=r"case shape: .*got float32\[2\], want float32\[3\]"):
        s.check("shape", x[:2], x)
    # An XLA comparator that differs is recorded, not an error.
    s.check("xla", x.at[2].set(1.0), x, comparator=True)
    assert s.checked == ["same"]
    assert s.differs == {"xla": "1 of 3 elements differ, the first at flat index 2"}


_BENCH_NAMES = sorted(os.path.basename(path)[len("bench_"):-len(".py")]
                      for path in glob.glob(os.path.join(_BENCHMARKS, "bench_*.py")))


@pytest.mark.parametrize("name", [f"bench_{n}" for n in _BENCH_NAMES] + ["run"])
def test_every_benchmark_module_imports(name):
    # Without the benchmarks' extension too: it is loaded when a benchmark runs.
    importlib.import_module(name)


@pytest.mark.parametrize("name", _BENCH_NAMES)
def test_every_benchmark_module_has_its_renderers(name):
    # benchmarks/render_<name>.py renders what bench_<name>.py writes: a
    # section of each of its ops (but those report.py renders itself), and
    # headline rows and plots of those ops alone.
    bench = importlib.import_module(f"bench_{name}")
    render = importlib.import_module(f"render_{name}")
    own = set(report.RENDERERS) - {op for m in report._MODULES for op in m.RENDERERS}
    assert set(render.RENDERERS) <= set(bench.BENCHMARKS)
    missing = set(bench.BENCHMARKS) - set(render.RENDERERS) - own
    assert not missing, f"benchmarks/render_{name}.py renders no section of {sorted(missing)}"
    for entry in (*getattr(render, "HEADLINES", ()), *getattr(render, "PLOTS", ())):
        assert entry.result in render.RENDERERS, entry


def test_report_collects_a_render_module_per_benchmark_module():
    # Each render_*.py is a bench_*.py's, and the README's table of ops has
    # one row per rank.
    assert [m.__name__.removeprefix("render_") for m in report._MODULES] == _BENCH_NAMES
    ranks = [row.rank for row in report.HEADLINES]
    assert len(set(ranks)) == len(ranks), ranks


def test_every_result_is_of_a_family():
    # report.py tells a result's staleness by its family: the FAMILY of its
    # render module, or the module's name (render_<family>.py); FAMILY None
    # says every family's code (host-cost times each op's handler).
    for module in report._MODULES:
        for op in module.RENDERERS:
            if getattr(module, "FAMILY", "") is None:
                continue
            assert report.family_of(op) in report.families(), (
                f"benchmarks/{module.__name__}.py renders {op}, whose family "
                f"{report.family_of(op)!r} is not in ffi/families.inc: set FAMILY")


def test_report_needs_neither_jax_nor_jax_tma():
    # report.py, tables.py and the render modules render on any machine.
    code = ("import sys, report; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'jax_tma'}))")
    run = subprocess.run([sys.executable, "-c", code], cwd=_BENCHMARKS, capture_output=True,
                         text=True, timeout=120)
    assert (run.returncode, run.stdout) == (0, "[]\n"), run.stderr


def test_size_text_takes_the_largest_unit_reached():
    assert [tables.size_text(n) for n in (128, 1536, 32768, 1 << 20, 3 << 29, 1 << 30)] == [
        "128 B", "1.5 KiB", "32 KiB", "1 MiB", "1.5 GiB", "1 GiB"]


def _copies(compiled_text: str, shape: tuple[int, ...]) -> list[str]:
    """The copies (instructions or fusions named copy) of arrays of `shape`."""
    dims = ",".join(map(str, shape))
    return re.findall(rf"%\S*copy\S* = \w+\[{dims}\]", compiled_text)


def test_in_place_cases_update_their_donated_state():
    # The gather benchmark's in-place cases: each call donates the previous
    # call's output, and the compiled program writes into it (no copy).
    from bench_gather import _Donated, _decode_step, _set, _set_hinted, _take, _take_hinted

    table = jnp.arange(64 * 4, dtype=jnp.uint32).reshape(64, 4)
    idx, upd = jnp.array([3, 9], jnp.int32), jnp.full((2, 4), 7, jnp.uint32)
    for fn in (jax_tma.scatter, _set, pallas_kernels.scatter):
        case = _Donated(fn, table, (idx, upd))
        first = case()
        np.testing.assert_array_equal(first, table.at[idx].set(upd))
        assert not _copies(case.fn.lower(first, idx, upd).compile().as_text(), table.shape)
        case()
        assert first.is_deleted() and not table.is_deleted()
    # the decode step: pools of 8 pages of 4 tokens, two sequences of 2 pages
    pools = (table.reshape(32, 2, 4), table.reshape(32, 2, 4) + 1)
    args = (jnp.array([5, 13], jnp.int32), jnp.array([[1, 3], [2, 0]], jnp.int32),
            jnp.full((2, 2, 2, 4), 9, jnp.uint32))
    for append, take in ((jax_tma.scatter, jax_tma.gather), (_set, _take),
                         (_set_hinted, _take_hinted)):
        case = _Donated(_decode_step(append, take, 4), pools, args, split=True)
        text = case.fn.lower(case.state, *args).compile().as_text()
        assert not _copies(text, (32, 2, 4)), (append, text)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32])
def test_pallas_kernels_move_the_bits(rng, dtype):
    # The in-JAX peer of the copy, gather, scatter and broadcast benchmarks
    # (through Triton on a GPU, Pallas's interpreter on the CPU), bit for
    # bit: tables of 16 B to 2 KiB rows, counts that no block size divides
    # evenly, a broadcast along every dim. Finite floats: Pallas's
    # interpreter on jax 0.10 quiets NaNs (the benchmarks record such a
    # comparator's difference rather than fail).
    finite = np.dtype(dtype).kind == "f"
    for rows, width, count in ((512, 16, 96), (64, 512, 24)):
        x = jnp.asarray(random_array(rng, (rows, width), dtype, finite=finite))
        idx = jnp.asarray(rng.permutation(rows)[:count].astype(np.int32))
        u = jnp.asarray(random_array(rng, (count, width), dtype, finite=finite))
        assert_bits_equal(jax.jit(pallas_kernels.copy)(x), x)
        assert_bits_equal(jax.jit(pallas_kernels.gather)(x, idx), np.asarray(x)[np.asarray(idx)])
        want = np.array(x)
        want[np.asarray(idx)] = np.asarray(u)
        assert_bits_equal(jax.jit(pallas_kernels.scatter, donate_argnums=0)(jnp.copy(x), idx, u),
                          want)
    x = jnp.asarray(random_array(rng, (4, 6, 8), dtype, finite=finite))
    for axis in range(4):
        got = jax.jit(pallas_kernels.broadcast, static_argnums=(1, 2))(x, 3, axis)
        assert_bits_equal(got, np.broadcast_to(np.expand_dims(np.asarray(x), axis),
                                               x.shape[:axis] + (3,) + x.shape[axis:]))


def test_pallas_kernels_are_the_simplest_a_user_would_write():
    # Issue 44: the Pallas comparator is what a JAX user would write instead
    # of jax_tma, a few lines each, so each public kernel stays short.
    import inspect

    for name in ("copy", "gather", "scatter", "broadcast"):
        source = inspect.getsource(getattr(pallas_kernels, name))
        body = [line for line in source.split('"""')[-1].splitlines() if line.strip()]
        assert len(body) <= 12, (name, len(body))
        assert "pallas_call" in source and name in pallas_kernels.describe(name)


def test_the_ppermute_ceiling_is_peer_copies_of_the_block(monkeypatch):
    # cudaMemcpyPeerAsync of each ring pair's block bytes at once, and of the
    # first pair alone; None from the module (built before it had it), or
    # one device, is recorded as not measured.
    import types

    import bench_ppermute

    calls = []

    def peer_copy(pairs, nbytes, iters):
        calls.append((list(pairs), nbytes, iters))
        return {"us_per_copy": [10.0, 20.0][:len(pairs)], "peer_access": [True] * len(pairs),
                "queue_us": 5.0, "hold_us": 100.0}

    s = harness.Session(smoke=False, refs=types.SimpleNamespace(peer_copy=peer_copy))
    devices = [types.SimpleNamespace(id=i, local_hardware_id=3 - i) for i in range(2)]
    got = bench_ppermute.peer_ceiling(s, devices, bench_ppermute.ring(2), 1 << 20)
    assert got["pairs"] == [(3, 2), (2, 3)] and got["iters"] == 200
    assert len(calls) == 2 * bench_ppermute.CEILING_SAMPLES
    assert {len(c[0]) for c in calls} == {1, 2} and {c[1] for c in calls} == {1 << 20}
    assert got["ring"]["us"] == 20.0 and got["one_way"]["us"] == 10.0  # the slowest pair
    assert got["ring"]["gbps"] == pytest.approx((1 << 20) / 20.0 / 1e3)
    assert got["ring"]["back_to_back"] and got["one_way"]["peer_access"] == [True]
    assert bench_ppermute.ceiling_iters(1 << 30) == 4
    s.refs.peer_copy = None
    assert "no peer_copy" in bench_ppermute.peer_ceiling(s, devices, [(0, 1)], 64)["not_measured"]
    s.refs.peer_copy = peer_copy
    assert "needs two" in bench_ppermute.peer_ceiling(s, devices[:1], [(0, 0)], 64)["not_measured"]


@pytest.mark.gpu
def test_peer_copy_times_every_pair(gpu, bench_ext):
    # _jax_tma_bench.peer_copy (the ppermute benchmark's link ceiling): a
    # bad argument is a ValueError; on two GPUs, each pair's copies take
    # time and ran back to back, and the current device is as it was.
    with pytest.raises(ValueError, match="needs a device pair"):
        bench_ext.peer_copy([], 1024, 4)
    gpus = jax.devices("cuda")
    if len(gpus) < 2:
        if os.environ.get("JAX_TMA_REQUIRE_MULTI_GPU") == "1":
            pytest.fail(f"JAX_TMA_REQUIRE_MULTI_GPU=1 but only {len(gpus)} GPU(s) visible")
        pytest.skip("needs at least 2 GPUs")
    a, b = gpus[0].local_hardware_id, gpus[1].local_hardware_id
    got = bench_ext.peer_copy([(a, b), (b, a)], 4 << 20, 8)
    assert len(got["us_per_copy"]) == 2 and all(us > 0 for us in got["us_per_copy"])
    assert got["queue_us"] <= got["hold_us"]
    assert len(got["peer_access"]) == 2
    # jax_tma's ppermute still runs after it (peer access left as it was)
    mesh = jax.sharding.Mesh(np.array(gpus[:2]), ("i",))
    x = jax.device_put(jnp.arange(8, dtype=jnp.uint32),
                       jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("i")))
    f = jax.jit(jax.shard_map(lambda v: jax_tma.ppermute(v, "i", [(0, 1), (1, 0)]), mesh=mesh,
                              in_specs=jax.sharding.PartitionSpec("i"),
                              out_specs=jax.sharding.PartitionSpec("i")))
    np.testing.assert_array_equal(f(x), np.array([4, 5, 6, 7, 0, 1, 2, 3], np.uint32))


def _run_py(*args, **env):
    return subprocess.run([sys.executable, "-P", os.path.join(_BENCHMARKS, "run.py"), *args],
                          env={**os.environ, "JAX_PLATFORMS": "cpu", **env},
                          capture_output=True, text=True, timeout=600)


def test_run_says_it_needs_a_gpu():
    run = _run_py("copy")
    assert run.returncode == 2, run.stderr
    assert "benchmarks/run.py: needs a CUDA GPU (--smoke runs the code paths" in run.stderr


def test_smoke_run_of_all_and_the_wheels_case(tmp_path):
    """Every benchmark that runs on the CPU, and the wheel's case, run once
    with tiny sizes: one checked result per op, gather's cases at their
    dtypes, results that render into the pages' sections. One test (about a
    minute on 2 cores), so that parallel workers make the run once."""
    smoke = _smoke_run(tmp_path)
    _writes_one_checked_result_per_op(smoke)
    _gather_times_every_case_at_its_dtypes(smoke)
    _results_render_into_the_pages_sections(smoke)


def _smoke_run(out):
    run = _run_py("all", "wheel", "--smoke", "--allow-dirty", "--out-dir", str(out),
                  XLA_FLAGS="--xla_force_host_platform_device_count=2",
                  JAX_TMA_INSTALL="the smoke test's install")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "broadcast-ncu skipped in a smoke run" in run.stderr
    return out, report.load_results(str(out))


def test_smoke_run_of_the_multi_group(tmp_path):
    """`run.py multi`: ppermute_processes first (its two workers under
    jax.distributed, swapping blocks over the process link on the CPU),
    then ppermute; each result checked bit for bit."""
    run = _run_py("multi", "--smoke", "--allow-dirty", "--out-dir", str(tmp_path),
                  XLA_FLAGS="--xla_force_host_platform_device_count=2")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    elapsed = run.stdout.split("== elapsed ==")[1]
    assert elapsed.index("ppermute_processes") < elapsed.index("ppermute ")
    results = report.load_results(str(tmp_path))
    assert sorted(results) == ["ppermute", "ppermute_processes"]
    r = results["ppermute_processes"][1]
    assert r["checked_bit_exact"] and list(r["layouts"]) == ["shared"]
    assert r["mps"].startswith("not run") and "per_gpu" in r["not_run"]
    shared = r["layouts"]["shared"]
    assert any("blocks over the process link between 2 devices of 2 processes" in line
               for line in shared["lowerings"]), shared["lowerings"]
    assert [row["copies_per_gpu"] for row in shared["rows"]] == [2] * len(shared["rows"])
    # the link's ceiling beside ppermute: every pair at once, and one way
    for row in results["ppermute"][1]["rows"]:
        assert row["ceiling"]["ring"]["us"] > 0 and len(row["ceiling"]["pairs"]) == 2
        assert len(row["ceiling"]["one_way"]["us_per_copy"]) == 1
        assert row["auto_vs_ceiling"] > 0
    text = report.render(results["ppermute"][1])
    assert "| cudaMemcpyPeerAsync, every pair at once | cudaMemcpyPeerAsync, one way |" in text


def test_smoke_run_of_the_a2a_group(tmp_path):
    """`run.py a2a`: all_to_all_processes first (two workers under
    jax.distributed, one host device each), then all_to_all (one process,
    two host devices); every case checked, lax.ragged_all_to_all (which
    XLA:CPU lacks) timed or recorded as failed, the results rendered."""
    run = _run_py("a2a", "--smoke", "--allow-dirty", "--out-dir", str(tmp_path),
                  XLA_FLAGS="--xla_force_host_platform_device_count=2")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    elapsed = run.stdout.split("== elapsed ==")[1]
    assert elapsed.index("all_to_all_processes") < elapsed.index("all_to_all ")
    results = report.load_results(str(tmp_path))
    assert sorted(results) == ["all_to_all", "all_to_all_processes"]
    for op, (path, r) in results.items():
        assert r["smoke"] and r["dtype"] == "bfloat16" and r["n"] == 2
        assert "bytes that leave each GPU" in r["bytes_convention"]
        assert r["repetitions"] == 3 and not r["quick"]
        assert [row["buffer_bytes"] for row in r["rows"]] == [64 << 10, 256 << 10]
        for row in r["rows"]:
            # Every case timed or failed; jax_tma's never fail here.
            want = set(r["cases"]) - set(r["not_run"])
            assert set(row["times"]) | set(row["failed"]) == want, op
            assert set(row["failed"]) <= {"lax_ragged", "lax_ragged_skewed"}
            assert len(row["runs"]) == 3
            assert row["sent_bytes"]["jax_tma"] == row["buffer_bytes"] // 2
            assert row["sent_bytes"]["ceiling"] == row["buffer_bytes"] // 2
            assert row["wall_calls"] == 100
            assert {"jax_tma_vs_nccl", "jax_tma_vs_ceiling", "jax_tma_vs_composed"} <= \
                set(row["ratios"])
            assert set(row["ratios"]["jax_tma_vs_nccl"]) == {"busy", "span", "wall", "loop",
                                                             "loop_busy"}
            # Below 16 MiB, every case timed in a jitted loop of 100 calls too,
            # and the loop traced (a smoke run's trace clock: the host's).
            assert all(run["cases"][c]["loop_us"] > 0 and run["cases"][c]["loop_busy_us"] > 0
                       for run in row["runs"] for c in row["times"])
            size = f"{row['buffer_mib']:g} MiB"
            for case in ("jax_tma", "composed", "ceiling"):
                for device in (0, 1):
                    label = f"{case} {size}: device {device}"
                    assert any(c.endswith(label) for c in r["checked_bit_exact"]), label
        assert any(x.startswith("jax_tma.all_to_all: jax_tma_all_to_all") for x in r["lowerings"])
        assert not any(": lax." in x for x in r["lowerings"]), r["lowerings"]
        text = report.render(r, path)
        assert "(smoke run: measures nothing)" in text
        assert "| buffer per GPU | `jax_tma.all_to_all` | `lax.all_to_all` (NCCL) |" in text
        clocks = r" / ".join([r"[\d.]+"] * 2 + [r"[\d.—]+"] + [r"[\d.]+"] * 2)
        assert re.search(rf"\| 64 KiB \| {clocks} \|", text), text
        assert "busy / span / wall / loop / loop busy" in text
        assert "the loop busy: the GPU busy time per call of one traced run" in text
    processes = results["all_to_all_processes"][1]
    assert processes["processes"] == 2 and set(processes["rows"][0]["peer_busy_us"])
    assert any("process link between 2 devices of 2 processes" in x
               for x in processes["lowerings"])
    page = "<!-- bench:all_to_all -->\nold\n<!-- /bench:all_to_all -->\n"
    assert "| `jax_tma` vs NCCL |" in report.render_sections(page, results)


def test_the_a2a_command_line_is_run_pys(tmp_path):
    # bench_all_to_all.py as a script: run.py's options, --processes picks
    # the process mode, --quick one run per size.
    run = subprocess.run(
        [sys.executable, os.path.join(_BENCHMARKS, "bench_all_to_all.py"), "--processes",
         "--quick", "--smoke", "--allow-dirty", "--sizes-mib", "0.0625", "--out-dir",
         str(tmp_path)], env={**os.environ, "JAX_PLATFORMS": "cpu",
                              "XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (_, r), = report.load_results(str(tmp_path)).values()
    assert r["op"] == "all_to_all_processes" and r["quick"] and r["repetitions"] == 1
    assert [len(row["runs"]) for row in r["rows"]] == [1]


# The in-process runs of the exchanges' benchmarks take the default backend's
# devices and need two: the host devices on the CPU (conftest.py), or two
# GPUs; a machine of one GPU has one (gpu_check.sh multi times them on two).
_two_devices = pytest.mark.skipif(len(jax.devices()) < 2,
                                  reason="the exchanges' benchmarks run over two devices")


def _ragged_by_gathers(operand, output, input_offsets, send_sizes, output_offsets,
                       recv_sizes, *, axis_name, wrong=False):
    """lax.ragged_all_to_all's result from all_gathers of the bits (XLA:CPU
    has no ragged-all-to-all, and its collectives of bf16 drop NaN
    payloads): jax_tma.ragged_all_to_all's stand-in. `wrong`: one row off."""
    from jax import lax

    bits = lax.bitcast_convert_type(operand, jnp.uint16)
    everyone = [lax.all_gather(a, axis_name) for a in (bits, input_offsets, send_sizes,
                                                       output_offsets)]
    ops, starts, sizes, dsts = everyone
    me = lax.axis_index(axis_name)
    rows = jnp.arange(output.shape[0])
    out = lax.bitcast_convert_type(output, jnp.uint16)
    for s in range(ops.shape[0]):
        start, size, dst = starts[s, me], sizes[s, me], dsts[s, me] + int(wrong)
        take = (rows >= dst) & (rows < dst + size)
        source = jnp.clip(rows - dst + start, 0, operand.shape[0] - 1)
        out = jnp.where(take[:, None], ops[s][source], out)
    return lax.bitcast_convert_type(out, operand.dtype)


@_two_devices
def test_a2a_times_jax_tmas_ragged_all_to_all_where_it_exists(monkeypatch):
    import bench_all_to_all
    import render_all_to_all

    monkeypatch.setattr(jax_tma, "ragged_all_to_all", _ragged_by_gathers, raising=False)
    s = harness.Session(smoke=True, refs=None)
    r = bench_all_to_all.bench_all_to_all(s, [1 / 16], quick=True)
    (row,) = r["rows"]
    assert not r["not_run"] and {"ragged", "ragged_skewed"} <= set(row["times"])
    for case in ("ragged", "ragged_skewed"):
        assert f"{case} 0.0625 MiB: device 1" in s.checked
    assert row["sent_bytes"]["ragged_skewed"] == row["buffer_bytes"] * 3 // 4
    assert row["skewed_sizes"] == [[2, 6], [6, 2]]
    assert {"ragged_vs_jax_tma", "ragged_vs_nccl", "ragged_skewed_vs_ceiling"} <= \
        set(row["ratios"])
    text = render_all_to_all.render_all_to_all(r)
    assert "`jax_tma.ragged_all_to_all`, skewed" in text and "ragged vs `jax_tma.all_to_all`" \
        in text


@_two_devices
def test_a2a_fails_on_a_wrong_ragged_and_records_one_that_raises(monkeypatch):
    import functools

    import bench_all_to_all

    monkeypatch.setattr(jax_tma, "ragged_all_to_all",
                        functools.partial(_ragged_by_gathers, wrong=True), raising=False)
    with pytest.raises(AssertionError, match=r"benchmark case ragged 0.0625 MiB: device 0: "
                                             r"output is not bit-exact"):
        bench_all_to_all.bench_all_to_all(harness.Session(smoke=True, refs=None), [1 / 16],
                                          quick=True)

    def raises(*args, **kwargs):
        raise NotImplementedError("not on this platform")

    monkeypatch.setattr(jax_tma, "ragged_all_to_all", raises)
    r = bench_all_to_all.bench_all_to_all(harness.Session(smoke=True, refs=None), [1 / 16],
                                          quick=True)
    assert r["rows"][0]["failed"]["ragged"] == "NotImplementedError: not on this platform"
    assert "ragged" not in r["rows"][0]["times"]


def test_a2a_ragged_plans_and_references():
    import bench_all_to_all as a2a

    assert a2a.skewed_sizes(2, 8).tolist() == [[2, 6], [6, 2]]
    four = a2a.skewed_sizes(4, 32)
    assert four.sum(axis=1).tolist() == [32] * 4 and [four[i, (i + 1) % 4] for i in range(4)] \
        == [24] * 4
    assert a2a.output_rows(four) == 32 and four.sum(axis=0).tolist() == [32] * 4
    starts, sizes, dsts, recv = a2a.ragged_operands(np.array([[1, 3], [2, 2]]))
    assert starts.tolist() == [[0, 1], [0, 2]] and dsts.tolist() == [[0, 0], [1, 3]]
    assert recv.tolist() == [[1, 2], [3, 2]]
    blocks = [np.arange(8 * 2, dtype=np.uint16).reshape(8, 2) + 100 * p for p in range(2)]
    equal = a2a.equal_sizes(2, 8)
    for p in range(2):
        np.testing.assert_array_equal(
            a2a.ragged_reference(blocks, equal, p, np.zeros((8, 2), np.uint16)),
            a2a.all_to_all_reference(blocks, p))
    got = a2a.ragged_reference(blocks, np.array([[1, 3], [2, 2]]), 1,
                               np.full((5, 2), 7, np.uint16))
    # position 1 gets rows 1-3 of block 0, then rows 2-3 of block 1
    np.testing.assert_array_equal(got, np.concatenate([blocks[0][1:4], blocks[1][2:4]]))
    assert a2a.wall_calls(1 << 20) == 100 and a2a.wall_calls(16 << 20) == 20


def test_smoke_run_of_the_ep_group(tmp_path):
    """`run.py ep`: moe_processes first (two workers under jax.distributed,
    one host device each), then moe (one process, two host devices): every
    shape, every case checked bit for bit on each device or recorded as
    failed (the lax.ragged_all_to_all route: XLA:CPU has no
    ragged-all-to-all), the loop clock at the decode shape, the results
    rendered with the targets."""
    import bench_moe

    run = _run_py("ep", "--smoke", "--allow-dirty", "--out-dir", str(tmp_path),
                  XLA_FLAGS="--xla_force_host_platform_device_count=2")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    elapsed = run.stdout.split("== elapsed ==")[1]
    assert elapsed.index("moe_processes") < elapsed.index("moe ")
    results = report.load_results(str(tmp_path))
    assert sorted(results) == ["moe", "moe_processes"]
    for op, (path, r) in results.items():
        assert r["smoke"] and r["dtype"] == "bfloat16" and r["n"] == 2
        assert "as DeepEP counts them" in r["bytes_convention"]
        assert r["repetitions"] == 3 and not r["quick"]
        assert [row["shape"] for row in r["rows"]] == ["deepep", "decode"]
        assert [row["experts"] for row in r["rows"]] == [32, 32]
        for row in r["rows"]:
            assert set(row["times"]) | set(row["failed"]) == set(bench_moe.CASES), op
            assert set(row["failed"]) == set(bench_moe.SPARSE), op
            assert len(row["runs"]) == 3 and row["sparse_run"] is None
            token = row["hidden"] * 2
            assert row["deepep_bytes"]["dispatch"] == sum(row["recv_pairs"]) / 2 * token
            assert row["deepep_bytes"]["pair"] == 2 * row["deepep_bytes"]["combine"]
            assert row["deepep_bytes"]["a2a"] == 2 * row["tokens"] * token
            assert {"dispatch_vs_dense_dispatch", "dispatch_vs_a2a"} <= set(row["ratios"])
            assert set(row["ratios"]["dispatch_vs_a2a"]) == {"busy", "span", "wall", "loop",
                                                             "loop_busy"}
            looped = row["shape"] == "decode"
            assert set(row["loop_us"]) == (set(row["times"]) if looped else set())
            assert set(row["loop_busy_us"]) == set(row["loop_us"])
            assert all(((row["times"][c]["loop_us"] or 0) > 0) == looped
                       and ((row["times"][c]["loop_busy_us"] or 0) > 0) == looped
                       for c in row["times"])
            for case in bench_moe.CASES[:7]:
                for device in (0, 1):
                    label = f"{case} {row['shape']}: device {device}"
                    assert any(c.endswith(label) for c in r["checked_bit_exact"]), label
            assert not r["comparator_differs"]
        assert any(x.startswith("jax_tma.ragged_all_to_all: jax_tma_ragged_all_to_all")
                   for x in r["lowerings"]), r["lowerings"]
        assert not any(": lax." in x for x in r["lowerings"]), r["lowerings"]
        text = report.render(r, path)
        assert "(smoke run: measures nothing)" in text
        assert "| case | µs per call | GB/s per GPU (DeepEP's count) | NVLink per GPU |" in text
        assert re.search(r"\| `moe_dispatch` \| [\d.]+ / [\d.]+ / [\d.—]+ / — / — \|",
                         text), text
        assert "busy / span / wall / loop / loop busy" in text
        assert "`lax.ragged_all_to_all` route: dispatch failed (deepep, decode)" \
            in text
    processes = results["moe_processes"][1]
    assert processes["processes"] == 2 and set(processes["rows"][0]["peer_busy_us"])
    assert any("process link between 2 devices of 2 processes" in x
               for x in processes["lowerings"])
    page = "".join(f"<!-- bench:{s} -->\nold\n<!-- /bench:{s} -->\n"
                   for s in ("moe", "moe-targets"))
    text = report.render_sections(page, results)
    assert "| target | mode | measured (busy / span) | met |" in text
    assert "| dispatch ≥ 300 GB/s per GPU at DeepEP's shape" in text
    assert "one process per GPU, 2 × cpu (" in text and "old" not in text


def test_all_to_all_targets_say_where_50x_lax_asks_for_more_than_the_link():
    # The committed 4-GPU results: lax.ragged_all_to_all runs at about 8 GB/s
    # there, so 50x it asks for more than NVLink carries at every size from
    # 16 MiB; with lax's ten times slower the sentence goes.
    import copy

    import render_all_to_all

    results = report.load_results(os.path.join(_BENCHMARKS, "results"))
    if "all_to_all@4x-h200" not in results or "all_to_all_processes@4x-h200" not in results:
        pytest.skip("no 4-GPU all_to_all results committed")
    text = render_all_to_all.render_targets(results, suffix="@4x-h200")
    assert "a target beyond the link, so the measured ratio is the answer" in text
    assert f"above the {render_all_to_all.LINK_GBPS} GB/s that NVLink carries" in text
    slower = copy.deepcopy(results)
    for row in slower["all_to_all@4x-h200"][1]["rows"]:
        row["gbps"]["lax_ragged"]["span"] /= 10
    assert "beyond the link" not in render_all_to_all.render_targets(slower, suffix="@4x-h200")


def test_a_timeline_renders_a_line_a_gpu_with_short_names():
    import render_moe
    from tables import short_name, timeline_lines

    assert short_name("void jax_tma::PeerInboxExchangeKernel<8, (bool)1>(Params)") \
        == "PeerInboxExchangeKernel"
    assert short_name("loop_fusion_3") == "loop_fusion_3"
    assert short_name("jax_tma::(anonymous namespace)::PeerPullCopyKernel(jax_tma::PeerLegs,"
                      " jax_tma::PeerPullRows)") == "PeerPullCopyKernel"
    acts = [{"gpu": "GPU:1", "stream": "s", "name": "f", "start_us": 1.0, "end_us": 3.0},
            {"gpu": "GPU:0", "stream": "s", "name": "void a::K<1>(int)", "start_us": 0.0,
             "end_us": 2.5}, {"gpu": "GPU:0", "stream": "s", "name": "g", "start_us": 4.0,
                              "end_us": 5.25}]
    t = {"span_us": 5.25, "host_window_us": -12.3, "activities": acts}
    lines = timeline_lines({"dispatch": t}, render_moe.LABELS)
    assert lines[1].startswith("One call of `moe_dispatch`, of median span (5.2 µs)")
    assert "activity by activity (µs" in lines[1]
    assert "the host's call began at -12.3" in lines[1]
    assert lines[3:] == ["- GPU:0: K 0.0–2.5, g 4.0–5.2", "- GPU:1: f 1.0–3.0"]
    assert timeline_lines({}, render_moe.LABELS) == timeline_lines(None, {}) == []
    # A process's own GPU (processes.WorkerSession), and a size after the label.
    lines = timeline_lines({"nccl": dict(t, own_gpu=True)}, {"nccl": "NCCL"}, " of 16 MiB")
    assert lines[1].startswith("One call of NCCL of 16 MiB, of median span")
    assert "activity by activity on this process's own GPU (a process traces its own" in lines[1]


@_two_devices
def test_moe_overlap_checks_and_times_every_case_and_renders_what_each_hid():
    """The overlap benchmark on two host devices (a smoke run): every case
    checked against the serial one (the GEMM's product, the dispatch's
    received rows and sizes), timed, what each pair hid by span and wall;
    the GEMM's stream annotation reaches the compiled program; the section
    renders a row a case. A trace by stream needs a GPU (none here)."""
    import bench_moe_overlap
    import render_moe_overlap

    s = harness.Session(smoke=True, refs=None)
    r = bench_moe_overlap.bench_moe_overlap(s, quick=True)
    (row,) = r["rows"]
    cases = bench_moe_overlap.case_names(bench_moe_overlap.SMOKE_BUDGETS)
    assert r["cases"] == list(cases) == ["gemm", "dispatch", "serial", "stream", "stream_sms2",
                                         "stream_no_graphs", "stream_no_graphs_lhs"]
    assert set(s.checked) == set(cases) and not s.differs
    assert set(row["times"]) == set(cases) and set(row["hid"]) == set(cases[2:])
    t = row["times"]
    for case in cases[2:]:
        assert row["hid"][case]["span"]["us"] == pytest.approx(
            t["gemm"]["span_us"] + t["dispatch"]["span_us"] - t[case]["span_us"])
    assert row["gemm_on_its_stream"]
    assert row["streams"] == {c: {} for c in ("serial", "stream", "stream_no_graphs",
                                              "stream_no_graphs_lhs")}
    text = render_moe_overlap.render_moe_overlap(r)
    assert "| as above, `num_sms=2` |" in text and "keeps its stream annotation" in text
    assert "| both, the GEMM under `compute_on(\"gpu_stream:1\")`, XLA's command buffers off |" in text
    assert "| as above, with XLA's latency-hiding scheduler |" in text
    assert len(re.findall(r"^\| ", text, re.M)) == 1 + len(cases)  # the header, a row a case


@_two_devices
def test_moe_overlap_records_the_cases_that_raise_and_times_the_others(monkeypatch):
    """Where XLA refuses the GEMM's stream (here: compute_on raises), the
    cases that hold it are recorded as failed with what they raised, and the
    others are checked, timed and rendered."""
    import bench_moe_overlap
    import render_moe_overlap

    def refused(**_):
        def wrap(f):
            def call(*args):
                raise RuntimeError("no stream here")
            return call
        return wrap

    monkeypatch.setattr(bench_moe_overlap, "compute_on", refused)
    s = harness.Session(smoke=True, refs=None)
    (row,) = bench_moe_overlap.bench_moe_overlap(s, quick=True)["rows"]
    assert row["failed"] == {c: "RuntimeError: no stream here"
                             for c in ("stream", "stream_sms2", "stream_no_graphs",
                                       "stream_no_graphs_lhs")}
    assert set(row["times"]) == set(s.checked) == {"gemm", "dispatch", "serial"}
    assert row["gemm_on_its_stream"] is None and set(row["streams"]) == {"serial"}
    r = {"n": 2, "devices": ["cpu"] * 2, "dtype": "bfloat16", "repetitions": 1,
         "hid_rule": "…", "cases": ["gemm", "dispatch", "serial", "stream", "stream_sms2"],
         "rows": [row]}
    text = render_moe_overlap.render_moe_overlap(r)
    assert "| as above, `num_sms=2` | failed: RuntimeError: no stream here | — | — |" in text
    assert "the GEMM did not run (the table says why)" in text


def test_small_sizes_give_each_clock_and_the_target_they_all_reach():
    import render_all_to_all

    def row(mib, busy, span, loop):
        return {"buffer_bytes": int(mib * render_all_to_all.MIB),
                "ratios": {"jax_tma_vs_nccl": {"busy": busy, "span": span, "loop": loop}}}

    text = render_all_to_all._small_verdicts([
        row(0.0625, 1.56, 1.56, 2.17), row(1, 1.38, 1.38, 1.76), row(4, 1.2, 1.1, 1.3),
        row(0.0625, 0.9, 1.2, 2.0), row(1, 1.6, 1.6, None)])
    assert text == ("64 KiB 1.56 / 1.56 / 2.17× (≥ 1.5×: met), "
                    "1 MiB 1.38 / 1.38 / 1.76× (≥ 1.0×, not 1.5×), "
                    "4 MiB 1.20 / 1.10 / 1.30× (≥ 1.0×: met), "
                    "64 KiB 0.90 / 1.20 / 2.00× (not ≥ 1.0×) and "
                    "1 MiB 1.60 / 1.60 / —×"), text


def test_the_launch_case_bounds_any_exchange_by_span_in_one_process():
    # `launch` (no exchange, one kernel a GPU) spans at least the launches'
    # distance: NCCL's span over it bounds any exchange's ratio by span, and
    # where that bound is under the small-size target up to 1 MiB, the text
    # says the target is above the floor; rows without the case say nothing.
    import render_all_to_all

    def row(mib, nccl, launch):
        times = {"nccl": {"span_us": nccl}}
        if launch is not None:
            times["launch"] = {"span_us": launch}
        return {"buffer_bytes": int(mib * render_all_to_all.MIB), "times": times}

    text = render_all_to_all._launch_floor([row(0.0625, 13.0, 10.0), row(1, 17.6, 12.8)])
    assert "spans 10.0 and 12.8 µs" in text and "1.30 and 1.38× NCCL by span" in text, text
    assert "target by span (and so by every clock together) in one process is above" in text
    close = render_all_to_all._launch_floor([row(0.0625, 13.0, 8.0), row(1, 17.6, 12.8)])
    assert "1.62 and 1.38×" in close and "is above" not in close, close
    assert render_all_to_all._launch_floor([row(1, 17.6, None)]) == ""


def test_targets_give_the_single_calls_launch_gaps_where_a_result_has_them():
    # The committed 2 x H200 results, their one-process rows given launch
    # gaps as Session.time now records them: the small sizes' account and the
    # decode target name them; without them the text stays as it was.
    import copy

    import render_all_to_all
    import render_moe

    results = report.load_results(os.path.join(_BENCHMARKS, "results"))
    keys = ("all_to_all@2x-h200", "all_to_all_processes@2x-h200", "moe")
    if not all(k in results for k in keys):
        pytest.skip("no 2 x H200 all_to_all and moe results committed")
    gapped = copy.deepcopy(results)
    for row in gapped["all_to_all@2x-h200"][1]["rows"]:
        row["launch_gap_us"] = {"jax_tma": 7.25, "nccl": 2.5}
    for row in gapped["moe"][1]["rows"]:
        row["launch_gap_us"] = {"dispatch": 11.0, "a2a": 6.0}
    text = render_all_to_all.render_targets(gapped, suffix="@2x-h200",
                                            small_why=render_all_to_all._inbox)
    assert ("A single call's GPUs began their first kernels 7.2 and 7.2 µs apart (2.5 and 2.5 "
            "for NCCL's; medians)") in text, text
    gapless = copy.deepcopy(results)
    for row in gapless["all_to_all@2x-h200"][1]["rows"]:
        row.pop("launch_gap_us", None)
    assert "first kernels" not in render_all_to_all.render_targets(
        gapless, suffix="@2x-h200", small_why=render_all_to_all._inbox)
    moe = render_moe.render_targets({"moe": gapped["moe"]})
    assert re.search(r"`moe_dispatch` [\d.]+ µs by span, [\d.]+ by the loop clock, its GPUs' "
                     r"launches 11\.0 µs apart, `jax_tma.all_to_all` of n·T rows [\d.]+ µs by "
                     r"span, [\d.]+ by the loop clock, its GPUs' launches 6\.0 µs apart", moe), moe


@_two_devices
def test_moe_times_the_lax_route_where_it_runs(monkeypatch):
    # XLA:CPU has no ragged-all-to-all: jax_tma.ragged_all_to_all, its bit-exact
    # twin, stands in, so that the route's sort, offsets and permutes run and
    # are checked against the contract; a wrong one is recorded, not fatal.
    import bench_moe
    import render_moe

    monkeypatch.setattr(bench_moe, "lax_ragged_all_to_all", jax_tma.ragged_all_to_all)
    monkeypatch.setattr(bench_moe, "SMOKE_SHAPES", bench_moe.SMOKE_SHAPES[-1:])  # decode
    s = harness.Session(smoke=True, refs=None)
    r = bench_moe.bench_moe(s, quick=True)
    (row,) = r["rows"]
    assert not row["failed"] and set(row["times"]) == set(bench_moe.CASES)
    assert set(row["sparse_run"]["cases"]) == set(bench_moe.SPARSE)
    assert row["sparse_run"]["protocol"]["wall"] is None
    assert row["sparse_run"]["protocol"]["counted_calls_per_case"] == bench_moe.SPARSE_ROUNDS
    assert set(row["loop_us"]) == set(bench_moe.CASES)
    for case in bench_moe.SPARSE:
        for device in (0, 1):
            assert f"{case} decode: device {device}" in s.checked
    assert not s.differs
    assert row["link_bytes"]["lax_dispatch"] == sum(row["link_choices"]) / 2 * row["hidden"] * 2
    assert {"dispatch_vs_lax_dispatch", "combine_vs_lax_combine", "pair_vs_lax_pair"} <= \
        set(row["ratios"])
    text = render_moe.render_moe(r)
    assert "both vs the `lax.ragged_all_to_all` route" in text and "failed" not in text
    targets = render_moe.render_targets({"moe": ("moe.json", r)})
    assert re.search(r"\| decode dispatch's span ≤ 2× one `jax_tma.all_to_all` of the same "
                     r"bytes \| one process, 2 × \S+ \(\S+\) \| [\d.]+ / [\d.]+× "
                     r"\(`moe_dispatch` [\d.]+ µs by span, [\d.]+ by the loop clock, "
                     r"`jax_tma.all_to_all` of n·T rows [\d.]+ µs by span, [\d.]+ by the loop "
                     r"clock\) \| (✓|✗) \|", targets), targets
    assert ("| dispatch ≥ 50× the `lax.ragged_all_to_all` route (deepep) | one process, "
            "2 × cpu (?) | — / —× | ✗ |") in targets  # no such shape in this result

    right = bench_moe.expert_major
    monkeypatch.setattr(bench_moe, "expert_major", lambda here, rows: right(here, rows)[::-1])
    s = harness.Session(smoke=True, refs=None)
    bench_moe.bench_moe(s, quick=True)
    assert {"lax_dispatch decode: device 0", "lax_pair decode: device 1"} <= set(s.differs)


def test_moe_references_are_the_contract():
    # What bench_moe checks every case against, made on one device from every
    # position's inputs, is tests/reference.py's contract of moe_dispatch and
    # moe_combine (the experts adding their shift), and the dense route's
    # buffer holds each expert's rows in its slots.
    import bench_moe

    n, shape = 2, bench_moe.Shape("t", 6, 16, 3, 8, False, "")
    tokens, k, experts, local = shape.tokens, shape.k, shape.experts, shape.local(2)
    cpu = jax.devices()[0]
    ids = np.stack([bench_moe.routing(shape, p) for p in range(n)])
    assert all(len(set(row)) == k for row in ids.reshape(-1, k))  # distinct experts
    xs = np.stack([np.asarray(bench_moe.tokens(cpu, shape, 7, p)) for p in range(n)])
    w = np.stack([bench_moe.weights(shape, 7, p) for p in range(n)])
    want, sizes, _, placed = moe_dispatch_reference(xs.reshape(n * tokens, -1),
                                                    ids.reshape(n * tokens, k), n, experts)
    rows = n * tokens * k
    y = np.zeros((n * rows, shape.hidden), np.float32)
    for p in range(n):
        recv, group_sizes = bench_moe.reference_recv(xs, ids, p, local)
        assert_bits_equal(np.asarray(recv)[:len(want[p])], want[p])
        assert not np.asarray(recv, np.float32)[len(want[p]):].any()
        np.testing.assert_array_equal(group_sizes, sizes[p])
        expert = np.repeat(np.arange(local) + p * local, sizes[p])
        y[p * rows:p * rows + len(want[p])] = want[p].astype(np.float32) + expert[:, None] % 5 - 2
        capacity = 3
        dense = np.asarray(bench_moe.reference_dense(xs, ids, p, local, capacity), np.float32)
        dense = dense.reshape(n, local, capacity, -1)
        for s in range(n):
            for e in range(local):
                hits = np.argwhere(ids[s] == p * local + e)[:capacity]  # (token, choice) order
                np.testing.assert_array_equal(dense[s, e, :len(hits)], xs[s][hits[:, 0]])
                assert not dense[s, e, len(hits):].any()
    combined = moe_combine_reference(y.astype(xs.dtype), w.reshape(n * tokens, k), placed, n)
    got = np.concatenate([bench_moe.reference_combine(xs[p], ids[p], w[p]) for p in range(n)])
    assert_bits_equal(got, combined)
    assert_bits_equal(np.concatenate([bench_moe.reference_pair(xs[p], w[p]) for p in range(n)]),
                      (xs.reshape(n * tokens, -1).astype(np.float32)
                       * w.reshape(n * tokens, k).sum(1)[:, None]).astype(xs.dtype))


def test_moe_routes_permutes_and_counts():
    import bench_moe

    rng = np.random.default_rng(0)
    for n, local in ((2, 3), (4, 1), (3, 4)):
        here = jnp.asarray(rng.integers(0, 4, (n, local)), jnp.int32)
        total, rows = int(here.sum()), int(here.sum()) + 5
        to_expert = np.asarray(bench_moe.expert_major(here, rows))
        to_source = np.asarray(bench_moe.source_major(here, rows))
        assert sorted(to_expert[:total]) == list(range(total)) and (to_expert[total:] == rows).all()
        np.testing.assert_array_equal(to_source[to_expert[:total]], np.arange(total))
        # expert-major: expert by expert, each its sources' rows in source order
        at = np.concatenate([[0], np.cumsum(np.asarray(here).reshape(-1))])
        order = [r for e in range(local) for s in range(n)
                 for r in range(at[s * local + e], at[s * local + e + 1])]
        assert to_expert[:total].tolist() == order
    # Two devices, two experts each: what a routing sends and receives.
    shape = bench_moe.Shape("t", 2, 8, 2, 4, False, "")
    c = bench_moe.counts(shape, [np.array([[0, 1], [0, 2]]), np.array([[3, 2], [1, 3]])])
    assert c == {"recv_pairs": [3, 3], "link_pairs": [1, 1], "recv_choices": [4, 4],
                 "link_choices": [1, 1], "capacity": 2}
    deepep, link = bench_moe.nbytes(shape, 2, c)
    assert deepep["dispatch"] == 3 * 16 and deepep["pair"] == 6 * 16 and deepep["a2a"] == 4 * 16
    assert link["dispatch"] == 32 and link["combine"] == 8 + 16  # (16 B + 2 slots) padded; w out
    assert link["dense_dispatch"] == 2 * 2 * 16 and link["lax_pair"] == 2 * 16


def test_the_moe_command_line_is_run_pys(monkeypatch):
    # bench_moe.py as a script: run.py's options, --processes picks the process mode.
    import bench_moe
    import run

    seen = []
    monkeypatch.setattr(run, "main", lambda argv: seen.append(argv) or 0)
    assert bench_moe.main(["--processes", "--quick", "--smoke"]) == 0
    assert bench_moe.main(["--out-dir", "x"]) == 0
    assert seen == [["moe_processes", "--quick", "--smoke"], ["moe", "--out-dir", "x"]]


def test_smoke_run_of_the_host_cost(tmp_path):
    """`run.py host-cost`: a worker process per flag setting (XLA:CPU takes
    the GPU flags), every op's chain checked bit for bit, its wall clock per
    call and its gap over the minimal kernel; the section renders."""
    run = _run_py("host-cost", "--smoke", "--allow-dirty", "--out-dir", str(tmp_path))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = report.load_results(str(tmp_path))
    assert list(results) == ["host-cost"]
    r = results["host-cost"][1]
    assert r["smoke"] and r["target_gap_us"] == 0.1 and r["minimal"] == "minimal_ffi"
    assert list(r["settings"]) == ["default", "command_buffers"]
    assert r["settings"]["default"]["xla_flags"] == ""
    assert "--xla_gpu_graph_min_graph_size=1" in r["settings"]["command_buffers"]["xla_flags"]
    for name, setting in r["settings"].items():
        assert setting["protocol"]["wall"]["samples"] >= 2
        assert list(setting["cases"]) == list(r["cases_described"])
        minimal = setting["cases"]["minimal_ffi"]["wall_us"]
        for case, c in setting["cases"].items():
            assert c["wall_us"] > 0 and c["launches"] is None  # no trace on the CPU
            assert c["gap_us"] == pytest.approx(c["wall_us"] - minimal)
            assert c["target_met"] == (c["gap_us"] <= 0.1)
            assert f"{name}: {r['chain_ops']} chained {case}" in r["checked_bit_exact"]
    text = report.render(r)
    assert "| op | launches | default flags: wall µs | gap µs | met | span µs |" in text
    assert "| minimal_ffi (minimal) | — |" in text


def test_ppermute_processes_sets_no_one_gpu_ceiling_beside_blocks_across_gpus():
    """A layout on one GPU has cudaMemcpyAsync as its ceiling; per_gpu's blocks
    cross the link between two GPUs, so its table has NCCL alone beside it."""
    import render_ppermute_processes

    row = {"block_mib": 1.0, "auto_gbps": 88.6, "push_gbps": 89.5, "pull_gbps": 87.8,
           "memcpy_gbps": 963.8, "auto_vs_memcpy": 0.09}
    host = {"block_bytes": 65536, "cases": {"auto": {"span_us": 40.0, "wall_us": 50.0}}}
    layout = {"devices": ["NVIDIA H200"], "lowerings": [], "untraced": {}, "host_time": host}
    r = {"perm": [[0, 1], [1, 0]], "chain": 8, "mps": "ran", "not_run": {},
         "sizes_left_out": {}, "in_process_host_time": None,
         "layouts": {"shared_mps": {**layout, "rows": [row]},
                     "per_gpu": {**layout, "rows": [{**row, "nccl_us": 25.6, "nccl_gbps": 40.9,
                                                     "auto_vs_nccl": 2.17}]}}}
    text = render_ppermute_processes.render_ppermute_processes(r)
    shared, per_gpu = text.split("`per_gpu`, one GPU each")
    assert "| 1 MiB | 88.6 | 89.5 | 87.8 | 963.8 | 0.09× |" in shared
    assert "| 1 MiB | 88.6 | 89.5 | 87.8 | 40.9 | 2.17× |" in per_gpu
    assert "`cudaMemcpyAsync` within one GPU's memory is no ceiling" in per_gpu
    assert "963.8" not in per_gpu.split("Host time")[0]


def _writes_one_checked_result_per_op(smoke_results):
    # What the smoke run asked for ("all" and "wheel") that the CPU and its
    # 2 host devices can run.
    run = importlib.import_module("run")
    asked = [op for op, bench in run.BENCHMARKS.items()
             if (op in run.GROUPS["all"] or op == "wheel") and not bench.not_in_smoke
             and bench.devices <= 2]
    out, results = smoke_results
    assert sorted(results) == sorted(asked)
    for op, (path, r) in results.items():
        assert os.path.basename(path).startswith(f"{op}_"), path
        assert r["smoke"] and r["timing_method"].startswith("smoke:")
        assert r["bytes_convention"] and r["checked_bit_exact"], op
        prov = r["provenance"]
        assert prov["date"][:10] in path and prov["versions"]["jax"] == jax.__version__
        assert prov["device_tag"] == ("2x-cpu" if run.BENCHMARKS[op].devices == 2 else "cpu")
        assert prov["jax_tma"]["build_info"]["ffi_api_version"]
        assert prov["install"] == "the smoke test's install"
    window = results["window"][1]["rows"]
    # the path auto ran (on the CPU, the host copy of every method)
    assert [r["auto_path"] for r in window] == ["window.cpu"] * 5 + ["copy.cpu"] + \
        ["window.cpu"] * 5 + ["copy.cpu"]
    assert "tma" not in window[3]["times"]  # x[::2, ::2] has no tensor-map form
    assert [r["dtype"] for r in window] == ["float32"] * 6 + ["bfloat16"] * 6
    copy = results["copy"][1]["rows"]
    assert [(r["bytes"], r["dtype"]) for r in copy] == [
        (64 << 10, "uint32"), (256 << 10, "uint32"), (64 << 10, "bfloat16")]
    assert "wall_us" in copy[0]["repeat"]["auto"]
    assert "wall_us" not in copy[0]["after_write"]["auto"]  # a write runs before each call
    assert [r["dtype"] for r in results["im2col"][1]["rows"]] == ["bfloat16", "float32"]
    assert [r["dtype"] for r in results["broadcast"][1]["rows"]] == [
        "bfloat16", "float32", "bfloat16"]
    # Issue 44: the simplest Pallas kernel beside every copy and broadcast
    # case, checked bit for bit; the convolution through im2col and a GEMM
    # against cuDNN's and slice-and-concatenate's GEMM.
    assert all("pallas" in row[regime] for row in copy for regime in ("repeat", "after_write"))
    assert all("pallas" in row["times"] and row["auto_vs_pallas"] > 0
               for row in results["broadcast"][1]["rows"])
    assert sum("pallas" in c for c in results["copy"][1]["checked_bit_exact"]) == len(copy)
    # (broadcast's inputs hold NaNs, which Pallas's interpreter on jax 0.10
    # quiets: a comparator's difference, recorded)
    broadcast = results["broadcast"][1]
    assert all(f"{row['case']} pallas" in broadcast["checked_bit_exact"]
               or f"{row['case']} pallas" in broadcast["comparator_differs"]
               for row in broadcast["rows"])
    conv = results["im2col"][1]["conv"]
    assert [(r["dtype"], r["channels_out"]) for r in conv["rows"]] == [("bfloat16", 16),
                                                                       ("float32", 16)]
    for row in conv["rows"]:
        assert set(row["times"]) == set(row["max_error"]) == {
            "im2col_gemm", "slice_concat_gemm", "xla_conv", "gemm"}
        assert max(row["max_error"].values()) <= conv["tolerance"][row["dtype"]]


def _gather_times_every_case_at_its_dtypes(smoke_results):
    _, results = smoke_results
    gather = results["gather"][1]
    assert gather["use_dtype"] == "bfloat16"
    assert [(row["key"], row["dtype"]) for row in gather["rows"]] == [
        ("pages", "bfloat16"), ("set", "bfloat16"), ("pages", "float8_e4m3fn"),
        ("set", "float8_e4m3fn"), ("pages", "uint32"), ("set", "uint32"),
        ("rows 512", "bfloat16"), ("rows 512", "float32"), ("rows 512", "uint32"),
        ("add", "float32"), ("add", "bfloat16"), ("decode", "bfloat16")]
    for row in gather["rows"] + gather["small_gathers"] + gather["sweep"]["rows"]:
        assert row["dtype"] in row["case"]  # each case names its dtype
        for name, t in row["times"].items():  # three clocks, each case checked first
            assert set(t) == {"busy_us", "span_us", "wall_us"}, (row["case"], name)
            label = "memcpy ceiling" if name == "memcpy" else name
            assert f"{row['case']}: {label}" in gather["checked_bit_exact"]
        # every jax_tma method at the use case's dtype, auto alone at the others
        # the Pallas kernel beside the pages, the page set and the rows
        assert ("pallas" in row["times"]) == (row["key"] in ("pages", "set", "rows 512")), \
            row["case"]
        ours = {"auto", "tma", "simt"} & set(row["times"])
        assert ours == ({"auto", "tma", "simt"} if row["dtype"] == "bfloat16" or
                        row["kind"] == "scatter add" else {"auto"}) or row["kind"] == "decode step"
        assert set(row.get("targets_met", {})) == set(row.get("targets", {}))
    targeted = {(row["key"], row["dtype"]): set(row["targets"])
                for row in gather["rows"] if "targets" in row}
    assert targeted == {("pages", "bfloat16"): {"memcpy", "xla"},
                        ("set", "bfloat16"): {"memcpy", "xla", "xla_hinted"},
                        ("rows 512", "bfloat16"): {"memcpy"},
                        ("add", "float32"): {"xla"}, ("add", "bfloat16"): {"xla"},
                        ("decode", "bfloat16"): {"xla_hinted"}}
    assert {"tma", "simt", "deterministic", "xla"} <= set(gather["rows"][9]["times"])
    assert set(gather["rows"][-1]["xla_gather_kernels"]) == {"xla", "xla_hinted"}
    assert [row["slab_bytes"] for row in gather["sweep"]["rows"]] == [128, 1024]
    assert gather["sweep"]["dtype"] == "bfloat16"
    # Small calls rotate through index sets of distinct rows (L2-cold on a GPU).
    small = gather["small_gathers"]
    assert [(row["bytes"], row["dtype"], row["inputs"]) for row in small] == [
        (2 * 4 * 2048, "bfloat16", 8), (2 * 4 * 2048, "uint32", 8),
        (2 * 16 * 2048, "bfloat16", 2)]
    assert all(row["ceiling_inputs"] > 1 for row in small)
    chain = gather["chained_tiny_gathers"]
    assert set(chain["per_op"]) == {"gather", "gather_tma", "gather_simt", "minimal_ffi"}
    assert chain["l2"] == "warm"
    wheel = results["wheel"][1]["rows"]
    assert len(wheel) == 1 and wheel[0]["case"] == gather["rows"][0]["case"]
    assert set(wheel[0]["times"]) == {"auto", "xla", "xla_hinted", "memcpy"}


def _results_render_into_the_pages_sections(smoke_results):
    _, results = smoke_results
    with pytest.raises(ValueError, match="a smoke run's result cannot be published"):
        report.check_results(results)
    names = [*report.RENDERERS, *report.DERIVED]
    readme = "".join(f"<!-- bench:{op} -->\nold\n<!-- /bench:{op} -->\n" for op in names)
    text = report.render_sections(readme, results)
    assert "old" not in text
    assert "(smoke run: measures nothing)" in text
    assert "No `broadcast-ncu` result at this commit" in text
    assert "No `sanitizer` result at this commit: `scripts/gpu_check.sh sanitize`" in text
    assert "| method | 4 replicas of 64² bf16 (axis=0) |" in text  # broadcast's table
    assert "| slab | auto | tma | simt | XLA | XLA hinted | copy ceiling |" in text  # gather's
    assert "The other methods, chained alike: `method='tma'`" in text
    assert "| gather 16 random rows of 2 KiB of 64 | bfloat16 | 2 (" in text  # the small gathers
    # the targets table: target, dtype, clock, measured, the ratio at the
    # copy ceiling, met (and whether a missed one is above the ceiling)
    assert "| target | case | dtype | clock | measured | at the ceiling | met |" in text
    assert re.search(r"\| in-place page set: `auto` ≥ 5× XLA \| .* \| bfloat16 \| busy and span "
                     r"\| [\d.]+× busy, [\d.]+× span(, wall [\d.]+×)? \| [\d.]+× \| "
                     r"(✓|✗|✗ \(above the ceiling\)) \|",
                     text)
    assert "| case | bfloat16 | float32 | float8_e4m3fn | uint32 |" in text  # the dtype effect
    # the build measured, and the wheel's case beside it
    assert "| install | CUDA architectures | FFI API | CUDA runtime |" in text
    assert text.count("| the smoke test's install | `") >= 3  # the build, the wheel's table x2
    assert "- `gather`/`scatter` speed (cpu, GPU busy time" in text  # the limits bullet
    # the Pallas kernels beside auto (ratios of every case), the convolution
    assert "The in-JAX peer: the simplest Pallas kernel a user would write" in text
    assert "| case | dtype | auto | Pallas | auto vs Pallas: busy | span | wall |" in text
    assert "| auto vs Pallas: busy / span |" in text
    assert "`auto` vs the simplest Pallas copy (`pallas_kernels.copy` (" in text
    assert "| input → output channels | `jax_tma.im2col` + GEMM |" in text
    assert re.search(r"3×3 SAME patches of \(2, 8, 8, 16\) bfloat16; as a convolution", text)
    assert "Blackwell" in text
    # the README's table of ops: one headline each, where and how it was measured
    assert "| [`scatter`](docs/ops/gather.md) | slabs set or added by index, in place | " in text
    assert re.search(r"\| \[`ppermute`\]\(docs/ops/ppermute\.md\) \| .* \| [\d.]+ GB/s per "
                     r"direction, [\d.]+× `lax\.ppermute` \(NCCL\), [\d.]+× "
                     r"`cudaMemcpyPeerAsync` \(the link's ceiling\), by span", text)
    assert "Bandwidth counts every byte read plus every byte written" in text
    assert "whose output differs from the bit-exact reference" not in \
        report.render(results["copy"][1])


def test_readme_and_docs_tables_match_the_committed_results():
    # The benchmark sections of the README and of docs/ are report.py's rendering of
    # benchmarks/results/: edit the results (by running the benchmarks),
    # then run `python benchmarks/report.py`, never the tables by hand.
    # (Whether the results are those of the code: the next test.)
    assert report.main(["--check", "--allow-stale"]) == 0


def test_every_section_is_on_a_page():
    # Each op's tables, and each section drawn from several results, stand
    # on one page of the README and docs/ (benchmarks.md, the op pages).
    text = "".join(open(path).read() for path in report.pages(report.README,
                                                              os.path.join(_ROOT, "docs")))
    for op in [*report.RENDERERS, *report.DERIVED]:
        assert text.count(f"<!-- bench:{op} -->") == 1, op


def _headlines() -> tuple[dict[str, tuple[str, dict]], dict[str, str]]:
    """The committed results, and the README's headline cell of each op
    rendered from them."""
    results = report.load_results(report.RESULTS)
    return results, {row.op: row.number(results[row.result][1]) for row in report.HEADLINES
                     if row.result in results}


def test_readme_says_which_jax_the_gpu_results_ran_on():
    # Issue 44: every GPU result is from the GPU machine's jax (0.11.2),
    # while the README claimed 0.10.2 to 0.12.x with no word of what ran
    # where. Its versions section names the jax, jaxlib and Python of every
    # result, and the GPUs.
    results = report.load_results(report.RESULTS)
    text = open(report.README).read()
    section = re.search(r"<!-- bench:versions -->\n(.*?)<!-- /bench:versions -->", text, re.S)
    assert section, "the README has no versions section"
    for _, r in results.values():
        prov = r.get("provenance")
        if prov:
            for want in (f"jax {prov['versions']['jax']}", prov["versions"]["jaxlib"],
                         prov["versions"]["python"], prov["devices"][0]):
                assert want in section.group(1), want


def test_headlines_name_the_hinted_and_the_plain_xla_forms():
    # Issue 44: the scatter headline gave 6.38x the plain x.at[i].set alone;
    # against the hinted form (unique_indices=True), measured in the same
    # run, jax_tma is 1.19x. Every form the result measured stands in the
    # headline, the strongest (fastest) first.
    results, cells = _headlines()
    if "gather" not in results:
        pytest.skip("no gather result")
    r = results["gather"][1]
    for op, kind, key in (("gather", "gather", "pages"), ("scatter", "scatter set", "set")):
        row = render_gather._find(r["rows"], key, r.get("use_dtype"))
        forms = r["xla_formulations"][kind]
        assert set(forms) == {"xla", "xla_hinted"}, kind
        at = {k: cells[op].index(f"`{code}`") for k, code in forms.items()}
        strongest = min(forms, key=lambda k: row["times"][k]["busy_us"])
        assert at[strongest] == min(at.values()), (op, cells[op])
        for k in forms:
            ratio = tables.ratio_text(row["times"], "auto", k, "busy_us")
            assert f"{ratio}× {render_gather._FORM[k]} `{forms[k]}`" in cells[op], (op, k)


def test_headlines_hide_no_case_lost_to_xla():
    # Issue 44: window loses to XLA in every case, and its headline showed
    # the f32 row (0.94x) where bf16's is 0.79x; col2im loses to XLA's
    # transpose of slice-and-concatenate in every case and no headline said so.
    results, cells = _headlines()
    if "window" in results:
        ratios = [row["vs_xla"]["auto"] for row in results["window"][1]["rows"]]
        assert f"{min(ratios):.2f}× XLA" in cells["window"]
        assert tables.behind_text(ratios, "XLA") in cells["window"]
    if "im2col" in results:
        rows = results["im2col"][1]["rows"]
        ratios = [row["col2im_vs"]["xla_grad_slice_concat"] for row in rows]
        assert f"{ratios[0]:.2f}× XLA's transpose of slice-and-concatenate" in cells["col2im"]
        assert tables.behind_text(ratios, "it") in cells["col2im"]
    assert tables.behind_text([0.79, 0.998], "XLA") == "below XLA in all 2 cases, 0.79–1.00×"
    assert tables.behind_text([0.9, 1.2, 1.1], "NCCL") == "below NCCL in 1 of 3 cases, 0.90–1.20×"


# The committed results in which `auto` is timed beside methods a user can
# force: op -> the (case, times) of each of its rows, `auto`'s times under
# "auto", those of forced methods under their names (FORCED).
_TIMED_METHODS = {
    "window": lambda r: [(row["case"], row["times"]) for row in r["rows"]],
    "gather": lambda r: [(row["case"], row["times"])
                         for row in r["rows"] + r.get("small_gathers", []) + r["sweep"]["rows"]],
    "im2col": lambda r: [(f"{tuple(row['shape'])} {row['dtype']}",
                          {k.removeprefix("im2col_"): t for k, t in row["times"].items()
                           if k.startswith("im2col_")}) for row in r["rows"]],
    "copy": lambda r: [(f"{row['bytes']} B {row['dtype']}, {clock}", row[clock])
                       for row in r["rows"] for clock in ("repeat", "after_write") if clock in row],
    "broadcast": lambda r: [(row["case"], row["times"]) for row in r["rows"]],
}
_FORCED = re.compile(r"tma|simt|bulk|tiled|store|(multicast|dsmem)(/\d+)?")
# A forced method beats `auto` where it takes 3 % less time by busy time and
# span alike (less is within a run's noise).
_BEAT = 0.97
# A sentence that says `auto` picks (takes, chooses) the fastest kernel.
_FASTEST_CLAIM = re.compile(r"auto\W[^.]{0,120}?\b(pick|take|choose|select)s?\b[^.]{0,30}?"
                            r"\bfastest\b", re.I)


def _auto_beaten(results) -> list[str]:
    """Where a forced method beat `auto` in the committed results, on any GPU."""
    out = []
    for op, (_, result) in results.items():
        rows = _TIMED_METHODS.get(report.base_op(op))
        for case, times in rows(result) if rows else ():
            for method, t in times.items():
                if _FORCED.fullmatch(method) and all(
                        t[c] < _BEAT * times["auto"][c] for c in ("busy_us", "span_us")):
                    out.append(f"{op}: {case}: method {method!r} {t['busy_us']:.1f} µs against "
                               f"auto's {times['auto']['busy_us']:.1f}")
    return out


def test_broadcast_auto_is_not_beaten_in_the_committed_results():
    # Its rule (the store kernel above 8 MiB of output, SIMT up to it) is
    # held by the benchmark's cases on both sides of it, on every GPU.
    results = report.load_results(report.RESULTS)
    beaten = _auto_beaten({op: r for op, r in results.items()
                           if report.base_op(op) == "broadcast"})
    assert not beaten, "\n".join(beaten)


def test_no_page_says_auto_is_the_fastest_where_the_results_disagree():
    # Issue 44: docs/getting_started.md said `auto` picks the fastest
    # kernel measured, but on the bf16 window at an aligned traced start
    # `auto` took 30.6 µs and `method="tma"` 27.9. Where the committed
    # results have a forced method beat `auto`, no page (the README, docs/,
    # the docstrings; the rendered sections aside) may say it is the fastest.
    assert _FASTEST_CLAIM.search('`method="auto"` (the default everywhere) picks the fastest '
                                 'kernel measured for the call')
    assert not _FASTEST_CLAIM.search('`method="auto"` picks a kernel by a rule. The fastest')
    beaten = _auto_beaten(report.load_results(report.RESULTS))
    if not beaten:
        return
    paths = [report.README, *glob.glob(os.path.join(_ROOT, "docs", "**", "*.md"), recursive=True),
             *glob.glob(os.path.join(_ROOT, "jax_tma", "*.py"))]
    claims = []
    for path in paths:
        text = " ".join(report._SECTION.sub("", open(path).read()).split())
        claims += [f"{os.path.relpath(path, _ROOT)}: ...{m.group(0)}..."
                   for m in _FASTEST_CLAIM.finditer(text)]
    assert not claims, ("these say `auto` takes the fastest kernel, but in the committed results "
                        "a forced method beat it:\n" + "\n".join(beaten) + "\nthe claims:\n"
                        + "\n".join(claims))


def test_committed_results_match_the_code():
    # No change to the measured code (report.WATCHED) since the results'
    # commit: after one, the benchmarks run again (scripts/gpu_check.sh
    # bench) and report.py renders their results. Without the history to
    # tell, it says which results it could not check (a warning in pytest's
    # summary, and the skip's reason), not a bare skip.
    results = report.load_results(report.RESULTS)
    missing = report.unchecked(results)
    if missing:
        why = ("could not check whether these benchmark results are those of the code (a copy "
               "without .git, or a shallow clone; `git fetch --unshallow` gives the history): "
               + "; ".join(missing))
        warnings.warn(why)
        pytest.skip(why)
    report.check_fresh(results)


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True, env={**os.environ, "GIT_AUTHOR_NAME": "t",
                                           "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                                           "GIT_COMMITTER_EMAIL": "t@t"}).stdout.strip()


def _committed_repo(tmp_path, files: dict[str, str]):
    """A git repo of `files` ({path: text}) in one commit, and results of
    that commit's code in its benchmarks/results/ (write_measured) ->
    (repo, the commit)."""
    repo = tmp_path / "repo"
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "code")
    (repo / "benchmarks" / "results").mkdir(parents=True)
    return repo, _git(repo, "rev-parse", "HEAD")


def _write_measured(repo, op: str, commit: str) -> None:
    """A result of `op` measured at `commit`, in repo's benchmarks/results/."""
    result = {"op": op, "summary": [], "smoke": False,
              "provenance": {"commit": commit, "dirty": False, "devices": ["H100"],
                             "versions": {"jax": "0"}, "date": "2026-11-25T00:00:00"}}
    (repo / "benchmarks" / "results" / f"{op}_h100_2026-11-25.json").write_text(
        json.dumps(result))


def _measured_checkout(tmp_path, monkeypatch, code):
    """A checkout of its own: `code`, results of its first commit, a README
    rendered from them -> (repo, the results' commit, report.py's --check
    arguments)."""
    rendering = {"benchmarks/report.py": "X = 1\n", "benchmarks/tables.py": "X = 1\n",
                 "benchmarks/render_copy.py": "X = 1\n"}
    repo, measured = _committed_repo(tmp_path, {**code, "docs/index.md": "one", **rendering})
    _write_measured(repo, "tune-bulk", measured)
    monkeypatch.setattr(report, "ROOT", str(repo))
    args = ["--check", "--results", str(repo / "benchmarks" / "results"),
            "--readme", str(repo / "README.md")]
    (repo / "README.md").write_text("<!-- bench:tune-bulk -->\nx\n<!-- /bench:tune-bulk -->\n")
    assert report.main(args[1:]) == 0  # renders it
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "results")
    return repo, measured, args


_CODE = {"jax_tma/_copy.py": 'def copy(x):\n    """Copies x."""\n    return x  # as is\n',
         "ffi/copy/bulk_copy.cu": 'int Size() { return 16; }  // "bytes"\n',
         "benchmarks/bench_copy.py": "SIZES = [1, 2]\n",
         "CMakeLists.txt": "project(jax_tma)  # the name\n"}


def test_check_fails_on_a_code_change_after_the_results_commit(tmp_path, monkeypatch):
    # Docs, comments, docstrings, layout and the renderers may change after
    # the results; code may not.
    repo, measured, args = _measured_checkout(tmp_path, monkeypatch, _CODE)
    assert report.main(args) == 0
    for path, text in {
            "docs/index.md": "two", "benchmarks/report.py": "X = 2\n",
            "benchmarks/tables.py": "X = 2\n", "benchmarks/render_copy.py": "X = 2\n",
            "jax_tma/_copy.py": 'def copy(x):\n    """Returns a copy of x."""\n\n'
                                '    return x  # unchanged\n',
            "ffi/copy/bulk_copy.cu": '/* The box. */\nint Size() {\n  return 16;\n}\n',
            "CMakeLists.txt": "#[[ A bracket\ncomment ]]\nproject(jax_tma)\n"}.items():
        (repo / path).write_text(text)
        _git(repo, "commit", "-qam", f"comments or docs of {path}")
        assert report.changed_since(measured) == [], path
        assert report.main(args) == 0
    for path, text in {"jax_tma/_copy.py": 'def copy(x):\n    """Copies x."""\n    return +x\n',
                       "ffi/copy/bulk_copy.cu": 'int Size() { return 32; }  // "bytes"\n',
                       "benchmarks/bench_copy.py": "SIZES = [1, 3]  # sizes\n",
                       "CMakeLists.txt": 'project(jax_tma "#")\n'}.items():
        (repo / path).write_text(text)
        _git(repo, "commit", "-qam", f"change {path}")
        assert path in report.changed_since(measured)
        assert report.main(args) == 1
        assert report.main([*args, "--allow-stale"]) == 0
    with pytest.raises(report.StaleResults, match=r"are stale: .*jax_tma/_copy.py"):
        report.check_fresh(report.load_results(str(repo / "benchmarks" / "results")))
    # Without the commit in the history, nothing can be told: that fails too.
    monkeypatch.setattr(report, "ROOT", str(tmp_path))
    with pytest.raises(report.StaleResults, match="cannot tell"):
        report.check_fresh(report.load_results(str(repo / "benchmarks" / "results")))


def test_check_judges_the_working_tree_not_head(tmp_path, monkeypatch):
    # An uncommitted change to measured code stales the results, and a
    # checkout whose HEAD lags its files (a copy of the tree beside an older
    # .git) is judged by its files; an untracked file (a build's module) is
    # no code of the results.
    repo, measured, args = _measured_checkout(tmp_path, monkeypatch, _CODE)
    (repo / "jax_tma" / "_copy.py").write_text('def copy(x):\n    return -x\n')
    assert report.changed_since(measured) == ["jax_tma/_copy.py"]
    assert report.main(args) == 1
    with pytest.raises(report.StaleResults, match="commit its change first"):
        report.record_unmeasured(report.load_results(str(repo / "benchmarks" / "results")),
                                 "jax_tma/_copy.py", "a test")
    _git(repo, "checkout", "-q", "--", "jax_tma/_copy.py")
    (repo / "jax_tma" / "_jax_tma.so").write_bytes(b"\x7fELF\x02\x80")
    assert report.main(args) == 0


def test_check_counts_a_new_source_that_git_does_not_track_yet(tmp_path, monkeypatch):
    # Issue 44: an uncommitted change must fail the check. A changed tracked
    # file did (above); a new source file not yet added to git did not,
    # though it is code of the checkout. A build's module is not (untracked
    # and no source), nor is a file git ignores.
    repo, measured, args = _measured_checkout(tmp_path, monkeypatch, _CODE)
    (repo / ".gitignore").write_text("*.log\nscratch/\n")
    (repo / "jax_tma" / "_jax_tma.so").write_bytes(b"\x7fELF\x02\x80")
    (repo / "ffi" / "copy" / "build.log").write_text("int x;\n")
    (repo / "ffi" / "scratch").mkdir()
    (repo / "ffi" / "scratch" / "try.cu").write_text("int Try();\n")
    assert report.changed_since(measured) == []
    assert report.main(args) == 0
    (repo / "ffi" / "copy" / "bulk_pipeline.cuh").write_text("int Stages() { return 4; }\n")
    assert report.changed_since(measured) == ["ffi/copy/bulk_pipeline.cuh"]
    assert report.main(args) == 1
    _git(repo, "add", "ffi/copy/bulk_pipeline.cuh")  # staged, not committed: the same
    assert report.changed_since(measured) == ["ffi/copy/bulk_pipeline.cuh"]
    assert report.main(args) == 1
    with pytest.raises(report.StaleResults, match="commit its change first"):
        report.record_unmeasured(report.load_results(str(repo / "benchmarks" / "results")),
                                 "ffi/copy/bulk_pipeline.cuh", "a test")


_BUILD_CODE = {
    **_CODE,
    "CMakeLists.txt": 'project(jax_tma)\nset(CMAKE_CUDA_ARCHITECTURES "90a-real")\n',
    "pyproject.toml": '[build-system]\nrequires = ["scikit-build-core>=0.10", "jaxlib==0.10.2"]\n'
                      '\n[project]\nname = "jax-tma"\ndependencies = ["jax>=0.10.2"]\n'
                      '[project.optional-dependencies]\ntest = ["pytest>=8", "hypothesis>=6"]\n'
                      '\n[tool.scikit-build.cmake.define]\nJAX_TMA_CUDA = "AUTO"\n'
                      '\n[tool.pytest.ini_options]\ntestpaths = ["tests"]\n',
    "tests/cuda/copy_selftest.cu": '#include "copy/bulk_copy.cu"\nint main() { return 0; }\n',
}


def test_check_watches_the_selftests_and_the_build_settings(tmp_path, monkeypatch):
    # Issue 44: the kernels' self-tests (tests/cuda/, what the sanitizer's
    # result runs) and the build's settings (compiler flags and
    # architectures: CMakeLists.txt, pyproject.toml's build tables) are code
    # of the results. A self-test is the sanitizer's alone; pyproject.toml's
    # dependencies and test settings are nobody's.
    repo, measured = _committed_repo(tmp_path, _BUILD_CODE)
    for op in ("tune-bulk", "sanitizer"):
        _write_measured(repo, op, measured)
    monkeypatch.setattr(report, "ROOT", str(repo))
    results = report.load_results(str(repo / "benchmarks" / "results"))

    def commit(path, text):
        (repo / path).write_text(text)
        _git(repo, "commit", "-qam", f"change {path}")
        return report.changed_since(measured), report.changed_since(measured, "copy")

    report.check_fresh(results)
    pyproject = _BUILD_CODE["pyproject.toml"]
    assert commit("pyproject.toml", pyproject.replace(', "hypothesis>=6"', "").replace(
        'testpaths = ["tests"]', 'testpaths = ["tests"]\nmarkers = ["gpu: a GPU"]')) == ([], [])
    report.check_fresh(results)
    assert commit("tests/cuda/copy_selftest.cu",
                  "// The self-test.\n" + _BUILD_CODE["tests/cuda/copy_selftest.cu"]) == ([], [])
    assert commit("tests/cuda/copy_selftest.cu", _BUILD_CODE["tests/cuda/copy_selftest.cu"]
                  .replace("return 0", "return 1")) == (["tests/cuda/copy_selftest.cu"], [])
    with pytest.raises(report.StaleResults, match=r"\(benchmarks/results/sanitizer_h100_2026-11-25"
                                                  r"\.json\) are stale: tests/cuda/copy_selftest"):
        report.check_fresh(results)
    _git(repo, "checkout", "-q", measured, "--", "tests/cuda/copy_selftest.cu")
    _git(repo, "commit", "-qm", "back")
    report.check_fresh(results)
    for path, text in (
            ("pyproject.toml", pyproject.replace('JAX_TMA_CUDA = "AUTO"', 'JAX_TMA_CUDA = "ON"')),
            ("pyproject.toml", pyproject.replace("jaxlib==0.10.2", "jaxlib==0.12.0")),
            ("CMakeLists.txt", _BUILD_CODE["CMakeLists.txt"].replace("90a-real", "90a-real;100a"))):
        assert commit(path, text) == ([path], [path]), text
        with pytest.raises(report.StaleResults, match=rf"tune-bulk.*are stale: {path}"):
            report.check_fresh(results)
        _git(repo, "checkout", "-q", measured, "--", path)
        _git(repo, "commit", "-qm", "back")
    report.check_fresh(results)


def test_without_history_the_check_says_what_it_could_not_check(tmp_path, monkeypatch, capsys):
    # Issue 44: where the checkout has no history (no .git, a shallow clone),
    # the freshness check cannot be made: --check fails, --allow-stale says
    # which results it left unchecked, and the test of the committed results
    # warns with the same before it skips.
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    commit = "c0ffee" + "0" * 34
    _write_measured(tmp_path, "tune-bulk", commit)
    (tmp_path / "README.md").write_text("no sections\n")
    monkeypatch.setattr(report, "ROOT", str(tmp_path))
    args = ["--check", "--results", str(results), "--readme", str(tmp_path / "README.md"),
            "--docs", str(tmp_path / "docs")]
    for extra, rc in (([], 1), (["--allow-stale"], 0)):
        assert report.main(args + extra) == rc
        err = capsys.readouterr().err
        assert re.search(r"cannot tell whether these results match the code: c0ffee0000 "
                         r"\(benchmarks/results/tune-bulk_h100_2026-11-25\.json\): no git "
                         r"history here", err), err
    monkeypatch.setattr(report, "RESULTS", str(results))
    with pytest.warns(UserWarning, match=r"could not check .*c0ffee0000 \(benchmarks/results/"
                                         r"tune-bulk_h100_2026-11-25.json\): no git history"):
        with pytest.raises(pytest.skip.Exception):
            test_committed_results_match_the_code()


def test_an_unmeasured_change_is_named_and_bounded(tmp_path, monkeypatch):
    # A change recorded as unmeasured (with why) passes the check and is named
    # beside the results; a later change to that file, an entry for a file
    # whose code is the results', or for other results, fails it.
    repo, measured, args = _measured_checkout(tmp_path, monkeypatch, _CODE)
    results = report.load_results(str(repo / "benchmarks" / "results"))
    with pytest.raises(report.StaleResults, match="its code is that of the results' commit"):
        report.record_unmeasured(results, "jax_tma/_copy.py", "nothing changed")
    (repo / "jax_tma" / "_copy.py").write_text("def copy(x):\n    return x + 0\n")
    _git(repo, "commit", "-qam", "autodiff only")
    assert report.main(args) == 1
    assert report.main(["--results", args[2], "--unmeasured", "jax_tma/_copy.py", "--why",
                        "AD only"]) == 0
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "unmeasured")
    assert report.main(args) == 1  # the README does not name it yet
    assert report.main(args[1:]) == 0
    assert "1 code file changed since and not measured again (which, why, and what was checked " \
        "instead: `benchmarks/unmeasured_changes.json`)" in (repo / "README.md").read_text()
    _git(repo, "commit", "-qam", "rendered")
    assert report.main(args) == 0
    (repo / "jax_tma" / "_copy.py").write_text("def copy(x):\n    return x + 1\n")
    _git(repo, "commit", "-qam", "more")
    with pytest.raises(report.StaleResults, match=r"are stale: jax_tma/_copy.py"):
        report.check_fresh(results)
    (repo / "jax_tma" / "_copy.py").write_text(_CODE["jax_tma/_copy.py"])
    _git(repo, "commit", "-qam", "back")
    with pytest.raises(report.StaleResults, match=r"lists jax_tma/_copy.py, whose code is that"):
        report.check_fresh(results)
    (repo / "benchmarks" / "unmeasured_changes.json").write_text(json.dumps(
        {"results": [{"commit": "c0ffee", "changes": [{"path": "jax_tma/_copy.py"}]}]}))
    with pytest.raises(report.StaleResults,
                       match=r"changes after c0ffee, but no results are of that commit"):
        report.check_fresh(results)


def test_results_of_two_commits_are_each_judged_against_their_own(tmp_path, monkeypatch):
    # Results measured after a change need no entry for it; the older ones
    # do, in the ledger of their commit; a later change stales both, and
    # is recorded in both commits' ledgers.
    repo, measured, args = _measured_checkout(tmp_path, monkeypatch, _CODE)
    (repo / "jax_tma" / "_copy.py").write_text("def copy(x):\n    return x + 0\n")
    _git(repo, "commit", "-qam", "a change")
    _write_measured(repo, "copy", _git(repo, "rev-parse", "HEAD"))
    results = report.load_results(str(repo / "benchmarks" / "results"))
    report.check_results(results)
    with pytest.raises(report.StaleResults,
                       match=rf"the results of {measured[:10]} \(.*tune-bulk.*\) are stale: "
                             r"jax_tma/_copy.py"):
        report.check_fresh(results)
    report.record_unmeasured(results, "jax_tma/_copy.py", "AD only")
    assert {c: [e["path"] for e in entries] for c, entries in report.load_unmeasured().items()} \
        == {measured: ["jax_tma/_copy.py"]}
    report.check_fresh(results)
    (repo / "jax_tma" / "_copy.py").write_text("def copy(x):\n    return x + 1\n")
    _git(repo, "commit", "-qam", "more")
    with pytest.raises(report.StaleResults, match="are stale: jax_tma/_copy.py"):
        report.check_fresh(results)
    report.record_unmeasured(results, "jax_tma/_copy.py", "AD again")
    head = _git(repo, "rev-parse", "HEAD")
    assert {c: [e["why"] for e in entries] for c, entries in report.load_unmeasured().items()} \
        == {measured: [f"AD only Later ({head[:7]}): AD again"],
            _git(repo, "rev-parse", "HEAD~1"): ["AD again"]}
    report.check_fresh(results)


_FAMILY_CODE = {
    "ffi/families.inc": '#ifndef JAX_TMA_FAMILY\n#endif\n#include "copy/manifest.inc"\n'
                        '#include "im2col/manifest.inc"\n',
    "ffi/common.h": "int Shared();\n",
    "ffi/copy/bulk_copy.cu": '#include "common.h"\nint Size() { return 16; }\n',
    "ffi/im2col/im2col_cpu.cc": '#include "common.h"\nint Taps() { return 9; }\n',
    "jax_tma/_copy.py": "def copy(x):\n    return x\n",
    "jax_tma/_im2col.py": "def im2col(x):\n    return x\n",
    "jax_tma/__init__.py": "from jax_tma._copy import copy\nfrom jax_tma._im2col import im2col\n"
                           '__all__ = ["copy", "im2col"]\n',
    "tests/families/copy.py": 'MODULES = ("jax_tma._copy",)\n',
    "tests/families/im2col.py": 'MODULES = ("jax_tma._im2col",)\n',
}


def test_a_change_stales_the_results_of_the_families_that_run_through_it(tmp_path,
                                                                         monkeypatch):
    """Results of two families (tune-bulk: copy's, im2col): a change to one
    family's sources or modules, or a new family, leaves the other's fresh;
    the shared core stales both, and so does a family that starts to run
    through another (an import of its module, an include of its header)."""
    repo, measured = _committed_repo(tmp_path, _FAMILY_CODE)
    results = repo / "benchmarks" / "results"
    for op in ("tune-bulk", "im2col"):
        _write_measured(repo, op, measured)
    monkeypatch.setattr(report, "ROOT", str(repo))

    def commit(changes, what):
        for path, text in changes.items():
            (repo / path).parent.mkdir(parents=True, exist_ok=True)
            (repo / path).write_text(text)
        _git(repo, "add", ".")
        _git(repo, "commit", "-qm", what)
        return {f: report.changed_since(measured, f) for f in ("copy", "im2col")}

    assert report.family_of("tune-bulk") == "copy"
    assert commit({"ffi/im2col/im2col_cpu.cc": '#include "common.h"\nint Taps() { return 4; }\n',
                   "jax_tma/_im2col.py": "def im2col(x):\n    return -x\n"}, "im2col only") == {
        "copy": [], "im2col": ["ffi/im2col/im2col_cpu.cc", "jax_tma/_im2col.py"]}
    with pytest.raises(report.StaleResults, match=r"\(benchmarks/results/im2col_h100_2026-11-25"
                                                  r"\.json\) are stale: ffi/im2col/im2col_cpu.cc"):
        report.check_fresh(report.load_results(str(results)))
    # A new family: its folder, module and descriptor, and its lines in the lists.
    new = commit({"ffi/fill/fill_cpu.cc": "int Fill();\n", "jax_tma/_fill.py": "def fill(x):\n"
                  "    return x\n", "tests/families/fill.py": 'MODULES = ("jax_tma._fill",)\n',
                  "ffi/families.inc": _FAMILY_CODE["ffi/families.inc"]
                  + '#include "fill/manifest.inc"\n',
                  "jax_tma/__init__.py": "from jax_tma._copy import copy\nfrom jax_tma._fill "
                  "import fill\nfrom jax_tma._im2col import im2col\n"
                  '__all__ = ["copy", "fill", "im2col"]\n'}, "a new family")
    assert new["copy"] == []
    assert "ffi/families.inc" in report.changed_since(measured)  # all families: the sanitizer's
    # copy starts to run through im2col's module, then the shared core changes.
    assert commit({"jax_tma/_copy.py": "from jax_tma._im2col import im2col\n\n\ndef copy(x):\n"
                   "    return x\n"}, "copy imports im2col")["copy"] == [
        "ffi/im2col/im2col_cpu.cc", "jax_tma/_copy.py", "jax_tma/_im2col.py"]
    assert commit({"ffi/common.h": "int Shared(int);\n"}, "core")["im2col"][0] == "ffi/common.h"
    assert report.runs_through("im2col") == {"im2col"}
    (repo / "ffi" / "im2col" / "im2col_cpu.cc").write_text('#include "copy/copy_launch.h"\n')
    assert report.runs_through("im2col") == {"im2col", "copy"}


def test_a_layer_is_the_code_of_the_families_that_include_it(tmp_path, monkeypatch):
    """A layer of shared sources (a folder of ffi/ that is no family, as
    ffi/peer/) is the code of the families whose sources include its headers:
    its change stales their results alone, and a family runs through the
    families that the layer's own sources include. A layer that the shared
    core's own sources include (module.cc: cuda/handlers.h) is shared core."""
    repo, measured = _committed_repo(tmp_path, {
        **_FAMILY_CODE,
        "ffi/im2col/im2col_cpu.cc": '#include "peer/link.h"\nint Taps() { return 9; }\n',
        "ffi/peer/link.h": '#include "copy/copy_launch.h"\nint Link();\n',
        "ffi/cuda/handlers.h": "int Handlers();\n",
        "ffi/module.cc": '#include "cuda/handlers.h"\n'})
    for op in ("tune-bulk", "im2col"):
        _write_measured(repo, op, measured)
    monkeypatch.setattr(report, "ROOT", str(repo))
    assert report.layers() == {"cuda", "peer"}
    assert report.runs_through("im2col") == {"im2col", "copy"}
    assert report.runs_through("copy") == {"copy"}

    def commit(path, text):
        (repo / path).write_text(text)
        _git(repo, "commit", "-qam", f"change {path}")
        return {f: report.changed_since(measured, f) for f in ("copy", "im2col")}

    assert commit("ffi/peer/link.h", '#include "copy/copy_launch.h"\nint Link(int);\n') == {
        "copy": [], "im2col": ["ffi/peer/link.h"]}
    assert commit("ffi/cuda/handlers.h", "int Handlers(int);\n") == {
        "copy": ["ffi/cuda/handlers.h"], "im2col": ["ffi/cuda/handlers.h", "ffi/peer/link.h"]}


def test_a_moved_file_is_recorded_at_its_old_and_new_paths(tmp_path, monkeypatch):
    # A file moved unchanged after the results (into a layer) stales them
    # until both paths are recorded as unmeasured; the old path's entry holds
    # while nothing is there, and a file that comes back there is a change.
    repo, measured, args = _measured_checkout(tmp_path, monkeypatch, _CODE)
    (repo / "ffi" / "peer").mkdir()
    _git(repo, "mv", "ffi/copy/bulk_copy.cu", "ffi/peer/bulk_copy.cu")
    _git(repo, "commit", "-qm", "moved")
    assert report.main(args) == 1
    for path in ("ffi/copy/bulk_copy.cu", "ffi/peer/bulk_copy.cu"):
        assert report.main(["--results", args[2], "--unmeasured", path, "--why", "moved"]) == 0
    assert report.main(args[1:]) == 0  # renders the note
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "unmeasured")
    assert report.main(args) == 0
    (repo / "ffi" / "copy" / "bulk_copy.cu").write_text("int Size() { return 32; }\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "back")
    assert report.main(args) == 1


def test_code_of_keeps_strings_and_drops_comments():
    assert report.code_of("a.cu", 'f("// no /* comment */");  // yes') == \
        'f("// no /* comment */");'
    assert report.code_of("a.h", "#define A 1 /* a\n b */\n#include <x>") == \
        "#define A 1 #include <x>"
    assert report.code_of("CMakeLists.txt", 'set(A "#1") # two') == 'set(A "#1")'
    assert report.code_of("a.py", "x = '# kept'  # dropped") != report.code_of("a.py", "x = ''")
    assert report.code_of("a.json", " {} ") == " {} "


def test_a_hand_edit_of_a_section_is_caught(tmp_path, capsys):
    # A section of the README or of a docs/ page out of step with the
    # results fails the check, which names every such page (one check of a
    # tree with all four edits: each check renders every page).
    pages = (("README.md", "headline"), ("docs/ops/copy.md", "copy"),
             ("docs/ops/gather.md", "gather-limits"), ("docs/benchmarks.md", "build"))
    shutil.copytree(os.path.join(_ROOT, "docs"), tmp_path / "docs")
    shutil.copy(report.README, tmp_path / "README.md")
    args = ["--check", "--allow-stale", "--readme", str(tmp_path / "README.md"),
            "--docs", str(tmp_path / "docs")]
    assert report.main(args) == 0
    for page, section in pages:
        text = (tmp_path / page).read_text()
        start = text.index(f"<!-- bench:{section} -->\n") + len(f"<!-- bench:{section} -->\n")
        (tmp_path / page).write_text(text[:start] + "| 1 MiB | 9.99 |\n" + text[start:])
    capsys.readouterr()
    assert report.main(args) == 1
    named = capsys.readouterr().err
    for page, _ in pages:
        assert f"{tmp_path / page}: the benchmark sections differ from" in named, page


# A measured quantity in a page's text: a time, a bandwidth, a ratio (0.85×;
# not a shape, 3×3, nor a count, 2 × H100) or a percentage.
_MEASURED = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:×(?![\d²])|\s?(?:ns|µs|ms|[KMGT]i?B/s)"
                       r"(?!\w)|\s?%)")
_FENCED = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_INLINE_CODE = re.compile(r"`[^`\n]*`")


def _measured_outside_sections(text: str) -> list[str]:
    """The measured quantities (_MEASURED) of a page's prose: not in a
    rendered section, a code block or inline code."""
    for rx in (report._SECTION, _FENCED, _INLINE_CODE):
        text = rx.sub(" ", text)
    text = " ".join(text.split())
    return [text[max(0, m.start() - 50):m.end() + 20] for m in _MEASURED.finditer(text)]


def test_every_measured_number_of_a_page_is_rendered():
    # Issue 44: docs/ops/ppermute.md kept numbers by hand outside any
    # rendered section (3.5 ms where the result says 2.41 ms, 0.65× where it
    # says 0.51×). Every time, bandwidth, ratio or percentage of the README
    # and of an op page stands in a section that report.py renders from a
    # result file.
    old = ("one call of 64 KiB blocks took 3.5 ms by span, and 256 MiB blocks moved at 59 GB/s "
           "per direction: 0.85× a `cudaMemcpyAsync` (0.65× at 16 MiB), 4–8% faster")
    assert [m.split()[-1] for m in _MEASURED.findall(old)] == ["ms", "GB/s", "0.85×", "0.65×",
                                                               "8%"]
    assert _measured_outside_sections("3×3 SAME patches of 8192² on 2 × H100, 64 KiB, "
                                      "`(i - 1) % 4`, 30 s\n```\nx = 2.5×\n```\n") == []
    pages = [report.README, *sorted(glob.glob(os.path.join(_ROOT, "docs", "ops", "*.md")))]
    found = [f"{os.path.relpath(path, _ROOT)}: ...{hit}..." for path in pages
             for hit in _measured_outside_sections(open(path).read())]
    assert not found, ("measured numbers outside a rendered section (render them from the "
                       "results: a DERIVED section of the op's render module):\n"
                       + "\n".join(found))


def test_report_refuses_two_results_of_one_op_on_one_gpu(tmp_path):
    for name in ("copy_h100_2026-01-01.json", "copy_h100_2026-01-02.json"):
        (tmp_path / name).write_text(json.dumps({"op": "copy"}))
    with pytest.raises(ValueError, match="two results for copy"):
        report.load_results(str(tmp_path))


def test_report_keys_another_gpus_result_by_its_gpus(tmp_path):
    for name in ("copy_h100_2026-01-01.json", "copy_h200_2026-01-02.json",
                 "copy_2x-h200_2026-01-02.json"):
        (tmp_path / name).write_text(json.dumps({"op": "copy"}))
    results = report.load_results(str(tmp_path))
    assert sorted(results) == ["copy", "copy@h100", "copy@h200"]
    assert results["copy"][0].endswith("copy_2x-h200_2026-01-02.json")
    assert report.base_op("copy@h200") == "copy"
    (tmp_path / "copy_h200_2026-01-03.json").write_text(json.dumps({"op": "copy"}))
    with pytest.raises(ValueError, match="two results for copy@h200"):
        report.load_results(str(tmp_path))


def test_write_result_replaces_only_the_same_ops_results(tmp_path):
    def result(op, date):
        return {"op": op, "provenance": {"device_tag": "h100", "date": date}}

    report.write_result(result("broadcast", "2026-01-01T00:00:00"), str(tmp_path))
    report.write_result(result("broadcast-ncu", "2026-01-01T00:00:00"), str(tmp_path))
    report.write_result(result("broadcast_more", "2026-01-01T00:00:00"), str(tmp_path))
    report.write_result(result("broadcast", "2026-01-02T00:00:00"), str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["broadcast-ncu_h100_2026-01-01.json",
                                            "broadcast_h100_2026-01-02.json",
                                            "broadcast_more_h100_2026-01-01.json"]
    # another GPU's result stays beside it
    report.write_result(dict(result("broadcast", "2026-01-03T00:00:00"),
                              provenance={"device_tag": "h200", "date": "2026-01-03T00:00:00"}),
                         str(tmp_path))
    assert "broadcast_h100_2026-01-02.json" in os.listdir(tmp_path)
    assert "broadcast_h200_2026-01-03.json" in os.listdir(tmp_path)


def _sized_result(sizes, date, **provenance):
    prov = {"commit": "c0ffee", "device_tag": "4x-h200", "date": date, "dirty": False,
            "versions": {"jax": "0.11.2"}, "install": "source", "command": ["run.py", date]}
    return {"op": "all_to_all", "n": 4, "rows": [{"buffer_bytes": s} for s in sizes],
            "checked_bit_exact": [f"{s}" for s in sizes], "not_run": {}, "elapsed_s": 10.0,
            "provenance": dict(prov, **provenance)}


def test_merge_joins_the_sizes_of_several_calls(tmp_path):
    small = _sized_result([65536, 1 << 20], "2026-01-01T00:00:00")
    large = dict(_sized_result([1 << 30, 1 << 29], "2026-01-01T00:10:00"),
                 not_run={"nccl": "out of memory"})
    for name, part in (("a.json", small), ("b.json", large)):
        (tmp_path / name).write_text(json.dumps(part))
    out = tmp_path / "results"
    assert report.main(["--results", str(out), "--merge", str(tmp_path / "a.json"),
                        str(tmp_path / "b.json")]) == 0
    [name] = os.listdir(out)
    assert name == "all_to_all_4x-h200_2026-01-01.json"
    merged = json.loads((out / name).read_text())
    assert [r["buffer_bytes"] for r in merged["rows"]] == [65536, 1 << 20, 1 << 29, 1 << 30]
    assert merged["checked_bit_exact"] == ["65536", "1048576", "1073741824", "536870912"]
    assert merged["not_run"] == {"nccl": "out of memory"} and merged["elapsed_s"] == 20.0
    assert [c["date"] for c in merged["provenance"]["calls"]] == [
        "2026-01-01T00:00:00", "2026-01-01T00:10:00"]


@pytest.mark.parametrize("part, message", [
    (_sized_result([1 << 20], "d"), "1048576 bytes are measured twice"),
    (_sized_result([1 << 29], "d", commit="beef"), "provenance.commit differs"),
    (_sized_result([1 << 29], "d", dirty=True), "is a dirty tree's"),
    (dict(_sized_result([1 << 29], "d"), n=2), "the results' 'n' differ"),
    (dict(_sized_result([1 << 29], "d"), smoke=True), "is a smoke run's"),
])
def test_merge_refuses_results_that_do_not_join(part, message):
    with pytest.raises(ValueError, match=message):
        report.merge_results([_sized_result([1 << 20], "2026-01-01T00:00:00"), part])


def test_a_tree_stamp_names_the_files_changed_since(tmp_path, monkeypatch):
    # A copy of the checkout without .git (the GPU machine) carries a stamp.
    (tmp_path / "a.py").write_text("one")
    (tmp_path / "b.py").write_text("two")
    stamp = tmp_path / "tree_stamp.json"
    stamp.write_text(json.dumps({"commit": "c0ffee", "dirty_files": [], "files": {
        "a.py": provenance._sha256(str(tmp_path / "a.py")),
        "b.py": provenance._sha256(str(tmp_path / "b.py"))}}))
    monkeypatch.setattr(provenance, "ROOT", str(tmp_path))
    monkeypatch.setattr(provenance, "STAMP", str(stamp))
    monkeypatch.setattr(provenance, "_git_state", lambda: None)
    state = provenance.tree_state()
    assert state["commit"] == "c0ffee" and state["dirty_files"] == []
    (tmp_path / "b.py").write_text("changed")
    assert provenance.tree_state()["dirty_files"] == ["b.py"]
    monkeypatch.setattr(provenance, "STAMP", str(tmp_path / "none.json"))
    state = provenance.tree_state()
    assert state["commit"] is None and "run `python benchmarks/run.py stamp`" in \
        state["dirty_files"][0]


def test_a_dirty_tree_is_refused_or_marked(monkeypatch):
    monkeypatch.setattr(provenance, "tree_state", lambda: {
        "commit": "c0ffee", "dirty_files": ["jax_tma/_copy.py"], "from": "git"})
    with pytest.raises(provenance.DirtyTree, match=r"results must come from a committed tree "
                                                   r"\(or pass --allow-dirty.*jax_tma/_copy.py"):
        provenance.collect(jax.devices()[:1], allow_dirty=False)
    prov = provenance.collect(jax.devices()[:1], allow_dirty=True)
    assert prov["dirty"] and prov["commit"] == "c0ffee"
    assert "jax_tma/_copy.py" in prov["dirty_reasons"]


def test_ncu_listing_parses_units_and_thousands():
    listing = "\n".join([
        "==PROF== Connected to process 1",
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
        '"Section Name","Metric Name","Metric Unit","Metric Value"',
        '"0","1","python3","h","void ReadStreamKernel(const uint4 *)","1","7","Command line '
        'profiler metrics","dram__bytes_read.sum","byte","16,384"',
        '"0","1","python3","h","void ReadStreamKernel(const uint4 *)","1","7","Command line '
        'profiler metrics","gpu__time_duration.sum","usecond","2.50"',
        '"1","1","python3","h","ClusterBroadcastKernel<1>","1","7","Command line profiler '
        'metrics","dram__bytes_read.sum","Mbyte","33.57"',
        '"1","1","python3","h","ClusterBroadcastKernel<1>","1","7","SpeedOfLight","Memory '
        'Throughput","","n/a"',
    ])
    kernels = ncu.parse_csv(listing)
    assert [k["id"] for k in kernels] == [0, 1]
    assert kernels[0]["metrics"] == {"dram__bytes_read.sum": 16384,
                                     "gpu__time_duration.sum": 2500}
    assert kernels[1]["metrics"]["dram__bytes_read.sum"] == pytest.approx(33.57e6)
    with pytest.raises(ValueError, match="unknown unit 'furlong'"):
        ncu.parse_csv(listing.replace('"Mbyte"', '"furlong"'))


def test_ncu_kernels_split_into_variants_at_the_markers():
    from bench_broadcast import split_at_markers

    def kernel(name, read):
        return {"name": name, "metrics": {"dram__bytes_read.sum": read,
                                          "dram__bytes_write.sum": 2 * read,
                                          "gpu__time_duration.sum": 1000.0}}

    marker = kernel("void jax_tma::ReadStreamKernel(const uint4 *)", 16)
    kernels = [kernel("warm-up", 5), marker, kernel("Store", 100), marker,
               kernel("fusion_a", 300), kernel("fusion_b", 500), marker]
    rows = split_at_markers(kernels, ["store", "xla"], x_bytes=100)
    assert [(r["method"], r["dram_read_bytes"], r["read_over_x"], r["kernel_us"])
            for r in rows] == [("store", 100, 1.0, 1.0), ("xla", 800, 8.0, 2.0)]
    with pytest.raises(RuntimeError, match="ncu: 3 marker kernels around 3 variants"):
        split_at_markers(kernels, ["a", "b", "c"], x_bytes=100)
    with pytest.raises(RuntimeError, match="each needs a kernel between two markers"):
        split_at_markers([marker, marker, kernel("k", 1), marker], ["a", "b"], x_bytes=1)


@pytest.mark.gpu
@pytest.mark.parametrize("target", ["jax_tma_bench_seed_copy", "jax_tma_bench_memcpy"])
def test_copy_references_are_bit_exact(gpu, bench_ext, rng, target):
    # The seed-style TMA copy (one 48 KiB chunk per CTA) and cudaMemcpyAsync,
    # which the copy benchmark times jax_tma against, into poisoned outputs:
    # sizes below, at and around the chunk, many chunks with a partial last.
    import references

    references.register()
    chunk = 48 * 1024
    for nbytes in (16, chunk - 16, chunk, chunk + 16, 7 * chunk + 4096, (3 << 20) + 48):
        for dtype in (np.uint8, np.float32):
            x = random_array(rng, (nbytes // np.dtype(dtype).itemsize,), dtype)
            assert_bits_equal(into_poison(references.ffi_reference(target), x, gpu), x)


_HLO = """HloModule jit_step, is_scheduled=true

%fused_gather (param_0: bf16[8,4], param_1: s32[2]) -> bf16[2,4] {
  %param_0 = bf16[8,4]{1,0} parameter(0)
  %param_1 = s32[2]{0} parameter(1)
  ROOT %gather.1 = bf16[2,4]{1,0} gather(%param_0, %param_1), offset_dims={1}
}

%fused_two (p0: bf16[8,4], p1: bf16[8,4], /*index=2*/p2: s32[2]) -> (bf16[2,4], bf16[2,4]) {
  %p0 = bf16[8,4]{1,0} parameter(0)
  %p1 = bf16[8,4]{1,0} parameter(1)
  %p2 = s32[2]{0} parameter(2)
  %gather.2 = bf16[2,4]{1,0} gather(%p0, %p2), offset_dims={1}
  %gather.3 = bf16[2,4]{1,0} gather(%p1, %p2), offset_dims={1}
  ROOT %tuple = (bf16[2,4]{1,0}, bf16[2,4]{1,0}) tuple(%gather.2, %gather.3)
}

%fused_scatter (a: bf16[8,4]) -> bf16[8,4] {
  ROOT %a = bf16[8,4]{1,0} parameter(0)
}

%command_buffer (x: bf16[8,4], y: bf16[8,4], i: s32[2]) -> (bf16[2,4], bf16[2,4]) {
  %x = bf16[8,4]{1,0} parameter(0)
  %y = bf16[8,4]{1,0} parameter(1)
  %i = s32[2]{0} parameter(2)
  ROOT %loop_fusion = (bf16[2,4]{1,0}, bf16[2,4]{1,0}) fusion(%x, %y, %i), kind=kLoop, \
calls=%fused_two
}

ENTRY %main (x: bf16[8,4], y: bf16[8,4], i: s32[2]) -> bf16[2,4] {
  %x = bf16[8,4]{1,0} parameter(0)
  %y = bf16[8,4]{1,0} parameter(1)
  %i = s32[2]{0} parameter(2)
  %s = bf16[8,4]{1,0} fusion(%x), kind=kLoop, calls=%fused_scatter
  %one = bf16[2,4]{1,0} fusion(%s, %i), kind=kLoop, calls=%fused_gather
  %bare = bf16[2,4]{1,0} gather(%y, %i), offset_dims={1}
  %cb = (bf16[2,4]{1,0}, bf16[2,4]{1,0}) call(%x, %y, %i), to_apply=%command_buffer
  ROOT %r = bf16[2,4]{1,0} add(%one, %bare)
}
"""


def test_kernels_with_counts_fusions_holding_the_op():
    from bench_gather import kernels_with

    # %one (a fusion of one gather), %bare (unfused), %loop_fusion inside the
    # command buffer (two gathers in one multi-output fusion: one kernel).
    assert kernels_with(_HLO, "gather") == 3
    assert kernels_with(_HLO, "scatter") == 0
    assert kernels_with(_HLO.replace("%bare = bf16[2,4]{1,0} gather(%y, %i), offset_dims={1}",
                                     "%bare = bf16[2,4]{1,0} copy(%one)"), "gather") == 2


def test_kernels_with_counts_a_compiled_program():
    from bench_gather import _decode_step, _set_hinted, _take_hinted, kernels_with

    pools = (jnp.zeros((32, 2, 4), jnp.bfloat16), jnp.ones((32, 2, 4), jnp.bfloat16))
    args = (jnp.array([5, 13], jnp.int32), jnp.array([[1, 3], [2, 0]], jnp.int32),
            jnp.zeros((2, 2, 2, 4), jnp.bfloat16))
    text = jax.jit(_decode_step(_set_hinted, _take_hinted, 4)).lower(pools, *args).compile() \
        .as_text()
    assert kernels_with(text, "gather") in (1, 2), text  # the two pools' gathers


@pytest.mark.gpu
@pytest.mark.parametrize("hinted", [False, True], ids=["plain", "hinted"])
def test_xla_gathers_a_decode_steps_pools_in_one_kernel(gpu, hinted):
    # docs/ops/gather.md ("Several tables") says XLA fuses the gathers of a
    # decode step's K and V pools into one kernel; the compiled step of the
    # benchmark, its pools donated, shows it (a multi-output fusion).
    from bench_gather import _decode_step, _set, _set_hinted, _take, _take_hinted, kernels_with

    batch, per_seq, tokens, heads, dim = 4, 8, 16, 8, 128
    pages = 2 * batch * per_seq
    pools = tuple(jax.device_put(jnp.zeros((pages * tokens, heads, dim), jnp.bfloat16), gpu)
                  for _ in range(2))
    table = jnp.arange(batch * per_seq, dtype=jnp.int32).reshape(batch, per_seq)
    args = jax.device_put((jnp.arange(batch, dtype=jnp.int32) * tokens, table,
                           jnp.zeros((2, batch, heads, dim), jnp.bfloat16)), gpu)
    step = _decode_step(_set_hinted, _take_hinted, tokens) if hinted else \
        _decode_step(_set, _take, tokens)
    text = jax.jit(step, donate_argnums=0).lower(pools, *args).compile().as_text()
    assert kernels_with(text, "gather") == 1, text


def test_sanitizer_lines_become_a_result():
    import sanitizer

    lines = "\n".join([
        "nvcc\tCuda compilation tools, release 13.0, V13.0.88",
        "compute-sanitizer\tNVIDIA (R) Compute Sanitizer 2025.3",
        "probe\tsynccheck\t9\t16\tprobe: cluster 16 faulted",
        "largest_synccheck_cluster\t8",
        "copy_selftest\trun\t0\t\tcopy_selftest: 90 cases passed",
        "copy_selftest\tmemcheck\t0\t\t========= ERROR SUMMARY: 0 errors",
        "broadcast_selftest\tsynccheck\t0\tall 1234 8\t========= ERROR SUMMARY: 0 errors",
    ])
    r = sanitizer.summarize(lines)
    assert r["passed"] and r["largest_synccheck_cluster"] == 8
    assert r["programs"]["copy_selftest"]["memcheck"] == {
        "rc": 0, "args": "", "summary": "========= ERROR SUMMARY: 0 errors"}
    assert r["synccheck_cluster_probe"] == {"cluster": 16, "rc": 9,
                                            "summary": "probe: cluster 16 faulted"}
    text = report.render_sanitizer(r)
    assert ("| copy_selftest | ✓ copy_selftest: 90 cases passed | ✓ ========= ERROR SUMMARY: "
            "0 errors | not run | not run |") in text
    assert "(`all 1234 8`)" in text and "faults under synccheck" in text
    assert not sanitizer.summarize(lines + "\nwindow_selftest\tracecheck\t9\t\t")["passed"]
    with pytest.raises(ValueError, match="unknown tool 'helgrind'"):
        sanitizer.summarize("copy_selftest\thelgrind\t0\t\t")


def test_run_writes_the_sanitizer_result(tmp_path):
    tsv = tmp_path / "sanitizer.tsv"
    tsv.write_text("copy_selftest\trun\t0\t\tok\ncopy_selftest\tmemcheck\t0\t\tERROR SUMMARY: "
                   "0 errors\n")
    run = _run_py("sanitizer", "--tsv", str(tsv), "--allow-dirty", "--out-dir", str(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    (path, r), = report.load_results(str(tmp_path)).values()
    assert r["op"] == "sanitizer" and r["provenance"]["devices"] and r["passed"]
    assert "| copy_selftest | ✓ ok | ✓ ERROR SUMMARY: 0 errors |" in report.render(r, path)


def test_a_target_above_the_copy_ceiling_says_so():
    # XLA at 0.85x the ceiling: 1.2x XLA would be 1.02x the ceiling.
    def row(auto_us):
        times = {c: {"busy_us": us, "span_us": us}
                 for c, us in (("auto", auto_us), ("xla", 79.1), ("memcpy", 67.5))}
        return {"case": "scatter add of rows", "key": "adds", "kind": "add", "dtype": "float32",
                "times": times, "targets": {"xla": 1.2}}

    chained = {"target_gap_us": 0.3, "ops": 100, "bytes": 4096, "gap_us": 0.1, "target_met": True}
    lines = render_gather._render_gather_targets({"rows": [row(80.2), row(60.0)],
                                                  "chained_tiny_gathers": chained})
    assert lines[4].endswith("| 0.99× busy, 0.99× span | 1.17× | ✗ (above the ceiling) |")
    assert lines[5].endswith("| 1.32× busy, 1.32× span | 1.17× | ✓ |")
