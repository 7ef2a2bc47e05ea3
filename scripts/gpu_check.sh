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
# The build comes first (both installs, and the kernels' standalone
# self-tests where quick or sanitize asks for them, compiled side by side),
# then the stages asked for, each timed; a stage with a budget fails when it
# runs over it (the build is outside every budget):
#  tests     the whole suite against each install, GPU skips turned into
#            failures (JAX_TMA_REQUIRE_GPU=1; JAX_TMA_REQUIRE_MULTI_GPU=1
#            too where two or more GPUs are visible), in parallel workers
#            (pytest-xdist) sharing the GPU: budget 180 s an install
#            (TESTS_BUDGET_S).
#  quick     after any kernel change: each family's self-test and the tests
#            marked quick (one GPU call per kernel path, one call across
#            processes sharing the GPU, every one-GPU kernel path replayed
#            from command buffers, both fuzz files under a shared
#            --fuzz-budget of 30 s): budget 120 s (QUICK_BUDGET_S).
#  sanitize  compute-sanitizer (memcheck, racecheck, synccheck) on the
#            self-tests, into a result file.
#  bench     benchmarks/run.py against the source install (built from this
#            very tree, so the results are this commit's), then one case,
#            `run.py wheel`, against the wheel, which must be built from the
#            same commit; ncu and multi run the benchmarks of run.py's groups
#            of those names (harness.Benchmark.group): ncu's profiles and
#            those of two GPUs (multi also runs test_multi_gpu.py, the
#            exchanges replayed from command buffers in
#            test_command_buffers.py, the processes on GPUs of their own in
#            test_ppermute_processes.py, and memcheck, then racecheck and
#            synccheck of the Peer* kernels: on one GPU over test_paths.py's
#            kernel paths, then over test_multi_gpu.py's memcheck-marked
#            tests).
# Logs under $OUT, the benchmarks' result JSON and log in
# $OUT/bench_<ops>.tgz and the sanitizers' result JSON in
# $OUT/bench_sanitize.tgz (`tar -xzf bench_all.tgz -C benchmarks results` and
# `tar -xzf bench_sanitize.tgz -C benchmarks results` put them in
# benchmarks/results/; then run benchmarks/report.py), a summary with each
# stage's wall time last; the exit status is non-zero if any step failed.
#   usage: bash scripts/gpu_check.sh [tests|quick|sanitize|bench|ncu|multi]...
#   (default: tests sanitize bench; `multi` needs two GPUs)
#   INSTALLS (default "wheel source") picks the installs `tests` runs against,
#   TEST_WORKERS the workers of tests and quick (default: the CPU count less
#   2, at most 14). TESTS,
#   SELFTESTS and BENCH_OPS narrow a stage, e.g. TESTS=tests/test_<family>.py
#   SELFTESTS=<family> BENCH_OPS=<op> (WHEEL_CASE=0 leaves out the wheel's
#   case). CMAKE_ARGS=-DCMAKE_CUDA_ARCHITECTURES=90a-real builds the source
#   install for the H100/H200 alone (about a third of the full build's time).
#   docs/development.md says which tier to run when and what each costs. The
#   results name the commit: where this tree came without .git, run
#   `python benchmarks/run.py stamp` in the checkout and bring
#   benchmarks/tree_stamp.json along (git-ignored; the device tool's carry);
#   a dirty or unstamped tree is refused.
set -uo pipefail
OUT=${OUT:-/tmp/jax_tma_out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
stages=("$@"); [ ${#stages[@]} -eq 0 ] && stages=(tests sanitize bench)
summary=()
times=()
failed=0
# record RC TEXT: one summary line; a non-zero RC fails the whole check.
record() {
  summary+=("$([ "$1" -eq 0 ] && echo ok || echo FAIL) rc=$1: $2")
  [ "$1" -eq 0 ] || failed=1
}
# within_budget NAME START BUDGET_S: the wall time since START (a $SECONDS),
# recorded as a failure when over BUDGET_S.
within_budget() {
  local took=$((SECONDS - $2))
  times+=("$1: ${took} s (budget $3 s)")
  [ "$took" -le "$3" ]
  record $? "$1 took ${took} s of its ${3} s budget"
}
wants() { [[ " ${stages[*]} " == *" $1 "* ]]; }
for stage in "${stages[@]}"; do
  case $stage in
  tests | quick | sanitize | bench | ncu | multi) ;;
  *) echo "gpu_check.sh: unknown stage '$stage' (tests, quick, sanitize, bench, ncu, multi)" >&2; exit 2 ;;
  esac
done
build_start=$SECONDS

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

# Each family's standalone kernel self-test (tests/cuda/<family>_selftest.cu),
# linked with the sources its manifest lists (JAX_TMA_SOURCES(SELFTEST, ...)
# in ffi/<family>/manifest.inc; the families come from ffi/families.inc), into
# $selftest_dir: the quick and sanitize stages run them.
selftest_dir=/tmp/jax_tma_selftests
inc=$(python3 -c 'import jaxlib, os; print(os.path.join(os.path.dirname(jaxlib.__file__), "include"))')
nvcc_args=(-std=c++17 -O2 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Iffi -isystem "$inc")
families=$(sed -n 's|^#include "\([a-z0-9_]*\)/manifest.inc"$|\1|p' ffi/families.inc)
selftests=()
selftest_pids=()
# start_selftest_builds: each build in the background (the source build
# runs meanwhile); finish_selftest_builds waits for them and lists in
# $selftests the programs that built.
start_selftest_builds() {
  local family line sources
  rm -rf "$selftest_dir" && mkdir -p "$selftest_dir"
  nvcc "${nvcc_args[@]}" tests/cuda/synccheck_cluster_probe.cu -o "$selftest_dir/synccheck_cluster_probe" \
    > "$selftest_dir/synccheck_cluster_probe.log" 2>&1 &
  selftest_pids+=("$!:synccheck_cluster_probe")
  for family in ${SELFTESTS:-$families}; do
    line=$(sed -n 's/^JAX_TMA_SOURCES(SELFTEST, "\(.*\)")$/\1/p' "ffi/$family/manifest.inc")
    [ -n "$line" ] || continue  # its manifest says why it has none (JAX_TMA_NO_SELFTEST)
    sources=$(for f in $line; do realpath -m --relative-to=. "ffi/$family/$f"; done | tr '\n' ' ')
    # shellcheck disable=SC2086
    nvcc "${nvcc_args[@]}" "tests/cuda/${family}_selftest.cu" $sources ffi/cuda/device_info.cc \
      -o "$selftest_dir/${family}_selftest" > "$selftest_dir/${family}_selftest.log" 2>&1 &
    selftest_pids+=("$!:${family}_selftest")
  done
}
finish_selftest_builds() {
  local job rc
  for job in "${selftest_pids[@]}"; do
    wait "${job%%:*}"
    rc=$?
    cat "$selftest_dir/${job#*:}.log" >> "$OUT/selftest_build.log"
    record $rc "build ${job#*:}"
    [ $rc -ne 0 ] || [ "${job#*:}" = synccheck_cluster_probe ] || selftests+=("${job#*:}")
  done
}
if wants quick || wants sanitize; then start_selftest_builds; fi
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
finish_selftest_builds
times+=("build: $((SECONDS - build_start)) s (no budget)")

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

# parallel_pytest SITE WORKERS LOG PYTEST_ARGS... -- PREFIX...: pytest of
# WORKERS pytest-xdist workers sharing the GPU (0: one process, no workers)
# against the install at SITE, GPU skips turned into failures, under PREFIX
# (env settings, a timeout), appended to LOG, a line a test; prints the
# failures, the crashes with the test (and the seed that replays it) each
# crashed worker was running (a worker that aborts loses its report:
# JAX_TMA_SEED_DIR keeps it), and returns pytest's status (no test
# selected counts as a pass). The GPU's memory is taken as needed, not
# preallocated. glibc's fatal messages go to stderr (LIBC_FATAL_STDERR_),
# not to a terminal there is none of. The GPUs' memory in use, and each
# process's, every 2 s, goes to $OUT/gpu_memory.log.
# Workers: the CPU count less 2, at most 14 (they share GPU 0's memory).
workers=${TEST_WORKERS:-$(( $(nproc) > 16 ? 14 : $(nproc) > 4 ? $(nproc) - 2 : 2 ))}
parallel_pytest() {
  local site_dir=$1 n=$2 log=$3 args=() rc worker seeds=/tmp/jax_tma_seeds
  shift 3
  while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
  shift
  rm -rf "$seeds" && mkdir -p "$seeds"
  echo "== $(basename "$log") ${args[*]}" >> "$OUT/gpu_memory.log"
  while true; do
    nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total --format=csv,noheader
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ';'
    echo
    sleep 2
  done >> "$OUT/gpu_memory.log" 2>&1 &
  local sampler=$!
  local start_line=1
  [ -f "$log" ] && start_line=$(($(wc -l < "$log") + 1))
  env PYTHONPATH="$site_dir:$bench_site" JAX_TMA_REQUIRE_GPU=1 XLA_PYTHON_CLIENT_PREALLOCATE=false \
    LIBC_FATAL_STDERR_=1 JAX_TMA_SEED_DIR="$seeds" "$@" python3 -P -m pytest -n "$n" -v -rfE \
    -p no:cacheprovider "${args[@]}" >> "$log" 2>&1
  rc=$?
  kill "$sampler" 2>/dev/null
  [ $rc -eq 5 ] && rc=0
  # Each test's line as it ends (-v): what failed shows also when the run
  # was cut short, before pytest's summary.
  tail -n "+$start_line" "$log" | grep -E '\] (FAILED|ERROR) |Fatal Python error|^(LLVM ERROR|terminate called|F[0-9]{4} |[a-z_]+\(\): )' | head -30
  for worker in $(tail -n "+$start_line" "$log" | sed -n 's/^replacing crashed worker \(gw[0-9]*\)$/\1/p'); do
    echo "  $worker crashed in $(cat "$seeds/$worker" 2>/dev/null || echo 'no test: it had not begun one')"
  done
  return $rc
}

for stage in "${stages[@]}"; do
  stage_start=$SECONDS
  case $stage in
  tests)
    # The whole suite against each install in one pytest of parallel workers
    # sharing the GPU (memory taken as needed, not preallocated). A worker
    # that aborts (XLA ends the process on some compiler failures) is named
    # with its test by pytest-xdist and replaced; the others go on.
    multi=()
    [ "$(nvidia-smi -L | grep -c '^GPU ')" -ge 2 ] && multi=(JAX_TMA_REQUIRE_MULTI_GPU=1)
    for install in ${INSTALLS:-wheel source}; do
      log=$OUT/tests_$install.log
      rm -f "$log"
      start=$SECONDS
      # The tests of several GiB first, in one process that then exits: an
      # allocator keeps what it grew to (61 GiB for these on an H100), which
      # beside 14 workers ran an 80 GB GPU out of memory.
      # shellcheck disable=SC2086
      parallel_pytest "${site[$install]}" 0 "$log" -m big_gpu_memory ${TESTS:-tests} \
        -- "${multi[@]}" timeout 120
      rc=$?
      record $rc "tests of several GiB ($install install): $(grep -E '^=* ?[0-9]+ (passed|failed|skipped|errors?|deselected)' "$log" | tail -1)"
      # shellcheck disable=SC2086
      parallel_pytest "${site[$install]}" "$workers" "$log" -m "not big_gpu_memory" ${TESTS:-tests} \
        --durations=15 -- "${multi[@]}" timeout $((2 * ${TESTS_BUDGET_S:-180}))
      rc=$?
      # The last line pytest wrote: JAX may print after it at exit.
      record $rc "tests ($install install, ${workers} workers${multi[0]:+, multi-GPU required}): $(grep -E '^=* ?[0-9]+ (passed|failed|skipped|errors?)' "$log" | tail -1)"
      within_budget "tests ($install install)" "$start" "${TESTS_BUDGET_S:-180}"
    done
    ;;
  quick)
    # After any kernel change: every self-test, then the tests marked quick
    # (one GPU call per kernel path in tests/test_paths.py, one call across
    # processes sharing the GPU, the command-buffer replay of every one-GPU
    # path, and both fuzz files sharing 30 s); the whole
    # suite (tests) before an issue that changed kernels is resolved.
    start=$SECONDS
    for prog in "${selftests[@]}"; do
      "$selftest_dir/$prog" > /tmp/selftest.log 2>&1
      rc=$?
      cat /tmp/selftest.log >> "$OUT/selftests.log"
      record $rc "$prog: $(tail -1 /tmp/selftest.log)"
    done
    log=$OUT/quick_tests.log
    rm -f "$log"
    parallel_pytest "${site[source]}" "$workers" "$log" -m quick --fuzz-budget 30 tests \
      -- timeout $((2 * ${QUICK_BUDGET_S:-120}))
    rc=$?
    record $rc "quick tests (source install): $(grep -E '^=* ?[0-9]+ (passed|failed|skipped|errors?)' "$log" | tail -1)"
    within_budget quick "$start" "${QUICK_BUDGET_S:-120}"
    ;;
  sanitize)
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
    timeout 60 compute-sanitizer --tool synccheck "${sync_opts[@]}" \
      "$selftest_dir/synccheck_cluster_probe" 16 > /tmp/probe.log 2>&1
    rc=$?
    printf 'probe\tsynccheck\t%s\t16\t%s\n' "$rc" \
      "$(grep -E 'probe:|ERROR SUMMARY' /tmp/probe.log | tr '\t\n' '  ')" >> "$tsv"
    if [ "$rc" -ne 0 ]; then
      largest_synccheck_cluster=8
      summary+=("synccheck faults on tests/cuda/synccheck_cluster_probe.cu at cluster 16 (a tool limitation, see the file): the self-tests run synccheck on clusters up to 8: $(grep probe: /tmp/probe.log)")
    fi
    printf 'largest_synccheck_cluster\t%s\n' "$largest_synccheck_cluster" >> "$tsv"
    cat /tmp/probe.log >> "$OUT/sanitizer.log"
    for prog in "${selftests[@]}"; do
      "$selftest_dir/$prog" > /tmp/selftest.log 2>&1
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
          "$selftest_dir/$prog" > /tmp/sanitizer.log 2>&1
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
    # Two or more GPUs: the multi-GPU tests (and the exchanges' command-buffer
    # replay, and the processes of test_ppermute_processes.py on GPUs of their
    # own), memcheck over those marked for it, and the benchmarks of run.py's
    # group multi (their results record nvidia-smi topo -m, as topology.txt
    # records it beside the tests' log).
    nvidia-smi topo -m | tee "$OUT/topology.txt"
    # A test that the topology rules out (one that needs a GPU pair without
    # peer access, on a host where every pair has it) skips with its reason,
    # which goes to the summary.
    # Against the source install (built from this tree, as the benchmarks are).
    PYTHONPATH=${site[source]}:$bench_site JAX_TMA_REQUIRE_GPU=1 JAX_TMA_REQUIRE_MULTI_GPU=1 \
      timeout 420 python3 -P -m pytest \
      tests/test_multi_gpu.py tests/test_command_buffers.py::test_exchanges_replay_from_command_buffers \
      tests/test_ppermute_processes.py::test_processes_on_gpus_of_their_own \
      -q -rfEs -p no:cacheprovider > "$OUT/multi_tests.log" 2>&1
    rc=$?
    tail -15 "$OUT/multi_tests.log"
    record $rc "multi-GPU tests: $(tail -1 "$OUT/multi_tests.log")"
    while read -r line; do summary+=("not run: $line"); done \
      < <(grep -E '^SKIPPED' "$OUT/multi_tests.log")
    # On two GPUs: under memcheck (2026-11-28) and racecheck (2026-11-29)
    # on 4 x H200, the first memcheck-marked all_to_all test's waiting kernel
    # timed out (30 s) and trapped; the same tests pass without the tools.
    # Under the tools the peers' waits get SANITIZER_PEER_TIMEOUT_S (default
    # 120 s), so that a slow instrumented peer is told from one that never
    # comes (set CUDA_VISIBLE_DEVICES=0,1,2,3 to run them on four).
    export JAX_TMA_PPERMUTE_TIMEOUT_S=${SANITIZER_PEER_TIMEOUT_S:-120}
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1} PYTHONPATH=${site[source]}:$bench_site \
      JAX_TMA_REQUIRE_MULTI_GPU=1 timeout 300 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
      python3 -P -m pytest tests/test_multi_gpu.py -q -p no:cacheprovider -m memcheck \
      > /tmp/sanitizer.log 2>&1
    rc=$?
    cat /tmp/sanitizer.log >> "$OUT/sanitizer.log"
    record $rc "compute-sanitizer memcheck on the memcheck-marked multi-GPU tests: $(grep -E 'ERROR SUMMARY|passed|failed' /tmp/sanitizer.log | tr '\n' ' ')"
    # The peer kernels on one GPU, each exchange on a one-device mesh (the
    # kernel paths of tests/test_paths.py, the Peer* kernels instrumented),
    # under the three tools: on two GPUs of one process racecheck can leave
    # one GPU's instrumented meet waiting for a publish that never comes
    # (2 x H200, 2026-11-29: 120 s, where the same tests pass without the
    # tool and under synccheck), so one GPU is where racecheck's word on
    # them is had for sure.
    for tool in memcheck racecheck synccheck; do
      CUDA_VISIBLE_DEVICES=0 PYTHONPATH=${site[source]}:$bench_site JAX_TMA_REQUIRE_GPU=1 \
        XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_enable_command_buffer=" \
        timeout 200 compute-sanitizer --tool $tool --kernel-name kns=Peer \
        --report-api-errors no --error-exitcode 9 \
        python3 -P -m pytest tests/test_paths.py -q -p no:cacheprovider \
        > /tmp/sanitizer.log 2>&1
      rc=$?
      cat /tmp/sanitizer.log >> "$OUT/sanitizer.log"
      record $rc "compute-sanitizer $tool (Peer* kernels, one GPU, command buffers off) on the one-GPU kernel paths: $( [ $rc -ge 128 ] && echo "the tool crashed (signal $((rc - 128))); ")$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failed' /tmp/sanitizer.log | tr '\n' ' ')"
    done
    # racecheck and synccheck over the memcheck-marked multi-GPU tests, the
    # peer kernels alone instrumented (XLA's are not ours to check) and XLA's
    # command buffers off: inside CUDA graphs both tools crashed in some runs
    # on one H200 (2026-11-29, a segfault and no report; benchmarks/TUNING.md,
    # "The peer kernels under racecheck and synccheck"). A crash is recorded
    # as one.
    for tool in racecheck synccheck; do
      CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1} PYTHONPATH=${site[source]}:$bench_site \
        XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_enable_command_buffer=" \
        JAX_TMA_REQUIRE_MULTI_GPU=1 timeout 300 compute-sanitizer --tool $tool --kernel-name kns=Peer \
        --report-api-errors no --error-exitcode 9 \
        python3 -P -m pytest tests/test_multi_gpu.py -q -p no:cacheprovider -m memcheck \
        > /tmp/sanitizer.log 2>&1
      rc=$?
      cat /tmp/sanitizer.log >> "$OUT/sanitizer.log"
      record $rc "compute-sanitizer $tool (Peer* kernels, command buffers off) on the memcheck-marked multi-GPU tests: $( [ $rc -ge 128 ] && echo "the tool crashed (signal $((rc - 128))); ")$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failed' /tmp/sanitizer.log | tr '\n' ' ')"
    done
    unset JAX_TMA_PPERMUTE_TIMEOUT_S
    # shellcheck disable=SC2086
    bench multi ${BENCH_OPS:-multi}
    ;;
  bench)
    # shellcheck disable=SC2086
    WHEEL_CASE=${WHEEL_CASE:-1} bench "${BENCH_OPS:-all}" ${BENCH_OPS:-all}
    ;;
  ncu)
    bench ncu ncu
    ;;
  esac
  [[ "$stage" == tests || "$stage" == quick ]] || times+=("$stage: $((SECONDS - stage_start)) s (no budget)")
done

echo; echo "== summary =="
printf '%s\n' "${summary[@]}"
echo; echo "== wall time =="
printf '%s\n' "${times[@]}"
exit $failed
