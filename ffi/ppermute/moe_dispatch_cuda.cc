// CUDA handler of "jax_tma_moe_dispatch": decodes and re-validates the call
// (every method is the same SIMT copy: a row is read once and stored to
// several places), then runs every step at once with PeerPull (peer_copy.h):
// the meet kernel checks this participant's routes and pairs, which stay on
// the device, and trades the operands and pairs; the copy kernel reads each
// pair from its source's `sent` and its row once, from its source's operand
// across the link (or this device's own), and stores the row to each of the
// pair's slots; a call needs no device-to-host copy and no host wait, and
// replays from command buffers. The per-step participants are all_to_all's
// (ExchangeSites), each publishing its operand and pairs to the participant
// that reads them.
#include <memory>
#include <string_view>

#include "cuda/handlers.h"
#include "path_counts.h"
#include "ppermute/exchange_sites.h"
#include "ppermute/moe_dispatch.h"

namespace jax_tma {
namespace {

static_assert(kMoePlanColumns == kPullRouteColumns, "the pull reads the plan's routes");

ffi::ErrorOr<std::unique_ptr<ExchangeSites>> MoeDispatchInstantiate() {
  return std::make_unique<ExchangeSites>();
}

ffi::Error MoeDispatchCudaImpl(
    cudaStream_t stream, ExchangeSites* sites, int32_t device, ffi::RunId /*run*/,
    ffi::AnyBuffer operand, ffi::AnyBuffer sent, ffi::AnyBuffer routes,
    ffi::Result<ffi::AnyBuffer> result, ffi::Result<ffi::AnyBuffer> slots, int64_t /*instance*/,
    ffi::Span<const int64_t> devices, ffi::Span<const int64_t> sources,
    ffi::Span<const int64_t> positions, int64_t parts, std::string_view method, int64_t ctas,
    int64_t process, ffi::Span<const int64_t> processes, std::string_view links,
    std::string_view site, int64_t timeout_ms) {
  MoeDispatchCall call;
  JAX_TMA_RETURN_IF_FAILED(DecodeMoeDispatch(device, operand, sent, routes, result, slots,
                                             devices, sources, positions, parts, method, ctas,
                                             process, processes, links, site, timeout_ms,
                                             &call));
  // No rows a position: nothing moves on any participant and the slots
  // result is empty (the shapes are the same on all), so all skip together.
  if (call.per_part == 0) return ffi::Error::Success();
  PeerWait check;
  JAX_TMA_RETURN_IF_FAILED(sites->Check(call, device, &check));
  CountPath(Path::kMoeDispatchPeer);
  // Rows of no bytes are never read: the pairs stand in for the operand,
  // which may have no memory to publish.
  const void* rows_published = call.row_bytes == 0 ? call.sent : call.operand;
  PeerLegs legs;
  JAX_TMA_RETURN_IF_FAILED(ExchangeLegs(sites, call.method, operand.size_bytes(), call, device,
                                        rows_published, call.sent, &legs));
  PeerPullRows rows;
  rows.src = static_cast<const uint8_t*>(call.operand);
  rows.dst = static_cast<uint8_t*>(call.result);
  rows.sent = call.sent;
  rows.routes = call.routes;
  rows.slots = call.slots;
  rows.parts = call.parts;
  rows.position = call.position;
  rows.per_part = call.per_part;
  rows.pairs = call.pairs;
  rows.choices = call.choices;
  rows.bytes = static_cast<int64_t>(call.row_bytes);
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
