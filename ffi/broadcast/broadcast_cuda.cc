// CUDA handler of "jax_tma_broadcast": decodes and re-validates the call,
// plans it once (PlanBroadcast: method "auto" and the cluster size resolved,
// the TMA tiles laid out) and launches the plan on XLA's stream. Graph-safe:
// no allocation, no synchronisation, tensor maps encoded per call.
#include <string_view>

#include "broadcast/broadcast_launch.h"
#include "cuda/device_info.h"
#include "cuda/handlers.h"

namespace jax_tma {
namespace {

ffi::Error BroadcastCudaImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x,
                             ffi::Result<ffi::AnyBuffer> y, int64_t axis,
                             std::string_view method, int64_t cluster_size) {
  BroadcastGeometry g;
  JAX_TMA_RETURN_IF_FAILED(DecodeBroadcast(x, y, axis, method, cluster_size, &g));
  if (g.n == 0 || g.outer == 0 || g.inner_bytes == 0) return ffi::Error::Success();
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  BroadcastPlan plan;
  JAX_TMA_RETURN_IF_FAILED(PlanBroadcast(g, info, device, &plan));
  return LaunchBroadcast(g, plan, stream, device);
}

}  // namespace
}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaBroadcastCuda, jax_tma::BroadcastCudaImpl,
    jax_tma::BindBroadcastCall(xla::ffi::Ffi::Bind()
                                   .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()  // stream
                                   .Ctx<xla::ffi::DeviceOrdinal>()),               // device
    {xla::ffi::Traits::kCmdBufferCompatible});
