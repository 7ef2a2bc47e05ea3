// CUDA handler of "jax_tma_ppermute": decodes and re-validates the call,
// plans which copy kernel moves the block (PlanPpermute) and runs this
// device's part of it (LaunchPpermute: the meeting with the peers and the
// peer copy on XLA's stream).
#include <string_view>

#include "cuda/device_info.h"
#include "cuda/handlers.h"
#include "ppermute/ppermute_launch.h"

namespace jax_tma {
namespace {

ffi::Error PpermuteCudaImpl(cudaStream_t stream, int32_t device, ffi::RunId run,
                            ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                            int64_t instance, ffi::Span<const int64_t> devices,
                            ffi::Span<const int64_t> sources, bool push,
                            std::string_view method, int64_t process,
                            ffi::Span<const int64_t> processes, std::string_view links,
                            std::string_view site, int64_t timeout_ms) {
  PpermuteCall call;
  JAX_TMA_RETURN_IF_FAILED(DecodePpermute(device, x, y, devices, sources, push, method,
                                          process, processes, links, site, timeout_ms, &call));
  if (call.where.spans_processes()) {
    // Lowering sends a mesh across processes on GPUs to lax.ppermute.
    return InvalidArgument(kPpermuteOp, "the CUDA handler runs within one process; the devices "
                                        "of this call live in several");
  }
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  PpermutePlan plan;
  JAX_TMA_RETURN_IF_FAILED(PlanPpermute(call, info, &plan));
  return LaunchPpermute(call, plan, instance, run.run_id, stream, device);
}

}  // namespace
}  // namespace jax_tma

// Not command-buffer compatible: host threads of the devices meet on every
// call, which a captured graph would skip.
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaPpermuteCuda, jax_tma::PpermuteCudaImpl,
    jax_tma::BindPpermuteCall(
        xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()));  // stream
