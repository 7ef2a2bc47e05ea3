// CUDA handler of "jax_tma_window": re-validates the geometry, then runs the
// kernel ChooseWindowKernel picks: the TMA tiled kernel where the tensor-map
// rules allow (auto) or where asked (method="tma", an error naming the rule
// otherwise), else the SIMT kernel. Graph-safe: the starts stay in device
// memory; tensor maps are encoded per call.
#include <string>
#include <string_view>

#include "cuda/device_info.h"
#include "cuda/handlers.h"
#include "path_counts.h"
#include "window/window_launch.h"

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
  WindowKernel kernel;
  std::string why;
  if (!ChooseWindowKernel(g, method, info, device, x.untyped_data(), y->untyped_data(), &kernel,
                          &why)) {
    return InvalidArgument(kWindowOp, why);
  }
  if (kernel == WindowKernel::kTiled) {
    JAX_TMA_RETURN_IF_FAILED(
        LaunchTiledWindow(g, x.untyped_data(), y->untyped_data(), stream, device));
    CountPath(Path::kWindowTiled);
  } else {
    JAX_TMA_RETURN_IF_FAILED(
        LaunchSimtWindow(g, x.untyped_data(), y->untyped_data(), stream, device));
    CountPath(Path::kWindowSimt);
  }
  return ffi::Error::Success();
}

}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaWindowCuda, jax_tma::WindowCudaImpl,
    jax_tma::BindWindowCall(xla::ffi::Ffi::Bind()
                                .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()  // stream
                                .Ctx<xla::ffi::DeviceOrdinal>()),               // device
    {xla::ffi::Traits::kCmdBufferCompatible});
