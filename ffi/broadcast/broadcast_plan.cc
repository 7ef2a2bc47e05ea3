// Host rules of jax_tma.broadcast's CUDA path (see broadcast_plan.h).
#include "broadcast/broadcast_plan.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/launch.h"

namespace jax_tma {
namespace {

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

}  // namespace

bool PlanClusterBroadcast(const BroadcastGeometry& g, BroadcastMethod method, int cluster,
                          ClusterBroadcastPlan* p, std::string* why) {
  const int64_t bytes = g.inner_bytes;
  if (bytes % static_cast<int64_t>(kTensorMapAlign) != 0) {
    return Reject(why, "one replica of x is ", bytes, " B, not a multiple of 16 (the tensor-map "
                  "stride rule; the replica dim's stride is its size)");
  }
  if (reinterpret_cast<std::uintptr_t>(g.src) % kTensorMapAlign != 0) {
    return Reject(why, "x address is not 16-B aligned");
  }
  if (reinterpret_cast<std::uintptr_t>(g.dst) % kTensorMapAlign != 0) {
    return Reject(why, "output address is not 16-B aligned");
  }
  const int64_t words = bytes / kBroadcastElemBytes;
  int64_t c = 1;
  while (c < static_cast<int64_t>(kMaxTensorMapBox) && words % (c * 2) == 0) c *= 2;
  const int64_t r = words / c;
  if (r > kMaxBroadcastCoord || g.outer > kMaxBroadcastCoord || g.n > kMaxBroadcastCoord) {
    return Reject(why, "a tensor coordinate would pass 2^31 - 1 (replica rows ", r, ", outer ",
                  g.outer, ", n ", g.n, ")");
  }
  const int64_t dst_outer_stride = g.n * bytes;
  if (dst_outer_stride >= static_cast<int64_t>(kTensorMapStrideLimit)) {
    return Reject(why, "the output's outer stride n x ", bytes, " B = ", dst_outer_stride,
                  " B is not below 2^40");
  }
  const int64_t row_bytes = c * kBroadcastElemBytes;
  const int64_t budget_rows = kBroadcastTileBudget / row_bytes;  // a power of two, >= 16
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
      return Reject(why, "a tile has ", tile_rows, " rows of ", row_bytes, " B (x is ", g.outer,
                    " x ", r, " rows), fewer than cluster_size ", cluster,
                    ": multicast splits a tile into one slice per CTA");
    }
    a.piece_rows = static_cast<uint32_t>(std::min(rows, tile_rows / cluster));
    a.pieces_per_cta = static_cast<uint32_t>(tile_rows / (a.piece_rows * cluster));
    if ((a.piece_rows * row_bytes) % kSmemTileAlign != 0) {
      return Reject(why, "a multicast slice is ", a.piece_rows, " row(s) of ", row_bytes, " B = ",
                    a.piece_rows * row_bytes, " B, not a multiple of ", kSmemTileAlign,
                    " (the shared-memory alignment of tensor copies)");
    }
  }
  const int64_t tiles = a.r_tiles * ((g.outer + outers - 1) / outers);
  p->grid = tiles * cluster;
  if (p->grid > kMaxBroadcastCoord) {
    return Reject(why, "the broadcast needs ", p->grid, " CTAs, over the grid limit");
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
  if (!broken.empty()) return Reject(why, "tensor-map rule broken: ", broken);
  return true;
}


bool ClusterBroadcastFits(const BroadcastGeometry& g, BroadcastMethod method, int cluster_size,
                          std::string* why) {
  ClusterBroadcastPlan plan;
  return PlanClusterBroadcast(g, method, cluster_size, &plan, why);
}

ffi::Error PlanBroadcast(const BroadcastGeometry& g, const DeviceInfo& info, int device,
                         BroadcastPlan* plan) {
  const auto op = kBroadcastOp;
  const BroadcastMethod method = g.method;
  const bool clustered =
      method == BroadcastMethod::kMulticast || method == BroadcastMethod::kDsmem;
  const int cluster_size =
      !clustered ? 1
                 : static_cast<int>(g.cluster_size != 0 ? g.cluster_size : kDefaultClusterSize);
  plan->cluster_size = cluster_size;
  if (method == BroadcastMethod::kAuto) {
    const int64_t x_bytes = g.outer * g.inner_bytes;  // n * x_bytes may overflow
    const bool store = info.has_tma() && x_bytes > kBroadcastAutoSimtMaxBytes / g.n &&
                       PlanClusterBroadcast(g, BroadcastMethod::kStore, 1, &plan->cluster,
                                            nullptr);
    plan->method = store ? BroadcastMethod::kStore : BroadcastMethod::kSimt;
    return ffi::Error::Success();
  }
  plan->method = method;
  if (method == BroadcastMethod::kSimt) return ffi::Error::Success();
  if (!(method == BroadcastMethod::kStore && cluster_size == 1) &&
      !(clustered && IsClusterSize(cluster_size))) {
    return InvalidArgument(op, "no TMA kernel for method '", BroadcastMethodName(method),
                           "' with cluster_size ", cluster_size);
  }
  if (!info.has_tma()) {
    return InvalidArgument(op, info.NeedsTma(BroadcastMethodName(method), device,
                                             clustered ? "thread-block clusters and TMA" : "TMA"));
  }
  std::string why;
  if (!PlanClusterBroadcast(g, method, cluster_size, &plan->cluster, &why)) {
    return InvalidArgument(op, "method='", BroadcastMethodName(method), "' (cluster_size ",
                           cluster_size, ") cannot run this shape: ", why);
  }
  return ffi::Error::Success();
}

}  // namespace jax_tma
