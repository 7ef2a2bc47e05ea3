// CPU handler of "jax_tma_im2col" (and its transpose, col2im): the reference
// semantics of im2col_common.h on the host. im2col copies one channel run per
// (pixel, tap) (tap-major) or one element at a time (channel-major); col2im
// sums each input element's patch entries in the shared tap order.
#include <cstring>
#include <string_view>

#include "handlers.h"
#include "im2col/im2col_common.h"
#include "keep_subnormals.h"
#include "path_counts.h"
#include "rules.h"

namespace jax_tma {
namespace {

void Im2colHost(const Im2colGeometry& g, const uint8_t* x, uint8_t* out) {
  const int64_t eb = g.elem_bytes;
  const int64_t run = g.channels * eb;  // one pixel's channels
  const int64_t row = g.taps * run;     // one patch row
  for (int64_t n = 0; n < g.batch; ++n) {
    const uint8_t* xn = x + n * g.in_pixels * run;
    for (int64_t m = 0; m < g.out_pixels; ++m) {
      uint8_t* dst = out + (n * g.out_pixels + m) * row;
      for (int64_t t = 0; t < g.taps; ++t) {
        const int64_t p = TapSource(g, m, t);
        if (!g.channel_major) {
          if (p < 0) {
            std::memset(dst + t * run, 0, static_cast<size_t>(run));
          } else {
            std::memcpy(dst + t * run, xn + p * run, static_cast<size_t>(run));
          }
          continue;
        }
        for (int64_t c = 0; c < g.channels; ++c) {
          uint8_t* e = dst + PatchColumn(g, t, c) * eb;
          if (p < 0) {
            std::memset(e, 0, static_cast<size_t>(eb));
          } else {
            std::memcpy(e, xn + (p * g.channels + c) * eb, static_cast<size_t>(eb));
          }
        }
      }
    }
  }
}

struct Col2imHost {
  const Im2colGeometry& g;
  const void* patches;
  void* x;

  template <SumKind K>
  void operator()() const {
    using T = typename ElementSum<K>::T;
    const T* src = static_cast<const T*>(patches);
    T* dst = static_cast<T*>(x);
    const int comps = g.components;
    for (int64_t n = 0; n < g.batch; ++n) {
      for (int64_t p = 0; p < g.in_pixels; ++p) {
        for (int64_t c = 0; c < g.channels; ++c) {
          for (int j = 0; j < comps; ++j) {
            dst[((n * g.in_pixels + p) * g.channels + c) * comps + j] =
                Col2imElement<K>(g, src, n, p, c, j);
          }
        }
      }
    }
  }
};

ffi::Error Im2colCpuImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                         ffi::Span<const int64_t> kernel, ffi::Span<const int64_t> strides,
                         ffi::Span<const int64_t> dilation, ffi::Span<const int64_t> pad_lo,
                         ffi::Span<const int64_t> pad_hi, bool channel_major, bool transpose,
                         std::string_view method) {
  Im2colGeometry g;
  Method parsed;  // every method is the same loop on the host
  JAX_TMA_RETURN_IF_FAILED(DecodeIm2col(x, y, kernel, strides, dilation, pad_lo, pad_hi,
                                        channel_major, transpose, method, &g, &parsed));
  CountPath(Path::kIm2colCpu);
  // Nothing to write (the loops below would still walk every tap: up to 2^63).
  if (y->element_count() == 0) return ffi::Error::Success();
  if (transpose && x.element_count() == 0) {
    // An empty patch matrix (an output dim of 0: the dilated kernel is
    // larger than the padded input) adds nothing: x is zeros. Not the loop
    // below, which would still walk every tap of every input element.
    std::memset(y->untyped_data(), 0, y->size_bytes());
  } else if (transpose) {
    KeepSubnormals keep;
    DispatchSumKind(g.sum, Col2imHost{g, x.untyped_data(), y->untyped_data()});
  } else {
    Im2colHost(g, static_cast<const uint8_t*>(x.untyped_data()),
               static_cast<uint8_t*>(y->untyped_data()));
  }
  return ffi::Error::Success();
}

}  // namespace

void Im2colRules(Rules* rules) {
  rules->Text("im2col.tma_channel_major", kIm2colTmaChannelMajor);
}

}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTmaIm2colCpu, jax_tma::Im2colCpuImpl,
                              jax_tma::BindIm2colCall(xla::ffi::Ffi::Bind()));
