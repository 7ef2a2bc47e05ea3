// The value of elements an op writes where its input has none (out of
// bounds, out of range), one encoding for every op: the attribute "fill"
// holds, for each output, its fill element repeated to 16 bytes (element
// sizes 1, 2, 4, 8 and 16 divide 16) as two little-endian int64 words. The
// pattern reaches the kernels by value, as a kernel parameter: no fill read
// from device memory, and the host planner sees it (a zero fill is the
// hardware's own out-of-bounds fill).
#ifndef JAX_TMA_FFI_FILL_H_
#define JAX_TMA_FFI_FILL_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common.h"

namespace jax_tma {

struct FillPattern {
  uint64_t lo = 0;  // bytes 0..7
  uint64_t hi = 0;  // bytes 8..15

  JAX_TMA_HOST_DEVICE bool zero() const { return (lo | hi) == 0; }

  // The V (1, 2, 4, 8 or 16 bytes) at byte offset `o` of a run of fill
  // elements that starts 16-byte aligned; `o` is a multiple of sizeof(V).
  template <typename V>
  JAX_TMA_HOST_DEVICE V At(int64_t o) const {
    static_assert(sizeof(V) == 1 || sizeof(V) == 2 || sizeof(V) == 4 || sizeof(V) == 8 ||
                      sizeof(V) == 16,
                  "a fill is read in 1, 2, 4, 8 or 16 bytes");
    union {
      V v;
      uint64_t w[sizeof(V) < 8 ? 1 : sizeof(V) / 8];
    } u;
    if constexpr (sizeof(V) == 16) {
      u.w[0] = lo;
      u.w[1] = hi;
    } else {
      u.w[0] = ((o & 8) != 0 ? hi : lo) >> ((o & 7) * 8);
    }
    return u.v;
  }
};

// The pattern of output `i` of `n` from the "fill" attribute, checked to be
// one element of `elem_bytes` repeated (the caller of an n-table op names
// the table in the error). Parse*, as ParseMethod: Decode<Op> is each
// family's own name (an op called fill has DecodeFill).
inline ffi::Error ParseFill(std::string_view op, ffi::Span<const int64_t> fill, size_t i,
                             size_t n, int64_t elem_bytes, FillPattern* out) {
  if (fill.size() != 2 * n) {
    return InvalidArgument(op, "fill holds ", fill.size(), " int64 words; expected 2 per output, ",
                           2 * n, " in all");
  }
  out->lo = static_cast<uint64_t>(fill[2 * i]);
  out->hi = static_cast<uint64_t>(fill[2 * i + 1]);
  uint8_t b[16];
  for (int k = 0; k < 8; ++k) {
    b[k] = static_cast<uint8_t>(out->lo >> (8 * k));
    b[8 + k] = static_cast<uint8_t>(out->hi >> (8 * k));
  }
  for (int64_t k = elem_bytes; k < 16; ++k) {
    if (elem_bytes < 1 || b[k] != b[k - elem_bytes]) {
      return InvalidArgument(op, "fill is not one ", elem_bytes,
                             "-byte element repeated to 16 bytes (words ", fill[2 * i], ", ",
                             fill[2 * i + 1], ")");
    }
  }
  return ffi::Error::Success();
}

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_FILL_H_
