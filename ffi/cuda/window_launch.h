// Launchers of the window kernels (SIMT; the TMA tiled path lives in
// tiled_window.h) shared by the FFI handler.
#ifndef JAX_TMA_FFI_CUDA_WINDOW_LAUNCH_H_
#define JAX_TMA_FFI_CUDA_WINDOW_LAUNCH_H_

#include <cuda_runtime_api.h>

#include "../window_common.h"

namespace jax_tma {

// Any geometry, forward or transpose; g.starts point to device memory.
ffi::Error LaunchSimtWindow(const WindowGeometry& g, const void* src, void* dst,
                            cudaStream_t stream, int device);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_CUDA_WINDOW_LAUNCH_H_
