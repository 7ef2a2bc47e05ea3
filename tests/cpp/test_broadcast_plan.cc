// jax_tma.broadcast's host rules (ffi/broadcast/broadcast_plan.h): tiles and
// grids of the store, multicast and dsmem kernels, each rule that rejects a
// shape (with its reason), and the method and cluster size auto and 0 pick.
#include <cstdint>
#include <string>

#include "check.h"
#include "broadcast/broadcast_plan.h"

namespace jax_tma {
namespace {

const void* const kAligned = reinterpret_cast<const void*>(std::uintptr_t{1} << 20);
void* const kAlignedOut = reinterpret_cast<void*>(std::uintptr_t{1} << 21);

BroadcastGeometry Broadcast(int64_t outer, int64_t inner_bytes, int64_t n,
                            BroadcastMethod method = BroadcastMethod::kAuto,
                            int64_t cluster_size = 0) {
  BroadcastGeometry g;
  g.method = method;
  g.cluster_size = cluster_size;
  g.outer = outer;
  g.inner_bytes = inner_bytes;
  g.n = n;
  g.src = kAligned;
  g.dst = kAlignedOut;
  return g;
}

std::string Why(const BroadcastGeometry& g, BroadcastMethod method, int cluster) {
  std::string why;
  ClusterBroadcastPlan plan;
  return PlanClusterBroadcast(g, method, cluster, &plan, &why) ? "fits" : why;
}

void TestStoreTiles() {
  // 8 rows of 8 KiB, 4 replicas: rows of 256 u64 (2 KiB), 4 replica rows by
  // 4 outer rows per 32 KiB tile, two tiles.
  ClusterBroadcastPlan p;
  std::string why;
  CHECK(PlanClusterBroadcast(Broadcast(8, 8192, 4), BroadcastMethod::kStore, 1, &p, &why));
  CHECK_EQ(p.args.row_bytes, 2048u);
  CHECK_EQ(p.args.rows, 4);
  CHECK_EQ(p.args.outers, 4);
  CHECK_EQ(p.args.r_tiles, int64_t{1});
  CHECK_EQ(p.args.tile_bytes, 32768u);
  CHECK_EQ(p.args.n, 4);
  CHECK_EQ(p.grid, int64_t{2});
  CHECK_EQ(p.tile.rank, 3);
  CHECK_EQ(p.dst.rank, 4);
  CHECK_EQ(p.dst.byte_strides[2], uint64_t{4 * 8192});  // outer stride: n replicas
  CHECK_EQ(p.dst.box[2], 1u);                           // one replica per store
  // Replica sizes that are not a power of two: the largest power-of-two
  // row that divides them.
  CHECK(PlanClusterBroadcast(Broadcast(1, 48, 2), BroadcastMethod::kStore, 1, &p, &why));
  CHECK_EQ(p.args.row_bytes, 16u);
  CHECK_EQ(p.args.rows, 2);  // 3 rows: floor to a power of two, two tiles along R
  CHECK_EQ(p.args.r_tiles, int64_t{2});
}

void TestClusterTiles() {
  // multicast: every CTA of the cluster loads one slice of each tile.
  ClusterBroadcastPlan p;
  std::string why;
  CHECK(PlanClusterBroadcast(Broadcast(8, 8192, 4), BroadcastMethod::kMulticast, 2, &p, &why));
  CHECK_EQ(p.grid, int64_t{4});
  CHECK_EQ(p.args.cluster, 2);
  CHECK_EQ(p.args.piece_rows, 4u);
  CHECK_EQ(p.args.pieces_per_cta, 2u);
  CHECK_EQ(p.piece.box[1], 4u);
  CHECK_EQ(p.piece.box[2], 1u);
  // dsmem: CTA 0 loads the whole tile.
  CHECK(PlanClusterBroadcast(Broadcast(8, 8192, 4), BroadcastMethod::kDsmem, 8, &p, &why));
  CHECK_EQ(p.grid, int64_t{16});
  CHECK_EQ(p.piece.box[1], p.tile.box[1]);
}

void TestRules() {
  CHECK_EQ(Why(Broadcast(4, 24, 2), BroadcastMethod::kStore, 1),
           "one replica of x is 24 B, not a multiple of 16 (the tensor-map stride rule; the "
           "replica dim's stride is its size)");
  BroadcastGeometry off = Broadcast(4, 64, 2);
  off.src = static_cast<const char*>(kAligned) + 8;
  CHECK_EQ(Why(off, BroadcastMethod::kStore, 1), "x address is not 16-B aligned");
  off = Broadcast(4, 64, 2);
  off.dst = static_cast<char*>(kAlignedOut) + 8;
  CHECK_EQ(Why(off, BroadcastMethod::kStore, 1), "output address is not 16-B aligned");
  CHECK_EQ(Why(Broadcast(1, 16, int64_t{1} << 31), BroadcastMethod::kStore, 1),
           "a tensor coordinate would pass 2^31 - 1 (replica rows 1, outer 1, n 2147483648)");
  CHECK_EQ(Why(Broadcast(2, int64_t{1} << 20, int64_t{1} << 20), BroadcastMethod::kStore, 1),
           "the output's outer stride n x 1048576 B = 1099511627776 B is not below 2^40");
  CHECK_EQ(Why(Broadcast(1, 16, 4), BroadcastMethod::kMulticast, 2),
           "a tile has 1 rows of 16 B (x is 1 x 1 rows), fewer than cluster_size 2: multicast "
           "splits a tile into one slice per CTA");
  CHECK_EQ(Why(Broadcast(4, 32, 4), BroadcastMethod::kMulticast, 4),
           "a multicast slice is 1 row(s) of 32 B = 32 B, not a multiple of 128 (the "
           "shared-memory alignment of tensor copies)");
  CHECK_EQ(Why(Broadcast(4, 32, 4), BroadcastMethod::kDsmem, 4), "fits");  // no slices
  CHECK(ClusterBroadcastFits(Broadcast(4, 32, 4), BroadcastMethod::kStore, 1, nullptr));
}

const DeviceInfo kH100{9, 0, 132, 232448, 233472};
const DeviceInfo kA100{8, 0, 108, 166912, 167936};

void TestPlan() {
  const BroadcastGeometry fits = Broadcast(8, 8192, 4);
  BroadcastPlan p;
  // auto: SIMT up to kBroadcastAutoSimtMaxBytes of output, the store kernel
  // above it (its tiles planned too), SIMT below sm_90 at any size.
  CHECK(PlanBroadcast(fits, kH100, 0, &p).success());
  CHECK(p.method == BroadcastMethod::kSimt);
  const BroadcastGeometry at_most = Broadcast(256, 8192, 4);  // 8 MiB out
  CHECK(PlanBroadcast(at_most, kH100, 0, &p).success());
  CHECK(p.method == BroadcastMethod::kSimt);
  const BroadcastGeometry over = Broadcast(257, 8192, 4);  // 8 MiB + 32 KiB
  CHECK(PlanBroadcast(over, kH100, 0, &p).success());
  CHECK(p.method == BroadcastMethod::kStore);
  CHECK_EQ(p.cluster_size, 1);
  ClusterBroadcastPlan store;
  CHECK(PlanClusterBroadcast(over, BroadcastMethod::kStore, 1, &store, nullptr));
  CHECK_EQ(p.cluster.grid, store.grid);
  CHECK(p.cluster.grid > 0);
  CHECK(PlanBroadcast(Broadcast(1, 8192, 1024), kH100, 0, &p).success());  // n x 8 KiB
  CHECK(p.method == BroadcastMethod::kSimt);
  CHECK(PlanBroadcast(Broadcast(1, 8192, 1025), kH100, 0, &p).success());
  CHECK(p.method == BroadcastMethod::kStore);
  CHECK(PlanBroadcast(over, kA100, 0, &p).success());  // below sm_90
  CHECK(p.method == BroadcastMethod::kSimt);
  CHECK(PlanBroadcast(Broadcast(8, 24, 4), kH100, 0, &p).success());  // no tensor map fits
  CHECK(p.method == BroadcastMethod::kSimt);
  CHECK(PlanBroadcast(Broadcast(8, 8192, 4, BroadcastMethod::kMulticast), kH100, 0, &p)
            .success());
  CHECK(p.method == BroadcastMethod::kMulticast);
  CHECK_EQ(p.cluster_size, kDefaultClusterSize);
  CHECK(PlanBroadcast(Broadcast(8, 8192, 4, BroadcastMethod::kDsmem, 8), kH100, 0, &p)
            .success());
  CHECK(p.method == BroadcastMethod::kDsmem);
  CHECK_EQ(p.cluster_size, 8);
  CHECK(PlanBroadcast(Broadcast(8, 8192, 4, BroadcastMethod::kSimt), kH100, 0, &p).success());
  CHECK(p.method == BroadcastMethod::kSimt);
  // Explicit TMA methods that cannot run say why.
  ffi::Error err = PlanBroadcast(Broadcast(8, 24, 4, BroadcastMethod::kStore), kA100, 3, &p);
  CHECK_EQ(err.message(), "jax_tma.broadcast: method='store' needs TMA, but device 3 has compute "
                          "capability 8.0 (TMA needs >= 9.0); use method='auto' or 'simt'");
  err = PlanBroadcast(Broadcast(8, 8192, 4, BroadcastMethod::kDsmem, 3), kH100, 0, &p);
  CHECK_EQ(err.message(),
           "jax_tma.broadcast: no TMA kernel for method 'dsmem' with cluster_size 3");
}

}  // namespace
}  // namespace jax_tma

int main() {
  jax_tma::TestStoreTiles();
  jax_tma::TestClusterTiles();
  jax_tma::TestRules();
  jax_tma::TestPlan();
  return jax_tma::testing::Failures("test_broadcast_plan");
}
