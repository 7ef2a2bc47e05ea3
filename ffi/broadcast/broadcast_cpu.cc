// CPU handler of "jax_tma_broadcast": the semantics of broadcast_common.h as
// one memcpy per replica row (every method and cluster size gives the same
// bytes; on the host they only get validated).
#include <cstring>
#include <string_view>

#include "broadcast/broadcast_common.h"
#include "handlers.h"
#include "path_counts.h"
#include "rules.h"

namespace jax_tma {

static ffi::Error BroadcastCpuImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                                   int64_t axis, std::string_view method,
                                   int64_t cluster_size) {
  BroadcastGeometry g;
  JAX_TMA_RETURN_IF_FAILED(DecodeBroadcast(x, y, axis, method, cluster_size, &g));
  CountPath(Path::kBroadcastCpu);
  if (g.inner_bytes == 0 || g.outer == 0) return ffi::Error::Success();
  const auto* src = static_cast<const uint8_t*>(g.src);
  auto* dst = static_cast<uint8_t*>(g.dst);
  const auto row = static_cast<size_t>(g.inner_bytes);
  for (int64_t o = 0; o < g.outer; ++o) {
    for (int64_t k = 0; k < g.n; ++k) {
      std::memcpy(dst + (o * g.n + k) * row, src + o * row, row);
    }
  }
  return ffi::Error::Success();
}

void BroadcastRules(Rules* rules) {
  std::vector<int64_t> sizes;
  for (int64_t c = 1; c <= kMaxClusterSize; ++c) {
    if (IsClusterSize(c)) sizes.push_back(c);
  }
  rules->Tuple("broadcast.cluster_sizes", sizes);
}

}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTmaBroadcastCpu, jax_tma::BroadcastCpuImpl,
                              jax_tma::BindBroadcastCall(xla::ffi::Ffi::Bind()));
