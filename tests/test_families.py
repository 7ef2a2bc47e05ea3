"""The family list (ffi/families.inc) and what every family on it has: a
descriptor (tests/families/<family>.py) whose fuzz specs cover its targets,
whose CPU calls cover its ops and whose GPU calls cover its CUDA paths, and
that names its ops' modules; a kernel self-test
(tests/cuda/<family>_selftest.cu, built by scripts/gpu_check.sh from the
sources its manifest lists) or the manifest's reason for none; and, once it
has CUDA targets, a benchmark (benchmarks/run.py). A family added to the list
without them fails here, naming what to add."""

import importlib
import os
import re

import pytest

import families
import jax_tma
from jax_tma import _jax_tma

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FAMILIES = _jax_tma.families()


def _read(*path: str) -> str:
    with open(os.path.join(_ROOT, *path), encoding="utf-8") as f:
        return f.read()


def _ops(family: str) -> set[str]:
    """The ops of a family's targets ("jax_tma_<op>")."""
    return {t.removeprefix("jax_tma_") for t in _FAMILIES[family]["targets"]}


def _descriptor(family: str):
    """The family's descriptor; the test fails where it lacks anything
    (test_every_family_has_a_descriptor says what)."""
    if families.missing(family):
        pytest.fail(f"{family}: its descriptor is incomplete: {families.missing(family)}")
    return families.DESCRIPTORS[family]


def test_the_extension_registers_the_listed_families():
    listed = re.findall(r'^#include "([a-z0-9_]+)/manifest\.inc"$', _read("ffi", "families.inc"),
                        re.M)
    assert list(_FAMILIES) == listed
    targets = {t for family in _FAMILIES.values() for t in family["targets"]}
    assert targets == set(_jax_tma.cpu_registrations())


@pytest.mark.parametrize("family", sorted(_FAMILIES))
def test_every_family_has_a_descriptor(family):
    lacking = families.missing(family)
    assert not lacking, (
        f"{family}: add {', '.join(lacking)} (what each is for: tests/families/__init__.py; "
        f"an example: tests/families/copy.py)" if lacking[0].endswith(".py") else
        f"{family}: tests/families/{family}.py lacks {', '.join(lacking)} (what each is "
        "for: tests/families/__init__.py)")


@pytest.mark.parametrize("family", sorted(_FAMILIES))
def test_every_target_is_fuzzed(family):
    specs = set(_descriptor(family).SPECS)
    assert specs == set(_FAMILIES[family]["targets"]), (
        f"{family}: tests/families/{family}.py's SPECS has {sorted(specs)}, one per target: "
        f"{_FAMILIES[family]['targets']}")


@pytest.mark.parametrize("family", sorted(_FAMILIES))
def test_every_target_is_path_tested(family):
    calls = set(_descriptor(family).CPU_CALLS)
    assert calls == _ops(family), (
        f"{family}: tests/families/{family}.py's CPU_CALLS has {sorted(calls)}, one per op of "
        f"its targets: {sorted(_ops(family))}")
    for path in _FAMILIES[family]["paths"]:
        assert path.split(".")[0] in _ops(family), f"{family}: path {path} names no op of it"
    for op in _ops(family):
        assert f"{op}.cpu" in _FAMILIES[family]["paths"], f"{family}: no path {op}.cpu"
    cuda = {p for p in _FAMILIES[family]["paths"] if not p.endswith(".cpu")}
    assert set(_descriptor(family).GPU_CALLS) == cuda, (
        f"{family}: tests/families/{family}.py's GPU_CALLS has "
        f"{sorted(_descriptor(family).GPU_CALLS)}, one per CUDA path: {sorted(cuda)}")


@pytest.mark.parametrize("family", sorted(_FAMILIES))
def test_cuda_targets_are_targets_and_have_cuda_paths(family):
    targets, cuda = _FAMILIES[family]["targets"], _FAMILIES[family]["cuda_targets"]
    assert set(cuda) <= set(targets), f"{family}: CUDA targets without a CPU one: {cuda}"
    paths = {p.split(".")[0] for p in _FAMILIES[family]["paths"] if not p.endswith(".cpu")}
    assert paths == {t.removeprefix("jax_tma_") for t in cuda}, (
        f"{family}: the ops with CUDA paths, {sorted(paths)}, are not those of its CUDA "
        f"targets, {cuda}")


@pytest.mark.parametrize("family", sorted(_FAMILIES))
def test_every_op_is_in_the_modules_its_descriptor_names(family):
    """benchmarks/report.py reads MODULES to tell whose results a change of
    Python makes stale."""
    modules = _descriptor(family).MODULES
    for module in modules:
        assert os.path.exists(os.path.join(_ROOT, *module.split(".")) + ".py"), module
    for target in _ops(family):
        # A target serves a public op: jax_tma_<op>, or jax_tma_<op>_<stage>
        # for one of several calls of it (moe_dispatch_plan).
        op = next((o for o in jax_tma.__all__ if target == o or target.startswith(o + "_")), None)
        assert op, f"{family}: no public jax_tma.<op> for target jax_tma_{target}"
        where = getattr(jax_tma, op).__module__
        assert where in modules, f"{family}: jax_tma.{op} is in {where}, not in MODULES {modules}"


def test_a_module_is_one_familys():
    """benchmarks/report.py gives a module's changes to the family that names
    it (and to those that import it)."""
    named: dict[str, str] = {}
    for family, d in families.DESCRIPTORS.items():
        for module in getattr(d, "MODULES", ()):
            assert module not in named, f"{module} is in the MODULES of {named[module]} and {family}"
            named[module] = family


@pytest.mark.parametrize("family", sorted(_FAMILIES))
def test_every_family_has_mode_test_ops(family):
    assert _descriptor(family).OPS, f"{family}: tests/families/{family}.py's OPS is empty"


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
    """Benchmarks time the CUDA path: a family without CUDA targets yet has
    nothing to time."""
    if not _FAMILIES[family]["cuda_targets"]:
        return
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
    for checked in ("ffi/families.inc", "tests/test_families.py", "tests/families/",
                    "benchmarks/run.py", "_selftest.cu"):
        assert checked in guide, f"the guide does not name {checked}"
