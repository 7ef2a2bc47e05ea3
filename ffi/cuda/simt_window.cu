// The SIMT window kernel: one thread per output element evaluates the
// window_common.h mapping (any rank, any strides, any alignment, and the
// transpose). The path for every geometry the TMA tiled kernel cannot take.
#include <algorithm>

#include "device_info.h"
#include "window_launch.h"

namespace jax_tma {
namespace {

constexpr int kWindowThreads = 256;

struct Bytes16 {
  uint64_t lo, hi;
};

// One warp covers kWindowSegment consecutive elements of one window row per
// step: the row's src offset is decoded once per step (the divisions), the
// lanes then read and write consecutive elements (coalesced when the
// innermost stride is 1).
constexpr int kWindowSegment = 128;

template <typename T>
__global__ void __launch_bounds__(kWindowThreads)
    SimtWindowKernel(const WindowGeometry g, const T* __restrict__ src,
                     const void* __restrict__ start, T* __restrict__ dst, T fill) {
  const int last = g.rank - 1;
  const int64_t inner = g.dst_dims[last];
  const int64_t rows = g.batch * (g.dst_spatial / inner);
  const int64_t segments = (inner + kWindowSegment - 1) / kWindowSegment;
  const int lane = threadIdx.x % 32;
  const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  const int64_t rows_per_batch = g.dst_spatial / inner;
  int64_t s[kMaxWindowRank];
  int64_t loaded_bt = -1;
  for (int64_t item = warp; item < rows * segments; item += warps) {
    const int64_t row = item / segments;
    const int64_t first = (item - row * segments) * kWindowSegment;
    const int64_t b = row / rows_per_batch;
    const int64_t bt = g.start_batched ? b : 0;
    if (bt != loaded_bt) {
      for (int d = 0; d < g.rank; ++d) s[d] = ReadStart(start, g.start_is_64, bt * g.rank + d);
      loaded_bt = bt;
    }
    const int64_t base = WindowRowSource(g, s, row - b * rows_per_batch);
    const T* sb = src + (g.src_batched ? b : 0) * g.src_spatial;
    T* drow = dst + row * inner;
    // Four independent loads in flight per lane before the stores.
    constexpr int kPer = kWindowSegment / 32;
    T v[kPer];
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int64_t i = first + u * 32 + lane;
      const int64_t c = (base < 0 || i >= inner) ? -1 : MapCoord(g, last, i, s[last]);
      v[u] = c >= 0 ? sb[base + c] : fill;
    }
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int64_t i = first + u * 32 + lane;
      if (i < inner) drow[i] = v[u];
    }
  }
}

template <typename T>
ffi::Error Launch(const WindowGeometry& g, const void* src, const void* start, void* dst,
                  T fill, cudaStream_t stream, const DeviceInfo& info) {
  const int64_t inner = g.dst_dims[g.rank - 1];
  const int64_t items = g.batch * (g.dst_spatial / inner) *
                        ((inner + kWindowSegment - 1) / kWindowSegment);
  const int64_t warps_per_block = kWindowThreads / 32;
  const int grid = static_cast<int>(std::clamp<int64_t>(
      (items + warps_per_block - 1) / warps_per_block, 1,
      static_cast<int64_t>(info.sm_count) * 16));
  SimtWindowKernel<T><<<grid, kWindowThreads, 0, stream>>>(
      g, static_cast<const T*>(src), start, static_cast<T*>(dst), fill);
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ffi::Error::Success();
}

}  // namespace

ffi::Error LaunchSimtWindow(const WindowGeometry& g, const void* src, const void* start,
                            void* dst, cudaStream_t stream, int device) {
  if (g.batch * g.dst_spatial == 0) return ffi::Error::Success();
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  const uint64_t f = g.fill_bits;
  switch (g.elem_bytes) {
    case 1: return Launch<uint8_t>(g, src, start, dst, static_cast<uint8_t>(f), stream, info);
    case 2: return Launch<uint16_t>(g, src, start, dst, static_cast<uint16_t>(f), stream, info);
    case 4: return Launch<uint32_t>(g, src, start, dst, static_cast<uint32_t>(f), stream, info);
    case 8: return Launch<uint64_t>(g, src, start, dst, f, stream, info);
    case 16: return Launch<Bytes16>(g, src, start, dst, Bytes16{f, f}, stream, info);
    default:
      return InvalidArgument(kWindowOp, "element size ", g.elem_bytes, " B is not supported");
  }
}

}  // namespace jax_tma
