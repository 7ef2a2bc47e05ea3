// jax_tma.gather / jax_tma.scatter's host rules (ffi/gather/gather_plan.h):
// the bulk path's 16-byte and dtype rules (with their reasons), the bulk and
// SIMT tilings on an H100, and the path each method gets.
#include <cstdint>
#include <string>
#include <vector>

#include "check.h"
#include "gather/gather_plan.h"

namespace jax_tma {
namespace {

constexpr int kH100Sms = 132;
const DeviceInfo kH100{9, 0, kH100Sms, 232448, 233472};
const DeviceInfo kA100{8, 0, 108, 166912, 167936};
// What DeviceInfo::NeedsTma says on kA100.
const char* const kNeedsTma =
    "method='tma' needs TMA, but device 0 has compute capability 8.0 (TMA needs >= 9.0); "
    "use method='auto' or 'simt'";
const void* const kAligned = reinterpret_cast<const void*>(std::uintptr_t{1} << 20);
void* const kAlignedOut = reinterpret_cast<void*>(std::uintptr_t{1} << 21);

// A gather of `count` slabs of `slab_bytes` from a table of `rows` rows.
GatherGeometry Gather(int64_t rows, int64_t count, int64_t slab_bytes) {
  GatherGeometry g;
  g.table_rows = rows;
  g.count = count;
  g.slab_bytes = slab_bytes;
  g.elem_bytes = 4;
  g.table_bytes = rows * slab_bytes;
  g.x = kAligned;
  g.out = kAlignedOut;
  g.slabs = kAligned;
  g.sum = SumKind::kF32;
  return g;
}

std::string Why(const GatherGeometry& g, GatherOp op) {
  std::string why;
  return BulkGatherFits(g, op, &why) ? "fits" : why;
}

void TestBulkRules() {
  CHECK_EQ(Why(Gather(100, 10, 64), GatherOp::kGather), std::string("fits"));
  CHECK_EQ(Why(Gather(100, 10, 12), GatherOp::kGather),
           std::string("slabs of 12 B are not a multiple of 16 B (the bulk-copy size rule)"));
  GatherGeometry odd = Gather(100, 10, 64);
  odd.out = reinterpret_cast<void*>(std::uintptr_t{(1 << 21) + 8});
  CHECK(Why(odd, GatherOp::kGather).find("a buffer is not 16-B aligned") == 0);
  // Gather reads no updates: their address does not matter there.
  GatherGeometry updates = Gather(100, 10, 64);
  updates.slabs = reinterpret_cast<const void*>(std::uintptr_t{(1 << 20) + 4});
  CHECK_EQ(Why(updates, GatherOp::kGather), std::string("fits"));
  CHECK(Why(updates, GatherOp::kScatterSet).find("updates at") != std::string::npos);
  GatherGeometry bytes = Gather(100, 10, 64);
  bytes.elem_bytes = 1;
  bytes.sum = SumKind::kU8;
  CHECK_EQ(Why(bytes, GatherOp::kScatterSet), std::string("fits"));
  CHECK_EQ(Why(bytes, GatherOp::kScatterAdd),
           std::string("cp.reduce.async.bulk has no add for 1-byte integers (it adds 32/64-bit "
                       "integers, f16, bf16, f32 and f64)"));
  GatherGeometry bf16 = Gather(100, 10, 64);
  bf16.elem_bytes = 2;
  bf16.sum = SumKind::kBF16;
  CHECK_EQ(Why(bf16, GatherOp::kScatterAdd), std::string("fits"));
}

void TestTiling() {
  // 512 B rows: 32 rows make a 16 KiB unit; 262,144 rows are 8,192 units,
  // four per CTA.
  BulkGatherTiling t = TileBulkGather(Gather(1 << 20, 1 << 18, 512), kH100Sms);
  CHECK_EQ(t.rows_per_unit, int64_t{32});
  CHECK_EQ(t.pieces, int64_t{1});
  CHECK_EQ(t.unit_bytes, int64_t{16384});
  CHECK_EQ(t.units, int64_t{8192});
  CHECK_EQ(t.units_per_cta, int64_t{4});
  CHECK_EQ(t.blocks, int64_t{2048});
  // 128 B rows: at most 64 rows (two per lane) in a unit.
  t = TileBulkGather(Gather(1 << 22, 1 << 20, 128), kH100Sms);
  CHECK_EQ(t.rows_per_unit, kBulkGatherMaxRowsPerUnit);
  CHECK_EQ(t.unit_bytes, int64_t{64 * 128});
  // 40 KiB pages move in pieces of 16 KiB (the last one shorter).
  t = TileBulkGather(Gather(1000, 300, 40 * 1024), kH100Sms);
  CHECK_EQ(t.pieces, int64_t{3});
  CHECK_EQ(t.piece_bytes, int64_t{16384});
  CHECK_EQ(t.units, int64_t{900});
  CHECK_EQ(t.units_per_cta, int64_t{4});
  CHECK_EQ(t.blocks, int64_t{225});
  // Few units: one per CTA, so that they spread over the SMs.
  t = TileBulkGather(Gather(64, 100, 16384), kH100Sms);
  CHECK_EQ(t.units_per_cta, int64_t{1});
  CHECK_EQ(t.blocks, int64_t{100});
  // Nothing to move: no units, no CTAs.
  t = TileBulkGather(Gather(64, 0, 16384), kH100Sms);
  CHECK_EQ(t.units, int64_t{0});
  CHECK_EQ(t.blocks, int64_t{0});
}

// The tile shape and counts of `t`: rows x segment vectors a tile, segments a
// row, tiles, blocks.
void CheckSimt(const SimtGatherTiling& t, int64_t tile_rows, int64_t segment, int64_t segments,
               int64_t tiles, int64_t blocks) {
  CHECK_EQ(t.tile_rows, tile_rows);
  CHECK_EQ(t.segment, segment);
  CHECK_EQ(t.segments, segments);
  CHECK_EQ(t.tiles, tiles);
  CHECK_EQ(t.blocks, blocks);
}

// g with its output 8 bytes off the 16-byte grid: 8-byte vectors.
GatherGeometry OffGrid(GatherGeometry g) {
  g.out = reinterpret_cast<void*>(std::uintptr_t{(1 << 21) + 8});
  return g;
}

void TestSimtTiling() {
  // 16-byte vectors: flat, a thread per vector, up to 2^31 - 1 vectors. 1 M
  // rows of 128 B are 8 M vectors; 8,192 pages of 32 KiB 16 M.
  constexpr int64_t kWave = kH100Sms * kSimtGatherBlocksPerSm;  // blocks
  SimtGatherTiling t = TileSimtGather(Gather(1 << 22, 1 << 20, 128), GatherOp::kGather, kH100Sms);
  CHECK_EQ(t.vector_bytes, 16);
  CHECK_EQ(t.vectors_per_row, int64_t{8});
  CHECK(t.flat);
  CHECK_EQ(t.flat_threads, kSimtFlatThreads);  // more than a wave: blocks of 128
  CheckSimt(t, 1, 1, 8, 1 << 23, 1 << 16);
  t = TileSimtGather(Gather(32768, 8192, 32768), GatherOp::kGather, kH100Sms);
  CHECK_EQ(t.vectors_per_row, int64_t{2048});
  CheckSimt(t, 1, 1, 2048, 1 << 24, 1 << 17);
  CHECK(TileSimtGather(Gather(100, 0x7fffffff, 16), GatherOp::kGather, kH100Sms).flat);
  t = TileSimtGather(Gather(100, int64_t{1} << 31, 16), GatherOp::kGather, kH100Sms);
  CHECK(!t.flat);  // tiled: 32 rows of one vector a tile
  CheckSimt(t, 32, 1, 1, int64_t{1} << 26, kWave);
  // Narrower vectors are tiled: 1 M rows of 128 B in 8-byte vectors, a tile
  // is 32 whole rows; one resident wave of blocks (4 a SM) loops over the
  // 32,768 tiles.
  t = TileSimtGather(OffGrid(Gather(1 << 22, 1 << 20, 128)), GatherOp::kGather, kH100Sms);
  CHECK_EQ(t.vector_bytes, 8);
  CheckSimt(t, 32, 16, 1, 32768, kWave);
  // 32 KiB pages: 1 KiB segments, so that 8,192 pages make 8,192 tiles of
  // 32 rows' 1 KiB.
  t = TileSimtGather(OffGrid(Gather(32768, 8192, 32768)), GatherOp::kGather, kH100Sms);
  CheckSimt(t, 32, 128, 32, 8192, kWave);
  // Fewer tiles than a wave has warps: segments halve to one vector a lane,
  // then rows, until the tiles fill the wave. 2,048 rows of 2 KiB: 8,192
  // tiles of two rows' 256 B.
  CheckSimt(TileSimtGather(OffGrid(Gather(65536, 2048, 2048)), GatherOp::kGather, kH100Sms), 2,
            32, 8, 8192, kWave);
  // 3,200 B slabs: 32-vector segments, the last one shorter; on one SM
  // (a wave of 32 warps) the 40 rows stop splitting at 16 a tile.
  CheckSimt(TileSimtGather(OffGrid(Gather(100, 40, 3200)), GatherOp::kGather, 1), 16, 32, 13, 39,
            kSimtGatherBlocksPerSm);
  // At most a vector for each thread of a wave (132 SMs: 135,168): flat in
  // any vector. 64 rows of 2 KiB are 8,192 vectors of 16 B; 40 of 3,200 B
  // are 8,000; 40 of 3,200 B in 8-byte vectors 16,000.
  t = TileSimtGather(Gather(65536, 64, 2048), GatherOp::kGather, kH100Sms);
  CHECK(t.flat);
  CHECK_EQ(t.flat_threads, kSimtFlatThreads);  // fewer than 256 a SM: blocks of 128
  CheckSimt(t, 1, 1, 128, 8192, 64);
  t = TileSimtGather(Gather(100, 40, 3200), GatherOp::kScatterSet, kH100Sms);
  CHECK(t.flat);
  CheckSimt(t, 1, 1, 200, 8000, 63);
  CHECK(TileSimtGather(OffGrid(Gather(100, 40, 3200)), GatherOp::kGather, kH100Sms).flat);
  const int64_t wave_threads = kWave * kSimtGatherThreads;
  CHECK_EQ(SimtWaveThreads(kH100Sms), wave_threads);
  CHECK(TileSimtGather(Gather(100, wave_threads, 8), GatherOp::kGather, kH100Sms).flat);
  CHECK(!TileSimtGather(Gather(100, wave_threads + 1, 8), GatherOp::kGather, kH100Sms).flat);
  // 16-byte vectors: blocks of 256 from 256 vectors a SM to a wave's
  // threads, of 128 outside.
  t = TileSimtGather(Gather(100, kH100Sms * 256 - 1, 16), GatherOp::kGather, kH100Sms);
  CHECK_EQ(t.flat_threads, kSimtFlatThreads);
  t = TileSimtGather(Gather(100, kH100Sms * 256, 16), GatherOp::kGather, kH100Sms);
  CHECK_EQ(t.flat_threads, kSimtFlatWaveThreads);
  CHECK_EQ(t.blocks, int64_t{kH100Sms});
  t = TileSimtGather(Gather(100, wave_threads, 16), GatherOp::kGather, kH100Sms);
  CHECK_EQ(t.flat_threads, kSimtFlatWaveThreads);
  CHECK_EQ(t.blocks, wave_threads / kSimtFlatWaveThreads);
  t = TileSimtGather(Gather(100, wave_threads + 1, 16), GatherOp::kGather, kH100Sms);
  CHECK_EQ(t.flat_threads, kSimtFlatThreads);
  CHECK_EQ(t.blocks, wave_threads / kSimtFlatThreads + 1);
  // The vector is the widest that slab size and addresses allow: 12 B slabs
  // move in 4-byte words, an output 8 bytes off the grid in 8-byte ones.
  t = TileSimtGather(Gather(100, 10, 12), GatherOp::kGather, kH100Sms);
  CHECK_EQ(t.vector_bytes, 4);
  CHECK_EQ(t.vectors_per_row, int64_t{3});
  CHECK_EQ(t.tiles, int64_t{30});
  CHECK_EQ(TileSimtGather(OffGrid(Gather(100, 10, 64)), GatherOp::kGather, kH100Sms).vector_bytes,
           8);
  // Gather reads no updates: only scatter minds their address.
  GatherGeometry updates = Gather(100, 10, 64);
  updates.slabs = reinterpret_cast<const void*>(std::uintptr_t{(1 << 20) + 2});
  CHECK_EQ(TileSimtGather(updates, GatherOp::kGather, kH100Sms).vector_bytes, 16);
  CHECK_EQ(TileSimtGather(updates, GatherOp::kScatterSet, kH100Sms).vector_bytes, 2);
  // 1-byte vectors: segments of 1 KiB where the tiles fill a wave.
  t = TileSimtGather(Gather(10000, 4096, 2001), GatherOp::kGather, 1);
  CHECK_EQ(t.vector_bytes, 1);
  CHECK_EQ(t.segment, int64_t{1024});
  CHECK_EQ(t.segments, int64_t{2});
  // Nothing to move: no tiles.
  CHECK_EQ(TileSimtGather(Gather(64, 0, 64), GatherOp::kGather, kH100Sms).tiles, int64_t{0});
}

GatherPath PathOf(const GatherGeometry& g, GatherOp op, bool has_tma) {
  GatherPlan plan;
  const ffi::Error e = PlanGather(g, op, has_tma ? kH100 : kA100, 0, &plan);
  CHECK(e.success());
  return plan.path;
}

std::string Error(const GatherGeometry& g, GatherOp op, bool has_tma) {
  GatherPlan plan;
  return PlanGather(g, op, has_tma ? kH100 : kA100, 0, &plan).message();
}

void TestPathChoice() {
  GatherGeometry g = Gather(100, 10, 64);
  // The SIMT path carries its tiling, add's too.
  GatherPlan plan;
  CHECK(PlanGather(g, GatherOp::kGather, kA100, 0, &plan).success());
  CHECK(plan.simt.flat);
  CHECK_EQ(plan.simt.tiles, int64_t{40});
  plan = GatherPlan{};
  CHECK(PlanGather(g, GatherOp::kScatterAdd, kA100, 0, &plan).success());
  CHECK(plan.path == GatherPath::kSimt);
  CHECK_EQ(plan.simt.tiles, int64_t{40});
  // "auto" with TMA: SIMT for gathers and sets of slabs of at most
  // kAutoSimtMaxSlabBytes, for gathers of at most kAutoSimtMaxGatherBytes
  // and for calls of at most a vector a thread of a wave; bulk for larger
  // slabs in larger calls.
  const GatherGeometry pages = Gather(32768, 8192, 32768);  // 256 MiB
  CHECK(PathOf(pages, GatherOp::kGather, true) == GatherPath::kTma);
  CHECK(PathOf(pages, GatherOp::kScatterSet, true) == GatherPath::kTma);
  CHECK(PathOf(pages, GatherOp::kGather, false) == GatherPath::kSimt);
  const int64_t max_pages = kAutoSimtMaxGatherBytes / 32768;
  CHECK(PathOf(Gather(32768, max_pages, 32768), GatherOp::kGather, true) == GatherPath::kSimt);
  CHECK(PathOf(Gather(32768, max_pages + 1, 32768), GatherOp::kGather, true) ==
        GatherPath::kTma);
  CHECK(PathOf(Gather(32768, max_pages, 32768), GatherOp::kScatterSet, true) ==
        GatherPath::kTma);
  const GatherGeometry rows = Gather(1 << 22, 1 << 20, kAutoSimtMaxSlabBytes);
  CHECK(PathOf(rows, GatherOp::kGather, true) == GatherPath::kSimt);
  CHECK(PathOf(rows, GatherOp::kScatterSet, true) == GatherPath::kSimt);
  CHECK(PathOf(Gather(100, 1 << 16, kAutoSimtMaxSlabBytes + 16), GatherOp::kGather, true) ==
        GatherPath::kTma);
  CHECK(PathOf(Gather(100, 1 << 16, kAutoSimtMaxSlabBytes + 16), GatherOp::kScatterSet, true) ==
        GatherPath::kTma);
  const GatherGeometry small = Gather(65536, 64, 8192);  // flat: 32,768 vectors
  CHECK(PathOf(small, GatherOp::kGather, true) == GatherPath::kSimt);
  CHECK(PathOf(small, GatherOp::kScatterSet, true) == GatherPath::kSimt);
  // Adds: vector reductions (SIMT) for f32, f16 and bf16 in 16-byte vectors
  // on sm_90; bulk for the other types the bulk reduction sums; element
  // atomics (SIMT) for the rest.
  CHECK(PathOf(pages, GatherOp::kScatterAdd, true) == GatherPath::kSimt);
  CHECK(VectorAddFits(pages, TileSimtGather(pages, GatherOp::kScatterAdd, kH100Sms)));
  GatherGeometry f64 = pages;
  f64.elem_bytes = 8;
  f64.sum = SumKind::kF64;
  CHECK(PathOf(f64, GatherOp::kScatterAdd, true) == GatherPath::kTma);
  CHECK(!VectorAddFits(f64, TileSimtGather(f64, GatherOp::kScatterAdd, kH100Sms)));
  GatherGeometry bf16 = pages;
  bf16.elem_bytes = 2;
  bf16.sum = SumKind::kBF16;
  CHECK(PathOf(bf16, GatherOp::kScatterAdd, true) == GatherPath::kSimt);
  GatherGeometry updates = pages;
  updates.slabs = reinterpret_cast<const void*>(std::uintptr_t{(1 << 20) + 4});
  CHECK(!VectorAddFits(updates, TileSimtGather(updates, GatherOp::kScatterAdd, kH100Sms)));
  CHECK(PathOf(updates, GatherOp::kScatterAdd, true) == GatherPath::kSimt);  // bulk cannot
  CHECK(PathOf(g, GatherOp::kGather, false) == GatherPath::kSimt);
  GatherGeometry odd = Gather(100, 10, 12);
  CHECK(PathOf(odd, GatherOp::kGather, true) == GatherPath::kSimt);
  g.method = Method::kSimt;
  CHECK(PathOf(g, GatherOp::kGather, true) == GatherPath::kSimt);
  odd.method = Method::kTma;
  CHECK_EQ(Error(odd, GatherOp::kGather, true),
           std::string("jax_tma.gather: method='tma' cannot move this call: slabs of 12 B are "
                       "not a multiple of 16 B (the bulk-copy size rule)"));
  g.method = Method::kTma;
  CHECK_EQ(Error(g, GatherOp::kScatterSet, false), "jax_tma.scatter: " + std::string(kNeedsTma));
  GatherGeometry ordered = Gather(100, 10, 64);
  ordered.mode = ScatterMode::kAdd;
  ordered.deterministic = true;
  CHECK(PathOf(ordered, GatherOp::kScatterAdd, true) == GatherPath::kOrdered);
  ordered.method = Method::kTma;
  CHECK(Error(ordered, GatherOp::kScatterAdd, true).find("deterministic=True") !=
        std::string::npos);
}

GatherPlan Plan(const GatherGeometry& g, GatherOp op) {
  GatherPlan plan;
  CHECK(PlanGather(g, op, kH100, 0, &plan).success());
  return plan;
}

// Tables of one call run in one launch where geometry and plan agree: K and
// V pools of the same pages; not where slabs, element size or the plan's
// tiling (an address off the 16-byte grid) differ.
void TestFusion() {
  for (GatherOp op : {GatherOp::kGather, GatherOp::kScatterSet, GatherOp::kScatterAdd}) {
    const GatherGeometry k = Gather(4096, 2048, 32768);
    GatherGeometry v = k;
    v.x = kAlignedOut;
    v.out = reinterpret_cast<void*>(std::uintptr_t{1} << 22);
    CHECK(FusesWith(k, Plan(k, op), k, Plan(k, op)));
    CHECK(FusesWith(k, Plan(k, op), v, Plan(v, op)));
    GatherGeometry wide = v;
    wide.slab_bytes *= 2;
    CHECK(!FusesWith(k, Plan(k, op), wide, Plan(wide, op)));
    GatherGeometry f16 = v;
    f16.elem_bytes = 2;
    f16.sum = SumKind::kF16;
    CHECK(!FusesWith(k, Plan(k, op), f16, Plan(f16, op)));
    GatherGeometry odd = v;  // 8-byte vectors
    odd.out = reinterpret_cast<void*>((std::uintptr_t{1} << 22) + 8);
    odd.slabs = reinterpret_cast<const void*>((std::uintptr_t{1} << 22) + 8);
    CHECK(!FusesWith(k, Plan(k, op), odd, Plan(odd, op)));
  }
  // The same geometry on different paths (a forced method) stays apart.
  const GatherGeometry pages = Gather(32768, 8192, 32768);
  GatherGeometry simt = pages;
  simt.method = Method::kSimt;
  CHECK(!FusesWith(pages, Plan(pages, GatherOp::kGather), simt, Plan(simt, GatherOp::kGather)));
}

// FastDivisor divides exactly: every divisor up to 4,096 and divisors near
// powers of two and near 2^31, each on numerators around its multiples, at
// the ends of the range and pseudo-random ones.
void TestFastDivisor() {
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (int k = 12; k <= 31; ++k) {
    for (int64_t e = -3; e <= 3; ++e) {
      const int64_t d = (int64_t{1} << k) + e;
      if (d >= 1 && d < (int64_t{1} << 31)) divisors.push_back(static_cast<uint32_t>(d));
    }
  }
  uint64_t state = 0x9e3779b97f4a7c15u;
  auto next = [&] {  // xorshift64
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return static_cast<uint32_t>(state >> 33);  // < 2^31
  };
  for (int k = 0; k < 2000; ++k) divisors.push_back(next() | 1u);
  int64_t wrong = 0;
  for (const uint32_t d : divisors) {
    const FastDivisor f = FastDivisor::Of(d);
    std::vector<uint32_t> ns = {0, 1, 0x7fffffff, 0x7ffffffe};
    for (uint32_t q : {uint32_t{1}, uint32_t{2}, uint32_t{3}, 0x7fffffffu / d}) {
      const uint64_t m = uint64_t{q} * d;
      for (int64_t e = -1; e <= 1; ++e) {
        if (m + e < (uint64_t{1} << 31) && static_cast<int64_t>(m) + e >= 0) {
          ns.push_back(static_cast<uint32_t>(m + e));
        }
      }
    }
    for (int k = 0; k < 64; ++k) ns.push_back(next());
    for (const uint32_t n : ns) wrong += f.Divide(n) != n / d;
  }
  CHECK_EQ(wrong, int64_t{0});
}

// A flat tiling is narrow (32-bit rows and offsets) without batch or outer
// dims, below 2^31 table rows and 2^32 table vectors; tiled ones never are.
void TestNarrow() {
  auto narrow = [](const GatherGeometry& g) {
    const SimtGatherTiling t = TileSimtGather(g, GatherOp::kGather, kH100Sms);
    CHECK(t.flat);
    CHECK_EQ(t.per_row.Divide(static_cast<uint32_t>(t.tiles - 1)),
             static_cast<uint32_t>((t.tiles - 1) / t.vectors_per_row));
    return t.narrow;
  };
  CHECK(narrow(Gather(65536, 64, 2048)));
  CHECK(narrow(Gather(0x7fffffff, 64, 16)));
  CHECK(!narrow(Gather(int64_t{1} << 31, 64, 16)));  // 2^31 rows
  // 32 KiB slabs are 2,048 vectors: 2^21 - 1 rows are 2^32 - 2,048 vectors, 2^21 rows 2^32.
  CHECK(narrow(Gather((int64_t{1} << 21) - 1, 64, int64_t{1} << 15)));
  CHECK(!narrow(Gather(int64_t{1} << 21, 64, int64_t{1} << 15)));
  GatherGeometry g = Gather(65536, 64, 2048);
  g.batch = 2;
  CHECK(!narrow(g));
  g = Gather(65536, 64, 2048);
  g.outer = 3;
  CHECK(!narrow(g));
  CHECK(!TileSimtGather(OffGrid(Gather(1 << 22, 1 << 20, 128)), GatherOp::kGather, kH100Sms)
             .narrow);
}

}  // namespace
}  // namespace jax_tma

int main() {
  jax_tma::TestFastDivisor();
  jax_tma::TestNarrow();
  jax_tma::TestFusion();
  jax_tma::TestBulkRules();
  jax_tma::TestTiling();
  jax_tma::TestSimtTiling();
  jax_tma::TestPathChoice();
  return jax_tma::testing::Failures("test_gather_plan");
}
