// Runs a planned window (see window_launch.h).
#include "window/window_launch.h"

#include "path_counts.h"

namespace jax_tma {

ffi::Error LaunchWindow(const WindowGeometry& g, const WindowPlan& plan, const void* src,
                        void* dst, cudaStream_t stream, int device) {
  if (plan.kernel == WindowKernel::kTiled) {
    if (!plan.tiled.empty) {
      JAX_TMA_RETURN_IF_FAILED(LaunchTiledWindow(g, plan.tiled, stream, device));
    }
    CountPath(Path::kWindowTiled);
  } else {
    JAX_TMA_RETURN_IF_FAILED(LaunchSimtWindow(g, src, dst, stream, device));
    CountPath(Path::kWindowSimt);
  }
  return ffi::Error::Success();
}

}  // namespace jax_tma
