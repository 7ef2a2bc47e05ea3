"""jax_tma.ppermute on 8 forced host devices: bit-exact against lax.ppermute
for every dtype and many permutations, jit/vmap/grad, repeated and looped
calls (the devices' meeting must pair calls up), the compiled program's
collectives, the lax.ppermute fallback, and every validation rule in Python
and in the C++ handler (the CUDA handler's peer-access rule needs two GPUs
without peer access: tests/test_multi_gpu.py)."""

import concurrent.futures
import functools
import logging
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import jax_tma
from families.ppermute import ppermute_reference
from reference import ALL_DTYPES, assert_bits_equal, assert_no_collectives, random_array


def _mesh(shape, names):
    return Mesh(np.array(jax.devices("cpu")[: int(np.prod(shape))]).reshape(shape), names)


def _both(mesh, spec, body, **options):
    """body(ppermute) under jit(shard_map), once with jax_tma.ppermute (given
    `options`) and once with lax.ppermute."""
    def make(fn):
        return jax.jit(jax.shard_map(functools.partial(body, fn), mesh=mesh,
                                     in_specs=spec, out_specs=spec))
    return make(functools.partial(jax_tma.ppermute, **options)), make(lax.ppermute)


def _hlo(f, *args):
    return f.lower(*args).compile().as_text()


PERMS = {
    "ring": lambda n: [(i, (i + 1) % n) for i in range(n)],
    "reverse-ring": lambda n: [((i + 1) % n, i) for i in range(n)],
    "swap-pairs": lambda n: [(i, i ^ 1) for i in range(n)],
    "partial": lambda n: [(0, n - 1), (n - 1, 1)],
    "identity": lambda n: [(i, i) for i in range(n)],
    "empty": lambda n: [],
}


@pytest.mark.parametrize("direction", ["pull", "push"])
@pytest.mark.parametrize("perm_name", list(PERMS))
def test_matches_lax_ppermute_1d_mesh(rng, perm_name, direction):
    mesh = _mesh((8,), ("i",))
    perm = PERMS[perm_name](8)
    ours, ref = _both(mesh, P("i"), lambda pp, b: pp(b, "i", perm), direction=direction)
    x = random_array(rng, (8 * 5, 33), np.float32)
    assert_bits_equal(ours(x), ref(x))
    assert_bits_equal(ours(x), ppermute_reference(x, 8, perm))
    text = _hlo(ours, x)
    assert "jax_tma_ppermute" in text
    assert_no_collectives(text)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_every_dtype_bit_exact(rng, dtype):
    # Against NumPy, not lax.ppermute: XLA's CPU collective-permute moves
    # bf16 through f32 and quiets NaN payloads on the way.
    mesh = _mesh((4,), ("i",))
    perm = PERMS["partial"](4)
    ours, _ = _both(mesh, P("i"), lambda pp, b: pp(b, "i", perm))
    x = random_array(rng, (4 * 3, 7, 5), dtype)
    assert_bits_equal(ours(x), ppermute_reference(x, 4, perm))


@pytest.mark.parametrize("axis_name", ["a", "b", ("a", "b")])
def test_2d_mesh_axis_groups(rng, axis_name):
    mesh = _mesh((4, 2), ("a", "b"))
    n = 8 if isinstance(axis_name, tuple) else mesh.shape[axis_name]
    perm = [(i, (3 * i + 1) % n) for i in range(n)] if n == 8 else PERMS["ring"](n)
    ours, ref = _both(mesh, P("a", "b"), lambda pp, b: pp(b, axis_name, perm))
    x = random_array(rng, (8, 6), np.int32)
    assert_bits_equal(ours(x), ref(x))


def test_zero_size_and_0d_blocks(rng):
    mesh = _mesh((4,), ("i",))
    perm = PERMS["ring"](4)
    ours, ref = _both(mesh, P("i"), lambda pp, b: pp(b[0], "i", perm)[None])
    x = random_array(rng, (4,), np.float32)
    assert_bits_equal(ours(x), ref(x))
    ours, _ = _both(mesh, P("i"), lambda pp, b: pp(b, "i", perm))
    assert ours(np.zeros((4, 0), np.float32)).shape == (4, 0)


def test_sub_byte_dtype(rng):
    mesh = _mesh((4,), ("i",))
    ours, ref = _both(mesh, P("i"), lambda pp, b: pp(b, "i", PERMS["ring"](4)))
    x = jnp.asarray(rng.integers(-8, 8, (8, 3)), jnp.int4)
    assert ours(x).dtype == jnp.int4
    assert_bits_equal(ours(x).astype(jnp.int8), ref(x).astype(jnp.int8))


@pytest.mark.parametrize("direction", ["pull", "push"])
def test_repeated_calls_and_loops_pair_up(rng, direction):
    mesh = _mesh((8,), ("i",))

    def body(pp, b):
        def step(_, c):
            return pp(c, "i", PERMS["ring"](8)) * 2 + 1
        return lax.fori_loop(0, 5, step, pp(b, "i", PERMS["swap-pairs"](8)))

    ours, ref = _both(mesh, P("i"), body, direction=direction)
    for _ in range(4):  # fresh data each call: stale outputs cannot pass
        x = random_array(rng, (8 * 4, 9), np.float32)
        assert_bits_equal(ours(x), ref(x))


def test_vmap_inside_shard_map(rng):
    mesh = _mesh((4,), ("i",))
    ours, ref = _both(mesh, P(None, "i"),
                      lambda pp, b: jax.vmap(lambda r: pp(r, "i", PERMS["ring"](4)))(b))
    x = random_array(rng, (3, 4 * 2, 5), np.float32)
    assert_bits_equal(ours(x), ref(x))


def test_grad_and_jvp_match_lax(rng):
    mesh = _mesh((8,), ("i",))
    perm = PERMS["partial"](8)

    def loss(pp, w, x):
        f = jax.shard_map(lambda b: pp(b, "i", perm), mesh=mesh, in_specs=P("i"), out_specs=P("i"))
        return jnp.sum(f(x) * w)

    # The gradient moves w's blocks back: any bits, compared exactly.
    w = random_array(rng, (8 * 2, 3), np.float32)
    x = random_array(rng, (8 * 2, 3), np.float32)
    g_ours = jax.jit(jax.grad(functools.partial(loss, jax_tma.ppermute, w)))(x)
    g_ref = jax.jit(jax.grad(functools.partial(loss, lax.ppermute, w)))(x)
    assert_bits_equal(g_ours, g_ref)
    # The JVP sums products: normal values, else the sum is inf or NaN on both
    # sides and the comparison says nothing.
    w, x, t = (rng.standard_normal(x.shape).astype(np.float32) for _ in range(3))
    _, jvp_ours = jax.jvp(functools.partial(loss, jax_tma.ppermute, w), (x,), (t,))
    _, jvp_ref = jax.jvp(functools.partial(loss, lax.ppermute, w), (x,), (t,))
    assert np.isfinite(jvp_ref)
    np.testing.assert_allclose(jvp_ours, jvp_ref, rtol=1e-6)


def test_partially_manual_shard_map_falls_back_to_lax(rng, caplog):
    caplog.set_level(logging.DEBUG, logger="jax_tma")
    mesh = _mesh((4, 2), ("a", "b"))
    perm = PERMS["ring"](4)

    def make(pp):
        return jax.jit(jax.shard_map(lambda b: pp(b, "a", perm), mesh=mesh,
                                     in_specs=P("a"), out_specs=P("a"), axis_names={"a"}))

    x = random_array(rng, (8, 6), np.float32)
    ours = make(jax_tma.ppermute)
    assert_bits_equal(ours(x), make(lax.ppermute)(x))
    text = _hlo(ours, x)
    assert "collective-permute" in text and "jax_tma_ppermute" not in text
    assert re.search(r"jax_tma.ppermute over \('a',\) at .*test_ppermute.py:\d+: lax.ppermute, because "
                     r"the shard_map is manual over \['a'\], not every mesh axis \['a', 'b'\]",
                     caplog.text), caplog.text


def test_the_debug_log_names_the_transport_of_each_call_site(rng, caplog):
    caplog.set_level(logging.DEBUG, logger="jax_tma")
    ours, _ = _both(_mesh((8,), ("i",)), P("i"), lambda pp, b: pp(b, "i", PERMS["ring"](8)),
                    direction="pull")
    ours(random_array(rng, (8, 3), np.float32))
    assert re.search(r"jax_tma.ppermute over \('i',\) at .*test_ppermute.py:\d+: jax_tma_ppermute "
                     r"\(cpu peer copies between 8 devices of this process, method auto, pull\)",
                     caplog.text), caplog.text


def test_device_plan_follows_lax_positions():
    from jax_tma._ppermute import device_plan
    mesh = _mesh((2, 4), ("a", "b"))
    ordinals, sources = device_plan(mesh, ("b",), ((0, 1), (1, 2), (2, 3), (3, 0)))
    assert ordinals.tolist() == [d.id for d in mesh.devices.flat]
    assert sources.tolist() == [3, 0, 1, 2, 7, 4, 5, 6]
    _, sources = device_plan(mesh, ("a",), ((0, 1),))
    assert sources.tolist() == [-1, -1, -1, -1, 0, 1, 2, 3]


# ---- validation: Python (trace time) -------------------------------------

def _call(mesh_shape, perm, axis_name="i", method="auto", x=None):
    mesh = _mesh(mesh_shape, ("i",))
    f = jax.shard_map(lambda b: jax_tma.ppermute(b, axis_name, perm, method=method),
                      mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    return jax.jit(f)(np.ones((mesh.size * 2,), np.float32) if x is None else x)


@pytest.mark.parametrize("perm, match", [
    ([(0, 1), (0, 2)], r"jax_tma.ppermute: perm is not a permutation: source 0 appears 2 times"),
    ([(0, 1), (2, 1)], r"jax_tma.ppermute: perm is not a permutation: destination 1 appears 2 times"),
    ([(0, 4)], r"jax_tma.ppermute: perm pair \(0, 4\) is outside the axis: positions run 0..3 \(axis size 4\)"),
    ([(-1, 0)], r"perm pair \(-1, 0\) is outside the axis"),
])
def test_bad_perm_values(perm, match):
    with pytest.raises(ValueError, match=match):
        _call((4,), perm)


@pytest.mark.parametrize("perm", [[(0.0, 1)], [(True, 1)], [(0, 1, 2)], [0, 1], "01"])
def test_bad_perm_types(perm):
    with pytest.raises(TypeError, match=r"jax_tma.ppermute: perm must be a sequence of \(source, destination\) int pairs"):
        _call((4,), perm)


def test_unknown_axis_name():
    with pytest.raises(NameError, match=r"jax_tma.ppermute: axis name 'j' is not bound here"):
        _call((4,), [(0, 1)], axis_name="j")


def test_bad_axis_name_type():
    with pytest.raises(TypeError, match=r"jax_tma.ppermute: axis_name must be a mesh axis name"):
        _call((4,), [(0, 1)], axis_name=3)


def test_axis_names_out_of_mesh_order():
    mesh = _mesh((4, 2), ("a", "b"))
    f = jax.shard_map(lambda b: jax_tma.ppermute(b, ("b", "a"), [(0, 1)]), mesh=mesh,
                      in_specs=P("a", "b"), out_specs=P("a", "b"))
    with pytest.raises(ValueError, match=r"jax_tma.ppermute: axis_name \('b', 'a'\) must list the "
                       r"mesh axes in the mesh's order \('a', 'b'\)"):
        jax.jit(f)(np.ones((8, 4), np.float32))


def test_bad_method():
    with pytest.raises(ValueError, match=r"jax_tma.ppermute: method must be one of 'auto', 'tma', 'simt', got 'dma'"):
        _call((4,), [(0, 1)], method="dma")


def test_bulk_is_the_deprecated_name_of_tma():
    x = np.arange(8.0, dtype=np.float32)
    with pytest.warns(DeprecationWarning, match=r"jax_tma\.ppermute: method='bulk' is "
                      r"deprecated, use method='tma'") as record:
        y = _call((4,), [(0, 1), (1, 0)], method="bulk", x=x)
    # _call's lambda calls ppermute: the warning names that line.
    assert record[0].filename == __file__
    assert record[0].lineno == _call.__code__.co_firstlineno + 2
    assert_bits_equal(y, _call((4,), [(0, 1), (1, 0)], method="tma", x=x))


def test_bad_direction():
    mesh = _mesh((4,), ("i",))
    f = jax.shard_map(lambda b: jax_tma.ppermute(b, "i", [(0, 1)], direction="both"),
                      mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    with pytest.raises(ValueError, match=r"jax_tma.ppermute: direction must be one of 'auto', "
                       r"'pull', 'push', got 'both'"):
        jax.jit(f)(np.ones(8, np.float32))


def test_bad_x():
    with pytest.raises(TypeError, match=r"jax_tma.ppermute: x must be an array"):
        jax_tma.ppermute([1.0, 2.0], "i", [(0, 0)])


# ---- validation: the C++ handler (exported HLO can skip Python) ----------

_raw_instances = iter(range(10**12, 10**13))


def _raw(devices, sources, method="auto", y_shape=(4,), push=False, x=None, instance=None,
         device=0, **where):
    """The target called directly on one CPU device, as a program of its own,
    with the given attributes (the participants all of process 0, waiting a
    minute for each other, unless `where` says otherwise: two threads'
    programs may compile seconds apart); x defaults to 4 float32 ones."""
    jax_tma._ffi.register()
    x = np.ones(4, np.float32) if x is None else x
    instance = next(_raw_instances) if instance is None else instance
    where = {"process": np.int64(0), "processes": np.zeros(len(devices), np.int64), "links": "",
             "site": "test", "timeout_ms": np.int64(60000), **where}
    call = jax.ffi.ffi_call("jax_tma_ppermute", jax.ShapeDtypeStruct(y_shape, x.dtype))
    return jax.jit(lambda a: call(a, instance=np.int64(instance),
                                  devices=np.array(devices, np.int64),
                                  sources=np.array(sources, np.int64), push=push,
                                  method=method, **where))(
        jax.device_put(x, jax.devices("cpu")[device]))


@pytest.mark.parametrize("devices, sources, method, y_shape, match", [
    ([0], [0, 0], "auto", (4,), r"jax_tma.ppermute: devices has 1 entries, sources 2 and "
                                r"processes 1; each needs one entry per device"),
    ([0, 0], [0, 1], "auto", (4,), r"jax_tma.ppermute: device 0 of process 0 appears twice in "
                                   r"devices \(positions 0 and 1\)"),
    ([0], [3], "auto", (4,), r"jax_tma.ppermute: sources\[0\] = 3 is not a position in \[0, 1\) or -1"),
    ([1, 0], [0, 0], "auto", (4,), r"jax_tma.ppermute: position 0 is the source of both 0 and 1"),
    ([5], [0], "auto", (4,), r"jax_tma.ppermute: device 0 of process 0 is not among the devices"),
    ([0], [0], "dma", (4,), r"jax_tma.ppermute: method must be one of 'auto', 'tma', 'bulk', 'simt', got 'dma'"),
    ([0], [0], "auto", (5,), r"jax_tma.ppermute: output has 5 elements but input has 4"),
])
def test_handler_rejects_bad_attributes(devices, sources, method, y_shape, match):
    with pytest.raises(Exception, match=match):
        _raw(devices, sources, method, y_shape)


@pytest.mark.parametrize("where, match", [
    ({"processes": np.zeros(1, np.int64)}, r"devices has 2 entries, sources 2 and processes 1"),
    ({"processes": np.array([0, 1], np.int64)},
     r"jax_tma.ppermute: process 0 has no link name \(0 given\)"),
    ({"processes": np.array([0, 1], np.int64), "links": "a\n"},
     r"jax_tma.ppermute: process 1 has no link name \(2 given\)"),
    ({"processes": np.array([0, 1], np.int64), "links": "a\nb", "timeout_ms": np.int64(0)},
     r"jax_tma.ppermute: timeout_ms must be positive, got 0"),
    ({"process": np.int64(1), "processes": np.array([0, 2], np.int64)},
     r"device 0 of process 1 is not among the devices"),
    ({"process": np.int64(-2**63)}, r"process must be in \[0, 2147483647\], got "
                                    r"-9223372036854775808"),
    ({"process": np.int64(2**32)}, r"process must be in \[0, 2147483647\], got 4294967296"),
])
def test_handler_rejects_bad_process_attributes(where, match):
    # Device 0 of process 0 and device 0 of process 1 may both take part;
    # a call across processes needs every process's link name.
    with pytest.raises(Exception, match=match):
        _raw([0, 0], [1, 0], **where)


@pytest.mark.parametrize("push", [False, True])
def test_handler_single_device_self_copy(rng, push):
    x = random_array(rng, (4, 3), np.float32)
    assert_bits_equal(_raw([0], [0], push=push, x=x, y_shape=x.shape), x)
    assert_bits_equal(_raw([0], [-1], push=push, x=x, y_shape=x.shape),
                      np.zeros(x.shape, np.float32))


def test_a_peer_that_never_arrives_times_out_after_the_calls_timeout(rng):
    # Device 1 never runs its part: device 0 gives up after timeout_ms.
    with pytest.raises(Exception, match=r"DEADLINE_EXCEEDED: jax_tma\.ppermute: device 0 waited "
                                        r"0\.25 s for device 1 to publish its buffer for call 0 "
                                        r"of this ppermute"):
        jax.block_until_ready(_raw([0, 1], [1, -1], timeout_ms=np.int64(250)))


def test_handler_rejects_an_instance_on_another_device_count(rng):
    """The devices of one lowered ppermute (one `instance`) meet in a table
    sized on first use; the same instance over another number of devices
    is an error, not a meeting that waits for devices that never come."""
    x = random_array(rng, (4,), np.float32)
    instance = next(_raw_instances)
    assert_bits_equal(_raw([0], [0], x=x, instance=instance), x)
    with pytest.raises(Exception, match=rf"jax_tma\.ppermute: instance {instance} was first "
                                        r"run on 1 devices and now on 2"):
        jax.block_until_ready(_raw([0, 1], [-1, -1], x=x, instance=instance))


@pytest.mark.parametrize("push", [False, True])
def test_handler_rejects_calls_of_different_runs(rng, push):
    """Two programs launched apart (two runs, as exported HLO run once per
    device could be) whose calls carry one instance: device 1 sends to
    device 0, so their k-th calls meet, and the run ids differ. The device
    that copies (pull: 0 reads 1's input; push: 1 writes 0's output) names
    both runs; the other learns that it failed. Neither waits for a timeout."""
    x = random_array(rng, (2, 4), np.float32)
    instance = next(_raw_instances)

    def part(device):
        try:
            jax.block_until_ready(_raw([0, 1], [1, -1], push=push, x=x, y_shape=x.shape,
                                       instance=instance, device=device))
        except Exception as e:  # noqa: BLE001 (the handler's error, whatever XLA wraps it in)
            return str(e)
        return None

    pool = concurrent.futures.ThreadPoolExecutor(2)
    parts = [pool.submit(part, d) for d in (0, 1)]
    done, _ = concurrent.futures.wait(parts, timeout=60)
    pool.shutdown(wait=False)  # a hung handler gives up after the call's timeout_ms
    assert len(done) == 2, "the two runs' calls did not meet (a handler waits for its peer)"
    errors = [p.result() for p in parts]
    mismatch = (r"jax_tma\.ppermute: call 0 on device (\d) belongs to run -?\d+ but on device "
                r"(\d) to run -?\d+; executions of this program reached the devices in "
                r"different orders")
    copier = 1 if push else 0
    assert errors[copier] is not None and re.search(mismatch, errors[copier]), errors
    other = errors[1 - copier]
    assert other is not None and re.search(
        rf"jax_tma\.ppermute: device {copier} failed \({mismatch}\); this ppermute cannot run "
        r"again in this process", other), errors


# ---- finding the processes of a mesh (the process link's names) ------------

class _FakeStore:
    """jax.distributed's key-value store as _process_links uses it."""

    def __init__(self, values):
        self.values = dict(values)

    def key_value_set(self, key, value):
        assert key not in self.values, key
        self.values[key] = value

    def blocking_key_value_get(self, key, timeout_in_ms):
        if key not in self.values:
            raise RuntimeError(f"DEADLINE_EXCEEDED: {key} after {timeout_in_ms} ms")
        return self.values[key]


def _links_with(monkeypatch, values, timeout_s="0.5"):
    from jax._src import distributed

    from jax_tma import _ppermute

    if _ppermute._own_link:  # this process published its link to an earlier store
        values = {"jax_tma/ppermute/link/0":
                  f"{_ppermute._host()}\n{_ppermute._own_link[0]}\n{os.getpid()}\n", **values}
    store = _FakeStore(values)
    monkeypatch.setattr(distributed.global_state, "client", store)
    monkeypatch.setenv(_ppermute.TIMEOUT_ENV, timeout_s)
    return _ppermute._process_links([0, 1]), store


def test_process_links_of_one_host(monkeypatch):
    from jax_tma import _ppermute

    (names, why), store = _links_with(
        monkeypatch, {"jax_tma/ppermute/link/1": f"{_ppermute._host()}\nthe-peer\n4242\n"})
    host, own, pid, ordinals = store.values["jax_tma/ppermute/link/0"].split("\n")
    assert host == _ppermute._host() and own.startswith("jax_tma.") and pid == str(os.getpid())
    assert ordinals == " ".join(f"{d.id}:{d.id}" for d in jax.local_devices())
    assert names == [own, "the-peer"] and why == ""
    # The link holds process 1 to that name and pid: the key-value store
    # gives each process one entry, so another one is refused.
    with pytest.raises(RuntimeError, match=r"process 1 is known as pid 4242 on @the-peer, not as "
                                           r"pid 4343 on @the-peer"):
        _links_with(monkeypatch,
                    {"jax_tma/ppermute/link/1": f"{_ppermute._host()}\nthe-peer\n4343\n"})


def test_a_peer_with_an_impossible_pid_is_refused(monkeypatch):
    from jax_tma import _ppermute

    with pytest.raises(RuntimeError, match=r"process 1 published pid 0, which no process can have"):
        _links_with(monkeypatch, {"jax_tma/ppermute/link/1": f"{_ppermute._host()}\nthe-peer\n0\n"})


def test_processes_of_another_host_keep_lax_ppermute(monkeypatch):
    (names, why), _ = _links_with(monkeypatch, {"jax_tma/ppermute/link/1": "elsewhere/1\np\n1\n"})
    assert names is None
    assert why == ("process 1 runs on another host (elsewhere); the process link joins the "
                   "processes of one host")


def test_a_process_that_never_publishes_is_named(monkeypatch):
    with pytest.raises(RuntimeError, match=r"jax_tma.ppermute: process 1 did not publish its "
                                           r"link within 0.5 s \(JAX_TMA_PPERMUTE_TIMEOUT_S\): "
                                           r"it does not run this program"):
        _links_with(monkeypatch, {})


@pytest.mark.parametrize("value", ["0", "-1", "nan", "soon", "1e9"])
def test_a_bad_timeout_is_refused(monkeypatch, value):
    with pytest.raises(ValueError, match=rf"jax_tma.ppermute: JAX_TMA_PPERMUTE_TIMEOUT_S="
                                         rf"'{value}' is not a number of seconds in \(0, 2147483\)"):
        _links_with(monkeypatch, {}, timeout_s=value)


def test_without_jax_distributed_there_is_no_link(monkeypatch):
    from jax._src import distributed

    from jax_tma import _ppermute

    monkeypatch.setattr(distributed.global_state, "client", None)
    assert _ppermute._process_links([0, 1]) == (
        None, "jax.distributed is not initialized (its key-value store finds the peers)")
