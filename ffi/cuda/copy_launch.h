// Host launchers of the whole-buffer copy kernels (bulk TMA pipeline and SIMT
// fallback) and the method dispatch shared by the FFI handler and the raw
// launch hook of the benchmarks' module (benchmarks/ffi/bench_module.cc).
#ifndef JAX_TMA_FFI_CUDA_COPY_LAUNCH_H_
#define JAX_TMA_FFI_CUDA_COPY_LAUNCH_H_

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "../common.h"

namespace jax_tma {

// Shape of the bulk pipeline: each CTA streams `chunks_per_cta` chunks of
// `chunk_bytes` through `stages` shared-memory buffers (static schedule), or
// `chunks_per_cta` chunks and then chunks claimed from a work counter
// (dynamic).
struct BulkCopyConfig {
  uint32_t chunk_bytes;
  int stages;
  int64_t chunks_per_cta;
  bool dynamic = false;
};

// Measured on H100 (benchmarks/bench_tune_bulk.py, 2026-11-22): one round of
// 4 x 32 KiB per CTA, with the block scheduler handing out CTAs, beat every
// multi-round static shape at 64 MiB and 1 GiB.
inline constexpr BulkCopyConfig kDefaultBulkCopyConfig{32 * 1024, 4, 4};
// The dynamic schedule, from kDynamicBulkMinBytes up where a counter slot is
// available. H100 (2026-11-22, profiler-timed dev harness, x cudaMemcpyAsync):
// 8 KiB x 16 stages, 16 static chunks per CTA: 1.001 / 1.000 / 1.001 at
// 64 MiB / 256 MiB / 1 GiB, against 0.967 / 0.985 / 0.993 for the static
// default. With 8 KiB x 8, 16 KiB x 8 or 32 KiB x 4 stages the dynamic
// schedule was 0.2-1.5% slower at 256 MiB and 1 GiB. 4 static chunks per
// CTA against 16 (later run, same harness, repeated / after a 192 MiB write):
// 0.989 / 1.012 against 0.979 / 0.999 at 32 MiB, 0.990 / 0.995 against
// 0.977 / 0.995 at 48 MiB, 0.980 / 0.990 against 0.973 / 0.983 at 64 MiB,
// 0.998 against 0.996 at 256 MiB and 1.004 against 1.002 at 1 GiB.
inline constexpr BulkCopyConfig kDynamicBulkCopyConfig{8 * 1024, 16, 4, true};
inline constexpr std::size_t kDynamicBulkMinBytes = std::size_t{32} << 20;
inline constexpr int kMaxBulkStages = 16;

// Work counters of the dynamic schedule. A launch that uses a slot must not
// overlap in time with another launch on the same slot and device: each FFI
// call site owns one (an XLA executable never runs concurrently with itself
// on a device); the raw hook, whose launches its callers keep on one stream,
// uses kRawCounterSlot (in its own module, so its own copy of the counters).
inline constexpr int kBulkCounterSlots = 1024;
inline constexpr int kRawCounterSlot = 0;
inline constexpr int kNoCounterSlot = -1;
// A free slot for a call site, or kNoCounterSlot when all are taken (the call
// site then copies with the static schedule).
int AcquireBulkCounterSlot();
void ReleaseBulkCounterSlot(int slot);

// method="auto" uses the bulk kernel from this size up (see LaunchCopy).
// H100 (2026-11-22, dev harness, x cudaMemcpyAsync, repeated / after a
// 192 MiB write), SIMT against the dynamic bulk schedule: 0.999 / 0.987
// against 0.989 / 1.012 at 32 MiB, 0.962 / 0.979 against 0.984 / 0.999 at
// 40 MiB, 0.935 / 0.953 against 0.990 / 0.995 at 48 MiB, 0.914 / 0.942
// against 0.980 / 0.990 at 64 MiB. Below 32 MiB SIMT leads: 0.97-1.01 /
// 1.03-1.12 against 0.77-0.88 / 0.97-1.02 at 12-24 MiB.
inline constexpr std::size_t kAutoBulkMinBytes = kDynamicBulkMinBytes;

ffi::Error LaunchBulkCopy(const void* src, void* dst, std::size_t bytes,
                          cudaStream_t stream, int device,
                          const BulkCopyConfig& config, int counter_slot);

ffi::Error LaunchSimtCopy(const void* src, void* dst, std::size_t bytes,
                          cudaStream_t stream, int device);

// Picks the kernel for `method` on `device` (auto: bulk where TMA exists
// and the copy is at least kAutoBulkMinBytes, else SIMT) and launches it.
// Without `config`, bulk copies of at least kDynamicBulkMinBytes take the
// dynamic schedule on `counter_slot` when one is given, else the default
// static one. Errors name `op`.
ffi::Error LaunchCopy(std::string_view op, CopyMethod method, const void* src,
                      void* dst, std::size_t bytes, cudaStream_t stream,
                      int device, int counter_slot = kNoCounterSlot,
                      const BulkCopyConfig* config = nullptr);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_CUDA_COPY_LAUNCH_H_
