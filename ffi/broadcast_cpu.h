// Handler symbol of the CPU broadcast target "jax_tma_broadcast".
#ifndef JAX_TMA_FFI_BROADCAST_CPU_H_
#define JAX_TMA_FFI_BROADCAST_CPU_H_

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaBroadcastCpu);

#endif  // JAX_TMA_FFI_BROADCAST_CPU_H_
