// Launchers of the whole-buffer copy kernels (TMA bulk pipeline, SIMT) and of
// a planned copy (PlanCopy), shared by the FFI handlers that copy whole
// buffers and the raw launch hook of the benchmarks' module
// (benchmarks/ffi/bench_module.cc).
#ifndef JAX_TMA_FFI_COPY_COPY_LAUNCH_H_
#define JAX_TMA_FFI_COPY_COPY_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "common.h"
#include "copy/copy_plan.h"
#include "cuda/device_info.h"

namespace jax_tma {

// Copies with `config` (PlanBulkCopy), or with the SIMT kernel where src and
// dst differ modulo 16 B. Errors name jax_tma.copy(method='tma').
ffi::Error LaunchBulkCopy(const void* src, void* dst, std::size_t bytes,
                          cudaStream_t stream, int device,
                          const BulkCopyConfig& config, int counter_slot);

// Lets `kernel`, a kernel of the bulk pipeline (bulk_pipeline.cuh), use
// `device`'s opt-in shared memory less room for its static part: *limit.
ffi::Error AllowBulkSmem(const void* kernel, int device, int* limit);

// Any size and alignment.
ffi::Error LaunchSimtCopy(const void* src, void* dst, std::size_t bytes,
                          cudaStream_t stream, int device);

// Runs the kernel of `plan` over the bytes of `c` on `stream`.
ffi::Error LaunchCopy(const CopyPlan& plan, const ByteCopy& c, cudaStream_t stream, int device);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_COPY_COPY_LAUNCH_H_
