// The TMA tiled path of jax_tma.window (forward only): a tensor-map load of
// each strided box of the input (hardware out-of-bounds handling) and a
// tensor-map store of it into the output, pipelined through shared memory.
// Geometry and semantics: window_common.h.
#ifndef JAX_TMA_FFI_CUDA_TILED_WINDOW_H_
#define JAX_TMA_FFI_CUDA_TILED_WINDOW_H_

#include <cuda_runtime_api.h>

#include <string>

#include "../window_common.h"

namespace jax_tma {

// True when the TMA path computes this window exactly; otherwise false with
// `*why` set to the first rule it breaks, phrased for a user, e.g.
// "strides[1] = 9 is over the hardware's 8" or
// "x row stride 18 B is not a multiple of 16". `src` / `dst` are the input
// and output device addresses (only their alignment is looked at). A window
// with no elements fits (LaunchTiledWindow launches nothing). Any fill value
// fits: out-of-bounds elements get g.fill_bits exactly (NaN payloads
// included). Pure host arithmetic, no CUDA calls: safe for method="auto".
bool TiledWindowFits(const WindowGeometry& g, const void* src, const void* dst,
                     std::string* why);

// Computes the window of `src` at the device-resident start indices
// g.starts into `dst` on `stream`. Encodes the
// tensor maps on every call; no allocation, no synchronisation, no host read
// of device memory (CUDA-graph safe). InvalidArgument when the window does
// not fit (the TiledWindowFits reason) or `device` has no TMA.
ffi::Error LaunchTiledWindow(const WindowGeometry& g, const void* src, void* dst,
                             cudaStream_t stream, int device);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_CUDA_TILED_WINDOW_H_
