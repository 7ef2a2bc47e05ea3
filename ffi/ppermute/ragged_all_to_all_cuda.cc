// CUDA handler of "jax_tma_ragged_all_to_all": decodes and re-validates the
// call, then runs every step at once: the index arrays stay on the device,
// where the kernels check and read them, so a call needs no device-to-host
// copy and no host wait, and replays from command buffers. Up to
// kPeerInboxMaxBytes of operand, with PeerInboxExchange (peer_copy.h): one
// kernel checks this participant's slices, pushes them with their sizes and
// places into each destination's inbox, and copies what each source sent,
// checked against recv_sizes, into its result. Above, with PeerScatter: the
// meet kernel checks the slices (and each receiver's recv_sizes) before any
// copy, and each slice is pushed straight into its destination's result;
// the slices that stay are copied in the same grid.
// The per-step participants are all_to_all's (ExchangeSites).
#include <memory>
#include <string_view>

#include "cuda/cuda_status.h"
#include "cuda/device_info.h"
#include "cuda/handlers.h"
#include "path_counts.h"
#include "ppermute/exchange_sites.h"
#include "ppermute/ragged_all_to_all.h"

namespace jax_tma {
namespace {

ffi::ErrorOr<std::unique_ptr<ExchangeSites>> RaggedAllToAllInstantiate() {
  return std::make_unique<ExchangeSites>();
}

ffi::Error RaggedAllToAllCudaImpl(
    cudaStream_t stream, ExchangeSites* sites, int32_t device, ffi::RunId /*run*/,
    ffi::AnyBuffer operand, ffi::AnyBuffer output, ffi::AnyBuffer input_offsets,
    ffi::AnyBuffer send_sizes, ffi::AnyBuffer output_offsets, ffi::AnyBuffer recv_sizes,
    ffi::Result<ffi::AnyBuffer> result, int64_t /*instance*/, ffi::Span<const int64_t> devices,
    ffi::Span<const int64_t> sources, ffi::Span<const int64_t> positions, int64_t parts,
    std::string_view method, int64_t ctas, int64_t process, ffi::Span<const int64_t> processes,
    std::string_view links, std::string_view site, int64_t timeout_ms) {
  RaggedAllToAllCall call;
  JAX_TMA_RETURN_IF_FAILED(DecodeRaggedAllToAll(
      device, operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, result,
      devices, sources, positions, parts, method, ctas, process, processes, links, site,
      timeout_ms, &call));
  // Rows that no slice writes keep the output's values (XLA aliases the two
  // buffers where Python asks it to; a raw call may not).
  if (call.result != call.output && output.size_bytes() != 0) {
    JAX_TMA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(call.result, call.output, output.size_bytes(),
                                                 cudaMemcpyDeviceToDevice, stream));
  }
  // Rows of no bytes, or no slices: nothing moves on any participant (the
  // shapes are the same on all), so all skip together.
  if (call.row_bytes == 0 || call.slices == 0) return ffi::Error::Success();
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  bool tma = false;
  JAX_TMA_RETURN_IF_FAILED(ExchangeUsesTma(kRaggedAllToAllOp, call.method, info, device, &tma));
  PeerWait check;
  JAX_TMA_RETURN_IF_FAILED(sites->Check(call, device, &check));
  const PeerSlices slices = RaggedPeerSlices(call);
  if (operand.size_bytes() <= kPeerInboxMaxBytes) {
    CountPath(Path::kRaggedAllToAllInbox);
    PeerInboxLegs legs;
    JAX_TMA_RETURN_IF_FAILED(ExchangeInboxLegs(sites, call.method, operand.size_bytes(), call,
                                               device, PeerInboxPayload(slices), &legs));
    return LaunchPeerInboxExchange(kRaggedAllToAllOp, legs, slices, call.ctas, check, stream,
                                   device);
  }
  CountPath(Path::kRaggedAllToAllPeer);
  PeerLegs legs;
  JAX_TMA_RETURN_IF_FAILED(ExchangeLegs(sites, call.method, operand.size_bytes(), call, device,
                                        call.result, call.recv_sizes, &legs));
  // The grid is sized for the operand spread evenly over the slices.
  const int64_t expected = call.operand_rows * slices.bytes / call.slices;
  return LaunchPeerScatter(kRaggedAllToAllOp, legs, slices, tma, expected, call.ctas, check,
                           stream, device);
}

}  // namespace
}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTmaRaggedAllToAllCudaInstantiate,
                              jax_tma::RaggedAllToAllInstantiate,
                              xla::ffi::Ffi::BindInstantiate());
// Command-buffer compatible: after the first call of a lowered exchange on a
// device, each step meets only on the devices (peer_copy.h).
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaRaggedAllToAllCuda, jax_tma::RaggedAllToAllCudaImpl,
    jax_tma::BindRaggedAllToAllCall(
        xla::ffi::Ffi::Bind()
            .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()     // stream
            .Ctx<xla::ffi::State<jax_tma::ExchangeSites>>()),  // sites
    {xla::ffi::Traits::kCmdBufferCompatible});
