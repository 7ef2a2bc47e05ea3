"""jax_tma.ragged_all_to_all on 8 host devices: bit for bit (as unsigned
integers) against the NumPy reference and the lax.all_to_all formulation
(XLA:CPU cannot run lax.ragged_all_to_all) over one mesh axis or both,
random, empty and skewed sizes, one or two slices a position, every dtype,
rows of any byte size, int32/int64 and narrower offsets; the output written
in place (donated) with unwritten rows kept; eager, jit, disable_jit, vmap,
jvp and grad; varying and replicated operands under shard_map's checks;
axis_index_groups and the other fallbacks, and their log; every validation
rule's message, at trace time and from the CPU handler. The mode tests
(tests/families/ppermute.py's OPS) cover every dtype's grads, export,
Explicit meshes and the fuzz; test_ppermute_processes.py several
processes."""

import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_tma
from families.ppermute import ragged_geometry, ragged_reference
from jax_tma._ragged_all_to_all import bind as ragged_bind
from jax_tma._ragged_all_to_all import composed
from reference import ALL_DTYPES, assert_bits_equal, random_array

MESH = Mesh(np.array(jax.devices("cpu")[:8]).reshape(2, 4), ("a", "b"))
BOTH = ("a", "b")
INDICES = ("input_offsets", "send_sizes", "output_offsets", "recv_sizes")


def _on_mesh(fn, spec=P(BOTH), out=None, jit=True):
    f = jax.shard_map(fn, mesh=MESH, in_specs=spec, out_specs=spec if out is None else out)
    return jax.jit(f) if jit else f


def _ours(axes, **kw):
    return lambda *a: jax_tma.ragged_all_to_all(*a, axis_name=axes, **kw)


def _lax(axes, **kw):
    return lambda *a: composed(*a, axis_name=axes, **kw)


def _exchange(rng, axes=BOTH, per=1, dtype=np.uint32, row=(3,), **kw):
    """Global operand, output and index arrays of a valid exchange over
    `axes` of the 2 x 4 mesh (its groups: all 8 devices, or each row of 4
    along "b"), and the NumPy result."""
    groups = 1 if axes == BOTH else 2
    n = 8 // groups
    parts = [ragged_geometry(rng, n, per, **kw) for _ in range(groups)]
    rows = max(g["rows"] for g in parts)
    out_rows = max(g["out_rows"] for g in parts)
    operand = random_array(rng, (8 * rows,) + row, dtype)
    output = random_array(rng, (8 * out_rows,) + row, dtype)
    index = [np.concatenate([g[k] for g in parts]) for k in INDICES]
    want = np.concatenate([
        ragged_reference(*(np.split(a, groups)[k] for a in (operand, output, *index)), n)
        for k in range(groups)])
    return (operand, output, *index), want


# ---- results ------------------------------------------------------------------

@pytest.mark.parametrize("axes", ["b", BOTH])
@pytest.mark.parametrize("per", [1, 2])
@pytest.mark.parametrize("sizes", ["random", "empty", "skewed"])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_matches_numpy_and_the_lax_formulation(rng, axes, per, sizes, index_dtype):
    kw = dict(max_size=0) if sizes == "empty" else dict(skew=sizes == "skewed")
    args, want = _exchange(rng, axes, per, index_dtype=index_dtype, **kw)
    got = _on_mesh(_ours(axes))(*args)
    assert_bits_equal(got, want)
    assert_bits_equal(_on_mesh(_lax(axes))(*args), want)


def test_lax_docstring_example_on_two_devices():
    pair = Mesh(np.array(jax.devices("cpu")[:2]), ("x",))
    f = jax.jit(jax.shard_map(lambda *a: jax_tma.ragged_all_to_all(*a, axis_name="x"),
                              mesh=pair, in_specs=P("x"), out_specs=P("x")))
    got = f(np.array([1, 2, 2, 3, 4, 0], np.int32), np.zeros(8, np.int32),
            np.array([0, 1, 0, 1]), np.array([1, 2, 1, 1]), np.array([0, 0, 1, 2]),
            np.array([1, 1, 2, 1]))
    assert got.tolist() == [1, 3, 0, 0, 2, 2, 4, 0]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype(rng, dtype):
    args, want = _exchange(rng, BOTH, 2, dtype=dtype, row=(2,))
    assert_bits_equal(_on_mesh(_ours(BOTH))(*args), want)


@pytest.mark.parametrize("row,dtype", [((), np.uint8), ((5,), np.uint8), ((3, 7), np.int16),
                                       ((1,), np.complex128), ((17,), np.float32)], ids=str)
def test_rows_of_any_byte_size(rng, row, dtype):
    args, want = _exchange(rng, BOTH, 2, dtype=dtype, row=row, max_size=5)
    assert_bits_equal(_on_mesh(_ours(BOTH))(*args), want)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.uint8, np.uint16, np.uint32, np.uint64,
                                   np.int32, np.int64], ids=str)
def test_offsets_of_every_integer_dtype(rng, dtype):
    args, want = _exchange(rng, BOTH, 1)
    args = args[:2] + tuple(a.astype(dtype) for a in args[2:])
    assert_bits_equal(_on_mesh(_ours(BOTH))(*args), want)


def test_the_output_is_written_in_place_and_keeps_unwritten_rows(rng):
    args, want = _exchange(rng, BOTH, 2)
    sharding = NamedSharding(MESH, P(BOTH))
    placed = [jax.device_put(a, sharding) for a in args]
    f = jax.jit(jax.shard_map(_ours(BOTH), mesh=MESH, in_specs=P(BOTH), out_specs=P(BOTH)),
                donate_argnums=1)
    got = f(*placed)
    assert placed[1].is_deleted(), "the donated output was not used in place"
    assert_bits_equal(got, want)
    # the rows no slice writes are the output's: where want has them
    written = ragged_reference(np.ones(args[0].shape[:1], bool),
                               np.zeros(args[1].shape[:1], bool), *args[2:], 8)
    assert_bits_equal(np.asarray(got)[~written], args[1][~written])


@pytest.mark.parametrize("mode", ["eager", "jit", "disable_jit"])
def test_eager_jit_and_disable_jit(rng, mode):
    args, want = _exchange(rng, BOTH, 2, dtype=np.float32)
    f = _on_mesh(_ours(BOTH), jit=mode == "jit")
    if mode == "disable_jit":
        with jax.disable_jit():
            got = f(*args)
    else:
        got = f(*args)
    assert_bits_equal(got, want)


def _geometries(rng, k: int, per: int) -> tuple[list[tuple], int, int]:
    """`k` exchanges over all 8 devices with blocks of one size: their index
    arrays, and the operand's and output's rows a block."""
    drawn = [ragged_geometry(rng, 8, per) for _ in range(k)]
    rows, out_rows = max(g["rows"] for g in drawn), max(g["out_rows"] for g in drawn)
    return [tuple(g[name] for name in INDICES) for g in drawn], rows, out_rows


# Index arrays are batched all together or not at all: a member's offsets
# fit its own sizes.
@pytest.mark.parametrize("batched", [(0, 1), (0, 1, 2, 3, 4, 5), (1, 2, 3, 4, 5)])
def test_vmap_folds_the_batch_into_the_rows(rng, batched):
    geometries, rows, out_rows = _geometries(rng, 3, 2)
    members = [(random_array(rng, (8 * rows, 2), np.float32),
                random_array(rng, (8 * out_rows, 2), np.float32), *g) for g in geometries]
    args = [np.stack([m[i] for m in members]) if i in batched else members[0][i]
            for i in range(6)]
    in_axes = tuple(0 if i in batched else None for i in range(6))
    want = np.stack([ragged_reference(*(m[i] if i in batched else members[0][i]
                                        for i in range(6)), 8) for m in members])
    ours = jax.jit(jax.vmap(_on_mesh(_ours(BOTH), jit=False), in_axes=in_axes))
    assert_bits_equal(ours(*args), want)


def test_under_vmap_an_offset_past_its_members_rows_is_refused(rng):
    """Folded, member 0's slice one row past its own operand would read
    member 1's first row: the batching rule makes it -1, which the handler
    refuses (slice k of member b is slice k * batch + b of the folded
    arrays)."""
    geometries, rows, out_rows = _geometries(rng, 2, 1)
    index = [np.stack([g[k] for g in geometries]) for k in range(4)]
    index[0][0, 0], index[1][0, 0] = rows, 1  # member 0, device 0, slice 0
    x = random_array(rng, (2, 8 * rows, 2), np.float32)
    out = random_array(rng, (2, 8 * out_rows, 2), np.float32)
    f = jax.jit(jax.vmap(_on_mesh(_ours(BOTH), jit=False)))
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=r"jax_tma\.ragged_all_to_all: input_offsets\[0\] = -1 on device 0 "
                             r"of process 0 \(position 0\) is negative"):
        jax.block_until_ready(f(x, out, *index))


def test_vmap_over_the_exchange_axis_is_not_implemented_as_in_lax(rng):
    x = np.ones((4, 3), np.float32)
    idx = np.zeros(4, np.int32)
    with pytest.raises(NotImplementedError, match=r"jax_tma\.ragged_all_to_all: axis \('v',\) "
                                                  r"is not a mesh axis"):
        jax.vmap(lambda a: jax_tma.ragged_all_to_all(a, a, idx, idx, idx, idx, axis_name="v"),
                 axis_name="v")(x[:, None].repeat(4, 1))


def _loss(fn, args, weights):
    def loss(operand, output):
        return (fn(operand, output, *args[2:]) * weights).sum()
    return loss


def test_grad_and_jvp_match_the_lax_formulation(rng):
    args, _ = _exchange(rng, BOTH, 2, dtype=np.float32, row=(2,))
    args = (random_array(rng, args[0].shape, np.float32, finite=True),
            random_array(rng, args[1].shape, np.float32, finite=True)) + args[2:]
    weights = rng.choice([-2.0, -1.0, 1.0, 2.0], args[1].shape).astype(np.float32)
    ours, ref = _on_mesh(_ours(BOTH), jit=False), _on_mesh(_lax(BOTH), jit=False)
    got = jax.jit(jax.grad(_loss(ours, args, weights), argnums=(0, 1)))(*args[:2])
    want = jax.jit(jax.grad(_loss(ref, args, weights), argnums=(0, 1)))(*args[:2])
    for g, w in zip(got, want):
        assert_bits_equal(g, w)
    tangents = tuple(rng.choice([-1.0, 1.0], a.shape).astype(np.float32) for a in args[:2])
    for fn in (ours, ref):
        y, dy = jax.jit(lambda a, b, ta, tb, f=fn: jax.jvp(
            lambda p, q: f(p, q, *args[2:]), (a, b), (ta, tb)))(*args[:2], *tangents)
        assert_bits_equal(y, ragged_reference(*args, 8))
        assert_bits_equal(dy, ragged_reference(*tangents, *args[2:], 8))


def _own_rows(out_rows: int):
    """The exchange into a result of `out_rows` rows of its own (an output
    of no rows), as jax_tma's compositions bind it."""
    def f(operand, *indices):
        empty = jnp.zeros((0,) + operand.shape[1:], operand.dtype)
        return ragged_bind(operand, empty, *indices, axis_name=BOTH, size=8, site="test",
                           rows=out_rows)
    return f


@pytest.mark.parametrize("mode", ["jit", "vmap", "grad"])
def test_a_result_of_rows_of_its_own_holds_the_slices(rng, mode):
    """The rows that the slices write are theirs (the others unspecified);
    vmap folds the batch into the result's rows; the grad reaches the
    operand from those rows alone, as lax's does from an output of zeros."""
    args, _ = _exchange(rng, BOTH, 2, dtype=np.float32, row=(2,))
    operand = random_array(rng, args[0].shape, np.float32, finite=True)
    indices, out_rows = args[2:], args[1].shape[0] // 8
    zeros = np.zeros_like(args[1])
    written = ragged_reference(np.ones(operand.shape[:1], bool), np.zeros(zeros.shape[:1], bool),
                               *indices, 8)
    ours = _on_mesh(_own_rows(out_rows), jit=False)
    if mode == "jit":
        got = jax.jit(ours)(operand, *indices)
        assert got.shape == zeros.shape
        assert_bits_equal(np.asarray(got)[written],
                          ragged_reference(operand, zeros, *indices, 8)[written])
    elif mode == "vmap":
        members = np.stack([operand, random_array(rng, operand.shape, np.float32)])
        got = np.asarray(jax.jit(jax.vmap(ours, in_axes=(0,) + (None,) * 4))(members, *indices))
        assert got.shape == (2,) + zeros.shape
        for m, g in zip(members, got):
            assert_bits_equal(g[written], ragged_reference(m, zeros, *indices, 8)[written])
    else:
        weights = np.where(written[:, None], rng.choice([-2.0, 1.0], zeros.shape),
                           0).astype(np.float32)
        got = jax.jit(jax.grad(lambda o: (ours(o, *indices) * weights).sum()))(operand)
        want = jax.jit(jax.grad(_loss(_on_mesh(_lax(BOTH), jit=False), args, weights)))(
            operand, zeros)
        assert_bits_equal(got, want)


def test_a_replicated_output_takes_a_varying_result(rng):
    """output the same on every device, operand and offsets varying: the
    result varies (shard_map's checks on), and out_specs=P() is refused as
    for lax's collectives."""
    args, _ = _exchange(rng, BOTH, 1)
    out_block = args[1][:args[1].shape[0] // 8]
    specs = (P(BOTH), P(), P(BOTH), P(BOTH), P(BOTH), P(BOTH))
    f = jax.jit(jax.shard_map(_ours(BOTH), mesh=MESH, in_specs=specs, out_specs=P(BOTH)))
    want = ragged_reference(args[0], np.concatenate([out_block] * 8), *args[2:], 8)
    assert_bits_equal(f(args[0], out_block, *args[2:]), want)
    g = jax.jit(jax.shard_map(_ours(BOTH), mesh=MESH, in_specs=specs, out_specs=P()))
    with pytest.raises(ValueError, match="out_specs which require replication"):
        g.lower(args[0], out_block, *args[2:])


# ---- the transport and the fallbacks, and what the log says -----------------

def test_the_debug_log_names_the_transport(rng, caplog):
    args, want = _exchange(rng, BOTH, 1)
    with caplog.at_level(logging.DEBUG, logger="jax_tma"):
        assert_bits_equal(_on_mesh(_ours(BOTH))(*args), want)
    assert "jax_tma.ragged_all_to_all over ('a', 'b') at " in caplog.text
    assert ("jax_tma_ragged_all_to_all (cpu peer copies between 8 devices of this process, "
            "7 steps)" in caplog.text)


def test_axis_index_groups_take_the_lax_formulation_and_say_so(rng, caplog):
    # groups of 2 along "b": positions (0, 2) and (1, 3) of each row
    groups = [[0, 2], [1, 3]]
    per_group = [ragged_geometry(rng, 2, 2) for _ in range(4)]  # 2 slices a position
    rows = max(g["rows"] for g in per_group)
    out_rows = max(g["out_rows"] for g in per_group)
    operand = random_array(rng, (8 * rows, 3), np.uint32)
    output = random_array(rng, (8 * out_rows, 3), np.uint32)
    # device (a, b) is mesh device 4a + b; group g of row a: b in groups[g]
    index = [np.zeros(8 * 4, np.int64) for _ in INDICES]
    members = []
    for a in range(2):
        for g, group in enumerate(groups):
            geometry = per_group[2 * a + g]
            devices = [4 * a + b for b in group]
            members.append(devices)
            for k, name in enumerate(INDICES):
                for p, d in enumerate(devices):
                    index[k][4 * d:4 * d + 4] = np.split(geometry[name], 2)[p]
    want = np.array(output)
    for devices in members:
        pick = lambda x, rows_: np.concatenate(  # noqa: E731
            [x[d * rows_:(d + 1) * rows_] for d in devices])
        got_group = ragged_reference(pick(operand, rows), pick(output, out_rows),
                                     *(pick(i, 4) for i in index), 2)
        for p, d in enumerate(devices):
            want[d * out_rows:(d + 1) * out_rows] = np.split(got_group, 2)[p]
    with caplog.at_level(logging.DEBUG, logger="jax_tma"):
        got = _on_mesh(_ours("b", axis_index_groups=groups))(operand, output, *index)
    assert_bits_equal(got, want)
    assert ("jax_tma.ragged_all_to_all over ('b',) at " in caplog.text and
            "lax.all_to_all of padded slices, because axis_index_groups is given" in caplog.text)


def test_a_shard_map_manual_over_some_axes_takes_the_lax_formulation(rng, caplog):
    """A shard_map manual over "b" alone ("a" automatic: every operand
    replicated along it, the same exchange in both rows of the mesh)."""
    args, _ = _exchange(rng, "b", 1)
    row = [a[:a.shape[0] // 2] for a in args]  # the blocks of one row of 4 devices
    f = jax.jit(jax.shard_map(_ours("b"), mesh=MESH, in_specs=P("b"), out_specs=P("b"),
                              axis_names={"b"}))
    with caplog.at_level(logging.DEBUG, logger="jax_tma"):
        got = f(*row)
    assert_bits_equal(got, ragged_reference(*row, 4))
    assert ("lax.all_to_all of padded slices, because the shard_map is manual over ['b'], not "
            "every mesh axis" in caplog.text), caplog.text


# ---- validation: trace time --------------------------------------------------

def _trace(args, axes=BOTH, **kw):
    return _on_mesh(lambda *a: jax_tma.ragged_all_to_all(*a, axis_name=axes, **kw)).lower(*args)


def _valid(rng):
    return list(_exchange(rng, BOTH, 1, index_dtype=np.int32)[0])


@pytest.mark.parametrize("change,error,match", [
    (lambda a: a.__setitem__(1, a[1].astype(np.int32)), TypeError,
     r"jax_tma\.ragged_all_to_all: output has dtype int32 but operand has uint32"),
    (lambda a: a.__setitem__(1, a[1][:, :2]), ValueError,
     r"operand's rows have shape \(3,\) but output's \(2,\)"),
    (lambda a: a.__setitem__(3, a[3].astype(np.float32)), TypeError,
     r"send_sizes must be integers, got dtype float32"),
    (lambda a: a.__setitem__(5, a[5].astype(np.int64)), TypeError,
     r"recv_sizes has dtype int64 but input_offsets has int32; the four offset and size arrays "
     r"share one dtype"),
])
def test_bad_arrays_are_refused_by_name(rng, change, error, match):
    args = _valid(rng)
    change(args)
    with pytest.raises(error, match=match):
        _trace(args)


def test_more_bad_arrays_are_refused_by_name(rng):
    args = _valid(rng)
    body = lambda *a: jax_tma.ragged_all_to_all(*a, axis_name=BOTH)  # noqa: E731
    with pytest.raises(ValueError, match=r"operand and output must have rank >= 1 \(rows first\)"):
        _on_mesh(lambda o, *a: body(o[0, 0], *a)).lower(*args)
    with pytest.raises(ValueError, match=r"input_offsets must have rank 1 and at least one "
                                         r"entry, got shape \(1, 8\)"):
        _on_mesh(lambda o, u, i, *a: body(o, u, i[None], *a)).lower(*args)
    with pytest.raises(ValueError, match=r"recv_sizes has 7 entries but input_offsets has 8"):
        _on_mesh(lambda *a: body(*a[:5], a[5][:7])).lower(*args)
    with pytest.raises(ValueError, match=r"input_offsets has 7 entries, not a multiple of the 8 "
                                         r"positions along \('a', 'b'\)"):
        _on_mesh(lambda *a: body(a[0], a[1], *(i[:7] for i in a[2:]))).lower(*args)
    with pytest.raises(TypeError, match=r"jax_tma\.ragged_all_to_all: operand must be an array"):
        _on_mesh(lambda *a: body({"x": a[0]}, *a[1:])).lower(*args)
    with pytest.raises(TypeError, match=r"output must be an array"):
        _on_mesh(lambda *a: body(a[0], [a[1]], *a[2:])).lower(*args)


def _static_call(rng, **values):
    """A call over "b" (4 positions) of blocks of 6 rows into 10, its index
    arrays NumPy constants (the same on every device): `values` replace
    them."""
    index = dict(input_offsets=np.array([0, 1, 2, 3]), send_sizes=np.ones(4, np.int64),
                 output_offsets=np.array([0, 2, 4, 6]), recv_sizes=np.ones(4, np.int64))
    index.update(values)
    x = random_array(rng, (48, 2), np.float32)
    out = random_array(rng, (80, 2), np.float32)
    return _on_mesh(lambda a, b: jax_tma.ragged_all_to_all(
        a, b, *(index[k] for k in INDICES), axis_name="b")), x, out


@pytest.mark.parametrize("values,match", [
    (dict(input_offsets=np.array([0, -1, 2, 3])), r"input_offsets\[1\] = -1 is negative"),
    (dict(recv_sizes=np.array([1, 1, 1, -3])), r"recv_sizes\[3\] = -3 is negative"),
    (dict(input_offsets=np.array([0, 1, 2, 5]), send_sizes=np.array([1, 1, 1, 2]),
          recv_sizes=np.array([1, 1, 1, 1])),
     r"input_offsets\[3\] \+ send_sizes\[3\] = 5 \+ 2 runs past the operand's 6 rows"),
    (dict(output_offsets=np.array([0, 2, 4, 10])),
     r"output_offsets\[3\] \+ send_sizes\[3\] = 10 \+ 1 runs past the output's 10 rows \(on "
     r"the device at position 3, which receives slice 3\)"),
    (dict(send_sizes=np.array([1, 2, 1, 1])),
     r"recv_sizes\[0\] = 1 differs from send_sizes\[1\] = 2: static sizes are the same on every "
     r"device, so position 0 sends 2 rows as its slice 1 to position 1, which expects 1"),
])
def test_static_offsets_and_sizes_are_checked_at_trace_time(rng, values, match):
    f, x, out = _static_call(rng, **values)
    with pytest.raises(ValueError, match=r"jax_tma\.ragged_all_to_all: " + match):
        f.lower(x, out)


def test_static_sizes_with_traced_offsets_run(rng):
    """Static offsets and sizes beside traced output offsets: every device
    sends its row p to position p along "b", where it lands at the row of
    the sender's own position."""
    x = random_array(rng, (8 * 4, 2), np.float32)
    out = random_array(rng, (8 * 5, 2), np.float32)
    ones = np.ones(4, np.int32)

    def local(a, b):
        at = jnp.full(4, lax.axis_index("b"), np.int32)
        return jax_tma.ragged_all_to_all(a, b, np.arange(4, dtype=np.int32), ones, at, ones,
                                         axis_name="b")

    got = _on_mesh(local)(x, out)
    index = [np.tile(np.arange(4), 8), np.ones(32, np.int64),
             np.repeat(np.tile(np.arange(4), 2), 4), np.ones(32, np.int64)]
    want = np.concatenate([ragged_reference(x[16 * r:16 * (r + 1)], out[20 * r:20 * (r + 1)],
                                            *(i[16 * r:16 * (r + 1)] for i in index), 4)
                           for r in range(2)])
    assert_bits_equal(got, want)


def test_axis_names_and_groups_are_checked(rng):
    args = _valid(rng)
    with pytest.raises(NameError, match=r"jax_tma\.ragged_all_to_all: axis name 'c' is not bound "
                                        r"here; call ragged_all_to_all inside shard_map"):
        _trace(args, axes="c")
    with pytest.raises(ValueError, match=r"axis_name \('b', 'a'\) must list the mesh axes in the "
                                         r"mesh's order"):
        _trace(args, axes=("b", "a"))
    with pytest.raises(ValueError, match=r"axis_index_groups must split the 4 positions along "
                                         r"\('b',\) into groups of one size"):
        _trace(args, axes="b", axis_index_groups=[[0, 1, 2], [3]])
    with pytest.raises(TypeError, match=r"axis_index_groups must be a sequence of sequences of "
                                        r"ints"):
        _trace(args, axes="b", axis_index_groups=[[0.5, 1], [2, 3]])


# ---- validation: the CPU handler, on traced values ---------------------------

def _runtime_error(rng, edit):
    """The error of a call whose traced arrays `edit` changes: (global index
    arrays as int64, 2 slices a position over both axes) -> None."""
    args, _ = _exchange(rng, BOTH, 2, index_dtype=np.int64)
    args = list(args)
    edit(args)
    with pytest.raises(jax.errors.JaxRuntimeError) as e:
        jax.block_until_ready(_on_mesh(_ours(BOTH))(*args))
    return str(e.value)


def test_the_handler_names_a_negative_value(rng):
    def edit(a):
        a[2][3 * 16 + 5] = -7  # device 3's input_offsets[5]
    msg = _runtime_error(rng, edit)
    assert re.search(r"INVALID_ARGUMENT: jax_tma\.ragged_all_to_all: input_offsets\[5\] = -7 on "
                     r"device 3 of process 0 \(position 3\) is negative", msg), msg


def test_the_handler_names_a_slice_past_the_operand(rng):
    def edit(a):
        rows = a[0].shape[0] // 8
        a[2][16 + 2], a[3][16 + 2] = rows, 1  # device 1's slice 2: one row past the end
    msg = _runtime_error(rng, edit)
    assert re.search(r"jax_tma\.ragged_all_to_all: input_offsets\[2\] \+ send_sizes\[2\] = \d+ "
                     r"\+ 1 on device 1 of process 0 \(position 1\) runs past the operand's "
                     r"\d+ rows", msg), msg


def test_the_handler_names_a_slice_past_its_receivers_output(rng):
    def edit(a):
        out_rows = a[1].shape[0] // 8
        a[4][6 * 16 + 9] = out_rows  # device 6's slice 9, to position 4
        a[3][6 * 16 + 9] = max(int(a[3][6 * 16 + 9]), 1)
    msg = _runtime_error(rng, edit)
    assert re.search(r"output_offsets\[9\] \+ send_sizes\[9\] = \d+ \+ \d+ on device 6 of "
                     r"process 0 \(position 6\) runs past the output's \d+ rows \(on the device "
                     r"at position 4, which receives slice 9\)", msg), msg


def test_the_handler_names_recv_sizes_that_differ_from_what_arrives(rng):
    def edit(a):
        a[5][2 * 16 + 11] += 1  # device 2's recv_sizes[11]: from position 5, its slice 5
    msg = _runtime_error(rng, edit)
    assert re.search(r"recv_sizes\[11\] = \d+ on device 2 of process 0 \(position 2\) differs "
                     r"from send_sizes\[5\] = \d+ on device 5 of process 0 \(position 5\), the "
                     r"slice it sends there", msg), msg


def test_a_refused_call_leaves_the_call_site_usable(rng):
    args, want = _exchange(rng, BOTH, 1)
    f = _on_mesh(_ours(BOTH))
    bad = list(args)
    bad[5] = bad[5] + 1
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"differs from send_sizes"):
        jax.block_until_ready(f(*bad))
    assert_bits_equal(f(*args), want)


# jax 0.11's Shardy canonicaliser (ManualComputationUnusedInputsPattern)
# segfaults compiling any shard_map with a zero-size input, ours or not:
# lax.dynamic_update_slice of a (0, 3) block into its (2, 3) output crashes
# the same way (XLA:CPU, jax 0.11.2, 2026-11-28); jax 0.10.2 and 0.12 compile it.
@pytest.mark.skipif(jax.__version_info__[:2] == (0, 11),
                    reason="jax 0.11's Shardy pass segfaults on any shard_map with a "
                           "zero-size input (ManualComputationUnusedInputsPattern)")
def test_empty_operand_and_output_rows(rng):
    x = np.zeros((0, 3), np.float32)
    zeros = np.zeros(8 * 8, np.int32)
    got = _on_mesh(_ours(BOTH))(x, x, zeros, zeros, zeros, zeros)
    assert got.shape == (0, 3) and got.dtype == jnp.float32
    rows = random_array(rng, (16, 3), np.float32)
    assert_bits_equal(_on_mesh(_ours(BOTH))(x, rows, zeros, zeros, zeros, zeros), rows)


def test_lax_own_op_does_not_run_on_the_cpu(rng):
    """The reference semantics: lax.ragged_all_to_all's own op cannot run on
    the CPU (the reason the tests compare with the lax.all_to_all
    formulation)."""
    args = _valid(rng)
    f = _on_mesh(lambda *a: lax.ragged_all_to_all(*a, axis_name=BOTH))
    with pytest.raises(Exception, match=r"ragged-all-to-all|UNIMPLEMENTED"):
        jax.block_until_ready(f(*args))
