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
#include <optional>
#include <string_view>
#include <utility>

#include "common.h"
#include "element_sum.h"
#include "fill.h"
#include "shape_checks.h"

namespace jax_tma {

inline constexpr std::string_view kGatherOp = "jax_tma.gather";
inline constexpr std::string_view kScatterOp = "jax_tma.scatter";

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
// common widths first: an eight-way switch compiles to a jump table whose
// constant-bank read and indirect branch cost small calls time
// (benchmarks/TUNING.md, SlabRow).
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
  return static_cast<uint64_t>(v) < static_cast<uint64_t>(n) ? v : -1;  // n >= 0
}

struct GatherGeometry {
  Method method = Method::kAuto;
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
  FillPattern fill;             // gather: the slab of an out-of-range index
  const void* slabs = nullptr;  // scatter: the updates
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

// TableRow with batch or outer dims: divisions, kept out of line so that
// their code does not slow the plain case (benchmarks/TUNING.md,
// DividedTableRow). Scalars, not the geometry, so that a kernel passes them
// in registers.
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

// One call moves up to kMaxGatherTables tables through the same indices
// (jax_tma.gather((k_pool, v_pool), pages)). Each table is decoded into its
// own geometry; tables whose geometry and plan agree (FusesWith) run as one
// kernel launch, a table for each blockIdx.y, their buffers in GatherTables.
inline constexpr int kMaxGatherTables = 8;

struct GatherTables {
  int count = 0;
  const void* x[kMaxGatherTables] = {};
  void* out[kMaxGatherTables] = {};
  const void* slabs[kMaxGatherTables] = {};
  FillPattern fill[kMaxGatherTables] = {};

  // `g` with the buffers (and fill) of table i.
  JAX_TMA_HOST_DEVICE GatherGeometry Of(GatherGeometry g, int i) const {
    g.x = x[i];
    g.out = out[i];
    g.slabs = slabs[i];
    g.fill = fill[i];
    return g;
  }
  // Appends the buffers of `g`; false where the launch is full.
  bool Add(const GatherGeometry& g) {
    if (count == kMaxGatherTables) return false;
    x[count] = g.x;
    out[count] = g.out;
    slabs[count] = g.slabs;
    fill[count] = g.fill;
    ++count;
    return true;
  }
};

#if defined(__CUDACC__)
// The geometry of this block's table: `g` itself (whose buffers are table
// 0's) in a launch of one table, which then reads no table's buffers by
// blockIdx.y.
__device__ __forceinline__ GatherGeometry BlockTable(const GatherGeometry& g,
                                                     const GatherTables& tables) {
  return gridDim.y == 1 ? g : tables.Of(g, static_cast<int>(blockIdx.y));
}
#endif  // __CUDACC__

// The tables of a launch: 1 to kMaxGatherTables (its grid's y dim).
inline ffi::Error CheckTables(std::string_view op, const GatherTables& tables) {
  if (tables.count < 1 || tables.count > kMaxGatherTables) {
    return InvalidArgument(op, "a launch moves 1 to ", kMaxGatherTables, " tables, got ",
                           tables.count);
  }
  return ffi::Error::Success();
}

// The operands and attributes shared by both targets, appended to a binding
// that starts with the platform's context (none on the CPU). Gather:
// (indices, x_0..x_{n-1}) -> (out_0..out_{n-1}), each table's fill in the
// attribute "fill" (fill.h).
template <typename Binding>
auto BindGatherCall(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()     // indices
      .RemainingArgs()                                         // the tables
      .RemainingRets()                                         // an output per table
      .template Attr<int64_t>("axis")                          // axis
      .template Attr<int64_t>("batch")                         // batch
      .template Attr<ffi::Span<const int64_t>>("fill")         // fill
      .template Attr<std::string_view>("method");              // method
}

// Scatter: (indices, order, x_0..x_{n-1}, updates_0..updates_{n-1}) ->
// (out_0..out_{n-1}), out_t aliasing x_t.
template <typename Binding>
auto BindScatterCall(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()     // indices
      .template Arg<ffi::AnyBuffer>()                          // order (deterministic) or empty
      .RemainingArgs()                                         // the tables, then their updates
      .RemainingRets()                                         // an output per table (aliases it)
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
  JAX_TMA_RETURN_IF_FAILED(ParseMethod(op, method, &g->method));
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
  JAX_TMA_RETURN_IF_FAILED(CheckRank(op, slab_name, static_cast<int64_t>(slab_dims.size()),
                                     want_rank, "x rank ", r, " - 1 + indices rank ", ir,
                                     " - batch ", batch));
  g->elem_bytes = static_cast<int64_t>(ffi::ByteWidth(x.element_type()));
  g->batch = g->outer = g->count = 1;
  g->slab_bytes = g->elem_bytes;
  g->table_rows = xd[axis];
  bool ok = true;
  for (int64_t d = 0; d < batch; ++d) {
    JAX_TMA_RETURN_IF_FAILED(
        CheckSameDim(op, "indices", d, id[d], "x", d, xd[d], "both are batch dims"));
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

// Re-validates table t of an n-table call of "jax_tma_gather" and fills in
// its geometry.
inline ffi::Error DecodeGather(const ffi::AnyBuffer& x, const ffi::AnyBuffer& indices,
                               ffi::Result<ffi::AnyBuffer>& out, int64_t axis, int64_t batch,
                               ffi::Span<const int64_t> fill, size_t t, size_t n,
                               std::string_view method, GatherGeometry* g) {
  const auto op = kGatherOp;
  JAX_TMA_RETURN_IF_FAILED(gather_detail::DecodeSlabs(op, x, indices, out->element_type(),
                                                      out->dimensions(), "output", axis, batch,
                                                      method, g));
  JAX_TMA_RETURN_IF_FAILED(ParseFill(op, fill, t, n, g->elem_bytes, &g->fill));
  g->out = out->untyped_data();
  if (out->element_count() != 0 && g->out == nullptr) return InvalidArgument(op, "null buffer");
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

namespace gather_detail {

// The error of table t of an n-table call, named as such ("jax_tma.gather:
// table 1: ...") where n > 1.
inline ffi::Error ForTable(ffi::Error e, std::string_view op, size_t t, size_t n) {
  if (e.success() || n == 1) return e;
  const std::string& what = e.message();
  const size_t skip = what.compare(0, op.size(), op) == 0 && what.compare(op.size(), 2, ": ") == 0
                          ? op.size() + 2 : 0;
  Message m;
  m << op << ": table " << t << ": " << std::string_view(what).substr(skip);
  return ffi::Error(e.errc().value_or(ffi::ErrorCode::kInvalidArgument), m.str());
}

// Buffer i of the remaining operands (or results) of a call.
template <typename Remaining, typename T>
ffi::Error Get(std::string_view op, const Remaining& all, size_t i, T* out) {
  auto got = all.template get<ffi::AnyBuffer>(i);
  if (!got.has_value()) return InvalidArgument(op, "buffer ", i, ": ", got.error().message());
  *out = std::move(*got);
  return ffi::Error::Success();
}

// The n tables of a call whose `leading` operands come first, then the
// tables and, unless `per_table` is empty, a `per_table` operand each, for n
// outputs: decode(t, x, second (null without per_table), out) checks table t
// and fills in gs[t].
template <typename DecodeTable>
ffi::Error DecodeTables(std::string_view op, std::string_view leading, size_t leading_count,
                        std::string_view per_table, const ffi::RemainingArgs& args,
                        const ffi::RemainingRets& rets, const DecodeTable& decode, size_t* n) {
  const size_t per = per_table.empty() ? 1 : 2;
  *n = rets.size();
  if (*n < 1 || *n > kMaxGatherTables || args.size() != per * *n) {
    return InvalidArgument(op, "takes ", leading, ", n tables",
                           per_table.empty() ? "" : " and n ", per_table,
                           " for n outputs (1 <= n <= ", kMaxGatherTables, "); got ",
                           args.size() + leading_count, " operands and ", rets.size(),
                           " outputs");
  }
  for (size_t t = 0; t < *n; ++t) {
    std::optional<ffi::AnyBuffer> x, second;
    std::optional<ffi::Result<ffi::AnyBuffer>> out;
    ffi::Error e = Get(op, args, t, &x);
    if (e.success() && per == 2) e = Get(op, args, *n + t, &second);
    if (e.success()) e = Get(op, rets, t, &out);
    if (e.success()) e = decode(t, *x, second ? &*second : nullptr, *out);
    if (e.failure()) return ForTable(std::move(e), op, t, *n);
  }
  return ffi::Error::Success();
}

}  // namespace gather_detail

// Re-validates a call of "jax_tma_gather" (indices, n tables -> n outputs,
// n fills) into the geometry of each table, gs[0..*n).
inline ffi::Error DecodeGatherCall(const ffi::AnyBuffer& indices, const ffi::RemainingArgs& args,
                                   const ffi::RemainingRets& rets, int64_t axis, int64_t batch,
                                   ffi::Span<const int64_t> fill, std::string_view method,
                                   GatherGeometry* gs, size_t* n) {
  return gather_detail::DecodeTables(
      kGatherOp, "indices", 1, "", args, rets,
      [&](size_t t, const ffi::AnyBuffer& x, const ffi::AnyBuffer*,
          ffi::Result<ffi::AnyBuffer>& out) {
        return DecodeGather(x, indices, out, axis, batch, fill, t, rets.size(), method, &gs[t]);
      },
      n);
}

// Re-validates a call of "jax_tma_scatter" (indices, order, n tables, n
// updates -> n outputs) into the geometry of each table, gs[0..*n).
inline ffi::Error DecodeScatterCall(const ffi::AnyBuffer& indices, const ffi::AnyBuffer& order,
                                    const ffi::RemainingArgs& args,
                                    const ffi::RemainingRets& rets, int64_t axis, int64_t batch,
                                    std::string_view mode, bool deterministic,
                                    std::string_view method, GatherGeometry* gs, size_t* n) {
  return gather_detail::DecodeTables(
      kScatterOp, "indices, order", 2, "updates", args, rets,
      [&](size_t t, const ffi::AnyBuffer& x, const ffi::AnyBuffer* updates,
          ffi::Result<ffi::AnyBuffer>& out) {
        return DecodeScatter(x, indices, *updates, order, out, axis, batch, mode, deterministic,
                             method, &gs[t]);
      },
      n);
}

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_GATHER_GATHER_COMMON_H_
