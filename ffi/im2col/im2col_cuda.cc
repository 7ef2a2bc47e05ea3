// CUDA handler of "jax_tma_im2col" (and col2im): decodes and re-validates the
// geometry, plans the call once (PlanIm2col: the TMA im2col kernel where
// asked, method="tma", or an error naming the broken hardware rule; else the
// SIMT kernels, col2im always the deterministic SIMT gather kernel) and
// launches the plan. Graph-safe: no allocation, no synchronisation; tensor
// maps encoded per call.
#include <string_view>

#include "cuda/device_info.h"
#include "cuda/handlers.h"
#include "im2col/im2col_launch.h"

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
  Method parsed;
  JAX_TMA_RETURN_IF_FAILED(DecodeIm2col(x, y, kernel, strides, dilation, pad_lo, pad_hi,
                                        channel_major, transpose, method, &g, &parsed));
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  Im2colPlan plan;
  JAX_TMA_RETURN_IF_FAILED(
      PlanIm2col(g, parsed, info, device, x.untyped_data(), y->untyped_data(), &plan));
  return LaunchIm2col(g, plan, x.untyped_data(), y->untyped_data(), stream, device);
}

}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaIm2colCuda, jax_tma::Im2colCudaImpl,
    jax_tma::BindIm2colCall(xla::ffi::Ffi::Bind()
                                .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()  // stream
                                .Ctx<xla::ffi::DeviceOrdinal>()),               // device
    {xla::ffi::Traits::kCmdBufferCompatible});
