"""The ppermute family's descriptor (tests/families/__init__.py says what
each name is for): jax_tma.ppermute, whose copies are the copy family's
kernels, jax_tma.all_to_all, which runs on ppermute's transport, and their
NumPy references."""

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
from fuzz import S, Call, Spec, i64, pick, with_
from ops_table import (BATCH, MESH_AXES, SUB_BYTE_WIDE, Case, Op, dim_size, dims_spec, extra_rank,
                       on_mesh, take_fill)
from paths import CpuCall
from reference import ALL_DTYPES, random_array

MODULES = ("jax_tma._ppermute", "jax_tma._all_to_all")


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

SPECS: dict[str, Spec] = {
    "jax_tma_all_to_all": Spec(
        ("jax_tma.all_to_all",), _all_to_all_call, copy_reference, _ALL_TO_ALL_NASTY,
        attr_rules={"parts": r"parts|chunks|sources|positions", "positions": r"positions?\b",
                    "sources": r"sources", "devices": r"devices|process|positions",
                    "process": r"process|among the devices", "processes": r"process|devices"},
        keep=("instance",), waits_for_peer=_all_to_all_waits_for_peer),
    "jax_tma_ppermute": Spec(
        ("jax_tma.ppermute",), _ppermute_call, _ppermute_reference, _PPERMUTE_NASTY,
        attr_rules={"devices": r"devices?\b|sources", "sources": r"sources?\b|position|devices",
                    "process": r"among the devices", "processes": r"process"},
        keep=("instance",), waits_for_peer=_ppermute_waits_for_peer),
}


# ---- the paths --------------------------------------------------------------------

# Two host devices swap their blocks: a handler call on each.
_PAIR = jax.sharding.Mesh(np.array(jax.devices("cpu")[:2]), ("i",))
CPU_CALLS = {"all_to_all": CpuCall(
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


def _self_exchange(x, device):
    """An all_to_all over a one-device mesh of `device`: the chunk that stays."""
    one = jax.sharding.Mesh(np.array([device]), ("i",))
    return jax.shard_map(lambda b: jax_tma.all_to_all(b, "i", 0, 0, tiled=True),
                         mesh=one, in_specs=P("i"), out_specs=P("i"))(x)


GPU_CALLS = {"ppermute.tma": _self_permute("tma"), "ppermute.simt": _self_permute("simt"),
             "all_to_all.peer": _self_exchange}


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


OPS = (Op("ppermute", build_ppermute, ALL_DTYPES, ("auto", "tma", "simt"), collective=True),
       Op("all_to_all", build_all_to_all, ALL_DTYPES, ("auto",), collective=True,
          symbolic_export="XLA segfaulted on some of these exports, and lax.all_to_all's "
                          "own fails them (jax 0.12.0.1)"))
