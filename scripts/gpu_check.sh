#!/usr/bin/env bash
# Everything the GPU machine is for, in one call. Two installs of jax_tma:
#  - wheel:  the carried cp312-abi3 wheel (dist/, built by scripts/build_dist.sh
#            on a machine without a GPU, as CI builds it);
#  - source: a build from this checkout with the machine's own compiler
#            (pip install --no-build-isolation, the path of a GPU user
#            without a wheel), with the benchmarks' extension _jax_tma_bench
#            (JAX_TMA_BENCH=ON), which is then moved to a folder of its own
#            and put on PYTHONPATH next to either install: the raw-hook and
#            reference tests and the benchmarks need it, the wheel lacks it.
# Then the test suite against each install with GPU skips turned into
# failures, compute-sanitizer (memcheck, racecheck, synccheck) on the kernels'
# self-tests, and the benchmarks (benchmarks/run.py, against the source
# install: built from this very tree, so the results are this commit's). Logs
# under $OUT, the benchmarks' result JSON and log in $OUT/bench_<ops>.tgz
# (`tar -xzf bench_all.tgz -C benchmarks results` puts them in
# benchmarks/results/; then run benchmarks/report.py), a short summary last;
# the exit status is non-zero if any step failed.
#   usage: bash scripts/gpu_check.sh [tests|sanitize|bench|ncu|multi]...
#   (default: tests sanitize bench; `multi` needs two GPUs)
#   INSTALLS (default "wheel source") picks the installs `tests` runs against;
#   the full suite takes about 5 min an install on an H100 (2026-11-23), so
#   within the device tool's 10-min call use one install a call:
#   INSTALLS=wheel bash scripts/gpu_check.sh tests; INSTALLS=source ... tests sanitize
#   TESTS, SELFTESTS and BENCH_OPS narrow a stage, e.g. TESTS=tests/test_im2col_gpu.py
#   SELFTESTS=im2col BENCH_OPS=im2col. CMAKE_ARGS=-DCMAKE_CUDA_ARCHITECTURES=90a-real
#   builds the source install for the H100/H200 alone (about a third of the
#   full build's time). bench runs `benchmarks/run.py all`
#   (about 6 min on an H100; ncu's DRAM bytes per broadcast method included),
#   ncu that step alone. The results name the commit: where this tree came
#   without .git, run `python benchmarks/run.py stamp` in the checkout and
#   bring benchmarks/tree_stamp.json along (git-ignored; the device tool's
#   carry); a dirty or unstamped tree is refused.
set -uo pipefail
OUT=${OUT:-/tmp/jax_tma_out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
stages=("$@"); [ ${#stages[@]} -eq 0 ] && stages=(tests sanitize bench)
summary=()
failed=0
# record RC TEXT: one summary line; a non-zero RC fails the whole check.
record() {
  summary+=("$([ "$1" -eq 0 ] && echo ok || echo FAIL) rc=$1: $2")
  [ "$1" -eq 0 ] || failed=1
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
env | grep -E '^(CC|CXX|CUDAHOSTCXX)=' || true

declare -A site=([wheel]=/tmp/jax_tma_wheel [source]=/tmp/jax_tma_source)
bench_site=/tmp/jax_tma_bench
wheel=$(ls dist/jax_tma-*cp312-abi3*.whl 2>/dev/null | head -1)
rm -rf "${site[wheel]}" "${site[source]}" "$bench_site"
if [ -n "$wheel" ]; then
  python3 -m pip install -q --no-deps --no-index --target "${site[wheel]}" "$wheel"
  record $? "install $(basename "$wheel")"
else
  record 1 "no dist/jax_tma-*cp312-abi3*.whl carried (scripts/build_dist.sh makes it)"
fi
JAX_TMA_CUDA=ON JAX_TMA_BENCH=ON SKBUILD_BUILD_DIR=/tmp/jax_tma_source_build python3 -m pip install -v \
  --no-build-isolation --no-deps --target "${site[source]}" . > "$OUT/source_build.log" 2>&1
record $? "source build: $(grep -E -- '-- jax_tma: (GNU|Clang)' "$OUT/source_build.log" | sed 's/.*-- //')"
# The benchmarks' extension out of the source install, so that each install
# is tested with it but neither shadows the other.
mkdir -p "$bench_site" && mv "${site[source]}"/_jax_tma_bench*.so "$bench_site"/
record $? "benchmarks' extension: $(ls "$bench_site")"
for install in wheel source; do
  # -P keeps the source tree off sys.path: the installed package is what runs.
  PYTHONPATH=${site[$install]}:$bench_site python3 -P -c \
    'import jax_tma, json, _jax_tma_bench; print(json.dumps(jax_tma.build_info())); print(jax_tma.__file__, _jax_tma_bench.__file__)'
done
export PYTHONPATH=${site[wheel]}:$bench_site

# bench NAME OPS...: benchmarks/run.py OPS against the source install, one
# result JSON per op, packed with the log into $OUT/bench_NAME.tgz (one
# file: the device tool brings back few).
bench() {
  local name=$1 dir=/tmp/jax_tma_bench_out
  shift
  rm -rf "$dir" && mkdir -p "$dir"
  PYTHONPATH=${site[source]}:$bench_site timeout 480 python3 -P benchmarks/run.py "$@" \
    --out-dir "$dir/results" > "$dir/bench.log" 2>&1
  local rc=$?
  grep -v "^WARNING" "$dir/bench.log" | tail -60
  # shellcheck disable=SC2046
  tar -czf "$OUT/bench_${name// /-}.tgz" -C "$dir" $(ls "$dir")
  record $rc "bench $name: $(grep -A12 '^== elapsed ==' "$dir/bench.log" | tail -n +2 | tr -s ' ' | tr '\n' ';')"
}

for stage in "${stages[@]}"; do
  case $stage in
  tests)
    for install in ${INSTALLS:-wheel source}; do
      log=$OUT/tests_$install.log
      PYTHONPATH=${site[$install]}:$bench_site JAX_TMA_REQUIRE_GPU=1 timeout 500 python3 -P -m pytest \
        ${TESTS:-tests} -q -rfE --durations=15 -p no:cacheprovider > "$log" 2>&1
      rc=$?
      tail -15 "$log"
      # The last line pytest wrote: JAX may print after it at exit.
      record $rc "tests ($install install): $(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed|error)' "$log" | tail -1)"
    done
    ;;
  sanitize)
    inc=$(python3 -c 'import jaxlib, os; print(os.path.join(os.path.dirname(jaxlib.__file__), "include"))')
    nvcc_args=(-std=c++17 -O2 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Iffi -isystem "$inc")
    declare -A sources=(
      [copy]="ffi/copy/bulk_copy.cu ffi/copy/simt_copy.cu ffi/copy/copy_cuda.cc ffi/copy/copy_plan.cc"
      [window]="ffi/window/tiled_window.cu ffi/window/simt_window.cu ffi/window/window_plan.cc ffi/cuda/tensor_map.cc"
      [broadcast]="ffi/broadcast/cluster_broadcast.cu ffi/broadcast/simt_broadcast.cu ffi/broadcast/broadcast_plan.cc ffi/cuda/tensor_map.cc"
      [im2col]="ffi/im2col/simt_im2col.cu ffi/im2col/tma_im2col.cu ffi/im2col/im2col_plan.cc ffi/cuda/tensor_map.cc"
      [gather]="ffi/gather/bulk_gather.cu ffi/gather/simt_gather.cu ffi/gather/gather_plan.cc ffi/gather/gather_cuda.cc"
    )
    # synccheck tracks a fixed number of mbarriers per block (CUDA 13.0);
    # below 64 it reported "Detected overflow of tracked cuda::barrier
    # structures" on 16-CTA clusters.
    sync_opts=(--num-cuda-barriers 64)
    largest_synccheck_cluster=16
    nvcc "${nvcc_args[@]}" tests/cuda/synccheck_cluster_probe.cu -o /tmp/synccheck_cluster_probe \
      >> "$OUT/selftest_build.log" 2>&1
    record $? "build synccheck_cluster_probe"
    if ! timeout 60 compute-sanitizer --tool synccheck "${sync_opts[@]}" \
        /tmp/synccheck_cluster_probe 16 > /tmp/probe.log 2>&1; then
      largest_synccheck_cluster=8
      summary+=("synccheck faults on tests/cuda/synccheck_cluster_probe.cu at cluster 16 (a tool limitation, see the file): broadcast synccheck on clusters up to 8: $(grep probe: /tmp/probe.log)")
    fi
    cat /tmp/probe.log >> "$OUT/sanitizer.log"
    for op in ${SELFTESTS:-copy window broadcast im2col gather}; do
      prog=${op}_selftest
      # shellcheck disable=SC2086
      nvcc "${nvcc_args[@]}" tests/cuda/$prog.cu ${sources[$op]} ffi/cuda/device_info.cc \
        -o /tmp/$prog >> "$OUT/selftest_build.log" 2>&1 \
        || { record 1 "$prog build"; continue; }
      /tmp/$prog > /tmp/selftest.log 2>&1
      rc=$?
      cat /tmp/selftest.log >> "$OUT/selftests.log"
      record $rc "$prog: $(tail -1 /tmp/selftest.log)"
      for tool in memcheck racecheck synccheck; do
        opts=()
        args=()
        [ "$tool" = synccheck ] && opts=("${sync_opts[@]}")
        [ "$op.$tool" = broadcast.synccheck ] && args=(all "$RANDOM" "$largest_synccheck_cluster")
        timeout 200 compute-sanitizer --tool "$tool" "${opts[@]}" --error-exitcode 9 /tmp/$prog \
          "${args[@]}" > /tmp/sanitizer.log 2>&1
        rc=$?
        cat /tmp/sanitizer.log >> "$OUT/sanitizer.log"
        record $rc "compute-sanitizer $tool $prog: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|_selftest:|overflow' /tmp/sanitizer.log | tr '\n' ' ')"
      done
    done
    ;;
  multi)
    # Two or more GPUs: the sharded-ops and ppermute tests, memcheck over the
    # peer-read path, and the ppermute benchmark against NCCL (its result
    # records nvidia-smi topo -m).
    nvidia-smi topo -m
    JAX_TMA_REQUIRE_GPU=1 JAX_TMA_REQUIRE_MULTI_GPU=1 timeout 300 python3 -P -m pytest \
      tests/test_multi_gpu.py tests/test_ppermute.py tests/test_sharding.py -q -rfE \
      -p no:cacheprovider > "$OUT/multi_tests.log" 2>&1
    rc=$?
    tail -15 "$OUT/multi_tests.log"
    record $rc "multi-GPU tests: $(tail -1 "$OUT/multi_tests.log")"
    JAX_TMA_REQUIRE_MULTI_GPU=1 timeout 300 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
      python3 -P -m pytest tests/test_multi_gpu.py -q -p no:cacheprovider \
      -k "ppermute_partial or (ppermute_matches_reference and bulk)" > /tmp/sanitizer.log 2>&1
    rc=$?
    cat /tmp/sanitizer.log >> "$OUT/sanitizer.log"
    record $rc "compute-sanitizer memcheck ppermute (2 GPUs): $(grep -E 'ERROR SUMMARY|passed|failed' /tmp/sanitizer.log | tr '\n' ' ')"
    bench ppermute ppermute
    ;;
  bench)
    # shellcheck disable=SC2086
    bench "${BENCH_OPS:-all}" ${BENCH_OPS:-all}
    ;;
  ncu)
    bench broadcast-ncu broadcast-ncu
    ;;
  esac
done

echo; echo "== summary =="
printf '%s\n' "${summary[@]}"
exit $failed
