"""The documentation site's sources (docs/), read as text, so that these checks
run in every test environment, with or without Sphinx: every public name has
an API reference entry, every argument is documented and every docstring has
the reference's sections, every guide shows an example that
tests/test_examples.py runs, every file, marker, function and image a page
includes exists, and the export example takes the FFI targets from
build_info() rather than spelling them. Building the
site (sphinx-build -W -n, its doctests) is CI's docs step."""

from __future__ import annotations

import inspect
import pathlib
import re

import pytest

import jax_tma

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
GUIDES = sorted((DOCS / "guides").glob("*.md"))
OPS = sorted((DOCS / "ops").glob("*.md"))

# A MyST directive fence: ```{name} argument, then its :option: value lines.
_DIRECTIVE = re.compile(r"^```\{(?P<name>[\w-]+)\}[ \t]*(?P<arg>.*)\n(?P<opts>(?::[\w-]+:.*\n)*)",
                        re.M)
_OPTION = re.compile(r"^:(?P<key>[\w-]+):[ \t]*(?P<value>.*)$", re.M)
_IMAGE = re.compile(r"!\[[^\]]*\]\((?P<path>[^)\s]+)\)")
_AUTOFUNCTION = re.compile(r"^\.\. autofunction:: jax_tma\.(\w+)\s*$", re.M)
# An "Args:" section of a Google-style docstring: its entries are the lines
# indented one level deeper than the header, "name: text" or "a, b: text".
_ARGS = re.compile(r"^(?P<indent>[ \t]*)Args:\n(?P<body>(?:(?P=indent)[ \t]+.*\n|[ \t]*\n)*)", re.M)


def _directives(page: pathlib.Path):
    """(name, argument, {option: value}) of every directive fence of `page`."""
    for m in _DIRECTIVE.finditer(page.read_text()):
        opts = {o["key"]: o["value"].strip() for o in _OPTION.finditer(m["opts"])}
        yield m["name"], m["arg"].strip(), opts


def _documented_args(doc: str) -> set[str]:
    m = _ARGS.search(doc)
    if m is None:
        return set()
    lines = [line for line in m["body"].splitlines() if line.strip()]
    indent = min(len(line) - len(line.lstrip()) for line in lines)
    names = set()
    for line in lines:
        if len(line) - len(line.lstrip()) == indent and ":" in line:
            names.update(n.strip() for n in line.split(":", 1)[0].split(","))
    return names


def test_every_public_name_has_one_reference_entry():
    entries = _AUTOFUNCTION.findall((DOCS / "api.md").read_text())
    assert sorted(entries) == sorted(set(entries)), f"docs/api.md lists a name twice: {entries}"
    assert set(entries) == set(jax_tma.__all__), (
        f"docs/api.md's autofunction entries {sorted(entries)} differ from jax_tma.__all__ "
        f"{sorted(jax_tma.__all__)}")


@pytest.mark.parametrize("name", jax_tma.__all__)
def test_every_argument_is_documented(name):
    fn = getattr(jax_tma, name)
    params = set(inspect.signature(fn).parameters)
    documented = _documented_args(inspect.getdoc(fn) or "")
    assert params <= documented, (
        f"jax_tma.{name}'s docstring has no Args entry for {sorted(params - documented)}")


# Words of tuning history, which belongs in benchmarks/ next to the results:
# timings, dates, what was measured where.
_HISTORY = re.compile(r"µs|\bmeasur|\b20\d\d-\d\d-\d\d\b|\bREADME\b", re.I)


@pytest.mark.parametrize("name", jax_tma.__all__)
def test_every_public_function_has_the_reference_sections(name):
    """Args (where it takes any), Returns, Raises (build_info raises
    nothing) and Examples, in that order, and the auto rule in words
    without tuning history."""
    fn = getattr(jax_tma, name)
    doc = inspect.getdoc(fn) or ""
    want = [s for s in ("Args", "Returns", "Raises", "Examples")
            if (s != "Args" or inspect.signature(fn).parameters)
            and (s != "Raises" or name != "build_info")]
    sections = [s for s in re.findall(r"^(\w+):$", doc, re.M) if s in want]
    assert sections == want, f"jax_tma.{name}'s docstring has sections {sections}, not {want}"
    history = _HISTORY.findall(doc)
    assert not history, f"jax_tma.{name}'s docstring holds tuning history: {history}"


@pytest.mark.parametrize("page", OPS + [DOCS / "api.md"], ids=lambda p: p.stem)
def test_ops_and_api_pages_are_in_the_toctree(page):
    index = (DOCS / "index.md").read_text()
    assert re.search(rf"^{re.escape(page.relative_to(DOCS).with_suffix('').as_posix())}$", index,
                     re.M), f"{page.relative_to(ROOT)} is not in docs/index.md's toctree"


@pytest.mark.parametrize("page", OPS, ids=lambda p: p.stem)
def test_op_page_has_every_section(page):
    headings = re.findall(r"^## (.+)$", page.read_text(), re.M)
    for section in ("Equivalent", "Methods", "Transformations", "Limits and errors", "Speed"):
        assert any(h.startswith(section) for h in headings), (
            f"{page.relative_to(ROOT)} has no '## {section}' section (has {headings})")


@pytest.mark.parametrize("page", GUIDES, ids=lambda p: p.stem)
def test_guide_shows_a_tested_example(page):
    """Each guide shows a script of examples/ (which tests/test_examples.py
    runs) through literalinclude, and is in the toctree."""
    scripts = [(page.parent / arg).resolve() for name, arg, _ in _directives(page)
               if name == "literalinclude"]
    scripts = [p for p in scripts if p.parent == ROOT / "examples" and p.suffix == ".py"]
    assert scripts, f"{page.relative_to(ROOT)} includes no script of examples/"
    for path in scripts:
        assert path.is_file(), f"{page.relative_to(ROOT)} includes {path}, which does not exist"
    assert f"guides/{page.stem}" in (DOCS / "index.md").read_text(), (
        f"{page.relative_to(ROOT)} is not in docs/index.md's toctree")


INCLUDES = [pytest.param(page, arg, opts, id=f"{page.relative_to(DOCS)}-{n}")
            for page in PAGES
            for n, (name, arg, opts) in enumerate(_directives(page))
            if name in ("include", "literalinclude")]


@pytest.mark.parametrize("page, arg, opts", INCLUDES)
def test_included_file_and_its_markers_exist(page, arg, opts):
    """What a page includes is there: the file, the text its start/end
    options name, the function a :pyobject: names."""
    path = (page.parent / arg).resolve()
    where = f"{page.relative_to(ROOT)} includes {arg}"
    assert path.is_file(), f"{where}, which does not exist"
    text = path.read_text()
    for key in ("start-after", "end-before", "start-at", "end-at"):
        if key in opts:
            assert opts[key] in text, f"{where}: its :{key}: {opts[key]!r} is not in the file"
    if "pyobject" in opts:
        assert re.search(rf"^(def|class) {re.escape(opts['pyobject'])}\b", text, re.M), (
            f"{where}: no top-level def or class {opts['pyobject']}")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_images_exist(page):
    for m in _IMAGE.finditer(page.read_text()):
        assert (page.parent / m["path"]).resolve().is_file(), (
            f"{page.relative_to(ROOT)} shows {m['path']}, which does not exist")


def test_export_example_takes_every_target_from_build_info():
    """The export example's disabled_checks name build_info()'s ffi_targets,
    every registered FFI target, and the page spells none by hand (a new
    family's would be missing)."""
    from jax_tma import _jax_tma

    text = (DOCS / "jax_modes.md").read_text()
    assert '>>> targets = jax_tma.build_info()["ffi_targets"]' in text
    assert not re.findall(r"jax_tma_\w+", text), "docs/jax_modes.md names FFI targets by hand"
    targets = jax_tma.build_info()["ffi_targets"]
    assert sorted(targets) == sorted(set(targets)) == sorted(_jax_tma.cpu_registrations())
