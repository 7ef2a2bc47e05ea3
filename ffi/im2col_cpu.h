// Handler symbol of the CPU im2col target "jax_tma_im2col" (and col2im).
#ifndef JAX_TMA_FFI_IM2COL_CPU_H_
#define JAX_TMA_FFI_IM2COL_CPU_H_

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaIm2colCpu);

#endif  // JAX_TMA_FFI_IM2COL_CPU_H_
