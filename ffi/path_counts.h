// How many calls each op's handlers sent down each path (the CPU handler, or
// a CUDA kernel family), so that tests can check which kernel a method
// reached: jax_tma._ffi.path_counts() reads them.
#ifndef JAX_TMA_FFI_PATH_COUNTS_H_
#define JAX_TMA_FFI_PATH_COUNTS_H_

#include <atomic>
#include <cstdint>

namespace jax_tma {

enum class Path : int {
  kCopyCpu, kCopyBulk, kCopySimt,
  kWindowCpu, kWindowTiled, kWindowSimt,
  kIm2colCpu, kIm2colTma, kIm2colSimt,
  kBroadcastCpu, kBroadcastStore, kBroadcastMulticast, kBroadcastDsmem, kBroadcastSimt,
  kPpermuteCpu, kPpermuteBulk, kPpermuteSimt,
  kGatherCpu, kGatherBulk, kGatherSimt,
  kScatterCpu, kScatterBulk, kScatterSimt, kScatterOrdered,
  kCount
};

// "op.path", in the order of Path.
inline constexpr const char* kPathNames[] = {
    "copy.cpu", "copy.bulk", "copy.simt",
    "window.cpu", "window.tiled", "window.simt",
    "im2col.cpu", "im2col.tma", "im2col.simt",
    "broadcast.cpu", "broadcast.store", "broadcast.multicast", "broadcast.dsmem",
    "broadcast.simt",
    "ppermute.cpu", "ppermute.bulk", "ppermute.simt",
    "gather.cpu", "gather.bulk", "gather.simt",
    "scatter.cpu", "scatter.bulk", "scatter.simt", "scatter.ordered"};
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
