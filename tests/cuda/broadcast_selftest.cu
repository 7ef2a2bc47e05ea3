// Standalone driver of the broadcast kernels (TMA store, multicast and dsmem
// at every cluster size, SIMT) for compute-sanitizer, without JAX: random
// geometries (tiles hanging over the array's edges, n not a multiple of the
// cluster size) checked byte for byte against the host evaluation of
// broadcast_common.h, destinations poisoned. Exit status 1 on any mismatch
// or launch error; a failing case is printed in full, and a sticky CUDA
// error (a fault that kills the context) stops the run at that case.
//   usage: broadcast_selftest [store|multicast|dsmem|simt|all] [seed] [largest cluster size]
// The largest cluster size defaults to JAX_TMA_SELFTEST_MAX_CLUSTER where it
// is set (scripts/gpu_check.sh sets it under synccheck, which tracks clusters
// only up to a size), else 16.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "broadcast/broadcast_launch.h"

namespace {

using jax_tma::BroadcastGeometry;
using jax_tma::BroadcastMethod;

bool Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
  return err == cudaSuccess;
}

// Runs one geometry through `method` with `cluster` CTAs per cluster.
bool RunCase(BroadcastGeometry g, BroadcastMethod method, int cluster, std::mt19937_64& gen) {
  std::vector<uint8_t> src(g.outer * g.inner_bytes);
  for (auto& v : src) v = static_cast<uint8_t>(gen());
  std::vector<uint8_t> want(src.size() * g.n);
  for (int64_t o = 0; o < g.outer; ++o) {
    for (int64_t k = 0; k < g.n; ++k) {
      std::memcpy(want.data() + (o * g.n + k) * g.inner_bytes, src.data() + o * g.inner_bytes,
                  g.inner_bytes);
    }
  }
  uint8_t *d_src = nullptr, *d_dst = nullptr;
  bool ok = Check(cudaMalloc(&d_src, src.size() + 16), "malloc") &&
            Check(cudaMalloc(&d_dst, want.size() + 16), "malloc") &&
            Check(cudaMemcpy(d_src, src.data(), src.size(), cudaMemcpyHostToDevice), "h2d") &&
            Check(cudaMemset(d_dst, 0xA5, want.size() + 16), "memset");
  g.src = d_src;
  g.dst = d_dst;
  g.method = method;
  // The plan of `method` where its TMA kernel fits, else of "simt", which
  // then covers this geometry.
  jax_tma::BroadcastPlan plan;
  jax_tma::DeviceInfo info;
  ok = ok && !jax_tma::GetDeviceInfo(0, &info).failure();
  g.cluster_size = cluster;
  bool tma = ok && method != BroadcastMethod::kSimt &&
             jax_tma::PlanBroadcast(g, info, 0, &plan).success();
  if (ok && !tma) {
    g.method = BroadcastMethod::kSimt;
    ok = jax_tma::PlanBroadcast(g, info, 0, &plan).success();
  }
  if (ok) {
    xla::ffi::Error err = jax_tma::LaunchBroadcast(g, plan, nullptr, 0);
    if (err.failure()) {
      std::fprintf(stderr, "launch failed: %s\n", err.message().c_str());
      ok = false;
    }
  }
  std::vector<uint8_t> got(want.size() + 16);
  ok = ok && Check(cudaDeviceSynchronize(), "sync") &&
       Check(cudaMemcpy(got.data(), d_dst, got.size(), cudaMemcpyDeviceToHost), "d2h");
  cudaFree(d_src);
  cudaFree(d_dst);
  bool tail_ok = true;
  for (size_t i = want.size(); i < got.size(); ++i) tail_ok &= got[i] == 0xA5;
  got.resize(want.size());
  const bool same = got == want && tail_ok;
  if (!ok || !same) {
    std::fprintf(stderr, "%s: method=%s cluster=%d tma=%d outer=%lld inner=%lld n=%lld%s\n",
                 ok ? "mismatch" : "error", jax_tma::BroadcastMethodName(method), cluster, tma,
                 static_cast<long long>(g.outer), static_cast<long long>(g.inner_bytes),
                 static_cast<long long>(g.n), tail_ok ? "" : " (wrote past the end)");
  }
  return ok && same;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "all";
  const uint64_t seed = argc > 2 ? std::stoull(argv[2]) : std::random_device{}();
  const char* max_cluster = std::getenv("JAX_TMA_SELFTEST_MAX_CLUSTER");
  const int largest = argc > 3 ? std::stoi(argv[3]) : max_cluster ? std::stoi(max_cluster) : 16;
  std::mt19937_64 gen(seed);
  const BroadcastMethod methods[] = {BroadcastMethod::kStore, BroadcastMethod::kMulticast,
                                     BroadcastMethod::kDsmem, BroadcastMethod::kSimt};
  int cases = 0, failures = 0, tma_cases = 0;
  for (int trial = 0; trial < 12; ++trial) {
    for (BroadcastMethod m : methods) {
      if (only != "all" && only != jax_tma::BroadcastMethodName(m)) continue;
      const bool clustered = m == BroadcastMethod::kMulticast || m == BroadcastMethod::kDsmem;
      for (int cluster : {2, 4, 8, 16}) {
        if ((!clustered && cluster != 2) || cluster > largest) continue;
        BroadcastGeometry g;
        g.outer = 1 + static_cast<int64_t>(gen() % 37);
        // Replica sizes: 16-B multiples of every shape class (odd row counts,
        // rows narrower than 256 words), some not a multiple of 16.
        const int64_t unit = trial % 6 == 5 ? 1 + static_cast<int64_t>(gen() % 15) : 16;
        g.inner_bytes = unit * (1 + static_cast<int64_t>(gen() % (trial % 3 == 0 ? 900 : 40)));
        g.n = 1 + static_cast<int64_t>(gen() % 19);
        ++cases;
        tma_cases += m != BroadcastMethod::kSimt && g.inner_bytes % 16 == 0;
        failures += !RunCase(g, m, clustered ? cluster : 1, gen);
        if (cudaPeekAtLastError() != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
          std::printf("broadcast_selftest: seed %llu: sticky CUDA error after %d cases\n",
                      static_cast<unsigned long long>(seed), cases);
          return 1;
        }
      }
    }
  }
  std::printf("broadcast_selftest: seed %llu, %s: %d cases (%d offered to the TMA kernels), "
              "%d failures\n", static_cast<unsigned long long>(seed), only.c_str(), cases,
              tma_cases, failures);
  return failures == 0 ? 0 : 1;
}
