// Status plumbing for CUDA runtime calls inside FFI handlers: every call's
// failure becomes an ffi::Error naming the file, line, expression and the
// CUDA error string. Nothing throws and nothing aborts.
#ifndef JAX_TMA_FFI_CUDA_CUDA_STATUS_H_
#define JAX_TMA_FFI_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "../common.h"

namespace jax_tma {

inline ffi::Error CudaError(const char* expr, cudaError_t err, const char* file,
                            int line) {
  Message os;
  os << file << ":" << line << ": operation " << expr
     << " failed: " << cudaGetErrorName(err) << " (" << cudaGetErrorString(err)
     << ")";
  return ffi::Error::Internal(os.str());
}

}  // namespace jax_tma

#define JAX_TMA_CUDA_RETURN_IF_ERROR(expr)                                  \
  do {                                                                      \
    cudaError_t jax_tma_status_ = (expr);                                   \
    if (jax_tma_status_ != cudaSuccess) {                                   \
      return ::jax_tma::CudaError(#expr, jax_tma_status_, __FILE__,         \
                                  __LINE__);                                \
    }                                                                       \
  } while (0)

#endif  // JAX_TMA_FFI_CUDA_CUDA_STATUS_H_
