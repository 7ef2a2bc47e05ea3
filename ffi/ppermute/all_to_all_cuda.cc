// CUDA handler of "jax_tma_all_to_all": decodes and re-validates the call,
// copies the chunk that stays, then runs each step of the exchange
// (all_to_all.h) as a push of ppermute's device-side transport
// (LaunchPpermute) straight into the destination's result, in this process
// or across the processes of one host. An instantiate stage gives each
// lowered all_to_all of an executable the participants of each step
// (AllToAllSites), freed with the executable.
#include <map>
#include <memory>
#include <mutex>
#include <string_view>

#include "cuda/cuda_status.h"
#include "cuda/device_info.h"
#include "cuda/handlers.h"
#include "path_counts.h"
#include "ppermute/all_to_all.h"
#include "ppermute/ppermute_launch.h"

namespace jax_tma {

// The participants of each step of a lowered all_to_all (one PeerSites a
// step, set up by the step's first call on each device).
class AllToAllSites {
 public:
  static ffi::TypeId id;
  PeerSites* Step(int k) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& sites = steps_[k];
    if (sites == nullptr) sites = std::make_unique<PeerSites>();
    return sites.get();
  }

 private:
  std::mutex mu_;
  std::map<int, std::unique_ptr<PeerSites>> steps_;
};

ffi::TypeId AllToAllSites::id = {};
const ffi::TypeInfo kAllToAllSitesTypeInfo = ffi::MakeTypeInfo<AllToAllSites>();
void* AllToAllSitesTypeId() { return &AllToAllSites::id; }
const void* AllToAllSitesTypeInfo() { return &kAllToAllSitesTypeInfo; }

namespace {

ffi::ErrorOr<std::unique_ptr<AllToAllSites>> AllToAllInstantiate() {
  return std::make_unique<AllToAllSites>();
}

// `instance` numbers the CPU handler's meetings; here the executable's
// state (`sites`) holds each step's participants.
ffi::Error AllToAllCudaImpl(cudaStream_t stream, AllToAllSites* sites, int32_t device,
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
  if (call.bytes.bytes == 0) return ffi::Error::Success();
  CountPath(Path::kAllToAllPeer);
  const ByteCopy local = call.Local();
  JAX_TMA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(local.dst, local.src, local.bytes, cudaMemcpyDeviceToDevice, stream));
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  for (int k = 1; k < call.parts; ++k) {
    PpermuteCall step{call.method, call.Step(k), call.steps[k - 1], call.StepPlan(k)};
    PpermutePlan plan;
    JAX_TMA_RETURN_IF_FAILED(PlanPpermute(step, info, &plan));
    JAX_TMA_RETURN_IF_FAILED(LaunchPpermute(step, plan, sites->Step(k), stream, device));
  }
  return ffi::Error::Success();
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
            .Ctx<xla::ffi::State<jax_tma::AllToAllSites>>()),  // sites
    {xla::ffi::Traits::kCmdBufferCompatible});
