"""The benchmarks (benchmarks/ of the checkout, outside the installed
package): the harness's bookkeeping, a smoke run of every benchmark's code
path on the CPU rendered by report.py, the README's benchmark sections
against the committed results (a hand edit fails here), provenance, the ncu
listing parser; on a GPU, the reference kernels that the copy benchmark
times jax_tma against."""

import importlib
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_tma
from reference import assert_bits_equal, into_poison, random_array

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_BENCHMARKS = os.path.join(_ROOT, "benchmarks")
if _BENCHMARKS not in sys.path:
    sys.path.insert(0, _BENCHMARKS)

import harness  # noqa: E402
import ncu  # noqa: E402
import provenance  # noqa: E402
import report  # noqa: E402


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


@pytest.mark.parametrize("name", ["bench_copy", "bench_window", "bench_im2col", "bench_broadcast",
                                  "bench_ppermute", "bench_tune_bulk", "bench_gather",
                                  "run"])
def test_every_benchmark_module_imports(name):
    # Without the benchmarks' extension too: it is loaded when a benchmark runs.
    importlib.import_module(name)


def test_size_text_takes_the_largest_unit_reached():
    assert [report.size_text(n) for n in (128, 1536, 32768, 1 << 20, 3 << 29, 1 << 30)] == [
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
    for fn in (jax_tma.scatter, _set):
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


def _run_py(*args, **env):
    return subprocess.run([sys.executable, "-P", os.path.join(_BENCHMARKS, "run.py"), *args],
                          env={**os.environ, "JAX_PLATFORMS": "cpu", **env},
                          capture_output=True, text=True, timeout=600)


def test_run_says_it_needs_a_gpu():
    run = _run_py("copy")
    assert run.returncode == 2, run.stderr
    assert "benchmarks/run.py: needs a CUDA GPU (--smoke runs the code paths" in run.stderr


@pytest.fixture(scope="module")
def smoke_results(tmp_path_factory):
    """Every benchmark that runs on the CPU, run once with tiny sizes."""
    out = tmp_path_factory.mktemp("smoke")
    run = _run_py("all", "--smoke", "--allow-dirty", "--out-dir", str(out),
                  XLA_FLAGS="--xla_force_host_platform_device_count=2")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "broadcast-ncu skipped in a smoke run" in run.stderr
    return out, report.load_results(str(out))


def test_smoke_run_writes_one_checked_result_per_op(smoke_results):
    out, results = smoke_results
    assert sorted(results) == ["broadcast", "copy", "gather", "im2col", "ppermute", "tune-bulk",
                               "window"]
    for op, (path, r) in results.items():
        assert os.path.basename(path).startswith(f"{op}_"), path
        assert r["smoke"] and r["timing_method"].startswith("smoke:")
        assert r["bytes_convention"] and r["checked_bit_exact"], op
        prov = r["provenance"]
        assert prov["date"][:10] in path and prov["versions"]["jax"] == jax.__version__
        assert prov["device_tag"] == ("2x-cpu" if op == "ppermute" else "cpu")
        assert prov["jax_tma"]["build_info"]["ffi_api_version"]
    window = results["window"][1]["rows"]
    # auto hands a traced start to SIMT, a static aligned one to the handler
    assert [r["auto_lowered_method"] for r in window[:3]] == ["simt", "simt", "auto"]
    assert "tma" not in window[3]["times"]  # x[::2, ::2] has no tensor-map form
    gather = results["gather"][1]
    assert [row["kind"] for row in gather["rows"]] == [
        "gather", "scatter set", "gather", "gather", "scatter add", "scatter add", "decode step"]
    for row in gather["rows"]:
        assert set(row["targets_met"]) == set(row["targets"]) <= {*row["vs"]["auto"]}
        for name in row["times"]:  # every timed case was checked first
            label = "memcpy ceiling" if name == "memcpy" else name
            assert f"{row['case']}: {label}" in gather["checked_bit_exact"]
    assert {"tma", "simt", "deterministic", "xla"} <= set(gather["rows"][4]["times"])
    assert [row["slab_bytes"] for row in gather["sweep"]["rows"]] == [128, 1024]
    assert [row["bytes"] for row in gather["small_gathers"]] == [2 * 4 * 2048, 2 * 16 * 2048]
    assert set(gather["chained_tiny_gathers"]["per_op"]) == {
        "gather", "gather_tma", "gather_simt", "minimal_ffi"}


def test_smoke_results_render_into_the_readme_sections(smoke_results):
    _, results = smoke_results
    with pytest.raises(ValueError, match="a smoke run's result cannot be published"):
        report.check_results(results)
    readme = "".join(f"<!-- bench:{op} -->\nold\n<!-- /bench:{op} -->\n" for op in report.RENDERERS)
    text = report.render_readme(readme, results)
    assert "old" not in text
    assert "(smoke run: measures nothing)" in text
    assert "No `broadcast-ncu` result at this commit" in text
    assert "| method | 4 replicas of 64² bf16 (axis=0) |" in text  # broadcast's table
    assert "| slab | auto | tma | simt | XLA | XLA hinted | copy ceiling |" in text  # gather's
    assert "The other methods, chained alike: `method='tma'`" in text
    assert "| gather 16 random rows of 2 KiB of 64 |" in text  # the small gathers
    assert "XLA comparators whose output differs from the bit-exact reference" not in \
        report.render(results["copy"][1])


def test_readme_tables_match_the_committed_results():
    # The README's benchmark sections are report.py's rendering of
    # benchmarks/results/: edit the results (by running the benchmarks),
    # then run `python benchmarks/report.py`, never the tables by hand.
    assert report.main(["--check"]) == 0


def test_a_hand_edit_of_a_table_is_caught(tmp_path):
    with open(report.README) as f:
        text = f.read()
    start = text.index("<!-- bench:copy -->\n") + len("<!-- bench:copy -->\n")
    edited = text[:start] + "| 1 MiB | 9.99 |\n" + text[start:]
    readme = tmp_path / "README.md"
    readme.write_text(edited)
    assert report.main(["--check", "--readme", str(readme)]) == 1


def test_report_refuses_two_results_of_one_op(tmp_path):
    for name in ("copy_a_2026-01-01.json", "copy_b_2026-01-02.json"):
        (tmp_path / name).write_text(json.dumps({"op": "copy"}))
    with pytest.raises(ValueError, match="two results for copy"):
        report.load_results(str(tmp_path))


def test_write_result_replaces_only_the_same_ops_results(tmp_path):
    def result(op, date):
        return {"op": op, "provenance": {"device_tag": "h100", "date": date}}

    harness.write_result(result("broadcast", "2026-01-01T00:00:00"), str(tmp_path))
    harness.write_result(result("broadcast-ncu", "2026-01-01T00:00:00"), str(tmp_path))
    harness.write_result(result("broadcast", "2026-01-02T00:00:00"), str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["broadcast-ncu_h100_2026-01-01.json",
                                            "broadcast_h100_2026-01-02.json"]


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
