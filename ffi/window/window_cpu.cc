// CPU handler of "jax_tma_window" (and its transpose): the reference
// semantics of window_common.h, element by element, on the host.
#include <cstring>
#include <string_view>

#include "handlers.h"
#include "path_counts.h"
#include "rules.h"
#include "window/window_common.h"

namespace jax_tma {

static ffi::Error WindowCpuImpl(ffi::AnyBuffer x, ffi::RemainingArgs starts,
                                ffi::Result<ffi::AnyBuffer> y,
                                ffi::Span<const int64_t> strides, ffi::Span<const int64_t> fill,
                                bool transpose, std::string_view method,
                                ffi::Span<const int64_t> static_start) {
  WindowGeometry g;
  Method parsed;  // every method is the same loop on the host
  JAX_TMA_RETURN_IF_FAILED(DecodeWindow(x, starts, y, strides, fill, transpose, method,
                                        static_start, &g, &parsed));
  CountPath(Path::kWindowCpu);
  // Nothing to write; a zero-size window dim would also divide by zero below.
  if (g.batch == 0 || g.dst_spatial == 0) return ffi::Error::Success();
  const auto* src = static_cast<const uint8_t*>(x.untyped_data());
  auto* dst = static_cast<uint8_t*>(y->untyped_data());
  const int64_t eb = g.elem_bytes;
  uint8_t fill_element[16];  // its first eb bytes
  std::memcpy(fill_element, &g.fill.lo, 8);
  std::memcpy(fill_element + 8, &g.fill.hi, 8);
  int64_t s[kMaxWindowRank];
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int d = 0; d < g.rank; ++d) s[d] = ReadStart(g.starts, g.rank, b, d);
    const uint8_t* sb = src + (g.src_batched ? b : 0) * g.src_spatial * eb;
    uint8_t* db = dst + b * g.dst_spatial * eb;
    const int64_t inner = g.dst_dims[g.rank - 1];
    for (int64_t row = 0; row < g.dst_spatial / inner; ++row) {
      const int64_t base = WindowRowSource(g, s, row);
      uint8_t* drow = db + row * inner * eb;
      int64_t lo = 0;
      int64_t hi = 0;
      int64_t c_lo = 0;
      int64_t step = 0;
      if (base < 0 || InnerSpan(g, s[g.rank - 1], 0, inner, &lo, &hi, &c_lo, &step)) {
        for (int64_t i = 0; i < inner; ++i) {
          const bool reads = base >= 0 && i >= lo && i < hi;
          std::memcpy(drow + i * eb,
                      reads ? sb + (base + c_lo + (i - lo) * step) * eb : fill_element,
                      static_cast<size_t>(eb));
        }
        continue;
      }
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t c = base < 0 ? -1 : MapCoord(g, g.rank - 1, i, s[g.rank - 1]);
        std::memcpy(drow + i * eb, c >= 0 ? sb + (base + c) * eb : fill_element,
                    static_cast<size_t>(eb));
      }
    }
  }
  return ffi::Error::Success();
}

void WindowRules(Rules* rules) { rules->Int("window.unknown_start", kUnknownStart); }

}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTmaWindowCpu, jax_tma::WindowCpuImpl,
                              jax_tma::BindWindowCall(xla::ffi::Ffi::Bind()));
