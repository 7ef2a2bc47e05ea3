// Handler symbols of the CUDA targets "jax_tma_gather" and "jax_tma_scatter".
#ifndef JAX_TMA_FFI_GATHER_GATHER_CUDA_H_
#define JAX_TMA_FFI_GATHER_GATHER_CUDA_H_

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaGatherCuda);   // "jax_tma_gather"
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaScatterCuda);  // "jax_tma_scatter"

#endif  // JAX_TMA_FFI_GATHER_GATHER_CUDA_H_
