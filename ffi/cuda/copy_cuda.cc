// CUDA handler of "jax_tma_copy": re-validates the call, picks the kernel for
// the requested method and launches it on XLA's stream. Graph-safe: no
// allocation, no synchronisation, no host reads of device data.
#include <string_view>

#include "copy_cuda.h"
#include "copy_launch.h"
#include "device_info.h"

namespace jax_tma {

ffi::Error LaunchCopy(std::string_view op, CopyMethod method, const void* src,
                      void* dst, std::size_t bytes, cudaStream_t stream,
                      int device, const BulkCopyConfig& config) {
  if (bytes == 0) return ffi::Error::Success();
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  if (method == CopyMethod::kBulk && !info.has_tma()) {
    return InvalidArgument(op, "method='bulk' needs TMA (compute capability "
                           ">= 9.0) but device ", device,
                           " has compute capability ", info.cc_major, ".",
                           info.cc_minor);
  }
  // auto: the SIMT kernel below kAutoBulkMinBytes, the bulk pipeline from
  // there up. H100 (2026-11-22, cold input, x cudaMemcpyAsync): SIMT 0.99-1.0x
  // at 32 MiB against bulk's 0.97x; at 64 MiB bulk 0.97x against SIMT's 0.93x.
  const bool simt = method == CopyMethod::kSimt || !info.has_tma() ||
                    (method == CopyMethod::kAuto && bytes < kAutoBulkMinBytes);
  if (simt) return LaunchSimtCopy(src, dst, bytes, stream, device);
  return LaunchBulkCopy(src, dst, bytes, stream, device, config);
}

static ffi::Error CopyCudaImpl(cudaStream_t stream, int32_t device,
                               ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                               std::string_view method) {
  constexpr std::string_view kOp = "jax_tma.copy";
  CopyMethod parsed;
  JAX_TMA_RETURN_IF_FAILED(ParseCopyMethodAttr(kOp, method, &parsed));
  ByteCopy c;
  JAX_TMA_RETURN_IF_FAILED(CheckWholeCopy(kOp, x, y, &c));
  return LaunchCopy(kOp, parsed, c.src, c.dst, c.bytes, stream, device);
}

}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaCopyCuda, jax_tma::CopyCudaImpl,
    xla::ffi::Ffi::Bind()
        .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()  // stream
        .Ctx<xla::ffi::DeviceOrdinal>()                 // device
        .Arg<xla::ffi::AnyBuffer>()                     // x
        .Ret<xla::ffi::AnyBuffer>()                     // y
        .Attr<std::string_view>("method"),              // method
    {xla::ffi::Traits::kCmdBufferCompatible});
