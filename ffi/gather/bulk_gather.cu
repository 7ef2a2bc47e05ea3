// The TMA bulk gather/scatter: each CTA (one warp) streams its units through
// shared-memory stages with cp.async.bulk, several in flight.
// - gather: the lanes load the unit's slab rows (one bulk load each, from
//   wherever the indices point) into one stage and lane 0 stores the stage
//   to the output with one bulk store (the gathered rows are contiguous);
//   rows with an out-of-range index are filled in shared memory instead;
// - scatter: lane 0 loads the unit's contiguous updates with one bulk load
//   and the lanes store each row to its slab with a bulk store (set) or a
//   bulk reduce-add (add); dropped rows are skipped.
// Large slabs are moved in pieces of one unit each.
#include <algorithm>
#include <cstring>

#include "cuda/device_helpers.cuh"
#include "cuda/device_info.h"
#include "gather/gather_launch.h"

namespace jax_tma {
namespace {

constexpr int kThreads = 32;
constexpr int kRowsPerLane = static_cast<int>(kBulkGatherMaxRowsPerUnit / kThreads);
// A compile-time power of two: the stage of unit k and its phase are a mask
// and a shift (a runtime count cost 64-bit divisions on every unit).
constexpr unsigned kStages = kBulkGatherStages;
static_assert((kStages & (kStages - 1)) == 0, "stages must be a power of two");
constexpr int kMaxSmem = kStages * static_cast<int>(kBulkGatherUnitBytes);

struct BulkParams {
  GatherGeometry g;
  BulkGatherTiling t;
  GatherTables tables;
};

// Slab rows [row0, row0 + rows) of the output (gather) or the updates
// (scatter); with pieces, bytes [off, off + bytes) of slab row row0.
struct Unit {
  int64_t row0;
  int64_t rows;
  int64_t off;
  uint32_t row_bytes;  // bytes moved per row
};

__device__ __forceinline__ Unit UnitOf(const BulkParams& p, int64_t u) {
  Unit x;
  if (p.t.pieces > 1) {
    x.row0 = u / p.t.pieces;
    x.rows = 1;
    x.off = (u - x.row0 * p.t.pieces) * p.t.piece_bytes;
    x.row_bytes = static_cast<uint32_t>(min(p.t.piece_bytes, p.g.slab_bytes - x.off));
  } else {
    x.row0 = u * p.t.rows_per_unit;
    x.rows = min(p.t.rows_per_unit, p.g.rows() - x.row0);
    x.off = 0;
    x.row_bytes = static_cast<uint32_t>(p.g.slab_bytes);
  }
  return x;
}

template <GatherOp kOp, typename AddT>
__global__ void __launch_bounds__(kThreads) BulkGatherKernel(const __grid_constant__ BulkParams p) {
#if JAX_TMA_HAS_BULK_COPY
  using namespace device;
  extern __shared__ __align__(128) uint8_t stage_buf[];
  __shared__ uint64_t full[kStages];
  const GatherGeometry g = BlockTable(p.g, p.tables);
  const BulkGatherTiling& t = p.t;
  const int lane = static_cast<int>(threadIdx.x);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * t.units_per_cta;
  const auto n = static_cast<unsigned>(min(t.units_per_cta, t.units - first));  // < 2^31
  const int64_t s_bytes = g.slab_bytes;
  const auto* table = static_cast<const uint8_t*>(g.x);
  auto* out = static_cast<uint8_t*>(g.out);
  const auto* slabs = static_cast<const uint8_t*>(g.slabs);

  if (lane == 0) {
#pragma unroll
    for (unsigned s = 0; s < kStages; ++s) mbarrier_init(&full[s], 1);
    fence_mbarrier_init();
  }
  __syncwarp();
  auto stage = [&](unsigned k) { return stage_buf + (k % kStages) * t.unit_bytes; };

  auto load = [&](unsigned k) {
    const Unit u = UnitOf(p, first + k);
    uint64_t* bar = &full[k % kStages];
    uint8_t* buf = stage(k);
    if constexpr (kOp == GatherOp::kGather) {
      int64_t src[kRowsPerLane];
      unsigned fill[kRowsPerLane];
      uint32_t bytes = 0;
      for (int i = 0; i < kRowsPerLane; ++i) {
        const int64_t j = lane + i * kThreads;
        src[i] = j < u.rows ? g.TableRow(u.row0 + j) : -1;
        bytes += __popc(__ballot_sync(~0u, src[i] >= 0)) * u.row_bytes;
        fill[i] = __ballot_sync(~0u, j < u.rows && src[i] < 0);
      }
      // The stage's one arrival carries every byte its loads will bring.
      if (lane == 0) expect_tx(bar, bytes);
      __syncwarp();
      for (int i = 0; i < kRowsPerLane; ++i) {
        if (src[i] >= 0) {
          bulk_load(buf + (lane + i * kThreads) * s_bytes, table + src[i] * s_bytes + u.off,
                    u.row_bytes, bar);
        }
      }
      // Rows of out-of-range indices get the fill (a kernel parameter) here;
      // a unit without one skips the proxy fence.
      bool filled = false;
      for (int i = 0; i < kRowsPerLane; ++i) filled = filled || fill[i] != 0;  // warp-uniform
      if (filled) {
        const uint4 pattern = g.fill.At<uint4>(0);
        for (int i = 0; i < kRowsPerLane; ++i) {
          for (unsigned m = fill[i]; m != 0; m &= m - 1) {
            uint8_t* row = buf + (__ffs(m) - 1 + i * kThreads) * s_bytes;
            for (uint32_t o = lane * 16; o < u.row_bytes; o += kThreads * 16) {
              *reinterpret_cast<uint4*>(row + o) = pattern;
            }
          }
        }
        // The bulk store that reads these rows is issued after this (in
        // program order, past the warp barrier).
        fence_proxy_async_shared();
      }
      __syncwarp();
    } else {
      if (lane == 0) {
        const uint32_t bytes = static_cast<uint32_t>(u.rows) * u.row_bytes;
        expect_tx(bar, bytes);
        bulk_load(buf, slabs + u.row0 * s_bytes + u.off, bytes, bar);
      }
    }
  };

  auto store = [&](unsigned k) {
    const Unit u = UnitOf(p, first + k);
    const uint8_t* buf = stage(k);
    if constexpr (kOp == GatherOp::kGather) {
      if (lane == 0) {
        bulk_store(out + u.row0 * s_bytes + u.off, buf,
                   static_cast<uint32_t>(u.rows) * u.row_bytes);
      }
    } else {
      for (int64_t j = lane; j < u.rows; j += kThreads) {
        const int64_t dst = g.TableRow(u.row0 + j);
        if (dst < 0) continue;
        uint8_t* d = out + dst * s_bytes + u.off;
        if constexpr (kOp == GatherOp::kScatterSet) {
          bulk_store(d, buf + j * s_bytes, u.row_bytes);
        } else {
          bulk_reduce_add<AddT>(d, buf + j * s_bytes, u.row_bytes);
        }
      }
    }
    // Every lane closes one group per unit (empty for most in gather), so
    // the lanes' group counts stay in step.
    store_commit_group();
  };

#pragma unroll 1
  for (unsigned k = 0; k < kStages && k < n; ++k) load(k);
  for (unsigned k = 0; k < n; ++k) {
    mbarrier_wait(&full[k % kStages], (k / kStages) & 1);
    store(k);
    // Refill the previous unit's stage once its stores have read it (only
    // the group just committed may still read shared memory).
    if (k >= 1 && k - 1 + kStages < n) {
      store_wait_read<1>();
      __syncwarp();
      load(k - 1 + kStages);
    }
  }
  // Shared memory must outlive every store that reads it; the writes
  // themselves are complete when the grid is.
  store_wait_read<0>();
#endif
}

template <GatherOp kOp, typename AddT>
ffi::Error Launch(const BulkParams& p, cudaStream_t stream, int device) {
  static PerDevice<bool> smem_set;
  bool done = false;
  JAX_TMA_RETURN_IF_FAILED(smem_set.Get(
      device,
      [](int, bool* ok) {
        JAX_TMA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
            BulkGatherKernel<kOp, AddT>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
        *ok = true;
        return ffi::Error::Success();
      },
      &done));
  const size_t smem = size_t{kStages} * static_cast<size_t>(p.t.unit_bytes);
  const dim3 grid(static_cast<unsigned>(p.t.blocks), static_cast<unsigned>(p.tables.count));
  BulkGatherKernel<kOp, AddT><<<grid, kThreads, smem, stream>>>(p);
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ffi::Error::Success();
}

}  // namespace

ffi::Error LaunchBulkGather(const GatherGeometry& g, const GatherTables& tables, GatherOp op,
                            const BulkGatherTiling& t, cudaStream_t stream, int device) {
  if (t.units == 0) return ffi::Error::Success();
  JAX_TMA_RETURN_IF_FAILED(CheckTables(op == GatherOp::kGather ? kGatherOp : kScatterOp, tables));
  if (t.unit_bytes <= 0 || t.unit_bytes > kBulkGatherUnitBytes ||
      t.rows_per_unit > kBulkGatherMaxRowsPerUnit || t.blocks <= 0 || t.blocks > 0x7fffffff ||
      t.units_per_cta <= 0 || t.units_per_cta > 0x7fffffff) {
    return InvalidArgument(op == GatherOp::kGather ? kGatherOp : kScatterOp,
                           "bad bulk tiling: unit ", t.unit_bytes, " B, rows per unit ",
                           t.rows_per_unit, ", ", t.units_per_cta, " units a CTA, ", t.blocks,
                           " CTAs");
  }
  const BulkParams p{g, t, tables};
  switch (op) {
    case GatherOp::kGather: return Launch<GatherOp::kGather, void>(p, stream, device);
    case GatherOp::kScatterSet: return Launch<GatherOp::kScatterSet, void>(p, stream, device);
    default: break;
  }
  switch (g.sum) {
    case SumKind::kU32: return Launch<GatherOp::kScatterAdd, uint32_t>(p, stream, device);
    case SumKind::kU64: return Launch<GatherOp::kScatterAdd, uint64_t>(p, stream, device);
    case SumKind::kF16: return Launch<GatherOp::kScatterAdd, __half>(p, stream, device);
    case SumKind::kBF16: return Launch<GatherOp::kScatterAdd, __nv_bfloat16>(p, stream, device);
    case SumKind::kF32: return Launch<GatherOp::kScatterAdd, float>(p, stream, device);
    case SumKind::kF64: return Launch<GatherOp::kScatterAdd, double>(p, stream, device);
    default:
      return InvalidArgument(kScatterOp, "the bulk path has no add for ", g.elem_bytes,
                             "-byte elements");
  }
}

}  // namespace jax_tma
