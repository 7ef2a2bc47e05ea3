// The shape rules several decoders share, one function a rule in the manner
// of jaxlib's ffi_helpers.h (CheckNumDimensions, CheckShape): each returns
// success or an InvalidArgument that names the op, the array, the dims and
// their values, with the rule's reason in parentheses where one is given.
#ifndef JAX_TMA_FFI_SHAPE_CHECKS_H_
#define JAX_TMA_FFI_SHAPE_CHECKS_H_

#include <cstdint>
#include <string_view>

#include "common.h"

namespace jax_tma {

// Array `name` has rank `want`: "<op>: output has rank 2; expected 3 (input
// rank 2 + 1)".
template <typename... Why>
ffi::Error CheckRank(std::string_view op, std::string_view name, int64_t rank, int64_t want,
                     const Why&... why) {
  if (rank == want) return ffi::Error::Success();
  if constexpr (sizeof...(why) == 0) {
    return InvalidArgument(op, name, " has rank ", rank, "; expected ", want);
  } else {
    return InvalidArgument(op, name, " has rank ", rank, "; expected ", want, " (", why..., ")");
  }
}

// Dim `ai` of array `a` equals dim `bi` of array `b`: "<op>: output dim 2 =
// 6 differs from input dim 1 = 5".
template <typename... Why>
ffi::Error CheckSameDim(std::string_view op, std::string_view a, int64_t ai, int64_t a_dim,
                        std::string_view b, int64_t bi, int64_t b_dim, const Why&... why) {
  if (a_dim == b_dim) return ffi::Error::Success();
  if constexpr (sizeof...(why) == 0) {
    return InvalidArgument(op, a, " dim ", ai, " = ", a_dim, " differs from ", b, " dim ", bi,
                           " = ", b_dim);
  } else {
    return InvalidArgument(op, a, " dim ", ai, " = ", a_dim, " differs from ", b, " dim ", bi,
                           " = ", b_dim, " (", why..., ")");
  }
}

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_SHAPE_CHECKS_H_
