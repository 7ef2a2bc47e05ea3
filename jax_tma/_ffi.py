"""Loading the compiled extension and registering its FFI targets (once, at
import), and the per-path call counters it keeps. The lowering helpers are in
_lowering.py, the device queries in _devices.py."""

from __future__ import annotations

import functools
import importlib.machinery
import os

import jax


def _source_tree_error(package_dir: str) -> ImportError:
    return ImportError(
        f"jax_tma's compiled extension _jax_tma is not in {package_dir}: this looks like a "
        "source checkout without a build, imported instead of an installed jax_tma because "
        "the checkout is first on sys.path (python -m pytest and python run from the "
        "checkout root put it there). Install the package (pip install .) and run from "
        "outside the source tree, or keep the checkout off sys.path: "
        "`python -P -m pytest tests` or `pytest tests`.")


def _load_extension():
    package_dir = os.path.dirname(os.path.abspath(__file__))
    try:
        from jax_tma import _jax_tma
    except ImportError:
        # Without the file, Python's own message is a misleading "partially
        # initialized module ... circular import".
        names = os.listdir(package_dir)
        if not any(n.startswith("_jax_tma.") and n.endswith(tuple(
                importlib.machinery.EXTENSION_SUFFIXES)) for n in names):
            raise _source_tree_error(package_dir) from None
        raise  # the file is there but does not load: its own error says why
    return _jax_tma


_ext = _load_extension()

@functools.cache
def rules() -> dict:
    """The constants and rule tables that the checks use, as the C++ that
    enforces them has them (ffi/rules.h): e.g. "tma_align_bytes" (16),
    "summed_dtypes" (NumPy names of the element types the handlers add)."""
    return dict(_ext.rules())


@functools.cache
def register() -> None:
    """Registers every CPU target and, when compiled, every CUDA target; once."""
    # Types of per-call-site state first: XLA rejects a handler whose state
    # type it does not know yet.
    for name, registration in _ext.cuda_types().items():
        jax.ffi.register_ffi_type(name, registration, platform="CUDA")
    for name, capsule in _ext.cpu_registrations().items():
        jax.ffi.register_ffi_target(name, capsule, platform="cpu")
    for name, capsule in _ext.cuda_registrations().items():
        jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
    # Targets whose handlers treat their leading (batch) dims independently
    # (their manifests say so): XLA partitions those dims without collectives
    # (_lowering.batch_partitioned_lowering).
    for family in _ext.families().values():
        for name in family["batch_partitionable"]:
            jax.ffi.register_ffi_target_as_batch_partitionable(name)


@functools.cache
def cuda_targets() -> frozenset[str]:
    """The FFI targets this build has CUDA handlers of (none without CUDA): a
    family's manifest may list a target with its CPU handler alone."""
    return frozenset(_ext.cuda_registrations())


def path_counts() -> dict[str, int]:
    """How many calls each op's handlers sent down each path since the
    extension loaded, as {"<op>.<path>": n}, the paths the families'
    manifests list (ffi/<family>/manifest.inc, JAX_TMA_PATH): which kernel a
    method really ran, for tests. A CUDA graph that XLA replays counts once,
    when recorded."""
    return dict(_ext.path_counts())
