// Handler symbols of the CPU targets, JaxTma<Name>Cpu for every
// JAX_TMA_CPU_TARGET of the family list (families.inc; defined in
// <op>/<op>_cpu.cc); module.cc hands them to Python. The CUDA handlers are
// declared in cuda/handlers.h.
#ifndef JAX_TMA_FFI_HANDLERS_H_
#define JAX_TMA_FFI_HANDLERS_H_

#include "xla/ffi/api/ffi.h"

#define JAX_TMA_CPU_TARGET(Name, target) XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTma##Name##Cpu);
#include "families.inc"

#endif  // JAX_TMA_FFI_HANDLERS_H_
