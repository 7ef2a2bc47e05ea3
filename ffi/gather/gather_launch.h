// Launchers of the gather/scatter kernels (TMA bulk pipeline, vectorised
// SIMT, the ordered deterministic scatter) and the dispatch shared by the FFI
// handlers and the standalone selftest. Which path runs is gather_plan.h's rule.
#ifndef JAX_TMA_FFI_GATHER_GATHER_LAUNCH_H_
#define JAX_TMA_FFI_GATHER_GATHER_LAUNCH_H_

#include <cuda_runtime_api.h>

#include "gather/gather_common.h"
#include "gather/gather_plan.h"

namespace jax_tma {

// One bulk copy (gather, scatter set) or bulk reduce-add (scatter add) per
// slab or slab piece; `g` must pass BulkGatherFits for `op`.
ffi::Error LaunchBulkGather(const GatherGeometry& g, GatherOp op, const BulkGatherTiling& t,
                            cudaStream_t stream, int device);

// Any geometry, as `t` tiles it (TileSimtGather): gather and scatter set;
// scatter add with atomics, in unspecified order (vector reductions where
// VectorAddFits).
ffi::Error LaunchSimtGather(const GatherGeometry& g, GatherOp op, const SimtGatherTiling& t,
                            cudaStream_t stream, int device);

// Scatter with deterministic=True: one warp per run of equal indices in
// g.order, applying its updates in that order.
ffi::Error LaunchOrderedScatter(const GatherGeometry& g, cudaStream_t stream, int device);

// The whole call: scatter first copies x into a non-aliased output, then the
// plan's kernel moves the slabs.
ffi::Error LaunchGather(const GatherGeometry& g, bool scatter, cudaStream_t stream, int device);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_GATHER_GATHER_LAUNCH_H_
