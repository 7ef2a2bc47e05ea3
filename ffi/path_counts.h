// How many calls each op's handlers sent down each path (the CPU handler, or
// a CUDA kernel family), so that tests can check which kernel a method
// reached: jax_tma._ffi.path_counts() reads them.
#ifndef JAX_TMA_FFI_PATH_COUNTS_H_
#define JAX_TMA_FFI_PATH_COUNTS_H_

#include <atomic>
#include <cstdint>

namespace jax_tma {

// One path per JAX_TMA_PATH line of the family list (families.inc).
enum class Path : int {
#define JAX_TMA_PATH(Name, path) k##Name,
#include "families.inc"
  kCount
};

// "op.path", in the order of Path.
inline constexpr const char* kPathNames[] = {
#define JAX_TMA_PATH(Name, path) path,
#include "families.inc"
};
static_assert(sizeof(kPathNames) / sizeof(kPathNames[0]) == static_cast<int>(Path::kCount));

// One counter per path for the whole module (an inline variable: the CPU
// handlers and the CUDA library share it). Relaxed: a count orders nothing.
inline std::atomic<int64_t> g_path_counts[static_cast<int>(Path::kCount)];

inline void CountPath(Path p) {
  g_path_counts[static_cast<int>(p)].fetch_add(1, std::memory_order_relaxed);
}

inline int64_t PathCount(Path p) {
  return g_path_counts[static_cast<int>(p)].load(std::memory_order_relaxed);
}

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PATH_COUNTS_H_
