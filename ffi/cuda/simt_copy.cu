// The SIMT copy: a vectorised grid-stride loop, the fallback below sm_90, the
// kernel of method="auto" below kAutoBulkMinBytes, and the copy of buffers
// whose addresses differ modulo 16. Vectors are the widest that both
// addresses share an alignment for; the edge bytes (fewer than one vector at
// each end) are copied by one extra block of the same launch.
#include <algorithm>

#include "copy_launch.h"
#include "device_info.h"

namespace jax_tma {
namespace {

constexpr int kSimtThreads = 256;
// From this many vectors up each thread keeps 8 loads in flight, below it 4.
// H100 (2026-11-22, cold input): 8 is 2-4% faster at 4, 16 and 32 MiB of
// 16-B vectors; at 1 and 2 MiB it leaves SMs idle and is 10-25% slower.
constexpr int64_t kDeepMinVectors = int64_t{1} << 18;

// Blocks [0, body_blocks) copy the nvec vectors of the body; block
// body_blocks, present only when there are edge bytes, copies bytes
// [0, head) and [tail, bytes). The body kernel has no edge code ahead of its
// loop: a predicated edge copy there made the whole copy 5% slower at 16 MiB.
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
  const int64_t nthreads = static_cast<int64_t>(body_blocks) * kSimtThreads;
  int64_t i = static_cast<int64_t>(blockIdx.x) * kSimtThreads + threadIdx.x;
  for (; i + (kUnroll - 1) * nthreads < nvec; i += kUnroll * nthreads) {
    V r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) r[u] = src[i + u * nthreads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dst[i + u * nthreads] = r[u];
  }
  for (; i < nvec; i += nthreads) dst[i] = src[i];
}

template <typename V>
ffi::Error LaunchSimtWidth(const void* src, void* dst, int64_t bytes,
                           cudaStream_t stream, const DeviceInfo& info) {
  constexpr int64_t w = sizeof(V);
  const auto s = reinterpret_cast<std::uintptr_t>(src);
  const int64_t head = std::min<int64_t>(bytes, (w - static_cast<int64_t>(s % w)) % w);
  const int64_t nvec = (bytes - head) / w;
  const int64_t tail = head + nvec * w;
  const bool deep = nvec >= kDeepMinVectors;
  const int64_t per_block = static_cast<int64_t>(kSimtThreads) * (deep ? 8 : 4);
  // At most 8 blocks per SM (a full SM at 256 threads); larger bodies loop.
  const int body_blocks = static_cast<int>(std::min<int64_t>(
      (nvec + per_block - 1) / per_block, static_cast<int64_t>(info.sm_count) * 8));
  const bool edges = head > 0 || tail < bytes;
  const auto* sv = reinterpret_cast<const V*>(static_cast<const uint8_t*>(src) + head);
  auto* dv = reinterpret_cast<V*>(static_cast<uint8_t*>(dst) + head);
  auto kernel = deep ? SimtCopyKernel<V, 8> : SimtCopyKernel<V, 4>;
  kernel<<<body_blocks + (edges ? 1 : 0), kSimtThreads, 0, stream>>>(
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
