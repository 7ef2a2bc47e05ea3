// CUDA handler of "jax_tma_copy": re-validates the call, picks the kernel for
// the requested method and launches it on XLA's stream. Graph-safe: no
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

ffi::Error LaunchCopy(std::string_view op, CopyMethod method, const void* src,
                      void* dst, std::size_t bytes, cudaStream_t stream,
                      int device, int counter_slot, const BulkCopyConfig* config,
                      CopyKernel* ran) {
  if (ran != nullptr) *ran = CopyKernel::kNone;
  if (bytes == 0) return ffi::Error::Success();
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  if (method == CopyMethod::kBulk && !info.has_tma()) {
    return InvalidArgument(op, info.NeedsTma("bulk", device));
  }
  const CopyKernel kernel = ChooseCopyKernel(method, bytes, info.has_tma(), src, dst);
  if (ran != nullptr) *ran = kernel;
  if (kernel == CopyKernel::kSimt) return LaunchSimtCopy(src, dst, bytes, stream, device);
  return LaunchBulkCopy(src, dst, bytes, stream, device,
                        config != nullptr ? *config : ChooseBulkCopyConfig(bytes, counter_slot),
                        counter_slot);
}

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
  CopyMethod parsed;
  JAX_TMA_RETURN_IF_FAILED(ParseCopyMethodAttr(kOp, method, &parsed));
  ByteCopy c;
  JAX_TMA_RETURN_IF_FAILED(CheckWholeCopy(kOp, x, y, &c));
  CopyKernel ran;
  JAX_TMA_RETURN_IF_FAILED(
      LaunchCopy(kOp, parsed, c.src, c.dst, c.bytes, stream, device, site->slot, nullptr, &ran));
  if (ran != CopyKernel::kNone) {
    CountPath(ran == CopyKernel::kBulk ? Path::kCopyBulk : Path::kCopySimt);
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
