// Handler symbol of the CUDA broadcast target "jax_tma_broadcast".
#ifndef JAX_TMA_FFI_CUDA_BROADCAST_CUDA_H_
#define JAX_TMA_FFI_CUDA_BROADCAST_CUDA_H_

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaBroadcastCuda);

#endif  // JAX_TMA_FFI_CUDA_BROADCAST_CUDA_H_
