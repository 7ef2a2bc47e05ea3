// Launchers of the im2col kernels: the SIMT kernels (any geometry, both patch
// orders, and col2im) and the TMA im2col-mode kernel (tap-major im2col, as
// PlanIm2col planned it), and of a planned call (LaunchIm2col). No
// allocation, no synchronisation (CUDA-graph safe); tensor maps are encoded
// on every call.
#ifndef JAX_TMA_FFI_IM2COL_IM2COL_LAUNCH_H_
#define JAX_TMA_FFI_IM2COL_IM2COL_LAUNCH_H_

#include <cuda_runtime_api.h>

#include "im2col/im2col_common.h"
#include "im2col/im2col_plan.h"

namespace jax_tma {

// im2col (g.transpose false) or col2im (true) of any geometry, any order.
ffi::Error LaunchSimtIm2col(const Im2colGeometry& g, const void* src, void* dst,
                            cudaStream_t stream, int device);

// Runs the TMA im2col kernel on `stream` with the jobs, tensor maps (their
// addresses included) and grid of `plan` (non-empty).
ffi::Error LaunchTmaIm2col(const Im2colGeometry& g, const TmaIm2colPlan& plan,
                           cudaStream_t stream, int device);

// Runs the kernel of `plan` (PlanIm2col) and counts its path.
ffi::Error LaunchIm2col(const Im2colGeometry& g, const Im2colPlan& plan, const void* x,
                        void* out, cudaStream_t stream, int device);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_IM2COL_IM2COL_LAUNCH_H_
