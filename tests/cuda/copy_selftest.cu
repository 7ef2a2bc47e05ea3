// Standalone driver of the copy kernels for compute-sanitizer (memcheck,
// racecheck, synccheck), without JAX in the process: every method, source
// and destination misalignments, several pipeline shapes of both bulk
// schedules (the dynamic ones small enough that CTAs claim chunks at the
// larger sizes, on one counter slot reused by every case) and the static
// one's kernel of one chunk a CTA, poisoned
// destinations with guard bytes on both sides; and the counter-slot pool.
// Exit status 1 on any failure.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "copy/copy_launch.h"

namespace {

constexpr uint8_t kPoison = 0xA5;
constexpr std::size_t kGuard = 64;

bool Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
    return false;
  }
  return true;
}

// Copies n bytes src+so -> dst+d_o and verifies every byte of dst.
bool RunCase(jax_tma::Method method, std::size_t so, std::size_t d_o,
             std::size_t n, const jax_tma::BulkCopyConfig& config,
             std::mt19937_64& gen) {
  const std::size_t total = n + 2 * kGuard;
  std::vector<uint8_t> src(total), want(total, kPoison), got(total);
  for (auto& b : src) b = static_cast<uint8_t>(gen());
  for (std::size_t i = 0; i < n; ++i) want[d_o + i] = src[so + i];
  uint8_t *d_src = nullptr, *d_dst = nullptr;
  bool ok = Check(cudaMalloc(&d_src, total), "cudaMalloc") &&
            Check(cudaMalloc(&d_dst, total), "cudaMalloc") &&
            Check(cudaMemcpy(d_src, src.data(), total, cudaMemcpyHostToDevice), "H2D") &&
            Check(cudaMemset(d_dst, kPoison, total), "memset");
  if (ok) {
    const jax_tma::ByteCopy c{d_src + so, d_dst + d_o, n};
    jax_tma::DeviceInfo info;
    jax_tma::CopyPlan plan;
    xla::ffi::Error err = jax_tma::GetDeviceInfo(0, &info);
    if (err.success()) {
      err = jax_tma::PlanCopy("selftest", method, c, info, 0, jax_tma::kRawCounterSlot, &config,
                              &plan);
    }
    if (err.success()) err = jax_tma::LaunchCopy(plan, c, nullptr, 0);
    if (err.failure()) {
      std::fprintf(stderr, "launch failed: %s\n", err.message().c_str());
      ok = false;
    }
  }
  ok = ok && Check(cudaDeviceSynchronize(), "sync") &&
       Check(cudaMemcpy(got.data(), d_dst, total, cudaMemcpyDeviceToHost), "D2H");
  cudaFree(d_src);
  cudaFree(d_dst);
  if (ok && got != want) {
    std::fprintf(stderr, "mismatch: method=%d so=%zu do=%zu n=%zu stages=%d chunk=%u dynamic=%d\n",
                 static_cast<int>(method), so, d_o, n, config.stages, config.chunk_bytes,
                 static_cast<int>(config.dynamic));
    ok = false;
  }
  return ok;
}

// Every slot but the raw hook's can be taken once; then none is left until
// one is released.
int CheckSlotPool() {
  std::vector<int> taken;
  for (int slot = jax_tma::AcquireBulkCounterSlot(); slot != jax_tma::kNoCounterSlot;
       slot = jax_tma::AcquireBulkCounterSlot()) {
    taken.push_back(slot);
  }
  if (static_cast<int>(taken.size()) != jax_tma::kBulkCounterSlots - 1) {
    std::fprintf(stderr, "counter-slot pool: %zu slots taken\n", taken.size());
    return 1;
  }
  int failures = 0;
  const int back = taken.back();
  jax_tma::ReleaseBulkCounterSlot(back);
  failures += jax_tma::AcquireBulkCounterSlot() != back;
  failures += jax_tma::AcquireBulkCounterSlot() != jax_tma::kNoCounterSlot;
  for (int slot : taken) jax_tma::ReleaseBulkCounterSlot(slot);
  if (failures) std::fprintf(stderr, "counter-slot pool: release/acquire mismatch\n");
  return failures;
}

// The dynamic schedule without a counter slot is refused, naming the rule.
int CheckDynamicNeedsSlot() {
  uint8_t* buf = nullptr;
  if (!Check(cudaMalloc(&buf, 1 << 16), "cudaMalloc")) return 1;
  const xla::ffi::Error err = jax_tma::LaunchBulkCopy(
      buf, buf + (1 << 15), 1 << 15, nullptr, 0, jax_tma::kCopyDevicePlans[0].dynamic,
      jax_tma::kNoCounterSlot);
  cudaFree(buf);
  const std::string want = "the dynamic schedule needs a counter slot in [0, 1024), got -1";
  if (!err.failure() || err.message().find(want) == std::string::npos) {
    std::fprintf(stderr, "dynamic without a slot: got '%s'\n", err.message().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main() {
  std::mt19937_64 gen(std::random_device{}());
  const jax_tma::BulkCopyConfig configs[] = {
      jax_tma::kDefaultBulkCopyConfig, {1024, 2, 1}, {4096, 3, 7}, {65536, 4, 100},
      jax_tma::kCopyDevicePlans[0].dynamic, jax_tma::kCopyDevicePlans[1].dynamic,
      {1024, 2, 1, true}, {4096, 4, 1, true}};
  // 4099 and 40 KiB + 5: static plans of one chunk a CTA (BulkChunkKernel).
  const std::size_t sizes[] = {0, 1, 15, 16, 17, 4099, (40 << 10) + 5, 1 << 20,
                               (3 << 20) + 48, (9 << 20) + 5};
  int cases = 0, failures = 0;
  for (auto method : {jax_tma::Method::kTma, jax_tma::Method::kSimt, jax_tma::Method::kAuto}) {
    for (const auto& config : configs) {
      for (std::size_t n : sizes) {
        for (std::size_t so : {0, 3, 16}) {
          for (std::size_t d_o : {0, 3, 8}) {
            ++cases;
            failures += !RunCase(method, so, d_o, n, config, gen);
          }
        }
      }
    }
  }
  cases += 2;
  failures += CheckSlotPool();
  failures += CheckDynamicNeedsSlot();
  std::printf("copy_selftest: %d cases, %d failures\n", cases, failures);
  return failures == 0 ? 0 : 1;
}
