// Launchers of the broadcast kernels: the TMA tile kernels (store, or with a
// thread-block cluster multicast and dsmem; as PlanBroadcast planned them) and
// the SIMT kernel (any geometry), and of a planned call (LaunchBroadcast). No
// allocation, no synchronisation (CUDA-graph safe); tensor maps are encoded
// on every call.
#ifndef JAX_TMA_FFI_BROADCAST_BROADCAST_LAUNCH_H_
#define JAX_TMA_FFI_BROADCAST_BROADCAST_LAUNCH_H_

#include <cuda_runtime_api.h>

#include "broadcast/broadcast_common.h"
#include "broadcast/broadcast_plan.h"

namespace jax_tma {

// Launches the TMA tile kernel of plan.method with plan.cluster_size CTAs per
// cluster (1 for store); errors name jax_tma.broadcast, the rule and the
// values (a cluster size the device cannot launch).
ffi::Error LaunchClusterBroadcast(const BroadcastGeometry& g, const BroadcastPlan& plan,
                                  cudaStream_t stream, int device);

// Any geometry: each input vector read once, written n times.
ffi::Error LaunchSimtBroadcast(const BroadcastGeometry& g, cudaStream_t stream, int device);

// Runs the kernel of `plan` (PlanBroadcast) and counts its path.
ffi::Error LaunchBroadcast(const BroadcastGeometry& g, const BroadcastPlan& plan,
                           cudaStream_t stream, int device);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_BROADCAST_BROADCAST_LAUNCH_H_
