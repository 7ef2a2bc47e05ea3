// Standalone driver of the im2col kernels (TMA im2col mode and SIMT, both
// patch orders, col2im for every summation kind) for compute-sanitizer,
// without JAX: random 1D/2D/3D geometries checked against the host
// evaluation of im2col_common.h, destinations poisoned. Exit status 1 on any
// mismatch or launch error.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "im2col/im2col_launch.h"

namespace {

using jax_tma::Im2colGeometry;
using jax_tma::SumKind;

struct HostCol2im {
  const Im2colGeometry& g;
  const std::vector<uint8_t>& patches;
  std::vector<uint8_t>& x;
  template <SumKind K>
  void operator()() const {
    using T = typename jax_tma::ElementSum<K>::T;
    const T* src = reinterpret_cast<const T*>(patches.data());
    T* dst = reinterpret_cast<T*>(x.data());
    int64_t i = 0;
    for (int64_t n = 0; n < g.batch; ++n)
      for (int64_t p = 0; p < g.in_pixels; ++p)
        for (int64_t c = 0; c < g.channels; ++c)
          for (int j = 0; j < g.components; ++j) {
            dst[i++] = jax_tma::Col2imElement<K>(g, src, n, p, c, j);
          }
  }
};

std::vector<uint8_t> HostIm2col(const Im2colGeometry& g, const std::vector<uint8_t>& x) {
  const int64_t eb = g.elem_bytes;
  std::vector<uint8_t> out(g.batch * g.out_pixels * g.taps * g.channels * eb, 0);
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t m = 0; m < g.out_pixels; ++m)
      for (int64_t t = 0; t < g.taps; ++t) {
        const int64_t p = jax_tma::TapSource(g, m, t);
        if (p < 0) continue;
        for (int64_t c = 0; c < g.channels; ++c) {
          std::memcpy(out.data() + ((n * g.out_pixels + m) * g.taps * g.channels +
                                    jax_tma::PatchColumn(g, t, c)) * eb,
                      x.data() + ((n * g.in_pixels + p) * g.channels + c) * eb, eb);
        }
      }
  return out;
}

bool Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
  return err == cudaSuccess;
}

// Runs one geometry (`tma`: through the TMA kernel where it fits); false on
// a mismatch or error. *used_tma says whether the TMA kernel ran.
bool RunCase(Im2colGeometry g, bool tma, std::mt19937_64& gen, bool* used_tma) {
  g.taps = g.in_pixels = g.out_pixels = 1;
  for (int d = 0; d < g.rank; ++d) {
    g.out_dims[d] = jax_tma::Im2colOutDim(g.in_dims[d], g.pad_lo[d], g.pad_hi[d], g.kernel[d],
                                          g.strides[d], g.dilation[d]);
    g.taps *= g.kernel[d];
    g.in_pixels *= g.in_dims[d];
    g.out_pixels *= g.out_dims[d];
  }
  const int64_t eb = g.elem_bytes;
  const size_t x_bytes = g.batch * g.in_pixels * g.channels * eb;
  const size_t p_bytes = g.batch * g.out_pixels * g.taps * g.channels * eb;
  std::vector<uint8_t> src(g.transpose ? p_bytes : x_bytes);
  for (auto& v : src) v = static_cast<uint8_t>(gen());
  std::vector<uint8_t> want(g.transpose ? x_bytes : p_bytes);
  if (g.transpose) {
    jax_tma::DispatchSumKind(g.sum, HostCol2im{g, src, want});
  } else {
    want = HostIm2col(g, src);
  }
  uint8_t *d_src = nullptr, *d_dst = nullptr;
  bool ok = Check(cudaMalloc(&d_src, src.size() + 16), "malloc") &&
            Check(cudaMalloc(&d_dst, want.size() + 16), "malloc") &&
            Check(cudaMemcpy(d_src, src.data(), src.size(), cudaMemcpyHostToDevice), "h2d") &&
            Check(cudaMemset(d_dst, 0xA5, want.size()), "memset");
  // The plan of method "tma" where the TMA kernel fits, else of "simt".
  jax_tma::Im2colPlan plan;
  jax_tma::DeviceInfo info;
  ok = ok && !jax_tma::GetDeviceInfo(0, &info).failure();
  *used_tma = ok && tma &&
              jax_tma::PlanIm2col(g, jax_tma::Method::kTma, info, 0, d_src, d_dst, &plan)
                  .success() &&
              plan.kernel == jax_tma::Im2colKernel::kTma;
  if (ok && !*used_tma) {
    ok = jax_tma::PlanIm2col(g, jax_tma::Method::kSimt, info, 0, d_src, d_dst, &plan).success();
  }
  if (ok) {
    xla::ffi::Error err = jax_tma::LaunchIm2col(g, plan, d_src, d_dst, nullptr, 0);
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
  if (ok && got != want) {
    size_t bad = 0;
    while (got[bad] == want[bad]) ++bad;
    std::fprintf(stderr,
                 "mismatch: tma=%d transpose=%d channel_major=%d rank=%d eb=%lld batch=%lld "
                 "C=%lld first bad byte %zu of %zu\n",
                 *used_tma, g.transpose, g.channel_major, g.rank, static_cast<long long>(eb),
                 static_cast<long long>(g.batch), static_cast<long long>(g.channels), bad,
                 want.size());
    ok = false;
  }
  return ok;
}

}  // namespace

int main() {
  std::mt19937_64 gen(std::random_device{}());
  const int64_t sizes[] = {1, 2, 4, 8, 16};
  const SumKind kinds[] = {SumKind::kU8, SumKind::kU16, SumKind::kU32, SumKind::kU64,
                           SumKind::kF16, SumKind::kBF16, SumKind::kF32, SumKind::kF64};
  const int64_t kind_bytes[] = {1, 2, 4, 8, 2, 2, 4, 8};
  int cases = 0, failures = 0, tma_cases = 0;
  // Trials from 90 on have one spatial dim whose dilated kernel is larger
  // than the padded input: an empty patch matrix (im2col writes nothing,
  // col2im writes zeros over the poison).
  int empty_cases = 0;
  for (int trial = 0; trial < 108; ++trial) {
    Im2colGeometry g;
    g.rank = 1 + trial % 3;
    g.transpose = trial % 3 == 2;
    const bool friendly = trial % 3 == 0;  // 16-B channel runs
    // Half the friendly ones go to the SIMT kernels (the staged one: odd
    // runs of 16-B units, wide, and long rows, so that a tile is shorter than
    // a row or a row does not fit at all), the other half are offered to the
    // TMA path.
    const bool wide = friendly && trial % 6 == 3;
    g.channel_major = !friendly && gen() % 2;
    if (g.transpose) {
      const int k = static_cast<int>(gen() % 8);
      g.sum = kinds[k];
      g.components = gen() % 4 == 0 && kind_bytes[k] >= 4 && k >= 6 ? 2 : 1;
      g.elem_bytes = kind_bytes[k] * g.components;
    } else {
      g.elem_bytes = sizes[gen() % 5];
    }
    g.batch = wide ? 1 : 1 + static_cast<int64_t>(gen() % 3);
    g.channels = friendly ? (16 / std::min<int64_t>(g.elem_bytes, 16)) *
                                (wide ? 13 + 2 * (gen() % 15) : 1 + gen() % 5)
                          : 1 + static_cast<int64_t>(gen() % 6);
    for (int d = 0; d < g.rank; ++d) {
      g.kernel[d] = 1 + static_cast<int64_t>(gen() % 3);
      g.strides[d] = 1 + static_cast<int64_t>(gen() % 3);
      g.dilation[d] = 1 + static_cast<int64_t>(gen() % 2);
      g.pad_lo[d] = static_cast<int64_t>(gen() % 4);
      g.pad_hi[d] = static_cast<int64_t>(gen() % 4);
      const int64_t span = g.dilation[d] * (g.kernel[d] - 1) + 1;
      const int64_t most = wide ? (d == g.rank - 1 ? 60 : 6) : g.rank == 3 ? 7 : 20;
      g.in_dims[d] = std::max<int64_t>(span, 1 + static_cast<int64_t>(gen() % most));
    }
    if (trial >= 90) {
      const int d = static_cast<int>(gen() % g.rank);
      g.kernel[d] = 3;
      g.dilation[d] = 2;  // spans 5 pixels
      g.pad_lo[d] = static_cast<int64_t>(gen() % 2);
      g.pad_hi[d] = static_cast<int64_t>(gen() % 2);
      g.in_dims[d] = static_cast<int64_t>(gen() % (5 - g.pad_lo[d] - g.pad_hi[d]));
      ++empty_cases;
    }
    ++cases;
    bool used_tma = false;
    failures += !RunCase(g, friendly && !wide, gen, &used_tma);
    tma_cases += used_tma;
  }
  std::printf("im2col_selftest: %d cases (%d through the TMA kernel, %d with an empty patch "
              "matrix), %d failures\n", cases, tma_cases, empty_cases, failures);
  return failures == 0 && tma_cases > 0 ? 0 : 1;
}
