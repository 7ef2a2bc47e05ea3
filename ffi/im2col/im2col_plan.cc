// Host rules of jax_tma.im2col's CUDA path (see im2col_plan.h).
#include "im2col/im2col_plan.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/launch.h"

namespace jax_tma {

bool PlanTmaIm2col(const Im2colGeometry& g, const void* x, const void* out, TmaIm2colPlan* p,
                   std::string* why) {
  if (g.transpose) return Reject(why, "col2im has no TMA path");
  if (g.channel_major) return Reject(why, kIm2colTmaChannelMajor);
  if (g.batch == 0 || g.out_pixels == 0 || g.channels == 0) {
    p->empty = true;
    return true;
  }
  const int r = g.rank;
  const int tensor_rank = r + 2;
  const int64_t eb = g.elem_bytes;
  if (eb != 1 && eb != 2 && eb != 4 && eb != 8 && eb != 16) {
    return Reject(why, "element size ", eb, " B has no TMA data type");
  }
  // complex128 moves as two 8-byte elements per channel.
  const int64_t e = std::min<int64_t>(eb, 8);
  const int64_t ch = g.channels * (eb / e);
  if ((g.channels * eb) % kTensorMapAlign != 0) {
    return Reject(why, "a pixel's channels (", g.channels, " x ", eb, " B = ", g.channels * eb,
                  " B) are not a multiple of 16 B");
  }
  const int32_t corner = Im2colCornerMax(tensor_rank);
  for (int d = 0; d < r; ++d) {
    if (g.strides[d] > static_cast<int64_t>(kMaxTensorMapElementStride)) {
      return Reject(why, "strides[", d, "] = ", g.strides[d],
                    " is over the hardware's traversal-stride limit ", kMaxTensorMapElementStride);
    }
    if (g.pad_lo[d] > corner + 1) {
      return Reject(why, "padding low ", g.pad_lo[d], " of spatial dim ", d,
                    " is over the hardware's pixel-box corner limit ", corner + 1, " for a rank-",
                    tensor_rank, " input");
    }
    const int64_t span = g.dilation[d] * (g.kernel[d] - 1);
    const int64_t upper = g.pad_hi[d] - span;
    if (upper < -corner - 1 || upper > corner) {
      return Reject(why, "padding high ", g.pad_hi[d], " minus the kernel's dilated extent ", span,
                    " along spatial dim ", d, " (", upper,
                    ") is outside the hardware's pixel-box corner range [", -corner - 1, ", ",
                    corner, "] for a rank-", tensor_rank, " input");
    }
    if (span > corner) {
      return Reject(why, "the kernel's dilated extent ", span, " along spatial dim ", d,
                    " is over the hardware's im2col offset limit ", corner, " for a rank-",
                    tensor_rank, " input");
    }
  }
  for (int d = 0; d < r; ++d) {
    if (g.in_dims[d] + g.pad_lo[d] > kMaxIm2colCoord) {
      return Reject(why, "spatial dim ", d, " = ", g.in_dims[d],
                    " plus its low padding is over the int32 coordinate range");
    }
  }
  const int64_t rows = g.batch * g.out_pixels;
  if (rows > kMaxIm2colCoord || g.taps * ch > kMaxIm2colCoord) {
    return Reject(why, "the patch matrix (", rows, " x ", g.taps * ch,
                  " tensor-map elements) is over the int32 coordinate range");
  }
  if (reinterpret_cast<std::uintptr_t>(x) % kTensorMapAlign != 0) {
    return Reject(why, "x address is not 16-B aligned");
  }
  if (reinterpret_cast<std::uintptr_t>(out) % kTensorMapAlign != 0) {
    return Reject(why, "output address is not 16-B aligned");
  }

  // Channel chunk: the largest divisor of the channel run up to 256
  // elements and 256 B (a whole number of 16 B), so that chunks tile the
  // run exactly (a partial chunk would write into the next tap's columns).
  const int64_t q = static_cast<int64_t>(kTensorMapAlign) / e;
  int64_t chunk = q;
  for (int64_t c = std::min<int64_t>(ch, 256 / e); c >= q; c -= q) {
    if (ch % c == 0) {
      chunk = c;
      break;
    }
  }
  const int64_t pixels =
      std::clamp<int64_t>(kTmaIm2colStageBudget / (chunk * e), 1, kMaxTensorMapBox);

  Im2colMapSpec& im = p->in;
  im = Im2colMapSpec{};
  im.type = UnsignedTensorMapType(static_cast<int>(e));
  im.rank = tensor_rank;
  im.address = x;
  im.dims[0] = static_cast<uint64_t>(ch);
  int64_t pitch = ch * e;
  for (int i = 1; i <= r; ++i) {
    const int d = r - i;  // spatial dims innermost first
    im.dims[i] = static_cast<uint64_t>(g.in_dims[d]);
    im.byte_strides[i - 1] = static_cast<uint64_t>(pitch);
    pitch *= g.in_dims[d];
    im.lower_corner[i - 1] = static_cast<int32_t>(-g.pad_lo[d]);
    im.upper_corner[i - 1] =
        static_cast<int32_t>(g.pad_hi[d] - g.dilation[d] * (g.kernel[d] - 1));
    im.elem_strides[i] = static_cast<uint32_t>(g.strides[d]);
  }
  im.dims[r + 1] = static_cast<uint64_t>(g.batch);
  im.byte_strides[r] = static_cast<uint64_t>(pitch);
  im.elem_strides[0] = 1;
  im.elem_strides[r + 1] = 1;
  im.channels_per_pixel = static_cast<uint32_t>(chunk);
  im.pixels_per_column = static_cast<uint32_t>(pixels);

  TiledMapSpec& om = p->out;
  om = TiledMapSpec{};
  om.type = im.type;
  om.rank = 2;
  om.address = out;
  om.dims[0] = static_cast<uint64_t>(g.taps * ch);
  om.dims[1] = static_cast<uint64_t>(rows);
  om.byte_strides[0] = static_cast<uint64_t>(g.taps * ch * e);
  om.box[0] = static_cast<uint32_t>(chunk);
  om.box[1] = static_cast<uint32_t>(pixels);
  om.elem_strides[0] = om.elem_strides[1] = 1;

  TmaIm2colArgs& a = p->args;
  a = TmaIm2colArgs{};
  a.taps = g.taps;
  a.chunks = ch / chunk;
  a.chunk = static_cast<int32_t>(chunk);
  a.channels = static_cast<int32_t>(ch);
  a.pixels = static_cast<int32_t>(pixels);
  a.job_bytes = static_cast<uint32_t>(pixels * chunk * e);
  a.stage_bytes = RoundUpToTileAlign(a.job_bytes);
  a.out_pixels = g.out_pixels;
  a.total_jobs = (rows + pixels - 1) / pixels * a.chunks * a.taps;
  for (int d = 0; d < r; ++d) {
    a.out_dims[d] = static_cast<int32_t>(g.out_dims[d]);
    a.strides[d] = static_cast<int32_t>(g.strides[d]);
    a.pad_lo[d] = static_cast<int32_t>(g.pad_lo[d]);
    a.kernel[d] = static_cast<int32_t>(g.kernel[d]);
    a.dilation[d] = static_cast<int32_t>(g.dilation[d]);
  }

  // The rules above imply the driver's; re-check so Fits and the encoder
  // never disagree.
  std::string broken = CheckIm2colMap(im);
  if (broken.empty()) broken = CheckTiledMap(om);
  if (!broken.empty()) return Reject(why, "tensor-map rule broken: ", broken);
  return true;
}


bool TmaIm2colFits(const Im2colGeometry& g, const void* x, const void* out, std::string* why) {
  TmaIm2colPlan plan;
  return PlanTmaIm2col(g, x, out, &plan, why);
}

void PlanTmaIm2colGrid(const DeviceInfo& info, TmaIm2colPlan* p) {
  TmaIm2colArgs& a = p->args;
  p->smem = SmemWithAlignSlack(int64_t{kTmaIm2colStages} * a.stage_bytes);
  const WorkSplit split = SplitWork(a.total_jobs, ResidentCtas(info, p->smem), INT64_MAX);
  a.jobs_per_cta = split.per_cta;
  p->blocks = split.blocks;
}

ffi::Error PlanIm2col(const Im2colGeometry& g, Method method, const DeviceInfo& info, int device,
                      const void* x, const void* out, Im2colPlan* plan) {
  plan->kernel = Im2colKernel::kSimt;
  if (g.transpose || method != Method::kTma) return ffi::Error::Success();
  if (!info.has_tma()) return InvalidArgument(kIm2colOp, info.NeedsTma("tma", device));
  std::string rule;
  if (!PlanTmaIm2col(g, x, out, &plan->tma, &rule)) {
    return InvalidArgument(kIm2colOp, "method='tma' cannot run this im2col: ", rule);
  }
  if (!plan->tma.empty) PlanTmaIm2colGrid(info, &plan->tma);
  plan->kernel = Im2colKernel::kTma;
  return ffi::Error::Success();
}

bool PlanStagedIm2col(const Im2colGeometry& g, int64_t run, StagedIm2colArgs* a) {
  const int last = g.rank - 1;
  const int64_t inner = g.out_dims[last];
  if (g.transpose || g.channel_major || inner == 0 || g.batch == 0) return false;
  if (run % 2 == 0 || g.kernel[last] <= g.strides[last]) return false;
  if (g.taps > kStagedIm2colSmem || run > kStagedIm2colSmem / 16) return false;  // no overflow
  const int64_t rows = g.taps / g.kernel[last];
  const int64_t reach = (g.kernel[last] - 1) * g.dilation[last] + 1;  // one pixel's span
  const int64_t pixel_bytes = rows * run * 16;
  // The widest tile: (tile - 1) * stride + reach staged pixels a row.
  if (reach > kStagedIm2colSmem / pixel_bytes) return false;
  int64_t tile = (kStagedIm2colSmem / pixel_bytes - reach) / g.strides[last] + 1;
  tile = std::min(tile, inner);
  // A tile's output units index a uint32 below FastDivisor's limit.
  tile = std::min(tile, (static_cast<int64_t>(kFastDivisorLimit) - 1) / (g.taps * run));
  if (tile < 1) return false;
  const int64_t span = (tile - 1) * g.strides[last] + reach;
  a->run = static_cast<uint32_t>(run);
  a->rows = static_cast<uint32_t>(rows);
  a->span = static_cast<uint32_t>(span);
  a->tile_pixels = static_cast<uint32_t>(tile);
  a->tiles_per_row = (inner + tile - 1) / tile;
  a->tiles = g.batch * (g.out_pixels / inner) * a->tiles_per_row;
  a->smem = static_cast<uint32_t>(rows * span * run * 16);
  a->by_run = FastDivisor::Of(a->run);
  a->by_span = FastDivisor::Of(a->span);
  a->by_patch_row = FastDivisor::Of(static_cast<uint32_t>(g.taps * run));
  a->by_inner_kernel = FastDivisor::Of(static_cast<uint32_t>(g.kernel[last]));
  a->by_kernel1 = FastDivisor::Of(static_cast<uint32_t>(g.rank == 3 ? g.kernel[1] : 1));
  return true;
}

}  // namespace jax_tma
