// CUDA handlers of "jax_tma_gather" and "jax_tma_scatter": decode and
// re-validate the call, plan every table once (PlanGatherCall) and launch the
// plan on XLA's stream (LaunchGather). Graph-safe: no allocation, no
// synchronisation, no host reads of device data.
#include <string_view>

#include "cuda/device_info.h"
#include "cuda/handlers.h"
#include "gather/gather_launch.h"

namespace jax_tma {
namespace {

ffi::Error GatherCudaImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer indices,
                          ffi::RemainingArgs args, ffi::RemainingRets rets, int64_t axis,
                          int64_t batch, ffi::Span<const int64_t> fill,
                          std::string_view method) {
  GatherGeometry gs[kMaxGatherTables];
  size_t n = 0;
  JAX_TMA_RETURN_IF_FAILED(
      DecodeGatherCall(indices, args, rets, axis, batch, fill, method, gs, &n));
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  GatherCallPlan plan;
  JAX_TMA_RETURN_IF_FAILED(PlanGatherCall(gs, n, false, info, device, &plan));
  return LaunchGather(gs, n, plan, stream, device);
}

ffi::Error ScatterCudaImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer indices,
                           ffi::AnyBuffer order, ffi::RemainingArgs args, ffi::RemainingRets rets,
                           int64_t axis, int64_t batch, std::string_view mode, bool deterministic,
                           std::string_view method) {
  GatherGeometry gs[kMaxGatherTables];
  size_t n = 0;
  JAX_TMA_RETURN_IF_FAILED(DecodeScatterCall(indices, order, args, rets, axis, batch, mode,
                                             deterministic, method, gs, &n));
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  GatherCallPlan plan;
  JAX_TMA_RETURN_IF_FAILED(PlanGatherCall(gs, n, true, info, device, &plan));
  return LaunchGather(gs, n, plan, stream, device);
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
