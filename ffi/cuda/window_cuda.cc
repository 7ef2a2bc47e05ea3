// CUDA handler of "jax_tma_window": re-validates the geometry, then runs the
// TMA tiled kernel where the tensor-map rules allow (auto) or where asked
// (method="tma", an error naming the rule otherwise), else the SIMT kernel.
// Graph-safe: the starts stay in device memory; tensor maps are encoded per call.
#include <string>
#include <string_view>

#include "copy_cuda.h"
#include "cuda_status.h"
#include "device_info.h"
#include "tiled_window.h"
#include "window_launch.h"

namespace jax_tma {

static ffi::Error WindowCudaImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x,
                                 ffi::RemainingArgs starts, ffi::Result<ffi::AnyBuffer> y,
                                 ffi::Span<const int64_t> strides, uint64_t fill_bits,
                                 bool transpose, std::string_view method) {
  WindowGeometry g;
  JAX_TMA_RETURN_IF_FAILED(
      DecodeWindow(x, starts, y, strides, fill_bits, transpose, method, &g));
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  if (method != "simt") {
    std::string why;
    const bool fits = info.has_tma() && TiledWindowFits(g, x.untyped_data(), y->untyped_data(), &why);
    if (fits) {
      return LaunchTiledWindow(g, x.untyped_data(), y->untyped_data(), stream, device);
    }
    if (method == "tma") {
      if (!info.has_tma()) why = info.NoTmaReason(device);
      return InvalidArgument(kWindowOp, "method='tma' cannot run this window: ", why);
    }
  }
  return LaunchSimtWindow(g, x.untyped_data(), y->untyped_data(), stream, device);
}

}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaWindowCuda, jax_tma::WindowCudaImpl,
    jax_tma::BindWindowCall(xla::ffi::Ffi::Bind()
                                .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()  // stream
                                .Ctx<xla::ffi::DeviceOrdinal>()),               // device
    {xla::ffi::Traits::kCmdBufferCompatible});
