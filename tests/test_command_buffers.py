"""Every op run from XLA's command buffers (CUDA graphs): each handler
declares ffi::Traits::kCmdBufferCompatible, and here each CUDA path runs in a
jitted loop of >= 100 steps (the MoE ops 200) with command buffers forced,
bit-exact at every step, with proof that the graph ran: XLA's thunk dump
holds the custom calls inside kCommandBuffer thunks, and the handlers ran
fewer times than the loop has steps (a replayed graph does not call them).
XLA's flags are per process, so tests/command_buffer_worker.py runs each
group of ops in a process of its own: on the GPU (one, then two in one
process), and on two host devices, where the same loops and comparisons run
without command buffers (the CPU run keeps the worker's code tested where CI
has no GPU). Here too: the dump parser on XLA's two line formats, and the
rule that every CUDA path the family manifests declare has a case."""

import os
import subprocess
import sys

import jax
import pytest

import command_buffer_worker as worker
from jax_tma import _jax_tma

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "command_buffer_worker.py")


def _run_worker(group: str, platform: str, rng, dump_dir) -> str:
    """The worker's output; fails unless every case of `group` passed. An
    exchange that waits for a peer gives up after 20 s, so that a hang fails
    the case by name well within the process's 240 s."""
    seed = int(rng.integers(2**62))
    env = dict(os.environ, JAX_TMA_PPERMUTE_TIMEOUT_S="20",
               PYTHONPATH=os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")])))
    os.makedirs(dump_dir, exist_ok=True)
    try:
        proc = subprocess.run([sys.executable, "-P", WORKER, group, platform, str(seed),
                               str(dump_dir)], env=env, capture_output=True, text=True,
                              timeout=240, cwd=dump_dir)
    except subprocess.TimeoutExpired as e:
        out = "".join(o if isinstance(o, str) else (o or b"").decode() for o in (e.stdout,
                                                                              e.stderr))
        pytest.fail(f"worker seed {seed} ran past 240 s:\n{out[-8000:]}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"worker seed {seed}:\n{out[-8000:]}"
    for case in worker.CASES[group]:
        assert f"case {case.name}: ok" in out, out[-8000:]
    assert "command buffer worker: ok" in out, out[-8000:]
    print(out)
    return out


# ---- on the GPU --------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.quick
def test_local_ops_replay_from_command_buffers(rng, tmp_path):
    """copy (its dynamic schedule), window, im2col, col2im, broadcast,
    gather, scatter, and the exchanges over a one-device mesh."""
    _run_worker("local", "gpu", rng, tmp_path / "dump")


@pytest.mark.gpu
def test_exchanges_replay_from_command_buffers(rng, tmp_path):
    """ppermute, all_to_all and ragged_all_to_all between two GPUs of this
    process, and moe_dispatch with moe_combine over 200 steps."""
    if len(jax.devices("cuda")) < 2:
        if os.environ.get("JAX_TMA_REQUIRE_MULTI_GPU") == "1":
            pytest.fail(f"JAX_TMA_REQUIRE_MULTI_GPU=1 but only {len(jax.devices('cuda'))} "
                        f"GPU(s) visible")
        pytest.skip("needs at least 2 GPUs")
    _run_worker("multi", "gpu", rng, tmp_path / "dump")


# ---- on host devices: the worker's code paths ------------------------------------

@pytest.mark.parametrize("group", sorted(worker.CASES))
def test_worker_on_host_devices(rng, tmp_path, group):
    out = _run_worker(group, "cpu", rng, tmp_path / "dump")
    assert ".cpu': " in out  # the CPU handlers' counts, at least one call a step


def test_every_cuda_path_has_a_case():
    """Every CUDA path the family manifests declare (a family without one,
    its CPU handlers alone so far, has nothing to capture)."""
    families = _jax_tma.families().values()
    paths = {p for f in families for p in f["paths"] if not p.endswith(".cpu")}
    targets = {t for f in families for t in f["targets"]}
    cases = [c for group in worker.CASES.values() for c in group]
    covered = {p for c in cases for p in c.paths}
    assert not paths - covered, (f"CUDA paths without a case in "
                                 f"tests/command_buffer_worker.py: {sorted(paths - covered)}")
    assert not covered - paths, f"cases name undeclared paths: {sorted(covered - paths)}"
    called = {t for c in cases for t in c.targets}
    assert called <= targets, f"cases name undeclared targets: {sorted(called - targets)}"
    assert len({c.name for c in cases}) == len(cases), "two cases share a name (a module name)"
    assert all(c.steps >= 100 for c in cases)
    assert all(c.steps >= 200 for c in cases if c.name.startswith("moe_"))
    multi = {p for c in worker.CASES["multi"] for p in c.paths}
    assert {"ppermute.tma", "ppermute.simt", "all_to_all.peer", "all_to_all.inbox",
            "ragged_all_to_all.peer", "ragged_all_to_all.inbox", "moe_combine.peer"} <= multi


# ---- the marker: XLA's thunk dump ---------------------------------------------------

def _render(thunks, indent: int, ids: bool, counter: list) -> str:
    """A thunk sequence as XLA prints it (SequentialThunk::ToString: two
    spaces a level, "%03d: " with ids, the kind padded, a tab, the thunk's
    own text; CommandBufferThunk: a newline, then its thunks a level
    deeper; WhileThunk: "condition:" and "body:", each sequence a level
    deeper). `thunks`: kinds, or (kind, nested...) tuples."""
    out = []
    width = max(len(t if isinstance(t, str) else t[0]) for t in thunks)
    for t in thunks:
        kind = t if isinstance(t, str) else t[0]
        line = " " * (2 * indent) + (f"{counter[0]:03d}: " if ids else "") + \
            kind.ljust(width) + "\t"
        counter[0] += 1
        if kind == "kCommandBuffer":
            line += "\n" + _render(t[1], indent + 2, ids, counter)
        elif kind == "kWhile":
            line += (" " * (2 * (indent + 1)) + "\ncondition:\n" +
                     _render(t[1], indent + 2, ids, counter) +
                     " " * (2 * (indent + 1)) + "body:\n" +
                     _render(t[2], indent + 2, ids, counter))
        elif kind == "kDynamicSliceFusion":
            line += "\n" + _render(t[1], indent + 2, ids, counter)
        out.append(line + "\n")
    return "".join(out)


def _dump(thunks, ids=True) -> str:
    return _render(thunks, 0, ids, [0])


@pytest.mark.parametrize("ids", [True, False], ids=["thunk ids", "no ids"])
def test_the_dump_parser_finds_custom_calls_inside_command_buffers(ids):
    loop_in_graphs = [
        "kKernel",
        ("kWhile", ["kKernel"],
         ["kKernel", ("kCommandBuffer", ["kKernel", "kCustomCall", "kKernel"]), "kCopy"]),
        ("kCommandBuffer", ["kCustomCall"]),
    ]
    assert worker.custom_calls_in_command_buffers(_dump(loop_in_graphs, ids)) == (2, 0)
    body_without_graph = [("kWhile", ["kKernel"], ["kKernel", "kCustomCall", "kKernel"]),
                          ("kCommandBuffer", ["kKernel"]), "kCustomCall"]
    assert worker.custom_calls_in_command_buffers(_dump(body_without_graph, ids)) == (0, 2)
    # A custom call after a command buffer, at its level, is outside it.
    after = [("kCommandBuffer", ["kKernel", "kCustomCall"]), "kCustomCall",
             ("kDynamicSliceFusion", ["kCustomCall"])]
    assert worker.custom_calls_in_command_buffers(_dump(after, ids)) == (1, 2)


def _write(folder, name, text):
    (folder / name).write_text(text)


_HLO = ('  %jax_tma_copy.4 = u32[10]{0} custom-call(%p), custom_call_target="jax_tma_copy", '
        'api_version=API_VERSION_TYPED_FFI\n')


def test_the_check_fails_without_the_marker(tmp_path):
    module = "jit_cmdbuf_copy_simt"
    check = lambda: worker.check_command_buffers(str(tmp_path), module,  # noqa: E731
                                                 ("jax_tma_copy",), gpu=True)
    with pytest.raises(AssertionError, match="no optimized HLO"):
        check()
    _write(tmp_path, f"module_0007.{module}.sm_9.0_gpu_after_optimizations.txt", _HLO)
    _write(tmp_path, "module_0008.jit_cmdbuf_copy.thunk_sequence_after_thunk_passes.txt",
           _dump([("kCommandBuffer", ["kCustomCall"])]))  # another module's
    with pytest.raises(AssertionError, match="no thunk-sequence dump"):
        check()
    _write(tmp_path, f"module_0007.{module}.thunk_sequence.txt", _dump(["kCustomCall"]))
    with pytest.raises(AssertionError, match="formed no command buffer: its thunk passes "
                                             "changed nothing"):
        check()
    after = tmp_path / f"module_0007.{module}.thunk_sequence_after_thunk_passes.txt"
    after.write_text(_dump([("kCommandBuffer", ["kKernel"]), "kCustomCall"]))
    with pytest.raises(AssertionError, match="0 custom-call thunks inside command buffers and "
                                             "1 outside"):
        check()
    after.write_text(_dump([("kWhile", ["kKernel"], [("kCommandBuffer", ["kCustomCall"])])]))
    assert check().startswith("1 custom-call thunks inside command buffers and 0 outside")
    with pytest.raises(AssertionError, match=r"no custom call to \['jax_tma_window'\]"):
        worker.check_command_buffers(str(tmp_path), module, ("jax_tma_window",), gpu=True)
    # A custom call of XLA's own (a cub sort it rewrote a sort into) may be
    # the one outside, but only with ours inside.
    _write(tmp_path, f"module_0007.{module}.sm_9.0_gpu_after_optimizations.txt",
           _HLO + _HLO.replace('"jax_tma_copy"', '"xla.gpu.ext.cub_sort_keys"'))
    after.write_text(_dump([("kCommandBuffer", ["kCustomCall"]), "kCustomCall"]))
    assert "and XLA's ['xla.gpu.ext.cub_sort_keys']" in check()
    after.write_text(_dump([("kCommandBuffer", ["kKernel"]), "kCustomCall", "kCustomCall"]))
    with pytest.raises(AssertionError, match="0 custom-call thunks inside command buffers and 2 "
                                             "outside, for 1 jax_tma custom calls and 1 others"):
        check()


def test_the_gpu_path_check_wants_replays():
    """A handler call for each recording, none for a replay: fewer calls
    than one loop's steps, on the case's paths alone."""
    case = worker.Case("copy_simt", ("copy.simt",), None)
    worker.check_paths(case, {"copy.simt": 4, "window.tiled": 9}, gpu=True, executions=2)
    for ran, why in (({}, "ran 0 times"), ({"copy.simt": 128}, "ran 128 times"),
                     ({"copy.simt": 2, "copy.tma": 1}, r"expected \('copy.simt',\) alone")):
        with pytest.raises(AssertionError, match=why):
            worker.check_paths(case, ran, gpu=True, executions=2)
    with pytest.raises(AssertionError, match="copy.cpu ran 255 times in 2 loops"):
        worker.check_paths(case, {"copy.cpu": 255}, gpu=False, executions=2)
