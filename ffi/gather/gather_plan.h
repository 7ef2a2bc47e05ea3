// Host rules of the gather/scatter kernels: which path moves a call (the TMA
// bulk path's 16-byte and dtype rules, method "auto"), and the bulk
// pipeline's tiling. Pure host C++, unit-tested without a GPU
// (tests/cpp/test_gather_plan.cc).
#ifndef JAX_TMA_FFI_GATHER_GATHER_PLAN_H_
#define JAX_TMA_FFI_GATHER_GATHER_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda/device_info.h"
#include "fast_divisor.h"
#include "gather/gather_common.h"

namespace jax_tma {

enum class GatherPath { kTma, kSimt, kOrdered };

// Which op a plan is for.
enum class GatherOp { kGather, kScatterSet, kScatterAdd };

inline GatherOp GatherOpOf(const GatherGeometry& g, bool scatter) {
  if (!scatter) return GatherOp::kGather;
  return g.mode == ScatterMode::kSet ? GatherOp::kScatterSet : GatherOp::kScatterAdd;
}

// The bulk pipeline: each CTA (one warp) moves `units_per_cta` consecutive
// units through kBulkGatherStages shared-memory buffers. A unit is `rows_per_unit`
// consecutive slab rows (small slabs) or one piece of `piece_bytes` of one
// slab (`pieces` per slab, large slabs).
struct BulkGatherTiling {
  int64_t rows_per_unit = 1;
  int64_t pieces = 1;
  int64_t piece_bytes = 0;  // pieces > 1: bytes of every piece but the last
  int64_t unit_bytes = 0;   // shared-memory bytes of one stage
  int64_t units = 0;
  int64_t units_per_cta = 1;
  int64_t blocks = 0;
};

// The SIMT kernels, in vectors of `vector_bytes`:
// - flat: a thread per vector, in 32-bit arithmetic. Calls of 16-byte
//   vectors take it up to 2^31 - 1 vectors, as XLA's gather does (faster
//   than tiled at every slab size, benchmarks/TUNING.md); calls of narrower
//   vectors where they have at most one vector for each thread of a resident
//   wave, where the tiled kernel's work per tile would be most of the call's
//   time. Adds of f32, f16 and bf16 in 16-byte vectors use it with vector
//   reductions (red.global.add.v4, sm_90).
// - tiled (gather and scatter set, all other calls): each warp moves tiles
//   of up to `tile_rows` (at most 32) consecutive slab rows of the output
//   (gather) or the updates (scatter), one segment of each row per tile.
//   Each lane reads one row's index per tile (one coalesced load) and the
//   warp shares them by shuffles, so every vector load is independent of the
//   others and a lane has several in flight (for narrow vectors faster than
//   flat, benchmarks/TUNING.md). Calls with few rows get smaller tiles, so
//   that they still spread over many warps.
// A flat tiling is narrow where the call has no batch or outer dims, fewer
// than 2^31 table rows and fewer than 2^32 table vectors: its kernels find
// rows and offsets in 32-bit arithmetic, as XLA's gather does where sizes
// allow (see LaunchFlat).
struct SimtGatherTiling {
  int vector_bytes = 1;         // the widest of 16, 8, 4, 2, 1 dividing slab size and addresses
  bool flat = false;
  bool narrow = false;          // flat only
  int64_t vectors_per_row = 0;  // slab_bytes / vector_bytes
  FastDivisor per_row;          // flat only: divides by vectors_per_row
  int64_t tile_rows = 0;        // slab rows per tile, 1 to kSimtTileRows
  int64_t segment = 0;          // vectors of a row per tile (the row's last may be fewer)
  int64_t segments = 0;         // segments per row
  int64_t tiles = 0;
  int flat_threads = 0;         // flat only: a block's threads (see kSimtFlatThreads)
  int64_t blocks = 0;           // of flat_threads (flat) or kSimtGatherThreads threads
};

struct GatherPlan {
  GatherPath path = GatherPath::kSimt;
  BulkGatherTiling bulk;  // path == kTma
  SimtGatherTiling simt;  // path == kSimt, gather and scatter set
};

// Target bytes of one pipeline stage, stages per CTA and the most slab rows
// one unit gathers (two per lane of the warp).
inline constexpr int64_t kBulkGatherUnitBytes = 16 * 1024;
inline constexpr int kBulkGatherStages = 4;
inline constexpr int64_t kBulkGatherMaxRowsPerUnit = 64;

// Threads of a SIMT block, the most slab rows of a tile, and the most bytes
// of one row a tile moves (larger slabs are split, so that even a few rows
// give every SM tiles).
inline constexpr int kSimtGatherThreads = 256;
// Threads of a flat kernel's block: 128, the fastest on large calls. Calls
// of at most a vector for each thread of a resident wave, and at least a
// block of 256 for every SM, take blocks of 256 (kSimtFlatWaveThreads), half
// as many for the SMs to start; smaller calls spread over more SMs in blocks
// of 128 (benchmarks/TUNING.md, kSimtFlatThreads).
inline constexpr int kSimtFlatThreads = 128;
inline constexpr int kSimtFlatWaveThreads = 256;
inline constexpr int kSimtGatherBlocksPerSm = 4;  // its launch bounds: 64 registers a thread
inline constexpr int64_t kSimtTileRows = 32;
inline constexpr int64_t kSimtSegmentBytes = 1024;

// "auto" takes the flat SIMT kernel over the bulk path for gathers and
// scatter sets of slabs of at most kAutoSimtMaxSlabBytes, for gathers of at
// most kAutoSimtMaxGatherBytes, and for calls of at most a vector for each
// thread of a resident wave (SimtWaveThreads); and for f32, f16 and bf16 adds
// in 16-byte vectors on sm_90 and later: where SIMT was as fast or faster
// (benchmarks/TUNING.md, kAutoSimtMaxSlabBytes; results in
// benchmarks/results/gather_*.json).
inline constexpr int64_t kAutoSimtMaxSlabBytes = 4096;
inline constexpr int64_t kAutoSimtMaxGatherBytes = int64_t{64} << 20;

// Threads of one resident wave of the SIMT kernels on `sm_count` SMs.
inline int64_t SimtWaveThreads(int sm_count) {
  return int64_t{sm_count > 0 ? sm_count : 1} * kSimtGatherBlocksPerSm * kSimtGatherThreads;
}

// Whether an add of `g` in tiling `t` sums vectors (VectorAddFits), not
// elements: a flat tiling of 16-byte vectors of f32, f16 or bf16.
inline bool VectorAddFits(const GatherGeometry& g, const SimtGatherTiling& t) {
  return t.flat && t.vector_bytes == 16 &&
         (g.sum == SumKind::kF32 || g.sum == SumKind::kF16 || g.sum == SumKind::kBF16);
}

// Whether the TMA bulk path can move `g` (16-byte slabs and addresses; for
// add, an element type cp.reduce.async.bulk can sum); the first broken rule
// in *why otherwise.
bool BulkGatherFits(const GatherGeometry& g, GatherOp op, std::string* why);

// The tiling of the bulk path for `g` on a GPU with `sm_count` SMs.
BulkGatherTiling TileBulkGather(const GatherGeometry& g, int sm_count);

// The tiling of the SIMT kernels for `g` on a GPU with `sm_count` SMs (for
// adds, only the vector width and whether it is flat mean anything).
SimtGatherTiling TileSimtGather(const GatherGeometry& g, GatherOp op, int sm_count);

// Resolves the method of a call with rows to move: deterministic scatter
// takes the ordered kernel; "tma" the bulk path or an error naming the rule;
// "auto" the bulk path where it fits, TMA exists and the SIMT kernel would
// not win (kAutoSimtMaxSlabBytes and the rules beside it), else SIMT. Errors name the
// op (method="tma" without TMA: DeviceInfo::NeedsTma for `device`).
ffi::Error PlanGather(const GatherGeometry& g, GatherOp op, const DeviceInfo& info, int device,
                      GatherPlan* plan);

// Whether table `b` of a call, planned as `pb`, moves in the same launch as
// table `a` planned as `pa`: the same geometry but for the buffers, and the
// same path and tiling (which also depend on the buffers' alignment).
bool FusesWith(const GatherGeometry& a, const GatherPlan& pa, const GatherGeometry& b,
               const GatherPlan& pb);

// The plan of a whole call of tables gs[0..n): the op and each table's
// GatherPlan.
struct GatherCallPlan {
  GatherOp op = GatherOp::kGather;
  GatherPlan tables[kMaxGatherTables];
};

// Plans every table of a call once (PlanGather); an error names the table
// where the call has several.
ffi::Error PlanGatherCall(const GatherGeometry* gs, size_t n, bool scatter, const DeviceInfo& info,
                          int device, GatherCallPlan* plan);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_GATHER_GATHER_PLAN_H_
