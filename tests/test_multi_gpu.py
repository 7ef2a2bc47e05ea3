"""jax_tma ops on arrays sharded over several GPUs (the 8-host-device CPU
version is tests/test_sharding.py): every op of the family descriptors
(families.OPS) under jit over NamedSharding inputs and shard_map gives the
NumPy result bit for bit, and the compiled program has no collectives for
the dims the op splits; then ppermute's peer copies between real GPUs, and
the MoE ops composed on the exchanges.
Needs >= 2 GPUs (the pull's index traps: one); JAX_TMA_REQUIRE_MULTI_GPU=1 turns
the skip into a failure."""

import functools
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_tma
from families import LOCAL_OPS, build
from families.ppermute import ppermute_reference
from paths import run_on_path
from reference import (assert_bits_equal, assert_no_collectives, moe_combine_reference,
                       moe_dispatch_reference, random_array)

pytestmark = pytest.mark.gpu


@pytest.fixture
def mesh():
    gpus = jax.devices("cuda")
    if len(gpus) < 2:
        if os.environ.get("JAX_TMA_REQUIRE_MULTI_GPU") == "1":
            pytest.fail(f"JAX_TMA_REQUIRE_MULTI_GPU=1 but only {len(gpus)} GPU(s) visible")
        pytest.skip("needs at least 2 GPUs")
    n = len(gpus) // 2 * 2
    return Mesh(np.array(gpus[:n]), ("x",), axis_types=(AxisType.Auto,))


def _no_collectives(f, *args):
    assert_no_collectives(f.lower(*args).compile().as_text())


@pytest.mark.parametrize("name", LOCAL_OPS)
def test_sharded_equals_the_numpy_result(mesh, rng, name):
    """The batch dim, then the last dim the op splits locally, over 2 or 4
    GPUs (the cases' split dims are 4 or 8 long)."""
    case = build(name, rng, np.float32)
    gpus = list(mesh.devices.flat)
    small = Mesh(np.array(gpus[:4 if len(gpus) >= 4 else 2]), ("x",),
                 axis_types=(AxisType.Auto,))
    for d in dict.fromkeys((0, case.local_split()[-1])):
        specs = case.in_specs({d: "x"})
        args = tuple(jax.device_put(a, NamedSharding(small, s)) for a, s in zip(case.args, specs))
        f = jax.jit(case.ours)
        _no_collectives(f, *args)
        assert_bits_equal(f(*args), case.want())
    specs = case.in_specs({0: "x"})
    args = tuple(jax.device_put(a, NamedSharding(small, s)) for a, s in zip(case.args, specs))
    g = jax.jit(jax.shard_map(case.ours, mesh=small, in_specs=specs, out_specs=P("x")))
    _no_collectives(g, *args)
    assert_bits_equal(g(*args), case.want())


# ---- jax_tma.ppermute: peer reads between real GPUs ------------------------

def _smap(mesh, body):
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))


def test_one_line_over_two_meshes_meets_each_apart(mesh, rng, monkeypatch):
    """One line of code traced over a one-device mesh, then over two devices
    (its first calls meet to trade mailboxes): each mesh counts its meetings
    apart, so the second mesh's devices meet each other, not the first's
    count. They once waited out the timeout here."""
    def ring(m):
        n = m.size
        return _smap(m, lambda b: jax_tma.ppermute(b, "x", [(i, (i + 1) % n) for i in range(n)]))

    monkeypatch.setenv(jax_tma._ppermute.TIMEOUT_ENV, "10")
    gpus = list(mesh.devices.flat)[:2]
    for devices in ([gpus[0]], gpus, [gpus[0]], gpus):
        m = Mesh(np.array(devices), ("x",))
        host = random_array(rng, (len(devices) * 1000,), np.uint32)
        got = ring(m)(jax.device_put(host, NamedSharding(m, P("x"))))
        assert_bits_equal(got, np.roll(host, 1000))


@pytest.mark.parametrize("direction", ["pull", "push"])
@pytest.mark.parametrize("method", ["auto", pytest.param("tma", marks=pytest.mark.memcheck),
                                    "simt"])
@pytest.mark.parametrize("block_bytes", [1, 1000, 4096 + 13, 1 << 20, (64 << 20) + 48])
def test_ppermute_matches_reference(mesh, rng, method, block_bytes, direction):
    n = mesh.size
    perm = [(i, (i + 1) % n) for i in range(n)]
    ours = _smap(mesh, lambda b: jax_tma.ppermute(b, "x", perm, method=method,
                                                  direction=direction))
    host = random_array(rng, (n * block_bytes,), np.uint8)
    x = jax.device_put(host, NamedSharding(mesh, P("x")))
    text = ours.lower(x).compile().as_text()
    assert "jax_tma_ppermute" in text
    assert_no_collectives(text)
    # Peer copies take the bulk pipeline wherever the GPU has TMA, auto included.
    path = "ppermute.simt" if method == "simt" else "ppermute.tma"
    assert_bits_equal(run_on_path(path, ours, x), ppermute_reference(host, n, perm))


@pytest.mark.memcheck
@pytest.mark.parametrize("direction", ["pull", "push"])
def test_ppermute_partial_perm_zero_fills(mesh, rng, direction):
    perm = [(0, 1)]
    ours = _smap(mesh, lambda b: jax_tma.ppermute(b, "x", perm, direction=direction))
    host = random_array(rng, (mesh.size * 3000,), np.float32)
    x = jax.device_put(host, NamedSharding(mesh, P("x")))
    assert_bits_equal(ours(x), ppermute_reference(host, mesh.size, perm))


@pytest.mark.parametrize("direction", ["pull", "push"])
def test_ppermute_loop_orders_reads_and_reuse(mesh, rng, direction):
    """Each iteration writes the block (c * 3 + 1) right before the peer
    copies it, and the loop reuses its buffers: a copy that starts before
    the block is written, writes over an output still being read, or a block
    reused while a peer still copies it, changes the result. Fresh data
    every call, so a stale output cannot pass."""
    n = mesh.size
    perm = [(i, (i + 1) % n) for i in range(n)]

    def body(pp, b):
        return jax.lax.fori_loop(0, 50, lambda _, c: pp(c * 3 + 1, "x", perm), b)

    ours = _smap(mesh, functools.partial(body, functools.partial(jax_tma.ppermute,
                                                                 direction=direction)))
    ref = _smap(mesh, functools.partial(body, jax.lax.ppermute))
    for _ in range(5):
        host = random_array(rng, (n * (8 << 20) // 4,), np.uint32)
        x = jax.device_put(host, NamedSharding(mesh, P("x")))
        assert_bits_equal(ours(x), ref(x))


def test_ppermute_grad_on_gpus(mesh, rng):
    n = mesh.size
    perm = [(i, (i + 1) % n) for i in range(n)]
    w = jax.device_put(random_array(rng, (n * 64,), np.float32), NamedSharding(mesh, P("x")))

    def loss(pp, x):
        f = jax.shard_map(lambda b: pp(b, "x", perm), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
        return jax.numpy.sum(f(x) * w)

    x = jax.device_put(random_array(rng, (n * 64,), np.float32), NamedSharding(mesh, P("x")))
    assert_bits_equal(jax.jit(jax.grad(functools.partial(loss, jax_tma.ppermute)))(x),
                      jax.jit(jax.grad(functools.partial(loss, jax.lax.ppermute)))(x))


def test_ppermute_without_peer_access_falls_back_to_nccl(mesh, rng, monkeypatch):
    import jax_tma._ppermute as ppermute_module
    monkeypatch.setattr(ppermute_module, "peer_access", lambda device, peer: False)
    n = mesh.size
    perm = [(i, (i + 1) % n) for i in range(n)]
    ours = _smap(mesh, lambda b: jax_tma.ppermute(b, "x", perm))
    host = random_array(rng, (n * 1000,), np.float32)
    x = jax.device_put(host, NamedSharding(mesh, P("x")))
    text = ours.lower(x).compile().as_text()
    assert "collective-permute" in text and "jax_tma_ppermute" not in text
    assert_bits_equal(ours(x), ppermute_reference(host, n, perm))


def test_ppermute_handler_names_a_pair_without_peer_access(mesh, rng):
    """The raw target (as exported HLO reaches it; Python would fall back to
    lax.ppermute) between two GPUs that cannot map each other's memory.
    Reachable only where such a pair exists: GPUs on an NVLink or P2P-capable
    PCIe switch (the 2 x H200 machine) all have peer access."""
    from jax_tma._ppermute import peer_access
    gpus = list(mesh.devices.flat)
    ids = [d.local_hardware_id for d in gpus]
    pair = next(((a, b) for a in range(len(gpus)) for b in range(len(gpus))
                 if a != b and not peer_access(ids[a], ids[b])), None)
    if pair is None:
        # The topology rules it out, GPUs or no: a skip even under
        # JAX_TMA_REQUIRE_MULTI_GPU=1, which gpu_check.sh's multi stage
        # names in its summary.
        pytest.skip(f"every pair of GPUs {ids} has peer access: no pair to test")
    a, b = pair
    jax_tma._ffi.register()
    call = jax.ffi.ffi_call("jax_tma_ppermute", jax.ShapeDtypeStruct((64,), np.float32))
    f = jax.jit(lambda x: call(x, instance=np.int64(rng.integers(10**12, 10**13)),
                               devices=np.array([ids[a], ids[b]], np.int64),
                               sources=np.array([1, -1], np.int64), push=False,
                               method="auto", process=np.int64(0),
                               processes=np.zeros(2, np.int64), links="", site="test",
                               timeout_ms=np.int64(1000)))
    x = jax.device_put(random_array(rng, (64,), np.float32), gpus[a])
    with pytest.raises(Exception, match=rf"jax_tma\.ppermute: device {ids[a]} cannot access "
                                        rf"device {ids[b]}'s memory \(no peer access between "
                                        rf"them\)"):
        jax.block_until_ready(f(x))


# ---- jax_tma.all_to_all: each chunk pushed into its destination's output ----

@pytest.mark.memcheck
@pytest.mark.parametrize("split,concat,tiled", [(0, 0, True), (0, 1, True), (1, 0, False),
                                               (1, 1, False)])
# Chunks in the inbox's low-latency form (1 B, 4 KiB + 13), its plain form (96 KiB + 4) and
# PeerScatter (8 MiB + 48).
@pytest.mark.parametrize("chunk_bytes", [1, 4096 + 13, (96 << 10) + 4, (8 << 20) + 48])
def test_all_to_all_matches_lax(mesh, rng, split, concat, tiled, chunk_bytes):
    n = mesh.size
    block = [n, chunk_bytes] if split == 0 else [chunk_bytes, n]
    host = random_array(rng, (n * block[0], block[1]), np.uint8)
    x = jax.device_put(host, NamedSharding(mesh, P("x")))
    ours = _smap(mesh, lambda b: jax_tma.all_to_all(b, "x", split, concat, tiled=tiled))
    text = ours.lower(x).compile().as_text()
    assert "jax_tma_all_to_all" in text
    assert_no_collectives(text)
    want = _smap(mesh, lambda b: jax.lax.all_to_all(b, "x", split, concat, tiled=tiled))(x)
    inbox = n * chunk_bytes <= jax_tma._ffi._ext.exchange_inbox_max_bytes
    assert_bits_equal(run_on_path("all_to_all.inbox" if inbox else "all_to_all.peer", ours, x),
                      want)


@pytest.mark.parametrize("block_bytes", [8 << 20, 1 << 20, 64 << 10, 4 * 4099])
def test_all_to_all_loop_orders_reads_and_reuse(mesh, rng, block_bytes):
    """50 exchanges in a loop, each of a block written right before it (the
    ppermute loop test's hazards, for every step of the exchange; through the
    inbox, its two slots' reuse), against lax.all_to_all (NCCL), fresh data
    every call."""
    def body(a2a, b):
        return jax.lax.fori_loop(0, 50, lambda _, c: a2a(c * 3 + 1, "x", 0, 0, tiled=True), b)

    ours = _smap(mesh, functools.partial(body, jax_tma.all_to_all))
    ref = _smap(mesh, functools.partial(body, jax.lax.all_to_all))
    for _ in range(3):
        host = random_array(rng, (mesh.size * mesh.size * (block_bytes // 4 // mesh.size),),
                            np.uint32)
        x = jax.device_put(host, NamedSharding(mesh, P("x")))
        assert_bits_equal(ours(x), ref(x))


def test_all_to_all_grad_on_gpus(mesh, rng):
    n = mesh.size  # blocks (8n, 2) exchanged into (8, 2n)
    on_mesh = NamedSharding(mesh, P("x"))
    w = jax.device_put(random_array(rng, (8 * n, 2 * n), np.float32), on_mesh)
    x = jax.device_put(random_array(rng, (8 * n * n, 2), np.float32), on_mesh)

    def loss(a2a, x):
        f = jax.shard_map(lambda b: a2a(b, "x", 0, 1, tiled=True), mesh=mesh, in_specs=P("x"),
                          out_specs=P("x"))
        return jax.numpy.sum(f(x) * w)

    assert_bits_equal(jax.jit(jax.grad(functools.partial(loss, jax_tma.all_to_all)))(x),
                      jax.jit(jax.grad(functools.partial(loss, jax.lax.all_to_all)))(x))


# ---- jax_tma.ragged_all_to_all: slices of device-read sizes, pushed in place ----

def _ragged_indices(rng, n, per_part, rows, skew):
    """Random (input_offsets, send_sizes, output_offsets, recv_sizes) of each
    device, (n, n * per_part) each, consistent across devices: slices packed
    at random gaps in the operand and in each receiver's output. `skew`:
    every device sends everything to device 0."""
    slices = n * per_part
    send = rng.integers(0, rows // slices + 1, size=(n, slices))
    if skew:
        send[:, per_part:] = 0
        send[:, :per_part] = rng.integers(0, rows // (n * per_part) + 1, size=(n, per_part))
    in_off = np.zeros_like(send)
    for d in range(n):
        gaps = rng.integers(0, 2, size=slices)
        in_off[d] = np.cumsum(send[d] + gaps) - send[d]
    out_off = np.zeros_like(send)
    recv = np.zeros_like(send)
    for r in range(n):  # receiver r packs what each source sends it, in source order
        at = 0
        for s in range(n):
            for t in range(per_part):
                i = r * per_part + t
                out_off[s, i] = at
                recv[r, s * per_part + t] = send[s, i]
                at += send[s, i] + int(rng.integers(0, 2))
    return in_off, send, out_off, recv


@pytest.mark.memcheck
# Row sizes of the inbox's low-latency form (6, 64, 2 B; with 40 slices a source, more
# entries than it keeps in shared memory), its flag form (4 KiB + 13; 2 B rows under 700
# slices a source, whose header of entries runs into a second piece of the slot) and
# PeerScatter.
@pytest.mark.parametrize("per_part,row_bytes,skew,index_dtype", [
    (1, 6, False, np.int32), (2, 64, False, np.int64), (1, 4096 + 13, True, np.int32),
    (3, 2, False, np.int64), (40, 2, False, np.int32), (700, 2, False, np.int32),
    (2, 24576 + 8, False, np.int32)])
def test_ragged_all_to_all_matches_lax(mesh, rng, per_part, row_bytes, skew, index_dtype):
    n = mesh.size
    rows = 64 * n * per_part
    operand = random_array(rng, (n * rows, row_bytes), np.uint8)
    output = random_array(rng, (n * 2 * rows, row_bytes), np.uint8)  # fresh: unwritten rows show
    idx = [jax.device_put(a.reshape(-1).astype(index_dtype), NamedSharding(mesh, P("x")))
           for a in _ragged_indices(rng, n, per_part, rows, skew)]
    on_mesh = NamedSharding(mesh, P("x"))
    args = (jax.device_put(operand, on_mesh), jax.device_put(output, on_mesh), *idx)

    def run(op):
        return jax.jit(jax.shard_map(lambda *a: op(*a, axis_name="x"), mesh=mesh,
                                     in_specs=(P("x"),) * 6, out_specs=P("x")))

    ours = run(jax_tma.ragged_all_to_all)
    text = ours.lower(*args).compile().as_text()
    assert "jax_tma_ragged_all_to_all" in text
    assert_no_collectives(text)
    want = run(jax.lax.ragged_all_to_all)(*args)
    inbox = rows * row_bytes <= jax_tma._ffi._ext.exchange_inbox_max_bytes
    path = "ragged_all_to_all.inbox" if inbox else "ragged_all_to_all.peer"
    assert_bits_equal(run_on_path(path, ours, *args), want)


def test_ragged_all_to_all_loop_equal_sizes_matches_all_to_all(mesh, rng):
    """50 ragged exchanges of equal slices in a loop, each of a block written
    right before it: the all_to_all they equal, bit for bit."""
    n = mesh.size
    rows = 4096 * n

    def ragged(b):
        k = rows // n
        off = jax.numpy.arange(n, dtype=np.int32) * k
        size = jax.numpy.full((n,), k, np.int32)
        return jax_tma.ragged_all_to_all(b, jax.numpy.zeros_like(b), off, size,
                                         jax.lax.axis_index("x").astype(np.int32) * k +
                                         jax.numpy.zeros((n,), np.int32), size, axis_name="x")

    def body(a2a, b):
        return jax.lax.fori_loop(0, 50, lambda _, c: a2a(c * 3 + 1), b)

    ours = _smap(mesh, functools.partial(body, ragged))
    ref = _smap(mesh, functools.partial(body, lambda c: jax.lax.all_to_all(c, "x", 0, 0,
                                                                           tiled=True)))
    host = random_array(rng, (n * rows, 8), np.uint32)
    x = jax.device_put(host, NamedSharding(mesh, P("x")))
    assert_bits_equal(ours(x), ref(x))


# A traced size that breaks a rule traps the checking kernel (the CUDA
# context is then lost), so each case runs in a process of its own.
_BAD_SIZES = textwrap.dedent("""
    import sys, time
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    import jax_tma
    case = sys.argv[1]
    gpus = jax.devices("cuda")[:2]
    mesh = Mesh(np.array(gpus), ("x",))
    n, rows = len(gpus), 64

    def f(operand, output, sizes, recv):
        k = rows // n
        off = jnp.arange(n, dtype=np.int32) * k
        oo = jax.lax.axis_index("x").astype(np.int32) * k + jnp.zeros((n,), np.int32)
        return jax_tma.ragged_all_to_all(operand, output, off, sizes, oo, recv, axis_name="x")

    g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    sizes = np.full((n, n), rows // n, np.int32)
    recv = sizes.copy()
    if case == "past_operand":
        sizes[1, 1] = rows  # device 1's slice for itself runs past its 64 rows
    else:
        recv[1, 0] = 3  # device 1 expects 3 rows from device 0, which sends 32
    x = jnp.ones((n * rows, 4), jnp.float32)
    try:
        jax.block_until_ready(g(x, x * 0, sizes.reshape(-1), recv.reshape(-1)))
    except Exception as e:
        print("raised:", type(e).__name__, flush=True)
    time.sleep(2)  # the fault's report reaches stderr
    print("done", flush=True)
""")


@pytest.mark.parametrize("case,message", [
    ("past_operand", "slice 1: input_offsets[1] = 32 and send_sizes[1] = 64 are negative or "
                     "run past the operand's 64 rows"),
    ("recv", "slice 1: send_sizes[1] = 32 but its receiver's recv_sizes entry for it is 3"),
])
def test_ragged_all_to_all_traced_sizes_that_break_a_rule_trap_by_name(mesh, tmp_path, case,
                                                                       message):
    """Checked on the device before any copy: the step fails, and stderr
    names the op, the call site, the device and the values."""
    _assert_traps(_BAD_SIZES, case, tmp_path, "jax_tma.ragged_all_to_all", message)


def _assert_traps(script: str, case: str, tmp_path, op: str, message: str) -> None:
    """`script` run for `case` in a process of its own raised, and its
    output names `op`'s call site and `message`, and that no copy ran."""
    # From tmp_path: `python -c` puts its directory first on sys.path.
    proc = subprocess.run([sys.executable, "-c", script, case], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path,
                          env=dict(os.environ, JAX_TMA_PPERMUTE_TIMEOUT_S="5"))
    out = proc.stdout + proc.stderr
    assert "raised:" in out, out[-4000:]
    assert f"{op} at " in out, out[-4000:]
    assert message in out, out[-4000:]
    assert "no copy ran out of bounds" in out, out[-4000:]


# A traced index of the MoE dispatch's pull that breaks a rule traps its
# meet kernel, before any copy: a process of its own for each case, on up to
# two GPUs (one: the pull's own pairs alone, checked all the same), the bad
# entry on the last.
_BAD_PULL = textwrap.dedent("""
    import sys, time
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    from jax_tma._moe import _pull_p
    case = sys.argv[1]
    gpus = jax.devices("cuda")[:2]
    mesh = Mesh(np.array(gpus), ("x",))
    n, tokens, per = len(gpus), 64, 8
    # Device v sends its rows 0..7 to each device d, into rows v * per on there.
    i = np.arange(n * per, dtype=np.int32) % per
    sent = np.stack([np.stack([i, v * per + i], 1) for v in range(n)]).astype(np.int32)
    routes = np.array([[[s * per, per, 0, per, v * per] for s in range(n)] for v in range(n)],
                      np.int32)
    if case == "token":
        sent[n - 1, 3, 0] = tokens + 1  # pair 3 names a row past the operand's 64
    elif case == "slot":
        sent[n - 1, 5, 1] = n * per  # pair 5 stores past the result's rows
    elif case == "lowest":  # two bad pairs: the lower one is named
        sent[n - 1, 6, 0] = tokens + 1
        sent[n - 1, 2, 1] = -2
    else:
        routes[n - 1, n - 1, 3] = tokens + 1  # more pairs from the last position than it has

    def f(x, sent, routes):
        return _pull_p.bind(x, sent[0], routes[0], rows=n * per, axis_name=("x",), size=n,
                            site="test", ctas=0)[0]

    g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    try:
        jax.block_until_ready(g(jnp.ones((n * tokens, 4), jnp.float32), sent, routes))
    except Exception as e:
        print("raised:", type(e).__name__, flush=True)
    time.sleep(2)  # the fault's report reaches stderr
    print("done", flush=True)
""")


@pytest.mark.parametrize("case,message", [
    ("token", "sent[3, 0] = 65 is outside [0, 64]"),
    ("slot", "sent[5, 1] = {rows} is neither -1 nor a row of the result's {rows}"),
    ("lowest", "sent[2, 1] = -2 is neither -1 nor a row of the result's {rows}"),
    ("size", "routes[{last}, 3] = 65 is outside [0, 64]"),
])
def test_moe_dispatch_pull_indices_that_break_a_rule_trap_by_name(gpu, tmp_path, case,
                                                                   message):
    """Checked on the device before any copy: the call fails, and stderr
    names the op, the call site and the values. One GPU is enough."""
    n = min(2, len(jax.devices("cuda")))
    _assert_traps(_BAD_PULL, case, tmp_path, "jax_tma.moe_dispatch",
                  message.format(rows=8 * n, last=n - 1))


# ---- jax_tma.moe_dispatch / moe_combine: composed on the exchanges above ----

@pytest.mark.parametrize("capacity,least_sms", [
    (None, False), (40, False), pytest.param(None, True, marks=pytest.mark.memcheck)])
def test_moe_dispatch_and_combine_match_the_reference(mesh, rng, capacity, least_sms):
    """Every GPU (2 or 4): recv row for row, group sizes and drops, and combine's sums
    bit for bit, as the NumPy reference has them (tests/test_moe.py runs the
    same on host devices). One dispatch carries each token's random bf16
    bits, then normal values that combine sums (no subnormal sum). With the
    least SM budget (num_sms = n: a CTA for each source's rows, each
    slice), at wide rows (the combine's sums home, PeerScatterSum, at 5 MiB
    a device; its weights out by the inbox), and at narrow ones."""
    n, k, experts = mesh.size, 4, 8
    # n·T rows of width bf16 home: 5 MiB at n = 2
    tokens, width = (160, 8192) if least_sms else (64, 128)
    num_sms = n if least_sms else None
    ids = rng.integers(-1, experts, (n * tokens, k)).astype(np.int32)
    bits = random_array(rng, (n * tokens, width), jax.numpy.bfloat16)
    values = rng.standard_normal((n * tokens, width)).astype(jax.numpy.bfloat16)
    weights = rng.standard_normal((n * tokens, k)).astype(np.float32)

    def body(x, ids, weights):
        recv, plan = jax_tma.moe_dispatch(x, ids, num_experts=experts, axis_name="x",
                                          capacity=capacity, num_sms=num_sms)
        out = jax_tma.moe_combine(recv[:, width:], plan, weights)
        return recv, plan.group_sizes, plan.dropped, out

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    args = (np.concatenate([bits, values], axis=1), ids, weights)
    compiled = f.lower(*args).compile().as_text()
    assert "jax_tma_ragged_all_to_all" in compiled and "jax_tma_moe_dispatch" in compiled
    recv, sizes, dropped, out = f(*args)
    want, want_sizes, want_dropped, placed = moe_dispatch_reference(bits, ids, n, experts,
                                                                    capacity)
    rows = np.asarray(recv).reshape(n, -1, 2 * width)
    for d in range(n):
        assert_bits_equal(rows[d, :len(want[d]), :width], want[d])
    assert_bits_equal(sizes, want_sizes.reshape(-1))
    assert_bits_equal(dropped, want_dropped)
    assert_bits_equal(out, moe_combine_reference(np.asarray(recv)[:, width:], weights, placed, n))


def test_moe_fp8_wire_on_gpus_matches_the_host_devices(mesh, rng):
    """wire_dtype=float8_e4m3fn on every GPU and on as many host devices:
    the quantised rows and their scales bit for bit (the scales'
    multiplication, the rows' division and rounding alike on both)."""
    n, tokens, k, experts, width = mesh.size, 64, 4, 8, 256
    x = rng.standard_normal((n * tokens, width)).astype(jax.numpy.bfloat16)
    ids = rng.integers(-1, experts, (n * tokens, k)).astype(np.int32)

    def body(x, ids):
        (rows, scales), plan = jax_tma.moe_dispatch(x, ids, num_experts=experts, axis_name="x",
                                                    wire_dtype=jax.numpy.float8_e4m3fn)
        return rows, scales, plan.group_sizes

    host = Mesh(np.array(jax.devices("cpu")[:n]), ("x",), axis_types=(AxisType.Auto,))
    on = [jax.jit(jax.shard_map(body, mesh=m, in_specs=P("x"), out_specs=P("x")))(x, ids)
          for m in (mesh, host)]
    sizes = np.asarray(on[1][2]).reshape(n, -1).sum(1)
    for got, want in zip(on[0][:2], on[1][:2]):
        got, want = np.asarray(got).reshape(n, -1, got.shape[1]), np.asarray(want).reshape(
            n, -1, want.shape[1])
        for d in range(n):  # the received rows; those past them are unspecified
            assert_bits_equal(got[d, :sizes[d]], want[d, :sizes[d]])
    assert_bits_equal(on[0][2], on[1][2])


def test_moe_layer_grads_on_gpus_match_the_host_devices(mesh, rng):
    """grad of a layer (top-2 routing, ragged_dot experts) on every GPU (2
    or 4) and on as many host devices: the same within float32 rounding (the weights'
    cotangents are dot products, which XLA sums in its own order): 1e-4
    relative, the contract's bound for a layer against the dense one. Every
    dot names full float32 precision: XLA's GPU default for a float32 dot
    is TF32, whose 10-bit mantissa moved a gradient by 1e-3 relative on
    2 x H200, and a default_matmul_precision context left 3e-4 (ragged_dot's
    own dots). An element far below the array's largest is held to 1e-4 of
    that largest (on 4 x H200 a cotangent of 2e-2 moved by 2e-5: 4 devices
    sum in another order)."""
    tokens, dim, experts = 32, 64, 8
    x = rng.standard_normal((mesh.size * tokens, dim)).astype(np.float32)
    w_router = rng.standard_normal((dim, experts)).astype(np.float32)
    w_experts = (rng.standard_normal((experts, dim, dim)) / 8).astype(np.float32)

    full = jax.lax.Precision.HIGHEST

    def layer(x, w_router, w_experts):
        gates, ids = jax.lax.top_k(jax.nn.softmax(jax.numpy.dot(x, w_router, precision=full)), 2)
        recv, plan = jax_tma.moe_dispatch(x, ids, num_experts=experts, axis_name="x")
        y = jax.numpy.tanh(jax.lax.ragged_dot(recv, w_experts, plan.group_sizes, precision=full))
        return jax_tma.moe_combine(y, plan, gates)

    def grads(pair):
        f = jax.shard_map(layer, mesh=pair, in_specs=(P("x"), P(), P("x")), out_specs=P("x"))
        return jax.jit(jax.grad(lambda *a: (f(*a) ** 2).sum(), argnums=(0, 1, 2)))(
            x, w_router, w_experts)

    host = Mesh(np.array(jax.devices("cpu")[:mesh.size]), ("x",), axis_types=(AxisType.Auto,))
    for got, want in zip(grads(mesh), grads(host)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
