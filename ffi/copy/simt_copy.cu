// The SIMT copy kernel and its launcher: a vectorised loop over block-wide
// spans, the fallback below sm_90, the kernel of method="auto" below
// kAutoBulkMinBytes, and the copy of buffers whose addresses differ modulo 16.
// Vectors are the widest that both addresses share an alignment for; the edge
// bytes (fewer than one vector at each end) are copied by one extra block of
// the same launch.
#include <algorithm>

#include "copy/copy_launch.h"
#include "cuda/device_info.h"

namespace jax_tma {
namespace {

constexpr int kSimtThreads = 256;
// Each thread loads kSimtUnroll vectors, a block apart, before storing any:
// each block copies contiguous spans of kSimtThreads * kSimtUnroll vectors
// (chosen over 8 loads a grid stride apart with benchmarks/bench_copy.py).
constexpr int kSimtUnroll = 4;

// Blocks [0, body_blocks) copy the nvec vectors of the body; block
// body_blocks, present only when there are edge bytes, copies bytes
// [0, head) and [tail, bytes). The body kernel has no edge code ahead of its
// loop: a predicated edge copy there slows the whole copy.
template <typename V>
__global__ void __launch_bounds__(kSimtThreads)
    SimtCopyKernel(const V* __restrict__ src, V* __restrict__ dst, int64_t nvec,
                   int body_blocks, const uint8_t* __restrict__ src_bytes,
                   uint8_t* __restrict__ dst_bytes, int head, int64_t tail,
                   int64_t bytes) {
  if (static_cast<int>(blockIdx.x) >= body_blocks) {
    const int t = static_cast<int>(threadIdx.x);
    if (t < head) dst_bytes[t] = src_bytes[t];
    if (t < bytes - tail) dst_bytes[tail + t] = src_bytes[tail + t];
    return;
  }
  constexpr int64_t kSpan = int64_t{kSimtThreads} * kSimtUnroll;
  const int64_t stride = static_cast<int64_t>(body_blocks) * kSpan;
  int64_t i = static_cast<int64_t>(blockIdx.x) * kSpan + threadIdx.x;
  for (; i + (kSimtUnroll - 1) * kSimtThreads < nvec; i += stride) {
    V r[kSimtUnroll];
#pragma unroll
    for (int u = 0; u < kSimtUnroll; ++u) r[u] = src[i + u * kSimtThreads];
#pragma unroll
    for (int u = 0; u < kSimtUnroll; ++u) dst[i + u * kSimtThreads] = r[u];
  }
  // The last, partial span.
#pragma unroll
  for (int u = 0; u < kSimtUnroll - 1; ++u) {
    if (i + u * kSimtThreads < nvec) dst[i + u * kSimtThreads] = src[i + u * kSimtThreads];
  }
}

template <typename V>
ffi::Error LaunchSimtWidth(const void* src, void* dst, int64_t bytes,
                           cudaStream_t stream, const DeviceInfo& info) {
  constexpr int64_t w = sizeof(V);
  const auto s = reinterpret_cast<std::uintptr_t>(src);
  const int64_t head = std::min<int64_t>(bytes, (w - static_cast<int64_t>(s % w)) % w);
  const int64_t nvec = (bytes - head) / w;
  const int64_t tail = head + nvec * w;
  const int64_t per_block = int64_t{kSimtThreads} * kSimtUnroll;
  // At most 8 blocks per SM (a full SM at 256 threads); larger bodies loop.
  const int body_blocks = static_cast<int>(std::min<int64_t>(
      (nvec + per_block - 1) / per_block, static_cast<int64_t>(info.sm_count) * 8));
  const bool edges = head > 0 || tail < bytes;
  const auto* sv = reinterpret_cast<const V*>(static_cast<const uint8_t*>(src) + head);
  auto* dv = reinterpret_cast<V*>(static_cast<uint8_t*>(dst) + head);
  SimtCopyKernel<V><<<body_blocks + (edges ? 1 : 0), kSimtThreads, 0, stream>>>(
      sv, dv, nvec, body_blocks, static_cast<const uint8_t*>(src),
      static_cast<uint8_t*>(dst), static_cast<int>(head), tail, bytes);
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ffi::Error::Success();
}

}  // namespace

ffi::Error LaunchSimtCopy(const void* src, void* dst, std::size_t bytes,
                          cudaStream_t stream, int device) {
  if (bytes == 0) return ffi::Error::Success();
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  const auto n = static_cast<int64_t>(bytes);
  // The widest vector for which src and dst are equally misaligned.
  const auto rel = reinterpret_cast<std::uintptr_t>(src) ^
                   reinterpret_cast<std::uintptr_t>(dst);
  if ((rel & 15) == 0) return LaunchSimtWidth<uint4>(src, dst, n, stream, info);
  if ((rel & 7) == 0) return LaunchSimtWidth<uint2>(src, dst, n, stream, info);
  if ((rel & 3) == 0) return LaunchSimtWidth<uint32_t>(src, dst, n, stream, info);
  if ((rel & 1) == 0) return LaunchSimtWidth<uint16_t>(src, dst, n, stream, info);
  return LaunchSimtWidth<uint8_t>(src, dst, n, stream, info);
}

}  // namespace jax_tma
