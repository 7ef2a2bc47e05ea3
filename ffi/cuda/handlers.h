// Handler symbols of the CUDA targets, one per op family (defined in
// <op>/<op>_cuda.cc), and the copy target's instantiate stage and state type;
// module.cc hands them to Python. The CPU handlers are declared in
// ../handlers.h.
#ifndef JAX_TMA_FFI_CUDA_HANDLERS_H_
#define JAX_TMA_FFI_CUDA_HANDLERS_H_

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaCopyCuda);             // "jax_tma_copy"
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaCopyCudaInstantiate);  // its instantiate stage
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaWindowCuda);           // "jax_tma_window"
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaIm2colCuda);           // "jax_tma_im2col"
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaBroadcastCuda);        // "jax_tma_broadcast"
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaPpermuteCuda);         // "jax_tma_ppermute"
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaGatherCuda);           // "jax_tma_gather"
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaScatterCuda);          // "jax_tma_scatter"

namespace jax_tma {
// The FFI type of "jax_tma_copy"'s per-call-site state (its TypeId and
// TypeInfo), registered with XLA before the target.
void* CopySiteTypeId();
const void* CopySiteTypeInfo();
}  // namespace jax_tma

#endif  // JAX_TMA_FFI_CUDA_HANDLERS_H_
