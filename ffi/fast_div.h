// Division by a divisor fixed before a kernel launches, for kernels that
// split a flat index into coordinates once per thread: one multiply-high, an
// add and a shift in place of an integer division (the round-up method of
// Granlund and Montgomery, "Division by invariant integers using
// multiplication", PLDI 1994). Host and device; tests/cpp checks it against
// `/` at the edges of the range.
#ifndef JAX_TMA_FFI_FAST_DIV_H_
#define JAX_TMA_FFI_FAST_DIV_H_

#include <cstdint>

#include "common.h"

namespace jax_tma {

// Dividends and divisors below this bound: n + mulhi(n, magic) then fits in
// 32 bits.
inline constexpr uint32_t kFastDivLimit = uint32_t{1} << 31;

struct FastDiv {
  uint32_t divisor = 1;
  uint32_t magic = 0;
  uint32_t shift = 0;

  FastDiv() = default;
  // 1 <= d < kFastDivLimit. magic = floor(2^32 (2^shift - d) / d) + 1 with
  // 2^shift the least power of two >= d.
  explicit FastDiv(uint32_t d) : divisor(d) {
    while ((uint64_t{1} << shift) < d) ++shift;
    magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }

  // n / divisor, for n < kFastDivLimit.
  JAX_TMA_HOST_DEVICE uint32_t Div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t t = __umulhi(n, magic);
#else
    const uint32_t t = static_cast<uint32_t>((uint64_t{n} * magic) >> 32);
#endif
    return (t + n) >> shift;
  }
};

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_FAST_DIV_H_
