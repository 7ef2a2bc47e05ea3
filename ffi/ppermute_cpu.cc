// CPU handler for jax_tma.ppermute: every host device's part meets the others
// through the same rendezvous as the CUDA handler and copies its source's
// block straight out of that device's buffer (or writes zeros).
#include <cstring>
#include <string_view>

#include "ppermute_cpu.h"
#include "ppermute_rendezvous.h"

namespace jax_tma {

static ffi::Error PpermuteCpuImpl(int32_t device, ffi::RunId run,
                                  ffi::AnyBuffer x,
                                  ffi::Result<ffi::AnyBuffer> y, int64_t instance,
                                  ffi::Span<const int64_t> devices,
                                  ffi::Span<const int64_t> sources,
                                  std::string_view method) {
  CopyMethod parsed;  // every method is the same memcpy on the host
  JAX_TMA_RETURN_IF_FAILED(ParseCopyMethodAttr(kPpermuteOp, method, &parsed));
  ByteCopy c;
  JAX_TMA_RETURN_IF_FAILED(CheckWholeCopy(kPpermuteOp, x, y, &c));
  PermutePlan plan;
  JAX_TMA_RETURN_IF_FAILED(PlanPermute(device, devices, sources, &plan));
  // Each step is synchronous on the host, so reaching Depart means the read
  // is finished and returning after it means every reader's is.
  return ExchangeBlocks(
      instance, plan, PermuteBlock{run.run_id, c.src},
      [&](const PermuteBlock* source) {
        if (c.bytes == 0) return ffi::Error::Success();
        if (source == nullptr) {
          std::memset(c.dst, 0, c.bytes);
        } else {
          std::memcpy(c.dst, source->data, c.bytes);
        }
        return ffi::Error::Success();
      },
      [](const std::vector<void*>&) { return ffi::Error::Success(); });
}

}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaPpermuteCpu, jax_tma::PpermuteCpuImpl,
    xla::ffi::Ffi::Bind()
        .Ctx<xla::ffi::DeviceOrdinal>()                 // device
        .Ctx<xla::ffi::RunId>()                         // run
        .Arg<xla::ffi::AnyBuffer>()                     // x
        .Ret<xla::ffi::AnyBuffer>()                     // y
        .Attr<int64_t>("instance")                      // instance
        .Attr<xla::ffi::Span<const int64_t>>("devices") // devices
        .Attr<xla::ffi::Span<const int64_t>>("sources") // sources
        .Attr<std::string_view>("method"));             // method
