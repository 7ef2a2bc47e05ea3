// CUDA handler of "jax_tma_im2col" (and col2im): re-validates the geometry,
// then runs the kernel ChooseIm2colKernel picks: the TMA im2col kernel where
// asked (method="tma"; an error naming the broken hardware rule where it
// cannot run), else the SIMT kernels (col2im always takes the deterministic
// SIMT gather kernel). Graph-safe: no allocation, no synchronisation; tensor
// maps encoded per call.
#include <string>
#include <string_view>

#include "cuda/device_info.h"
#include "cuda/handlers.h"
#include "im2col/im2col_launch.h"
#include "path_counts.h"

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
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  Im2colKernel path;
  std::string why;
  if (!ChooseIm2colKernel(g, method, info, device, x.untyped_data(), y->untyped_data(), &path,
                          &why)) {
    return InvalidArgument(kIm2colOp, why);
  }
  if (path == Im2colKernel::kTma) {
    JAX_TMA_RETURN_IF_FAILED(
        LaunchTmaIm2col(g, x.untyped_data(), y->untyped_data(), stream, device));
    CountPath(Path::kIm2colTma);
  } else {
    JAX_TMA_RETURN_IF_FAILED(
        LaunchSimtIm2col(g, x.untyped_data(), y->untyped_data(), stream, device));
    CountPath(Path::kIm2colSimt);
  }
  return ffi::Error::Success();
}

}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaIm2colCuda, jax_tma::Im2colCudaImpl,
    jax_tma::BindIm2colCall(xla::ffi::Ffi::Bind()
                                .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()  // stream
                                .Ctx<xla::ffi::DeviceOrdinal>()),               // device
    {xla::ffi::Traits::kCmdBufferCompatible});
