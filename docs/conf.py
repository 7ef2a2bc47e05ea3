"""Sphinx configuration of the jax_tma documentation site.

    pip install ".[docs]"
    sphinx-build -W --keep-going -n -b html docs build/docs/html
    sphinx-build -W --keep-going -n -b doctest docs build/docs/doctest

The pages are MyST Markdown; the API reference is autodoc over the installed
jax_tma's docstrings (Google style, napoleon). Nothing is fetched from the
network: no intersphinx, no external link check.
"""

import doctest
import os

# The doctests (every ``{doctest}`` block of the pages and every docstring
# example) run on the CPU handlers, with four host devices for the sharding
# and ppermute examples. JAX's traceback filtering would append a note to an
# error raised inside a transformation, which the doctests' expected errors
# do not show. Set before anything imports jax.
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["JAX_TRACEBACK_FILTERING"] = "off"
os.environ["XLA_FLAGS"] = " ".join(
    filter(None, [os.environ.get("XLA_FLAGS"), "--xla_force_host_platform_device_count=4"]))

import jax_tma  # noqa: E402  (the installed package, after the environment above)

project = "jax_tma"
author = "the jax_tma authors"
copyright = "the jax_tma authors"
release = jax_tma.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

myst_enable_extensions = ["colon_fence", "deflist"]
# Headings get anchors for links of the form page.md#heading.
myst_heading_anchors = 3

autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

doctest_default_flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

# -n (nitpicky) checks every cross-reference. Without intersphinx the types of
# other libraries (jax.Array, numpy.ndarray, the typing and collections.abc
# names in the signatures, jax.errors.JaxRuntimeError under Raises) have no
# target here; every jax_tma reference must still resolve.
nitpick_ignore_regex = [
    ("py:(class|exc)", r"(jax|jaxlib|numpy|np|typing|collections\.abc)\..+"),
    ("py:class", r"(Array|ndarray|Sequence|Any|Literal)"),
]

html_theme = "furo"
html_title = f"jax_tma {release}"
html_static_path = []
