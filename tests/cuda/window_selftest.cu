// Standalone driver of the window kernels (TMA tiled and SIMT in both its
// forms, forward and transpose; every start layout: one array, a batched array, one buffer per
// dim) for compute-sanitizer, without JAX: random geometries checked
// against the host evaluation of window_common.h, destinations poisoned.
// Exit status 1 on any mismatch or launch error.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "window/window_launch.h"

namespace {

using jax_tma::WindowGeometry;

std::vector<uint8_t> HostWindow(const WindowGeometry& g, const std::vector<uint8_t>& src,
                                const std::vector<int64_t>& start) {
  const int64_t eb = g.elem_bytes;
  std::vector<uint8_t> out(g.batch * g.dst_spatial * eb);
  uint8_t fill[16];
  std::memcpy(fill, &g.fill.lo, 8);
  std::memcpy(fill + 8, &g.fill.hi, 8);
  const int64_t inner = g.dst_dims[g.rank - 1];
  for (int64_t b = 0; b < g.batch; ++b) {
    jax_tma::WindowStarts host;  // the same values, one array on the host
    host.ptr[0] = start.data();
    host.batched = g.starts.batched;
    host.is64 = true;
    int64_t s[jax_tma::kMaxWindowRank];
    for (int d = 0; d < g.rank; ++d) s[d] = jax_tma::ReadStart(host, g.rank, b, d);
    const uint8_t* sb = src.data() + (g.src_batched ? b : 0) * g.src_spatial * eb;
    for (int64_t row = 0; row < g.dst_spatial / inner; ++row) {
      const int64_t base = jax_tma::WindowRowSource(g, s, row);
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t c = base < 0 ? -1 : jax_tma::MapCoord(g, g.rank - 1, i, s[g.rank - 1]);
        std::memcpy(out.data() + ((b * g.dst_spatial) + row * inner + i) * eb,
                    c >= 0 ? sb + (base + c) * eb : fill, eb);
      }
    }
  }
  return out;
}

bool Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
  return err == cudaSuccess;
}

// Runs one geometry through `tiled` (TMA) or SIMT; returns false on mismatch.
bool RunCase(WindowGeometry g, bool tiled, std::mt19937_64& gen) {
  const int64_t eb = g.elem_bytes;
  g.src_spatial = 1;
  g.dst_spatial = 1;
  for (int d = g.rank - 1; d >= 0; --d) {
    g.src_pitch[d] = g.src_spatial;
    g.src_spatial *= g.src_dims[d];
    g.dst_spatial *= g.dst_dims[d];
  }
  std::vector<uint8_t> src((g.src_batched ? g.batch : 1) * g.src_spatial * eb);
  for (auto& v : src) v = static_cast<uint8_t>(gen());
  std::vector<int64_t> start((g.starts.batched ? g.batch : 1) * g.rank);
  for (size_t k = 0; k < start.size(); ++k) {
    const int64_t dim = g.transpose ? g.dst_dims[k % g.rank] : g.src_dims[k % g.rank];
    start[k] = static_cast<int64_t>(gen() % (dim + 24)) - 12;
  }
  g.starts.is64 = true;
  const std::vector<uint8_t> want = HostWindow(g, src, start);
  // Static starts (kernel parameters) in two calls of three: the starts
  // there, and others in the operand, which the kernels must not read.
  std::vector<int64_t> operand = start;
  const bool all_known = !g.starts.batched && gen() % 3 != 0;
  if (all_known) {
    for (int d = 0; d < g.rank; ++d) operand[d] = start[d] + 5;
  }
  uint8_t *d_src = nullptr, *d_dst = nullptr;
  int64_t* d_start = nullptr;
  bool ok = Check(cudaMalloc(&d_src, src.size() + 16), "malloc") &&
            Check(cudaMalloc(&d_dst, want.size() + 16), "malloc") &&
            Check(cudaMalloc(&d_start, start.size() * 8), "malloc") &&
            Check(cudaMemcpy(d_src, src.data(), src.size(), cudaMemcpyHostToDevice), "h2d") &&
            Check(cudaMemcpy(d_start, operand.data(), operand.size() * 8, cudaMemcpyHostToDevice),
                  "h2d") &&
            Check(cudaMemset(d_dst, 0xA5, want.size()), "memset");
  // Split starts: one one-element buffer per dim (here consecutive ones).
  for (int d = 0; d < (g.starts.split ? g.rank : 1); ++d) g.starts.ptr[d] = d_start + d;
  if (all_known) {
    g.starts.all_known = true;
    std::copy(start.begin(), start.begin() + g.rank, g.starts.known);
  }
  // The plan of method "tma" where the tiled kernel fits, else of "simt",
  // which then covers this geometry.
  jax_tma::WindowPlan plan;
  jax_tma::DeviceInfo info;
  ok = ok && !jax_tma::GetDeviceInfo(0, &info).failure();
  if (ok && tiled) {
    tiled = jax_tma::PlanWindow(g, jax_tma::Method::kTma, jax_tma::kUnknownStart, info, 0, d_src,
                                d_dst, &plan).success();
  }
  if (ok && !tiled) {
    ok = jax_tma::PlanWindow(g, jax_tma::Method::kSimt, jax_tma::kUnknownStart, info, 0, d_src,
                             d_dst, &plan).success();
  }
  if (ok) {
    xla::ffi::Error err = jax_tma::LaunchWindow(g, plan, d_src, d_dst, nullptr, 0);
    if (err.failure()) {
      std::fprintf(stderr, "launch failed: %s\n", err.message().c_str());
      ok = false;
    }
  }
  std::vector<uint8_t> got(want.size());
  ok = ok && Check(cudaDeviceSynchronize(), "sync") &&
       Check(cudaMemcpy(got.data(), d_dst, got.size(), cudaMemcpyDeviceToHost), "d2h");
  cudaFree(d_src);
  cudaFree(d_dst);
  cudaFree(d_start);
  if (ok && got != want) {
    std::fprintf(stderr, "mismatch: tiled=%d transpose=%d rank=%d eb=%lld batch=%lld\n", tiled,
                 g.transpose, g.rank, static_cast<long long>(eb), static_cast<long long>(g.batch));
    ok = false;
  }
  return ok;
}

}  // namespace

int main() {
  std::mt19937_64 gen(std::random_device{}());
  const int64_t sizes[] = {1, 2, 4, 8, 16};
  int cases = 0, failures = 0, tiled_cases = 0;
  for (int trial = 0; trial < 120; ++trial) {
    WindowGeometry g;
    g.rank = 1 + static_cast<int>(gen() % 3);
    g.elem_bytes = sizes[gen() % 5];
    g.transpose = trial % 4 == 3;
    const bool friendly = trial % 2 == 0 && !g.transpose;
    g.batch = 1 + static_cast<int64_t>(gen() % 3);
    g.src_batched = g.transpose || gen() % 2;
    const int layout = static_cast<int>(gen() % 3);  // array, batched array, split
    g.starts.batched = layout == 1;
    g.starts.split = layout == 2;
    if (!g.transpose && gen() % 2) {  // a random element, repeated to 16 bytes (ffi/fill.h)
      uint8_t pattern[16];
      for (int k = 0; k < 16; ++k) {
        pattern[k] = k < g.elem_bytes ? static_cast<uint8_t>(gen()) : pattern[k - g.elem_bytes];
      }
      std::memcpy(&g.fill.lo, pattern, 8);
      std::memcpy(&g.fill.hi, pattern + 8, 8);
    }
    for (int d = 0; d < g.rank; ++d) {
      const bool inner = d == g.rank - 1;
      g.strides[d] = inner && friendly ? 1 : 1 + static_cast<int64_t>(gen() % 4);
      const int64_t unit = inner && friendly ? 64 / g.elem_bytes : 1;
      g.src_dims[d] = unit * (1 + static_cast<int64_t>(gen() % 40)) + (friendly ? g.strides[d] : 0);
      g.dst_dims[d] = unit * (1 + static_cast<int64_t>(gen() % 24));
    }
    ++cases;
    tiled_cases += friendly;
    failures += !RunCase(g, friendly, gen);
    if (friendly) {  // its rows are whole 16-B vectors: SIMT's vector form too,
      ++cases;        // every other time at innermost stride 2
      g.strides[g.rank - 1] = 1 + trial / 2 % 2;
      failures += !RunCase(g, false, gen);
    }
  }
  std::printf("window_selftest: %d cases (%d offered to the TMA path), %d failures\n", cases,
              tiled_cases, failures);
  return failures == 0 ? 0 : 1;
}
