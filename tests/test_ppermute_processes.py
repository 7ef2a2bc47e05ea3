"""jax_tma.ppermute with one process per device group: 2 to 4 processes on
localhost under jax.distributed (a local coordinator, 2 host devices each).
The blocks travel over the process link (ffi/ppermute/peer_link.h), bit-exact
against lax.ppermute over the global mesh; the "jax_tma" debug log must say
so. A peer that never calls, is killed, or calls with another permutation
fails every process still alive with an error that names it, within the
timeout (JAX_TMA_PPERMUTE_TIMEOUT_S), never a hang."""

import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _run(mode: str, count: int, rng, timeout_s: float | None = None) -> list[tuple[int, str]]:
    """(exit status, output) of each of `count` processes of
    tests/ppermute_process.py in `mode`."""
    port, seed = _free_port(), int(rng.integers(2**62))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")])))
    if timeout_s is not None:
        env["JAX_TMA_PPERMUTE_TIMEOUT_S"] = str(timeout_s)
    procs = [subprocess.Popen([sys.executable, "-P", os.path.join(HERE, "ppermute_process.py"),
                               mode, str(pid), str(count), str(port), str(seed)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for pid in range(count)]
    outputs = []
    try:
        for pid, p in enumerate(procs):
            # A process that stays alive on purpose (mode "never") is ended
            # once the others are done.
            wait = 5 if mode == "never" and pid == 1 else 300
            try:
                outputs.append((p.wait(timeout=wait), p.communicate()[0]))
            except subprocess.TimeoutExpired:
                p.kill()
                outputs.append((None, p.communicate()[0]))
    finally:
        for p in procs:
            p.kill()
    return outputs


@pytest.mark.parametrize("count", [2, 3, 4])
def test_processes_match_lax_ppermute(rng, count):
    for pid, (status, out) in enumerate(_run("check", count, rng)):
        assert status == 0, f"process {pid} exited {status}:\n{out[-4000:]}"
        assert f"process {pid}: ok" in out, out[-4000:]
        assert ("jax_tma: jax_tma.ppermute over ('i',) at " in out
                and f"jax_tma_ppermute (cpu blocks over the process link between {2 * count} "
                    f"devices of {count} processes {list(range(count))}" in out), out[-4000:]
        assert "lax.ppermute, because" not in out, out[-4000:]


def _survivors_failed(outputs, *, within_s: float, skip=(1,)):
    for pid, (status, out) in enumerate(outputs):
        if pid in skip:
            continue
        assert status == 0, f"process {pid} exited {status}:\n{out[-4000:]}"
        assert f"process {pid}: ok" in out, out[-4000:]
        took = float(out.split(f"process {pid}: failed after ")[1].split(" s")[0])
        assert took < within_s, out[-4000:]


def test_a_peer_that_never_calls_times_out_by_name(rng):
    outputs = _run("never", 2, rng, timeout_s=3)
    _survivors_failed(outputs, within_s=20)
    # Process 0 waits for the block of process 1's device 3 (the ring); it
    # times out, and its call site refuses the next call.
    out = outputs[0][1]
    assert "DEADLINE_EXCEEDED: jax_tma.ppermute at " in out and "ppermute_process.py:" in out
    assert "waiting for the block of device 2049 of process 1 from process 1" in out, out
    assert "an earlier call here failed" in out, out


def test_a_killed_peer_fails_the_others_at_once(rng):
    # With a minute to wait, the survivors still fail within seconds: the
    # killed process no longer listens, and its connection closes.
    outputs = _run("kill", 3, rng, timeout_s=60)
    assert outputs[1][0] == -9, outputs[1]
    _survivors_failed(outputs, within_s=15)
    # Process 2 waits for process 1's block; process 0 only sends to it.
    assert "process 1 is gone (its connection closed) while this process waited for the " \
           "block of device 2049 of process 1" in outputs[2][1] or \
           "process 1 is gone (nothing listens" in outputs[2][1], outputs[2][1]
    assert "process 1 is gone" in outputs[0][1] or "process 0: the first call finished" in \
        outputs[0][1], outputs[0][1]


def test_a_peer_with_another_permutation_fails_every_process(rng):
    outputs = _run("perm", 2, rng, timeout_s=5)
    _survivors_failed(outputs, within_s=30, skip=())
