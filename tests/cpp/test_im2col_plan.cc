// jax_tma.im2col's host rules (ffi/im2col/im2col_plan.h): an im2col that fits
// the TMA kernel against each rule that rejects one (with its reason), the
// channel chunks and jobs chosen (chunks tile a pixel's channel run exactly),
// the grid on an H100, and the kernel each method gets.
#include <cstdint>
#include <string>
#include <vector>

#include "check.h"
#include "im2col/im2col_plan.h"

namespace jax_tma {
namespace {

const void* const kAligned = reinterpret_cast<const void*>(std::uintptr_t{1} << 20);
void* const kAlignedOut = reinterpret_cast<void*>(std::uintptr_t{1} << 21);
const DeviceInfo kH100{9, 0, 132, 232448, 233472};
const DeviceInfo kA100{8, 0, 108, 166912, 167936};

struct Conv {
  std::vector<int64_t> kernel;
  std::vector<int64_t> strides;
  std::vector<int64_t> dilation;
  std::vector<int64_t> pad_lo;
  std::vector<int64_t> pad_hi;
};

// The geometry DecodeIm2col would build for channels-last x of shape
// (batch, *spatial, channels) with elements of `eb` bytes.
Im2colGeometry Im2col(int64_t batch, std::vector<int64_t> spatial, int64_t channels, int64_t eb,
                      const Conv& c) {
  Im2colGeometry g;
  g.rank = static_cast<int>(spatial.size());
  g.batch = batch;
  g.channels = channels;
  g.elem_bytes = eb;
  for (int d = 0; d < g.rank; ++d) {
    g.in_dims[d] = spatial[d];
    g.kernel[d] = c.kernel[d];
    g.strides[d] = c.strides[d];
    g.dilation[d] = c.dilation[d];
    g.pad_lo[d] = c.pad_lo[d];
    g.pad_hi[d] = c.pad_hi[d];
    g.out_dims[d] = Im2colOutDim(spatial[d], c.pad_lo[d], c.pad_hi[d], c.kernel[d],
                                 c.strides[d], c.dilation[d]);
    g.taps *= c.kernel[d];
    g.in_pixels *= spatial[d];
    g.out_pixels *= g.out_dims[d];
  }
  return g;
}

const Conv k3x3{{3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}};

std::string Why(const Im2colGeometry& g, const void* x = kAligned, const void* out = kAlignedOut) {
  std::string why;
  TmaIm2colPlan plan;
  return PlanTmaIm2col(g, x, out, &plan, &why) ? "fits" : why;
}

void TestFittingIm2col() {
  // (2, 16, 16, 64) bf16, 3x3, padding 1: one 128-B channel run per pixel is
  // one chunk; 16 KiB stages hold 128 pixels of it.
  const Im2colGeometry g = Im2col(2, {16, 16}, 64, 2, k3x3);
  TmaIm2colPlan p;
  std::string why;
  CHECK(PlanTmaIm2col(g, kAligned, kAlignedOut, &p, &why));
  CHECK(!p.empty);
  CHECK_EQ(p.args.chunk, 64);
  CHECK_EQ(p.args.chunks, int64_t{1});
  CHECK_EQ(p.args.pixels, 128);
  CHECK_EQ(p.args.job_bytes, 128u * 64 * 2);
  CHECK_EQ(p.args.taps, int64_t{9});
  CHECK_EQ(p.args.total_jobs, int64_t{(2 * 256 / 128) * 9});
  CHECK_EQ(p.in.rank, 4);
  CHECK_EQ(p.in.lower_corner[0], -1);
  CHECK_EQ(p.in.upper_corner[0], -1);  // pad_hi 1 minus the dilated extent 2
  CHECK_EQ(p.in.channels_per_pixel, 64u);
  CHECK_EQ(p.in.pixels_per_column, 128u);
  CHECK_EQ(p.out.rank, 2);
  CHECK_EQ(p.out.dims[0], uint64_t{9 * 64});
  CHECK_EQ(p.out.dims[1], uint64_t{2 * 256});
  CHECK(TmaIm2colFits(g, kAligned, kAlignedOut, nullptr));
}

void TestChannelChunks() {
  // The largest divisor of the run up to 256 B: a partial chunk would write
  // into the next tap's columns.
  TmaIm2colPlan p;
  CHECK(PlanTmaIm2col(Im2col(1, {8, 8}, 200, 2, k3x3), kAligned, kAlignedOut, &p, nullptr));
  CHECK_EQ(p.args.chunk, 40);  // 200 = 5 x 40 bf16; no divisor in (40, 128] is 16-B whole
  CHECK_EQ(p.args.chunks, int64_t{5});
  CHECK_EQ(p.args.pixels, 16384 / 80);
  CHECK(PlanTmaIm2col(Im2col(1, {8, 8}, 384, 4, k3x3), kAligned, kAlignedOut, &p, nullptr));
  CHECK_EQ(p.args.chunk, 64);  // 256 B of f32
  CHECK_EQ(p.args.chunks, int64_t{6});
  // Small runs: pixels per job capped at the 256-element box.
  CHECK(PlanTmaIm2col(Im2col(1, {32, 32}, 4, 4, k3x3), kAligned, kAlignedOut, &p, nullptr));
  CHECK_EQ(p.args.chunk, 4);
  CHECK_EQ(p.args.pixels, 256);
  // complex128 moves as two 8-byte elements per channel.
  CHECK(PlanTmaIm2col(Im2col(1, {8, 8}, 3, 16, k3x3), kAligned, kAlignedOut, &p, nullptr));
  CHECK_EQ(p.args.channels, 6);
  CHECK_EQ(p.args.chunk, 6);
  // 1D and 3D inputs use rank-3 and rank-5 maps.
  CHECK(PlanTmaIm2col(Im2col(1, {64}, 16, 4, {{5}, {2}, {1}, {2}, {2}}), kAligned, kAlignedOut,
                      &p, nullptr));
  CHECK_EQ(p.in.rank, 3);
  CHECK_EQ(p.in.elem_strides[1], 2u);
  CHECK(PlanTmaIm2col(Im2col(1, {4, 4, 4}, 16, 4, {{2, 2, 2}, {1, 1, 1}, {1, 1, 1}, {0, 0, 0},
                                                   {0, 0, 0}}),
                      kAligned, kAlignedOut, &p, nullptr));
  CHECK_EQ(p.in.rank, 5);
}

void TestEmptyFits() {
  TmaIm2colPlan p;
  CHECK(PlanTmaIm2col(Im2col(0, {8, 8}, 16, 4, k3x3), kAligned, kAlignedOut, &p, nullptr));
  CHECK(p.empty);
  // A dilated kernel larger than the padded input: no output pixels.
  CHECK(PlanTmaIm2col(Im2col(1, {2, 2}, 16, 4, {{5, 5}, {1, 1}, {1, 1}, {0, 0}, {0, 0}}),
                      kAligned, kAlignedOut, &p, nullptr));
  CHECK(p.empty);
}

void TestRules() {
  Im2colGeometry col2im = Im2col(1, {8, 8}, 16, 4, k3x3);
  col2im.transpose = true;
  CHECK_EQ(Why(col2im), "col2im has no TMA path");
  Im2colGeometry channel_major = Im2col(1, {8, 8}, 16, 4, k3x3);
  channel_major.channel_major = true;
  CHECK_EQ(Why(channel_major),
           "order='channel_major' has no TMA path (the hardware moves whole channel runs; "
           "use order='tap_major')");
  CHECK_EQ(Why(Im2col(1, {8, 8}, 3, 4, k3x3)),
           "a pixel's channels (3 x 4 B = 12 B) are not a multiple of 16 B");
  CHECK_EQ(Why(Im2col(1, {64, 64}, 16, 4, {{3, 3}, {9, 1}, {1, 1}, {0, 0}, {0, 0}})),
           "strides[0] = 9 is over the hardware's traversal-stride limit 8");
  // Rank-5 maps (3D inputs) have pixel-box corners in [-16, 15].
  const Conv deep_pad{{3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {17, 0, 0}, {0, 0, 0}};
  CHECK_EQ(Why(Im2col(1, {40, 8, 8}, 16, 4, deep_pad)),
           "padding low 17 of spatial dim 0 is over the hardware's pixel-box corner limit 16 "
           "for a rank-5 input");
  const Conv high_pad{{3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, {0, 20, 0}};
  CHECK_EQ(Why(Im2col(1, {8, 40, 8}, 16, 4, high_pad)),
           "padding high 20 minus the kernel's dilated extent 2 along spatial dim 1 (18) is "
           "outside the hardware's pixel-box corner range [-16, 15] for a rank-5 input");
  const Conv wide{{3, 3, 3}, {1, 1, 1}, {1, 1, 9}, {0, 0, 0}, {0, 0, 18}};
  CHECK_EQ(Why(Im2col(1, {8, 8, 40}, 16, 4, wide)),
           "the kernel's dilated extent 18 along spatial dim 2 is over the hardware's im2col "
           "offset limit 15 for a rank-5 input");
  // Rank-4 maps (2D inputs) allow corners in [-128, 127].
  const Conv pad_128{{3, 3}, {1, 1}, {1, 1}, {128, 0}, {0, 0}};
  CHECK_EQ(Why(Im2col(1, {8, 8}, 16, 4, pad_128)), "fits");
  const Conv pad_129{{3, 3}, {1, 1}, {1, 1}, {129, 0}, {0, 0}};
  CHECK(Why(Im2col(1, {8, 8}, 16, 4, pad_129)) != "fits");
  CHECK_EQ(Why(Im2col(1, {int64_t{1} << 31, 1}, 16, 1, {{1, 1}, {1, 1}, {1, 1}, {1, 0}, {0, 0}})),
           "spatial dim 0 = 2147483648 plus its low padding is over the int32 coordinate range");
  CHECK_EQ(Why(Im2col(1 << 16, {1 << 8, 1 << 8}, 16, 1, {{1, 1}, {1, 1}, {1, 1}, {0, 0}, {0, 0}})),
           "the patch matrix (4294967296 x 16 tensor-map elements) is over the int32 coordinate "
           "range");
  const Im2colGeometry ok = Im2col(1, {8, 8}, 16, 4, k3x3);
  const auto* off = static_cast<const char*>(kAligned) + 4;
  CHECK_EQ(Why(ok, off), "x address is not 16-B aligned");
  CHECK_EQ(Why(ok, kAligned, off), "output address is not 16-B aligned");
}

void TestGrid() {
  // 4 x 16 KiB stages: three CTAs per H100 SM; 36 jobs, one per CTA.
  TmaIm2colPlan p;
  CHECK(PlanTmaIm2col(Im2col(2, {16, 16}, 64, 2, k3x3), kAligned, kAlignedOut, &p, nullptr));
  PlanTmaIm2colGrid(kH100, &p);
  CHECK_EQ(p.smem, 4 * 16384 + 128);
  CHECK_EQ(p.args.jobs_per_cta, int64_t{1});
  CHECK_EQ(p.blocks, int64_t{36});
  // (64, 56, 56, 64) bf16: 3136 x 64 pixels in jobs of 128, 9 taps, spread
  // over 396 resident CTAs.
  CHECK(PlanTmaIm2col(Im2col(64, {56, 56}, 64, 2, k3x3), kAligned, kAlignedOut, &p, nullptr));
  PlanTmaIm2colGrid(kH100, &p);
  CHECK_EQ(p.args.total_jobs, int64_t{1568 * 9});
  CHECK_EQ(p.args.jobs_per_cta, int64_t{36});
  CHECK_EQ(p.blocks, int64_t{392});
}

void TestKernelChoice() {
  const Im2colGeometry ok = Im2col(2, {16, 16}, 64, 2, k3x3);
  Im2colPlan p;
  // auto always takes SIMT; TMA only where asked.
  CHECK(PlanIm2col(ok, Method::kAuto, kH100, 0, kAligned, kAlignedOut, &p).success());
  CHECK(p.kernel == Im2colKernel::kSimt);
  CHECK(PlanIm2col(ok, Method::kTma, kH100, 0, kAligned, kAlignedOut, &p).success());
  CHECK(p.kernel == Im2colKernel::kTma);
  CHECK(p.tma.blocks > 0);  // the grid is planned too
  CHECK(PlanIm2col(ok, Method::kSimt, kH100, 0, kAligned, kAlignedOut, &p).success());
  CHECK(p.kernel == Im2colKernel::kSimt);
  Im2colGeometry col2im = ok;
  col2im.transpose = true;
  CHECK(PlanIm2col(col2im, Method::kTma, kH100, 0, kAligned, kAlignedOut, &p).success());
  CHECK(p.kernel == Im2colKernel::kSimt);
  ffi::Error err = PlanIm2col(Im2col(1, {8, 8}, 3, 4, k3x3), Method::kTma, kH100, 0, kAligned,
                              kAlignedOut, &p);
  CHECK_EQ(err.message(), "jax_tma.im2col: method='tma' cannot run this im2col: a pixel's "
                          "channels (3 x 4 B = 12 B) are not a multiple of 16 B");
  err = PlanIm2col(ok, Method::kTma, kA100, 1, kAligned, kAlignedOut, &p);
  CHECK_EQ(err.message(), "jax_tma.im2col: method='tma' needs TMA, but device 1 has compute "
                          "capability 8.0 (TMA needs >= 9.0); use method='auto' or 'simt'");
}

// The staged SIMT kernel's tiles: the widest whose staged rows (one per tap
// of the outer kernel dims) fit kStagedIm2colSmem, at most a row; only where
// a pixel's channels are not whole 32-B sectors and the row's taps overlap.
void TestStagedTiles() {
  StagedIm2colArgs a;
  // (16, 224, 224, 4) f32: one 16-B unit a pixel, a whole row a tile.
  CHECK(PlanStagedIm2col(Im2col(16, {224, 224}, 4, 4, k3x3), 1, &a));
  CHECK_EQ(a.rows, 3u);
  CHECK_EQ(a.tile_pixels, 224u);
  CHECK_EQ(a.span, 226u);
  CHECK_EQ(a.tiles_per_row, 1);
  CHECK_EQ(a.tiles, 16 * 224);
  CHECK_EQ(a.smem, 3u * 226 * 16);
  // 48 B a pixel: 16384 / (3 * 48) = 113 staged pixels, tiles of 111 of 300 (3 a row).
  CHECK(PlanStagedIm2col(Im2col(2, {8, 300}, 12, 4, k3x3), 3, &a));
  CHECK_EQ(a.tile_pixels, 111u);
  CHECK_EQ(a.span, 113u);
  CHECK_EQ(a.tiles_per_row, 3);
  CHECK_EQ(a.tiles, 2 * 8 * 3);
  // Stride 2 and dilation 2 along the row: (tile - 1) * 2 + 5 staged pixels.
  const Conv strided{{3, 3}, {1, 2}, {1, 2}, {2, 2}, {2, 2}};
  CHECK(PlanStagedIm2col(Im2col(2, {8, 300}, 12, 4, strided), 3, &a));
  CHECK_EQ(a.tile_pixels, 55u);
  CHECK_EQ(a.span, 113u);
  // 3-D: a staged row per tap of the two outer dims.
  CHECK(PlanStagedIm2col(Im2col(1, {4, 4, 50}, 4, 4, {{3, 2, 3}, {1, 1, 1}, {1, 1, 1},
                                                      {1, 0, 1}, {1, 1, 1}}), 1, &a));
  CHECK_EQ(a.rows, 6u);
  CHECK_EQ(a.tile_pixels, 50u);
  // Whole sectors a pixel, no overlap along the row, or not one pixel's rows.
  CHECK(!PlanStagedIm2col(Im2col(32, {28, 28}, 256, 2, k3x3), 32, &a));
  CHECK(!PlanStagedIm2col(Im2col(1, {8, 8}, 4, 4, {{3, 2}, {1, 2}, {1, 1}, {1, 0}, {1, 0}}), 1,
                          &a));
  CHECK(!PlanStagedIm2col(Im2col(1, {8, 8}, 4, 4, {{3, 1}, {1, 1}, {1, 1}, {1, 0}, {1, 0}}), 1,
                          &a));
  CHECK(!PlanStagedIm2col(Im2col(1, {8, 100}, 4092, 4, k3x3), 1023, &a));
  Im2colGeometry g = Im2col(1, {8, 8}, 4, 4, k3x3);
  g.channel_major = true;
  CHECK(!PlanStagedIm2col(g, 1, &a));
  g.channel_major = false;
  g.transpose = true;
  CHECK(!PlanStagedIm2col(g, 1, &a));
}

}  // namespace
}  // namespace jax_tma

int main() {
  jax_tma::TestFittingIm2col();
  jax_tma::TestChannelChunks();
  jax_tma::TestEmptyFits();
  jax_tma::TestRules();
  jax_tma::TestGrid();
  jax_tma::TestKernelChoice();
  jax_tma::TestStagedTiles();
  return jax_tma::testing::Failures("test_im2col_plan");
}
