// CUDA handler of "jax_tma_broadcast": re-validates the call, resolves method
// "auto" and the cluster size (ChooseBroadcast), and launches on XLA's
// stream. Graph-safe: no allocation, no synchronisation, tensor maps encoded
// per call.
#include <string_view>

#include "broadcast/broadcast_launch.h"
#include "cuda/device_info.h"
#include "cuda/handlers.h"
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

ffi::Error BroadcastCudaImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x,
                             ffi::Result<ffi::AnyBuffer> y, int64_t axis,
                             std::string_view method, int64_t cluster_size) {
  BroadcastGeometry g;
  JAX_TMA_RETURN_IF_FAILED(DecodeBroadcast(x, y, axis, method, cluster_size, &g));
  if (g.n == 0 || g.outer == 0 || g.inner_bytes == 0) return ffi::Error::Success();
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  const BroadcastChoice choice = ChooseBroadcast(g, info.has_tma());
  if (choice.method == BroadcastMethod::kSimt) {
    JAX_TMA_RETURN_IF_FAILED(LaunchSimtBroadcast(g, stream, device));
  } else {
    JAX_TMA_RETURN_IF_FAILED(
        LaunchClusterBroadcast(g, choice.method, choice.cluster_size, stream, device));
  }
  CountPath(PathOf(choice.method));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaBroadcastCuda, jax_tma::BroadcastCudaImpl,
    jax_tma::BindBroadcastCall(xla::ffi::Ffi::Bind()
                                   .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()  // stream
                                   .Ctx<xla::ffi::DeviceOrdinal>()),               // device
    {xla::ffi::Traits::kCmdBufferCompatible});
