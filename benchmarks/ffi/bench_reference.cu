// Reference targets that exist only for the benchmark: cudaMemcpyAsync D2D
// (the copy ceiling), the "seed-style" TMA copy (one 32-thread CTA per
// 48 KiB chunk, one cp.async.bulk each way, no pipelining) that the bulk
// kernel must beat, and a read-only and a write-only stream, whose rates
// bound what any copy can reach when DRAM serves reads and writes in turn.
// Besides them, not a target: cudaMemcpyPeerAsync between devices, timed
// here (the link's ceiling for ppermute).
#include "bench_reference.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <string_view>

#include "copy/bulk_pipeline.cuh"
#include "cuda/cuda_status.h"
#include "cuda/device_helpers.cuh"
#include "cuda/device_info.h"

namespace jax_tma {
namespace {

constexpr uint32_t kSeedChunk = 48 * 1024;

__global__ void __launch_bounds__(32)
    SeedCopyKernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst,
                   int64_t bytes) {
#if JAX_TMA_HAS_BULK_COPY
  using namespace device;
  extern __shared__ __align__(128) uint8_t buf[];
  __shared__ uint64_t full;
  if (threadIdx.x != 0) return;
  const int64_t off = static_cast<int64_t>(blockIdx.x) * kSeedChunk;
  const uint32_t n = static_cast<uint32_t>(min(static_cast<int64_t>(kSeedChunk), bytes - off));
  CopyOneBulkChunk(src + off, dst + off, n, buf, &full);
#endif
}

ffi::Error SetSeedSmem(int device, int* unused) {
  *unused = 0;
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      SeedCopyKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSeedChunk));
  return ffi::Error::Success();
}

ffi::Error SeedCopyImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x,
                        ffi::Result<ffi::AnyBuffer> y) {
  constexpr std::string_view kOp = "jax_tma_bench_seed_copy";
  ByteCopy c;
  JAX_TMA_RETURN_IF_FAILED(CheckWholeCopy(kOp, x, y, &c));
  const auto addr_bits = reinterpret_cast<std::uintptr_t>(c.src) |
                         reinterpret_cast<std::uintptr_t>(c.dst) | c.bytes;
  if ((addr_bits & 15) != 0) {
    return InvalidArgument(kOp, "addresses and size must be multiples of 16 B");
  }
  if (c.bytes == 0) return ffi::Error::Success();
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  if (!info.has_tma()) return InvalidArgument(kOp, "needs compute capability >= 9.0");
  static PerDevice<int> once;
  int unused;
  JAX_TMA_RETURN_IF_FAILED(once.Get(device, SetSeedSmem, &unused));
  const int64_t blocks = (static_cast<int64_t>(c.bytes) + kSeedChunk - 1) / kSeedChunk;
  if (blocks > 0x7fffffff) return InvalidArgument(kOp, "too many chunks");
  SeedCopyKernel<<<static_cast<unsigned>(blocks), 32, kSeedChunk, stream>>>(
      static_cast<const uint8_t*>(c.src), static_cast<uint8_t*>(c.dst),
      static_cast<int64_t>(c.bytes));
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ffi::Error::Success();
}

ffi::Error MemcpyImpl(cudaStream_t stream, ffi::AnyBuffer x,
                      ffi::Result<ffi::AnyBuffer> y) {
  ByteCopy c;
  JAX_TMA_RETURN_IF_FAILED(CheckWholeCopy("jax_tma_bench_memcpy", x, y, &c));
  if (c.bytes == 0) return ffi::Error::Success();
  JAX_TMA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDeviceToDevice, stream));
  return ffi::Error::Success();
}

// Read-only stream: XORs the 16-B vectors of x into a 16-B checksum, in one
// kernel (a separate zeroing launch would add its gap to the span): each
// block leaves its partial in g_read_partials, the last block to finish
// folds them and resets g_read_done for the next launch. One launch at a time
// per device, which the benchmark's single stream guarantees.
constexpr int kReadThreads = 256;
constexpr int kReadUnroll = 8;
constexpr int kReadMaxBlocks = 4096;
__device__ uint4 g_read_partials[kReadMaxBlocks];
__device__ unsigned int g_read_done;

__device__ inline void Fold(uint4& acc, const uint4& v) {
  acc.x ^= v.x;
  acc.y ^= v.y;
  acc.z ^= v.z;
  acc.w ^= v.w;
}

// The XOR of `acc` over the block, in thread 0.
__device__ inline uint4 BlockXor(uint4 acc) {
  for (int lane_mask = 16; lane_mask > 0; lane_mask >>= 1) {
    Fold(acc, {__shfl_xor_sync(~0u, acc.x, lane_mask), __shfl_xor_sync(~0u, acc.y, lane_mask),
               __shfl_xor_sync(~0u, acc.z, lane_mask), __shfl_xor_sync(~0u, acc.w, lane_mask)});
  }
  __shared__ uint4 warp_sums[kReadThreads / 32];
  __syncthreads();  // warp_sums may still be read from a previous call
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  for (int w = 1; w < kReadThreads / 32; ++w) Fold(acc, warp_sums[w]);
  return acc;
}

__global__ void __launch_bounds__(kReadThreads)
    ReadStreamKernel(const uint4* __restrict__ src, int64_t nvec, uint4* __restrict__ sum) {
  const int64_t threads = static_cast<int64_t>(gridDim.x) * kReadThreads;
  uint4 acc = {0, 0, 0, 0};
  int64_t i = static_cast<int64_t>(blockIdx.x) * kReadThreads + threadIdx.x;
  for (; i + (kReadUnroll - 1) * threads < nvec; i += kReadUnroll * threads) {
    uint4 r[kReadUnroll];
#pragma unroll
    for (int u = 0; u < kReadUnroll; ++u) r[u] = src[i + u * threads];
#pragma unroll
    for (int u = 0; u < kReadUnroll; ++u) Fold(acc, r[u]);
  }
  for (; i < nvec; i += threads) Fold(acc, src[i]);
  acc = BlockXor(acc);
  __shared__ bool last;
  if (threadIdx.x == 0) {
    g_read_partials[blockIdx.x] = acc;
    __threadfence();
    last = atomicAdd(&g_read_done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  uint4 total = {0, 0, 0, 0};
  for (unsigned b = threadIdx.x; b < gridDim.x; b += kReadThreads) {
    Fold(total, __ldcg(&g_read_partials[b]));
  }
  total = BlockXor(total);
  if (threadIdx.x == 0) {
    *sum = total;
    g_read_done = 0;
  }
}

ffi::Error ReadStreamBlocks(int device, int* blocks) {
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  int per_sm = 0;
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, ReadStreamKernel, kReadThreads, 0));
  // One wave: a second, partial one would leave a tail of few blocks.
  *blocks = std::clamp(per_sm * info.sm_count, 1, kReadMaxBlocks);
  return ffi::Error::Success();
}

ffi::Error ReadStreamImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x,
                          ffi::Result<ffi::Buffer<ffi::U32>> sum) {
  constexpr std::string_view kOp = "jax_tma_bench_read";
  // Sub-byte buffers are packed: size_bytes() would overstate them.
  JAX_TMA_RETURN_IF_FAILED(CheckElementTypes(kOp, x.element_type(), x.element_type()));
  const auto bytes = static_cast<int64_t>(x.size_bytes());
  if (sum->dimensions().size() != 1 || sum->element_count() != 4) {
    return InvalidArgument(kOp, "the checksum is a (4,) uint32 array");
  }
  if ((reinterpret_cast<std::uintptr_t>(x.untyped_data()) | bytes) % 16 != 0) {
    return InvalidArgument(kOp, "address and size must be multiples of 16 B");
  }
  static PerDevice<int> grid;
  int blocks;
  JAX_TMA_RETURN_IF_FAILED(grid.Get(device, ReadStreamBlocks, &blocks));
  ReadStreamKernel<<<blocks, kReadThreads, 0, stream>>>(
      static_cast<const uint4*>(x.untyped_data()), bytes / 16,
      reinterpret_cast<uint4*>(sum->typed_data()));
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ffi::Error::Success();
}

// Write-only stream: y, shaped like x, filled with 0x5a bytes.
ffi::Error WriteStreamImpl(cudaStream_t stream, ffi::AnyBuffer x,
                           ffi::Result<ffi::AnyBuffer> y) {
  JAX_TMA_RETURN_IF_FAILED(
      CheckElementTypes("jax_tma_bench_write", x.element_type(), y->element_type()));
  if (y->size_bytes() != x.size_bytes()) {
    return InvalidArgument("jax_tma_bench_write", "y must have the size of x");
  }
  if (y->size_bytes() == 0) return ffi::Error::Success();
  JAX_TMA_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(y->untyped_data(), 0x5a, y->size_bytes(), stream));
  return ffi::Error::Success();
}

}  // namespace

// ---- cudaMemcpyPeerAsync, the link's ceiling (PeerCopyTime) ----------------

namespace bench {
namespace {

#define JAX_TMA_BENCH_CUDA_OR_THROW(expr)                                        \
  do {                                                                           \
    cudaError_t jax_tma_status_ = (expr);                                        \
    if (jax_tma_status_ != cudaSuccess) {                                        \
      throw std::runtime_error(                                                  \
          ::jax_tma::CudaError(#expr, jax_tma_status_, __FILE__, __LINE__).message()); \
    }                                                                            \
  } while (0)

// Spins for `ns` of the GPU's global timer. It holds a stream while the host
// queues the copies behind it, so that they run back to back rather than as
// fast as the host queues them (a small copy takes less time than queueing
// one).
__global__ void HoldStreamKernel(uint64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

// Restores the calling thread's current device on the way out.
struct CurrentDevice {
  int saved = 0;
  CurrentDevice() { cudaGetDevice(&saved); }
  ~CurrentDevice() { cudaSetDevice(saved); }
};

// One (source, destination) pair's buffers, stream and events, released on
// the way out, an error's included (cudaFree waits for the device first).
struct PeerPair {
  int src = 0;
  int dst = 0;
  void* from = nullptr;  // on src
  void* to = nullptr;    // on dst
  cudaStream_t stream = nullptr;  // on src, as are the events
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;

  PeerPair() = default;
  PeerPair(const PeerPair&) = delete;
  PeerPair& operator=(const PeerPair&) = delete;
  ~PeerPair() {
    cudaSetDevice(src);
    if (stop != nullptr) cudaEventDestroy(stop);
    if (start != nullptr) cudaEventDestroy(start);
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (from != nullptr) cudaFree(from);
    if (to != nullptr) {
      cudaSetDevice(dst);
      cudaFree(to);
    }
  }
};

// Lets `from` access `to`'s memory where the hardware can; whether it can.
// Access that jax_tma or XLA enabled first stays as it is.
bool EnablePeerAccess(int from, int to) {
  if (from == to) return true;
  int can = 0;
  JAX_TMA_BENCH_CUDA_OR_THROW(cudaDeviceCanAccessPeer(&can, from, to));
  if (can == 0) return false;
  JAX_TMA_BENCH_CUDA_OR_THROW(cudaSetDevice(from));
  const cudaError_t err = cudaDeviceEnablePeerAccess(to, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();  // resets the last error, which this call set
    return true;
  }
  JAX_TMA_BENCH_CUDA_OR_THROW(err);
  return true;
}

}  // namespace

PeerCopyTimes PeerCopyTime(const std::vector<std::pair<int, int>>& pairs, std::size_t bytes,
                           int iters) {
  if (pairs.empty() || bytes == 0 || iters < 1) {
    throw std::invalid_argument("_jax_tma_bench.peer_copy: needs a device pair, bytes > 0 and "
                                "iters >= 1 (got " + std::to_string(pairs.size()) + " pairs, " +
                                std::to_string(bytes) + " bytes, iters " +
                                std::to_string(iters) + ")");
  }
  const CurrentDevice restore;  // destroyed last: after the pairs' cleanup
  std::vector<PeerPair> p(pairs.size());
  PeerCopyTimes out;
  for (std::size_t k = 0; k < p.size(); ++k) {
    PeerPair& q = p[k];
    q.src = pairs[k].first;
    q.dst = pairs[k].second;
    const bool there = EnablePeerAccess(q.src, q.dst);
    const bool back = EnablePeerAccess(q.dst, q.src);
    out.peer_access.push_back(there && back);
    JAX_TMA_BENCH_CUDA_OR_THROW(cudaSetDevice(q.dst));
    JAX_TMA_BENCH_CUDA_OR_THROW(cudaMalloc(&q.to, bytes));
    JAX_TMA_BENCH_CUDA_OR_THROW(cudaSetDevice(q.src));
    JAX_TMA_BENCH_CUDA_OR_THROW(cudaMalloc(&q.from, bytes));
    JAX_TMA_BENCH_CUDA_OR_THROW(cudaMemset(q.from, 0x5a, bytes));
    JAX_TMA_BENCH_CUDA_OR_THROW(cudaStreamCreateWithFlags(&q.stream, cudaStreamNonBlocking));
    JAX_TMA_BENCH_CUDA_OR_THROW(cudaEventCreate(&q.start));
    JAX_TMA_BENCH_CUDA_OR_THROW(cudaEventCreate(&q.stop));
  }
  // One copy per pair first, untimed: the link's and the driver's first use.
  for (PeerPair& q : p) {
    JAX_TMA_BENCH_CUDA_OR_THROW(
        cudaMemcpyPeerAsync(q.to, q.dst, q.from, q.src, bytes, q.stream));
  }
  for (PeerPair& q : p) JAX_TMA_BENCH_CUDA_OR_THROW(cudaStreamSynchronize(q.stream));
  // Every stream held for 1 ms plus 20 µs per copy queued (several times what
  // queueing one takes), then started alike, so that the pairs' copies run
  // at once.
  out.hold_us = 1000.0 + 20.0 * static_cast<double>(iters) * static_cast<double>(p.size());
  for (PeerPair& q : p) {
    JAX_TMA_BENCH_CUDA_OR_THROW(cudaSetDevice(q.src));
    HoldStreamKernel<<<1, 1, 0, q.stream>>>(static_cast<uint64_t>(out.hold_us * 1e3));
    JAX_TMA_BENCH_CUDA_OR_THROW(cudaGetLastError());
    JAX_TMA_BENCH_CUDA_OR_THROW(cudaEventRecord(q.start, q.stream));
  }
  const auto queued = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    for (PeerPair& q : p) {
      JAX_TMA_BENCH_CUDA_OR_THROW(
          cudaMemcpyPeerAsync(q.to, q.dst, q.from, q.src, bytes, q.stream));
    }
  }
  for (PeerPair& q : p) {
    JAX_TMA_BENCH_CUDA_OR_THROW(cudaSetDevice(q.src));
    JAX_TMA_BENCH_CUDA_OR_THROW(cudaEventRecord(q.stop, q.stream));
  }
  out.queue_us = std::chrono::duration<double, std::micro>(
                     std::chrono::steady_clock::now() - queued).count();
  for (PeerPair& q : p) {
    JAX_TMA_BENCH_CUDA_OR_THROW(cudaEventSynchronize(q.stop));
    float ms = 0;
    JAX_TMA_BENCH_CUDA_OR_THROW(cudaEventElapsedTime(&ms, q.start, q.stop));
    out.us_per_copy.push_back(static_cast<double>(ms) * 1e3 / iters);
  }
  return out;
}

#undef JAX_TMA_BENCH_CUDA_OR_THROW

}  // namespace bench
}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaBenchSeedCopyCuda, jax_tma::SeedCopyImpl,
    xla::ffi::Ffi::Bind()
        .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()  // stream
        .Ctx<xla::ffi::DeviceOrdinal>()                 // device
        .Arg<xla::ffi::AnyBuffer>()                     // x
        .Ret<xla::ffi::AnyBuffer>(),                    // y
    {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaBenchMemcpyCuda, jax_tma::MemcpyImpl,
    xla::ffi::Ffi::Bind()
        .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()  // stream
        .Arg<xla::ffi::AnyBuffer>()                     // x
        .Ret<xla::ffi::AnyBuffer>(),                    // y
    {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaBenchReadCuda, jax_tma::ReadStreamImpl,
    xla::ffi::Ffi::Bind()
        .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()  // stream
        .Ctx<xla::ffi::DeviceOrdinal>()                 // device
        .Arg<xla::ffi::AnyBuffer>()                     // x
        .Ret<xla::ffi::Buffer<xla::ffi::U32>>(),        // checksum
    {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaBenchWriteCuda, jax_tma::WriteStreamImpl,
    xla::ffi::Ffi::Bind()
        .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()  // stream
        .Arg<xla::ffi::AnyBuffer>()                     // x
        .Ret<xla::ffi::AnyBuffer>(),                    // y
    {xla::ffi::Traits::kCmdBufferCompatible});
