"""Which kernel ran: the change in jax_tma's per-op, per-path handler counts
(jax_tma._ffi.path_counts) over a block of code, and the check that a call
took the path a test claims. Run each checked call through a fresh jit (or
its first execution): a CUDA graph that XLA replays does not call the handler
again."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

import jax

from jax_tma import _ffi


@dataclasses.dataclass(frozen=True)
class CpuCall:
    """One call of an op that its CPU handler counts (a descriptor's
    CPU_CALLS): `call` of a random float32 array of shape (8, 16) put
    `where` (None: the first CPU device), which makes `handler_calls`
    handler calls (one per device)."""

    call: Callable
    where: jax.sharding.Sharding | None = None
    handler_calls: int = 1


@contextlib.contextmanager
def paths_ran():
    """Yields a dict that, after the block, holds {"op.path": calls} for every
    path the handlers took inside it."""
    ran: dict[str, int] = {}
    before = _ffi.path_counts()
    yield ran
    after = _ffi.path_counts()
    ran.update({k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)})


def assert_path(ran: dict[str, int], path: str) -> None:
    """`path` ("window.tiled") ran, and no other path of its op."""
    op = path.split(".")[0] + "."
    others = {k: n for k, n in ran.items() if k.startswith(op) and k != path}
    assert ran.get(path, 0) >= 1 and not others, f"expected {path} alone, the handlers ran {ran}"


def run_on_path(path: str, fn, *args):
    """fn(*args), finished, after checking that it ran on `path` alone."""
    with paths_ran() as ran:
        out = jax.block_until_ready(fn(*args))
    assert_path(ran, path)
    return out
