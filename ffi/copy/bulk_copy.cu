// The bulk TMA copy kernel and its launcher: each CTA streams 16-B-aligned
// chunks global -> shared -> global with cp.async.bulk, several stages in
// flight. Two schedules share the kernel (copy_plan.h lays them out):
// - static: CTA b copies the contiguous chunks [b * per_cta, (b+1) * per_cta);
//   the grid holds many more CTAs than fit at once, so the block scheduler
//   hands them to whichever SM is free;
// - dynamic: one CTA per free CTA slot of the GPU; each copies its first
//   per_cta chunks as above, then claims chunks one at a time from a work
//   counter in device memory, so that every SM keeps its stages in flight
//   until the copy ends.
// Unaligned head/tail bytes are copied by CTA 0 in the same launch. Static
// plans of one chunk a CTA take BulkChunkKernel, the same copy without the
// pipeline.
#include <string>

#include "copy/bulk_pipeline.cuh"
#include "copy/copy_launch.h"
#include "cuda/device_info.h"
#include "cuda/launch.h"

namespace jax_tma {
namespace {

constexpr int kBulkThreads = 32;

// Per counter slot: [0] chunks claimed past the static round, [1] CTAs
// finished. The last CTA of a launch zeroes both, so every launch starts from
// zero; launches that share a slot must not overlap in time (see
// AcquireBulkCounterSlot). One array per device (module globals are per
// context).
__device__ unsigned long long g_bulk_counters[kBulkCounterSlots][2];

// Bytes [0, head) and [head + body, bytes) are edges; the body starts 16-B
// aligned in both buffers and its length is a multiple of 16. counter_slot < 0
// selects the static schedule.
__global__ void __launch_bounds__(kBulkThreads)
    BulkCopyKernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst,
                   int64_t bytes, int64_t head, int64_t body, uint32_t chunk,
                   int stages, int64_t chunks_per_cta, int counter_slot) {
#if JAX_TMA_HAS_BULK_COPY
  using namespace device;
  extern __shared__ __align__(128) uint8_t stage_buf[];
  __shared__ uint64_t full[kMaxBulkStages];
  __shared__ int64_t chunk_of[kMaxBulkStages];  // chunk held by each stage

  CopyBulkEdges(src, dst, bytes, head, body, blockIdx.x);
  if (threadIdx.x != 0) return;
  unsigned long long* counters =
      counter_slot >= 0 ? g_bulk_counters[counter_slot] : nullptr;
  StreamBulkChunks(src, dst, head, body, chunk, stages, chunks_per_cta, blockIdx.x, gridDim.x,
                   counters, stage_buf, full, chunk_of);
  if (counters != nullptr) {
    // Every CTA's claims precede its finish count; the last one to finish
    // sees all claims done and resets the slot for the next launch.
    __threadfence();
    if (atomicAdd(&counters[1], 1ull) == gridDim.x - 1) {
      atomicExch(&counters[0], 0ull);
      atomicExch(&counters[1], 0ull);
    }
  }
#endif
}

// A one-chunk plan (BulkCopyPlan::one_chunk: bodies of up to one chunk an
// SM): CTA b copies chunk b, one bulk load and one bulk store, without
// the pipeline's bookkeeping. A tiny copy's time is then what those two cost
// (at 8 KiB, 0.35 µs a call less than BulkCopyKernel's: benchmarks/TUNING.md).
__global__ void __launch_bounds__(kBulkThreads)
    BulkChunkKernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst, int64_t bytes,
                    int64_t head, int64_t body, uint32_t chunk) {
#if JAX_TMA_HAS_BULK_COPY
  using namespace device;
  extern __shared__ __align__(128) uint8_t buf[];
  __shared__ uint64_t full;
  CopyBulkEdges(src, dst, bytes, head, body, blockIdx.x);
  if (threadIdx.x != 0) return;
  const int64_t at = head + static_cast<int64_t>(blockIdx.x) * chunk;
  const auto n = static_cast<uint32_t>(min(static_cast<int64_t>(chunk), head + body - at));
  CopyOneBulkChunk(src + at, dst + at, n, buf, &full);
#endif
}

}  // namespace

ffi::Error AllowBulkSmem(const void* kernel, int device, int* limit) {
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  // The opt-in limit covers static shared memory too: leave the mbarriers room.
  *limit = info.smem_per_block_optin - kStaticSmemAllowance;
  JAX_TMA_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, *limit));
  return ffi::Error::Success();
}

ffi::Error LaunchBulkCopy(const void* src, void* dst, std::size_t bytes,
                          cudaStream_t stream, int device,
                          const BulkCopyConfig& config, int counter_slot) {
  constexpr std::string_view kOp = "jax_tma.copy(method='tma')";
  if (bytes == 0) return ffi::Error::Success();
  // No common aligned body: the SIMT kernel (also one launch) copies it all.
  if (!HasBulkBody(src, dst)) return LaunchSimtCopy(src, dst, bytes, stream, device);
  std::string why;
  if (!CheckBulkCopyConfig(config, counter_slot, &why)) return InvalidArgument(kOp, why);
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  static PerDevice<int> smem_limit;
  int limit = 0;
  JAX_TMA_RETURN_IF_FAILED(smem_limit.Get(
      device,
      [](int d, int* l) {
        return AllowBulkSmem(reinterpret_cast<const void*>(BulkCopyKernel), d, l);
      },
      &limit));
  int per_sm = 0;
  if (config.dynamic) {
    JAX_TMA_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, BulkCopyKernel, kBulkThreads,
        static_cast<std::size_t>(config.stages) * config.chunk_bytes));
  }
  BulkCopyPlan plan;
  if (!PlanBulkCopy(config, counter_slot, bytes, src, info.sm_count, per_sm, &plan, &why)) {
    return InvalidArgument(kOp, why);
  }
  if (plan.smem > static_cast<std::size_t>(limit)) {
    return InvalidArgument(kOp, config.stages, " stages of ", plan.chunk,
                           " B need ", plan.smem, " B of shared memory; device ",
                           device, " allows ", limit, " B");
  }
  if (plan.one_chunk) {
    BulkChunkKernel<<<static_cast<int>(plan.blocks), kBulkThreads, plan.chunk, stream>>>(
        static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst),
        static_cast<int64_t>(bytes), plan.head, plan.body, plan.chunk);
    JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return ffi::Error::Success();
  }
  BulkCopyKernel<<<static_cast<int>(plan.blocks), kBulkThreads, plan.smem, stream>>>(
      static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst),
      static_cast<int64_t>(bytes), plan.head, plan.body, plan.chunk, config.stages,
      plan.chunks_per_cta, config.dynamic ? counter_slot : -1);
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ffi::Error::Success();
}

}  // namespace jax_tma
