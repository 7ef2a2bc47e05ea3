// CUDA handler of "jax_tma_im2col" (and col2im): re-validates the geometry,
// then runs the TMA im2col kernel where asked (method="tma"; an error naming
// the broken hardware rule where it cannot run), else the SIMT kernels.
// method="auto" takes the SIMT kernel: on an H100 (2026-11-22) the TMA
// kernel took 1.13-1.21x its time with 128-512-byte channel runs and 8.5x
// with 16-byte runs (benchmarks/results/im2col_h100_2026-11-22.json): the TMA
// unit moves one pixel's channel run per request in each direction.
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
  if (!transpose && method == "tma") {
    DeviceInfo info;
    JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
    std::string why;
    if (!info.has_tma()) {
      why = info.NoTmaReason(device);
    } else if (TmaIm2colFits(g, x.untyped_data(), y->untyped_data(), &why)) {
      return LaunchTmaIm2col(g, x.untyped_data(), y->untyped_data(), stream, device);
    }
    return InvalidArgument(kIm2colOp, "method='tma' cannot run this im2col: ", why);
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
