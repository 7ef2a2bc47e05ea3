// Host rules of jax_tma.broadcast's CUDA path: which kernel and cluster size a
// method runs, every rule the TMA tile kernels rely on (tensor-map strides,
// alignment, s32 coordinates, multicast slices), and their tiles and grid.
// Pure host C++, unit-tested without a GPU (tests/cpp/test_broadcast_plan.cc).
#ifndef JAX_TMA_FFI_BROADCAST_BROADCAST_PLAN_H_
#define JAX_TMA_FFI_BROADCAST_BROADCAST_PLAN_H_

#include <cstdint>
#include <string>

#include "broadcast/broadcast_common.h"
#include "cuda/device_info.h"
#include "cuda/launch.h"
#include "cuda/tensor_map.h"

namespace jax_tma {

inline constexpr uint32_t kBroadcastTileBudget = 32 * 1024;  // shared memory per CTA: one tile
inline constexpr int kBroadcastDynamicSmem = SmemWithAlignSlack(kBroadcastTileBudget);
inline constexpr int64_t kBroadcastElemBytes = 8;  // tensor-map element: UINT64 (bytes move as is)
inline constexpr int64_t kMaxBroadcastCoord = (int64_t{1} << 31) - 1;  // s32 tensor coordinates

// "auto" takes the SIMT kernel for outputs of at most this many bytes, where the
// store kernel's few CTAs (one tile of up to 32 KiB each, stored n times) bound
// it. Busy µs a call on an H200, 2026-11-29, rows of 1 KiB, store / simt: n=4,
// 512 KiB out 3.36 / 1.28, 2 MiB 3.46 / 1.54, 8 MiB 3.81 / 3.07, 32 MiB 9.90 / 10.21;
// n=1, 8 KiB 1.31 / 1.03, 8 MiB 3.68 / 3.65, 32 MiB 18.0 / 17.1 (the cases of
// benchmarks/bench_broadcast.py at these sizes hold it to the rule).
inline constexpr int64_t kBroadcastAutoSimtMaxBytes = int64_t{8} << 20;

// cluster_size 0 under multicast/dsmem: 2, the fastest size at every shape
// benchmarks/bench_broadcast.py measures (a cluster must find all its SMs free
// in one GPC at once, which leaves SMs idle at larger sizes).
inline constexpr int kDefaultClusterSize = 2;

// The TMA tile kernels' parameters (by value). Tensor-map view (innermost
// first): x is {C, R, outer} u64 elements, the output {C, R, n, outer};
// C * R * 8 = the replica's bytes. A tile is {C, rows, outers}; tiles run
// over R (fast) and outer.
struct BroadcastTileArgs {
  int64_t r_tiles;           // tiles along R
  int32_t rows;              // tile rows (box dim 1)
  int32_t outers;            // tile outer indices (box dim 2)
  int32_t n;                 // replicas
  int32_t cluster;           // CTAs per cluster (1: store)
  uint32_t tile_bytes;       // C * rows * outers * 8: every receiving CTA expects this once
  uint32_t row_bytes;        // C * 8
  uint32_t piece_rows;       // multicast: rows per slice load (divides rows)
  uint32_t pieces_per_cta;   // multicast: slice loads per CTA
};

struct ClusterBroadcastPlan {
  TiledMapSpec tile;   // box = one tile of x
  TiledMapSpec piece;  // box = one multicast slice (= tile otherwise)
  TiledMapSpec dst;    // box = one tile of one replica
  BroadcastTileArgs args{};
  int64_t grid = 0;    // CTAs: one tile per CTA (per cluster for multicast/dsmem)
};

// Checks every rule the TMA tile kernel of `method` (store, multicast or
// dsmem) with `cluster` CTAs per cluster (1 for store) relies on and lays out
// its tiles; false with the first broken rule in *why (may be null). Host
// arithmetic only: whether the device can launch such a cluster is
// LaunchClusterBroadcast's check.
bool PlanClusterBroadcast(const BroadcastGeometry& g, BroadcastMethod method, int cluster,
                          ClusterBroadcastPlan* plan, std::string* why);

// PlanClusterBroadcast's verdict alone.
bool ClusterBroadcastFits(const BroadcastGeometry& g, BroadcastMethod method, int cluster_size,
                          std::string* why);

// What one call runs: the method (never kAuto), its cluster size (1 for
// store and simt) and, for the TMA methods, their tiles and tensor maps.
struct BroadcastPlan {
  BroadcastMethod method = BroadcastMethod::kSimt;
  int cluster_size = 1;
  ClusterBroadcastPlan cluster;
};

// Plans a non-empty call once on `device` (`info`). "auto" takes the TMA
// store kernel for outputs over kBroadcastAutoSimtMaxBytes wherever its
// tensor-map rules hold, SIMT otherwise and below sm_90: every method reads x
// from DRAM once, so the cluster methods save no traffic, and the store
// kernel saves their cluster barriers and co-scheduling
// (benchmarks/bench_broadcast.py). Cluster size 0 takes
// kDefaultClusterSize. An explicit TMA method that cannot run (no kernel for
// that cluster size, no TMA, a broken tensor-map rule) is an error naming
// the rule and the values.
ffi::Error PlanBroadcast(const BroadcastGeometry& g, const DeviceInfo& info, int device,
                         BroadcastPlan* plan);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_BROADCAST_BROADCAST_PLAN_H_
