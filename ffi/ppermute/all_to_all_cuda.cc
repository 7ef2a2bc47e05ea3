// CUDA handler of "jax_tma_all_to_all": decodes and re-validates the call,
// then runs every step of the exchange (all_to_all.h) at once, in this
// process or across the processes of one host. Up to kPeerInboxMaxBytes a
// participant, with PeerInboxExchange (peer_copy.h): one kernel pushes each
// chunk into its destination's inbox and copies its sources' chunks out of
// its own, one crossing of the link a call; above, with PeerScatter: each
// chunk is pushed straight into its destination's result, the chunk that
// stays copied in the same grid. An instantiate stage
// gives each lowered all_to_all of an executable its per-step participants
// (ExchangeSites), freed with the executable.
#include <memory>
#include <string_view>

#include "cuda/cuda_status.h"
#include "cuda/device_info.h"
#include "cuda/handlers.h"
#include "path_counts.h"
#include "ppermute/all_to_all.h"
#include "ppermute/exchange_sites.h"

namespace jax_tma {

namespace {

ffi::ErrorOr<std::unique_ptr<ExchangeSites>> AllToAllInstantiate() {
  return std::make_unique<ExchangeSites>();
}

// `instance` numbers the CPU handler's meetings; here the executable's
// state (`sites`) holds each step's participants.
ffi::Error AllToAllCudaImpl(cudaStream_t stream, ExchangeSites* sites, int32_t device,
                            ffi::RunId /*run*/, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                            int64_t /*instance*/, ffi::Span<const int64_t> devices,
                            ffi::Span<const int64_t> sources, ffi::Span<const int64_t> positions,
                            int64_t parts, std::string_view method, int64_t process,
                            ffi::Span<const int64_t> processes, std::string_view links,
                            std::string_view site, int64_t timeout_ms) {
  AllToAllCall call;
  JAX_TMA_RETURN_IF_FAILED(DecodeAllToAll(device, x, y, devices, sources, positions, parts,
                                          method, process, processes, links, site, timeout_ms,
                                          &call));
  // Every participant has the same chunk size, so all skip together.
  if (call.bytes.bytes == 0) return ffi::Error::Success();
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  bool tma = false;
  JAX_TMA_RETURN_IF_FAILED(ExchangeUsesTma(kAllToAllOp, call.method, info, device, &tma));
  PeerSlices slices;
  slices.src = static_cast<const uint8_t*>(call.bytes.src);
  slices.local = static_cast<uint8_t*>(call.bytes.dst);
  slices.parts = call.parts;
  slices.position = call.position;
  slices.slices = call.parts;
  slices.bytes = static_cast<int64_t>(call.chunk());
  if (call.bytes.bytes <= kPeerInboxMaxBytes) {
    CountPath(Path::kAllToAllInbox);
    PeerInboxLegs legs;
    JAX_TMA_RETURN_IF_FAILED(ExchangeInboxLegs(sites, call.method, call.bytes.bytes, call,
                                               device, PeerInboxPayload(slices), &legs));
    return LaunchPeerInboxExchange(kAllToAllOp, legs, slices, 0, PeerWait{}, stream,
                                   device);
  }
  CountPath(Path::kAllToAllPeer);
  PeerLegs legs;
  JAX_TMA_RETURN_IF_FAILED(ExchangeLegs(sites, call.method, call.bytes.bytes, call, device,
                                        call.bytes.dst, nullptr, &legs));
  return LaunchPeerScatter(kAllToAllOp, legs, slices, tma, slices.bytes, 0, PeerWait{}, stream,
                           device);
}

}  // namespace
}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTmaAllToAllCudaInstantiate, jax_tma::AllToAllInstantiate,
                              xla::ffi::Ffi::BindInstantiate());
// Command-buffer compatible: after the first call of a lowered all_to_all on
// a device, each step meets only on the devices (peer_copy.h).
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaAllToAllCuda, jax_tma::AllToAllCudaImpl,
    jax_tma::BindAllToAllCall(
        xla::ffi::Ffi::Bind()
            .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()     // stream
            .Ctx<xla::ffi::State<jax_tma::ExchangeSites>>()),  // sites
    {xla::ffi::Traits::kCmdBufferCompatible});
