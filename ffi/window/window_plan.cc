// Host rules of jax_tma.window's CUDA path (see window_plan.h).
#include "window/window_plan.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/launch.h"

namespace jax_tma {

bool PlanTiledWindow(const WindowGeometry& g, const void* src, const void* dst,
                     TiledWindowPlan* p, std::string* why) {
  const int r = g.rank;
  if (g.transpose) {
    return Reject(why, "the transpose has no TMA path");
  }
  if (r < 1) {
    return Reject(why, "rank ", r, " is below 1");
  }
  if (g.batch == 0 || g.dst_spatial == 0) {
    p->empty = true;
    return true;
  }
  const int64_t eb = g.elem_bytes;
  if (eb != 1 && eb != 2 && eb != 4 && eb != 8 && eb != 16) {
    return Reject(why, "element size ", eb, " B has no TMA data type");
  }
  // complex128 moves as two 8-byte elements along the innermost dim.
  const int64_t e = std::min<int64_t>(eb, 8);
  const int64_t k = eb / e;
  const int64_t q = static_cast<int64_t>(kTensorMapAlign) / e;
  const bool dst_batch = g.batch > 1;
  const bool src_batch = dst_batch && g.src_batched;
  const int src_rank = r + (src_batch ? 1 : 0);
  const int dst_rank = r + (dst_batch ? 1 : 0);
  if (r > kMaxTiledWindowRank) {
    return Reject(why, "rank ", r, " is over the hardware's ", kMaxTiledWindowRank);
  }
  if (std::max(src_rank, dst_rank) > kMaxTiledWindowRank) {
    return Reject(why, "rank ", r + 1, " (with the batch dim) is over the hardware's ",
                  kMaxTiledWindowRank);
  }
  if (g.strides[r - 1] != 1) {
    return Reject(why, "the innermost stride must be 1 for TMA (got ", g.strides[r - 1], ")");
  }
  for (int d = 0; d < r; ++d) {
    if (g.strides[d] > kMaxTensorMapElementStride) {
      return Reject(why, "strides[", d, "] = ", g.strides[d], " is over the hardware's ",
                    kMaxTensorMapElementStride);
    }
  }
  for (int d = 0; d < r; ++d) {
    const int64_t sd = g.src_dims[d];
    const bool inner = d == r - 1;
    if (sd == 0) {
      return Reject(why, "x dim ", d, " is 0: a tensor map cannot describe an empty input");
    }
    if (sd * (inner ? k : 1) > kMaxSrcMapDim) {
      const bool pairs = inner && k == 2;
      return Reject(why, "x dim ", d, " = ", sd, " is over 2^", pairs ? 29 : 30,
                    pairs ? " (complex128 moves as two 8-byte elements)" : "");
    }
    // Conservative: CCCL's encoder rejects element strides above the dim; the
    // driver documentation is silent about it.
    if (sd < g.strides[d]) {
      return Reject(why, "x dim ", d, " = ", sd, " is below strides[", d, "] = ", g.strides[d],
                    " (a TMA element stride may not exceed its dim)");
    }
  }
  if (dst_batch && g.batch > kMaxDstMapDim) {
    return Reject(why, "batch ", g.batch, " is over 2^31 - 1 (TMA coordinates are int32)");
  }
  if (g.dst_dims[r - 1] * k > kMaxDstMapDim) {
    return Reject(why, "window dim ", r - 1, " = ", g.dst_dims[r - 1],
                  " is over 2^30 (complex128 moves as two 8-byte elements)");
  }
  if (reinterpret_cast<std::uintptr_t>(src) % kTensorMapAlign != 0) {
    return Reject(why, "x address is not 16-B aligned");
  }
  if (reinterpret_cast<std::uintptr_t>(dst) % kTensorMapAlign != 0) {
    return Reject(why, "output address is not 16-B aligned");
  }

  // Tensor-map dims and byte strides, innermost first; the batch outermost.
  TiledMapSpec& sm = p->src;
  TiledMapSpec& dm = p->dst;
  sm = TiledMapSpec{};
  dm = TiledMapSpec{};
  sm.type = dm.type = UnsignedTensorMapType(static_cast<int>(e));
  sm.rank = src_rank;
  dm.rank = dst_rank;
  sm.address = src;
  dm.address = dst;
  int64_t dst_pitch = 1;  // window elements
  for (int i = 0; i < r; ++i) {
    const int d = r - 1 - i;
    sm.dims[i] = static_cast<uint64_t>(g.src_dims[d] * (i == 0 ? k : 1));
    dm.dims[i] = static_cast<uint64_t>(g.dst_dims[d] * (i == 0 ? k : 1));
    if (i > 0) {
      sm.byte_strides[i - 1] = static_cast<uint64_t>(g.src_pitch[d] * eb);
      dm.byte_strides[i - 1] = static_cast<uint64_t>(dst_pitch * eb);
    }
    dst_pitch *= g.dst_dims[d];
  }
  if (src_batch) {
    sm.dims[r] = static_cast<uint64_t>(g.batch);
    sm.byte_strides[r - 1] = static_cast<uint64_t>(g.src_spatial * eb);
  }
  if (dst_batch) {
    dm.dims[r] = static_cast<uint64_t>(g.batch);
    dm.byte_strides[r - 1] = static_cast<uint64_t>(g.dst_spatial * eb);
  }
  for (const TiledMapSpec* m : {&sm, &dm}) {
    for (int i = 1; i < m->rank; ++i) {
      const uint64_t st = m->byte_strides[i - 1];
      if (st % kTensorMapAlign == 0 && st < kTensorMapStrideLimit) continue;
      Message dim;
      if (i == r) {
        dim << "batch";
      } else if (i == 1) {
        dim << "row";
      } else {
        dim << "dim " << r - 1 - i;
      }
      return Reject(why, m == &sm ? "x " : "output ", dim.str(), " stride ", st, " B ",
                    st % kTensorMapAlign != 0 ? "is not a multiple of 16" : "is not below 2^40");
    }
  }

  // Tiles. Inner: up to 512 B, and at most 256 elements less 16 B so that
  // the wide box (tile + 16 B) stays within a box dim; split evenly and
  // rounded up to 16 B (512 B chosen over 256 B and 1 KiB with
  // benchmarks/bench_window.py). Outer dims, innermost first: as many rows as
  // the stage budget holds, each box dim (tile x stride) <= 256, split evenly.
  TiledWindowArgs& a = p->args;
  a = TiledWindowArgs{};
  const int64_t inner_max = std::min<int64_t>(kMaxTensorMapBox - q, 512 / e);
  const int64_t wm = g.dst_dims[r - 1] * k;
  const int64_t inner_splits = (wm + inner_max - 1) / inner_max;
  const int64_t t_inner = ((wm + inner_splits - 1) / inner_splits + q - 1) / q * q;
  const int64_t row_bytes = (t_inner + q) * e;  // one row of the wide box
  const int64_t max_rows = std::max<int64_t>(1, kTiledWindowStageBudget / row_bytes);
  a.tile[r - 1] = static_cast<int32_t>(t_inner);
  a.tile_step[r - 1] = static_cast<int32_t>(t_inner / k);
  a.ntiles[r - 1] = static_cast<int32_t>((wm + t_inner - 1) / t_inner);
  int64_t rows = 1;
  for (int d = r - 2; d >= 0; --d) {
    const int64_t cap = std::min<int64_t>(g.dst_dims[d], kMaxTensorMapBox / g.strides[d]);
    int64_t t = std::min(cap, std::max<int64_t>(1, max_rows / rows));
    const int64_t splits = (g.dst_dims[d] + t - 1) / t;
    t = (g.dst_dims[d] + splits - 1) / splits;
    a.tile[d] = static_cast<int32_t>(t);
    a.tile_step[d] = static_cast<int32_t>(t);
    a.ntiles[d] = static_cast<int32_t>(splits);
    rows *= t;
  }
  int64_t tiles = g.batch;
  for (int d = 0; d < r; ++d) {
    a.src_dim[d] = g.src_dims[d] * (d == r - 1 ? k : 1);
    a.stride[d] = static_cast<int32_t>(g.strides[d]);
    tiles *= a.ntiles[d];
  }
  a.starts = g.starts;
  a.fill = g.fill;
  a.patch_fill = !g.fill.zero();
  a.total_tiles = tiles;
  a.scale = static_cast<int32_t>(k);
  a.align_elems = static_cast<int32_t>(q);
  a.elem_bytes = static_cast<int32_t>(e);
  a.rows = static_cast<uint32_t>(rows);
  a.tile_bytes = static_cast<uint32_t>(rows * t_inner * e);
  a.wide_bytes = static_cast<uint32_t>(rows * row_bytes);
  a.stage_bytes = RoundUpToTileAlign(a.wide_bytes);

  // Boxes: the load box spans tile x stride elements and keeps every
  // stride-th (elementStrides); the hardware counts the tile's bytes.
  for (int i = 0; i < r; ++i) {
    const int d = r - 1 - i;
    sm.box[i] = static_cast<uint32_t>(a.tile[d] * (i == 0 ? 1 : a.stride[d]));
    sm.elem_strides[i] = static_cast<uint32_t>(i == 0 ? 1 : a.stride[d]);
    dm.box[i] = static_cast<uint32_t>(a.tile[d]);
    dm.elem_strides[i] = 1;
  }
  if (src_batch) sm.box[r] = sm.elem_strides[r] = 1;
  if (dst_batch) dm.box[r] = dm.elem_strides[r] = 1;
  p->wide = sm;
  p->wide.box[0] = static_cast<uint32_t>(t_inner + q);
  p->variant = src_batch ? 2 : (dst_batch ? 1 : 0);

  // Everything above implies the driver's rules; re-check them anyway so that
  // Fits and the encoder can never disagree.
  const std::string broken = CheckTiledMaps({&p->src, &p->wide, &p->dst});
  if (!broken.empty()) return Reject(why, "tensor-map rule broken: ", broken);
  return true;
}


bool TiledWindowFits(const WindowGeometry& g, const void* src, const void* dst,
                     std::string* why) {
  TiledWindowPlan plan;
  return PlanTiledWindow(g, src, dst, &plan, why);
}

bool PlanTiledWindowGrid(const DeviceInfo& info, TiledWindowPlan* p, std::string* why) {
  TiledWindowArgs& a = p->args;
  p->smem = SmemWithAlignSlack(int64_t{kTiledWindowStages} * a.stage_bytes);
  const WorkSplit split = SplitWork(a.total_tiles, ResidentCtas(info, p->smem), kMaxTilesPerCta);
  a.tiles_per_cta = split.per_cta;
  p->blocks = split.blocks;
  if (p->blocks > 0x7fffffff) {
    return Reject(why, "the window needs ", p->blocks, " CTAs, over the grid limit");
  }
  return true;
}

bool PlanVectorWindow(const WindowGeometry& g, const void* src, const void* dst,
                      VectorWindowArgs* args) {
  const int last = g.rank - 1;
  const int64_t row_bytes = g.dst_dims[last] * g.elem_bytes;
  const int64_t vectors = g.batch * g.dst_spatial * g.elem_bytes / 16;
  const auto misaligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 != 0; };
  const bool stride_fits = g.strides[last] == 1 || (g.strides[last] == 2 && g.elem_bytes < 16);
  if (g.transpose || !stride_fits || vectors == 0 || row_bytes % 16 != 0 ||
      vectors >= kFastDivisorLimit || misaligned(src) || misaligned(dst)) {
    return false;
  }
  args->vectors = static_cast<uint32_t>(vectors);
  args->vectors_per_row = static_cast<uint32_t>(row_bytes / 16);
  args->rows_per_batch = static_cast<uint32_t>(g.dst_spatial / g.dst_dims[last]);
  args->per_row = FastDivisor::Of(args->vectors_per_row);
  args->per_batch = FastDivisor::Of(args->rows_per_batch);
  for (int d = 0; d < last; ++d) {
    args->dims[d] = FastDivisor::Of(static_cast<uint32_t>(g.dst_dims[d]));
  }
  return true;
}

bool InnerStartAligned(const WindowGeometry& g, int64_t inner_start) {
  return inner_start != kUnknownStart &&
         (inner_start % kTmaAlignBytes) * g.elem_bytes % kTmaAlignBytes == 0;
}

ffi::Error PlanWindow(const WindowGeometry& g, Method method, int64_t inner_start,
                      const DeviceInfo& info, int device, const void* src, const void* dst,
                      WindowPlan* plan) {
  if (method != Method::kTma) {
    plan->kernel = PlanVectorWindow(g, src, dst, &plan->vector) ? WindowKernel::kVector
                                                                 : WindowKernel::kRows;
    if (method == Method::kSimt || plan->kernel == WindowKernel::kVector ||
        !InnerStartAligned(g, inner_start)) {
      return ffi::Error::Success();
    }
  }
  std::string rule;
  if (info.has_tma() && PlanTiledWindow(g, src, dst, &plan->tiled, &rule) &&
      (plan->tiled.empty || PlanTiledWindowGrid(info, &plan->tiled, &rule))) {
    plan->kernel = WindowKernel::kTiled;
    return ffi::Error::Success();
  }
  if (method != Method::kTma) return ffi::Error::Success();
  if (!info.has_tma()) return InvalidArgument(kWindowOp, info.NeedsTma("tma", device));
  return InvalidArgument(kWindowOp, "method='tma' cannot run this window: ", rule);
}

}  // namespace jax_tma
