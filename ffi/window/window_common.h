// The geometry of jax_tma.window and its transpose, decoded and re-validated
// from the FFI buffers and attributes once, then shared by the CPU handler,
// the SIMT kernel and the TMA tiled kernel.
//
// Forward (transpose=false):  dst[b, i] = src[bs, start[bt] + i * strides]
//                              when every coordinate is inside src, else fill.
// Transpose (transpose=true): dst[b, j] = src[bs, (j - start[bt]) / strides]
//                              when every j - start[bt] is a non-negative
//                              multiple of strides below strides * src_dims,
//                              else 0 (the cotangent of a window: a scatter
//                              written as a gather, so every element is
//                              written exactly once).
// b runs over the batch (the leading dims of dst); bs = b if src is batched
// else 0; bt = b if start is batched else 0.
#ifndef JAX_TMA_FFI_WINDOW_WINDOW_COMMON_H_
#define JAX_TMA_FFI_WINDOW_WINDOW_COMMON_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string_view>

#include "common.h"
#include "fill.h"
#include "shape_checks.h"

namespace jax_tma {

inline constexpr int kMaxWindowRank = 16;
inline constexpr std::string_view kWindowOp = "jax_tma.window";

// An entry of the "static_start" attribute (one per dim: the start the caller
// knew when it built the call, in src elements) for a start known only on
// the device (traced).
inline constexpr int64_t kUnknownStart = std::numeric_limits<int64_t>::min();

// Where the start indices are (device memory on the GPU). `split`: ptr[d]
// holds start d alone, so that XLA passes traced starts to the call as the
// scalars they are, without a kernel that stacks them first. Otherwise ptr[0]
// holds them all, (r,) or, when `batched`, (batch, r). `all_known`: the
// call's "static_start" gives every start, and the starts are known[] (in
// place of ptr[]), read in place of the operands, so that a kernel loads none
// (kernel parameters). Where any is traced, all are the operands' (which hold
// the static ones too: the call is built with them): one load is needed then
// anyway, and a test of which start is known, on the kernel's first dependent
// chain, made a tiny traced window slower (benchmarks/TUNING.md).
struct WindowStarts {
  bool split = false;
  bool batched = false;
  bool is64 = false;            // int64 (else int32)
  bool all_known = false;
  union {  // one of the two, as all_known says: the kernel's parameters stay as small
    const void* ptr[kMaxWindowRank] = {};
    int64_t known[kMaxWindowRank];
  };
};

struct WindowGeometry {
  int rank = 0;                 // spatial rank r
  int64_t batch = 1;            // product of dst's leading (batch) dims
  bool src_batched = false;     // src carries the batch dims too
  bool transpose = false;
  WindowStarts starts;
  int64_t elem_bytes = 0;       // 1, 2, 4, 8 or 16
  FillPattern fill;             // of out-of-bounds elements
  int64_t src_dims[kMaxWindowRank] = {};
  int64_t dst_dims[kMaxWindowRank] = {};
  int64_t strides[kMaxWindowRank] = {};
  int64_t src_pitch[kMaxWindowRank] = {};  // elements between src neighbours along d
  int64_t src_spatial = 1;                  // elements of one src batch entry
  int64_t dst_spatial = 1;                  // elements of one dst batch entry
};

// Starts beyond +-2^62 lie outside every array; clamping them there keeps
// start + i * stride (stride < 2^31, i < 2^31) inside int64.
inline constexpr int64_t kStartClamp = int64_t{1} << 62;
inline constexpr int64_t kMaxWindowStride = (int64_t{1} << 31) - 1;

// A start clamped to +-kStartClamp.
JAX_TMA_HOST_DEVICE inline int64_t ClampStart(int64_t v) {
  return v < -kStartClamp ? -kStartClamp : (v > kStartClamp ? kStartClamp : v);
}

// Start d of batch entry b of a window of rank `rank` as the operands hold
// it (unclamped; not where all_known).
JAX_TMA_HOST_DEVICE inline int64_t LoadStart(const WindowStarts& s, int rank, int64_t b, int d) {
  const void* p = s.split ? s.ptr[d] : s.ptr[0];
  const int64_t k = s.split ? 0 : (s.batched ? b : 0) * rank + d;
  return s.is64 ? static_cast<const int64_t*>(p)[k] : static_cast<const int32_t*>(p)[k];
}

// Start d of batch entry b, clamped: the known one where all are, else the
// operand's.
JAX_TMA_HOST_DEVICE inline int64_t ReadStart(const WindowStarts& s, int rank, int64_t b, int d) {
  return ClampStart(s.all_known ? s.known[d] : LoadStart(s, rank, b, d));
}

// The operands and attributes of "jax_tma_window", appended to a binding
// that starts with the platform's context (none on the CPU).
template <typename Binding>
auto BindWindowCall(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()     // x
      .RemainingArgs()                                         // start(s): WindowStarts
      .template Ret<ffi::AnyBuffer>()                          // y
      .template Attr<ffi::Span<const int64_t>>("strides")      // strides
      .template Attr<ffi::Span<const int64_t>>("fill")         // fill (fill.h)
      .template Attr<bool>("transpose")                        // transpose
      .template Attr<std::string_view>("method")               // method
      .template Attr<ffi::Span<const int64_t>>("static_start"); // static_start
}

// Re-validates a call of "jax_tma_window" and fills in its geometry and
// method.
inline ffi::Error DecodeWindow(const ffi::AnyBuffer& src,
                               const ffi::RemainingArgs& starts,
                               ffi::Result<ffi::AnyBuffer>& dst,
                               ffi::Span<const int64_t> strides,
                               ffi::Span<const int64_t> fill, bool transpose,
                               std::string_view method, ffi::Span<const int64_t> static_start,
                               WindowGeometry* g, Method* parsed) {
  const auto op = kWindowOp;
  JAX_TMA_RETURN_IF_FAILED(ParseMethod(op, method, parsed));
  const int64_t r = static_cast<int64_t>(strides.size());
  const auto sd = src.dimensions();
  const auto dd = dst->dimensions();
  if (r < 1 || r > kMaxWindowRank) {
    return InvalidArgument(op, "spatial rank ", r, " is outside [1, ", kMaxWindowRank, "]");
  }
  if (static_cast<int64_t>(dd.size()) < r) {
    return InvalidArgument(op, "output rank ", dd.size(), " is below the window rank ", r);
  }
  const int64_t nb = static_cast<int64_t>(dd.size()) - r;
  if (static_cast<int64_t>(sd.size()) != r && static_cast<int64_t>(sd.size()) != nb + r) {
    return InvalidArgument(op, "input rank ", sd.size(), " is neither ", r, " nor ", nb + r);
  }
  JAX_TMA_RETURN_IF_FAILED(CheckElementTypes(op, src.element_type(), dst->element_type()));
  g->rank = static_cast<int>(r);
  g->transpose = transpose;
  g->elem_bytes = static_cast<int64_t>(ffi::ByteWidth(src.element_type()));
  JAX_TMA_RETURN_IF_FAILED(ParseFill(op, fill, 0, 1, g->elem_bytes, &g->fill));
  g->src_batched = static_cast<int64_t>(sd.size()) == nb + r && nb > 0;
  g->batch = 1;
  for (int64_t i = 0; i < nb; ++i) {
    if (g->src_batched) {
      JAX_TMA_RETURN_IF_FAILED(
          CheckSameDim(op, "input", i, sd[i], "output", i, dd[i], "batch dims"));
    }
    g->batch *= dd[i];
  }
  const int64_t soff = static_cast<int64_t>(sd.size()) - r;
  for (int64_t i = 0; i < r; ++i) {
    g->src_dims[i] = sd[soff + i];
    g->dst_dims[i] = dd[nb + i];
    g->strides[i] = strides[i];
    if (strides[i] < 1 || strides[i] > kMaxWindowStride) {
      return InvalidArgument(op, "strides[", i, "] = ", strides[i], " is outside [1, ",
                             kMaxWindowStride, "]");
    }
    if (g->dst_dims[i] > kMaxWindowStride && !transpose) {
      return InvalidArgument(op, "window dim ", i, " = ", g->dst_dims[i], " is over 2^31 - 1");
    }
  }
  if (transpose && !g->fill.zero()) {
    return InvalidArgument(op, "the transpose fills with zeros only");
  }
  if (transpose && !g->src_batched && nb > 0) {
    return InvalidArgument(op, "the transpose needs a batched cotangent");
  }
  g->src_spatial = 1;
  g->dst_spatial = 1;
  for (int64_t i = r - 1; i >= 0; --i) {
    g->src_pitch[i] = g->src_spatial;
    g->src_spatial *= g->src_dims[i];
    g->dst_spatial *= g->dst_dims[i];
  }
  // One array of every start, or one one-element buffer per dim.
  const int64_t n_ops = static_cast<int64_t>(starts.size());
  if (n_ops != 1 && n_ops != r) {
    return InvalidArgument(op, "got ", n_ops, " start operands; expected 1 (an array) or ", r,
                           " (one scalar per dim)");
  }
  WindowStarts& ws = g->starts;
  ws = WindowStarts{};
  ws.split = n_ops > 1;
  int64_t count = 0;
  for (int64_t i = 0; i < n_ops; ++i) {
    ffi::ErrorOr<ffi::AnyBuffer> buf = starts.get<ffi::AnyBuffer>(static_cast<size_t>(i));
    if (!buf.has_value()) return buf.error();
    const ffi::DataType type = buf->element_type();
    if (type != ffi::DataType::S32 && type != ffi::DataType::S64) {
      return InvalidArgument(op, "start must be s32 or s64, got ", DataTypeName(type));
    }
    if (i == 0) ws.is64 = type == ffi::DataType::S64;
    if ((type == ffi::DataType::S64) != ws.is64) {
      return InvalidArgument(op, "start operands mix s32 and s64");
    }
    if (ws.split && buf->element_count() != 1) {
      return InvalidArgument(op, "start operand ", i, " has ", buf->element_count(),
                             " elements; one per dim expected");
    }
    if (buf->element_count() != 0 && buf->untyped_data() == nullptr) {
      return InvalidArgument(op, "null start buffer");
    }
    ws.ptr[i] = buf->untyped_data();
    count += static_cast<int64_t>(buf->element_count());
  }
  if (count != r && count != g->batch * r) {
    return InvalidArgument(op, "start has ", count, " entries; expected ", r, " or ",
                           g->batch * r, " (batch x rank)");
  }
  ws.batched = count != r;
  if (static_cast<int64_t>(static_start.size()) != r) {
    return InvalidArgument(op, "static_start has ", static_start.size(), " entries; expected ",
                           r, " (one per dim, ", kUnknownStart, " where traced)");
  }
  bool all_known = true;
  for (int64_t i = 0; i < r; ++i) {
    if (static_start[i] == kUnknownStart) {
      all_known = false;
    } else if (ws.batched) {
      return InvalidArgument(op, "static_start[", i, "] = ", static_start[i],
                             " is known, but the starts are batched (one set per batch entry)");
    }
  }
  if (all_known) {
    ws.all_known = true;
    std::copy(static_start.begin(), static_start.end(), ws.known);
  }
  if (src.element_count() != 0 && src.untyped_data() == nullptr) {
    return InvalidArgument(op, "null input buffer");
  }
  if (dst->element_count() != 0 && dst->untyped_data() == nullptr) {
    return InvalidArgument(op, "null output buffer");
  }
  return ffi::Error::Success();
}

// The src coordinate that window coordinate `i` along dim `d` reads, for
// the (clamped) start `s` of that dim, or -1 when there is none: outside src
// (forward), or between strided elements (transpose).
JAX_TMA_HOST_DEVICE inline int64_t MapCoord(const WindowGeometry& g, int d, int64_t i,
                                            int64_t s) {
  int64_t c;
  if (!g.transpose) {
    c = s + i * g.strides[d];
  } else {
    const int64_t rel = i - s;
    if (rel < 0) return -1;
    if (g.strides[d] != 1) {
      if (rel % g.strides[d] != 0) return -1;
      c = rel / g.strides[d];
    } else {
      c = rel;
    }
  }
  return c >= 0 && c < g.src_dims[d] ? c : -1;
}

// n / d rounded up, for d > 0 and any sign of n.
JAX_TMA_HOST_DEVICE inline int64_t CeilDiv(int64_t n, int64_t d) {
  return n / d + (n % d > 0 ? 1 : 0);
}

// The part of the innermost-dim run [first, first + len) that reads src, when
// it is one arithmetic progression: coordinates i in [*lo, *hi) read src at
// *c_lo + (i - *lo) * *step and the rest of the run is fill (*lo == *hi when
// none reads src). False for a strided transpose, whose src elements
// interleave with zeros: map each element (MapCoord) then. `s` is the
// innermost start; the row itself must read src (WindowRowSource >= 0).
JAX_TMA_HOST_DEVICE inline bool InnerSpan(const WindowGeometry& g, int64_t s, int64_t first,
                                          int64_t len, int64_t* lo, int64_t* hi,
                                          int64_t* c_lo, int64_t* step) {
  const int d = g.rank - 1;
  const int64_t end = first + len;
  int64_t a;  // [a, b): the coordinates that read src, before clipping to the run
  int64_t b;
  if (g.transpose) {
    if (g.strides[d] != 1) return false;
    a = s;  // c = i - s in [0, dim)
    b = s + g.src_dims[d];
    *step = 1;
  } else {
    *step = g.strides[d];  // c = s + i * stride in [0, dim)
    a = CeilDiv(-s, *step);
    b = CeilDiv(g.src_dims[d] - s, *step);
  }
  *lo = a < first ? first : (a > end ? end : a);
  *hi = b > end ? end : (b < *lo ? *lo : b);
  // |s| <= 2^62 and lo * stride < 2^62 (forward lo < 2^31): no overflow.
  *c_lo = g.transpose ? *lo - s : s + *lo * *step;
  return true;
}

// Offset into one src batch entry of the first element of window row `row`
// (row-major over all dims but the innermost), or -1 when that row reads
// no src element. The innermost dim then adds MapCoord(g, rank-1, ...).
// Shared by the CPU handler and the SIMT kernel.
JAX_TMA_HOST_DEVICE inline int64_t WindowRowSource(const WindowGeometry& g, const int64_t* s,
                                                   int64_t row) {
  int64_t off = 0;
  for (int d = g.rank - 2; d >= 0; --d) {
    const int64_t i = row % g.dst_dims[d];
    row /= g.dst_dims[d];
    const int64_t c = MapCoord(g, d, i, s[d]);
    if (c < 0) return -1;
    off += c * g.src_pitch[d];
  }
  return off;
}

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_WINDOW_WINDOW_COMMON_H_
