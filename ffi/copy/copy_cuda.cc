// CUDA handler of "jax_tma_copy": decodes and re-validates the call, plans it
// (PlanCopy) and launches the plan on XLA's stream. Graph-safe: no
// allocation, no synchronisation, no host reads of device data. An
// instantiate stage gives each call site the work-counter slot of its
// dynamic bulk schedule.
#include <memory>
#include <string_view>

#include "copy/copy_launch.h"
#include "cuda/device_info.h"
#include "cuda/handlers.h"
#include "path_counts.h"

namespace jax_tma {

// Per call site (FFI instantiate state): the work-counter slot of its
// dynamic bulk copies, returned to the pool with the executable.
struct CopySite {
  static ffi::TypeId id;
  explicit CopySite(int slot) : slot(slot) {}
  ~CopySite() { ReleaseBulkCounterSlot(slot); }
  CopySite(const CopySite&) = delete;
  CopySite& operator=(const CopySite&) = delete;
  int slot;
};
ffi::TypeId CopySite::id = {};
const ffi::TypeInfo kCopySiteTypeInfo = ffi::MakeTypeInfo<CopySite>();

static ffi::ErrorOr<std::unique_ptr<CopySite>> CopyInstantiate() {
  return std::make_unique<CopySite>(AcquireBulkCounterSlot());
}

static ffi::Error CopyCudaImpl(cudaStream_t stream, int32_t device,
                               CopySite* site, ffi::AnyBuffer x,
                               ffi::Result<ffi::AnyBuffer> y,
                               std::string_view method) {
  constexpr std::string_view kOp = "jax_tma.copy";
  Method parsed;
  JAX_TMA_RETURN_IF_FAILED(ParseMethod(kOp, method, &parsed, TmaSpelling::kTmaOrBulk));
  ByteCopy c;
  JAX_TMA_RETURN_IF_FAILED(CheckWholeCopy(kOp, x, y, &c));
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  CopyPlan plan;
  JAX_TMA_RETURN_IF_FAILED(PlanCopy(kOp, parsed, c, info, device, site->slot, nullptr, &plan));
  JAX_TMA_RETURN_IF_FAILED(LaunchCopy(plan, c, stream, device));
  if (plan.kernel != CopyKernel::kNone) {
    CountPath(plan.kernel == CopyKernel::kTma ? Path::kCopyTma : Path::kCopySimt);
  }
  return ffi::Error::Success();
}

void* CopySiteTypeId() { return &CopySite::id; }
const void* CopySiteTypeInfo() { return &kCopySiteTypeInfo; }

}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTmaCopyCudaInstantiate, jax_tma::CopyInstantiate,
                              xla::ffi::Ffi::BindInstantiate());

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaCopyCuda, jax_tma::CopyCudaImpl,
    xla::ffi::Ffi::Bind()
        .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()  // stream
        .Ctx<xla::ffi::DeviceOrdinal>()                 // device
        .Ctx<xla::ffi::State<jax_tma::CopySite>>()      // call site
        .Arg<xla::ffi::AnyBuffer>()                     // x
        .Ret<xla::ffi::AnyBuffer>()                     // y
        .Attr<std::string_view>("method"),              // method
    {xla::ffi::Traits::kCmdBufferCompatible});
