#!/usr/bin/env bash
# Everything the GPU machine is for, in one call: install the carried wheel
# (dist/*cp312*.whl, built on a machine without a GPU) into a fresh target,
# run the test suite against the installed package with GPU skips turned
# into failures, run compute-sanitizer (memcheck, racecheck, synccheck) on
# the copy kernels, run the benchmark; logs and JSON under $OUT, a short
# summary last.
#   usage: bash scripts/gpu_check.sh [tests|sanitize|bench]...   (default: all)
#   TEST_PATHS, SELFTESTS and BENCH_OPS narrow a stage, e.g.
#   TEST_PATHS=tests/test_im2col_gpu.py SELFTESTS=im2col_selftest BENCH_OPS=im2col
set -uo pipefail
OUT=${OUT:-/tmp/jax_tma_out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
stages=("$@"); [ ${#stages[@]} -eq 0 ] && stages=(tests sanitize bench)
summary=()

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv

wheel=$(ls dist/jax_tma-*cp312*.whl 2>/dev/null | head -1)
if [ -z "$wheel" ]; then echo "no dist/jax_tma-*cp312*.whl carried"; exit 2; fi
rm -rf /tmp/jax_tma_site
python3 -m pip install -q --no-deps --no-index --target /tmp/jax_tma_site "$wheel" || exit 2
export PYTHONPATH=/tmp/jax_tma_site
# -P keeps the source tree off sys.path: the installed wheel is what runs.
python3 -P -c 'import jax_tma, json; print(json.dumps(jax_tma.build_info())); print(jax_tma.__file__)'

for stage in "${stages[@]}"; do
  case $stage in
  tests)
    JAX_TMA_REQUIRE_GPU=1 timeout 400 python3 -P -m pytest ${TEST_PATHS:-tests} -q -rfE -p no:cacheprovider \
      > "$OUT/tests.log" 2>&1
    rc=$?
    tail -25 "$OUT/tests.log"
    summary+=("tests rc=$rc: $(tail -1 "$OUT/tests.log")")
    ;;
  sanitize)
    inc=$(python3 -c 'import jaxlib, os; print(os.path.join(os.path.dirname(jaxlib.__file__), "include"))')
    nvcc_args=(-std=c++17 -O2 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Iffi -isystem "$inc")
    nvcc "${nvcc_args[@]}" tests/cuda/copy_selftest.cu ffi/cuda/bulk_copy.cu ffi/cuda/simt_copy.cu \
      ffi/cuda/copy_cuda.cc ffi/cuda/device_info.cc -o /tmp/copy_selftest > "$OUT/selftest_build.log" 2>&1 \
      && nvcc "${nvcc_args[@]}" tests/cuda/window_selftest.cu ffi/cuda/tiled_window.cu \
      ffi/cuda/simt_window.cu ffi/cuda/tensor_map.cc ffi/cuda/device_info.cc \
      -o /tmp/window_selftest >> "$OUT/selftest_build.log" 2>&1 \
      && nvcc "${nvcc_args[@]}" tests/cuda/im2col_selftest.cu ffi/cuda/simt_im2col.cu \
      ffi/cuda/tma_im2col.cu ffi/cuda/tensor_map.cc ffi/cuda/device_info.cc \
      -o /tmp/im2col_selftest >> "$OUT/selftest_build.log" 2>&1 \
      || { summary+=("selftest build FAILED"); continue; }
    for prog in ${SELFTESTS:-copy_selftest window_selftest im2col_selftest}; do
      /tmp/$prog
      for tool in memcheck racecheck synccheck; do
        timeout 200 compute-sanitizer --tool "$tool" --error-exitcode 9 /tmp/$prog \
          > /tmp/sanitizer.log 2>&1
        rc=$?
        cat /tmp/sanitizer.log >> "$OUT/sanitizer.log"
        summary+=("compute-sanitizer $tool $prog rc=$rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|_selftest:' /tmp/sanitizer.log | tr '\n' ' ')")
      done
    done
    ;;
  bench)
    for op in ${BENCH_OPS:-copy window im2col}; do
      timeout 300 python3 -P -m jax_tma.bench $op --out "$OUT/$op.json" 2>&1 | tee "$OUT/bench_$op.log" | grep -v "^WARNING"
      summary+=("bench $op rc=${PIPESTATUS[0]}")
    done
    ;;
  esac
done

echo; echo "== summary =="
printf '%s\n' "${summary[@]}"
