// Launchers of the im2col kernels shared by the FFI handler and the
// selftest: the SIMT kernels (any geometry, both patch orders, and col2im)
// and the TMA im2col-mode kernel (tap-major im2col where its rules hold).
#ifndef JAX_TMA_FFI_CUDA_IM2COL_LAUNCH_H_
#define JAX_TMA_FFI_CUDA_IM2COL_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <string>

#include "../im2col_common.h"

namespace jax_tma {

// im2col (g.transpose false) or col2im (true) of any geometry, any order.
ffi::Error LaunchSimtIm2col(const Im2colGeometry& g, const void* src, void* dst,
                            cudaStream_t stream, int device);

// True when the TMA im2col kernel computes this im2col exactly; otherwise
// false with `*why` set to the first rule it breaks, phrased for a user, e.g.
// "strides[0] = 9 is over the hardware's traversal-stride limit 8". `x` and
// `out` are device addresses (only their alignment is looked at). Pure host
// arithmetic, no CUDA calls: safe for method="auto".
bool TmaIm2colFits(const Im2colGeometry& g, const void* x, const void* out, std::string* why);

// Runs the TMA im2col kernel on `stream`; tensor maps encoded per call; no
// allocation, no synchronisation. InvalidArgument (the TmaIm2colFits reason)
// where it cannot run.
ffi::Error LaunchTmaIm2col(const Im2colGeometry& g, const void* x, void* out,
                           cudaStream_t stream, int device);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_CUDA_IM2COL_LAUNCH_H_
