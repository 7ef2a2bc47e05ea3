// The geometry of jax_tma.broadcast, decoded and re-validated from the FFI
// buffers and attributes once, then shared by the CPU handler and the CUDA
// kernels (TMA store / multicast / DSMEM, SIMT).
//
// y has x's shape with a replica dim of size n inserted at `axis`. As bytes,
// x is `outer` rows of `inner_bytes` and y is outer x n rows of inner_bytes:
//   y[o, k, :] = x[o, :]   for o < outer, k < n.
#ifndef JAX_TMA_FFI_BROADCAST_BROADCAST_COMMON_H_
#define JAX_TMA_FFI_BROADCAST_BROADCAST_COMMON_H_

#include <cstdint>
#include <string_view>

#include "common.h"
#include "shape_checks.h"

namespace jax_tma {

inline constexpr std::string_view kBroadcastOp = "jax_tma.broadcast";

enum class BroadcastMethod { kAuto, kMulticast, kDsmem, kStore, kSimt };

inline bool ParseBroadcastMethod(std::string_view name, BroadcastMethod* out) {
  if (name == "auto") { *out = BroadcastMethod::kAuto; return true; }
  if (name == "multicast") { *out = BroadcastMethod::kMulticast; return true; }
  if (name == "dsmem") { *out = BroadcastMethod::kDsmem; return true; }
  if (name == "store") { *out = BroadcastMethod::kStore; return true; }
  if (name == "simt") { *out = BroadcastMethod::kSimt; return true; }
  return false;
}

inline const char* BroadcastMethodName(BroadcastMethod m) {
  switch (m) {
    case BroadcastMethod::kAuto: return "auto";
    case BroadcastMethod::kMulticast: return "multicast";
    case BroadcastMethod::kDsmem: return "dsmem";
    case BroadcastMethod::kStore: return "store";
    default: return "simt";
  }
}

// Hardware cluster sizes: 2, 4 and 8 are portable, 16 needs the
// non-portable attribute (H100/B200 maximum, the width of the multicast mask).
inline constexpr int64_t kMaxClusterSize = 16;
inline bool IsClusterSize(int64_t c) { return c == 2 || c == 4 || c == 8 || c == 16; }

struct BroadcastGeometry {
  BroadcastMethod method = BroadcastMethod::kAuto;
  int64_t cluster_size = 0;   // 0: the launcher chooses
  int64_t n = 0;              // replicas
  int64_t outer = 1;          // product of x's dims before axis
  int64_t inner_bytes = 0;    // bytes of x's dims from axis on
  const void* src = nullptr;
  void* dst = nullptr;
};

// The operands and attributes of "jax_tma_broadcast", appended to a binding
// that starts with the platform's context (none on the CPU).
template <typename Binding>
auto BindBroadcastCall(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()     // x
      .template Ret<ffi::AnyBuffer>()                          // y
      .template Attr<int64_t>("axis")                          // axis
      .template Attr<std::string_view>("method")               // method
      .template Attr<int64_t>("cluster_size");                 // cluster_size
}

// Re-validates a call of "jax_tma_broadcast" and fills in its geometry.
inline ffi::Error DecodeBroadcast(const ffi::AnyBuffer& x, ffi::Result<ffi::AnyBuffer>& y,
                                  int64_t axis, std::string_view method,
                                  int64_t cluster_size, BroadcastGeometry* g) {
  const auto op = kBroadcastOp;
  if (!ParseBroadcastMethod(method, &g->method)) {
    return BadChoice(op, "method", method, {"auto", "multicast", "dsmem", "store", "simt"});
  }
  const bool clustered =
      g->method == BroadcastMethod::kMulticast || g->method == BroadcastMethod::kDsmem;
  if (cluster_size != 0 && !(clustered ? IsClusterSize(cluster_size) : cluster_size == 1)) {
    return InvalidArgument(op, "cluster_size ", cluster_size, " is not valid for method '",
                           method, "' (", clustered ? "2, 4, 8 or 16" : "1", ", or 0 to choose)");
  }
  g->cluster_size = cluster_size;
  const auto xd = x.dimensions();
  const auto yd = y->dimensions();
  const int64_t r = static_cast<int64_t>(xd.size());
  if (axis < 0 || axis > r) {
    return InvalidArgument(op, "axis ", axis, " is outside [0, ", r, "] for an input of rank ", r);
  }
  JAX_TMA_RETURN_IF_FAILED(
      CheckRank(op, "output", static_cast<int64_t>(yd.size()), r + 1, "input rank ", r, " + 1"));
  JAX_TMA_RETURN_IF_FAILED(CheckElementTypes(op, x.element_type(), y->element_type()));
  g->n = yd[axis];
  g->outer = 1;
  g->inner_bytes = static_cast<int64_t>(ffi::ByteWidth(x.element_type()));
  for (int64_t i = 0; i < r; ++i) {
    const int64_t want = xd[i];
    const int64_t yi = i < axis ? i : i + 1;
    JAX_TMA_RETURN_IF_FAILED(CheckSameDim(op, "output", yi, yd[yi], "input", i, want));
    if (i < axis) {
      g->outer *= want;
    } else {
      g->inner_bytes *= want;
    }
  }
  g->src = x.untyped_data();
  g->dst = y->untyped_data();
  // XLA may give an empty output (n = 0) no address.
  if (y->element_count() != 0 && (g->src == nullptr || g->dst == nullptr)) {
    return InvalidArgument(op, "null buffer for a ", x.size_bytes(), "-byte input");
  }
  return ffi::Error::Success();
}

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_BROADCAST_BROADCAST_COMMON_H_
