// Handler symbols of the CUDA targets.
#ifndef JAX_TMA_FFI_CUDA_COPY_CUDA_H_
#define JAX_TMA_FFI_CUDA_COPY_CUDA_H_

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaCopyCuda);          // "jax_tma_copy"
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaCopyCudaInstantiate);  // its instantiate stage
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaWindowCuda);        // "jax_tma_window"
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaPpermuteCuda);      // "jax_tma_ppermute"
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaIm2colCuda);        // "jax_tma_im2col"

namespace jax_tma {
// The FFI type of "jax_tma_copy"'s per-call-site state (its TypeId and
// TypeInfo), registered with XLA before the target.
void* CopySiteTypeId();
const void* CopySiteTypeInfo();
}  // namespace jax_tma

#endif  // JAX_TMA_FFI_CUDA_COPY_CUDA_H_
