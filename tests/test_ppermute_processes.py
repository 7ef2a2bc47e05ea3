"""jax_tma.ppermute with one process per device group: two processes on
localhost under jax.distributed (a local coordinator, 2 host devices each),
bit-exact against lax.ppermute over the global mesh. Between processes the op
is lax.ppermute; the "jax_tma" debug log must say so and why."""

import os
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_processes_match_lax_ppermute(rng):
    port, seed = _free_port(), int(rng.integers(2**62))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")])))
    procs = [subprocess.Popen([sys.executable, "-P", os.path.join(HERE, "ppermute_process.py"),
                               str(pid), str(port), str(seed)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for pid in range(2)]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:
            p.kill()
    for pid, (p, out) in enumerate(zip(procs, outputs, strict=True)):
        assert p.returncode == 0, f"process {pid} (seed {seed}) exited {p.returncode}:\n{out[-4000:]}"
        assert f"process {pid}: ok" in out, out[-4000:]
        assert "jax_tma: jax_tma.ppermute over ('i',) at " in out, out[-4000:]
        assert "lax.ppermute, because the mesh spans 2 processes [0, 1]" in out, out[-4000:]
        assert "jax_tma_ppermute (" not in out, out[-4000:]
