// CPU handler for jax_tma.copy: the same byte-exact semantics as the CUDA
// handler (every method name is accepted; on the host they are one memcpy).
#include <cstring>
#include <string_view>

#include "common.h"
#include "handlers.h"
#include "path_counts.h"
#include "copy/copy_plan.h"
#include "rules.h"

namespace jax_tma {

static ffi::Error CopyCpuImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                              std::string_view method) {
  Method parsed;
  JAX_TMA_RETURN_IF_FAILED(ParseMethod("jax_tma.copy", method, &parsed, TmaSpelling::kTmaOrBulk));
  ByteCopy c;
  JAX_TMA_RETURN_IF_FAILED(CheckWholeCopy("jax_tma.copy", x, y, &c));
  if (c.bytes != 0) std::memcpy(c.dst, c.src, c.bytes);
  CountPath(Path::kCopyCpu);
  return ffi::Error::Success();
}

void CopyRules(Rules* rules) {
  // The size from which the CUDA planner's bulk kernel takes its dynamic
  // schedule (the GPU tests reach it).
  rules->Int("copy.dynamic_bulk_min_bytes", static_cast<int64_t>(kDynamicBulkMinBytes));
}

}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTmaCopyCpu, jax_tma::CopyCpuImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()          // x
                                  .Ret<xla::ffi::AnyBuffer>()          // y
                                  .Attr<std::string_view>("method"));  // method
