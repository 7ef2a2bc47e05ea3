// Handler symbols of the CUDA targets, JaxTma<Name>Cuda for every
// JAX_TMA_CUDA_TARGET of the family list (../families.inc; defined in
// <op>/<op>_cuda.cc), the instantiate stages and the FFI state types the
// manifests declare; module.cc hands them to Python. The CPU handlers are declared in
// ../handlers.h.
#ifndef JAX_TMA_FFI_CUDA_HANDLERS_H_
#define JAX_TMA_FFI_CUDA_HANDLERS_H_

#include "xla/ffi/api/ffi.h"

#define JAX_TMA_CUDA_TARGET(Name, target) XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTma##Name##Cuda);
#define JAX_TMA_CUDA_INSTANTIATE(Name, target) \
  XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTma##Name##CudaInstantiate);
#include "../families.inc"

namespace jax_tma {
// An FFI state type's TypeId and TypeInfo, registered with XLA before the
// targets.
#define JAX_TMA_CUDA_STATE(Name, type) \
  void* Name##TypeId();                \
  const void* Name##TypeInfo();
#include "../families.inc"
}  // namespace jax_tma

#endif  // JAX_TMA_FFI_CUDA_HANDLERS_H_
