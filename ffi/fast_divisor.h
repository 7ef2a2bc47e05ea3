// Division by a divisor fixed before a kernel launches, for kernels that
// split a flat index into coordinates once per thread (gather's flat kernels,
// window's vector form, broadcast's SIMT kernel). Host and device;
// tests/cpp/test_gather_plan.cc checks it against `/`.
#ifndef JAX_TMA_FFI_FAST_DIVISOR_H_
#define JAX_TMA_FFI_FAST_DIVISOR_H_

#include <cstdint>

#include "common.h"

namespace jax_tma {

// Dividends and divisors below this bound.
inline constexpr uint32_t kFastDivisorLimit = uint32_t{1} << 31;

// Division of n < 2^31 by a divisor 1 <= d < 2^31 fixed before the launch,
// as a multiply-high, an add and a shift (Granlund and Montgomery, "Division
// by invariant integers using multiplication", PLDI 1994, theorem 4.2): the
// flat kernels' row of a vector, cheaper there than a division or a
// power-of-two test (benchmarks/TUNING.md, FastDivisor); window's vector
// form's coordinates.
struct FastDivisor {
  uint32_t mul = 1;
  int32_t shift = 0;

  static FastDivisor Of(uint32_t d) {
    FastDivisor f;
    while ((uint64_t{1} << f.shift) < d) ++f.shift;  // ceil(log2 d)
    // floor(2^32 (2^shift - d) / d) + 1 < 2^32, as 2^shift < 2d.
    f.mul = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << f.shift) - d)) / d + 1);
    return f;
  }
  JAX_TMA_HOST_DEVICE uint32_t Divide(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, mul);
#else
    const auto hi = static_cast<uint32_t>((uint64_t{n} * mul) >> 32);
#endif
    return (hi + n) >> shift;  // no overflow: hi <= n < 2^31
  }
};

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_FAST_DIVISOR_H_
