// Runs a planned im2col or col2im (see im2col_launch.h).
#include "im2col/im2col_launch.h"

#include "cuda/launch.h"

namespace jax_tma {

ffi::Error LaunchIm2col(const Im2colGeometry& g, const Im2colPlan& plan, const void* x,
                        void* out, cudaStream_t stream, int device) {
  return LaunchTmaOrSimt(
      plan.kernel == Im2colKernel::kTma, plan.tma.empty, Path::kIm2colTma, Path::kIm2colSimt,
      [&] { return LaunchTmaIm2col(g, plan.tma, stream, device); },
      [&] { return LaunchSimtIm2col(g, x, out, stream, device); });
}

}  // namespace jax_tma
