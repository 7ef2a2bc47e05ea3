// Runs a planned broadcast (see broadcast_launch.h).
#include "broadcast/broadcast_launch.h"

#include "path_counts.h"

namespace jax_tma {
namespace {

Path PathOf(BroadcastMethod method) {
  switch (method) {
    case BroadcastMethod::kStore: return Path::kBroadcastStore;
    case BroadcastMethod::kMulticast: return Path::kBroadcastMulticast;
    case BroadcastMethod::kDsmem: return Path::kBroadcastDsmem;
    default: return Path::kBroadcastSimt;
  }
}

}  // namespace

ffi::Error LaunchBroadcast(const BroadcastGeometry& g, const BroadcastPlan& plan,
                           cudaStream_t stream, int device) {
  if (plan.method == BroadcastMethod::kSimt) {
    JAX_TMA_RETURN_IF_FAILED(LaunchSimtBroadcast(g, stream, device));
  } else {
    JAX_TMA_RETURN_IF_FAILED(LaunchClusterBroadcast(g, plan, stream, device));
  }
  CountPath(PathOf(plan.method));
  return ffi::Error::Success();
}

}  // namespace jax_tma
