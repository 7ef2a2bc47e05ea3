// The SIMT copy kernel and its launcher: the kernel of method="auto" (the
// fastest measured at every size on an H100 and an H200), the fallback below
// sm_90, and the copy of buffers whose addresses differ modulo 16.
// Vectors are the widest that both addresses share an alignment for; the edge
// bytes (fewer than one vector at each end) are copied by one extra block of
// the same launch.
#include <algorithm>

#include "copy/copy_launch.h"
#include "cuda/device_info.h"

namespace jax_tma {
namespace {

constexpr int kSimtThreads = 256;
// Two shapes, by size (benchmarks/TUNING.md, "The SIMT copy's two shapes"):
// a body that one wave of 8 blocks per SM covers with 4 vectors a thread
// takes that (4 loads a block apart before any store: each block copies a
// contiguous span of 1,024 vectors); a larger one takes one vector a thread,
// the grid covering it (looping only past the grid limit).
constexpr int kSimtWaveBlocksPerSm = 8;
constexpr int kSimtSmallUnroll = 4;
constexpr int64_t kSimtMaxBodyBlocks = 0x7fffffff - 1;  // and the edge block

// Blocks [0, body_blocks) copy the nvec vectors of the body, kUnroll vectors
// a thread a block apart, looping a grid apart; block body_blocks, present
// only when there are edge bytes, copies bytes [0, head) and [tail, bytes).
// The body kernel has no edge code ahead of its loop: a predicated edge copy
// there slows the whole copy.
template <typename V, int kUnroll>
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
  constexpr int64_t kSpan = int64_t{kSimtThreads} * kUnroll;
  const int64_t stride = static_cast<int64_t>(body_blocks) * kSpan;
  int64_t i = static_cast<int64_t>(blockIdx.x) * kSpan + threadIdx.x;
  for (; i + (kUnroll - 1) * kSimtThreads < nvec; i += stride) {
    V r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) r[u] = src[i + u * kSimtThreads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dst[i + u * kSimtThreads] = r[u];
  }
  // The last, partial span.
#pragma unroll
  for (int u = 0; u < kUnroll - 1; ++u) {
    if (i + u * kSimtThreads < nvec) dst[i + u * kSimtThreads] = src[i + u * kSimtThreads];
  }
}

template <typename V>
ffi::Error LaunchSimtWidth(const void* src, void* dst, int64_t bytes, int sm_count,
                           cudaStream_t stream) {
  constexpr int64_t w = sizeof(V);
  const auto s = reinterpret_cast<std::uintptr_t>(src);
  const int64_t head = std::min<int64_t>(bytes, (w - static_cast<int64_t>(s % w)) % w);
  const int64_t nvec = (bytes - head) / w;
  const int64_t tail = head + nvec * w;
  const bool edges = head > 0 || tail < bytes;
  const auto* sv = reinterpret_cast<const V*>(static_cast<const uint8_t*>(src) + head);
  auto* dv = reinterpret_cast<V*>(static_cast<uint8_t*>(dst) + head);
  const auto* sb = static_cast<const uint8_t*>(src);
  auto* db = static_cast<uint8_t*>(dst);
  constexpr int64_t kSmallSpan = int64_t{kSimtThreads} * kSimtSmallUnroll;
  const int64_t small_blocks = (nvec + kSmallSpan - 1) / kSmallSpan;
  if (small_blocks <= int64_t{sm_count} * kSimtWaveBlocksPerSm) {
    const int body = static_cast<int>(small_blocks);
    SimtCopyKernel<V, kSimtSmallUnroll><<<body + (edges ? 1 : 0), kSimtThreads, 0, stream>>>(
        sv, dv, nvec, body, sb, db, static_cast<int>(head), tail, bytes);
  } else {
    const int body = static_cast<int>(
        std::min<int64_t>((nvec + kSimtThreads - 1) / kSimtThreads, kSimtMaxBodyBlocks));
    SimtCopyKernel<V, 1><<<body + (edges ? 1 : 0), kSimtThreads, 0, stream>>>(
        sv, dv, nvec, body, sb, db, static_cast<int>(head), tail, bytes);
  }
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
  const int sms = info.sm_count;
  // The widest vector for which src and dst are equally misaligned.
  const auto rel = reinterpret_cast<std::uintptr_t>(src) ^
                   reinterpret_cast<std::uintptr_t>(dst);
  if ((rel & 15) == 0) return LaunchSimtWidth<uint4>(src, dst, n, sms, stream);
  if ((rel & 7) == 0) return LaunchSimtWidth<uint2>(src, dst, n, sms, stream);
  if ((rel & 3) == 0) return LaunchSimtWidth<uint32_t>(src, dst, n, sms, stream);
  if ((rel & 1) == 0) return LaunchSimtWidth<uint16_t>(src, dst, n, sms, stream);
  return LaunchSimtWidth<uint8_t>(src, dst, n, sms, stream);
}

}  // namespace jax_tma
