// CUDA handler of "jax_tma_moe_dispatch": decodes and re-validates the call
// (every method is the same SIMT copy: a row is read once and stored to
// several places), then runs every step at once with PeerPull (peer_copy.h): the meet kernel
// checks the index arrays, which stay on the device, and trades the
// operands; the copy kernel reads each row once, from its source's operand
// across the link (or this device's own), and stores it to each of its
// slots; a call needs no device-to-host copy and no host wait, and replays
// from command buffers. The per-step participants are all_to_all's
// (ExchangeSites), each publishing its operand to the participant that
// reads it.
#include <memory>
#include <string_view>

#include "cuda/handlers.h"
#include "path_counts.h"
#include "ppermute/exchange_sites.h"
#include "ppermute/moe_dispatch.h"

namespace jax_tma {
namespace {

ffi::ErrorOr<std::unique_ptr<ExchangeSites>> MoeDispatchInstantiate() {
  return std::make_unique<ExchangeSites>();
}

ffi::Error MoeDispatchCudaImpl(
    cudaStream_t stream, ExchangeSites* sites, int32_t device, ffi::RunId /*run*/,
    ffi::AnyBuffer operand, ffi::AnyBuffer tokens, ffi::AnyBuffer slots,
    ffi::AnyBuffer recv_sizes, ffi::Result<ffi::AnyBuffer> result, int64_t /*instance*/,
    ffi::Span<const int64_t> devices, ffi::Span<const int64_t> sources,
    ffi::Span<const int64_t> positions, int64_t parts, std::string_view method, int64_t ctas,
    int64_t process, ffi::Span<const int64_t> processes, std::string_view links,
    std::string_view site, int64_t timeout_ms) {
  MoeDispatchCall call;
  JAX_TMA_RETURN_IF_FAILED(DecodeMoeDispatch(device, operand, tokens, slots, recv_sizes, result,
                                          devices, sources, positions, parts, method, ctas,
                                          process, processes, links, site, timeout_ms, &call));
  // Rows of no bytes, or no rows a position: nothing moves on any
  // participant (the shapes are the same on all), so all skip together.
  if (call.row_bytes == 0 || call.per_part == 0) return ffi::Error::Success();
  PeerWait check;
  JAX_TMA_RETURN_IF_FAILED(sites->Check(call, device, &check));
  CountPath(Path::kMoeDispatchPeer);
  PeerLegs legs;
  JAX_TMA_RETURN_IF_FAILED(ExchangeLegs(sites, call.method, operand.size_bytes(), call, device,
                                        call.operand, nullptr, &legs));
  PeerPullRows rows;
  rows.src = static_cast<const uint8_t*>(call.operand);
  rows.dst = static_cast<uint8_t*>(call.result);
  rows.tokens = call.tokens;
  rows.slots = call.slots;
  rows.recv_sizes = call.recv_sizes;
  rows.parts = call.parts;
  rows.position = call.position;
  rows.per_part = call.per_part;
  rows.choices = call.choices;
  rows.bytes = static_cast<int64_t>(call.row_bytes);
  rows.src_rows = call.operand_rows;
  rows.dst_rows = call.result_rows;
  return LaunchPeerPull(kMoeDispatchOp, legs, rows, call.ctas, check, stream, device);
}

}  // namespace
}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTmaMoeDispatchCudaInstantiate, jax_tma::MoeDispatchInstantiate,
                              xla::ffi::Ffi::BindInstantiate());
// Command-buffer compatible: after the first call of a lowered pull on a
// device, each step meets only on the devices (peer_copy.h).
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaMoeDispatchCuda, jax_tma::MoeDispatchCudaImpl,
    jax_tma::BindMoeDispatchCall(
        xla::ffi::Ffi::Bind()
            .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()     // stream
            .Ctx<xla::ffi::State<jax_tma::ExchangeSites>>()),  // sites
    {xla::ffi::Traits::kCmdBufferCompatible});
