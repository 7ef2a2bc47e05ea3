"""One process of tests/test_ppermute_processes.py: process `pid` of `count`
under jax.distributed with a local coordinator, with 2 host devices
(PLATFORM cpu, the default), the one GPU that all the processes share
(gpu), or one GPU each (gpus: the caller gives each process its own in
CUDA_VISIBLE_DEVICES); prints the jax_tma debug log, then "process PID: ok"
or the error it expects.

    usage: python tests/ppermute_process.py MODE PID COUNT PORT SEED [PLATFORM]

MODE:
  check  jax_tma.ppermute over the global mesh (1-D and 2-D, several
         dtypes, blocks of 0 bytes to 20 MiB, not multiples of 16 bytes among
         them), bit for bit, fresh random data every iteration. (NCCL and
         Gloo are no reference: lax.ppermute quiets bf16 NaN payloads on
         the CPU.)
  never  process 1 never makes the call: the others time out naming it, and
         their call site refuses the next call.
  kill   process 1 is killed (SIGKILL) as the call starts: the others fail at
         once, naming it (one that only sends to it may finish that call, and
         fails the next).
  perm   process 1 calls with another permutation: every process fails
         instead of taking a block meant for another call.
  exchange  jax_tma.all_to_all over the global mesh (1-D and 2-D, several
         dtypes, split and concat dims, tiled or not, chunks of 0 bytes to
         8 MiB), bit for bit against the chunks moved in NumPy, fresh random
         data every iteration.
  ragged jax_tma.ragged_all_to_all over the global mesh (1-D and 2-D, several
         dtypes and row sizes, 1 or 2 slices a position, random, empty and
         skewed sizes, slices up to 4 MiB), bit for bit against NumPy, fresh
         rows and offsets every iteration; then a call whose recv_sizes
         differ from what a device of another process sends, which fails
         naming both, and the same call site again with valid sizes.
  moe    jax_tma.moe_dispatch and moe_combine over the global mesh (masked
         ids, dropless and with a capacity that drops), recv row for row,
         group sizes, drops and combine's sums bit for bit against the NumPy
         reference, fresh tokens and routing every iteration.
  intruded  40 calls around the ring, bit for bit, while a process of the
         test (no part of the job) forges connections to this one's link
         (the folder JAX_TMA_TEST_INTRUSION_DIR is where they meet): each is
         logged once at WARNING, and no descriptor it passed, nor any
         connection, stays open here.
  (GPU only, gpu or gpus; after a first call that every process makes:)
  replay jitted loops of 128 ppermutes and of 200 all_to_alls replay from
         XLA's command buffers: bit-exact, with fewer handler calls than
         loop iterations.
  cycles 250 cycles of compiling, calling and freeing a new jitted
         ppermute: bit-exact, and what the transport holds (participants,
         mailboxes, VA reservations, mapped allocations) and the process's
         open descriptors do not grow.
  stop   process 1 stops calling: the others' waiting kernel traps after
         the timeout, failing the step, and the reason names it on stderr;
         their next call fails too (the GPU context is lost), never hangs.
  die    process 1 is killed (SIGKILL): the others' waiting kernel traps at
         once, and the reason names it.
"""

import gc
import logging
import os
import signal
import sys
import time
import traceback

mode, pid, count, port, seed = sys.argv[1], *map(int, sys.argv[2:5]), int(sys.argv[5])
platform = sys.argv[6] if len(sys.argv) > 6 else "cpu"
if platform == "cpu":
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    os.environ["JAX_PLATFORMS"] = "cpu"
else:
    # The moe mode's reference rounds on the host: XLA's conversion on the CPU.
    os.environ["JAX_PLATFORMS"] = "cuda,cpu" if mode == "moe" else "cuda"
    # Command buffers for graphs of any size: the replay mode's loop body
    # holds two thunks.
    os.environ["XLA_FLAGS"] = "--xla_gpu_graph_min_graph_size=1"
per = 2 if platform == "cpu" else 1  # devices per process

import jax  # noqa: E402

jax.distributed.initialize(f"localhost:{port}", num_processes=count, process_id=pid,
                           initialization_timeout=60)

import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_tma  # noqa: E402
from jax_tma import _ffi, _ppermute  # noqa: E402
from jax_tma._ppermute import device_plan  # noqa: E402
import file_meeting  # noqa: E402
from reference import assert_bits_equal, random_array  # noqa: E402

logging.basicConfig(stream=sys.stdout, format="%(levelname)s %(name)s: %(message)s")
logging.getLogger("jax_tma").setLevel(logging.DEBUG)
n = per * count
assert jax.process_count() == count and len(jax.devices()) == n, jax.devices()


def shard_mapped(fn, mesh, axis, perm):
    spec = P(*mesh.axis_names)
    return jax.jit(jax.shard_map(lambda b: fn(b, axis, perm), mesh=mesh, in_specs=spec,
                                 out_specs=spec))


def global_array(mesh, x):
    sharding = NamedSharding(mesh, P(*mesh.axis_names))
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def check(mesh, axis, perm, dtype, shape, iterations):
    """jax_tma.ppermute of fresh random data, bit for bit against the blocks
    every process cuts from the same global array (same seed, same shape):
    each device gets its source's block, or zeros."""
    ours = shard_mapped(jax_tma.ppermute, mesh, axis, perm)
    _, sources = device_plan(mesh, (axis,) if isinstance(axis, str) else axis, tuple(perm))
    indices = NamedSharding(mesh, P(*mesh.axis_names)).devices_indices_map(shape)
    block = [indices[d] for d in mesh.devices.flat]
    rng = np.random.default_rng([seed, iterations, *shape])
    for _ in range(iterations):
        x = random_array(rng, shape, dtype)
        want = np.zeros_like(x)
        for i, s in enumerate(sources):
            if s >= 0:
                want[block[i]] = x[block[s]]
        got = ours(global_array(mesh, x))
        for shard in got.addressable_shards:
            assert_bits_equal(shard.data, want[shard.index])


def expect_failure(fn, *patterns):
    """Runs fn, which must raise an error matching every pattern; prints it."""
    try:
        jax.block_until_ready(fn())
    except Exception as e:  # noqa: BLE001 (XLA's runtime error, whatever its class)
        msg = str(e).split("\n")[0]
        print(f"process {pid}: failed: {msg}", flush=True)
        missing = [p for p in patterns if p not in msg]
        assert not missing, f"{missing} not in {msg}"
        return
    raise AssertionError(f"process {pid}: the call did not fail")


def main():
    if mode == "check":
        run_checks()
    elif mode == "exchange":
        run_exchanges()
    elif mode == "ragged":
        run_ragged()
    elif mode == "moe":
        run_moe()
    elif mode == "replay":
        run_replay()
    elif mode == "cycles":
        run_cycles()
    elif mode.partition(":")[0] in ("stop", "die"):
        run_device_fault()
    elif mode == "intruded":
        run_intruded()
    else:
        run_fault()
    print(f"process {pid}: ok", flush=True)


ring = [(i, (i + 1) % n) for i in range(n)]
mesh_1d = Mesh(np.array(jax.devices()), ("i",))


def run_checks():
    for dtype in (np.float32, np.int8, np.uint16, np.complex64, jax.numpy.bfloat16, np.bool_):
        check(mesh_1d, "i", ring, dtype, (n * 3, 5), iterations=3)
    for rows in (0, 1, 7, 1 << 20):  # 0 B, 20 B, 140 B and 20 MiB blocks
        check(mesh_1d, "i", ring, np.float32, (n * rows, 5), iterations=1)
    if platform != "cpu" and count == 2:  # 1 GiB + 3 B per GPU
        check(mesh_1d, "i", ring, np.uint8, (n * ((1 << 30) + 3),), iterations=1)
    partial = [(0, n - 1), (n - 1, 1)] if n > 2 else [(0, 1)]
    check(mesh_1d, "i", partial, np.int16, (n * 7,), iterations=2)
    # A 2-D mesh: processes x their devices on the CPU; on the GPUs (one per
    # process) pairs of processes where the count is even.
    rows, cols = (count, per) if per > 1 or count % 2 else (count // 2, 2)
    mesh_2d = Mesh(np.array(jax.devices()).reshape(rows, cols), ("a", "b"))
    check(mesh_2d, ("a",), [(i, (i + 1) % rows) for i in range(rows)], np.float32,
          (rows * 3, cols * 4), iterations=2)
    check(mesh_2d, ("b",), [(0, 1), (1, 0)] if cols == 2 else [(0, 0)], np.uint8,
          (rows * 2, cols * 9), iterations=2)
    check(mesh_2d, ("a", "b"), ring, np.int32, (rows * 2, cols * 3), iterations=2)


def exchange(mesh, axis, split, concat, tiled, dtype, block, iterations):
    """jax_tma.all_to_all of fresh random data over mesh axes `axis` (a
    group of every device of the mesh along them), bit for bit against the
    chunks moved in NumPy: the global array's blocks along dim 0, in the
    mesh's device order."""
    spec = P(mesh.axis_names)
    f = jax.jit(jax.shard_map(lambda b: jax_tma.all_to_all(b, axis, split, concat, tiled=tiled),
                              mesh=mesh, in_specs=spec, out_specs=spec))
    rng = np.random.default_rng([seed, iterations, *block])
    for _ in range(iterations):
        x = random_array(rng, (n * block[0], *block[1:]), dtype)
        blocks = np.split(x, n)
        s, c = split, concat
        if not tiled and s != c:
            s, c = (s, c + 1) if s < c else (s + 1, c)
            blocks = [np.expand_dims(b, c) for b in blocks]
        chunks = [np.split(b, n, axis=s) for b in blocks]
        out = [np.concatenate([chunks[i][j] for i in range(n)], axis=c) for j in range(n)]
        if not tiled and s != c:
            out = [np.squeeze(o, axis=s) for o in out]
        want = np.concatenate(out)
        got = f(jax.make_array_from_callback(x.shape, NamedSharding(mesh, spec),
                                             lambda index: x[index]))
        for shard in got.addressable_shards:
            assert_bits_equal(shard.data, want[shard.index])


def run_exchanges():
    for dtype in (np.float32, np.int8, jax.numpy.bfloat16, np.bool_):
        exchange(mesh_1d, "i", 0, 0, True, dtype, (n * 3, 5), iterations=2)
    # Chunks of 0 B, 4 B (the inbox's low-latency form), 128 KiB (its plain form) and 4 MiB.
    for rows in (0, 1, 1 << 15, 1 << 20):
        exchange(mesh_1d, "i", 0, 0, True, np.float32, (n * rows,), iterations=1)
    exchange(mesh_1d, "i", 1, 0, False, np.uint16, (2, n, 7), iterations=2)
    exchange(mesh_1d, "i", 0, 1, True, np.int32, (n * 2, 3), iterations=2)
    rows, cols = (count, per) if per > 1 or count % 2 else (count // 2, 2)
    mesh_2d = Mesh(np.array(jax.devices()).reshape(rows, cols), ("a", "b"))
    exchange(mesh_2d, ("a", "b"), 0, 0, True, np.float32, (n * 2, 3), iterations=2)


def ragged_call(mesh):
    spec = P(mesh.axis_names)
    return jax.jit(jax.shard_map(
        lambda *a: jax_tma.ragged_all_to_all(*a, axis_name=mesh.axis_names), mesh=mesh,
        in_specs=spec, out_specs=spec))


def ragged(mesh, dtype, row, per, iterations, **kw):
    """jax_tma.ragged_all_to_all over every device of the mesh (the global
    arrays' blocks along dim 0, in the mesh's device order), of fresh random
    rows and offsets (the same in every process: one seed), bit for bit
    against NumPy."""
    from families.ppermute import ragged_geometry, ragged_reference  # (host devices only)

    f = ragged_call(mesh)
    spec = NamedSharding(mesh, P(mesh.axis_names))
    rng = np.random.default_rng([seed, iterations, per, *row])
    for _ in range(iterations):
        g = ragged_geometry(rng, n, per, **kw)
        index = [g[k] for k in ("input_offsets", "send_sizes", "output_offsets", "recv_sizes")]
        operand = random_array(rng, (n * g["rows"],) + row, dtype)
        output = random_array(rng, (n * g["out_rows"],) + row, dtype)
        want = ragged_reference(operand, output, *index, n)
        got = f(*(jax.make_array_from_callback(a.shape, spec, lambda i, a=a: a[i])
                  for a in (operand, output, *index)))
        for shard in got.addressable_shards:
            assert_bits_equal(shard.data, want[shard.index])
    return f


def run_ragged():
    from families.ppermute import ragged_geometry, ragged_reference

    for dtype in (np.float32, np.int8, jax.numpy.bfloat16, np.bool_):
        ragged(mesh_1d, dtype, (3,), 1, iterations=2)
    ragged(mesh_1d, np.uint16, (5,), 2, iterations=2, max_size=0)  # nothing moves
    ragged(mesh_1d, np.float32, (7,), 2, iterations=2, skew=True)  # all to position 0
    ragged(mesh_1d, np.uint8, (1 << 20,), 1, iterations=1, max_size=4)  # up to 4 MiB a slice
    rows, cols = (count, per) if per > 1 or count % 2 else (count // 2, 2)
    mesh_2d = Mesh(np.array(jax.devices()).reshape(rows, cols), ("a", "b"))
    f = ragged(mesh_2d, np.int32, (2,), 2, iterations=2)
    if platform != "cpu":
        return  # a GPU's refusal traps, losing the context (tests/test_multi_gpu.py)
    # recv_sizes of position 1 for the last position's slice one more than
    # it sends: the receiver refuses it, naming both; then the call site
    # works on.
    rng = np.random.default_rng([seed, 7])
    g = ragged_geometry(rng, n, 1, max_size=2)
    index = [g[k] for k in ("input_offsets", "send_sizes", "output_offsets", "recv_sizes")]
    operand = random_array(rng, (n * g["rows"],) + (2,), np.int32)
    output = random_array(rng, (n * g["out_rows"],) + (2,), np.int32)
    spec = NamedSharding(mesh_2d, P(mesh_2d.axis_names))
    put = lambda a: jax.make_array_from_callback(a.shape, spec, lambda i: a[i])  # noqa: E731
    bad = index[3].copy()
    bad[1 * n + n - 1] += 1
    try:
        jax.block_until_ready(f(put(operand), put(output), *map(put, index[:3]), put(bad)))
        print(f"process {pid}: the bad call passed here", flush=True)
    except Exception as e:  # noqa: BLE001 (XLA's runtime error)
        print(f"process {pid}: refused: {str(e).splitlines()[0]}", flush=True)
    got = f(put(operand), put(output), *map(put, index))
    want = ragged_reference(operand, output, *index, n)
    for shard in got.addressable_shards:
        assert_bits_equal(shard.data, want[shard.index])


def run_moe():
    """Tokens carry their random bits through dispatch (row for row against
    the reference), then normal values that combine sums (no subnormal
    sum), as tests/test_multi_gpu.py checks them in one process. Rows of 64
    elements, and of 22,016 once: past the inbox's limit of pair rows, where
    combine sums them on their way home (jax_tma_moe_combine)."""
    from reference import moe_combine_reference, moe_dispatch_reference

    tokens, k, experts = 48, 4, 2 * n
    spec = NamedSharding(mesh_1d, P("i"))
    put = lambda a: jax.make_array_from_callback(a.shape, spec, lambda i: a[i])  # noqa: E731
    rng = np.random.default_rng([seed, 43])
    for width, capacity, calls in ((64, None, 2), (64, 20, 2), (22_016, None, 1)):
        def body(x, ids, weights, capacity=capacity, width=width):
            recv, plan = jax_tma.moe_dispatch(x, ids, num_experts=experts, axis_name="i",
                                              capacity=capacity)
            out = jax_tma.moe_combine(recv[:, width:], plan, weights)
            return recv, plan.group_sizes, plan.dropped, out

        f = jax.jit(jax.shard_map(body, mesh=mesh_1d, in_specs=P("i"), out_specs=P("i")))
        for _ in range(calls):
            ids = rng.integers(-1, experts, (n * tokens, k)).astype(np.int32)
            bits = random_array(rng, (n * tokens, width), jax.numpy.bfloat16)
            values = rng.standard_normal((n * tokens, width)).astype(jax.numpy.bfloat16)
            weights = rng.standard_normal((n * tokens, k)).astype(np.float32)
            x = np.concatenate([bits, values], axis=1)
            recv, sizes, dropped, out = f(put(x), put(ids), put(weights))
            want, want_sizes, want_dropped, placed = moe_dispatch_reference(
                x, ids, n, experts, capacity)
            # The rows past each device's received total are unspecified:
            # zeros here, which combine never reads.
            per_device = recv.shape[0] // n
            y = np.zeros((n, per_device, width), x.dtype)
            for d in range(n):
                y[d, :len(want[d])] = want[d][:, width:]
            want_out = moe_combine_reference(y.reshape(-1, width), weights, placed, n)
            for shard in recv.addressable_shards:
                d = shard.index[0].start // per_device
                assert_bits_equal(np.asarray(shard.data)[:len(want[d])], want[d])
            for got, want_all in ((sizes, want_sizes.reshape(-1)), (dropped, want_dropped),
                                  (out, want_out)):
                for shard in got.addressable_shards:
                    assert_bits_equal(shard.data, want_all[shard.index])
    # Every process's checks done before any exits (process 0's exit ends
    # the coordinator, which the others' references take seconds to reach).
    from jax._src import distributed
    distributed.global_state.client.wait_at_barrier("moe checked", 120_000)


def run_replay():
    """Jitted loops replayed from command buffers, each step followed by an
    xor with the step, bit-exact against the blocks moved on the host, three
    times with fresh data, with fewer handler calls than steps: 128
    ppermutes around the ring, then 200 all_to_alls."""
    ppermute_steps, all_to_all_steps = 128, 200

    def ring_step(blocks, i, sources):
        return [blocks[s] ^ np.uint32(i) for s in sources]

    def exchange_step(blocks, i, _):
        chunks = [np.split(b, n) for b in blocks]
        return [np.concatenate([chunks[s][d] for s in range(n)]) ^ np.uint32(i)
                for d in range(n)]

    _, sources = device_plan(mesh_1d, ("i",), tuple(ring))
    for op, steps, path, host_step in (
            (lambda v: jax_tma.ppermute(v, "i", ring), ppermute_steps, "ppermute.tma",
             ring_step),
            (lambda v: jax_tma.all_to_all(v, "i", 0, 0, tiled=True), all_to_all_steps,
             "all_to_all.inbox", exchange_step)):
        def loop(b, op=op, steps=steps):
            return jax.lax.fori_loop(0, steps, lambda i, v: op(v) ^ i.astype(v.dtype), b)

        spec = P("i")
        f = jax.jit(jax.shard_map(loop, mesh=mesh_1d, in_specs=spec, out_specs=spec))
        rng = np.random.default_rng([seed, steps])
        before = _ffi.path_counts()[path]
        for _ in range(3):
            x = random_array(rng, (n * n * 1000, 3), np.uint32)
            blocks = np.split(x, n)
            for i in range(steps):
                blocks = host_step(blocks, i, sources)
            got = f(global_array(mesh_1d, x))
            for shard in got.addressable_shards:
                assert_bits_equal(shard.data, blocks[shard.index[0].start // (n * 1000)])
        calls = _ffi.path_counts()[path] - before
        print(f"process {pid}: {calls} {path} handler calls for {3 * steps} calls", flush=True)
        assert calls < steps, calls


def run_cycles():
    cycles, warm = 250, 10
    rng = np.random.default_rng([seed, cycles])
    x = random_array(rng, (n * 1000, 3), np.uint32)
    blocks = np.split(x, n)
    _, sources = device_plan(mesh_1d, ("i",), tuple(ring))
    x = global_array(mesh_1d, x)

    def held():
        # Frees the executables: jax's caches hold them, and cycles of
        # references their functions.
        jax.clear_caches()
        gc.collect()
        return dict(_ffi._ext.peer_resources(), fds=len(os.listdir("/proc/self/fd")))

    start = time.monotonic()
    for i in range(cycles):
        # A new function each time: a new executable (its lowering is a new
        # instance), freed with the caches.
        f = shard_mapped(lambda b, axis, perm: jax_tma.ppermute(b, axis, perm), mesh_1d, "i",
                         ring)
        got = f(x)
        for shard in got.addressable_shards:
            assert_bits_equal(shard.data, blocks[sources[shard.index[0].start // 1000]])
        del f, got
        if i == warm - 1:
            before = held()
        elif i % 100 == 99:
            print(f"process {pid}: {i + 1} cycles, {time.monotonic() - start:.1f} s, "
                  f"{held()}", flush=True)
    after = held()
    print(f"process {pid}: held after {warm} cycles {before}, after {cycles} {after}",
          flush=True)
    assert before["sites"] == after["sites"] == 0, (before, after)
    assert all(after[k] == before[k] for k in before if k != "fds"), (before, after)
    assert after["fds"] - before["fds"] < 10, (before, after)


def run_intruded():
    folder = os.environ["JAX_TMA_TEST_INTRUSION_DIR"]

    def descriptors():
        fds = {}
        for fd in os.listdir("/proc/self/fd"):
            try:
                fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:  # the listing's own descriptor, closed by now
                pass
        return fds

    warnings = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("jax_tma").addHandler(handler)
    def unix_sockets(held) -> set[str]:
        """The link's kind of socket among `held` (jax.distributed's gRPC
        ones are TCP, opened and closed as it goes)."""
        with open("/proc/net/unix") as f:
            inodes = {line.split()[6] for line in list(f)[1:] if len(line.split()) > 6}
        return {t for t in held if t.startswith("socket:[") and t[8:-1] in inodes}

    check(mesh_1d, "i", ring, np.uint32, (n * 1000, 3), iterations=1)  # the link is up
    sockets = unix_sockets(descriptors().values())
    file_meeting.write(folder, f"victim{pid}", f"{_ppermute._own_link[0]} {os.getpid()}\n")
    file_meeting.wait_for(folder, "intruding")
    check(mesh_1d, "i", ring, np.uint32, (n * 1000, 3), iterations=40)
    _, _, forged, pipe_inode = file_meeting.wait_for(folder, "intruded").split()
    deadline = time.monotonic() + 30
    while len(warnings) < int(forged) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(warnings) == int(forged), warnings
    held = descriptors().values()
    passed = [t for t in held if "jax_tma_intruder" in t or t == f"pipe:[{pipe_inode}]"]
    assert not passed, f"descriptors the intruder passed are open here: {passed}"
    opened = unix_sockets(held) - sockets
    assert not opened, f"Unix sockets opened since the intrusion began: {sorted(opened)}"


def fault_call(op, kind):
    """The call of a fault mode, `op` ("ppermute", "all_to_all" or
    "ragged_all_to_all") over the ring of every device, and its arguments.
    In process 1, kind "perm" reverses ppermute's permutation and kind
    "shape" doubles an exchange's rows (ragged_all_to_all: its row width)."""
    other = kind == "shape" and pid == 1
    x = global_array(mesh_1d, np.arange(n * n * (8 if other else 4), dtype=np.float32))
    if op == "ppermute":
        perm = ring if kind != "perm" or pid != 1 else [(d, s) for s, d in ring]
        return shard_mapped(jax_tma.ppermute, mesh_1d, "i", perm), (x,)
    if op == "all_to_all":
        spec = P("i")
        return jax.jit(jax.shard_map(lambda b: jax_tma.all_to_all(b, "i", 0, 0, tiled=True),
                                     mesh=mesh_1d, in_specs=spec, out_specs=spec)), (x,)
    # Each device sends one row to every device, its own included.
    width = 2 if other else 1
    rows = global_array(mesh_1d, np.arange(n * n * width, dtype=np.float32).reshape(-1, width))
    ones = np.ones(n * n, np.int32)
    offsets = np.tile(np.arange(n, dtype=np.int32), n)
    index = [global_array(mesh_1d, a) for a in (offsets, ones, np.repeat(offsets[:n], n), ones)]
    out = global_array(mesh_1d, np.zeros((n * n, width), np.float32))
    return ragged_call(mesh_1d), (rows, out, *index)


def run_fault():
    """Process 1 never calls (mode never), is killed (kill), or calls with
    another permutation (perm, ppermute) or shape (shape, the exchanges):
    every other process fails, naming it. A mode's suffix names the op
    (`never:all_to_all`); ppermute without one."""
    kind, _, op = mode.partition(":")
    op = op or "ppermute"
    f, args = fault_call(op, kind)
    f.lower(*args).compile()  # every process lowers (publishing its link) before any call
    if kind in ("never", "kill") and pid == 1:
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # alive, never calling; the test ends it
        return
    start = time.monotonic()
    if kind == "never":
        # An exchange's error may be a sibling device's, which stopped when
        # the one waiting for process 1 timed out (ABORTED, naming it).
        code = ("DEADLINE_EXCEEDED",) if op == "ppermute" else ()
        expect_failure(lambda: f(*args), *code, "timed out after",
                       "from process 1; it never made this call")
    elif kind == "kill":
        # A process that only sends to process 1 may finish its first call
        # (its outputs do not depend on process 1); its next one cannot.
        try:
            jax.block_until_ready(f(*args))
            print(f"process {pid}: the first call finished", flush=True)
        except Exception as e:  # noqa: BLE001
            assert "process 1" in str(e), e
            print(f"process {pid}: failed: {str(e).splitlines()[0]}", flush=True)
        else:  # process 1 is gone, and by now process 2 may have exited too
            expect_failure(lambda: f(*args), "is gone")
    else:  # a block of another permutation or shape, or a peer that saw one
        expect_failure(lambda: f(*args), f"jax_tma.{op} at ")
    print(f"process {pid}: failed after {time.monotonic() - start:.1f} s", flush=True)
    if kind == "never":  # the call site is out of step: later calls refuse at once
        expect_failure(lambda: f(*args), "an earlier call here failed",
                       "refuses every later call")


def run_device_fault():
    """After a first call that meets on the host, process 1 stops calling
    (mode stop) or is killed (die): the others' next call waits on the GPU
    and fails. A mode's suffix names the op, as in run_fault."""
    kind, _, op = mode.partition(":")
    f, args = fault_call(op or "ppermute", kind)
    jax.block_until_ready(f(*args))
    # jax.distributed's barrier, not a collective (NCCL refuses two ranks on
    # one GPU).
    from jax._src import distributed
    distributed.global_state.client.wait_at_barrier("first call done", 60_000)
    if pid == 1:
        if kind == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
        return
    start = time.monotonic()
    try:
        jax.block_until_ready(f(*args))
    except Exception as e:  # noqa: BLE001 (XLA's error for the trapped kernel)
        print(f"process {pid}: failed: {str(e).splitlines()[0]}", flush=True)
    else:
        raise AssertionError(f"process {pid}: the call did not fail")
    print(f"process {pid}: failed after {time.monotonic() - start:.1f} s", flush=True)
    time.sleep(0.5)  # the reporting thread prints the reason
    signal.alarm(30)  # a hang ends the process (SIGALRM), failing the test
    expect_failure(lambda: f(*args))  # refused: the context is lost
    signal.alarm(0)


try:
    main()
except BaseException:
    traceback.print_exc()
    sys.stdout.flush()
    os._exit(1)
# Not jax.distributed's shutdown barrier, which waits for every process: in
# the fault modes a peer is gone or stuck.
os._exit(0)
