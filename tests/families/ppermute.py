"""The ppermute family's descriptor (tests/families/__init__.py says what
each name is for): jax_tma.ppermute, whose copies are the copy family's
kernels, jax_tma.all_to_all and jax_tma.ragged_all_to_all, which run on
ppermute's transport, and their NumPy references. jax_tma.moe_dispatch and
moe_combine, Python compositions of those two exchanges and of the
dispatch's pull of its rows (target jax_tma_moe_dispatch) and of the
combine's rows summed on their way home (target jax_tma_moe_combine), are
this family's code too (MODULES); tests/test_moe.py tests them.""" 

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_tma
from families.copy import copy_call, copy_reference
from jax_tma._moe import _home_sums_p, _pull_p, _plan_counts_p, _plan_p
from jax_tma._ragged_all_to_all import composed
from fuzz import S, Call, Spec, i64, pick, some_dtype, with_
from ops_table import (BATCH, MESH_AXES, SUB_BYTE_WIDE, Case, Op, dim_size, dims_spec, extra_rank,
                       on_mesh, take_fill)
from paths import CpuCall
from reference import ALL_DTYPES, assert_bits_equal, random_array

MODULES = ("jax_tma._ppermute", "jax_tma._all_to_all", "jax_tma._ragged_all_to_all",
           "jax_tma._moe")


# ---- references -------------------------------------------------------------------

def ppermute_reference(x: np.ndarray, n: int, perm) -> np.ndarray:
    """lax.ppermute's result for `x` split into `n` blocks along dim 0 (a
    1-D mesh): block d is the block of the device sending to d, else zeros
    as jnp writes them (float8_e8m0fnu's 0 is 0xFF)."""
    blocks = np.split(np.asarray(x), n)
    out = [np.full_like(b, np.asarray(0).astype(b.dtype)) for b in blocks]
    for src, dst in perm:
        out[dst] = blocks[src]
    return np.concatenate(out)


def all_to_all_reference(x: np.ndarray, n: int, split_axis: int, concat_axis: int,
                         tiled: bool) -> np.ndarray:
    """lax.all_to_all's result for `x` split into `n` blocks along dim 0 (a
    1-D mesh), split_axis and concat_axis of a block: block j is the
    concatenation along concat_axis of chunk j of every block's split_axis;
    untiled, of slices, with the split dim moved to concat_axis."""
    s, c = split_axis, concat_axis
    blocks = np.split(np.asarray(x), n)
    if not tiled and s != c:
        if s < c:
            c += 1
        else:
            s += 1
        blocks = [np.expand_dims(b, c) for b in blocks]
    chunks = [np.split(b, n, axis=s) for b in blocks]
    out = [np.concatenate([chunks[i][j] for i in range(n)], axis=c) for j in range(n)]
    if not tiled and s != c:
        out = [np.squeeze(o, axis=s) for o in out]
    return np.concatenate(out)


def ragged_reference(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes,
                     n: int) -> np.ndarray:
    """lax.ragged_all_to_all's result for the arrays split into `n` blocks
    along dim 0 (a 1-D mesh): every device's slice i, rows input_offsets[i]
    to + send_sizes[i] of its operand block, written into the output block
    of position i // (N // n) at output_offsets[i], in the order of lax's
    docstring (device by device, slice by slice). recv_sizes is not read:
    valid calls agree with send_sizes."""
    del recv_sizes
    blocks = [np.asarray(b) for b in np.split(np.asarray(operand), n)]
    out = [np.array(b) for b in np.split(np.asarray(output), n)]
    io, ss, oo = (np.split(np.asarray(a).astype(np.int64), n)
                  for a in (input_offsets, send_sizes, output_offsets))
    per = len(io[0]) // n
    for j in range(n):
        for i in range(len(io[j])):
            d, size = i // per, int(ss[j][i])
            out[d][oo[j][i]:oo[j][i] + size] = blocks[j][io[j][i]:io[j][i] + size]
    return np.concatenate(out)


def ragged_geometry(rng, n: int, per: int, *, max_size: int = 3, gaps: bool = True,
                    skew: bool = False, index_dtype=np.int32) -> dict:
    """Valid offsets and sizes of a ragged exchange among `n` devices with
    `per` slices for each position: random sizes (0 among them; `skew`: every
    slice goes to position 0, the others send nothing there), each device's
    slices at random places of its operand and each receiver's at random
    places of its output, never overlapping, with random gaps. The rows of
    operand and output blocks ("rows", "out_rows") fit them; the index
    arrays are global (n * n * per entries, a block per device)."""
    N = n * per
    sizes = rng.integers(0, max_size + 1, (n, N))
    if skew:
        sizes[:, per:] = 0
        sizes[:, :per] = rng.integers(1, max_size + 1, (n, per))

    def place(lengths):
        """Starts of the pieces in a random order, with random gaps; the end."""
        starts, at = np.zeros(len(lengths), np.int64), 0
        for k in rng.permutation(len(lengths)):
            at += int(rng.integers(0, 2)) if gaps else 0
            starts[k] = at
            at += int(lengths[k])
        return starts, at

    io = np.zeros((n, N), np.int64)
    oo = np.zeros((n, N), np.int64)
    rs = np.zeros((n, N), np.int64)
    rows = out_rows = 0
    for j in range(n):
        io[j], end = place(sizes[j])
        rows = max(rows, end)
    for d in range(n):
        # what position d receives: slice t of position j, j-major
        got = [(j, d * per + t) for j in range(n) for t in range(per)]
        starts, end = place([sizes[j, i] for j, i in got])
        for (j, i), start in zip(got, starts):
            oo[j, i] = start
            rs[d, j * per + i - d * per] = sizes[j, i]
        out_rows = max(out_rows, end)
    rows += int(rng.integers(0, 3))
    out_rows += int(rng.integers(1, 3))
    as_ = lambda a: a.reshape(-1).astype(index_dtype)  # noqa: E731
    return dict(rows=rows, out_rows=out_rows, input_offsets=as_(io), send_sizes=as_(sizes),
                output_offsets=as_(oo), recv_sizes=as_(rs))


# ---- the FFI fuzz -----------------------------------------------------------------

# The ppermute meeting state is per instance id and lives as long as the
# process; lowerings number theirs from 1 and test_ppermute's raw calls from
# 10^12, so the fuzz takes its own range and never mutates the value.
_instances = itertools.count(2**62)


def _ppermute_call(rng) -> Call:
    """This device (ordinal 0) receiving its own block or zeros, alone or
    beside devices that it exchanges nothing with."""
    c = copy_call(rng, min_dim=1)  # non-empty: the call reaches the meeting
    c.results[0] = S(c.operands[0].shape, c.results[0].dtype)
    n = int(rng.integers(1, 4))
    me = int(rng.integers(n))
    sources = np.full(n, -1, np.int64)
    sources[me] = pick(rng, (me, -1))
    return with_(c, instance=np.int64(next(_instances)),
                 devices=np.insert(rng.choice(np.arange(1, 64), n - 1, replace=False), me, 0),
                 sources=sources, push=bool(rng.integers(2)), process=np.int64(0),
                 processes=np.zeros(n, np.int64), links="", site="fuzz",
                 timeout_ms=np.int64(1000))


def _ppermute_plan(call: Call) -> tuple[int, np.ndarray] | None:
    """(this device's position, sources) when the handler would accept the
    devices, sources and processes attributes (every device of this process,
    process 0), else None."""
    devices, sources, processes = (call.attrs.get(k) for k in ("devices", "sources", "processes"))
    if not all(isinstance(v, np.ndarray) and v.dtype == np.int64
               for v in (devices, sources, processes)):
        return None
    devices, sources, processes = devices.reshape(-1), sources.reshape(-1), processes.reshape(-1)
    n = len(devices)
    taken = sources[sources >= 0]
    ok = (n > 0 and len(sources) == n and len(set(devices.tolist())) == n and 0 in devices
          and ((sources >= -1) & (sources < n)).all() and len(set(taken.tolist())) == len(taken)
          and len(processes) == n and not processes.any() and call.attrs.get("process") == 0)
    return (devices.tolist().index(0), sources) if ok else None


def _ppermute_waits_for_peer(call: Call) -> bool:
    """Whether device 0 would wait for a peer that never runs (timeout_ms, then an
    error): its source or its receiver is another device."""
    plan = _ppermute_plan(call)
    if plan is None:
        return False
    me, sources = plan
    return sources[me] not in (-1, me) or any(s == me for i, s in enumerate(sources) if i != me)


def _ppermute_reference(call: Call) -> list[np.ndarray]:
    me, sources = _ppermute_plan(call)
    y = copy_reference(call)[0]
    return [y if sources[me] == me else np.zeros_like(y)]


def _reused_instance(c: Call) -> Call:
    """The instance of the last baseline, which ran, now among one device
    more: the handler's meeting state refuses the other size."""
    return with_(c, devices=np.append(c.attrs["devices"], 64),
                 sources=np.append(c.attrs["sources"], -1),
                 processes=np.append(c.attrs["processes"], 0))


_PPERMUTE_NASTY = (
    (_reused_instance, r"instance"),
    (lambda c: with_(c, instance=np.int64(-2**63), devices=i64(0), sources=i64(0),
                     processes=i64(0)), r"instance"),
    (lambda c: with_(c, devices=i64(2**63 - 1, 0), sources=i64(-2**63, 1),
                     processes=i64(0, 0)), r"sources"),
    (lambda c: with_(c, devices=i64(), sources=i64(), processes=i64()), r"devices|sources"),
    (lambda c: with_(c, processes=np.ones_like(c.attrs["processes"])), r"among the devices"),
    (lambda c: with_(c, devices=np.append(c.attrs["devices"], 65),
                     sources=np.append(c.attrs["sources"], -1),
                     processes=np.append(c.attrs["processes"], 7), links="a"),
     r"process 7 has no link name \(1 given\)"),
)


def _all_to_all_call(rng) -> Call:
    """This device (ordinal 0) in a group of its own (one part: the chunk
    that stays), alone or beside devices in groups of their own."""
    c = copy_call(rng, min_dim=1)
    c.results[0] = S(c.operands[0].shape, c.results[0].dtype)
    n = int(rng.integers(1, 4))
    return with_(c, instance=np.int64(next(_instances)),
                 devices=np.insert(rng.choice(np.arange(1, 64), n - 1, replace=False),
                                   int(rng.integers(n)), 0),
                 sources=i64(), positions=np.zeros(n, np.int64), parts=np.int64(1),
                 method="auto", process=np.int64(0), processes=np.zeros(n, np.int64), links="",
                 site="fuzz", timeout_ms=np.int64(1000))


def _all_to_all_waits_for_peer(call: Call) -> bool:
    """Whether a call of several parts could reach a step, whose peers never
    run here."""
    parts = call.attrs.get("parts")
    return not isinstance(parts, np.integer) or int(parts) > 1


_ALL_TO_ALL_NASTY = (
    (lambda c: with_(c, parts=np.int64(0)), r"parts must be in \[1, \d+\]"),
    (lambda c: with_(c, parts=np.int64(len(c.attrs["devices"]) + 1)), r"parts must be in"),
    (lambda c: with_(c, positions=np.full(len(c.attrs["devices"]), 1, np.int64)),
     r"positions\[0\] = 1 is not a position in \[0, 1\)"),
    (lambda c: with_(c, positions=i64()), r"positions has 0 entries"),
    (lambda c: with_(c, sources=i64(0)), r"sources has 1 entries"),
)

def _alone(rng) -> dict:
    """The attributes of an exchange that copies rows (ragged_all_to_all's,
    moe_dispatch's) of this device (ordinal 0) in a group of its own (one
    part), alone or beside 1 or 2 devices in groups of their own; a CTA
    budget or none."""
    n = int(rng.integers(1, 4))
    return dict(instance=np.int64(next(_instances)),
                devices=np.insert(rng.choice(np.arange(1, 64), n - 1, replace=False),
                                  int(rng.integers(n)), 0),
                sources=i64(), positions=np.zeros(n, np.int64), parts=np.int64(1),
                method="auto", ctas=np.int64(pick(rng, (0, 1, 132))), process=np.int64(0),
                processes=np.zeros(n, np.int64), links="", site="fuzz",
                timeout_ms=np.int64(1000))


def _ragged_call(rng) -> Call:
    """This device (ordinal 0) in a group of its own (one part: its slices
    stay, at random places of its output), alone or beside devices in
    groups of their own; rows of any dtype and row shape, int32 or int64
    offsets and sizes; one call in four with an output of no rows (a result
    of rows of its own, as jax_tma's compositions call it)."""
    dtype = some_dtype(rng)
    row = tuple(int(v) for v in rng.integers(1, 4, int(rng.integers(0, 3))))
    g = ragged_geometry(rng, 1, int(rng.integers(1, 4)),
                        index_dtype=pick(rng, (np.int32, np.int64)))
    output = random_array(rng, (g["out_rows"],) + row, dtype)
    if rng.integers(4) == 0:
        output = output[:0]
    return Call([random_array(rng, (g["rows"],) + row, dtype), output,
                 *(g[k] for k in _RAGGED_INDICES)], [S((g["out_rows"],) + row, dtype)],
                _alone(rng))


_RAGGED_INDICES = ("input_offsets", "send_sizes", "output_offsets", "recv_sizes")


def _ragged_fuzz_reference(call: Call) -> list[np.ndarray]:
    return [ragged_reference(*call.operands, 1)]


def _ragged_own_rows(call: Call) -> bool:
    """An output of no rows for a result of rows of its own, whose rows that
    no slice writes are unspecified."""
    return call.operands[1].shape[0] == 0 and call.results[0].shape[0] != 0


def _ragged_written_rows(call: Call, got: list[np.ndarray]) -> None:
    """The rows that the slices write are theirs (the others: unspecified
    where the result has rows of its own, the output's otherwise)."""
    operand, output, *indices = call.operands
    out = np.zeros(call.results[0].shape, operand.dtype) if _ragged_own_rows(call) else output
    written = ragged_reference(np.ones(operand.shape[:1], bool), np.zeros(out.shape[:1], bool),
                               *indices, 1)
    assert_bits_equal(got[0][written], ragged_reference(operand, out, *indices, 1)[written])


def _ragged_set(c: Call, **values) -> Call:
    """`c` with entry 0 of index arrays set ({name: value}), all as int64."""
    ops = list(c.operands)
    for k, name in enumerate(_RAGGED_INDICES):
        ops[2 + k] = ops[2 + k].astype(np.int64)
        if name in values:
            ops[2 + k][0] = values[name]
    return with_(c, operands=ops)


def _one_row_slice(c: Call, **values) -> Call:
    """Slice 0 one row from row 0 to row 0 (`values` set after), of an
    operand of at least one row."""
    return _ragged_set(_ragged_set(_with_a_row(c), input_offsets=0, send_sizes=1,
                                   output_offsets=0, recv_sizes=1), **values)


def _with_a_row(c: Call) -> Call:
    """`c` with an operand of at least one row (a geometry whose slices are
    all empty may have none)."""
    operand = c.operands[0]
    if operand.shape[0]:
        return c
    return with_(c, operands=[np.zeros((1,) + operand.shape[1:], operand.dtype)] + c.operands[1:])


def _ragged_indices_as(c: Call, *dtypes) -> Call:
    return with_(c, operands=c.operands[:2] + [a.astype(d) for a, d in
                                               zip(c.operands[2:], dtypes)])


_ME = r"on device 0 of process 0 \(position 0\)"
_RAGGED_NASTY = (
    (lambda c: with_(c, ctas=np.int64(-1)),
     r"ctas must be >= 0 \(0: the device's choice\), got -1"),
    (lambda c: _ragged_set(c, input_offsets=-1), rf"input_offsets\[0\] = -1 {_ME} is negative"),
    (lambda c: _ragged_set(c, recv_sizes=-2), rf"recv_sizes\[0\] = -2 {_ME} is negative"),
    (lambda c: _one_row_slice(c, input_offsets=max(1, c.operands[0].shape[0])),
     r"input_offsets\[0\] \+ send_sizes\[0\] = \d+ \+ 1 on device 0 .* runs past the "
     r"operand's \d+ rows"),
    (lambda c: _one_row_slice(c, output_offsets=c.results[0].shape[0]),
     r"output_offsets\[0\] \+ send_sizes\[0\] = \d+ \+ 1 on device 0 .* runs past the "
     r"output's \d+ rows"),
    (lambda c: _one_row_slice(c, output_offsets=2**62, send_sizes=2**62, recv_sizes=2**62),
     r"input_offsets\[0\] \+ send_sizes\[0\] = 0 \+ 4611686018427387904 .* runs past"),
    (lambda c: _one_row_slice(c, recv_sizes=2),
     rf"recv_sizes\[0\] = 2 {_ME} differs from send_sizes\[0\] = 1 on device 0 of process 0 "
     r"\(position 0\), the slice it sends there"),
    (lambda c: _ragged_indices_as(c, np.int32, np.int64, np.int32, np.int32),
     r"send_sizes has element type s64 but input_offsets has s32; the four offset and size "
     r"arrays share one element type"),
    (lambda c: _ragged_indices_as(c, *(np.int16,) * 4),
     r"input_offsets has element type s16; the offsets and sizes take s32 or s64"),
    (lambda c: with_(c, operands=c.operands[:2] + [a[:0] for a in c.operands[2:]]),
     r"input_offsets has 0 entries"),
    (lambda c: with_(c, operands=c.operands[:5] + [np.append(c.operands[5], 0)
                                                    .astype(c.operands[5].dtype)]),
     r"recv_sizes has \d+ entries but input_offsets has \d+"),
    (lambda c: with_(c, results=[S((c.results[0].shape[0] + 1,) + c.results[0].shape[1:],
                                   c.results[0].dtype)]), r"the result has shape"),
    (lambda c: with_(c, operands=[c.operands[0], np.zeros((1,) + c.operands[0].shape[1:],
                                                          c.operands[0].dtype),
                                  *c.operands[2:]], results=[S((2,) + c.operands[0].shape[1:],
                                                               c.operands[0].dtype)]),
     r"the result has shape \(2,.*\) but output has \(1,.*\); they must be equal, or "
     r"output must have 0 rows of the result's row shape"),
    (lambda c: with_(c, operands=[np.zeros(c.operands[0].shape, jnp.int4),
                                  np.zeros(c.operands[1].shape, jnp.int4)] + c.operands[2:],
                     results=[S(c.operands[1].shape, jnp.int4)]),
     r"sub-byte element type s4 must be widened"),
    (lambda c: with_(c, operands=[c.operands[0][..., None], *c.operands[1:]]),
     r"operand's rows have shape"),
    (lambda c: with_(c, parts=np.int64(0)), r"parts must be in \[1, \d+\]"),
)


def _pull_call(rng) -> Call:
    """This device (ordinal 0) in a group of its own (one part: it pulls its
    own pairs), alone or beside devices in groups of their own: T operand
    rows, P pairs of which a random run is read (routes), each a token (T
    now and then: a pair that carries nothing) and k slots, -1 or rows of
    the result that no other slot names; rows of any dtype and row shape."""
    dtype = some_dtype(rng)
    row = tuple(int(v) for v in rng.integers(1, 4, int(rng.integers(0, 3))))
    tokens, k = (int(v) for v in rng.integers(1, 5, 2))
    pairs = int(rng.integers(1, 2 * tokens + 1))
    count = int(rng.integers(0, min(tokens, pairs) + 1))
    start = int(rng.integers(0, pairs - count + 1))
    out_rows = count * k + int(rng.integers(0, 3))
    sent = np.full((pairs, k + 1), -1, np.int32)
    sent[:, 0] = tokens
    sent[start:start + count, 0] = rng.integers(0, tokens + 1, count)
    slots = rng.permutation(out_rows)[:count * k].reshape(count, k)
    slots[rng.random(slots.shape) < 0.3] = -1
    sent[start:start + count, 1:] = slots
    routes = np.array([[start, count, 0, count, start]], np.int32)
    return Call([random_array(rng, (tokens,) + row, dtype), sent, routes],
                [S((out_rows,) + row, dtype), S((tokens, k), np.int32)], _alone(rng))


def _pull_written_rows(call: Call, got: list[np.ndarray]) -> None:
    """Each slot of a pair read holds its token's row, the slots result its
    pairs' slots (-1 for one that carries nothing, and past them); the
    result's other rows are unspecified."""
    operand, sent, routes = call.operands
    out, slots = got
    tokens = operand.shape[0]
    count, start = int(routes[0, 3]), int(routes[0, 4])
    want = np.full(slots.shape, -1, np.int32)
    for i in range(count):
        token, *pair = sent[start + i]
        if token == tokens:
            continue
        want[i] = pair
        for slot in pair:
            if slot >= 0:
                assert_bits_equal(out[slot], operand[token])
    np.testing.assert_array_equal(slots, want)


def _pull_set(c: Call, i: int, value, at=0) -> Call:
    """`c` with entry `at` (flat) of operand i set to `value`."""
    ops = [np.array(a) for a in c.operands]
    if ops[i].size:
        ops[i].reshape(-1)[at] = value
    return with_(c, operands=ops)


def _pairs_of(c: Call) -> int:
    return c.operands[1].shape[0]


_PULL_NASTY = (
    (lambda c: with_(c, ctas=np.int64(-2**63)), r"ctas must be >= 0 .*, got -9223372036854775808"),
    (lambda c: _pull_set(c, 2, -1, at=3), rf"routes\[0, 3\] = -1 {_ME} is outside \[0, \d+\]"),
    (lambda c: _pull_set(c, 2, c.operands[0].shape[0] + 1, at=3),
     rf"routes\[0, 3\] = \d+ {_ME} is outside \[0, \d+\]"),
    (lambda c: _pull_set(c, 2, -1, at=1), rf"routes\[0, 1\] = -1 {_ME} is outside \[0, \d+\]"),
    (lambda c: _pull_set(c, 2, _pairs_of(c) + 1, at=0),
     rf"routes\[0, 0\] = \d+ {_ME} is outside \[0, \d+\]"),
    (lambda c: _pull_set(c, 2, _pairs_of(c) + 1, at=4),
     rf"routes\[0, 4\] = \d+ {_ME} is outside \[0, \d+\]"),
    (lambda c: _pull_set(c, 1, c.operands[0].shape[0] + 1),
     rf"sent\[0, 0\] = \d+ {_ME} is outside \[0, \d+\]"),
    (lambda c: _pull_set(c, 1, -3), rf"sent\[0, 0\] = -3 {_ME} is outside \[0, \d+\]"),
    (lambda c: _pull_set(c, 1, -2, at=1), rf"sent\[0, 1\] = -2 {_ME} is neither -1 nor a row of "
     r"the result's \d+"),
    (lambda c: _pull_set(c, 1, c.results[0].shape[0], at=1),
     r"sent\[0, 1\] = \d+ .* is neither -1"),
    (lambda c: with_(c, operands=c.operands[:1] + [c.operands[1].astype(np.int64)]
                     + c.operands[2:]), r"sent has element type s64; it takes s32"),
    (lambda c: with_(c, operands=c.operands[:2] + [c.operands[2].reshape(-1)]),
     r"routes must have rank 2, got shape \(\d+,\)"),
    (lambda c: with_(c, operands=c.operands[:2] + [np.zeros((2, 5), np.int32)]),
     r"routes \(2, 5\) and the slots result \(\d+, \d+\); they must be"),
    (lambda c: with_(c, results=[c.results[0], S((c.operands[0].shape[0] + 1,
                                                  c.results[1].shape[1]), np.int32)]),
     r"the slots result \(\d+, \d+\); they must be"),
    (lambda c: with_(c, results=[S(c.results[0].shape + (1,), c.results[0].dtype),
                                 c.results[1]]),
     r"operand and result must have rows \(dim 0\) of one shape"),
    (lambda c: with_(c, operands=[np.zeros(c.operands[0].shape, jnp.int4)] + c.operands[1:],
                     results=[S(c.results[0].shape, jnp.int4), c.results[1]]),
     r"sub-byte element type s4 must be widened"),
    (lambda c: with_(c, parts=np.int64(0)), r"parts must be in \[1, \d+\]"),
)


_SUMMED = (np.float16, jnp.bfloat16, np.float32, np.float64)


def combine_sums(y, weights, slots) -> np.ndarray:
    """jax_tma_moe_combine's pair rows: each row's Σ_j y[slot] · weight in
    float32 (float64 for float64 y), ascending j, each product rounded,
    +0.0 where no slot is set, rounded to y's dtype; a NaN as the positive
    quiet NaN."""
    y = np.asarray(y)
    acc = np.float64 if y.dtype == np.float64 else np.float32
    out = np.zeros((slots.shape[0],) + y.shape[1:], acc)
    with np.errstate(all="ignore"):
        for r in range(slots.shape[0]):
            terms = [y[s].astype(acc) * acc(weights[r, j]) for j, s in enumerate(slots[r])
                     if s >= 0]
            for i, term in enumerate(terms):
                out[r] = out[r] + term if i else term
        rows = out.astype(y.dtype)
    rows[np.isnan(out)] = np.abs(np.array(np.nan, y.dtype))
    return rows


def _combine_call(rng) -> Call:
    """This device (ordinal 0) in a group of its own (one part: its pair
    rows go to its own result), alone or beside devices in groups of their
    own: P pair rows of k choices, slots -1 or rows of y, weights in the
    sums' type; y of a summed dtype and any row shape; int32 or int64
    offsets and sizes."""
    dtype = np.dtype(pick(rng, _SUMMED))
    row = tuple(int(v) for v in rng.integers(1, 4, int(rng.integers(0, 3))))
    g = ragged_geometry(rng, 1, int(rng.integers(1, 4)),
                        index_dtype=pick(rng, (np.int32, np.int64)))
    y_rows, k = (int(v) for v in rng.integers(1, 5, 2))
    slots = rng.integers(-1, y_rows, (g["rows"], k)).astype(np.int32)
    acc = np.float64 if dtype == np.float64 else np.float32
    return Call([random_array(rng, (y_rows,) + row, dtype),
                 rng.standard_normal((g["rows"], k)).astype(acc), slots,
                 *(g[k] for k in _RAGGED_INDICES)], [S((g["out_rows"],) + row, dtype)],
                _alone(rng))


def _combine_written_rows(call: Call, got: list[np.ndarray]) -> None:
    """The rows that the slices write are the pairs' sums (the others are
    unspecified); NaNs of any bits match."""
    y, weights, slots, *indices = call.operands
    sums = combine_sums(y, weights, slots)
    out = np.zeros(call.results[0].shape, y.dtype)
    written = ragged_reference(np.ones(sums.shape[:1], bool), np.zeros(out.shape[:1], bool),
                               *indices, 1)
    want = ragged_reference(sums, out, *indices, 1)[written]
    have = got[0][written]
    nan = np.isnan(want.astype(np.float64))
    assert (np.isnan(have.astype(np.float64)) == nan).all()
    assert_bits_equal(np.where(nan, 0, have).astype(y.dtype), np.where(nan, 0, want).astype(y.dtype))


def _combine_set(c: Call, i: int, value, at=0) -> Call:
    """`c` with entry `at` (flat) of operand i set to `value`, of at least
    one pair row."""
    ops = [np.array(a) for a in c.operands]
    if ops[i].size:
        ops[i].reshape(-1)[at] = value
    return with_(c, operands=ops)


_COMBINE_NASTY = (
    (lambda c: with_(c, ctas=np.int64(-1)),
     r"ctas must be >= 0 \(0: the device's choice\), got -1"),
    (lambda c: _combine_set(c, 2, -2), rf"slots\[0, 0\] = -2 {_ME} is neither -1 nor a row of "
     r"y's \d+"),
    (lambda c: _combine_set(c, 2, c.operands[0].shape[0]),
     r"slots\[0, 0\] = \d+ .* is neither -1 nor a row of y's"),
    (lambda c: _combine_set(c, 3, -1), rf"input_offsets\[0\] = -1 {_ME} is negative"),
    (lambda c: with_(c, operands=[np.zeros(c.operands[0].shape, np.int32)] + c.operands[1:],
                     results=[S(c.results[0].shape, np.int32)]),
     r"y has element type s32; the combine's kernel sums f16, bf16, f32 or f64 rows"),
    (lambda c: with_(c, operands=c.operands[:1] + [c.operands[1].astype(np.int8)]
                     + c.operands[2:]), r"weights has element type s8; it takes f(32|64)"),
    (lambda c: with_(c, operands=c.operands[:2] + [c.operands[2].astype(np.int64)]
                     + c.operands[3:]), r"slots has element type s64; it takes s32"),
    (lambda c: with_(c, operands=c.operands[:2] + [c.operands[2][:, :0]] + c.operands[3:]),
     r"slots has shape \(\d+, 0\) but weights has"),
    (lambda c: with_(c, results=[S(c.results[0].shape + (1,), c.results[0].dtype)]),
     r"y and the result must have rows \(dim 0\) of one shape"),
    (lambda c: with_(c, parts=np.int64(0)), r"parts must be in \[1, \d+\]"),
)


# ---- the MoE routing plan (ffi/ppermute/moe_dispatch_plan.h) -----------------------------------

def plan_counts_reference(ids: np.ndarray, experts: int, parts: int) -> np.ndarray:
    """jax_tma_moe_dispatch_counts: each position's row, the counts of each
    expert's valid choices and of the tokens with a choice on each device,
    then the position."""
    ids = np.asarray(ids)
    valid = (ids >= 0) & (ids < experts)
    expert = np.where(valid, ids, experts)
    per_expert = (expert[..., None] == np.arange(experts)).sum((-3, -2))
    device = np.where(valid, expert // (experts // parts), parts)
    per_device = (device[..., None] == np.arange(parts)).any(-2).sum(-2)
    row = np.concatenate([per_expert, per_device], -1)[..., None, :]
    lead = ids.shape[:-2]
    return np.concatenate([np.broadcast_to(row, lead + (parts, experts + parts)),
                           np.broadcast_to(np.arange(parts)[:, None], lead + (parts, 1))],
                          -1).astype(np.int32)


def _plan_member(ids, table, experts: int, parts: int, capacity: int) -> list[np.ndarray]:
    """One member's jax_tma_moe_dispatch_plan results, the header's rules in loops,
    the table's sums in int32 (wrapping)."""
    tokens, k = ids.shape
    local, pairs = experts // parts, tokens * min(k, parts)
    me = int(table[0, -1])
    assert 0 <= me < parts
    counts = table[:, :experts].astype(np.int32)
    with np.errstate(over="ignore"):
        place = counts[:me].sum(0, dtype=np.int32)
        kept = counts.sum(0, dtype=np.int32)
        if capacity >= 0:
            kept = np.minimum(kept, np.int32(capacity))
        start = np.zeros(experts, np.int32)
        for e in range(experts):
            if e % local:
                start[e] = start[e - 1] + kept[e - 1]
        below = table[:, experts:experts + me].sum(1, dtype=np.int32)
    has = np.zeros((tokens, parts), bool)
    for t in range(tokens):
        for e in ids[t]:
            if 0 <= e < experts:
                has[t, e // local] = True
    per_device = has.sum(0)
    first = np.concatenate([[0], np.cumsum(per_device)[:-1]])
    routes = np.stack([first, per_device, np.full(parts, me * tokens),
                       table[:, experts + me], below], 1).astype(np.int32)
    pair_token = np.full(pairs, tokens, np.int32)
    sent = np.full((pairs, k + 1), -1, np.int32)
    sent[:, 0] = tokens
    choice_row = np.full((tokens, k), -1, np.int32)
    dropped = np.zeros((tokens, k), bool)
    rank = np.zeros(experts, np.int32)
    row = {}
    for t in range(tokens):
        for d in np.flatnonzero(has[t]):
            row[t, d] = first[d]
            first[d] += 1
            pair_token[row[t, d]] = sent[row[t, d], 0] = t
        for j, e in enumerate(ids[t]):
            if not 0 <= e < experts:
                continue
            with np.errstate(over="ignore"):
                at = place[e] + rank[e]
                rank[e] += 1
                keep = capacity < 0 or at < capacity
                choice_row[t, j] = r = row[t, e // local]
                dropped[t, j] = not keep
                sent[r, 1 + j] = start[e] + at if keep else -1
    return [kept[me * local:(me + 1) * local], dropped, routes, pair_token, choice_row, sent]


def plan_reference(ids, table, experts: int, parts: int, capacity: int) -> list[np.ndarray]:
    """jax_tma_moe_dispatch_plan's results, member by member of the leading dims."""
    ids, table = np.asarray(ids), np.asarray(table)
    batch = int(np.prod(ids.shape[:-2]))
    members = [_plan_member(i, t, experts, parts, capacity) for i, t in
               zip(ids.reshape((batch,) + ids.shape[-2:]),
                   table.reshape((batch,) + table.shape[-2:]))]
    shapes = _plan_shapes(ids.shape, experts, parts)
    return [np.array([m[r] for m in members]).reshape(s.shape).astype(s.dtype)
            for r, s in enumerate(shapes)]


def _plan_shapes(ids_shape, experts: int, parts: int) -> list[S]:
    """jax_tma_moe_dispatch_plan's results for ids of `ids_shape`."""
    *lead, tokens, k = ids_shape
    lead, pairs = tuple(lead), tokens * min(k, parts)
    return [S(lead + (experts // parts,), np.int32), S(tuple(ids_shape), np.bool_),
            S(lead + (parts, 5), np.int32), S(lead + (pairs,), np.int32),
            S(tuple(ids_shape), np.int32), S(lead + (pairs, k + 1), np.int32)]


def _plan_ids_and_attrs(rng):
    """ids of a few tokens (some out of range, masked) and their plan's
    attributes: 1 to 4 positions, 1 to 4 experts each."""
    parts = int(rng.integers(1, 5))
    experts = parts * int(rng.integers(1, 5))
    lead = pick(rng, ((), (2,), (1, 3)))
    tokens, k = int(rng.integers(0, 30)), int(rng.integers(1, 6))
    ids = rng.integers(-2, experts + 2, lead + (tokens, k)).astype(np.int32)
    return ids, dict(experts=np.int64(experts), parts=np.int64(parts))


def _plan_counts_call(rng) -> Call:
    ids, attrs = _plan_ids_and_attrs(rng)
    n, e = int(attrs["parts"]), int(attrs["experts"])
    return Call([ids], [S(ids.shape[:-2] + (n, e + n + 1), np.int32)], attrs)


def _plan_call(rng) -> Call:
    """A table of random counts up to T * k from each position, naming a
    random position; a random capacity or none (-1)."""
    ids, attrs = _plan_ids_and_attrs(rng)
    n, e = int(attrs["parts"]), int(attrs["experts"])
    tokens, k = ids.shape[-2:]
    table = rng.integers(0, tokens * k + 1, ids.shape[:-2] + (n, e + n + 1)).astype(np.int32)
    table[..., -1] = rng.integers(0, n, ids.shape[:-2] + (1,))
    return Call([ids, table], _plan_shapes(ids.shape, e, n),
                {**attrs, "capacity": np.int64(pick(rng, (-1, 0, 1, 3, 50)))})


def _plan_with(c: Call, i: int, operand) -> Call:
    return with_(c, operands=c.operands[:i] + [operand] + c.operands[i + 1:])


def _plan_last_entry(c: Call, value) -> Call:
    table = np.array(c.operands[1])
    table[..., -1] = value
    return _plan_with(c, 1, table)


_PLAN_ATTR_NASTY = (
    (lambda c: with_(c, parts=np.int64(0)),
     r"the routing plan takes 1 to 64 positions and a multiple of them up to 256 experts, got 0 "
     r"positions"),
    (lambda c: with_(c, parts=np.int64(65), experts=np.int64(65)), r"got 65 positions"),
    (lambda c: with_(c, experts=np.int64(257)), r"got \d+ positions and 257 experts"),
    (lambda c: with_(c, experts=np.int64(5), parts=np.int64(2)),
     r"a multiple of them"),
    (lambda c: _plan_with(c, 0, c.operands[0].astype(np.int64)),
     r"the routing plan's ids have element type s64 and rank \d+; it takes s32 ids of rank 2"),
    (lambda c: _plan_with(c, 0, np.zeros(5, np.int32)),
     r"ids have element type s32 and rank 1; it takes s32 ids of rank 2 or more"),
    (lambda c: _plan_with(c, 0, c.operands[0][..., :0]),
     r"ids have \d+ tokens of 0 choices \(their last two dims\); it takes up to 4096 "
     r"choices a member, 1 or more a token"),
    (lambda c: _plan_with(c, 0, np.zeros(c.operands[0].shape[:-2] + (2049, 2), np.int32)),
     r"ids have 2049 tokens of 2 choices"),
)

_PLAN_COUNTS_NASTY = _PLAN_ATTR_NASTY + (
    (lambda c: with_(c, results=[S(c.results[0].shape[:-1] + (1,), np.int32)]),
     r"the routing plan's send has shape \(.*\); expected \(.*\) \(a row of counts for each "
     r"position\)"),
    (lambda c: with_(c, results=[S(c.results[0].shape, np.int64)]),
     r"send has element type s64; it takes s32"),
)

_PLAN_NASTY = _PLAN_ATTR_NASTY + (
    (lambda c: _plan_last_entry(c, c.attrs["parts"]),
     r"the routing plan's table names position \d+ of \d+ \(not a table of the counts' "
     r"exchange\)"),
    (lambda c: _plan_last_entry(c, -1), r"table names position -1 of"),
    (lambda c: with_(c, capacity=np.int64(-2)),
     r"capacity must be -1 \(none\) or in \[0, 2\^31 - 1\], got -2"),
    (lambda c: with_(c, capacity=np.int64(2**31)), r"capacity .* got 2147483648"),
    (lambda c: _plan_with(c, 1, c.operands[1].astype(np.int64)),
     r"table has element type s64; it takes s32"),
    (lambda c: _plan_with(c, 1, c.operands[1][..., :-1]),
     r"table has shape \(.*\); expected \(.*\) \(a row of counts from each position\)"),
    (lambda c: with_(c, results=c.results[:1] + [S(c.results[1].shape, np.int32)]
                     + c.results[2:]), r"dropped has element type s32; it takes pred"),
    (lambda c: with_(c, results=c.results[:5] + [S(c.results[5].shape[:-1] + (1,), np.int32)]),
     r"sent has shape \(.*\); expected \(.*\) \(a pair's token and its k slots\)"),
    (lambda c: with_(c, results=c.results[:3] + [S((7,) + c.results[3].shape, np.int32)]
                     + c.results[4:]), r"pair_token has shape"),
)

_PLAN_ATTR_RULES = {"experts": r"experts|shape", "parts": r"positions|shape"}


SPECS: dict[str, Spec] = {
    "jax_tma_moe_dispatch_counts": Spec(
        ("jax_tma.moe_dispatch",), _plan_counts_call,
        lambda c: [plan_counts_reference(c.operands[0], int(c.attrs["experts"]),
                                          int(c.attrs["parts"]))],
        _PLAN_COUNTS_NASTY, attr_rules=_PLAN_ATTR_RULES),
    "jax_tma_moe_dispatch_plan": Spec(
        ("jax_tma.moe_dispatch",), _plan_call,
        lambda c: plan_reference(*c.operands, int(c.attrs["experts"]), int(c.attrs["parts"]),
                                  int(c.attrs["capacity"])),
        _PLAN_NASTY, attr_rules={**_PLAN_ATTR_RULES, "capacity": r"capacity"},
        # A mutated table (random_array draws new values) may name no position.
        rules={k: r"names position" for k in ("shape", "dtype", "operands")},
        # The GPU reads the table on the device, where such a table traps.
        device_checked=r"jax_tma\.moe_dispatch: the routing plan's table names position"),
    "jax_tma_moe_combine": Spec(
        ("jax_tma.moe_combine",), _combine_call, lambda call: [], _COMBINE_NASTY,
        # A mutated operand may give values that break a rule (random_array
        # draws new values), which the handler names.
        rules={k: r"is negative|runs past|differs from|is neither -1|element type|must have rank"
               r"|one shape|but weights has|entries" for k in ("shape", "dtype")},
        attr_rules={"parts": r"parts|slices|sources|positions", "positions": r"positions?\b",
                    "sources": r"sources", "devices": r"devices|process|positions",
                    "process": r"process|among the devices", "processes": r"process|devices",
                    "ctas": r"ctas"},
        keep=("instance",), waits_for_peer=_all_to_all_waits_for_peer,
        exact=lambda platform, call: False, bounds=_combine_written_rows,
        # The slots, offsets and sizes stay on the GPU, whose meet kernel checks them.
        device_checked=r"jax_tma\.moe_combine: .*(?:is negative|runs past|differs from"
                       r"|is neither -1)"),
    "jax_tma_all_to_all": Spec(
        ("jax_tma.all_to_all",), _all_to_all_call, copy_reference, _ALL_TO_ALL_NASTY,
        attr_rules={"parts": r"parts|chunks|sources|positions", "positions": r"positions?\b",
                    "sources": r"sources", "devices": r"devices|process|positions",
                    "process": r"process|among the devices", "processes": r"process|devices"},
        keep=("instance",), waits_for_peer=_all_to_all_waits_for_peer),
    "jax_tma_ragged_all_to_all": Spec(
        ("jax_tma.ragged_all_to_all",), _ragged_call, _ragged_fuzz_reference, _RAGGED_NASTY,
        # A mutated index array or row count may give values that break a
        # rule (random_array draws new values), which the handler names.
        rules={k: r"negative|runs past|differs from" for k in ("shape", "dtype")},
        attr_rules={"parts": r"parts|slices|sources|positions", "positions": r"positions?\b",
                    "sources": r"sources", "devices": r"devices|process|positions",
                    "process": r"process|among the devices", "processes": r"process|devices",
                    "ctas": r"ctas"},
        keep=("instance",), waits_for_peer=_all_to_all_waits_for_peer,
        exact=lambda platform, call: not _ragged_own_rows(call), bounds=_ragged_written_rows,
        # The offsets and sizes stay on the GPU, whose meet kernel checks them.
        device_checked=r"jax_tma\.ragged_all_to_all: .*(?:is negative|runs past|differs from)"),
    "jax_tma_moe_dispatch": Spec(
        ("jax_tma.moe_dispatch",), _pull_call, lambda call: [], _PULL_NASTY,
        # A mutated index array or row count may give values that break a
        # rule (random_array draws new values), which the handler names.
        rules={k: r"is outside|is neither -1|it takes s32|must have rank|they must be|one shape"
               for k in ("shape", "dtype")},
        attr_rules={"parts": r"parts|positions|sources", "positions": r"positions?\b",
                    "sources": r"sources", "devices": r"devices|process|positions",
                    "process": r"process|among the devices", "processes": r"process|devices",
                    "ctas": r"ctas"},
        keep=("instance",), waits_for_peer=_all_to_all_waits_for_peer,
        exact=lambda platform, call: False, bounds=_pull_written_rows,
        # The indices stay on the GPU, whose meet kernel checks them.
        device_checked=r"jax_tma\.moe_dispatch: .*(?:is outside|is neither -1)"),
    "jax_tma_ppermute": Spec(
        ("jax_tma.ppermute",), _ppermute_call, _ppermute_reference, _PPERMUTE_NASTY,
        attr_rules={"devices": r"devices?\b|sources", "sources": r"sources?\b|position|devices",
                    "process": r"among the devices", "processes": r"process"},
        keep=("instance",), waits_for_peer=_ppermute_waits_for_peer),
}


# ---- the paths --------------------------------------------------------------------

# Two host devices swap their blocks: a handler call on each. A process
# without the CPU platform (JAX_PLATFORMS=cuda, tests/ppermute_process.py on
# GPUs) has no CPU calls.
try:
    _PAIR = jax.sharding.Mesh(np.array(jax.devices("cpu")[:2]), ("i",))
except RuntimeError:
    _PAIR = None
def _ragged_pair(b):
    """Each device's first two rows to device 0 and last two to device 1,
    landing at row 2 * its position there."""
    sizes = jnp.array([2, 2], np.int32)
    at = jnp.full(2, 2 * lax.axis_index("i"), np.int32)
    return jax_tma.ragged_all_to_all(b, b, jnp.array([0, 2], np.int32), sizes, at, sizes,
                                     axis_name="i")


def _pull(b, sent, routes, rows: int, n: int):
    """jax_tma.moe_dispatch's pull over axis "i" of `n` devices."""
    return _pull_p.bind(b, jnp.asarray(sent, np.int32), jnp.asarray(routes, np.int32), rows=rows,
                        axis_name=("i",), size=n, site="paths", ctas=0)


def _pull_pair(b):
    """Each device sends its row 1 to device 0, into row 2 * its position
    there, and its row 0 to device 1, into row 2 * its position + 1."""
    me = lax.axis_index("i")
    sent = jnp.stack([jnp.stack([1, 2 * me]), jnp.stack([0, 2 * me + 1])]).astype(np.int32)
    routes = jnp.stack([jnp.stack([0, 1, 0, 1, me]), jnp.stack([1, 1, 0, 1, me])])
    return _pull(b, sent, routes, 4, 2)[0]


def _home_sums(y, weights, slots, indices, rows: int, n: int):
    """jax_tma.moe_combine's pair rows summed home over axis "i" of `n`
    devices (`indices`: the ragged exchange's four arrays)."""
    return _home_sums_p.bind(y, jnp.asarray(weights, np.float32), jnp.asarray(slots, np.int32),
                             *(jnp.asarray(a, np.int32) for a in indices), rows=rows,
                             axis_name=("i",), size=n, site="paths", ctas=0)


def _home_sums_pair(b):
    """Each device's pair rows 0, 1 (rows 0 + 1/2 row 1, and row 1 / 4) to
    device 0 and rows 2, 3 (row 2 alone; rows 2, 3 and 3) to device 1,
    landing at row 2 * its position there."""
    at = jnp.full(2, 2 * lax.axis_index("i"), np.int32)
    return _home_sums(b, [[1, 0.5], [0.25, 0], [1, 1], [1, 2]],
                      [[0, 1], [1, -1], [2, -1], [2, 3]], ([0, 2], [2, 2], at, [2, 2]), 4, 2)


def _plan_ids(x):
    """(rows, 6) ids drawn from x, -1 to 11: for 8 experts, some masked, some
    out of range."""
    return (jnp.abs(x[:, :6]) * 4).astype(np.int32) - 1


def _plan_counts_alone(x):
    """The counts of 8 experts over 2 positions."""
    return _plan_counts_p.bind(_plan_ids(x), experts=8, parts=2)


def _plan_alone(x):
    """The plan of 8 experts over 2 positions with a capacity of 3, from a
    table drawn from x (position 0), every result flat in one int32 array."""
    table = jnp.concatenate([(jnp.abs(x[:2, 6:16]) * 5).astype(np.int32),
                             jnp.zeros((2, 1), np.int32)], 1)
    plan = _plan_p.bind(_plan_ids(x), table, experts=8, parts=2, capacity=3)
    return jnp.concatenate([a.reshape(-1).astype(np.int32) for a in plan])


CPU_CALLS = {} if _PAIR is None else {
    "moe_dispatch_plan": CpuCall(_plan_alone), "moe_dispatch_counts": CpuCall(_plan_counts_alone),
                                      "moe_combine": CpuCall(
    jax.shard_map(_home_sums_pair, mesh=_PAIR, in_specs=P("i"), out_specs=P("i")),
    where=NamedSharding(_PAIR, P("i")), handler_calls=2), "moe_dispatch": CpuCall(
    jax.shard_map(_pull_pair, mesh=_PAIR, in_specs=P("i"), out_specs=P("i")),
    where=NamedSharding(_PAIR, P("i")), handler_calls=2), "ragged_all_to_all": CpuCall(
    jax.shard_map(_ragged_pair, mesh=_PAIR, in_specs=P("i"), out_specs=P("i")),
    where=NamedSharding(_PAIR, P("i")), handler_calls=2), "all_to_all": CpuCall(
    jax.shard_map(lambda b: jax_tma.all_to_all(b, "i", 0, 0, tiled=True), mesh=_PAIR,
                  in_specs=P("i"), out_specs=P("i")),
    where=NamedSharding(_PAIR, P("i")), handler_calls=2), "ppermute": CpuCall(
    jax.shard_map(lambda b: jax_tma.ppermute(b, "i", [(0, 1), (1, 0)]), mesh=_PAIR,
                  in_specs=P("i"), out_specs=P("i")),
    where=NamedSharding(_PAIR, P("i")), handler_calls=2)}


def _self_permute(method):
    """A block to itself over a one-device mesh of `device` (on a GPU: a
    peer copy within it)."""
    def call(x, device):
        one = jax.sharding.Mesh(np.array([device]), ("i",))
        return jax.shard_map(lambda b: jax_tma.ppermute(b, "i", [(0, 0)], method=method),
                             mesh=one, in_specs=P("i"), out_specs=P("i"))(x)
    return call


def _self_exchange(copies: int):
    """An all_to_all over a one-device mesh of `device` of `copies` of x: the
    chunk that stays. Up to the inbox's limit (exchange_inbox_max_bytes), it
    takes the inbox's kernel."""
    def call(x, device):
        one = jax.sharding.Mesh(np.array([device]), ("i",))
        return jax.shard_map(lambda b: jax_tma.all_to_all(b, "i", 0, 0, tiled=True),
                             mesh=one, in_specs=P("i"), out_specs=P("i"))(
                                 jnp.tile(x, (copies, 1)))
    return call


def _self_ragged(copies: int):
    """A ragged_all_to_all over a one-device mesh of `device` of `copies` of
    x: two slices of its rows into its reverse, one of them empty. Up to the
    inbox's limit of operand, it takes the inbox's kernel."""
    def call(x, device):
        one = jax.sharding.Mesh(np.array([device]), ("i",))

        def local(b):
            sizes = jnp.array([40, 0], np.int32)
            return jax_tma.ragged_all_to_all(b, b[::-1], jnp.array([3, 64], np.int32), sizes,
                                             jnp.array([10, 0], np.int32), sizes, axis_name="i")
        return jax.shard_map(local, mesh=one, in_specs=P("i"), out_specs=P("i"))(
            jnp.tile(x, (copies, 1)))
    return call


def _self_pull(x, device):
    """x's rows, reversed, pulled over a one-device mesh of `device` into
    rows i and 64 + i of its result (64 pairs)."""
    one = jax.sharding.Mesh(np.array([device]), ("i",))
    i = np.arange(64)
    return jax.shard_map(
        lambda b: _pull(b, np.stack([63 - i, i, 64 + i], 1), [[0, 64, 0, 64, 0]], 128, 1)[0],
        mesh=one, in_specs=P("i"), out_specs=P("i"))(x)


def _self_home_sums(x, device):
    """x's rows summed in pairs (row i and, at half weight, row 63 - i) over
    a one-device mesh of `device`, into rows 0..63 of its result."""
    one = jax.sharding.Mesh(np.array([device]), ("i",))
    i = np.arange(64)
    return jax.shard_map(
        lambda b: _home_sums(b, np.tile([1, 0.5], (64, 1)), np.stack([i, 63 - i], 1),
                             ([0], [64], [0], [64]), 64, 1), mesh=one,
        in_specs=P("i"), out_specs=P("i"))(x)


# (64, 16) float32 x 1100: 4.5 MB, over the inbox's limit.
GPU_CALLS = {"moe_dispatch_plan.simt": lambda x, device: _plan_alone(x),
             "moe_dispatch_counts.simt": lambda x, device: _plan_counts_alone(x),
             "moe_combine.peer": _self_home_sums, "moe_dispatch.peer": _self_pull, "ppermute.tma": _self_permute("tma"), "ppermute.simt": _self_permute("simt"),
             "all_to_all.inbox": _self_exchange(1), "all_to_all.peer": _self_exchange(1100),
             "ragged_all_to_all.inbox": _self_ragged(1),
             "ragged_all_to_all.peer": _self_ragged(1100)}


# ---- the mode tests ---------------------------------------------------------------


def _lax_ppermute(b, perm):
    """lax.ppermute over MESH_AXES, sub-byte dtypes through SUB_BYTE_WIDE."""
    wide = SUB_BYTE_WIDE.get(b.dtype.name)
    if wide is None:
        return lax.ppermute(b, MESH_AXES, perm)
    return lax.ppermute(b.astype(wide), MESH_AXES, perm).astype(b.dtype)


def build_ppermute(rng, dtype, *, batch=16, even=True, method="auto") -> Case:
    """A (batch, ...) array split over all 8 devices of the 2 x 4 mesh,
    blocks moved along a random partial permutation of the 8 positions."""
    shape = (batch,) + tuple(dim_size(rng, even) for _ in range(extra_rank(rng, even)))
    k = int(rng.integers(1, 9))
    perm = tuple(zip(map(int, rng.permutation(8)[:k]), map(int, rng.permutation(8)[:k])))
    draw = lambda rr: (random_array(rr, shape, dtype),)  # noqa: E731
    local = lambda b: jax_tma.ppermute(b, MESH_AXES, perm, method=method)  # noqa: E731
    local_ref = lambda b: _lax_ppermute(b, perm)  # noqa: E731

    def expect(x):
        out = ppermute_reference(x, 8, perm)
        received = ppermute_reference(np.ones(x.shape, bool), 8, perm)
        out[~received] = take_fill(0, x.dtype)[0]  # lax's zeros (float8_e8m0fnu: 0xFF)
        return out
    return Case(
        op="ppermute", dtype=np.dtype(dtype), args=draw(rng),
        ours=on_mesh(local, BATCH), ref=on_mesh(local_ref, BATCH),
        expect=expect, draw=draw, diff=(0,), batch=(0,),
        split=(0,), in_specs=lambda dims: (dims_spec(len(shape), dims),), collective=True,
        symbolic=(("8*b",) + tuple(f"d{i}" for i in range(1, len(shape))),),
        params=dict(perm=perm, local=local, local_ref=local_ref),
    )


def build_all_to_all(rng, dtype, *, batch=16, even=True, method="auto") -> Case:
    """A (batch, ...) array split over all 8 devices of the 2 x 4 mesh, each
    block exchanged over both mesh axes along a random split and concat dim
    past the batch dim, tiled or not."""
    del even, method  # the split dim's size is set by the exchange
    rank = 1 + int(rng.integers(1, 3))
    split, concat = (int(d) for d in rng.integers(1, rank, size=2))
    tiled = bool(rng.integers(2))
    shape = [batch] + [int(rng.integers(1, 4)) for _ in range(rank - 1)]
    shape[split] = 8 * int(rng.integers(1, 3)) if tiled else 8
    draw = lambda rr: (random_array(rr, tuple(shape), dtype),)  # noqa: E731
    local = lambda b: jax_tma.all_to_all(b, MESH_AXES, split, concat, tiled=tiled)  # noqa: E731

    def local_ref(b):
        # Untiled as lax.all_to_all binds it (a dim inserted at concat_axis,
        # the split dim squeezed out), with lax's tiled exchange: jax's grad
        # of its untiled exchange fails where split_axis != concat_axis
        # ("Expected cotangent type", jax 0.12.0.1), ours does not.
        s, c = split, concat
        wide = SUB_BYTE_WIDE.get(b.dtype.name)
        x = b if wide is None else b.astype(wide)
        if not tiled and s != c:
            s, c = (s, c + 1) if s < c else (s + 1, c)
            x = jnp.expand_dims(x, c)
        out = lax.all_to_all(x, MESH_AXES, s, c, tiled=True)
        out = jnp.squeeze(out, s) if not tiled and s != c else out
        return out if wide is None else out.astype(b.dtype)

    return Case(
        op="all_to_all", dtype=np.dtype(dtype), args=draw(rng),
        ours=on_mesh(local, BATCH), ref=on_mesh(local_ref, BATCH),
        expect=lambda x: all_to_all_reference(x, 8, split, concat, tiled),
        draw=draw, diff=(0,), batch=(0,), split=(0,),
        in_specs=lambda dims: (dims_spec(rank, dims),), collective=True,
        symbolic=(("8*b",) + (None,) * (rank - 1),),
        params=dict(split_axis=split, concat_axis=concat, tiled=tiled, local=local,
                    local_ref=local_ref),
    )


def build_ragged_all_to_all(rng, dtype, *, batch=16, even=True, method="auto") -> Case:
    """Each of the 8 devices of the 2 x 4 mesh with an operand block and an
    output block of rows of `dtype` (row shape random), sending 1 or 2
    slices of random sizes (0 among them) to every position over both mesh
    axes, at random places of operand and output; int32 or int64 offsets
    and sizes. A fresh draw changes the rows' values, not the offsets and
    sizes, so that any mix of draws (vmap's) is a valid call."""
    del batch, even, method  # the exchange sets its own rows
    per = int(rng.integers(1, 3))
    g = ragged_geometry(rng, 8, per, index_dtype=pick(rng, (np.int32, np.int64)))
    row = tuple(int(v) for v in rng.integers(1, 4, int(rng.integers(0, 3))))
    indices = tuple(g[k] for k in _RAGGED_INDICES)

    def draw(rr):
        return (random_array(rr, (8 * g["rows"],) + row, dtype),
                random_array(rr, (8 * g["out_rows"],) + row, dtype), *indices)

    def local(*blocks):
        return jax_tma.ragged_all_to_all(*blocks, axis_name=MESH_AXES)

    def local_ref(operand, output, *index):
        # The lax.all_to_all formulation, sub-byte dtypes through
        # SUB_BYTE_WIDE (XLA's CPU collectives overrun their buffers)
        wide = SUB_BYTE_WIDE.get(operand.dtype.name)
        if wide is None:
            return composed(operand, output, *index, axis_name=MESH_AXES)
        return composed(operand.astype(wide), output.astype(wide), *index,
                        axis_name=MESH_AXES).astype(operand.dtype)

    args = draw(rng)
    return Case(
        op="ragged_all_to_all", dtype=np.dtype(dtype), args=args,
        ours=on_mesh(local, BATCH), ref=on_mesh(local_ref, BATCH),
        expect=lambda *a: ragged_reference(*a, 8), draw=draw, diff=(0, 1),
        batch=tuple(range(6)), split=(0,),
        in_specs=lambda dims: tuple(dims_spec(a.ndim, dims) for a in args), collective=True,
        symbolic=(("8*r",) + (None,) * len(row), ("8*m",) + (None,) * len(row),
                  *((None,),) * 4),
        params=dict(local=local, local_ref=local_ref, per=per),
    )


OPS = (Op("ppermute", build_ppermute, ALL_DTYPES, ("auto", "tma", "simt"), collective=True),
       Op("all_to_all", build_all_to_all, ALL_DTYPES, ("auto",), collective=True,
          symbolic_export="XLA segfaulted on some of these exports, and lax.all_to_all's "
                          "own fails them (jax 0.12.0.1)"),
       Op("ragged_all_to_all", build_ragged_all_to_all, ALL_DTYPES, ("auto",), collective=True,
          symbolic_export="XLA segfaults refining the shapes of such an export when it is "
                          "called (its lax.all_to_all formulation: symbolic dims take no "
                          "transport), jax 0.12.0.1"))
