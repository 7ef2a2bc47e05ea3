// Launchers of the whole-buffer copy kernels (bulk TMA pipeline, SIMT) and the
// method dispatch shared by the FFI handlers (copy, ppermute) and the raw
// launch hook of the benchmarks' module (benchmarks/ffi/bench_module.cc).
#ifndef JAX_TMA_FFI_COPY_COPY_LAUNCH_H_
#define JAX_TMA_FFI_COPY_COPY_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string_view>

#include "common.h"
#include "copy/copy_plan.h"

namespace jax_tma {

// Copies with `config` (PlanBulkCopy), or with the SIMT kernel where src and
// dst differ modulo 16 B. Errors name jax_tma.copy(method='bulk').
ffi::Error LaunchBulkCopy(const void* src, void* dst, std::size_t bytes,
                          cudaStream_t stream, int device,
                          const BulkCopyConfig& config, int counter_slot);

// Any size and alignment.
ffi::Error LaunchSimtCopy(const void* src, void* dst, std::size_t bytes,
                          cudaStream_t stream, int device);

// Picks the kernel for `method` on `device` (ChooseCopyKernel) and launches
// it; *ran, when not null, says which. Without `config`, bulk copies take
// ChooseBulkCopyConfig's. method="bulk" on a device without TMA is an error
// naming `op`.
ffi::Error LaunchCopy(std::string_view op, CopyMethod method, const void* src,
                      void* dst, std::size_t bytes, cudaStream_t stream,
                      int device, int counter_slot = kNoCounterSlot,
                      const BulkCopyConfig* config = nullptr, CopyKernel* ran = nullptr);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_COPY_COPY_LAUNCH_H_
