"""The FFI fuzz's spec of jax_tma.broadcast (tests/test_ffi_fuzz.py runs it)."""

from __future__ import annotations

import numpy as np

from fuzz_specs.common import S, SHAPE_RULES, Call, Spec, pick, some_dtype, with_
from reference import broadcast_reference, random_array


def _broadcast_call(rng) -> Call:
    dtype = some_dtype(rng)
    x = random_array(rng, tuple(int(v) for v in rng.integers(0, 4, int(rng.integers(0, 4)))),
                     dtype)
    axis = int(rng.integers(x.ndim + 1))
    method, cluster = pick(rng, (("auto", 0), ("simt", 0), ("simt", 1)))
    y = x.shape[:axis] + (int(rng.integers(0, 4)),) + x.shape[axis:]
    return Call([x], [S(y, dtype)], dict(axis=np.int64(axis), method=method,
                                          cluster_size=np.int64(cluster)))


def _broadcast_reference(call: Call) -> list[np.ndarray]:
    axis = int(call.attrs["axis"])
    return [broadcast_reference(call.operands[0], call.results[0].shape[axis], axis)]


_BROADCAST_NASTY = (
    (lambda c: with_(c, axis=np.int64(-1)), r"axis"),
    (lambda c: with_(c, axis=np.int64(2**63 - 1)), r"axis"),
    (lambda c: with_(c, method="multicast", cluster_size=np.int64(32)), r"cluster_size"),
    # The forced hardware methods may refuse a geometry (on a GPU), naming it.
    (lambda c: with_(c, method="multicast", cluster_size=np.int64(16)), r"method|cluster"),
    (lambda c: with_(c, method="dsmem", cluster_size=np.int64(2)), r"method|cluster"),
    (lambda c: with_(c, method="store", cluster_size=np.int64(1)), r"method|cluster"),
    (lambda c: with_(c, results=[S((0,) + c.operands[0].shape, c.operands[0].dtype)],
                     axis=np.int64(0)), SHAPE_RULES),
)


SPECS: dict[str, Spec] = {
    "jax_tma_broadcast": Spec(
        ("jax_tma.broadcast",), _broadcast_call, _broadcast_reference, _BROADCAST_NASTY,
        attr_rules={"axis": r"output dim|rank", "method": r"cluster"}),
}
