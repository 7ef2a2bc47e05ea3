// Runs a planned gather or scatter call (see gather_launch.h).
#include "gather/gather_launch.h"

#include "cuda/cuda_status.h"
#include "path_counts.h"

namespace jax_tma {
namespace {

Path PathOf(GatherPath p, bool scatter) {
  switch (p) {
    case GatherPath::kOrdered: return Path::kScatterOrdered;
    case GatherPath::kTma: return scatter ? Path::kScatterTma : Path::kGatherTma;
    default: return scatter ? Path::kScatterSimt : Path::kGatherSimt;
  }
}

}  // namespace

ffi::Error LaunchGather(const GatherGeometry* gs, size_t n, const GatherCallPlan& plan,
                        cudaStream_t stream, int device) {
  const bool scatter = plan.op != GatherOp::kGather;
  for (size_t i = 0; i < n; ++i) {
    const GatherGeometry& g = gs[i];
    if (scatter && g.out != g.x && g.table_bytes != 0) {
      JAX_TMA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(g.out, g.x,
                                                   static_cast<size_t>(g.table_bytes),
                                                   cudaMemcpyDeviceToDevice, stream));
    }
  }
  for (size_t first = 0, end = 0; first < n; first = end) {
    const GatherGeometry& g = gs[first];
    const GatherPlan& p = plan.tables[first];
    GatherTables tables;
    for (end = first; end < n && FusesWith(g, p, gs[end], plan.tables[end]); ++end) {
      tables.Add(gs[end]);
    }
    if (g.rows() == 0 || g.slab_bytes == 0) continue;
    switch (p.path) {
      case GatherPath::kOrdered:
        JAX_TMA_RETURN_IF_FAILED(LaunchOrderedScatter(g, tables, stream, device));
        break;
      case GatherPath::kTma:
        JAX_TMA_RETURN_IF_FAILED(LaunchBulkGather(g, tables, plan.op, p.bulk, stream, device));
        break;
      default:
        JAX_TMA_RETURN_IF_FAILED(LaunchSimtGather(g, tables, plan.op, p.simt, stream, device));
    }
    CountPath(PathOf(p.path, scatter));
  }
  return ffi::Error::Success();
}

}  // namespace jax_tma
