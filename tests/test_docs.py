"""The runnable example in every public function's docstring runs and prints
what it says."""

import doctest

import pytest

import jax_tma


@pytest.mark.parametrize("name", jax_tma.__all__)
def test_docstring_example(name):
    fn = getattr(jax_tma, name)
    tests = doctest.DocTestFinder().find(fn, name, globs={})
    examples = [t for t in tests if t.examples]
    assert examples, f"jax_tma.{name} has no docstring example"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for t in examples:
        runner.run(t)
    assert runner.failures == 0, f"jax_tma.{name}: {runner.failures} docstring example(s) failed"
