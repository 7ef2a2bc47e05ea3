// CUDA handler of "jax_tma_broadcast": re-validates the call, resolves
// method "auto" and the cluster size, and launches on XLA's stream.
// Graph-safe: no allocation, no synchronisation, tensor maps encoded per call.
#include <string>
#include <string_view>

#include "broadcast_cuda.h"
#include "broadcast_launch.h"
#include "cuda_status.h"
#include "device_info.h"

namespace jax_tma {
namespace {

// cluster_size 0 under multicast/dsmem: 2, the fastest size at every shape
// measured (H100, 2026-11-22, benchmarks/results/broadcast_h100_2026-11-22.json):
// multicast/16 ran 1.5x slower than multicast/2 (a cluster must find all its
// SMs free in one GPC at once, which likely leaves SMs idle).
constexpr int kDefaultClusterSize = 2;

}  // namespace

ffi::Error LaunchBroadcast(const BroadcastGeometry& g, cudaStream_t stream, int device) {
  if (g.n == 0 || g.outer == 0 || g.inner_bytes == 0) return ffi::Error::Success();
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  switch (g.method) {
    case BroadcastMethod::kSimt:
      return LaunchSimtBroadcast(g, stream, device);
    case BroadcastMethod::kStore:
      return LaunchClusterBroadcast(g, g.method, 1, stream, device);
    case BroadcastMethod::kMulticast:
    case BroadcastMethod::kDsmem: {
      const int cs = g.cluster_size != 0 ? static_cast<int>(g.cluster_size)
                                         : kDefaultClusterSize;
      return LaunchClusterBroadcast(g, g.method, cs, stream, device);
    }
    default:
      break;
  }
  // auto: the TMA store kernel wherever its tensor-map rules hold, SIMT
  // otherwise and below sm_90. Measured on H100 (2026-11-22): store was the
  // fastest method at every shape (8 x 4096^2 bf16 along axis 0 and 1, GQA
  // K/V repeat), 2-6% ahead of multicast/2 and dsmem/2, 5-10% ahead of SIMT.
  // Every method reads x once (ncu: 33.6 MB of DRAM reads for a 33.5 MB x),
  // so the cluster methods save no DRAM traffic here; the store kernel
  // saves their cluster barriers and co-scheduling.
  if (info.has_tma() && ClusterBroadcastFits(g, BroadcastMethod::kStore, 1, nullptr)) {
    return LaunchClusterBroadcast(g, BroadcastMethod::kStore, 1, stream, device);
  }
  return LaunchSimtBroadcast(g, stream, device);
}

static ffi::Error BroadcastCudaImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x,
                                    ffi::Result<ffi::AnyBuffer> y, int64_t axis,
                                    std::string_view method, int64_t cluster_size) {
  BroadcastGeometry g;
  JAX_TMA_RETURN_IF_FAILED(DecodeBroadcast(x, y, axis, method, cluster_size, &g));
  return LaunchBroadcast(g, stream, device);
}

}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaBroadcastCuda, jax_tma::BroadcastCudaImpl,
    jax_tma::BindBroadcastCall(xla::ffi::Ffi::Bind()
                                   .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()  // stream
                                   .Ctx<xla::ffi::DeviceOrdinal>()),               // device
    {xla::ffi::Traits::kCmdBufferCompatible});
