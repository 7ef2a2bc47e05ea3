// Handler symbol of the CPU target "jax_tma_ppermute".
#ifndef JAX_TMA_FFI_PPERMUTE_CPU_H_
#define JAX_TMA_FFI_PPERMUTE_CPU_H_

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaPpermuteCpu);

#endif  // JAX_TMA_FFI_PPERMUTE_CPU_H_
