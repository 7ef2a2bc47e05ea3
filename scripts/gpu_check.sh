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
# install: built from this very tree, so the results are this commit's; then
# one case, `run.py wheel`, against the wheel, which must be built from the
# same commit). Logs under $OUT, the benchmarks' result JSON and log in
# $OUT/bench_<ops>.tgz and the sanitizers' result JSON in
# $OUT/bench_sanitize.tgz (`tar -xzf bench_all.tgz -C benchmarks results` and
# `tar -xzf bench_sanitize.tgz -C benchmarks results` put them in
# benchmarks/results/; then run benchmarks/report.py), a short summary last;
# the exit status is non-zero if any step failed.
#   usage: bash scripts/gpu_check.sh [tests|sanitize|bench|ncu|multi]...
#   (default: tests sanitize bench; `multi` needs two GPUs)
#   INSTALLS (default "wheel source") picks the installs `tests` runs against;
#   the full suite took about 11 min for one install on an H100 (2026-11-26),
#   so within the device tool's 10-min call run one install and half the test
#   files a call: TESTS_PART=1/2 INSTALLS=source bash scripts/gpu_check.sh tests,
#   then TESTS_PART=2/2 (part k of n: every n-th file, from the k-th).
#   `tests` runs one pytest per test file: $OUT/tests_<install>.log has a
#   line per file (and its failures), tests_<install>.tgz each file's output.
#   TESTS, SELFTESTS and BENCH_OPS narrow a stage, e.g. TESTS=tests/test_<family>.py
#   SELFTESTS=<family> BENCH_OPS=<op> (WHEEL_CASE=0 leaves out the wheel's case).
#   CMAKE_ARGS=-DCMAKE_CUDA_ARCHITECTURES=90a-real builds the source install
#   for the H100/H200 alone (about a third of the full build's time). bench
#   runs `benchmarks/run.py all` (about 4 min on an H100 after the source
#   build) and `run.py wheel` on the wheel (under a minute); ncu and multi run
#   the benchmarks of run.py's groups of those names (harness.Benchmark.group):
#   ncu's profiles and those of two GPUs. The results name the commit: where this tree came
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
# What each result names as the install it measured (provenance.install).
declare -A install_label=(
  [source]="source build on this machine (pip install --no-build-isolation; $(grep -E -- '-- jax_tma: (GNU|Clang)' "$OUT/source_build.log" | sed 's/.*-- jax_tma: //' | head -1)${CMAKE_ARGS:+; $CMAKE_ARGS})"
  [wheel]="wheel ${wheel:+$(basename "$wheel")}")
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
# result JSON per op (and, with WHEEL_CASE=1, `run.py wheel` against the
# wheel into the same folder), packed with the logs into $OUT/bench_NAME.tgz
# (one file: the device tool brings back few).
bench() {
  local name=$1 dir=/tmp/jax_tma_bench_out
  shift
  rm -rf "$dir" && mkdir -p "$dir"
  PYTHONPATH=${site[source]}:$bench_site JAX_TMA_INSTALL="${install_label[source]}" timeout 480 \
    python3 -P benchmarks/run.py "$@" --out-dir "$dir/results" > "$dir/bench.log" 2>&1
  local rc=$?
  grep -v "^WARNING" "$dir/bench.log" | tail -60
  if [ "${WHEEL_CASE:-0}" = 1 ]; then
    PYTHONPATH=${site[wheel]}:$bench_site JAX_TMA_INSTALL="${install_label[wheel]}" timeout 150 \
      python3 -P benchmarks/run.py wheel --out-dir "$dir/results" > "$dir/bench_wheel.log" 2>&1
    local wrc=$?
    grep -v "^WARNING" "$dir/bench_wheel.log" | tail -8
    record $wrc "bench wheel (one case on $(basename "${wheel:-no wheel}")): $(grep -A3 '^== elapsed ==' "$dir/bench_wheel.log" | tail -n +2 | tr -s ' ' | tr '\n' ';')"
  fi
  # shellcheck disable=SC2046
  tar -czf "$OUT/bench_${name// /-}.tgz" -C "$dir" $(ls "$dir")
  record $rc "bench $name: $(grep -A12 '^== elapsed ==' "$dir/bench.log" | tail -n +2 | tr -s ' ' | tr '\n' ';')"
}

for stage in "${stages[@]}"; do
  case $stage in
  tests)
    # One pytest process per test file: a file whose process aborts (XLA
    # ends the process on some compiler failures, and pytest's report with
    # it) is named, and the other files still run and report. Each file's
    # summary line goes to the log, its output to tests_<install>/<file>.log.
    for install in ${INSTALLS:-wheel source}; do
      log=$OUT/tests_$install.log
      mkdir -p "$OUT/tests_$install"
      : > "$log"
      rc=0
      files=0
      # A file may take 450 s (the longest took about 5 min on an H200).
      part=${TESTS_PART:-1/1}
      # shellcheck disable=SC2086
      for file in $(ls -d ${TESTS:-tests/test_*.py} | awk -v k="${part%/*}" -v n="${part#*/}" \
          'NR % n == k % n'); do
        name=$(basename "$file" .py)
        files=$((files + 1))
        PYTHONPATH=${site[$install]}:$bench_site JAX_TMA_REQUIRE_GPU=1 timeout 450 python3 -P -m pytest \
          "$file" -q -rfE --durations=5 -p no:cacheprovider > "$OUT/tests_$install/$name.log" 2>&1
        file_rc=$?
        [ $file_rc -eq 0 ] || [ $file_rc -eq 5 ] || rc=$file_rc  # 5: nothing collected
        # The last line pytest wrote: JAX may print after it at exit.
        printf '%s rc=%s: %s\n' "$name" "$file_rc" "$(grep -E '^[0-9]+ (passed|failed|skipped|errors?)|^=+ .*(passed|failed|error|skipped)' \
          "$OUT/tests_$install/$name.log" | tail -1)" >> "$log"
        [ $file_rc -eq 0 ] || grep -E '^(FAILED|ERROR) |Fatal Python error' "$OUT/tests_$install/$name.log" \
          | head -20 >> "$log"
      done
      tar -czf "$OUT/tests_$install.tgz" -C "$OUT" "tests_$install" && rm -rf "$OUT/tests_$install"
      grep -v ' rc=0: ' "$log" | tail -30
      totals=$(grep -E '^test_[a-z0-9_]+ rc=[0-9]+: ' "$log" | grep -oE '[0-9]+ (passed|failed|skipped|errors?)' \
        | awk '{n[$2] += $1} END {for (k in n) printf "%d %s, ", n[k], k}')
      record $rc "tests ($install install): ${totals}$files files"
    done
    ;;
  sanitize)
    inc=$(python3 -c 'import jaxlib, os; print(os.path.join(os.path.dirname(jaxlib.__file__), "include"))')
    nvcc_args=(-std=c++17 -O2 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Iffi -isystem "$inc")
    # Each family's self-test links the sources its manifest lists
    # (JAX_TMA_SOURCES(SELFTEST, ...) in ffi/<family>/manifest.inc); the
    # families come from ffi/families.inc.
    families=$(sed -n 's|^#include "\([a-z0-9_]*\)/manifest.inc"$|\1|p' ffi/families.inc)
    declare -A sources=()
    for family in $families; do
      line=$(sed -n 's/^JAX_TMA_SOURCES(SELFTEST, "\(.*\)")$/\1/p' "ffi/$family/manifest.inc")
      [ -n "$line" ] || continue  # its manifest says why it has none (JAX_TMA_NO_SELFTEST)
      sources[$family]=$(for f in $line; do realpath -m --relative-to=. "ffi/$family/$f"; done | tr '\n' ' ')
    done
    # synccheck tracks a fixed number of mbarriers per block (CUDA 13.0);
    # below 64 it reported "Detected overflow of tracked cuda::barrier
    # structures" on 16-CTA clusters.
    sync_opts=(--num-cuda-barriers 64)
    largest_synccheck_cluster=16
    # One line per run for benchmarks/run.py sanitizer (benchmarks/sanitizer.py).
    tsv=$OUT/sanitizer.tsv
    : > "$tsv"
    printf 'nvcc\t%s\n' "$(nvcc --version | tail -1)" >> "$tsv"
    printf 'compute-sanitizer\t%s\n' "$(compute-sanitizer --version | grep -i version | head -1)" >> "$tsv"
    nvcc "${nvcc_args[@]}" tests/cuda/synccheck_cluster_probe.cu -o /tmp/synccheck_cluster_probe \
      >> "$OUT/selftest_build.log" 2>&1
    record $? "build synccheck_cluster_probe"
    timeout 60 compute-sanitizer --tool synccheck "${sync_opts[@]}" \
      /tmp/synccheck_cluster_probe 16 > /tmp/probe.log 2>&1
    rc=$?
    printf 'probe\tsynccheck\t%s\t16\t%s\n' "$rc" \
      "$(grep -E 'probe:|ERROR SUMMARY' /tmp/probe.log | tr '\t\n' '  ')" >> "$tsv"
    if [ "$rc" -ne 0 ]; then
      largest_synccheck_cluster=8
      summary+=("synccheck faults on tests/cuda/synccheck_cluster_probe.cu at cluster 16 (a tool limitation, see the file): the self-tests run synccheck on clusters up to 8: $(grep probe: /tmp/probe.log)")
    fi
    printf 'largest_synccheck_cluster\t%s\n' "$largest_synccheck_cluster" >> "$tsv"
    cat /tmp/probe.log >> "$OUT/sanitizer.log"
    for op in ${SELFTESTS:-$families}; do
      [ -n "${sources[$op]:-}" ] || continue
      prog=${op}_selftest
      # shellcheck disable=SC2086
      nvcc "${nvcc_args[@]}" tests/cuda/$prog.cu ${sources[$op]} ffi/cuda/device_info.cc \
        -o /tmp/$prog >> "$OUT/selftest_build.log" 2>&1 \
        || { record 1 "$prog build"; continue; }
      /tmp/$prog > /tmp/selftest.log 2>&1
      rc=$?
      cat /tmp/selftest.log >> "$OUT/selftests.log"
      record $rc "$prog: $(tail -1 /tmp/selftest.log)"
      printf '%s\trun\t%s\t\t%s\n' "$prog" "$rc" "$(tail -1 /tmp/selftest.log | tr '\t' ' ')" >> "$tsv"
      for tool in memcheck racecheck synccheck; do
        opts=()
        limit=()
        # Under synccheck a self-test with clusters keeps them within what the
        # tool tracks (JAX_TMA_SELFTEST_MAX_CLUSTER).
        [ "$tool" = synccheck ] && opts=("${sync_opts[@]}") \
          && limit=(env "JAX_TMA_SELFTEST_MAX_CLUSTER=$largest_synccheck_cluster")
        timeout 200 "${limit[@]}" compute-sanitizer --tool "$tool" "${opts[@]}" --error-exitcode 9 \
          /tmp/$prog > /tmp/sanitizer.log 2>&1
        rc=$?
        cat /tmp/sanitizer.log >> "$OUT/sanitizer.log"
        line=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|_selftest:|overflow' /tmp/sanitizer.log | tr '\t\n' '  ')
        record $rc "compute-sanitizer $tool $prog: $line"
        printf '%s\t%s\t%s\t%s\t%s\n' "$prog" "$tool" "$rc" "${limit[1]:-}" "$line" >> "$tsv"
      done
    done
    # The lines as a result file (provenance: this tree's commit, the GPU),
    # packed like a benchmark's: tar -xzf bench_sanitize.tgz -C benchmarks results
    sdir=/tmp/jax_tma_sanitize_out
    rm -rf "$sdir" && mkdir -p "$sdir" && cp "$tsv" "$sdir/"
    PYTHONPATH=${site[source]}:$bench_site JAX_TMA_INSTALL="${install_label[source]}" \
      python3 -P benchmarks/run.py sanitizer --tsv "$tsv" --out-dir "$sdir/results" \
      > "$sdir/sanitizer_result.log" 2>&1
    rc=$?
    tail -3 "$sdir/sanitizer_result.log"
    record $rc "sanitizer result file: $(ls "$sdir/results" 2>/dev/null)"
    tar -czf "$OUT/bench_sanitize.tgz" -C "$sdir" results sanitizer.tsv sanitizer_result.log
    ;;
  multi)
    # Two or more GPUs: the multi-GPU tests, memcheck over those marked for
    # it, and the benchmarks of run.py's group multi (their results record
    # nvidia-smi topo -m).
    nvidia-smi topo -m
    # A test that the topology rules out (one that needs a GPU pair without
    # peer access, on a host where every pair has it) skips with its reason,
    # which goes to the summary.
    JAX_TMA_REQUIRE_GPU=1 JAX_TMA_REQUIRE_MULTI_GPU=1 timeout 300 python3 -P -m pytest \
      tests/test_multi_gpu.py -q -rfEs -p no:cacheprovider > "$OUT/multi_tests.log" 2>&1
    rc=$?
    tail -15 "$OUT/multi_tests.log"
    record $rc "multi-GPU tests: $(tail -1 "$OUT/multi_tests.log")"
    while read -r line; do summary+=("not run: $line"); done \
      < <(grep -E '^SKIPPED' "$OUT/multi_tests.log")
    JAX_TMA_REQUIRE_MULTI_GPU=1 timeout 300 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
      python3 -P -m pytest tests/test_multi_gpu.py -q -p no:cacheprovider -m memcheck \
      > /tmp/sanitizer.log 2>&1
    rc=$?
    cat /tmp/sanitizer.log >> "$OUT/sanitizer.log"
    record $rc "compute-sanitizer memcheck on the memcheck-marked multi-GPU tests: $(grep -E 'ERROR SUMMARY|passed|failed' /tmp/sanitizer.log | tr '\n' ' ')"
    bench multi multi
    ;;
  bench)
    # shellcheck disable=SC2086
    WHEEL_CASE=${WHEEL_CASE:-1} bench "${BENCH_OPS:-all}" ${BENCH_OPS:-all}
    ;;
  ncu)
    bench ncu ncu
    ;;
  esac
done

echo; echo "== summary =="
printf '%s\n' "${summary[@]}"
exit $failed
