// CUDA driver functions without linking libcuda: each is resolved once
// through cudaGetDriverEntryPointByVersion, so the extension links only the
// static cudart and loads on machines whose driver is newer than the build's
// toolkit.
#ifndef JAX_TMA_FFI_CUDA_DRIVER_API_H_
#define JAX_TMA_FFI_CUDA_DRIVER_API_H_

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>

#include "../common.h"

namespace jax_tma {

// A driver entry point, or why it could not be had.
template <typename Fn>
struct DriverEntry {
  Fn fn = nullptr;
  std::string error;  // why fn is null
};

// Resolves `name` at ABI version `version` (what the PFN_*_v<version>
// typedefs of <cudaTypedefs.h> describe on every newer driver).
template <typename Fn>
DriverEntry<Fn> ResolveDriverEntry(const char* name, int version) {
  DriverEntry<Fn> e;
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult qres = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &qres);
  if (err != cudaSuccess || qres != cudaDriverEntryPointSuccess || fn == nullptr) {
    Message os;
    os << "cannot resolve the driver entry point " << name << " (v" << version << "): "
       << "cudaGetDriverEntryPointByVersion returned " << cudaGetErrorName(err)
       << " with query result "
       << (qres == cudaDriverEntryPointSuccess           ? "success"
           : qres == cudaDriverEntryPointSymbolNotFound ? "symbol not found"
                                                        : "driver version not sufficient")
       << (fn == nullptr ? " and no function" : "");
    e.error = os.str();
  } else {
    e.fn = reinterpret_cast<Fn>(fn);
  }
  return e;
}

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_CUDA_DRIVER_API_H_
