// CUDA handler of "jax_tma_im2col" (and col2im): re-validates the geometry,
// then runs the TMA im2col kernel where its rules hold (auto) or where asked
// (method="tma", an error naming the rule otherwise), else the SIMT kernels.
// col2im always takes the deterministic SIMT gather kernel.
// Graph-safe: no allocation, no synchronisation; tensor maps encoded per call.
#include <string>
#include <string_view>

#include "copy_cuda.h"
#include "cuda_status.h"
#include "device_info.h"
#include "im2col_launch.h"

namespace jax_tma {

static ffi::Error Im2colCudaImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x,
                                 ffi::Result<ffi::AnyBuffer> y,
                                 ffi::Span<const int64_t> kernel,
                                 ffi::Span<const int64_t> strides,
                                 ffi::Span<const int64_t> dilation,
                                 ffi::Span<const int64_t> pad_lo,
                                 ffi::Span<const int64_t> pad_hi, bool channel_major,
                                 bool transpose, std::string_view method) {
  Im2colGeometry g;
  JAX_TMA_RETURN_IF_FAILED(DecodeIm2col(x, y, kernel, strides, dilation, pad_lo, pad_hi,
                                        channel_major, transpose, method, &g));
  if (!transpose && method != "simt") {
    DeviceInfo info;
    JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
    std::string why;
    const bool fits =
        info.has_tma() && TmaIm2colFits(g, x.untyped_data(), y->untyped_data(), &why);
    if (fits) return LaunchTmaIm2col(g, x.untyped_data(), y->untyped_data(), stream, device);
    if (method == "tma") {
      if (!info.has_tma()) {
        why = "device " + std::to_string(device) + " has compute capability " +
              std::to_string(info.cc_major) + "." + std::to_string(info.cc_minor) +
              " (TMA needs >= 9.0)";
      }
      return InvalidArgument(kIm2colOp, "method='tma' cannot run this im2col: ", why);
    }
  }
  return LaunchSimtIm2col(g, x.untyped_data(), y->untyped_data(), stream, device);
}

}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaIm2colCuda, jax_tma::Im2colCudaImpl,
    jax_tma::BindIm2colCall(xla::ffi::Ffi::Bind()
                                .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()  // stream
                                .Ctx<xla::ffi::DeviceOrdinal>()),               // device
    {xla::ffi::Traits::kCmdBufferCompatible});
