// Runs a planned im2col or col2im (see im2col_launch.h).
#include "im2col/im2col_launch.h"

#include "path_counts.h"

namespace jax_tma {

ffi::Error LaunchIm2col(const Im2colGeometry& g, const Im2colPlan& plan, const void* x,
                        void* out, cudaStream_t stream, int device) {
  if (plan.kernel == Im2colKernel::kTma) {
    if (!plan.tma.empty) JAX_TMA_RETURN_IF_FAILED(LaunchTmaIm2col(g, plan.tma, stream, device));
    CountPath(Path::kIm2colTma);
  } else {
    JAX_TMA_RETURN_IF_FAILED(LaunchSimtIm2col(g, x, out, stream, device));
    CountPath(Path::kIm2colSimt);
  }
  return ffi::Error::Success();
}

}  // namespace jax_tma
