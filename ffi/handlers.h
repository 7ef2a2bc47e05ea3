// Handler symbols of the CPU targets, one per op family (defined in
// <op>/<op>_cpu.cc); module.cc hands them to Python. The CUDA handlers are
// declared in cuda/handlers.h.
#ifndef JAX_TMA_FFI_HANDLERS_H_
#define JAX_TMA_FFI_HANDLERS_H_

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaCopyCpu);              // "jax_tma_copy"
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaWindowCpu);            // "jax_tma_window"
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaIm2colCpu);            // "jax_tma_im2col"
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaBroadcastCpu);         // "jax_tma_broadcast"
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaPpermuteCpu);          // "jax_tma_ppermute"
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaGatherCpu);            // "jax_tma_gather"
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaScatterCpu);           // "jax_tma_scatter"

#endif  // JAX_TMA_FFI_HANDLERS_H_
