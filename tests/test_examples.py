"""Every script in examples/ runs to completion (each checks its own result
and exits non-zero when it is wrong)."""

import pathlib
import subprocess
import sys

import pytest

EXAMPLES = sorted((pathlib.Path(__file__).parent.parent / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path):
    # -P: the installed package, not the source tree, as in the README.
    done = subprocess.run([sys.executable, "-P", str(path)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"{path.name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
