// Handler symbols of the CPU targets "jax_tma_gather" and "jax_tma_scatter".
#ifndef JAX_TMA_FFI_GATHER_GATHER_CPU_H_
#define JAX_TMA_FFI_GATHER_GATHER_CPU_H_

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaGatherCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaScatterCpu);

#endif  // JAX_TMA_FFI_GATHER_GATHER_CPU_H_
