// The TMA broadcast kernels and their launcher (broadcast_plan.cc lays out the
// tiles). x is cut into tiles; each
// tile is read from global memory once and written n times with tensor
// stores. Three ways to get a tile into shared memory, one kernel template:
//   store:     one CTA loads the tile and issues all n stores (no cluster);
//   multicast: the CTAs of a cluster each load a slice with
//              .multicast::cluster, so every CTA receives the whole tile,
//              and each stores the replicas k with k % cluster == its rank;
//   dsmem:     CTA 0 of a cluster loads the tile, which is pushed SM to SM
//              into the peers' shared memory (a binomial tree of
//              shared::cluster bulk copies), then all store as above.
#include <array>
#include <cstdint>
#include <string>

#include "broadcast/broadcast_launch.h"
#include "cuda/cuda_status.h"
#include "cuda/device_helpers.cuh"
#include "cuda/device_info.h"
#include "cuda/launch.h"
#include "cuda/tensor_copy.cuh"
#include "cuda/tensor_map.h"

namespace jax_tma {
namespace {

constexpr int kThreads = 32;  // one thread drives the copy engine; one warp for the barriers

enum class TileSource { kOwnLoad, kMulticast, kPush };

// One tile per CTA (per cluster for multicast/dsmem): the block scheduler
// balances, as for the bulk copy (bulk_copy.cu). Thread 0 issues every copy.
//
// Synchronisation. One mbarrier, one phase (parity 0): it is initialised to
// one arrival (thread 0's expect_tx of the whole tile), and completes when
// the tile's bytes have all landed in this CTA's shared memory, whichever CTA
// issued them: its own load, the peers' multicast slices, or a peer's push.
// Each receiving CTA counts the tile's bytes exactly once, on its own
// barrier. A complete_tx that lands before the expect_tx cannot complete the
// phase early: the pending arrival holds it. In a cluster, the barrier
// inits are fenced to cluster scope (fence.mbarrier_init) and published by
// a cluster barrier before any CTA may signal a peer's barrier. Shared memory
// is written only by the async proxy (TMA loads, multicast, push) and read
// only by it (tensor stores, push), so no fence.proxy.async is needed; the
// only generic-proxy write, the mbarrier init, has its own fence. A final
// cluster barrier keeps every CTA (and its shared memory) alive until every
// peer has received its tile: no multicast slice or push may still be
// writing into, or (a forwarding CTA's push) reading from, a CTA that has
// exited.
template <TileSource kSource>
__global__ void __launch_bounds__(kThreads)
    ClusterBroadcastKernel(const __grid_constant__ CUtensorMap tile_map,
                           const __grid_constant__ CUtensorMap piece_map,
                           const __grid_constant__ CUtensorMap dst_map,
                           const BroadcastTileArgs a) {
#if JAX_TMA_HAS_BULK_COPY
  using namespace device;
  constexpr bool kCluster = kSource != TileSource::kOwnLoad;
  __shared__ uint64_t full;
  extern __shared__ uint8_t dynamic_smem[];
  // Same offset in every CTA of the cluster (same kernel, same layout), as
  // multicast and push need.
  uint8_t* const tile =
      dynamic_smem + ((kSmemTileAlign - (smem_addr(dynamic_smem) & (kSmemTileAlign - 1))) &
                      (kSmemTileAlign - 1));
  if (!kCluster && threadIdx.x != 0) return;
  const uint32_t rank = kCluster ? cluster_ctarank() : 0;
  // Cluster dims are (cluster, 1, 1): a cluster is `cluster` consecutive CTAs.
  const int64_t t = blockIdx.x / a.cluster;
  const int32_t r0 = static_cast<int32_t>((t % a.r_tiles) * a.rows);
  const int32_t o0 = static_cast<int32_t>((t / a.r_tiles) * a.outers);
  const bool leader = threadIdx.x == 0;

  if (leader) {
    mbarrier_init(&full, 1);
    fence_mbarrier_init();
    prefetch_tensor_map(kSource == TileSource::kMulticast ? &piece_map : &tile_map);
    prefetch_tensor_map(&dst_map);
  }
  if constexpr (kCluster) {
    __syncwarp();
    cluster_sync();  // every barrier of the cluster initialised before any is signalled
  }
  if (leader) {
    expect_tx(&full, a.tile_bytes);
    if constexpr (kSource == TileSource::kMulticast) {
      // Slice q of the tile: piece_rows consecutive rows of the tile's
      // (outer, row) order, contiguous in shared memory; never straddles an
      // outer index because piece_rows divides rows.
      const uint16_t everyone = static_cast<uint16_t>((1u << a.cluster) - 1);
      for (uint32_t i = 0; i < a.pieces_per_cta; ++i) {
        const uint32_t row = (rank * a.pieces_per_cta + i) * a.piece_rows;
        const uint32_t ol = row / static_cast<uint32_t>(a.rows);
        const uint32_t rl = row - ol * static_cast<uint32_t>(a.rows);
        tensor_load_3d_multicast(tile + static_cast<size_t>(row) * a.row_bytes, &piece_map,
                                 &full, 0, r0 + static_cast<int32_t>(rl),
                                 o0 + static_cast<int32_t>(ol), everyone);
      }
    } else if (rank == 0) {
      tensor_load_3d(tile, &tile_map, &full, 0, r0, o0);
    }
    mbarrier_wait(&full, 0);
    if constexpr (kSource == TileSource::kPush) {
      // Binomial tree: once it holds the tile, CTA r forwards it to r + s
      // for every power of two s > r (r + s < cluster). Every CTA but 0
      // receives exactly once (q from q minus its highest bit); CTA 0 sends
      // log2(cluster) pushes instead of cluster - 1, spreading the SM-to-SM
      // traffic over the senders.
      for (uint32_t s = 1; s < static_cast<uint32_t>(a.cluster); s <<= 1) {
        const uint32_t peer = rank + s;
        if (s > rank && peer < static_cast<uint32_t>(a.cluster)) {
          bulk_push_to_peer(peer_smem_addr(tile, peer), tile, a.tile_bytes,
                            peer_smem_addr(&full, peer));
        }
      }
    }
    for (int32_t k = static_cast<int32_t>(rank); k < a.n; k += a.cluster) {
      tensor_store_4d(&dst_map, tile, 0, r0, k, o0);
    }
    store_commit_group();
    // Shared memory must outlive every store reading it; the global writes
    // themselves are complete when the grid is.
    store_wait_read<0>();
  }
  if constexpr (kCluster) {
    __syncwarp();
    cluster_sync();  // no CTA exits while a peer may still copy into or out of it
  }
#endif
}

using KernelFn = void (*)(const CUtensorMap, const CUtensorMap, const CUtensorMap,
                          const BroadcastTileArgs);

KernelFn KernelFor(BroadcastMethod method) {
  switch (method) {
    case BroadcastMethod::kMulticast: return ClusterBroadcastKernel<TileSource::kMulticast>;
    case BroadcastMethod::kDsmem: return ClusterBroadcastKernel<TileSource::kPush>;
    default: return ClusterBroadcastKernel<TileSource::kOwnLoad>;
  }
}

int ClusterIndex(int cluster_size) {
  return cluster_size == 2 ? 0 : cluster_size == 4 ? 1 : cluster_size == 8 ? 2 : 3;
}

// Per device: how many clusters of each size each cluster kernel can keep
// resident (cudaOccupancyMaxActiveClusters; 0: the size cannot launch).
// Allowing 16 (non-portable) is set here, once per device.
struct ClusterCaps {
  std::array<std::array<int, 4>, 2> max_active{};  // [multicast, dsmem][2, 4, 8, 16]
};

ffi::Error QueryClusterCaps(int device, ClusterCaps* caps) {
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  const BroadcastMethod methods[2] = {BroadcastMethod::kMulticast, BroadcastMethod::kDsmem};
  for (int m = 0; m < 2; ++m) {
    const void* fn = reinterpret_cast<const void*>(KernelFor(methods[m]));
    if (!info.has_tma()) continue;  // no clusters below sm_90: all stay 0
    JAX_TMA_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    for (int c = 0; c < 4; ++c) {
      const unsigned size = 2u << c;
      const ClusterLaunch launch(size, kThreads, kBroadcastDynamicSmem, size);
      int active = 0;
      // An unsupported size is an answer (0), not a failure of the handler.
      if (cudaOccupancyMaxActiveClusters(&active, fn, &launch.config) != cudaSuccess) {
        (void)cudaGetLastError();
        active = 0;
      }
      caps->max_active[m][c] = active;
    }
  }
  return ffi::Error::Success();
}

}  // namespace

ffi::Error LaunchClusterBroadcast(const BroadcastGeometry& g, const BroadcastPlan& p,
                                  cudaStream_t stream, int device) {
  const auto op = kBroadcastOp;
  const BroadcastMethod method = p.method;
  const int cluster_size = p.cluster_size;
  const ClusterBroadcastPlan& plan = p.cluster;
  const bool clustered =
      method == BroadcastMethod::kMulticast || method == BroadcastMethod::kDsmem;
  if (g.n == 0 || g.outer == 0 || g.inner_bytes == 0) return ffi::Error::Success();
  static PerDevice<ClusterCaps> caps_cache;
  ClusterCaps caps;
  JAX_TMA_RETURN_IF_FAILED(caps_cache.Get(device, QueryClusterCaps, &caps));
  if (clustered) {
    const int active = caps.max_active[method == BroadcastMethod::kMulticast ? 0 : 1]
                                      [ClusterIndex(cluster_size)];
    if (active == 0) {
      return InvalidArgument(op, "cluster_size ", cluster_size, " cannot launch on device ",
                             device, " (cudaOccupancyMaxActiveClusters reports 0 clusters of ",
                             cluster_size, " CTAs with ", kBroadcastDynamicSmem,
                             " B of shared memory each); use 2, 4 or 8");
    }
  }
  // Encoded on every call: the addresses change between calls and the
  // descriptors travel by value as kernel parameters.
  CUtensorMap tile_map;
  CUtensorMap piece_map;
  CUtensorMap dst_map;
  JAX_TMA_RETURN_IF_FAILED(EncodeTiled(op, plan.tile, &tile_map));
  JAX_TMA_RETURN_IF_FAILED(EncodeTiled(op, plan.piece, &piece_map));
  JAX_TMA_RETURN_IF_FAILED(EncodeTiled(op, plan.dst, &dst_map));

  const ClusterLaunch launch(static_cast<unsigned>(plan.grid), kThreads, kBroadcastDynamicSmem,
                             clustered ? static_cast<unsigned>(cluster_size) : 0, stream);
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&launch.config, KernelFor(method), tile_map,
                                                  piece_map, dst_map, plan.args));
  return ffi::Error::Success();
}

}  // namespace jax_tma
