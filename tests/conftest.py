"""Test session set-up: the installed jax_tma, not the source tree; 8 forced
host devices for the sharding tests, 64-bit types on, the `gpu` marker
(skipped without a GPU unless JAX_TMA_REQUIRE_GPU=1, which turns the skip
into a failure), and the `rng` fixture: a fresh seed per test, named in
every failure report of a test that uses it; JAX_TMA_SEED=<seed> replays it;
and --fuzz-budget, the wall time the fuzz tests share (the quick tier's)."""

import argparse
import glob
import os
import shlex
import sys
import time

# `python -m pytest` puts the working directory first on sys.path. From the
# checkout root that is the source tree, whose jax_tma/ has no compiled
# extension (builds install it elsewhere) and would shadow the installed
# package. Drop the checkout root from sys.path then, before any test module
# imports jax_tma; an in-place build (an extension in jax_tma/) stays usable.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not glob.glob(os.path.join(_ROOT, "jax_tma", "_jax_tma.*")):
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _ROOT]

_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import reference  # noqa: E402  (tests/, on sys.path as the rootdir conftest's folder)

jax.config.update("jax_enable_x64", True)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def pytest_addoption(parser):
    parser.addoption(
        "--fuzz-budget", type=_seconds, default=None, metavar="SECONDS",
        help="wall time that the fuzz tests of this run share (pytest-xdist's workers "
             "included): each runs at least one case and draws more while its share lasts; "
             "default: each runs its full count of cases")


@pytest.fixture
def fuzz_deadline(request) -> float | None:
    """time.monotonic() at which this fuzz test should stop drawing cases (it
    runs one in any case), or None without --fuzz-budget. The budget is
    shared evenly among the tests of the run that use this fixture, which
    pytest-xdist's workers run side by side."""
    budget = request.config.getoption("fuzz_budget")
    if budget is None:
        return None
    tests = sum("fuzz_deadline" in item.fixturenames for item in request.session.items)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return time.monotonic() + budget * workers / max(tests, 1)


def pytest_configure(config):
    """pytest-xdist's workers steal each other's pending tests (--dist
    worksteal) unless the command line names a --dist: under the default
    `load`, a worker's queue is fixed once handed out, and on a GPU machine
    (2026-11-29, an H200, 14 workers) eight workers sat idle from 73 s of
    test time while two worked through queues of long tests to 189 s."""
    args = [*config.invocation_params.args, *shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))]
    named = getattr(config.option, "distload", False) or any(
        str(arg).startswith("--dist") for arg in args)
    if getattr(config.option, "dist", "no") == "load" and not named:
        config.option.dist = "worksteal"


def _has_gpu() -> bool:
    try:
        return len(jax.devices("cuda")) > 0
    except RuntimeError:
        return False


def _name_the_running_test(text: str) -> None:
    """With JAX_TMA_SEED_DIR set, `text` (the test, and its seed once the rng
    fixture has drawn it) is the one line of a file there named after the
    process (pytest-xdist's worker): what names, and replays, a test that
    ended its process, whose report is lost with it."""
    if seed_dir := os.environ.get("JAX_TMA_SEED_DIR"):
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(os.path.join(seed_dir, worker), "w") as f:
            f.write(text + "\n")


def pytest_runtest_setup(item):
    _name_the_running_test(item.nodeid)
    if "gpu" in item.keywords and not _has_gpu():
        if os.environ.get("JAX_TMA_REQUIRE_GPU") == "1":
            pytest.fail("JAX_TMA_REQUIRE_GPU=1 but JAX sees no CUDA GPU")
        pytest.skip("needs a CUDA GPU (set JAX_TMA_REQUIRE_GPU=1 to fail instead)")


@pytest.fixture
def rng(request, record_property):
    """Fresh random inputs on every run (JAX_TMA_SEED=<seed> repeats one):
    a Generator that carries its seed (`rng.seed`). The seed is kept in the
    test report, named by reference.assert_bits_equal's failures and added to
    the report of any failing test that uses this fixture, and written beside
    the test's name under JAX_TMA_SEED_DIR (_name_the_running_test)."""
    fixed = os.environ.get("JAX_TMA_SEED")
    seed = int(fixed) if fixed else np.random.SeedSequence().entropy
    record_property("seed", seed)
    _name_the_running_test(f"{request.node.nodeid}: JAX_TMA_SEED={seed}")
    reference.set_active_seed(seed)
    yield reference.SeededGenerator(seed)
    reference.set_active_seed(None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    seed = getattr(getattr(item, "funcargs", {}).get("rng"), "seed", None)
    if report.failed and seed is not None:
        report.sections.append(("random inputs", f"rng seed {seed}: rerun with "
                                                 f"JAX_TMA_SEED={seed}"))


@pytest.fixture(autouse=True)
def _fresh_runtime_tokens():
    """Raw calls with has_side_effect=True that a test expects to fail leave
    their error in JAX's runtime tokens, which the next effects barrier (or
    JAX's own at exit) would raise again; each test starts and ends without
    them. jax_tma's ops have no side effects, so no error of theirs is lost."""
    yield
    from jax._src import dispatch  # private; in jax 0.10 to 0.12

    dispatch.runtime_tokens.clear()


@pytest.fixture
def gpu():
    return jax.devices("cuda")[0]


@pytest.fixture
def bench_ext(gpu):
    """The benchmarks' extension _jax_tma_bench: a failure under
    JAX_TMA_REQUIRE_GPU=1 when it is missing (a GPU run must not pass by
    skipping), else a skip."""
    benchmarks = os.path.join(_ROOT, "benchmarks")
    if benchmarks not in sys.path:
        sys.path.insert(0, benchmarks)
    import references  # benchmarks/references.py

    try:
        return references.load_extension()
    except ImportError as e:
        if os.environ.get("JAX_TMA_REQUIRE_GPU") == "1":
            pytest.fail(f"JAX_TMA_REQUIRE_GPU=1 but {e}")
        pytest.skip(str(e))
