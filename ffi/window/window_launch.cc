// Runs a planned window (see window_launch.h).
#include "window/window_launch.h"

#include "cuda/launch.h"

namespace jax_tma {

ffi::Error LaunchWindow(const WindowGeometry& g, const WindowPlan& plan, const void* src,
                        void* dst, cudaStream_t stream, int device) {
  return LaunchTmaOrSimt(
      !plan.simt(), plan.tiled.empty, Path::kWindowTiled, Path::kWindowSimt,
      [&] { return LaunchTiledWindow(g, plan.tiled, stream, device); },
      [&] { return LaunchSimtWindow(g, plan, src, dst, stream, device); });
}

}  // namespace jax_tma
