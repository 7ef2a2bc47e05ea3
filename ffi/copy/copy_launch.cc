// Runs a planned copy (see copy_launch.h).
#include "copy/copy_launch.h"

namespace jax_tma {

ffi::Error LaunchCopy(const CopyPlan& plan, const ByteCopy& c, cudaStream_t stream, int device) {
  switch (plan.kernel) {
    case CopyKernel::kNone: return ffi::Error::Success();
    case CopyKernel::kSimt: return LaunchSimtCopy(c.src, c.dst, c.bytes, stream, device);
    default:
      return LaunchBulkCopy(c.src, c.dst, c.bytes, stream, device, plan.config, plan.counter_slot);
  }
}

}  // namespace jax_tma
