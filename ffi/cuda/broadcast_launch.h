// Launchers of the broadcast kernels (TMA tile kernels with and without a
// thread-block cluster, SIMT fallback) and the method dispatch shared by the
// FFI handler and the standalone selftest.
#ifndef JAX_TMA_FFI_CUDA_BROADCAST_LAUNCH_H_
#define JAX_TMA_FFI_CUDA_BROADCAST_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <string>

#include "../broadcast_common.h"

namespace jax_tma {

// Whether the TMA tile kernel of `method` (store, multicast or dsmem) with
// `cluster_size` CTAs per cluster (1 for store) can run `g`; the first broken
// rule in *why otherwise. Host arithmetic only: whether the device can launch
// such a cluster is LaunchClusterBroadcast's check.
bool ClusterBroadcastFits(const BroadcastGeometry& g, BroadcastMethod method, int cluster_size,
                          std::string* why);

// Launches the TMA tile kernel; errors name jax_tma.broadcast, the rule and
// the values (including a cluster size the device cannot launch).
ffi::Error LaunchClusterBroadcast(const BroadcastGeometry& g, BroadcastMethod method,
                                  int cluster_size, cudaStream_t stream, int device);

// Any geometry: each input vector read once, written n times.
ffi::Error LaunchSimtBroadcast(const BroadcastGeometry& g, cudaStream_t stream, int device);

// Resolves method "auto" and cluster size 0 (see broadcast_cuda.cc for the
// rule and the measurements behind it) and launches.
ffi::Error LaunchBroadcast(const BroadcastGeometry& g, cudaStream_t stream, int device);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_CUDA_BROADCAST_LAUNCH_H_
