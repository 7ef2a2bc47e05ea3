// The SIMT broadcast kernel and its launcher: a grid-stride loop over the
// input in the widest vectors that the replica size and both addresses allow;
// each vector is read once and stored n times. The fallback below sm_90 and for shapes the TMA tile
// kernels cannot describe.
#include <algorithm>
#include <cstdint>

#include "broadcast/broadcast_launch.h"
#include "cuda/cuda_status.h"
#include "cuda/device_info.h"
#include "fast_divisor.h"

namespace jax_tma {
namespace {

constexpr int kSimtThreads = 256;

// A thread's input row by a FastDivisor where every index it reaches is below
// 2^31 (Narrow: a multiply-high where a 64-bit division is a software routine
// on the kernel's first chain, 0.1 µs of a 1.2-µs call), else by `/`.
template <typename V, bool Narrow>
__global__ void __launch_bounds__(kSimtThreads)
    SimtBroadcastKernel(const V* __restrict__ src, V* __restrict__ dst, int64_t outer,
                        int64_t row_vecs, int64_t n, FastDivisor rows) {
  const int64_t total = outer * row_vecs;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += stride) {
    const V v = src[idx];
    int64_t o;
    if constexpr (Narrow) {
      o = rows.Divide(static_cast<uint32_t>(idx));
    } else {
      o = idx / row_vecs;
    }
    const int64_t i = idx - o * row_vecs;
    V* d = dst + o * n * row_vecs + i;
    for (int64_t k = 0; k < n; ++k) d[k * row_vecs] = v;
  }
}

template <typename V>
ffi::Error LaunchWidth(const BroadcastGeometry& g, cudaStream_t stream, const DeviceInfo& info) {
  const int64_t row_vecs = g.inner_bytes / static_cast<int64_t>(sizeof(V));
  const int64_t total = g.outer * row_vecs;
  const int grid = static_cast<int>(std::clamp<int64_t>(
      (total + kSimtThreads - 1) / kSimtThreads, 1, static_cast<int64_t>(info.sm_count) * 8));
  const auto* src = static_cast<const V*>(g.src);
  auto* dst = static_cast<V*>(g.dst);
  // Every index a thread reaches stays below total + the grid's threads.
  if (total + int64_t{grid} * kSimtThreads < kFastDivisorLimit) {
    SimtBroadcastKernel<V, true><<<grid, kSimtThreads, 0, stream>>>(
        src, dst, g.outer, row_vecs, g.n, FastDivisor::Of(static_cast<uint32_t>(row_vecs)));
  } else {
    SimtBroadcastKernel<V, false><<<grid, kSimtThreads, 0, stream>>>(src, dst, g.outer, row_vecs,
                                                                     g.n, FastDivisor{});
  }
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ffi::Error::Success();
}

}  // namespace

ffi::Error LaunchSimtBroadcast(const BroadcastGeometry& g, cudaStream_t stream, int device) {
  if (g.n == 0 || g.outer == 0 || g.inner_bytes == 0) return ffi::Error::Success();
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  // The widest vector dividing the replica size and both addresses.
  const auto bits = static_cast<std::uintptr_t>(g.inner_bytes) |
                    reinterpret_cast<std::uintptr_t>(g.src) |
                    reinterpret_cast<std::uintptr_t>(g.dst);
  if ((bits & 15) == 0) return LaunchWidth<uint4>(g, stream, info);
  if ((bits & 7) == 0) return LaunchWidth<uint2>(g, stream, info);
  if ((bits & 3) == 0) return LaunchWidth<uint32_t>(g, stream, info);
  if ((bits & 1) == 0) return LaunchWidth<uint16_t>(g, stream, info);
  return LaunchWidth<uint8_t>(g, stream, info);
}

}  // namespace jax_tma
