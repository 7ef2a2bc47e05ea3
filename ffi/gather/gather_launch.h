// Launchers of the gather/scatter kernels (TMA bulk pipeline, vectorised
// SIMT, the ordered deterministic scatter) and of a planned call
// (LaunchGather). Which path runs is gather_plan.h's rule.
#ifndef JAX_TMA_FFI_GATHER_GATHER_LAUNCH_H_
#define JAX_TMA_FFI_GATHER_GATHER_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "gather/gather_common.h"
#include "gather/gather_plan.h"

namespace jax_tma {

// Each launcher moves every table of `tables` (a grid row each, blockIdx.y)
// with the geometry `g` and the table's buffers (GatherTables::Of).

// One bulk copy (gather, scatter set) or bulk reduce-add (scatter add) per
// slab or slab piece; every table must pass BulkGatherFits for `op`.
ffi::Error LaunchBulkGather(const GatherGeometry& g, const GatherTables& tables, GatherOp op,
                            const BulkGatherTiling& t, cudaStream_t stream, int device);

// Any geometry, as `t` tiles it (TileSimtGather): gather and scatter set;
// scatter add with atomics, in unspecified order (vector reductions where
// VectorAddFits).
ffi::Error LaunchSimtGather(const GatherGeometry& g, const GatherTables& tables, GatherOp op,
                            const SimtGatherTiling& t, cudaStream_t stream, int device);

// Scatter with deterministic=True: one warp per run of equal indices in
// g.order, applying its updates in that order.
ffi::Error LaunchOrderedScatter(const GatherGeometry& g, const GatherTables& tables,
                                cudaStream_t stream, int device);

// The whole call of the tables gs[0..n) as `plan` (PlanGatherCall) says:
// scatter first copies each table into its output where that is not aliased
// (the lowering asks for the alias, so that only the indexed slabs are
// written); then each run of tables that FusesWith its first moves in one
// launch of the plan's kernel, and counts its path.
ffi::Error LaunchGather(const GatherGeometry* gs, size_t n, const GatherCallPlan& plan,
                        cudaStream_t stream, int device);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_GATHER_GATHER_LAUNCH_H_
