// Launchers of the window kernels: the TMA tiled kernel (forward only, as
// PlanWindow planned it) and the SIMT kernel (its vector form, or its row
// form for any geometry, forward or transpose), and of a planned call (LaunchWindow). Both kernels read the
// starts from device memory, allocate nothing and synchronise nothing
// (CUDA-graph safe); tensor maps are encoded on every call.
#ifndef JAX_TMA_FFI_WINDOW_WINDOW_LAUNCH_H_
#define JAX_TMA_FFI_WINDOW_WINDOW_LAUNCH_H_

#include <cuda_runtime_api.h>

#include "window/window_common.h"
#include "window/window_plan.h"

namespace jax_tma {

// Computes the window at the start indices g.starts on `stream` with the
// tiles, tensor maps (their addresses included) and grid of `plan`
// (non-empty).
ffi::Error LaunchTiledWindow(const WindowGeometry& g, const TiledWindowPlan& plan,
                             cudaStream_t stream, int device);

// The SIMT kernel in the form `plan` took (kVector or kRows: any geometry,
// forward or transpose).
ffi::Error LaunchSimtWindow(const WindowGeometry& g, const WindowPlan& plan, const void* src,
                            void* dst, cudaStream_t stream, int device);

// Runs the kernel of `plan` (PlanWindow) and counts its path.
ffi::Error LaunchWindow(const WindowGeometry& g, const WindowPlan& plan, const void* src,
                        void* dst, cudaStream_t stream, int device);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_WINDOW_WINDOW_LAUNCH_H_
