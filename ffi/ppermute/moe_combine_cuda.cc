// CUDA handler of "jax_tma_moe_combine": decodes and re-validates the call,
// then runs the ragged exchange of its summed rows with PeerScatterSum
// (peer_copy.h): the meet kernel checks the slots and the slices, which stay
// on the device, and trades the results; the copy stage sums each pair row
// as it goes, straight into its destination's result (this device's own, or
// one across the link), so the sums are never stored here. A call needs no
// device-to-host copy and no host wait, and replays from command buffers.
// The per-step participants are all_to_all's (ExchangeSites), each
// publishing its result to the participant that writes into it.
#include <memory>
#include <string_view>

#include "cuda/handlers.h"
#include "path_counts.h"
#include "ppermute/exchange_sites.h"
#include "ppermute/moe_combine.h"

namespace jax_tma {
namespace {

ffi::ErrorOr<std::unique_ptr<ExchangeSites>> MoeCombineInstantiate() {
  return std::make_unique<ExchangeSites>();
}

ffi::Error MoeCombineCudaImpl(
    cudaStream_t stream, ExchangeSites* sites, int32_t device, ffi::RunId /*run*/,
    ffi::AnyBuffer y, ffi::AnyBuffer weights, ffi::AnyBuffer slots,
    ffi::AnyBuffer input_offsets, ffi::AnyBuffer send_sizes, ffi::AnyBuffer output_offsets,
    ffi::AnyBuffer recv_sizes, ffi::Result<ffi::AnyBuffer> result, int64_t /*instance*/,
    ffi::Span<const int64_t> devices, ffi::Span<const int64_t> sources,
    ffi::Span<const int64_t> positions, int64_t parts, std::string_view method, int64_t ctas,
    int64_t process, ffi::Span<const int64_t> processes, std::string_view links,
    std::string_view site, int64_t timeout_ms) {
  MoeCombineCall call;
  JAX_TMA_RETURN_IF_FAILED(DecodeMoeCombine(
      device, y, weights, slots, input_offsets, send_sizes, output_offsets, recv_sizes, result,
      devices, sources, positions, parts, method, ctas, process, processes, links, site,
      timeout_ms, &call));
  // Rows of no bytes: nothing moves on any participant (the shapes are the
  // same on all), so all skip together.
  if (call.row_bytes == 0) return ffi::Error::Success();
  PeerWait check;
  JAX_TMA_RETURN_IF_FAILED(sites->Check(call, device, &check));
  CountPath(Path::kMoeCombinePeer);
  PeerLegs legs;
  JAX_TMA_RETURN_IF_FAILED(ExchangeLegs(sites, call.method,
                                        call.operand_rows * call.row_bytes, call, device,
                                        call.result, call.recv_sizes, &legs));
  const PeerSlices slices = RaggedPeerSlices(call);  // its src (the operand) null: sums
  PeerSumRows sums;
  sums.y = static_cast<const uint8_t*>(call.y);
  sums.y_rows = call.y_rows;
  sums.weights = call.weights;
  sums.slots = call.slots;
  sums.choices = call.choices;
  sums.kind = static_cast<int>(call.kind);
  return LaunchPeerScatterSum(kMoeCombineOp, legs, slices, sums, call.ctas, check, stream,
                              device);
}

}  // namespace
}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTmaMoeCombineCudaInstantiate, jax_tma::MoeCombineInstantiate,
                              xla::ffi::Ffi::BindInstantiate());
// Command-buffer compatible: after the first call of a lowered exchange on a
// device, each step meets only on the devices (peer_copy.h).
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaMoeCombineCuda, jax_tma::MoeCombineCudaImpl,
    jax_tma::BindMoeCombineCall(
        xla::ffi::Ffi::Bind()
            .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()     // stream
            .Ctx<xla::ffi::State<jax_tma::ExchangeSites>>()),  // sites
    {xla::ffi::Traits::kCmdBufferCompatible});
