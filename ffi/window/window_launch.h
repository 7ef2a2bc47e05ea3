// Launchers of the window kernels: the TMA tiled kernel (forward only, where
// TiledWindowFits) and the SIMT kernel (any geometry, forward or transpose).
// Both read the starts from device memory, allocate nothing and synchronise
// nothing (CUDA-graph safe); tensor maps are encoded on every call.
#ifndef JAX_TMA_FFI_WINDOW_WINDOW_LAUNCH_H_
#define JAX_TMA_FFI_WINDOW_WINDOW_LAUNCH_H_

#include <cuda_runtime_api.h>

#include "window/window_common.h"
#include "window/window_plan.h"

namespace jax_tma {

// Computes the window of `src` at the start indices g.starts into `dst` on
// `stream`. InvalidArgument when the window does not fit (the
// TiledWindowFits reason) or `device` has no TMA.
ffi::Error LaunchTiledWindow(const WindowGeometry& g, const void* src, void* dst,
                             cudaStream_t stream, int device);

// Any geometry, forward or transpose.
ffi::Error LaunchSimtWindow(const WindowGeometry& g, const void* src, void* dst,
                            cudaStream_t stream, int device);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_WINDOW_WINDOW_LAUNCH_H_
