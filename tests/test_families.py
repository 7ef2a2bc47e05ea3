"""The family list (ffi/families.inc) and what every family on it has: each of
its FFI targets fuzzed (test_ffi_fuzz.SPECS) and path-tested
(test_paths.CPU_CALLS), a kernel self-test (tests/cuda/<family>_selftest.cu,
built by scripts/gpu_check.sh from the sources its manifest lists) or the
manifest's reason for none, and a benchmark (benchmarks/run.py). A family
added to the list without them fails here."""

import importlib
import os
import re

import pytest

import test_ffi_fuzz
import test_paths
from jax_tma import _jax_tma

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FAMILIES = _jax_tma.families()


def _read(*path: str) -> str:
    with open(os.path.join(_ROOT, *path), encoding="utf-8") as f:
        return f.read()


def _ops(family: str) -> set[str]:
    """The ops of a family's targets ("jax_tma_<op>")."""
    return {t.removeprefix("jax_tma_") for t in _FAMILIES[family]["targets"]}


def test_the_extension_registers_the_listed_families():
    listed = re.findall(r'^#include "([a-z0-9_]+)/manifest\.inc"$', _read("ffi", "families.inc"),
                        re.M)
    assert list(_FAMILIES) == listed
    targets = {t for family in _FAMILIES.values() for t in family["targets"]}
    assert targets == set(_jax_tma.cpu_registrations())


@pytest.mark.parametrize("family", sorted(_FAMILIES))
def test_every_target_is_fuzzed(family):
    missing = set(_FAMILIES[family]["targets"]) - set(test_ffi_fuzz.SPECS)
    assert not missing, f"{family}: targets without a fuzz spec in test_ffi_fuzz.SPECS: {missing}"


@pytest.mark.parametrize("family", sorted(_FAMILIES))
def test_every_target_is_path_tested(family):
    missing = _ops(family) - set(test_paths.CPU_CALLS)
    assert not missing, f"{family}: ops without a call in test_paths.CPU_CALLS: {missing}"
    for path in _FAMILIES[family]["paths"]:
        assert path.split(".")[0] in _ops(family), f"{family}: path {path} names no op of it"
    for op in _ops(family):
        assert f"{op}.cpu" in _FAMILIES[family]["paths"], f"{family}: no path {op}.cpu"


@pytest.mark.parametrize("family", sorted(_FAMILIES))
def test_every_family_is_self_tested(family):
    manifest = _read("ffi", family, "manifest.inc")
    sources = re.search(r'^JAX_TMA_SOURCES\(SELFTEST, "(.*)"\)$', manifest, re.M)
    if sources is None:
        assert re.search(r'^JAX_TMA_NO_SELFTEST\(".+"\)$', manifest, re.M), (
            f"{family}: its manifest lists no self-test sources and says not why")
        return
    assert os.path.exists(os.path.join(_ROOT, "tests", "cuda", f"{family}_selftest.cu"))
    for source in sources.group(1).split():
        path = os.path.normpath(os.path.join(_ROOT, "ffi", family, source))
        assert os.path.exists(path), f"{family}: self-test source {source} does not exist"


@pytest.mark.parametrize("family", sorted(_FAMILIES))
def test_every_family_is_benchmarked(family, monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(_ROOT, "benchmarks"))
    run = importlib.import_module("run")
    assert family in run.OPS, f"{family}: not in benchmarks/run.py's registry {run.OPS}"


def test_gpu_check_reads_the_list():
    """scripts/gpu_check.sh builds the self-tests the manifests list and runs
    the benchmarks of run.py's groups, naming no family itself."""
    script = _read("scripts", "gpu_check.sh")
    assert "ffi/families.inc" in script and "JAX_TMA_SOURCES(SELFTEST" in script
    for family in _FAMILIES:
        assert not re.search(rf"\b{family}\b", script, re.I), f"gpu_check.sh names {family}"


def test_gpu_check_stages_run_groups_that_exist(monkeypatch):
    """Each `bench NAME OPS` line of gpu_check.sh (but bench's own, which
    takes BENCH_OPS) names a group of run.py's."""
    monkeypatch.syspath_prepend(os.path.join(_ROOT, "benchmarks"))
    run = importlib.import_module("run")
    named = re.findall(r"^\s+bench (\w+) (\w+)$", _read("scripts", "gpu_check.sh"), re.M)
    assert named, "no bench line found"
    for name, group in named:
        assert group in run.GROUPS and run.GROUPS[group], (name, group, run.GROUPS)


@pytest.mark.parametrize("family", sorted(_FAMILIES))
def test_batch_partitionable_targets_are_the_familys(family):
    extra = set(_FAMILIES[family]["batch_partitionable"]) - set(_FAMILIES[family]["targets"])
    assert not extra, f"{family}: batch-partitionable targets it does not register: {extra}"


def test_rules_are_read_not_spelled():
    """The rule tables Python reads come from the extension (ffi/rules.h):
    shared ones and one prefix per family that declares JAX_TMA_RULES."""
    from jax_tma import _ffi
    prefixes = {name.split(".")[0] for name in _ffi.rules() if "." in name}
    declared = {family for family in _FAMILIES
                if re.search(r"^JAX_TMA_RULES\(\w+\)$", _read("ffi", family, "manifest.inc"),
                             re.M)}
    assert prefixes == declared


def test_the_guide_names_every_manifest_macro():
    """docs/design.md's "Adding an op family" walks through every line a
    manifest may hold, the list and the checks of this file."""
    macros = set(re.findall(r"^#ifndef (JAX_TMA_\w+)$", _read("ffi", "families.inc"), re.M))
    guide = _read("docs", "design.md").split("## Adding an op family", 1)[1]
    missing = {m for m in macros if m not in guide}
    assert not missing, f"docs/design.md's guide does not name {sorted(missing)}"
    for checked in ("ffi/families.inc", "tests/test_families.py", "test_ffi_fuzz.py",
                    "test_paths.py", "benchmarks/run.py", "_selftest.cu"):
        assert checked in guide, f"the guide does not name {checked}"
