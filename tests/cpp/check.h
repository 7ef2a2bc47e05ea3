// The C++ unit tests' one check macro: CHECK(cond) and CHECK_EQ(a, b) report
// a failure with its line and values and keep going; main returns
// Failures() so ctest sees any. No test framework to install.
#ifndef JAX_TMA_TESTS_CPP_CHECK_H_
#define JAX_TMA_TESTS_CPP_CHECK_H_

#include <cstdio>
#include <string>

#include "message.h"

namespace jax_tma::testing {

inline int& FailureCount() {
  static int count = 0;
  return count;
}

inline void Fail(const char* file, int line, const std::string& what) {
  ++FailureCount();
  std::fprintf(stderr, "%s:%d: FAILED %s\n", file, line, what.c_str());
}

// The exit status of a test program, after a summary line.
inline int Failures(const char* name) {
  std::printf("%s: %d failure(s)\n", name, FailureCount());
  return FailureCount() == 0 ? 0 : 1;
}

}  // namespace jax_tma::testing

#define CHECK(cond)                                                                   \
  do {                                                                                \
    if (!(cond)) ::jax_tma::testing::Fail(__FILE__, __LINE__, #cond);                 \
  } while (0)

#define CHECK_EQ(a, b)                                                                \
  do {                                                                                \
    const auto& jax_tma_a_ = (a);                                                     \
    const auto& jax_tma_b_ = (b);                                                     \
    if (!(jax_tma_a_ == jax_tma_b_)) {                                                \
      ::jax_tma::Message jax_tma_m_;                                                  \
      jax_tma_m_ << #a " == " #b " (" << jax_tma_a_ << " vs " << jax_tma_b_ << ")";   \
      ::jax_tma::testing::Fail(__FILE__, __LINE__, jax_tma_m_.str());                 \
    }                                                                                 \
  } while (0)

#endif  // JAX_TMA_TESTS_CPP_CHECK_H_
