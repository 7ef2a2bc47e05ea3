"""jax_tma.ppermute with one process per device group: 2 to 4 processes on
localhost under jax.distributed (a local coordinator), with 2 host devices
each, or all sharing the one GPU of the machine (the `gpu` tests, which
start their processes without touching the GPU here). On the CPU the blocks
travel over the process link (ffi/peer/peer_link.h); on the GPU each
process maps its peers' XLA allocations and the blocks move GPU to GPU
(ffi/peer/peer_copy.h). Either way they are bit-exact against the blocks
every process cuts from the same global array (NCCL refuses two ranks on one
GPU, so lax.ppermute cannot be the reference), and the "jax_tma" debug log
must name the transport. A peer that never calls, is killed, or calls with
another permutation fails every process still alive with an error that names
it, within the timeout (JAX_TMA_PPERMUTE_TIMEOUT_S), never a hang. A process
that is no part of the job (of this uid or another) and forges connections
to the processes' links changes nothing: every call stays bit-exact, each
forged connection is logged once, and no descriptor it passed stays open."""

import ctypes
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback

import pytest

import file_meeting

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port() -> int:
    """A port free now, below the kernel's ephemeral range: a port that
    bind(0) hands out is one the outgoing connections of other tests'
    processes may take before the coordinator binds it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    while True:
        port = rng.randrange(10000, max(low, 10001))
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port


_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not in the forked child


def _die_with_parent() -> None:
    """In a child: SIGKILL when this process ends, however it ends (a timeout
    that kills pytest must not leave processes holding the GPU). Between fork
    and exec it only calls prctl: no lock another thread may have held."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _run(mode: str, count: int, rng, timeout_s: float | None = None,
         platform: str = "cpu", intruder: "_Intruder | None" = None) -> list[tuple[int, str]]:
    """(exit status, output) of each of `count` processes of
    tests/ppermute_process.py in `mode` on `platform`, with `intruder`
    forging connections to them while they run. A coordinator that finds
    its port taken after all is started again on another."""
    seed = int(rng.integers(2**62))
    for _ in range(3):
        outputs = _run_on_port(_free_port(), seed, mode, count, timeout_s, platform, intruder)
        if not any("Address already in use" in out for _, out in outputs):
            break
    return outputs


def _run_on_port(port: int, seed: int, mode: str, count: int, timeout_s: float | None,
                 platform: str, intruder: "_Intruder | None") -> list[tuple[int, str]]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")])))
    if timeout_s is not None:
        env["JAX_TMA_PPERMUTE_TIMEOUT_S"] = str(timeout_s)
    if intruder is not None:
        env[_INTRUSION_ENV] = intruder.folder
    visible = env.get("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(count)))).split(",")
    if platform == "gpu":  # the processes share one GPU and its memory
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{0.8 / count:.3f}"
        visible = visible[:1] * count
    # Where each process has a GPU of its own (platform gpus), process i takes
    # the i-th visible GPU.
    envs = [env if platform == "cpu" else dict(env, CUDA_VISIBLE_DEVICES=visible[pid])
            for pid in range(count)]
    # Output to files, not pipes: a process that writes more than a pipe
    # holds (the cycles mode logs 250 lowerings) would block on its write
    # while this one waits for it to end.
    logs = [tempfile.TemporaryFile("w+") for _ in range(count)]
    procs = [subprocess.Popen([sys.executable, "-P", os.path.join(HERE, "ppermute_process.py"),
                               mode, str(pid), str(count), str(port), str(seed), platform],
                              env=envs[pid], stdout=log, stderr=subprocess.STDOUT, text=True,
                              preexec_fn=_die_with_parent)
             for pid, log in enumerate(logs)]
    if intruder is not None:
        intruder.start(count)
    statuses = []
    try:
        for pid, p in enumerate(procs):
            # A process that stays alive on purpose (modes "never", "stop")
            # is ended once the others are done.
            wait = 5 if mode.partition(":")[0] in ("never", "stop") and pid == 1 else 300
            try:
                statuses.append(p.wait(timeout=wait))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                statuses.append(None)
    finally:
        for p in procs:
            p.kill()
        if intruder is not None:
            intruder.finish()
    outputs = []
    for status, log in zip(statuses, logs):
        log.seek(0)
        outputs.append((status, log.read()))
        log.close()
    return outputs


def _exits(outputs) -> str:
    """Each process's exit status and the end of its output: where one fails,
    the first to fail is often another, whose output says why."""
    return "\n".join(f"process {pid} exited {status}:\n{out[-3000:]}"
                     for pid, (status, out) in enumerate(outputs))


@pytest.mark.parametrize("count", [2, 3, 4])
def test_processes_match_lax_ppermute(rng, count):
    outputs = _run("check", count, rng)
    for pid, (status, out) in enumerate(outputs):
        assert status == 0, _exits(outputs)
        assert f"process {pid}: ok" in out, out[-4000:]
        assert ("jax_tma: jax_tma.ppermute over ('i',) at " in out
                and f"jax_tma_ppermute (cpu blocks over the process link between {2 * count} "
                    f"devices of {count} processes {list(range(count))}" in out), out[-4000:]
        assert "lax.ppermute, because" not in out, out[-4000:]


def _survivors_failed(outputs, *, within_s: float, skip=(1,)):
    for pid, (status, out) in enumerate(outputs):
        if pid in skip:
            continue
        assert status == 0, _exits(outputs)
        assert f"process {pid}: ok" in out, out[-4000:]
        took = float(out.split(f"process {pid}: failed after ")[1].split(" s")[0])
        assert took < within_s, out[-4000:]


@pytest.mark.parametrize("count", [2, 3])
def test_processes_exchange_all_to_all_over_the_link(rng, count):
    outputs = _run("exchange", count, rng)
    for pid, (status, out) in enumerate(outputs):
        assert status == 0, _exits(outputs)
        assert f"process {pid}: ok" in out, out[-4000:]
        assert (f"jax_tma_all_to_all (cpu blocks over the process link between {2 * count} "
                f"devices of {count} processes" in out), out[-4000:]
        assert "lax.all_to_all, because" not in out, out[-4000:]


@pytest.mark.parametrize("count", [2, 3])
def test_processes_exchange_ragged_all_to_all_over_the_link(rng, count):
    outputs = _run("ragged", count, rng)
    for pid, (status, out) in enumerate(outputs):
        assert status == 0, _exits(outputs)
        assert f"process {pid}: ok" in out, out[-4000:]
        assert (f"jax_tma_ragged_all_to_all (cpu blocks over the process link between "
                f"{2 * count} devices of {count} processes" in out), out[-4000:]
        assert "lax.all_to_all of padded slices, because" not in out, out[-4000:]
    # Position 1 (process 0's second device) receives the last position's
    # slice from process count - 1 over the link, and refuses it.
    last = 2048 * (count - 1) + 1
    assert re.search(rf"process 0: refused: INVALID_ARGUMENT: jax_tma\.ragged_all_to_all: "
                     rf"recv_sizes\[{2 * count - 1}\] = \d+ on device 1 of process 0 "
                     rf"\(position 1\) differs from send_sizes\[1\] = \d+ on device {last} of "
                     rf"process {count - 1} \(position {2 * count - 1}\), the slice it sends "
                     rf"there", outputs[0][1]), outputs[0][1][-4000:]


@pytest.mark.parametrize("count", [2, 3])
def test_processes_run_moe_over_the_link(rng, count):
    outputs = _run("moe", count, rng)
    for op in ("ragged_all_to_all", "moe_combine", "moe_dispatch"):
        _all_moved(outputs, op, f"cpu blocks over the process link between {2 * count} "
                   f"devices of {count} processes")


def _all_moved(outputs, op: str, transport: str) -> None:
    """Every process passed its checks, and jax_tma's debug log names `op`'s
    transport, never a fallback to lax."""
    for pid, (status, out) in enumerate(outputs):
        assert status == 0, _exits(outputs)
        assert f"process {pid}: ok" in out, out[-4000:]
        assert f"jax_tma_{op} ({transport}" in out, out[-4000:]
        assert "lax.ppermute, because" not in out, out[-4000:]
        assert "lax.all_to_all, because" not in out, out[-4000:]
        assert "lax.all_to_all of padded slices, because" not in out, out[-4000:]
        assert "lax.all_to_all of the pairs and their rows, because" not in out, out[-4000:]


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


@pytest.mark.parametrize("op", ["all_to_all", "ragged_all_to_all"])
def test_an_exchange_peer_that_never_calls_times_out_by_name(rng, op):
    outputs = _run(f"never:{op}", 2, rng, timeout_s=3)
    _survivors_failed(outputs, within_s=20)
    out = outputs[0][1]
    assert re.search(rf"(DEADLINE_EXCEEDED|ABORTED): jax_tma\.{op} at \S*ppermute_process\.py:",
                     out), out
    assert "of process 1 from process 1; it never made this call" in out, out
    assert "an earlier call here failed" in out, out


@pytest.mark.parametrize("op", ["all_to_all", "ragged_all_to_all"])
def test_a_killed_exchange_peer_fails_the_others_at_once(rng, op):
    outputs = _run(f"kill:{op}", 3, rng, timeout_s=60)
    assert outputs[1][0] == -9, outputs[1]
    _survivors_failed(outputs, within_s=15)
    for pid in (0, 2):  # each receives from process 1 in an exchange
        assert "process 1 is gone" in outputs[pid][1], outputs[pid][1]


@pytest.mark.parametrize("op", ["all_to_all", "ragged_all_to_all"])
def test_an_exchange_peer_of_another_shape_fails_every_process(rng, op):
    outputs = _run(f"shape:{op}", 2, rng, timeout_s=5)
    _survivors_failed(outputs, within_s=30, skip=())


# ---- intruders ----

_INTRUSION_ENV = "JAX_TMA_TEST_INTRUSION_DIR"  # read by ppermute_process.py
_NOBODY = 65534
# peer_link.cc's wire format: a header (magic, kind, process, key size,
# size), then the key and the bytes.
_MAGIC, _HELLO, _DATA, _ABORT = 0x6A746D61, 1, 2, 3


def _header(kind: int, process: int, key_size: int = 0, size: int = 0) -> bytes:
    return struct.pack("=IIiIQ", _MAGIC, kind, process, key_size, size)


def _message(kind: int, process: int, key: bytes, data: bytes) -> bytes:
    return _header(kind, process, len(key), len(data)) + key + data


def _forgeries(other: int, memfd: int, pipe: int) -> list[tuple[bytes, bytes, list[int]]]:
    """The connections forged to a process of the job whose peer is process
    `other`: (bytes sent first, bytes sent with the descriptors, descriptors).
    Were any let in, the victim would take `other` for gone, fail its call,
    or map what the descriptors hold."""
    hello = _header(_HELLO, other)
    key = b"ppermute_process.py:1#3:1>0"
    return [
        (hello, b"", []),  # the repro: a hello, then gone
        (hello, _message(_ABORT, other, key, b"forged abort"), []),
        (hello, _message(_DATA, other, key, b"\0" * 16), [memfd]),
        (hello, _message(_DATA, other, key, b"\0" * 16), [pipe]),
        (os.urandom(64), b"", []),
        (_header(_HELLO, other, size=2**63), b"", []),
        (hello, _header(_DATA, other, 8, 2**63) + key[:8], []),
        (_header(7, other), b"", []),
    ]


_FORGED_PER_PROCESS = len(_forgeries(0, -1, -1))


class _Intruder:
    """A process of `uid`, no part of the job, that forges connections to
    the link of every process of a `_run` in the "intruded" mode while they
    make their calls: it reads their link names (which they write into
    `folder`), finds them in /proc/net/unix, as anyone can, and sends each
    process `_forgeries`, one connection each. It is a forked child of this
    process, which drops to `uid` (root can) and needs no interpreter of its
    own: another uid may not reach this one's."""

    def __init__(self, uid: int):
        self.uid = uid
        self.folder = tempfile.mkdtemp(prefix="jax_tma_intrusion.")
        os.chmod(self.folder, 0o777)  # the intruder may be of another uid
        self.pid = None
        self.status = None

    def start(self, count: int) -> None:
        self.pid = os.fork()
        if self.pid == 0:
            status = 1
            try:
                self._intrude(count)
                status = 0
            except BaseException:  # noqa: BLE001 (the child reports it and exits)
                traceback.print_exc()
            finally:
                os._exit(status)

    def finish(self) -> None:
        deadline = time.monotonic() + 30
        while self.status is None and time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
            else:
                time.sleep(0.05)
        if self.status is None:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        shutil.rmtree(self.folder, ignore_errors=True)

    def _intrude(self, count: int) -> None:
        if self.uid != os.geteuid():
            os.setgroups([])
            os.setgid(self.uid)
            os.setuid(self.uid)
        names = [file_meeting.wait_for(self.folder, f"victim{i}").split()[0]
                 for i in range(count)]
        with open("/proc/net/unix") as f:
            listed = f.read()
        assert all(f"@{name}" in listed for name in names), "the link names are not listed"
        memfd = os.memfd_create("jax_tma_intruder")
        os.write(memfd, b"memory a victim must never map")
        pipe, _ = os.pipe()
        file_meeting.write(self.folder, "intruding", "")
        for victim, name in enumerate(names):
            for first, rest, fds in _forgeries((victim + 1) % count, memfd, pipe):
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect("\0" + name)
                    try:  # the victim may close first
                        s.sendall(first)
                        if rest:
                            socket.send_fds(s, [rest], fds)
                    except (BrokenPipeError, ConnectionResetError):
                        pass
                time.sleep(0.01)
        file_meeting.write(self.folder, "intruded",
                           f"{os.getpid()} {os.geteuid()} {_FORGED_PER_PROCESS} "
                           f"{os.fstat(pipe).st_ino}\n")


def _refused_every_forgery(outputs, intruder: _Intruder, why: str) -> None:
    """Every process made its calls bit-exact, logged each forged connection
    once at WARNING with the intruder's pid and uid, and holds no descriptor
    it passed (ppermute_process.py checks that)."""
    assert intruder.status == 0, f"the intruder exited {intruder.status}"
    for pid, (status, out) in enumerate(outputs):
        assert status == 0, _exits(outputs)
        assert f"process {pid}: ok" in out, out[-4000:]
        logged = [line for line in out.splitlines() if line.startswith("WARNING jax_tma: ")]
        refused = (f"WARNING jax_tma: the jax_tma process link refused a connection "
                   f"(pid {intruder.pid}, uid {intruder.uid}): {why}")
        assert len(logged) == _FORGED_PER_PROCESS, out[-4000:]
        assert all(line.startswith(refused) for line in logged), out[-4000:]
        assert "is gone" not in out and f"process {pid}: failed" not in out, out[-4000:]


def test_an_intruder_of_this_uid_changes_nothing(rng):
    intruder = _Intruder(os.geteuid())
    outputs = _run("intruded", 2, rng, intruder=intruder)
    _refused_every_forgery(outputs, intruder, f"pid {intruder.pid} is not a process of this job")


def test_an_intruder_of_another_uid_changes_nothing(rng):
    if os.geteuid() != 0:
        pytest.skip("only root can start a process of another uid (CI runs as root)")
    intruder = _Intruder(_NOBODY)
    outputs = _run("intruded", 2, rng, intruder=intruder)
    _refused_every_forgery(outputs, intruder,
                           f"uid {_NOBODY} is not this process's uid {os.geteuid()}")


# ---- processes sharing the GPU ----


@pytest.fixture(scope="module")
def shared_gpu():
    """Skips without a CUDA GPU (JAX_TMA_REQUIRE_GPU=1 fails instead),
    asking a child process: this one must not take the GPU's memory."""
    probe = subprocess.run([sys.executable, "-P", "-c", "import jax; print(len(jax.devices('cuda')))"],
                           env=dict(os.environ, JAX_PLATFORMS="cuda"), capture_output=True, text=True)
    if probe.returncode != 0 or not probe.stdout.strip().isdigit():
        if os.environ.get("JAX_TMA_REQUIRE_GPU") == "1":
            pytest.fail(f"JAX_TMA_REQUIRE_GPU=1 but JAX sees no CUDA GPU: {probe.stderr[-2000:]}")
        pytest.skip("needs a CUDA GPU (set JAX_TMA_REQUIRE_GPU=1 to fail instead)")


@pytest.mark.parametrize("count", [pytest.param(2, marks=pytest.mark.quick), 3, 4])
def test_processes_sharing_a_gpu_move_blocks_gpu_to_gpu(rng, shared_gpu, count):
    outputs = _run("check", count, rng, platform="gpu")
    for pid, (status, out) in enumerate(outputs):
        assert status == 0, _exits(outputs)
        assert f"process {pid}: ok" in out, out[-4000:]
        assert (f"jax_tma_ppermute (cuda peer copies between {count} devices of {count} "
                f"processes {list(range(count))}" in out), out[-4000:]
        assert "lax.ppermute, because" not in out, out[-4000:]


@pytest.mark.parametrize("count", [2, 3])
def test_processes_sharing_a_gpu_exchange_all_to_all(rng, shared_gpu, count):
    outputs = _run("exchange", count, rng, platform="gpu")
    for pid, (status, out) in enumerate(outputs):
        assert status == 0, _exits(outputs)
        assert f"process {pid}: ok" in out, out[-4000:]
        assert (f"jax_tma_all_to_all (cuda peer copies between {count} devices of {count} "
                f"processes {list(range(count))}" in out), out[-4000:]
        assert "lax.all_to_all, because" not in out, out[-4000:]


@pytest.mark.parametrize("count", [2, 3])
def test_processes_sharing_a_gpu_exchange_ragged_all_to_all(rng, shared_gpu, count):
    outputs = _run("ragged", count, rng, platform="gpu")
    for pid, (status, out) in enumerate(outputs):
        assert status == 0, _exits(outputs)
        assert f"process {pid}: ok" in out, out[-4000:]
        assert (f"jax_tma_ragged_all_to_all (cuda peer copies between {count} devices of "
                f"{count} processes {list(range(count))}" in out), out[-4000:]
        assert "lax.all_to_all of padded slices, because" not in out, out[-4000:]


@pytest.mark.parametrize("count", [2, 3])
def test_processes_sharing_a_gpu_run_moe(rng, shared_gpu, count):
    outputs = _run("moe", count, rng, platform="gpu")
    for op in ("ragged_all_to_all", "moe_combine", "moe_dispatch"):
        _all_moved(outputs, op, f"cuda peer copies between {count} devices of {count} "
                   f"processes {list(range(count))}")


# ---- one GPU each ----


@pytest.fixture(scope="module")
def own_gpus() -> int:
    """The processes of a test on GPUs of their own: as many as the machine
    has, up to 4 (asked of a child process, as shared_gpu does). Skips with
    fewer than 2 (JAX_TMA_REQUIRE_MULTI_GPU=1 fails instead)."""
    probe = subprocess.run([sys.executable, "-P", "-c", "import jax; print(len(jax.devices('cuda')))"],
                           env=dict(os.environ, JAX_PLATFORMS="cuda"), capture_output=True, text=True)
    gpus = int(probe.stdout.strip()) if probe.stdout.strip().isdigit() else 0
    if gpus < 2:
        if os.environ.get("JAX_TMA_REQUIRE_MULTI_GPU") == "1":
            pytest.fail(f"JAX_TMA_REQUIRE_MULTI_GPU=1 but JAX sees {gpus} CUDA GPU(s): "
                        f"{probe.stderr[-2000:]}")
        pytest.skip("needs at least 2 CUDA GPUs (set JAX_TMA_REQUIRE_MULTI_GPU=1 to fail instead)")
    return min(gpus, 4)


@pytest.mark.parametrize("mode, op", [("check", "ppermute"), ("exchange", "all_to_all"),
                                      ("ragged", "ragged_all_to_all"),
                                      ("moe", "ragged_all_to_all")])
def test_processes_on_gpus_of_their_own(rng, own_gpus, mode, op):
    """As many processes as GPUs (up to 4), one each: every mode's checks
    pass over the mapped peer memory of the other GPUs."""
    outputs = _run(mode, own_gpus, rng, platform="gpus")
    _all_moved(outputs, op, f"cuda peer copies between {own_gpus} devices of {own_gpus} "
               f"processes {list(range(own_gpus))}")


def test_a_loop_across_processes_replays_from_command_buffers(rng, shared_gpu):
    outputs = _run("replay", 2, rng, platform="gpu")
    for pid, (status, out) in enumerate(outputs):
        assert status == 0, _exits(outputs)
        assert f"process {pid}: ok" in out, out[-4000:]


def test_compile_and_free_cycles_release_what_the_transport_holds(rng, shared_gpu):
    # 250 new executables, each set up at its first call and freed: the
    # participants, mailboxes, VA reservations, mappings and descriptors
    # stay as they were after the first 10: one of anything held per cycle
    # would show 240 times over. (1000 cycles took 58-77 s of the GPU
    # suite's wall time on an H200, its longest test.)
    outputs = _run("cycles", 2, rng, platform="gpu")
    for pid, (status, out) in enumerate(outputs):
        assert status == 0, _exits(outputs)
        assert f"process {pid}: ok" in out, out[-4000:]


def test_a_gpu_peer_that_never_calls_times_out_by_name(rng, shared_gpu):
    outputs = _run("never", 2, rng, timeout_s=3, platform="gpu")
    _survivors_failed(outputs, within_s=20)
    out = outputs[0][1]
    assert "DEADLINE_EXCEEDED: jax_tma.ppermute at " in out, out
    assert "waiting for the mailbox of device 0 of process 1 from process 1" in out, out
    assert "an earlier call here failed" in out, out


def test_a_killed_gpu_peer_fails_the_others_at_once(rng, shared_gpu):
    outputs = _run("kill", 3, rng, timeout_s=60, platform="gpu")
    assert outputs[1][0] == -9, outputs[1]
    _survivors_failed(outputs, within_s=15)
    assert "process 1 is gone" in outputs[2][1], outputs[2][1]


def test_a_gpu_peer_with_another_permutation_fails_every_process(rng, shared_gpu):
    # Three processes: with two, the reversed ring is the same permutation.
    outputs = _run("perm", 3, rng, timeout_s=5, platform="gpu")
    _survivors_failed(outputs, within_s=30, skip=())


def test_a_gpu_peer_that_stops_calling_fails_the_step_by_name(rng, shared_gpu):
    # After the first call, calls meet only on the GPU: the waiting kernel
    # gives up after the timeout and traps, and the reason names the peer.
    outputs = _run("stop", 2, rng, timeout_s=3, platform="gpu")
    _survivors_failed(outputs, within_s=20)
    out = outputs[0][1]
    assert ("timed out after 3 s waiting for device 0 of process 1 to publish its buffer for "
            "call 2" in out), out


@pytest.mark.parametrize("op", ["all_to_all", "ragged_all_to_all"])
def test_a_gpu_exchange_peer_that_never_calls_times_out_by_name(rng, shared_gpu, op):
    outputs = _run(f"never:{op}", 2, rng, timeout_s=3, platform="gpu")
    _survivors_failed(outputs, within_s=20)
    out = outputs[0][1]
    assert f"DEADLINE_EXCEEDED: jax_tma.{op} at " in out, out
    assert "waiting for the mailbox of device 0 of process 1 from process 1" in out, out


@pytest.mark.parametrize("op", ["all_to_all", "ragged_all_to_all"])
def test_a_killed_gpu_exchange_peer_fails_the_others_at_once(rng, shared_gpu, op):
    outputs = _run(f"kill:{op}", 3, rng, timeout_s=60, platform="gpu")
    assert outputs[1][0] == -9, outputs[1]
    _survivors_failed(outputs, within_s=15)
    for pid in (0, 2):
        assert "process 1 is gone" in outputs[pid][1], outputs[pid][1]


@pytest.mark.parametrize("op", ["all_to_all", "ragged_all_to_all"])
def test_a_gpu_exchange_peer_of_another_shape_fails_every_process(rng, shared_gpu, op):
    outputs = _run(f"shape:{op}", 2, rng, timeout_s=5, platform="gpu")
    _survivors_failed(outputs, within_s=30, skip=())


@pytest.mark.parametrize("op", ["all_to_all", "ragged_all_to_all"])
def test_a_gpu_exchange_peer_that_stops_calling_fails_the_step_by_name(rng, shared_gpu, op):
    # These buffers (under 4 MiB) go through the inbox exchange: what times
    # out is the wait for the peer's copy into this device's inbox.
    outputs = _run(f"stop:{op}", 2, rng, timeout_s=3, platform="gpu")
    _survivors_failed(outputs, within_s=20)
    out = outputs[0][1]
    assert re.search(rf"jax_tma\.{op} at \S+ on device 0 of process 0: timed out after 3 s "
                     r"waiting for device 0 of process 1 to finish its copy in call 2", out), out


@pytest.mark.parametrize("op", ["all_to_all", "ragged_all_to_all"])
def test_a_killed_gpu_exchange_peer_fails_the_step_at_once(rng, shared_gpu, op):
    outputs = _run(f"die:{op}", 2, rng, timeout_s=60, platform="gpu")
    assert outputs[1][0] == -9, outputs[1]
    _survivors_failed(outputs, within_s=15)
    assert "the process of device 0 of process 1 is gone" in outputs[0][1], outputs[0][1]


def test_an_intruder_changes_nothing_on_a_shared_gpu(rng, shared_gpu):
    intruder = _Intruder(os.geteuid())
    outputs = _run("intruded", 2, rng, platform="gpu", intruder=intruder)
    _refused_every_forgery(outputs, intruder, f"pid {intruder.pid} is not a process of this job")


def test_a_killed_gpu_peer_fails_the_step_at_once(rng, shared_gpu):
    outputs = _run("die", 2, rng, timeout_s=60, platform="gpu")
    assert outputs[1][0] == -9, outputs[1]
    _survivors_failed(outputs, within_s=15)
    out = outputs[0][1]
    assert "the process of device 0 of process 1 is gone" in out, out
