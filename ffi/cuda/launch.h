// Host-side helpers that every op's planner and launcher share: the planners'
// rejection message, shared-memory sizing (tile alignment, the static part
// and the driver's per-CTA reservation), cluster launch configurations and
// the dispatch of a TMA-or-SIMT plan.
// No CUDA calls: the planners that use it are host C++, unit-tested without a
// GPU (tests/cpp/).
#ifndef JAX_TMA_FFI_CUDA_LAUNCH_H_
#define JAX_TMA_FFI_CUDA_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "../message.h"
#include "../path_counts.h"
#include "device_info.h"

namespace jax_tma {

// A planner's answer for a broken rule: the rule and its values in *why, which
// may be null where the caller wants the verdict only (the `*Fits` checks:
// `Plan p; return PlanX(..., &p, why);`); always false.
template <typename... Parts>
bool Reject(std::string* why, const Parts&... parts) {
  if (why != nullptr) {
    Message m;
    (m << ... << parts);
    *why = m.str();
  }
  return false;
}

// Tensor copies read and write shared memory at 128-B aligned addresses.
inline constexpr uint32_t kSmemTileAlign = 128;

inline constexpr uint32_t RoundUpToTileAlign(uint32_t bytes) {
  return (bytes + kSmemTileAlign - 1) / kSmemTileAlign * kSmemTileAlign;
}

// The dynamic shared memory to ask for so that `bytes` fit after the kernel
// rounds its base up to kSmemTileAlign (the base itself is only 16-B aligned).
inline constexpr int SmemWithAlignSlack(int64_t bytes) {
  return static_cast<int>(bytes + kSmemTileAlign);
}

// Beside its dynamic shared memory, a CTA of these kernels holds static shared
// memory (mbarriers, fix-up records) within kStaticSmemAllowance, and the
// driver reserves kSmemReservedPerCta for every CTA (sm_80 and later).
inline constexpr int kStaticSmemAllowance = 1024;
inline constexpr int kSmemReservedPerCta = 1024;

// How many CTAs with `dynamic_smem` bytes each fit on the device at once, as
// far as shared memory decides (at least one per SM).
inline int64_t ResidentCtas(const DeviceInfo& info, int dynamic_smem) {
  const int64_t per_cta = int64_t{dynamic_smem} + kStaticSmemAllowance + kSmemReservedPerCta;
  const int64_t per_sm = std::max<int64_t>(1, static_cast<int64_t>(info.smem_per_sm) / per_cta);
  return std::max<int64_t>(1, info.sm_count * per_sm);
}

// `items` work items (tiles, jobs) over `resident` CTA slots (ResidentCtas):
// per CTA as few as keep every slot busy, at most `max_per_cta`, and the grid
// that covers them all. One round of CTAs lets the block scheduler balance.
struct WorkSplit {
  int64_t per_cta;
  int64_t blocks;
};

inline WorkSplit SplitWork(int64_t items, int64_t resident, int64_t max_per_cta) {
  const int64_t per_cta = std::clamp<int64_t>((items + resident - 1) / resident, 1, max_per_cta);
  return {per_cta, (items + per_cta - 1) / per_cta};
}

// `grid` CTAs of `block` threads with `smem` bytes of dynamic shared memory
// each, on `stream`, in clusters of `cluster` consecutive CTAs along x (0:
// no cluster attribute), for cudaLaunchKernelEx and
// cudaOccupancyMaxActiveClusters. `config` points at the attribute held
// here, so the object is neither copied nor moved.
struct ClusterLaunch {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attr = {};

  ClusterLaunch(unsigned grid, unsigned block, std::size_t smem, unsigned cluster,
                cudaStream_t stream = nullptr) {
    config.gridDim = dim3(grid);
    config.blockDim = dim3(block);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = cluster;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    config.attrs = &attr;
    config.numAttrs = cluster > 0 ? 1 : 0;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// Runs a planned call of a family with a TMA kernel and a SIMT one: `tma`
// where the plan took it (nothing to launch where its plan is `empty`), else
// `simt`; then counts the path taken.
template <typename Tma, typename Simt>
ffi::Error LaunchTmaOrSimt(bool use_tma, bool empty, Path tma_path, Path simt_path,
                           const Tma& tma, const Simt& simt) {
  if (use_tma) {
    if (!empty) JAX_TMA_RETURN_IF_FAILED(tma());
  } else {
    JAX_TMA_RETURN_IF_FAILED(simt());
  }
  CountPath(use_tma ? tma_path : simt_path);
  return ffi::Error::Success();
}

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_CUDA_LAUNCH_H_
