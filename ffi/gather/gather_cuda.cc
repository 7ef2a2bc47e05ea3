// CUDA handlers of "jax_tma_gather" and "jax_tma_scatter": re-validate the
// call, pick the path (gather_plan.h) and launch on XLA's stream. Graph-safe:
// no allocation, no synchronisation, no host reads of device data. Scatter
// writes only the indexed slabs when its output aliases x (the lowering asks
// for that); otherwise it copies x into the output first.
#include <string_view>

#include "cuda/cuda_status.h"
#include "cuda/device_info.h"
#include "cuda/handlers.h"
#include "gather/gather_launch.h"
#include "path_counts.h"

namespace jax_tma {
namespace {

Path PathOf(GatherPath p, bool scatter) {
  switch (p) {
    case GatherPath::kOrdered: return Path::kScatterOrdered;
    case GatherPath::kBulk: return scatter ? Path::kScatterBulk : Path::kGatherBulk;
    default: return scatter ? Path::kScatterSimt : Path::kGatherSimt;
  }
}

}  // namespace

ffi::Error LaunchGather(const GatherGeometry* gs, size_t n, bool scatter, cudaStream_t stream,
                        int device) {
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  const GatherOp op = GatherOpOf(gs[0], scatter);
  const std::string_view name = scatter ? kScatterOp : kGatherOp;
  GatherPlan plans[kMaxGatherTables];
  for (size_t i = 0; i < n; ++i) {
    JAX_TMA_RETURN_IF_FAILED(gather_detail::ForTable(
        PlanGather(gs[i], op, info, device, &plans[i]), name, i, n));
  }
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
    const GatherPlan& plan = plans[first];
    GatherTables tables;
    for (end = first; end < n && FusesWith(g, plan, gs[end], plans[end]); ++end) {
      tables.Add(gs[end]);
    }
    if (g.rows() == 0 || g.slab_bytes == 0) continue;
    switch (plan.path) {
      case GatherPath::kOrdered:
        JAX_TMA_RETURN_IF_FAILED(LaunchOrderedScatter(g, tables, stream, device));
        break;
      case GatherPath::kBulk:
        JAX_TMA_RETURN_IF_FAILED(LaunchBulkGather(g, tables, op, plan.bulk, stream, device));
        break;
      default:
        JAX_TMA_RETURN_IF_FAILED(LaunchSimtGather(g, tables, op, plan.simt, stream, device));
    }
    CountPath(PathOf(plan.path, scatter));
  }
  return ffi::Error::Success();
}

namespace {

ffi::Error GatherCudaImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer indices,
                          ffi::RemainingArgs args, ffi::RemainingRets rets, int64_t axis,
                          int64_t batch, std::string_view method) {
  GatherGeometry gs[kMaxGatherTables];
  size_t n = 0;
  JAX_TMA_RETURN_IF_FAILED(DecodeGatherCall(indices, args, rets, axis, batch, method, gs, &n));
  return LaunchGather(gs, n, false, stream, device);
}

ffi::Error ScatterCudaImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer indices,
                           ffi::AnyBuffer order, ffi::RemainingArgs args, ffi::RemainingRets rets,
                           int64_t axis, int64_t batch, std::string_view mode, bool deterministic,
                           std::string_view method) {
  GatherGeometry gs[kMaxGatherTables];
  size_t n = 0;
  JAX_TMA_RETURN_IF_FAILED(DecodeScatterCall(indices, order, args, rets, axis, batch, mode,
                                             deterministic, method, gs, &n));
  return LaunchGather(gs, n, true, stream, device);
}

}  // namespace
}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaGatherCuda, jax_tma::GatherCudaImpl,
    jax_tma::BindGatherCall(xla::ffi::Ffi::Bind()
                                .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()  // stream
                                .Ctx<xla::ffi::DeviceOrdinal>()),               // device
    {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaScatterCuda, jax_tma::ScatterCudaImpl,
    jax_tma::BindScatterCall(xla::ffi::Ffi::Bind()
                                 .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()  // stream
                                 .Ctx<xla::ffi::DeviceOrdinal>()),               // device
    {xla::ffi::Traits::kCmdBufferCompatible});
