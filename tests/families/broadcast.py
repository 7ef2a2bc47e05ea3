"""The broadcast family's descriptor (tests/families/__init__.py says what
each name is for): jax_tma.broadcast and its NumPy reference."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import jax_tma
from fuzz import S, SHAPE_RULES, Call, Spec, pick, some_dtype, with_
from ops_table import Case, Op, dim_size, dims_spec, extra_rank
from paths import CpuCall
from reference import ALL_DTYPES, random_array

MODULES = ("jax_tma._broadcast",)


# ---- references -------------------------------------------------------------------

def broadcast_reference(x: np.ndarray, n: int, axis: int) -> np.ndarray:
    """NumPy jax_tma.broadcast: n copies of x stacked along a new axis."""
    x = np.asarray(x)
    axis = axis % (x.ndim + 1)
    return np.ascontiguousarray(np.repeat(np.expand_dims(x, axis), n, axis=axis))


# ---- the FFI fuzz -----------------------------------------------------------------

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


# ---- the paths --------------------------------------------------------------------

CPU_CALLS = {"broadcast": CpuCall(lambda x: jax_tma.broadcast(x, 3, method="multicast"))}

GPU_CALLS = {
    "broadcast.store": lambda x, device: jax_tma.broadcast(x, 3, method="store"),
    "broadcast.multicast": lambda x, device: jax_tma.broadcast(x, 3, method="multicast"),
    "broadcast.dsmem": lambda x, device: jax_tma.broadcast(x, 3, method="dsmem"),
    "broadcast.simt": lambda x, device: jax_tma.broadcast(x, 3, method="simt"),
}


# ---- the mode tests ---------------------------------------------------------------

def build_broadcast(rng, dtype, *, batch=8, even=True, method="auto") -> Case:
    shape = (batch,) + tuple(dim_size(rng, even) for _ in range(extra_rank(rng, even)))
    n = int(rng.integers(1, 4))
    axis = int(rng.integers(1, len(shape) + 1))  # the batch dim stays dim 0
    if rng.integers(0, 2):
        axis -= len(shape) + 1  # the same axis, counted from the end
    draw = lambda rr: (random_array(rr, shape, dtype),)  # noqa: E731
    return Case(
        op="broadcast", dtype=np.dtype(dtype), args=draw(rng),
        ours=lambda x: jax_tma.broadcast(x, n, axis=axis, method=method),
        ref=lambda x: jnp.broadcast_to(jnp.expand_dims(x, axis),
                                       jnp.expand_dims(x, axis).shape[:axis % (x.ndim + 1)]
                                       + (n,) + x.shape[axis % (x.ndim + 1):]),
        expect=lambda x: broadcast_reference(x, n, axis), draw=draw, diff=(0,), batch=(0,),
        split=tuple(range(len(shape))), in_specs=lambda dims: (dims_spec(len(shape), dims),),
        symbolic=((("b",) + tuple(f"d{i}" for i in range(1, len(shape)))),),
        params=dict(n=n, axis=axis),
    )


OPS = (Op("broadcast", build_broadcast, ALL_DTYPES),)
