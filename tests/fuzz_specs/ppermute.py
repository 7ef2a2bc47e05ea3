"""The FFI fuzz's spec of jax_tma.ppermute (tests/test_ffi_fuzz.py runs it)."""

from __future__ import annotations

import itertools

import numpy as np

from fuzz_specs.common import S, Call, Spec, i64, pick, with_
from fuzz_specs.copy import copy_call, copy_reference


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


SPECS: dict[str, Spec] = {
    "jax_tma_ppermute": Spec(
        ("jax_tma.ppermute",), _ppermute_call, _ppermute_reference, _PPERMUTE_NASTY,
        attr_rules={"devices": r"devices?\b|sources", "sources": r"sources?\b|position|devices",
                    "process": r"among the devices", "processes": r"process"},
        keep=("instance",), waits_for_peer=_ppermute_waits_for_peer),
}
