// Host launchers of the whole-buffer copy kernels (bulk TMA pipeline and SIMT
// fallback) and the method dispatch shared by the FFI handler and the raw
// test/benchmark hook.
#ifndef JAX_TMA_FFI_CUDA_COPY_LAUNCH_H_
#define JAX_TMA_FFI_CUDA_COPY_LAUNCH_H_

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "../common.h"

namespace jax_tma {

// Shape of the bulk pipeline: each CTA streams `chunks_per_cta` chunks of
// `chunk_bytes` through `stages` shared-memory buffers.
struct BulkCopyConfig {
  uint32_t chunk_bytes;
  int stages;
  int64_t chunks_per_cta;
};

// Measured on H100 (jax_tma.bench tune-bulk, 2026-11-22): one round of
// 4 x 32 KiB per CTA, with the block scheduler handing out CTAs, beat every
// multi-round (persistent) shape at 64 MiB and 1 GiB.
inline constexpr BulkCopyConfig kDefaultBulkCopyConfig{32 * 1024, 4, 4};
inline constexpr int kMaxBulkStages = 8;

// method="auto" uses the bulk kernel from this size up (see LaunchCopy).
inline constexpr std::size_t kAutoBulkMinBytes = std::size_t{64} << 20;

ffi::Error LaunchBulkCopy(const void* src, void* dst, std::size_t bytes,
                          cudaStream_t stream, int device,
                          const BulkCopyConfig& config);

ffi::Error LaunchSimtCopy(const void* src, void* dst, std::size_t bytes,
                          cudaStream_t stream, int device);

// Picks the kernel for `method` on `device` (auto: bulk where TMA exists
// and the copy is at least kAutoBulkMinBytes, else SIMT) and launches it.
// Errors name `op`.
ffi::Error LaunchCopy(std::string_view op, CopyMethod method, const void* src,
                      void* dst, std::size_t bytes, cudaStream_t stream,
                      int device,
                      const BulkCopyConfig& config = kDefaultBulkCopyConfig);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_CUDA_COPY_LAUNCH_H_
