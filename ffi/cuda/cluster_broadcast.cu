// The TMA broadcast kernels and their launcher. x is cut into tiles; each
// tile is read from global memory once and written n times with tensor
// stores. Three ways to get a tile into shared memory, one kernel template:
//   store:     one CTA loads the tile and issues all n stores (no cluster);
//   multicast: the CTAs of a cluster each load a slice with
//              .multicast::cluster, so every CTA receives the whole tile,
//              and each stores the replicas k with k % cluster == its rank;
//   dsmem:     CTA 0 of a cluster loads the tile, which is pushed SM to SM
//              into the peers' shared memory (a binomial tree of
//              shared::cluster bulk copies), then all store as above.
#include <algorithm>
#include <array>
#include <cstdint>

#include "broadcast_launch.h"
#include "cluster_launch.h"
#include "cuda_status.h"
#include "device_helpers.cuh"
#include "device_info.h"
#include "tensor_copy.cuh"
#include "tensor_map.h"

namespace jax_tma {
namespace {

constexpr int kThreads = 32;  // one thread drives the copy engine; one warp for the barriers
constexpr uint32_t kTileBudget = 32 * 1024;  // shared memory per CTA: one tile
constexpr uint32_t kTileAlign = 128;         // tensor-copy shared-memory alignment
constexpr int kDynamicSmem = kTileBudget + kTileAlign;
constexpr int64_t kElemBytes = 8;            // tensor-map element: UINT64 (bytes move as is)
constexpr int64_t kMaxCoord = (int64_t{1} << 31) - 1;  // s32 tensor coordinates

enum class TileSource { kOwnLoad, kMulticast, kPush };

// Tensor-map view (innermost first): x is {C, R, outer} u64 elements, the
// output {C, R, n, outer}; C * R * 8 = the replica's bytes. A tile is
// {C, rows, outers}; tiles run over R (fast) and outer.
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
      dynamic_smem + ((kTileAlign - (smem_addr(dynamic_smem) & (kTileAlign - 1))) &
                      (kTileAlign - 1));
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
      const ClusterLaunch launch(size, kThreads, kDynamicSmem, size);
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

struct BroadcastPlan {
  TiledMapSpec tile;   // box = one tile of x
  TiledMapSpec piece;  // box = one multicast slice (= tile otherwise)
  TiledMapSpec dst;    // box = one tile of one replica
  BroadcastTileArgs args{};
  int64_t grid = 0;
};

int64_t FloorPow2(int64_t v) {
  int64_t p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}

// A dense u64 tensor map of rank R (arrays innermost first), element
// strides 1, zero out-of-bounds fill.
template <int R>
TiledMapSpec U64Map(const void* address, const int64_t (&dims)[R],
                    const int64_t (&byte_strides)[R - 1], const int64_t (&box)[R]) {
  TiledMapSpec m;
  m.type = CU_TENSOR_MAP_DATA_TYPE_UINT64;
  m.rank = R;
  m.address = address;
  for (int i = 0; i < R; ++i) {
    m.dims[i] = static_cast<uint64_t>(dims[i]);
    m.box[i] = static_cast<uint32_t>(box[i]);
    m.elem_strides[i] = 1;
    if (i > 0) m.byte_strides[i - 1] = static_cast<uint64_t>(byte_strides[i - 1]);
  }
  return m;
}

// Checks every rule the kernel relies on and lays out the tiles; false with
// the first broken rule in *why.
bool PlanClusterBroadcast(const BroadcastGeometry& g, BroadcastMethod method, int cluster,
                          BroadcastPlan* p, std::string* why) {
  Message os;
  auto fail = [&] {
    *why = os.str();
    return false;
  };
  const int64_t bytes = g.inner_bytes;
  if (bytes % static_cast<int64_t>(kTensorMapAlign) != 0) {
    os << "one replica of x is " << bytes << " B, not a multiple of 16 (the tensor-map stride "
       << "rule; the replica dim's stride is its size)";
    return fail();
  }
  if (reinterpret_cast<std::uintptr_t>(g.src) % kTensorMapAlign != 0 ||
      reinterpret_cast<std::uintptr_t>(g.dst) % kTensorMapAlign != 0) {
    os << "x or the output is not 16-B aligned";
    return fail();
  }
  const int64_t words = bytes / kElemBytes;
  int64_t c = 1;
  while (c < static_cast<int64_t>(kMaxTensorMapBox) && words % (c * 2) == 0) c *= 2;
  const int64_t r = words / c;
  if (r > kMaxCoord || g.outer > kMaxCoord || g.n > kMaxCoord) {
    os << "a tensor coordinate would pass 2^31 - 1 (replica rows " << r << ", outer " << g.outer
       << ", n " << g.n << ")";
    return fail();
  }
  const int64_t dst_outer_stride = g.n * bytes;
  if (dst_outer_stride >= static_cast<int64_t>(kTensorMapStrideLimit)) {
    os << "the output's outer stride n x " << bytes << " B = " << dst_outer_stride
       << " B is not below 2^40";
    return fail();
  }
  const int64_t row_bytes = c * kElemBytes;
  const int64_t budget_rows = kTileBudget / row_bytes;  // a power of two, >= 16
  const int64_t box = kMaxTensorMapBox;
  const int64_t rows = FloorPow2(std::min({r, budget_rows, box}));
  const int64_t outers = FloorPow2(std::min({g.outer, budget_rows / rows, box}));
  const int64_t tile_rows = rows * outers;
  BroadcastTileArgs& a = p->args;
  a = BroadcastTileArgs{};
  a.r_tiles = (r + rows - 1) / rows;
  a.rows = static_cast<int32_t>(rows);
  a.outers = static_cast<int32_t>(outers);
  a.n = static_cast<int32_t>(g.n);
  a.cluster = cluster;
  a.tile_bytes = static_cast<uint32_t>(tile_rows * row_bytes);
  a.row_bytes = static_cast<uint32_t>(row_bytes);
  a.piece_rows = static_cast<uint32_t>(rows);
  a.pieces_per_cta = 1;
  if (method == BroadcastMethod::kMulticast) {
    if (tile_rows < cluster) {
      os << "a tile has " << tile_rows << " rows of " << row_bytes << " B (x is " << g.outer
         << " x " << r << " rows), fewer than cluster_size " << cluster
         << ": multicast splits a tile into one slice per CTA";
      return fail();
    }
    a.piece_rows = static_cast<uint32_t>(std::min(rows, tile_rows / cluster));
    a.pieces_per_cta = static_cast<uint32_t>(tile_rows / (a.piece_rows * cluster));
    if ((a.piece_rows * row_bytes) % kTileAlign != 0) {
      os << "a multicast slice is " << a.piece_rows << " row(s) of " << row_bytes << " B = "
         << a.piece_rows * row_bytes << " B, not a multiple of " << kTileAlign
         << " (the shared-memory alignment of tensor copies)";
      return fail();
    }
  }
  const int64_t tiles = a.r_tiles * ((g.outer + outers - 1) / outers);
  p->grid = tiles * cluster;
  if (p->grid > kMaxCoord) {
    os << "the broadcast needs " << p->grid << " CTAs, over the grid limit";
    return fail();
  }

  p->tile = U64Map<3>(g.src, {c, r, g.outer}, {row_bytes, bytes}, {c, rows, outers});
  p->piece = p->tile;
  if (method == BroadcastMethod::kMulticast) {
    p->piece.box[1] = a.piece_rows;
    p->piece.box[2] = 1;
  }
  p->dst = U64Map<4>(g.dst, {c, r, g.n, g.outer}, {row_bytes, bytes, dst_outer_stride},
                     {c, rows, 1, outers});
  const std::string broken = CheckTiledMaps({&p->tile, &p->piece, &p->dst});
  if (!broken.empty()) {
    os << "tensor-map rule broken: " << broken;
    return fail();
  }
  return true;
}

}  // namespace

bool ClusterBroadcastFits(const BroadcastGeometry& g, BroadcastMethod method, int cluster_size,
                          std::string* why) {
  BroadcastPlan plan;
  std::string reason;
  const bool fits = PlanClusterBroadcast(g, method, cluster_size, &plan, &reason);
  if (!fits && why != nullptr) *why = reason;
  return fits;
}

ffi::Error LaunchClusterBroadcast(const BroadcastGeometry& g, BroadcastMethod method,
                                  int cluster_size, cudaStream_t stream, int device) {
  const auto op = kBroadcastOp;
  const bool clustered =
      method == BroadcastMethod::kMulticast || method == BroadcastMethod::kDsmem;
  if (!(method == BroadcastMethod::kStore && cluster_size == 1) &&
      !(clustered && IsClusterSize(cluster_size))) {
    return InvalidArgument(op, "no TMA kernel for method '", BroadcastMethodName(method),
                           "' with cluster_size ", cluster_size);
  }
  if (g.n == 0 || g.outer == 0 || g.inner_bytes == 0) return ffi::Error::Success();
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  if (!info.has_tma()) {
    return InvalidArgument(op, "method='", BroadcastMethodName(method),
                           "' needs TMA", clustered ? " and thread-block clusters" : "",
                           " (compute capability >= 9.0) but device ", device,
                           " has compute capability ", info.cc_major, ".", info.cc_minor);
  }
  BroadcastPlan plan;
  std::string why;
  if (!PlanClusterBroadcast(g, method, cluster_size, &plan, &why)) {
    return InvalidArgument(op, "method='", BroadcastMethodName(method), "' (cluster_size ",
                           cluster_size, ") cannot run this shape: ", why);
  }
  static PerDevice<ClusterCaps> caps_cache;
  ClusterCaps caps;
  JAX_TMA_RETURN_IF_FAILED(caps_cache.Get(device, QueryClusterCaps, &caps));
  if (clustered) {
    const int active = caps.max_active[method == BroadcastMethod::kMulticast ? 0 : 1]
                                      [ClusterIndex(cluster_size)];
    if (active == 0) {
      return InvalidArgument(op, "cluster_size ", cluster_size, " cannot launch on device ",
                             device, " (cudaOccupancyMaxActiveClusters reports 0 clusters of ",
                             cluster_size, " CTAs with ", kDynamicSmem,
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

  const ClusterLaunch launch(static_cast<unsigned>(plan.grid), kThreads, kDynamicSmem,
                             clustered ? static_cast<unsigned>(cluster_size) : 0, stream);
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&launch.config, KernelFor(method), tile_map,
                                                  piece_map, dst_map, plan.args));
  return ffi::Error::Success();
}

}  // namespace jax_tma
