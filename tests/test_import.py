"""Importing jax_tma from a source tree without a compiled extension fails
with an ImportError that says so and what to do, and `python -m pytest` from
the checkout root tests the installed package (tests/conftest.py)."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import jax_tma

ROOT = pathlib.Path(__file__).resolve().parent.parent
_ENV = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")  # nothing written into the checkout


def _has_extension(package_dir: pathlib.Path) -> bool:
    return any(package_dir.glob("_jax_tma.*"))


def _source_copy(tmp_path: pathlib.Path) -> pathlib.Path:
    """A checkout-like folder holding the source tree's jax_tma/ (its .py
    files only: no extension, whatever the checkout holds)."""
    src = ROOT / "jax_tma"
    if not src.is_dir():  # tests run from elsewhere: the installed package's sources
        src = pathlib.Path(jax_tma.__file__).parent
    (tmp_path / "jax_tma").mkdir()
    for f in src.glob("*.py"):
        shutil.copy(f, tmp_path / "jax_tma" / f.name)
    return tmp_path


@pytest.mark.parametrize("where", ["checkout", "copy"])
def test_source_tree_without_extension_says_what_to_do(tmp_path, where):
    if where == "checkout":
        if not (ROOT / "jax_tma").is_dir() or _has_extension(ROOT / "jax_tma"):
            pytest.skip("the checkout's jax_tma/ holds a built extension (in-place build)")
        cwd = ROOT
    else:
        cwd = _source_copy(tmp_path)
    # `python -c` puts the working directory first on sys.path, as `python -m
    # pytest` does: the source tree shadows any installed jax_tma.
    done = subprocess.run([sys.executable, "-c", "import jax_tma"], cwd=cwd, env=_ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0, done.stdout
    package_dir = os.path.join(os.path.realpath(cwd), "jax_tma")
    want = (f"ImportError: jax_tma's compiled extension _jax_tma is not in {package_dir}: "
            "this looks like a source checkout without a build")
    assert want in done.stderr, done.stderr[-3000:]
    assert "pip install ." in done.stderr and "python -P -m pytest tests" in done.stderr
    assert "circular import" not in done.stderr, done.stderr[-3000:]


def test_the_tests_import_the_installed_package():
    here = pathlib.Path(jax_tma.__file__).resolve().parent
    assert here != ROOT / "jax_tma" or _has_extension(here), here


def test_python_m_pytest_from_the_checkout_root():
    if not (ROOT / "tests" / "conftest.py").is_file() or _has_extension(ROOT / "jax_tma"):
        pytest.skip("needs the checkout's tests/ and no in-place build")
    # `python -m pytest` from the root (the root first on sys.path): conftest
    # drops it, so the installed package is the one tested.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/test_import.py::test_the_tests_import_the_installed_package"],
        cwd=ROOT, env=_ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 passed" in done.stdout, done.stdout[-3000:]
