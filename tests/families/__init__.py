"""The op families' descriptors: tests/families/<family>.py for each family
that the extension reports (_jax_tma.families(), the order of
ffi/families.inc). The shared tests iterate over them and name no family;
each descriptor defines

  MODULES    the jax_tma modules of its ops ("jax_tma._window"), each the
             module of one family: benchmarks/report.py reads this line as
             text (no import) to tell which results a change of code makes
             stale
  SPECS      {target: fuzz.Spec}: the FFI fuzz of each of its targets
             (test_ffi_fuzz.py)
  CPU_CALLS  {op: paths.CpuCall}: one call of each op of its targets
             ("jax_tma_<op>") that the CPU handler counts (test_paths.py)
  GPU_CALLS  {"<op>.<path>": call(x, device)}: one call forcing each CUDA path of its
             manifest (test_paths.py, the GPU quick tier's smoke test)
  OPS        (ops_table.Op, ...): the builders of its ops' cases for the
             JAX-mode, sharding and multi-GPU tests

and the references (NumPy results) that its own test files import.
test_families.py fails, naming what to add, for a family without a
descriptor or a descriptor without one of these; the other tests leave
such a family out."""

from __future__ import annotations

import importlib
from types import ModuleType

import jax
import numpy as np
import pytest

from jax_tma import _jax_tma
from ops_table import Case, Op

FAMILIES: dict[str, dict] = dict(_jax_tma.families())
NAMES = ("MODULES", "SPECS", "CPU_CALLS", "GPU_CALLS", "OPS")


def _load(family: str) -> ModuleType | None:
    """The family's descriptor; None where the file is missing (a descriptor
    that fails to import raises its own error)."""
    name = f"families.{family}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        return None


DESCRIPTORS: dict[str, ModuleType] = {
    family: module for family in FAMILIES if (module := _load(family)) is not None}


def missing(family: str) -> list[str]:
    """What the family's descriptor lacks: the file, or names of NAMES."""
    if family not in DESCRIPTORS:
        return [f"tests/families/{family}.py"]
    return [name for name in NAMES if not hasattr(DESCRIPTORS[family], name)]


def _complete() -> dict[str, ModuleType]:
    return {family: d for family, d in DESCRIPTORS.items() if not missing(family)}


def _merged(name: str) -> dict:
    """The descriptors' dicts called `name` in one; a key in two is an error."""
    out: dict = {}
    for family, d in _complete().items():
        for key, value in getattr(d, name).items():
            if key in out:
                raise ValueError(f"tests/families/{family}.py: {name} {key!r} is another "
                                 "family's too")
            out[key] = value
    return out


SPECS = _merged("SPECS")
CPU_CALLS = _merged("CPU_CALLS")
GPU_CALLS = _merged("GPU_CALLS")
FAMILY_OF: dict[str, str] = {op.name: family for family, d in _complete().items()
                             for op in d.OPS}
OPS: tuple[Op, ...] = tuple(op for d in _complete().values() for op in d.OPS)
OP_NAMES = tuple(op.name for op in OPS)
BY_NAME = {op.name: op for op in OPS}
# The ops that run outside shard_map.
LOCAL_OPS = tuple(op.name for op in OPS if not op.collective)


def runs_on_the_default_backend(name: str) -> bool:
    """Whether the op's target ("jax_tma_<name>"), or every target of its
    family where it has none of that name, has a handler on the default
    backend (a family, or one op of it, may have its CPU handlers alone so
    far)."""
    if jax.default_backend() == "cpu":
        return True
    targets = set(FAMILIES[FAMILY_OF[name]]["targets"])
    own = {f"jax_tma_{name}"} & targets
    return (own or targets) <= set(_jax_tma.cuda_registrations())


def build(name: str, rng, dtype=np.float32, **kw) -> Case:
    """A case of op `name`, skipping the test where the op's family has no
    handlers on the default backend."""
    if not runs_on_the_default_backend(name):
        pytest.skip(f"{name}: its family ({FAMILY_OF[name]}) has no CUDA handlers yet")
    return BY_NAME[name].build(rng, np.dtype(dtype), **kw)
