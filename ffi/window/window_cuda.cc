// CUDA handler of "jax_tma_window": decodes and re-validates the geometry,
// plans the call once (PlanWindow: the TMA tiled kernel where the tensor-map
// rules allow, or an error naming the rule for method="tma"; else SIMT) and
// launches the plan. Graph-safe: traced starts stay in device memory (the
// kernels read them there; static ones travel as kernel parameters); tensor
// maps are encoded per call.
#include <string_view>

#include "cuda/device_info.h"
#include "cuda/handlers.h"
#include "window/window_launch.h"

namespace jax_tma {

static ffi::Error WindowCudaImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x,
                                 ffi::RemainingArgs starts, ffi::Result<ffi::AnyBuffer> y,
                                 ffi::Span<const int64_t> strides, ffi::Span<const int64_t> fill,
                                 bool transpose, std::string_view method,
                                 ffi::Span<const int64_t> static_start) {
  WindowGeometry g;
  Method parsed;
  JAX_TMA_RETURN_IF_FAILED(DecodeWindow(x, starts, y, strides, fill, transpose, method,
                                        static_start, &g, &parsed));
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  WindowPlan plan;
  JAX_TMA_RETURN_IF_FAILED(PlanWindow(g, parsed, static_start[g.rank - 1], info, device,
                                      x.untyped_data(), y->untyped_data(), &plan));
  return LaunchWindow(g, plan, x.untyped_data(), y->untyped_data(), stream, device);
}

}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaWindowCuda, jax_tma::WindowCudaImpl,
    jax_tma::BindWindowCall(xla::ffi::Ffi::Bind()
                                .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()  // stream
                                .Ctx<xla::ffi::DeviceOrdinal>()),               // device
    {xla::ffi::Traits::kCmdBufferCompatible});
