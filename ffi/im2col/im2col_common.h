// The geometry of jax_tma.im2col and its transpose col2im, decoded and
// re-validated from the FFI buffers and attributes once, then shared by the
// CPU handler, the SIMT kernels and the TMA im2col kernel.
//
// x is (N, *S, C) channels-last with r = 1..3 spatial dims; the patch matrix
// is (N, *O, K * C) with K = prod(kernel) taps and
//   O[d] = (S[d] + pad_lo[d] + pad_hi[d] - dilation[d] * (kernel[d] - 1) - 1)
//          / strides[d] + 1,
// or 0 where the dilated kernel is larger than the padded input (as in
// lax.conv_general_dilated_patches): the patch matrix is then empty and
// col2im writes zeros.
// Tap t (row-major over the kernel dims, index k[d] per dim) of output pixel
// o reads input pixel i[d] = o[d] * strides[d] - pad_lo[d] + k[d] * dilation[d],
// zero where that lies outside x. Patch column: t * C + c (tap-major) or
// c * K + t (channel-major, lax.conv_general_dilated_patches).
// col2im (transpose=true) writes x-shaped sums: each input element adds its
// patch entries in increasing t (see ElementSum).
#ifndef JAX_TMA_FFI_IM2COL_IM2COL_COMMON_H_
#define JAX_TMA_FFI_IM2COL_IM2COL_COMMON_H_

#include <cstdint>
#include <cstring>
#include <string_view>

#include "common.h"
#include "element_sum.h"

namespace jax_tma {

inline constexpr int kMaxIm2colRank = 3;  // spatial dims: NWC, NHWC, NDHWC
inline constexpr std::string_view kIm2colOp = "jax_tma.im2col";
inline constexpr std::string_view kCol2imOp = "jax_tma.col2im";
inline constexpr int64_t kMaxIm2colValue = (int64_t{1} << 31) - 1;
inline constexpr int64_t kMaxIm2colTaps = INT64_MAX;  // taps and patch columns fit int64
// The TMA im2col load moves a pixel's channels as one run per tap, which
// channel-major patch columns (c * K + t) interleave. A rule of the op, not
// of a device: every platform's handler refuses method='tma' with it, and
// Python at trace time with the same words (rules(): "im2col.tma_channel_major").
inline constexpr std::string_view kIm2colTmaChannelMajor =
    "order='channel_major' has no TMA path (the hardware moves whole channel runs; use "
    "order='tap_major')";

struct Im2colGeometry {
  int rank = 0;                        // spatial dims r
  bool transpose = false;              // col2im
  bool channel_major = false;
  int64_t batch = 0;                   // N
  int64_t channels = 0;                // C
  int64_t taps = 1;                    // K
  int64_t elem_bytes = 0;
  int64_t in_dims[kMaxIm2colRank] = {};
  int64_t out_dims[kMaxIm2colRank] = {};
  int64_t kernel[kMaxIm2colRank] = {};
  int64_t strides[kMaxIm2colRank] = {};
  int64_t dilation[kMaxIm2colRank] = {};
  int64_t pad_lo[kMaxIm2colRank] = {};
  int64_t pad_hi[kMaxIm2colRank] = {};
  int64_t in_pixels = 1;               // prod(S)
  int64_t out_pixels = 1;              // prod(O)
  SumKind sum = SumKind::kU8;          // col2im only
  int components = 1;                  // col2im: 2 for complex
};

// Output pixels along one spatial dim (O[d] above): 0 where the dilated
// kernel does not fit the padded input. The caller has checked kernel,
// stride, dilation in [1, 2^31) and paddings in [0, 2^31), so the span
// (< 2^62) and the padded size (a buffer dim plus < 2^32) do not overflow.
JAX_TMA_HOST_DEVICE inline int64_t Im2colOutDim(int64_t size, int64_t pad_lo, int64_t pad_hi,
                                               int64_t kernel, int64_t stride,
                                               int64_t dilation) {
  const int64_t padded = size + pad_lo + pad_hi;
  const int64_t span = dilation * (kernel - 1) + 1;
  return padded < span ? 0 : (padded - span) / stride + 1;
}

// The operands and attributes of "jax_tma_im2col", appended to a binding
// that starts with the platform's context (none on the CPU).
template <typename Binding>
auto BindIm2colCall(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()     // x (or patches)
      .template Ret<ffi::AnyBuffer>()                          // patches (or x)
      .template Attr<ffi::Span<const int64_t>>("kernel")       // kernel
      .template Attr<ffi::Span<const int64_t>>("strides")      // strides
      .template Attr<ffi::Span<const int64_t>>("dilation")     // dilation
      .template Attr<ffi::Span<const int64_t>>("pad_lo")       // pad_lo
      .template Attr<ffi::Span<const int64_t>>("pad_hi")       // pad_hi
      .template Attr<bool>("channel_major")                    // channel_major
      .template Attr<bool>("transpose")                        // transpose
      .template Attr<std::string_view>("method");              // method
}

// Re-validates a call of "jax_tma_im2col" and fills in its geometry and
// method.
inline ffi::Error DecodeIm2col(const ffi::AnyBuffer& src, ffi::Result<ffi::AnyBuffer>& dst,
                               ffi::Span<const int64_t> kernel,
                               ffi::Span<const int64_t> strides,
                               ffi::Span<const int64_t> dilation,
                               ffi::Span<const int64_t> pad_lo,
                               ffi::Span<const int64_t> pad_hi, bool channel_major,
                               bool transpose, std::string_view method,
                               Im2colGeometry* g, Method* parsed) {
  const auto op = transpose ? kCol2imOp : kIm2colOp;
  JAX_TMA_RETURN_IF_FAILED(ParseMethod(op, method, parsed));
  const auto sd = src.dimensions();
  const auto dd = dst->dimensions();
  // x is the input of im2col: src forward, dst for the transpose.
  const auto xd = transpose ? dd : sd;
  const auto pd = transpose ? sd : dd;
  const int64_t rank = static_cast<int64_t>(xd.size());
  if (rank < 3 || rank > 5) {
    return InvalidArgument(op, "x has rank ", rank, "; expected 3, 4 or 5 (NWC, NHWC, NDHWC)");
  }
  const int64_t r = rank - 2;
  if (static_cast<int64_t>(pd.size()) != rank) {
    return InvalidArgument(op, "patches have rank ", pd.size(), " but x has rank ", rank);
  }
  for (const auto& [name, span] : {std::pair{"kernel", kernel}, std::pair{"strides", strides},
                                   std::pair{"dilation", dilation}, std::pair{"pad_lo", pad_lo},
                                   std::pair{"pad_hi", pad_hi}}) {
    if (static_cast<int64_t>(span.size()) != r) {
      return InvalidArgument(op, name, " has ", span.size(), " entries but x has ", r,
                             " spatial dims");
    }
  }
  JAX_TMA_RETURN_IF_FAILED(CheckElementTypes(op, src.element_type(), dst->element_type()));
  if (transpose && !SumKindOf(src.element_type(), &g->sum, &g->components)) {
    return InvalidArgument(op, "element type ", DataTypeName(src.element_type()),
                           " cannot be summed (integer, f16, bf16, f32, f64, c64 or c128)");
  }
  g->rank = static_cast<int>(r);
  g->transpose = transpose;
  g->channel_major = channel_major;
  g->elem_bytes = static_cast<int64_t>(ffi::ByteWidth(src.element_type()));
  g->batch = xd[0];
  g->channels = xd[rank - 1];
  g->taps = 1;
  g->in_pixels = 1;
  g->out_pixels = 1;
  for (int64_t d = 0; d < r; ++d) {
    const int64_t k = kernel[d], s = strides[d], dl = dilation[d];
    if (k < 1 || k > kMaxIm2colValue || s < 1 || s > kMaxIm2colValue || dl < 1 ||
        dl > kMaxIm2colValue) {
      return InvalidArgument(op, "kernel, strides and dilation must lie in [1, 2^31 - 1]; dim ",
                             d, " has kernel ", k, ", strides ", s, ", dilation ", dl);
    }
    if (pad_lo[d] < 0 || pad_hi[d] < 0 || pad_lo[d] > kMaxIm2colValue ||
        pad_hi[d] > kMaxIm2colValue) {
      return InvalidArgument(op, "padding (", pad_lo[d], ", ", pad_hi[d], ") of dim ", d,
                             " is outside [0, 2^31 - 1]");
    }
    const int64_t size = xd[d + 1];
    const int64_t o = Im2colOutDim(size, pad_lo[d], pad_hi[d], k, s, dl);
    if (pd[d + 1] != o) {
      return InvalidArgument(op, "patches dim ", d + 1, " is ", pd[d + 1], " but spatial dim ", d,
                             " gives ", o, " output pixels (input ", size, " + padding (",
                             pad_lo[d], ", ", pad_hi[d], "), dilated kernel ",
                             dl * (k - 1) + 1, ", stride ", s, ")");
    }
    if (k > kMaxIm2colTaps / g->taps) {
      return InvalidArgument(op, "the kernel has over 2^63 - 1 taps (kernel[", d, "] = ", k,
                             " after ", g->taps, " taps of the dims before it)");
    }
    g->in_dims[d] = size;
    g->out_dims[d] = o;
    g->kernel[d] = k;
    g->strides[d] = s;
    g->dilation[d] = dl;
    g->pad_lo[d] = pad_lo[d];
    g->pad_hi[d] = pad_hi[d];
    g->taps *= k;
    g->in_pixels *= size;
    g->out_pixels *= o;
  }
  if (g->channels != 0 && g->taps > kMaxIm2colTaps / g->channels) {
    return InvalidArgument(op, "a patch row has over 2^63 - 1 columns (", g->taps, " taps x ",
                           g->channels, " channels)");
  }
  if (pd[0] != g->batch || pd[rank - 1] != g->taps * g->channels) {
    return InvalidArgument(op, "patches have batch ", pd[0], " and ", pd[rank - 1],
                           " columns; expected ", g->batch, " and ", g->taps, " x ",
                           g->channels);
  }
  if (src.element_count() != 0 && src.untyped_data() == nullptr) {
    return InvalidArgument(op, "null input buffer");
  }
  if (dst->element_count() != 0 && dst->untyped_data() == nullptr) {
    return InvalidArgument(op, "null output buffer");
  }
  if (!transpose && channel_major && *parsed == Method::kTma) {
    return InvalidArgument(op, "method='tma' cannot run this im2col: ", kIm2colTmaChannelMajor);
  }
  return ffi::Error::Success();
}

// The input pixel (flat within one image) that tap `t` of output pixel `m`
// (flat within one image) reads, or -1 when it lies in the padding.
JAX_TMA_HOST_DEVICE inline int64_t TapSource(const Im2colGeometry& g, int64_t m, int64_t t) {
  int64_t off = 0;
  int64_t pitch = 1;
  for (int d = g.rank - 1; d >= 0; --d) {
    const int64_t o = m % g.out_dims[d];
    m /= g.out_dims[d];
    const int64_t k = t % g.kernel[d];
    t /= g.kernel[d];
    const int64_t i = o * g.strides[d] - g.pad_lo[d] + k * g.dilation[d];
    if (i < 0 || i >= g.in_dims[d]) return -1;
    off += i * pitch;
    pitch *= g.in_dims[d];
  }
  return off;
}

// The output pixel whose tap `t` reads input pixel `p` (both flat within one
// image), or -1 when no output pixel does.
JAX_TMA_HOST_DEVICE inline int64_t TapTarget(const Im2colGeometry& g, int64_t p, int64_t t) {
  int64_t off = 0;
  int64_t pitch = 1;
  for (int d = g.rank - 1; d >= 0; --d) {
    const int64_t i = p % g.in_dims[d];
    p /= g.in_dims[d];
    const int64_t k = t % g.kernel[d];
    t /= g.kernel[d];
    const int64_t q = i + g.pad_lo[d] - k * g.dilation[d];
    if (q < 0 || q % g.strides[d] != 0) return -1;
    const int64_t o = q / g.strides[d];
    if (o >= g.out_dims[d]) return -1;
    off += o * pitch;
    pitch *= g.out_dims[d];
  }
  return off;
}

// Column of (tap t, channel c) in a patch row.
JAX_TMA_HOST_DEVICE inline int64_t PatchColumn(const Im2colGeometry& g, int64_t t, int64_t c) {
  return g.channel_major ? c * g.taps + t : t * g.channels + c;
}

// Component `j` of channel `c` of input pixel `p` of image `n`: the sum of
// its patch entries in increasing tap order (the exact order every path uses).
template <SumKind K>
JAX_TMA_HOST_DEVICE inline typename ElementSum<K>::T Col2imElement(
    const Im2colGeometry& g, const typename ElementSum<K>::T* patches, int64_t n, int64_t p,
    int64_t c, int j) {
  using S = ElementSum<K>;
  typename S::Acc acc = SumStart<K>();
  bool any = false;
  const int64_t row = g.taps * g.channels;
  for (int64_t t = 0; t < g.taps; ++t) {
    const int64_t m = TapTarget(g, p, t);
    if (m < 0) continue;
    const int64_t e = (n * g.out_pixels + m) * row + PatchColumn(g, t, c);
    acc = static_cast<typename S::Acc>(acc + S::Load(patches[e * g.components + j]));
    any = true;
  }
  return S::Store(any ? acc : EmptySum<K>());
}

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_IM2COL_IM2COL_COMMON_H_
