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

ffi::Error LaunchGather(const GatherGeometry& g, bool scatter, cudaStream_t stream, int device) {
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  const GatherOp op = GatherOpOf(g, scatter);
  GatherPlan plan;
  JAX_TMA_RETURN_IF_FAILED(PlanGather(g, op, info, device, &plan));
  if (scatter && g.out != g.x && g.table_bytes != 0) {
    JAX_TMA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(g.out, g.x, static_cast<size_t>(g.table_bytes),
                                                 cudaMemcpyDeviceToDevice, stream));
  }
  if (g.rows() == 0 || g.slab_bytes == 0) return ffi::Error::Success();
  switch (plan.path) {
    case GatherPath::kOrdered:
      JAX_TMA_RETURN_IF_FAILED(LaunchOrderedScatter(g, stream, device));
      break;
    case GatherPath::kBulk:
      JAX_TMA_RETURN_IF_FAILED(LaunchBulkGather(g, op, plan.bulk, stream, device));
      break;
    default: JAX_TMA_RETURN_IF_FAILED(LaunchSimtGather(g, op, plan.simt, stream, device));
  }
  CountPath(PathOf(plan.path, scatter));
  return ffi::Error::Success();
}

namespace {

ffi::Error GatherCudaImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x,
                          ffi::AnyBuffer indices, ffi::AnyBuffer fill,
                          ffi::Result<ffi::AnyBuffer> out, int64_t axis, int64_t batch,
                          std::string_view method) {
  GatherGeometry g;
  JAX_TMA_RETURN_IF_FAILED(DecodeGather(x, indices, fill, out, axis, batch, method, &g));
  return LaunchGather(g, false, stream, device);
}

ffi::Error ScatterCudaImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x,
                           ffi::AnyBuffer indices, ffi::AnyBuffer updates, ffi::AnyBuffer order,
                           ffi::Result<ffi::AnyBuffer> out, int64_t axis, int64_t batch,
                           std::string_view mode, bool deterministic, std::string_view method) {
  GatherGeometry g;
  JAX_TMA_RETURN_IF_FAILED(DecodeScatter(x, indices, updates, order, out, axis, batch, mode,
                                         deterministic, method, &g));
  return LaunchGather(g, true, stream, device);
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
