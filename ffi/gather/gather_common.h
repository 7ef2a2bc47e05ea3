// The geometry and semantics of jax_tma.gather / jax_tma.scatter, decoded and
// re-validated from the FFI buffers and attributes once, then shared by the
// CPU handlers and the CUDA kernels: index wrapping, the slab layout, fill.
//
// x is viewed as (B, P, N, S) bytes: B batch dims shared with the indices, P
// the other dims before `axis`, N = x.shape[axis], S the slab (the dims after
// axis, contiguous). The indices are (B, M). Slab rows of the gathered output
// (and of scatter's updates) are (B, P, M, S):
//   gather:  out[b, p, m] = x[b, p, w(idx[b, m])], or fill where w is -1;
//   scatter: x[b, p, w(idx[b, m])] = updates[b, p, m] (set) or += (add);
//            rows with w = -1 are dropped.
// w(i) wraps a negative i once (i + N) and is -1 outside [0, N).
#ifndef JAX_TMA_FFI_GATHER_GATHER_COMMON_H_
#define JAX_TMA_FFI_GATHER_GATHER_COMMON_H_

#include <cstdint>
#include <string_view>

#include "common.h"
#include "im2col/im2col_common.h"  // SumKind, Col2imSum: the element arithmetic col2im shares

namespace jax_tma {

inline constexpr std::string_view kGatherOp = "jax_tma.gather";
inline constexpr std::string_view kScatterOp = "jax_tma.scatter";

enum class GatherMethod { kAuto, kTma, kSimt };
enum class ScatterMode { kSet, kAdd };
enum class IndexKind : int32_t { kS8, kS16, kS32, kS64, kU8, kU16, kU32, kU64 };

inline bool IndexKindOf(ffi::DataType t, IndexKind* k) {
  switch (t) {
    case ffi::DataType::S8: *k = IndexKind::kS8; return true;
    case ffi::DataType::S16: *k = IndexKind::kS16; return true;
    case ffi::DataType::S32: *k = IndexKind::kS32; return true;
    case ffi::DataType::S64: *k = IndexKind::kS64; return true;
    case ffi::DataType::U8: *k = IndexKind::kU8; return true;
    case ffi::DataType::U16: *k = IndexKind::kU16; return true;
    case ffi::DataType::U32: *k = IndexKind::kU32; return true;
    case ffi::DataType::U64: *k = IndexKind::kU64; return true;
    default: return false;
  }
}

// w(indices[i]) for a table of n rows: negative values wrap once, anything
// outside [0, n) after that is -1. Unsigned values never wrap. The kind's
// code gives the width (its low two bits) and the signedness: an if-chain,
// common widths first, where an eight-way switch compiled to a jump table
// whose constant-bank read and indirect branch cost a small call 0.14 µs.
static_assert(static_cast<int32_t>(IndexKind::kS32) == 2 &&
              static_cast<int32_t>(IndexKind::kU8) == 4 &&
              static_cast<int32_t>(IndexKind::kU64) == 7);
JAX_TMA_HOST_DEVICE inline int64_t SlabRow(const void* indices, IndexKind kind, int64_t i,
                                           int64_t n) {
  const auto k = static_cast<int32_t>(kind);
  const int32_t log_bytes = k & 3;
  uint64_t u;
  if (log_bytes == 2) {
    u = static_cast<const uint32_t*>(indices)[i];
  } else if (log_bytes == 3) {
    u = static_cast<const uint64_t*>(indices)[i];
  } else if (log_bytes == 1) {
    u = static_cast<const uint16_t*>(indices)[i];
  } else {
    u = static_cast<const uint8_t*>(indices)[i];
  }
  if (k >= 4) return u < static_cast<uint64_t>(n) ? static_cast<int64_t>(u) : -1;
  const int unused_bits = 64 - (8 << log_bytes);
  int64_t v = static_cast<int64_t>(u << unused_bits) >> unused_bits;  // sign-extended
  if (v < 0) v += n;  // no overflow: v < 0 <= n
  return v >= 0 && v < n ? v : -1;
}

inline bool ParseGatherMethod(std::string_view name, GatherMethod* out) {
  if (name == "auto") { *out = GatherMethod::kAuto; return true; }
  if (name == "tma") { *out = GatherMethod::kTma; return true; }
  if (name == "simt") { *out = GatherMethod::kSimt; return true; }
  return false;
}

struct GatherGeometry {
  GatherMethod method = GatherMethod::kAuto;
  int64_t batch = 1;       // B
  int64_t outer = 1;       // P
  int64_t table_rows = 0;  // N
  int64_t count = 0;       // M, indices per batch entry
  int64_t slab_bytes = 0;  // S
  int64_t elem_bytes = 1;
  int64_t table_bytes = 0;  // of x
  IndexKind index_kind = IndexKind::kS32;
  const void* indices = nullptr;
  const void* x = nullptr;      // the table
  void* out = nullptr;          // gather: (B, P, M, S); scatter: x's shape
  const void* slabs = nullptr;  // gather: the fill element; scatter: the updates
  // scatter only
  ScatterMode mode = ScatterMode::kSet;
  bool deterministic = false;
  const void* order = nullptr;  // (B, M) stable argsort of each batch entry's rows
  bool order_64 = false;        // order is s64 (else s32)
  SumKind sum = SumKind::kU8;   // add: the element arithmetic
  int components = 1;           // add: summed parts per element (2 for complex)

  // Slab rows of the gathered output / of the updates: B * P * M.
  JAX_TMA_HOST_DEVICE int64_t rows() const { return batch * outer * count; }
  // Flat slab row of x that slab row r of the output/updates reads/writes, or
  // -1 when its index is out of range.
  JAX_TMA_HOST_DEVICE int64_t TableRow(int64_t r) const;
};

// TableRow with batch or outer dims: divisions, kept out of line (inlined,
// their code cost every small call of the plain case 0.09 µs). Scalars, not
// the geometry, so that a kernel passes them in registers.
JAX_TMA_HOST_DEVICE JAX_TMA_NOINLINE inline int64_t DividedTableRow(
    const void* indices, IndexKind kind, int64_t r, int64_t count, int64_t outer,
    int64_t table_rows) {
  const int64_t m = r % count;
  const int64_t bp = r / count;
  const int64_t b = bp / outer;
  const int64_t w = SlabRow(indices, kind, b * count + m, table_rows);
  return w < 0 ? -1 : bp * table_rows + w;
}

JAX_TMA_HOST_DEVICE inline int64_t GatherGeometry::TableRow(int64_t r) const {
  if (batch == 1 && outer == 1) return SlabRow(indices, index_kind, r, table_rows);
  return DividedTableRow(indices, index_kind, r, count, outer, table_rows);
}

#if defined(__CUDACC__)
// The V at byte offset `o` of a slab of gather's fill element (element sizes
// are powers of two), read a byte at a time where a row needs it: a 16-byte
// pattern loaded once a SIMT tile cost 2% at 128 B rows (H100, 108.1 against
// 106.1 us), and loaded a vector it spilled registers.
template <typename V>
__device__ __forceinline__ V FillVector(const void* fill, int64_t elem_bytes, int64_t o) {
  union {
    V v;
    uint8_t b[sizeof(V)];
  } u;
  const auto* bytes = static_cast<const uint8_t*>(fill);
  const int mask = static_cast<int>(elem_bytes) - 1;
  for (int i = 0; i < static_cast<int>(sizeof(V)); ++i) {
    u.b[i] = bytes[(static_cast<int>(o) + i) & mask];
  }
  return u.v;
}
#endif  // __CUDACC__

// The operands and attributes shared by both targets, appended to a binding
// that starts with the platform's context (none on the CPU).
template <typename Binding>
auto BindGatherCall(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()     // x
      .template Arg<ffi::AnyBuffer>()                          // indices
      .template Arg<ffi::AnyBuffer>()                          // fill (0-d, x's dtype)
      .template Ret<ffi::AnyBuffer>()                          // out
      .template Attr<int64_t>("axis")                          // axis
      .template Attr<int64_t>("batch")                         // batch
      .template Attr<std::string_view>("method");              // method
}

template <typename Binding>
auto BindScatterCall(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()     // x
      .template Arg<ffi::AnyBuffer>()                          // indices
      .template Arg<ffi::AnyBuffer>()                          // updates
      .template Arg<ffi::AnyBuffer>()                          // order (deterministic) or empty
      .template Ret<ffi::AnyBuffer>()                          // out (aliases x)
      .template Attr<int64_t>("axis")                          // axis
      .template Attr<int64_t>("batch")                         // batch
      .template Attr<std::string_view>("mode")                 // mode
      .template Attr<bool>("deterministic")                    // deterministic
      .template Attr<std::string_view>("method");              // method
}

namespace gather_detail {

// a * b, or false where the product overflows int64.
inline bool Mul(int64_t a, int64_t b, int64_t* out) { return !__builtin_mul_overflow(a, b, out); }

// The checks both ops share: method, element type, ranks and the dims of
// x and indices, the slab array's dims (gather: the output; scatter: the
// updates) against x.shape[:axis] + indices.shape[batch:] + x.shape[axis+1:].
inline ffi::Error DecodeSlabs(std::string_view op, const ffi::AnyBuffer& x,
                              const ffi::AnyBuffer& indices, ffi::DataType slab_type,
                              ffi::Span<const int64_t> slab_dims, std::string_view slab_name,
                              int64_t axis, int64_t batch, std::string_view method,
                              GatherGeometry* g) {
  if (!ParseGatherMethod(method, &g->method)) {
    return BadChoice(op, "method", method, {"auto", "tma", "simt"});
  }
  JAX_TMA_RETURN_IF_FAILED(CheckElementTypes(op, x.element_type(), slab_type));
  if (!IndexKindOf(indices.element_type(), &g->index_kind)) {
    return InvalidArgument(op, "indices must be integers, got element type ",
                           DataTypeName(indices.element_type()));
  }
  const auto xd = x.dimensions();
  const auto id = indices.dimensions();
  const int64_t r = static_cast<int64_t>(xd.size());
  const int64_t ir = static_cast<int64_t>(id.size());
  if (r < 1) return InvalidArgument(op, "x must have rank >= 1, got a 0-d array");
  if (axis < 0 || axis >= r) {
    return InvalidArgument(op, "axis ", axis, " is outside [0, ", r - 1, "] for x of rank ", r);
  }
  if (batch < 0 || batch > axis || batch > ir) {
    return InvalidArgument(op, "batch ", batch, " is outside [0, min(axis, indices rank)] = [0, ",
                           axis < ir ? axis : ir, "]");
  }
  const int64_t want_rank = r - 1 + ir - batch;
  if (static_cast<int64_t>(slab_dims.size()) != want_rank) {
    return InvalidArgument(op, slab_name, " has rank ", slab_dims.size(), "; expected ", want_rank,
                           " (x rank ", r, " - 1 + indices rank ", ir, " - batch ", batch, ")");
  }
  g->elem_bytes = static_cast<int64_t>(ffi::ByteWidth(x.element_type()));
  g->batch = g->outer = g->count = 1;
  g->slab_bytes = g->elem_bytes;
  g->table_rows = xd[axis];
  bool ok = true;
  for (int64_t d = 0; d < batch; ++d) {
    if (id[d] != xd[d]) {
      return InvalidArgument(op, "indices dim ", d, " = ", id[d], " differs from x dim ", d, " = ",
                             xd[d], " (both are batch dims)");
    }
    ok = ok && Mul(g->batch, xd[d], &g->batch);
  }
  for (int64_t d = batch; d < axis; ++d) ok = ok && Mul(g->outer, xd[d], &g->outer);
  for (int64_t d = batch; d < ir; ++d) ok = ok && Mul(g->count, id[d], &g->count);
  for (int64_t d = axis + 1; d < r; ++d) ok = ok && Mul(g->slab_bytes, xd[d], &g->slab_bytes);
  int64_t rows = 0, table = 0;
  ok = ok && Mul(g->batch, g->outer, &rows) && Mul(rows, g->count, &rows) &&
       Mul(g->batch * g->outer, g->table_rows, &table) && Mul(rows, g->slab_bytes, &rows);
  if (!ok) return InvalidArgument(op, "the slab geometry overflows 64 bits");
  for (int64_t d = 0; d < want_rank; ++d) {
    const int64_t want = d < axis ? xd[d] : d < axis + ir - batch ? id[d - axis + batch]
                                                                  : xd[d - (ir - batch) + 1];
    if (slab_dims[d] != want) {
      return InvalidArgument(op, slab_name, " dim ", d, " is ", slab_dims[d], "; expected ", want,
                             " (x.shape[:axis] + indices.shape[batch:] + x.shape[axis+1:])");
    }
  }
  g->indices = indices.untyped_data();
  g->x = x.untyped_data();
  g->table_bytes = static_cast<int64_t>(x.size_bytes());
  if ((x.element_count() != 0 && g->x == nullptr) ||
      (indices.element_count() != 0 && g->indices == nullptr)) {
    return InvalidArgument(op, "null input buffer");
  }
  return ffi::Error::Success();
}

}  // namespace gather_detail

// Re-validates a call of "jax_tma_gather" and fills in its geometry.
inline ffi::Error DecodeGather(const ffi::AnyBuffer& x, const ffi::AnyBuffer& indices,
                               const ffi::AnyBuffer& fill, ffi::Result<ffi::AnyBuffer>& out,
                               int64_t axis, int64_t batch, std::string_view method,
                               GatherGeometry* g) {
  const auto op = kGatherOp;
  JAX_TMA_RETURN_IF_FAILED(gather_detail::DecodeSlabs(op, x, indices, out->element_type(),
                                                      out->dimensions(), "output", axis, batch,
                                                      method, g));
  if (fill.element_type() != x.element_type() || fill.element_count() != 1) {
    return InvalidArgument(op, "fill must be one element of x's type ",
                           DataTypeName(x.element_type()), ", got ", fill.element_count(),
                           " of ", DataTypeName(fill.element_type()));
  }
  g->slabs = fill.untyped_data();
  g->out = out->untyped_data();
  if (g->slabs == nullptr || (out->element_count() != 0 && g->out == nullptr)) {
    return InvalidArgument(op, "null buffer");
  }
  return ffi::Error::Success();
}

// Re-validates a call of "jax_tma_scatter" and fills in its geometry.
inline ffi::Error DecodeScatter(const ffi::AnyBuffer& x, const ffi::AnyBuffer& indices,
                                const ffi::AnyBuffer& updates, const ffi::AnyBuffer& order,
                                ffi::Result<ffi::AnyBuffer>& out, int64_t axis, int64_t batch,
                                std::string_view mode, bool deterministic,
                                std::string_view method, GatherGeometry* g) {
  const auto op = kScatterOp;
  if (mode == "set") {
    g->mode = ScatterMode::kSet;
  } else if (mode == "add") {
    g->mode = ScatterMode::kAdd;
  } else {
    return BadChoice(op, "mode", mode, {"set", "add"});
  }
  JAX_TMA_RETURN_IF_FAILED(gather_detail::DecodeSlabs(op, x, indices, updates.element_type(),
                                                      updates.dimensions(), "updates", axis,
                                                      batch, method, g));
  JAX_TMA_RETURN_IF_FAILED(CheckElementTypes(op, x.element_type(), out->element_type()));
  const auto xd = x.dimensions();
  const auto od = out->dimensions();
  bool same = xd.size() == od.size();
  for (size_t d = 0; same && d < xd.size(); ++d) same = xd[d] == od[d];
  if (!same) return InvalidArgument(op, "the output's shape differs from x's");
  if (g->mode == ScatterMode::kAdd && !SumKindOf(x.element_type(), &g->sum, &g->components)) {
    return InvalidArgument(op, "mode 'add' cannot sum element type ",
                           DataTypeName(x.element_type()),
                           " (integer, f16, bf16, f32, f64, c64 or c128)");
  }
  g->deterministic = deterministic;
  const int64_t want = deterministic ? g->batch * g->count : 0;
  if (static_cast<int64_t>(order.element_count()) != want ||
      (deterministic && order.element_type() != ffi::DataType::S32 &&
       order.element_type() != ffi::DataType::S64)) {
    return InvalidArgument(op, "order must be ", want,
                           deterministic ? " s32 or s64 row numbers (one per index)"
                                         : " elements without deterministic",
                           ", got ", order.element_count(), " of ",
                           DataTypeName(order.element_type()));
  }
  g->order = order.untyped_data();
  g->order_64 = order.element_type() == ffi::DataType::S64;
  g->slabs = updates.untyped_data();
  g->out = out->untyped_data();
  if ((updates.element_count() != 0 && g->slabs == nullptr) ||
      (want != 0 && g->order == nullptr) || (out->element_count() != 0 && g->out == nullptr)) {
    return InvalidArgument(op, "null buffer");
  }
  return ffi::Error::Success();
}

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_GATHER_GATHER_COMMON_H_
