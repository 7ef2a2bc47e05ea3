// Host rules of the gather/scatter kernels (see gather_plan.h).
#include "gather/gather_plan.h"

#include <algorithm>
#include <cstdint>

namespace jax_tma {
namespace {

constexpr int64_t kMaxUnitsPerCta = 4;

bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kTmaAlignBytes == 0; }

std::string_view OpName(GatherOp op) { return op == GatherOp::kGather ? kGatherOp : kScatterOp; }

}  // namespace

bool BulkGatherFits(const GatherGeometry& g, GatherOp op, std::string* why) {
  Message m;
  if (g.slab_bytes % kTmaAlignBytes != 0) {
    m << "slabs of " << g.slab_bytes << " B are not a multiple of 16 B (the bulk-copy size rule)";
  } else if (!Aligned(g.x) || !Aligned(g.out) || (op != GatherOp::kGather && !Aligned(g.slabs))) {
    m << "a buffer is not 16-B aligned (x at " << g.x << ", output at "
      << static_cast<const void*>(g.out);
    if (op != GatherOp::kGather) m << ", updates at " << g.slabs;
    m << ")";
  } else if (op == GatherOp::kScatterAdd && !BulkAddSums(g.sum)) {
    m << "cp.reduce.async.bulk has no add for " << g.elem_bytes / g.components
      << "-byte integers (it adds 32/64-bit integers, f16, bf16, f32 and f64)";
  } else {
    return true;
  }
  if (why != nullptr) *why = m.str();
  return false;
}

BulkGatherTiling TileBulkGather(const GatherGeometry& g, int sm_count) {
  BulkGatherTiling t;
  const int64_t rows = g.rows();
  if (rows == 0 || g.slab_bytes == 0) return t;  // nothing to move: no units
  if (g.slab_bytes > kBulkGatherUnitBytes) {
    t.pieces = (g.slab_bytes + kBulkGatherUnitBytes - 1) / kBulkGatherUnitBytes;
    t.piece_bytes = kBulkGatherUnitBytes;
    t.unit_bytes = kBulkGatherUnitBytes;
    t.units = rows * t.pieces;
  } else {
    t.rows_per_unit = std::clamp<int64_t>(kBulkGatherUnitBytes / g.slab_bytes, 1,
                                          kBulkGatherMaxRowsPerUnit);
    t.unit_bytes = t.rows_per_unit * g.slab_bytes;
    t.units = (rows + t.rows_per_unit - 1) / t.rows_per_unit;
  }
  // One round of up to kMaxUnitsPerCta units per CTA; fewer where that
  // would leave SMs without a CTA. The block scheduler balances the rest.
  const int64_t sms = std::max(sm_count, 1);
  t.units_per_cta = std::clamp<int64_t>((t.units + sms - 1) / sms, 1, kMaxUnitsPerCta);
  t.blocks = (t.units + t.units_per_cta - 1) / t.units_per_cta;
  // Grids over 2^31 - 1 CTAs take longer rounds instead.
  while (t.blocks > 0x7fffffff) {
    t.units_per_cta *= 2;
    t.blocks = (t.units + t.units_per_cta - 1) / t.units_per_cta;
  }
  return t;
}

SimtGatherTiling TileSimtGather(const GatherGeometry& g, GatherOp op, int sm_count) {
  SimtGatherTiling t;
  // The widest vector dividing the slab size and every address it moves.
  const auto bits = static_cast<std::uintptr_t>(g.slab_bytes) |
                    reinterpret_cast<std::uintptr_t>(g.x) |
                    reinterpret_cast<std::uintptr_t>(g.out) |
                    (op == GatherOp::kGather ? 0 : reinterpret_cast<std::uintptr_t>(g.slabs));
  t.vector_bytes = 16;
  while (bits % t.vector_bytes != 0) t.vector_bytes /= 2;
  const int64_t rows = g.rows();
  if (rows == 0 || g.slab_bytes == 0) return t;  // nothing to move: no tiles
  t.vectors_per_row = g.slab_bytes / t.vector_bytes;
  constexpr int64_t kWarps = kSimtGatherThreads / 32;
  const int64_t wave = SimtWaveThreads(sm_count) / 32;  // warps
  // No overflow: rows * slab_bytes fits in 64 bits (DecodeSlabs).
  const int64_t vectors = rows * t.vectors_per_row;
  if (vectors <= wave * 32 || (t.vector_bytes == 16 && vectors <= 0x7fffffff)) {
    t.flat = true;
    t.tile_rows = t.segment = 1;
    t.segments = t.vectors_per_row;
    t.tiles = vectors;
    t.flat_threads = vectors <= wave * 32 && vectors >= int64_t{sm_count} * kSimtFlatWaveThreads
                         ? kSimtFlatWaveThreads
                         : kSimtFlatThreads;
    t.blocks = (t.tiles + t.flat_threads - 1) / t.flat_threads;
    t.per_row = FastDivisor::Of(static_cast<uint32_t>(t.vectors_per_row));
    t.narrow = g.batch == 1 && g.outer == 1 && g.table_rows <= 0x7fffffff &&
               g.table_rows * t.vectors_per_row <= 0xffffffff;
    return t;
  }
  t.segment = std::min(t.vectors_per_row, kSimtSegmentBytes / t.vector_bytes);
  t.tile_rows = std::min(rows, kSimtTileRows);
  // A call with fewer tiles than one resident wave has warps splits its
  // tiles, segments first (down to a vector a lane), then rows, until a
  // tile is one vector a lane: a warp's time is its loads in series.
  auto tiles = [&] {
    const int64_t segments = (t.vectors_per_row + t.segment - 1) / t.segment;
    return (rows + t.tile_rows - 1) / t.tile_rows * segments;
  };
  while (tiles() < wave && t.tile_rows * t.segment > 32) {
    if (t.segment > 32) {
      t.segment = (t.segment + 1) / 2;
    } else {
      t.tile_rows = (t.tile_rows + 1) / 2;
    }
  }
  t.segments = (t.vectors_per_row + t.segment - 1) / t.segment;
  t.tiles = tiles();
  // One resident wave of blocks, each warp looping over tiles; fewer where
  // the tiles run out first.
  t.blocks = std::clamp<int64_t>((t.tiles + kWarps - 1) / kWarps, 1, wave / kWarps);
  return t;
}

ffi::Error PlanGather(const GatherGeometry& g, GatherOp op, const DeviceInfo& info, int device,
                      GatherPlan* plan) {
  const bool has_tma = info.has_tma();
  const std::string_view name = OpName(op);
  if (op != GatherOp::kGather && g.deterministic) {
    if (g.method == Method::kTma) {
      return InvalidArgument(name, "deterministic=True applies updates in index order with the "
                             "SIMT kernel; method='tma' cannot (use method='auto' or 'simt')");
    }
    plan->path = GatherPath::kOrdered;
    return ffi::Error::Success();
  }
  std::string why;
  const bool fits = BulkGatherFits(g, op, &why);
  if (g.method == Method::kTma) {
    if (!has_tma) return InvalidArgument(name, info.NeedsTma("tma", device));
    if (!fits) return InvalidArgument(name, "method='tma' cannot move this call: ", why);
  }
  // "auto": see kAutoSimtMaxSlabBytes.
  const SimtGatherTiling simt = TileSimtGather(g, op, info.sm_count);
  const bool simt_wins =
      op == GatherOp::kScatterAdd
          ? VectorAddFits(g, simt) && info.cc_major >= 9
          : simt.flat && (g.slab_bytes <= kAutoSimtMaxSlabBytes ||
                          simt.tiles <= SimtWaveThreads(info.sm_count) ||
                          (op == GatherOp::kGather &&
                           g.rows() * g.slab_bytes <= kAutoSimtMaxGatherBytes));
  const bool bulk = g.method == Method::kTma ||
                    (g.method == Method::kAuto && has_tma && fits && !simt_wins);
  plan->path = bulk ? GatherPath::kTma : GatherPath::kSimt;
  if (bulk) {
    plan->bulk = TileBulkGather(g, info.sm_count);
  } else {
    plan->simt = simt;
  }
  return ffi::Error::Success();
}

bool FusesWith(const GatherGeometry& a, const GatherPlan& pa, const GatherGeometry& b,
               const GatherPlan& pb) {
  const bool same_geometry =
      a.method == b.method && a.batch == b.batch && a.outer == b.outer &&
      a.table_rows == b.table_rows && a.count == b.count && a.slab_bytes == b.slab_bytes &&
      a.elem_bytes == b.elem_bytes && a.index_kind == b.index_kind && a.indices == b.indices &&
      a.mode == b.mode && a.deterministic == b.deterministic && a.order == b.order &&
      a.order_64 == b.order_64 && a.sum == b.sum && a.components == b.components;
  if (!same_geometry || pa.path != pb.path) return false;
  switch (pa.path) {
    case GatherPath::kTma: {
      const BulkGatherTiling& s = pa.bulk;
      const BulkGatherTiling& t = pb.bulk;
      return s.rows_per_unit == t.rows_per_unit && s.pieces == t.pieces &&
             s.piece_bytes == t.piece_bytes && s.unit_bytes == t.unit_bytes &&
             s.units == t.units && s.units_per_cta == t.units_per_cta && s.blocks == t.blocks;
    }
    case GatherPath::kSimt: {
      const SimtGatherTiling& s = pa.simt;
      const SimtGatherTiling& t = pb.simt;
      return s.vector_bytes == t.vector_bytes && s.flat == t.flat && s.narrow == t.narrow &&
             s.vectors_per_row == t.vectors_per_row && s.tile_rows == t.tile_rows &&
             s.segment == t.segment && s.segments == t.segments && s.tiles == t.tiles &&
             s.flat_threads == t.flat_threads && s.blocks == t.blocks;
    }
    default: return true;
  }
}

ffi::Error PlanGatherCall(const GatherGeometry* gs, size_t n, bool scatter, const DeviceInfo& info,
                          int device, GatherCallPlan* plan) {
  plan->op = GatherOpOf(gs[0], scatter);
  for (size_t i = 0; i < n; ++i) {
    JAX_TMA_RETURN_IF_FAILED(gather_detail::ForTable(
        PlanGather(gs[i], plan->op, info, device, &plan->tables[i]), OpName(plan->op), i, n));
  }
  return ffi::Error::Success();
}

}  // namespace jax_tma
