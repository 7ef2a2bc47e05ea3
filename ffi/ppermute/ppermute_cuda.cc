// CUDA handler of "jax_tma_ppermute": decodes and re-validates the call,
// plans which copy kernel moves the block (PlanPpermute) and runs this
// device's part of it on XLA's stream (LaunchPpermute: the device-side
// transport, in this process or across the processes of one host). An
// instantiate stage gives each lowered ppermute of an executable its
// participants (PeerSites), freed with the executable.
#include <memory>
#include <string_view>

#include "cuda/device_info.h"
#include "cuda/handlers.h"
#include "ppermute/ppermute_launch.h"

namespace jax_tma {

const ffi::TypeInfo kPeerSitesTypeInfo = ffi::MakeTypeInfo<PeerSites>();
void* PeerSitesTypeId() { return &PeerSites::id; }
const void* PeerSitesTypeInfo() { return &kPeerSitesTypeInfo; }

namespace {

ffi::ErrorOr<std::unique_ptr<PeerSites>> PpermuteInstantiate() {
  return std::make_unique<PeerSites>();
}

// `instance` names the lowered ppermute for the CPU handler's meetings; here
// the executable's state (`sites`) holds it.
ffi::Error PpermuteCudaImpl(cudaStream_t stream, PeerSites* sites, int32_t device,
                            ffi::RunId /*run*/, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                            int64_t /*instance*/, ffi::Span<const int64_t> devices,
                            ffi::Span<const int64_t> sources, bool push,
                            std::string_view method, int64_t process,
                            ffi::Span<const int64_t> processes, std::string_view links,
                            std::string_view site, int64_t timeout_ms) {
  PpermuteCall call;
  JAX_TMA_RETURN_IF_FAILED(DecodePpermute(device, x, y, devices, sources, push, method,
                                          process, processes, links, site, timeout_ms, &call));
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  PpermutePlan plan;
  JAX_TMA_RETURN_IF_FAILED(PlanPpermute(call, info, &plan));
  return LaunchPpermute(call, plan, sites, stream, device);
}

}  // namespace
}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTmaPpermuteCudaInstantiate, jax_tma::PpermuteInstantiate,
                              xla::ffi::Ffi::BindInstantiate());

// Command-buffer compatible: after the first call of a lowered ppermute on a
// device, its calls meet only on the devices (peer_copy.h), so a captured
// graph replays them.
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaPpermuteCuda, jax_tma::PpermuteCudaImpl,
    jax_tma::BindPpermuteCall(
        xla::ffi::Ffi::Bind()
            .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()  // stream
            .Ctx<xla::ffi::State<jax_tma::PeerSites>>()),   // sites
    {xla::ffi::Traits::kCmdBufferCompatible});
