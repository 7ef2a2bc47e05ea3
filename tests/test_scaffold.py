"""docs/design.md's "Adding an op family", followed in a copy of the tree for a
CPU-only family `fill` (jax_tma.fill: jnp.full_like, bit for bit): its own
files, and its lines in the shared files the guide names and no others;
then the extension built without CUDA and the tests that the shared test
files and the family's descriptor generate for it (each shared file must
make some), run against that build; and no benchmark result of another
family goes stale. A step of the guide that no longer holds (a file it must
touch beyond those, a descriptor name it does not give, a shared test that
keeps its own list of families) fails here.

It builds the extension (the CPU handlers: under a minute on 2 cores) and
runs a pytest of its own, so it runs only where JAX_TMA_SCAFFOLD=1, with
cmake, a C++ compiler, nanobind and jaxlib's FFI headers beside this
Python: CI sets it once, in the stage of the C++ unit tests."""

from __future__ import annotations

import ast
import glob
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
GUIDE = (ROOT / "docs" / "design.md").read_text().split("## Adding an op family", 1)[1]

# ---- the family's own files, laid out as the guide says --------------------------

OWN = {
    "ffi/fill/manifest.inc": '''\
// The fill family: jax_tma.fill (see ../families.inc for the macros). CPU
// handlers only so far.
JAX_TMA_FAMILY(fill)
JAX_TMA_CPU_TARGET(Fill, "jax_tma_fill")
JAX_TMA_BATCH_PARTITIONABLE("jax_tma_fill")
JAX_TMA_PATH(FillCpu, "fill.cpu")
JAX_TMA_SOURCES(CPU, "fill_cpu.cc")
JAX_TMA_NO_SELFTEST("no kernels yet")
''',
    "ffi/fill/fill_common.h": '''\
// The decode of jax_tma.fill that its handlers share: y has x's shape and
// element type, and every element is the "fill" attribute's (fill.h).
#ifndef JAX_TMA_FFI_FILL_FILL_COMMON_H_
#define JAX_TMA_FFI_FILL_FILL_COMMON_H_

#include <cstdint>

#include "common.h"
#include "fill.h"

namespace jax_tma {

struct FillGeometry {
  void* dst = nullptr;
  int64_t bytes = 0;
  FillPattern fill;
};

inline ffi::Error DecodeFill(const ffi::AnyBuffer& x, ffi::Result<ffi::AnyBuffer>& y,
                             ffi::Span<const int64_t> fill, FillGeometry* g) {
  ByteCopy c;
  JAX_TMA_RETURN_IF_FAILED(CheckWholeCopy("jax_tma.fill", x, y, &c));
  g->dst = c.dst;
  g->bytes = static_cast<int64_t>(c.bytes);
  return ParseFill("jax_tma.fill", fill, 0, 1,
                   static_cast<int64_t>(ffi::ByteWidth(x.element_type())), &g->fill);
}

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_FILL_FILL_COMMON_H_
''',
    "ffi/fill/fill_cpu.cc": '''\
// CPU handler for jax_tma.fill: the fill element's 16-byte pattern over y.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common.h"
#include "fill/fill_common.h"
#include "handlers.h"
#include "path_counts.h"

namespace jax_tma {

static ffi::Error FillCpuImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                              ffi::Span<const int64_t> fill) {
  FillGeometry g;
  JAX_TMA_RETURN_IF_FAILED(DecodeFill(x, y, fill, &g));
  uint8_t pattern[16];
  std::memcpy(pattern, &g.fill.lo, 8);
  std::memcpy(pattern + 8, &g.fill.hi, 8);
  auto* dst = static_cast<uint8_t*>(g.dst);
  for (int64_t i = 0; i < g.bytes; i += 16) {
    std::memcpy(dst + i, pattern, static_cast<size_t>(std::min<int64_t>(16, g.bytes - i)));
  }
  CountPath(Path::kFillCpu);
  return ffi::Error::Success();
}

}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTmaFillCpu, jax_tma::FillCpuImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()                     // x
                                  .Ret<xla::ffi::AnyBuffer>()                     // y
                                  .Attr<xla::ffi::Span<const int64_t>>("fill"));  // fill
''',
    "jax_tma/_fill.py": '''\
"""jax_tma.fill: an array of x's shape and dtype, every element one value, as
a JAX primitive (jit, vmap, grad, shard_map and NamedSharding partitioning
without collectives). CPU handlers only so far."""

from __future__ import annotations

import jax
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad

from jax_tma import _checks, _ffi, _lowering

_OP = "jax_tma.fill"


# ---- the public op ----------------------------------------------------------

def fill(x: jax.Array | np.ndarray, value: float | int | complex) -> jax.Array:
    """An array of ``x``'s shape and dtype with every element ``value``: bit
    for bit ``jnp.full_like(x, value)``.

    Runs on CPU devices. Works under ``jit``, ``vmap``, ``grad`` (zero: the
    result does not depend on ``x``'s values), ``shard_map`` and on sharded
    arrays without collectives.

    Args:
      x: an array of any dtype and shape.
      value: a concrete scalar, converted to ``x``'s dtype as jnp converts it.

    Returns:
      An array of ``x``'s shape, dtype and sharding.

    Raises:
      TypeError: ``x`` is not an array or scalar; ``value`` is not a
        concrete number.

    Examples:
      >>> import jax.numpy as jnp, jax_tma
      >>> jax_tma.fill(jnp.zeros((2, 2), jnp.int8), 7).tolist()
      [[7, 7], [7, 7]]
    """
    x = _checks.as_array(_OP, "x", x)
    element = _checks.fill_bytes(_OP, value, x.dtype)
    _ffi.register()
    return _checks.narrow(fill_p.bind(_checks.widen(x), fill=element), x.dtype)


# ---- primitives -------------------------------------------------------------

fill_p = Primitive("jax_tma_fill")


# ---- lowering and partitioning ----------------------------------------------

_elementwise = _lowering.elementwise_lowering("jax_tma_fill")


def _fill_lowering(ctx, x, *, fill):
    return _elementwise(ctx, x, fill=_lowering.fill_attr([fill]))


# ---- vmap -------------------------------------------------------------------

def _fill_batcher(args, dims, *, fill):
    (x,), (d,) = args, dims
    return fill_p.bind(x, fill=fill), d


# ---- AD ---------------------------------------------------------------------

def _fill_jvp(primals, tangents, *, fill):
    y = fill_p.bind(*primals, fill=fill)
    return y, ad.Zero(jax.typeof(y).to_tangent_aval())


# ---- registration -----------------------------------------------------------

_lowering.register(fill_p, lambda x, *, fill: x, {"cpu": _fill_lowering},
                   batcher=_fill_batcher)
ad.primitive_jvps[fill_p] = _fill_jvp
''',
    "tests/families/fill.py": '''\
"""The fill family's descriptor (tests/families/__init__.py says what each
name is for): jax_tma.fill, on the CPU only so far."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import jax_tma
from fuzz import S, Call, Spec, fill_patterns, i64, random_fill, some_dtype, with_
from ops_table import Case, Op, dim_size, dims_spec, extra_rank, pad_fill
from paths import CpuCall
from reference import ALL_DTYPES, random_array

MODULES = ("jax_tma._fill",)


def _fill_call(rng) -> Call:
    dtype = some_dtype(rng)
    x = random_array(rng, tuple(int(v) for v in rng.integers(0, 5, int(rng.integers(0, 4)))),
                     dtype)
    return Call([x], [S(x.shape, dtype)], dict(fill=random_fill(rng, [dtype])))


def _fill_reference(call: Call) -> list[np.ndarray]:
    y = call.results[0]
    element = fill_patterns(call)[0][:y.dtype.itemsize]
    return [np.tile(element, int(np.prod(y.shape))).view(y.dtype).reshape(y.shape)]


SPECS = {"jax_tma_fill": Spec(("jax_tma.fill",), _fill_call, _fill_reference,
                              ((lambda c: with_(c, fill=i64(1)), r"fill"),),
                              rules={"dtype": r"fill is not one"})}

CPU_CALLS = {"fill": CpuCall(lambda x: jax_tma.fill(x, 2.5))}

GPU_CALLS: dict = {}


def build_fill(rng, dtype, *, batch=8, even=True, method="auto") -> Case:
    shape = (batch,) + tuple(dim_size(rng, even) for _ in range(extra_rank(rng, even)))
    value = int(rng.integers(0, 2))
    draw = lambda r: (random_array(r, shape, dtype),)  # noqa: E731
    return Case(
        op="fill", dtype=np.dtype(dtype), args=draw(rng),
        ours=lambda x: jax_tma.fill(x, value), ref=lambda x: jnp.full_like(x, value),
        expect=lambda x: np.full(x.shape, pad_fill(value, x.dtype)[0]), draw=draw, diff=(0,),
        batch=(0,), split=tuple(range(len(shape))),
        in_specs=lambda dims: (dims_spec(len(shape), dims),),
        symbolic=((("b",) + tuple(f"d{i}" for i in range(1, len(shape)))),),
    )


OPS = (Op("fill", build_fill, ALL_DTYPES, methods=("auto",)),)
''',
    "tests/test_fill.py": '''\
"""jax_tma.fill on the CPU: every dtype as jnp.full_like writes it, and its
errors."""

import jax
import jax.numpy as jnp
import pytest

import jax_tma
from reference import ALL_DTYPES, assert_bits_equal, cpu_device, random_array


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype_as_full_like(rng, dtype):
    x = jax.device_put(random_array(rng, (3, 5), dtype), cpu_device())
    assert_bits_equal(jax_tma.fill(x, 1), jnp.full_like(x, 1))


def test_a_traced_value_is_a_type_error():
    with pytest.raises(TypeError, match=r"jax_tma\\.fill: fill must be a concrete scalar"):
        jax.jit(lambda v: jax_tma.fill(jnp.zeros(2), v))(1.0)
''',
    "docs/ops/fill.md": '''\
# fill

{func}`jax_tma.fill` returns an array of `x`'s shape and dtype with every element `value`.

## Equivalent

`jnp.full_like(x, value)`, bit for bit.

## Methods

One, on CPU devices.

## Transformations

`jax.jit`, `jax.vmap`, `jax.grad` (zero), `shard_map` and sharded arrays without collectives.

## Limits and errors

`value` is a concrete scalar.

## Speed

Not measured: it has no CUDA path yet.
''',
}


# ---- its lines in the shared files ------------------------------------------------

def _after_last(text: str, pattern: str, line: str) -> str:
    """`text` with `line` after the last line that matches `pattern`."""
    last = list(re.finditer(pattern, text, re.M))[-1]
    return text[:last.end()] + "\n" + line + text[last.end():]


def _with_public_name(text: str) -> str:
    """jax_tma/__init__.py importing fill and listing it in __all__."""
    text = _after_last(text, r"^from jax_tma\._\w+ import .*$", "from jax_tma._fill import fill")
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets))
    names = sorted(ast.literal_eval(node.value) + ["fill"])
    lines = text.splitlines(keepends=True)
    listed = textwrap.fill(", ".join(f'"{n}"' for n in names), 99, initial_indent="__all__ = [",
                           subsequent_indent=" " * 11) + "]\n"
    return "".join(lines[:node.lineno - 1] + [listed] + lines[node.end_lineno:])


SHARED = {
    "ffi/families.inc": lambda t: _after_last(t, r'^#include "\w+/manifest\.inc"$',
                                              '#include "fill/manifest.inc"'),
    "jax_tma/__init__.py": _with_public_name,
    "docs/index.md": lambda t: _after_last(t, r"^ops/\w+$", "ops/fill"),
    "docs/api.md": lambda t: t.rstrip("\n") + "\n\n## Fills\n\n```{eval-rst}\n"
                                              ".. autofunction:: jax_tma.fill\n```\n",
    "README.md": lambda t: t.replace("One page per op family — ",
                                     "One page per op family — [fill](docs/ops/fill.md), ", 1),
}

# The shared test files that make tests of every family (each must make some
# of fill's: one that keeps a list of its own would not), and what of them,
# its own file's and the README's runs: the tests whose id names the family,
# and the files that check every family as a whole.
GENERATING = ["tests/test_families.py", "tests/test_paths.py", "tests/test_ffi_fuzz.py",
              *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("tests/test_mode_*.py")
                      if p.name != "test_mode_int_dtypes.py"),
              "tests/test_sharding.py", "tests/test_multi_gpu.py", "tests/test_docs.py",
              "tests/test_docs_site.py"]
TESTS = [*GENERATING, "tests/test_fill.py", "tests/test_readme.py"]
SELECTED = "fill or test_families or test_paths or test_docs_site or registered or links"


def test_the_guide_names_what_the_scaffold_touches():
    """The family's files are those the guide lays out for `foo`; the shared
    files it edits are those the guide lists, and no others."""
    for path in OWN:
        generic = path.replace("fill", "foo")
        folder, name = os.path.split(generic)
        assert generic in GUIDE or (f"{folder}/" in GUIDE and name in GUIDE), \
            f"the guide does not lay out {generic}"
    listed = re.search(r"Shared files a family edits:(.*?); nothing else", GUIDE, re.S)
    assert listed, "the guide does not list the shared files a family edits"
    assert set(re.findall(r"`([\w/.]+\.\w+)`", listed[1])) == set(SHARED)


def _run(args, cwd, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, **kw)
    assert done.returncode == 0, (f"{' '.join(map(str, args))}:\n{done.stdout[-4000:]}\n"
                                  f"{done.stderr[-4000:]}")
    return done


def _git(repo, *args) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return _run(["git", "-C", str(repo), *args], ROOT, env=env).stdout.strip()


@pytest.mark.skipif(os.environ.get("JAX_TMA_SCAFFOLD") != "1",
                    reason="builds the extension: runs where JAX_TMA_SCAFFOLD=1 (CI's C++ "
                           "test stage)")
def test_a_cpu_only_family_made_as_the_guide_says(tmp_path, monkeypatch):
    tree = tmp_path / "tree"
    files = _run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others",
                  "--exclude-standard"], ROOT).stdout.split("\n")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tree / name)
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-qm", "the tree")
    base = _git(tree, "rev-parse", "HEAD")

    for path, text in OWN.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(text)
    for path, edit in SHARED.items():
        (tree / path).write_text(edit((tree / path).read_text()))
    _git(tree, "add", "-A")
    _git(tree, "commit", "-qm", "the fill family")
    touched = set(_git(tree, "diff", "--name-only", base, "HEAD").split())
    assert touched == set(OWN) | set(SHARED)

    # The CPU module alone, no optimisation: the build's question is whether
    # the family's lines compile and register, not how fast.
    build = tmp_path / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run(["cmake", "-S", str(tree), "-B", str(build), *generator, "-DJAX_TMA_CUDA=OFF",
          f"-DPython_EXECUTABLE={sys.executable}"], tree, timeout=300)
    _run(["cmake", "--build", str(build), "--target", "_jax_tma", "--parallel", "2"], tree,
         timeout=600)
    modules = glob.glob(str(build / "_jax_tma*.so"))
    assert modules, f"the build left no _jax_tma module in {build}"
    shutil.copy2(modules[0], tree / "jax_tma")

    env = {k: v for k, v in os.environ.items() if k not in ("JAX_TMA_SCAFFOLD", "PYTHONPATH")}
    env.update(PYTHONPATH=str(tree), JAX_PLATFORMS="cpu")
    pytest_args = [sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider", "-q"]
    found = _run([*pytest_args, "--collect-only", *GENERATING, "-k", "fill"], tree, env=env,
                 timeout=300).stdout
    for path in GENERATING:
        assert f"{path}::" in found, f"{path} makes no test of a new family"
    ran = _run([*pytest_args, *TESTS, "-k", SELECTED, "-n", "2"], tree, env=env, timeout=600)
    summary = ran.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary, ran.stdout[-4000:]

    # No result of another family goes stale (benchmarks/report.py).
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import report
    monkeypatch.setattr(report, "ROOT", str(tree))
    for family in report.families():
        if family != "fill":
            assert report.changed_since(base, family) == [], family
