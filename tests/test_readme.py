"""The README's Python example (its taste of the API) runs as written on the
CPU, on the oldest and newest supported jax; a line `expr  # <literal>` must
evaluate to that literal; its links name files of the checkout. The docs'
examples are the doctests of the docs build; the README's set-up commands
are the ones .ci/run runs."""

import json
import os
import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).parent.parent / "README.md"

_RUNNER = r'''
import ast, json, re, sys
import numpy as np
scope = {}
for first_line, code in json.loads(sys.stdin.read()):
    lines = code.splitlines()
    for stmt in ast.parse(code).body:
        where = f"README.md line {first_line + stmt.lineno - 1}"
        # The result a statement is said to give: a literal in the comment
        # ending its last line, or in a comment line right after it.
        tail = lines[stmt.end_lineno - 1].partition("#")[2]
        if not tail and stmt.end_lineno < len(lines) and lines[stmt.end_lineno].lstrip().startswith("#"):
            tail = lines[stmt.end_lineno].partition("#")[2]
        found = re.match(r"\s*(\[[^#:]*\])", tail)
        node = ast.Module([stmt], [])
        if isinstance(stmt, ast.Expr) and found:
            got = np.asarray(eval(compile(ast.Expression(stmt.value), where, "eval"), scope))
            want = ast.literal_eval(found.group(1))
            if got.tolist() != want:
                sys.exit(f"{where}: gave {got.tolist()}, the README says {want}")
        else:
            exec(compile(node, where, "exec"), scope)
print("README examples OK")
'''


def _python_blocks():
    blocks, lines = [], README.read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i + 1
            i += 1
            while lines[i].strip() != "```":
                i += 1
            blocks.append((start + 1, "\n".join(lines[start:i])))
        i += 1
    return blocks


def test_readme_python_examples_run_as_written():
    blocks = _python_blocks()
    assert blocks, "the README shows no Python example"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-P", "-c", _RUNNER], input=json.dumps(blocks),
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert "README examples OK" in done.stdout



def test_readme_links_exist():
    """Every relative link of the README (into docs/, mostly) names a file
    of the checkout."""
    import re

    links = re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", README.read_text())
    assert links, "the README links nowhere"
    missing = [link for link in links if "://" not in link
               and not (README.parent / link).is_file()]
    assert not missing, f"the README links to files that do not exist: {missing}"


# The test extra's requirements that no test imports, and where each is used
# instead (a file of the checkout and a text in it that shows the use).
_USED_WITHOUT_IMPORT = {
    "pytest": ("README.md", "pytest tests"),                     # the runner itself
    "pytest-xdist": ("README.md", "-n auto"),                    # a worker per core
    "flatbuffers": ("tests/test_mode_export.py", ".serialize()"),  # jax.export's serialize()
}


def test_every_test_requirement_is_used():
    """`pip install ".[test]"` (the README's test command) installs only what
    the tests use: each requirement of the `test` extra is imported by a test
    module, or used as _USED_WITHOUT_IMPORT says (and that use is there)."""
    import tomllib

    root = README.parent
    extra = tomllib.loads((root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["test"]
    names = [re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower() for req in extra]
    sources = "\n".join(p.read_text() for p in (root / "tests").rglob("*.py"))
    imported = set(re.findall(r"^\s*(?:import|from)\s+([A-Za-z0-9_]+)", sources, re.M))
    unused = []
    for name in names:
        if name.replace("-", "_") in imported:
            continue
        if name in _USED_WITHOUT_IMPORT:
            path, text = _USED_WITHOUT_IMPORT[name]
            assert text in (root / path).read_text(), f"{name}: {path} no longer has {text!r}"
            continue
        unused.append(name)
    assert not unused, (f"pyproject.toml's test extra lists {unused}, which no test imports "
                        f"or uses: use it or drop it")


def test_readme_says_which_jax_ci_tests_on_which_python():
    """The README names each (Python, jax) pair that CI's wheel stages
    (.ci/run's test_wheel lines) test on, as it tests it: "jax 0.10.2 on
    Python 3.11", "the newest jax on Python 3.12"."""
    root = README.parent
    ci = root / ".ci" / "run"
    if not ci.is_file():
        import pytest

        pytest.skip("no .ci/run here")
    pairs = re.findall(r'^test_wheel (3\.\d+) "jax(?:==([\d.]+))?"', ci.read_text(), re.M)
    assert pairs, ".ci/run tests no wheel"
    text = " ".join(README.read_text().split())
    for python, version in pairs:
        said = f"jax {version} on Python {python}" if version else \
            f"the newest jax on Python {python}"
        assert said in text, f"the README does not say CI tests {said}"
