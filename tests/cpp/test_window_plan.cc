// jax_tma.window's host rules (ffi/window/window_plan.h): a window that fits
// the TMA tiled kernel against each rule that rejects one (with its reason),
// the tiles and boxes chosen, the grid on an H100, and the kernel each method
// gets.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "check.h"
#include "window/window_plan.h"

namespace jax_tma {
namespace {

const void* const kAligned = reinterpret_cast<const void*>(std::uintptr_t{1} << 20);
void* const kAlignedOut = reinterpret_cast<void*>(std::uintptr_t{1} << 21);
const DeviceInfo kH100{9, 0, 132, 232448, 233472};
const DeviceInfo kA100{8, 0, 108, 166912, 167936};

// The geometry DecodeWindow would build for x of spatial shape `x` (with
// `batch` leading dims of that size when batched), a window of `shape` and
// `strides`, elements of `eb` bytes.
WindowGeometry Window(std::vector<int64_t> x, std::vector<int64_t> shape,
                      std::vector<int64_t> strides, int64_t eb, int64_t batch = 1,
                      bool src_batched = false) {
  WindowGeometry g;
  g.rank = static_cast<int>(x.size());
  g.batch = batch;
  g.src_batched = src_batched;
  g.elem_bytes = eb;
  for (int d = g.rank - 1; d >= 0; --d) {
    g.src_dims[d] = x[d];
    g.dst_dims[d] = shape[d];
    g.strides[d] = strides[d];
    g.src_pitch[d] = g.src_spatial;
    g.src_spatial *= x[d];
    g.dst_spatial *= shape[d];
  }
  return g;
}

std::string Why(const WindowGeometry& g, const void* src = kAligned,
                const void* dst = kAlignedOut) {
  std::string why;
  TiledWindowPlan plan;
  if (PlanTiledWindow(g, src, dst, &plan, &why)) return "fits";
  return why;
}

void TestFittingWindow() {
  // A 32 x 32 f32 window of a 64 x 64 array: one tile of 32 rows of 32
  // elements, loaded through a box 16 B wider per row for unaligned starts.
  const WindowGeometry g = Window({64, 64}, {32, 32}, {1, 1}, 4);
  TiledWindowPlan p;
  std::string why;
  CHECK(PlanTiledWindow(g, kAligned, kAlignedOut, &p, &why));
  CHECK_EQ(why, std::string());
  CHECK(!p.empty);
  CHECK_EQ(p.variant, 0);
  CHECK_EQ(p.src.rank, 2);
  CHECK_EQ(p.src.dims[0], uint64_t{64});
  CHECK_EQ(p.src.byte_strides[0], uint64_t{256});
  CHECK_EQ(p.src.box[0], 32u);
  CHECK_EQ(p.src.box[1], 32u);
  CHECK_EQ(p.wide.box[0], 36u);  // + 16 B of f32
  CHECK_EQ(p.dst.dims[0], uint64_t{32});
  CHECK_EQ(p.args.tile[0], 32);
  CHECK_EQ(p.args.tile[1], 32);
  CHECK_EQ(p.args.total_tiles, 1);
  CHECK_EQ(p.args.tile_bytes, 32u * 32 * 4);
  CHECK_EQ(p.args.wide_bytes, 32u * 36 * 4);
  CHECK_EQ(p.args.stage_bytes, 4608u);  // a multiple of 128
  CHECK_EQ(p.args.align_elems, 4);
  CHECK(!p.args.patch_fill);
  CHECK(TiledWindowFits(g, kAligned, kAlignedOut, nullptr));
}

void TestTiling() {
  // Inner tiles of at most 512 B split evenly; outer tiles as many rows as
  // the 32 KiB stage holds, each box dim (tile x stride) <= 256.
  TiledWindowPlan p;
  CHECK(PlanTiledWindow(Window({8192, 8192}, {4096, 4096}, {1, 1}, 4), kAligned, kAlignedOut,
                        &p, nullptr));
  CHECK_EQ(p.args.tile[1], 128);       // 512 B of f32
  CHECK_EQ(p.args.ntiles[1], 32);
  CHECK_EQ(p.args.tile[0], 62);        // 32 KiB / ((128 + 4) x 4 B) = 62 rows
  CHECK_EQ(p.args.ntiles[0], 67);
  CHECK_EQ(p.args.total_tiles, 32 * 67);
  CHECK_EQ(p.args.stage_bytes, 32768u);
  // Strided outer dims: the load box spans tile x stride <= 256 elements.
  TiledWindowPlan s;
  CHECK(PlanTiledWindow(Window({4096, 256}, {1000, 64}, {8, 1}, 2), kAligned, kAlignedOut, &s,
                        nullptr));
  CHECK_EQ(s.args.tile[0], 32);        // 256 / 8
  CHECK_EQ(s.src.box[1], 256u);
  CHECK_EQ(s.src.elem_strides[1], 8u);
  // complex128 moves as two 8-byte elements along the innermost dim.
  TiledWindowPlan c;
  CHECK(PlanTiledWindow(Window({16, 16}, {8, 8}, {1, 1}, 16), kAligned, kAlignedOut, &c, nullptr));
  CHECK_EQ(c.args.scale, 2);
  CHECK_EQ(c.src.dims[0], uint64_t{32});
  CHECK_EQ(c.args.tile[1], 16);
  CHECK_EQ(c.args.tile_step[1], 8);
  // Batch dims: in the output only (variant 1) or in both (variant 2).
  TiledWindowPlan b1;
  CHECK(PlanTiledWindow(Window({16, 16}, {8, 8}, {1, 1}, 4, 3), kAligned, kAlignedOut, &b1,
                        nullptr));
  CHECK_EQ(b1.variant, 1);
  CHECK_EQ(b1.dst.rank, 3);
  CHECK_EQ(b1.src.rank, 2);
  TiledWindowPlan b2;
  CHECK(PlanTiledWindow(Window({16, 16}, {8, 8}, {1, 1}, 4, 3, true), kAligned, kAlignedOut, &b2,
                        nullptr));
  CHECK_EQ(b2.variant, 2);
  CHECK_EQ(b2.src.dims[2], uint64_t{3});
  CHECK_EQ(b2.src.byte_strides[1], uint64_t{16 * 16 * 4});
  CHECK_EQ(b2.args.total_tiles, 3);
  // A non-zero fill is patched in shared memory.
  WindowGeometry nan = Window({64, 64}, {32, 32}, {1, 1}, 4);
  nan.fill.lo = nan.fill.hi = 0x7fc000007fc00000;
  TiledWindowPlan f;
  CHECK(PlanTiledWindow(nan, kAligned, kAlignedOut, &f, nullptr));
  CHECK(f.args.patch_fill);
}

void TestEmptyWindowFits() {
  TiledWindowPlan p;
  CHECK(PlanTiledWindow(Window({16, 16}, {0, 16}, {1, 1}, 4), kAligned, kAlignedOut, &p, nullptr));
  CHECK(p.empty);
}

void TestRules() {
  WindowGeometry transpose = Window({16, 16}, {8, 8}, {1, 1}, 4);
  transpose.transpose = true;
  CHECK_EQ(Why(transpose), "the transpose has no TMA path");
  CHECK_EQ(Why(Window({16, 16}, {8, 8}, {1, 1}, 32)), "element size 32 B has no TMA data type");
  CHECK_EQ(Why(Window({2, 2, 2, 2, 2, 16}, {1, 1, 1, 1, 1, 16}, {1, 1, 1, 1, 1, 1}, 4)),
           "rank 6 is over the hardware's 5");
  CHECK_EQ(Why(Window({2, 2, 2, 2, 16}, {1, 1, 1, 1, 16}, {1, 1, 1, 1, 1}, 4, 2)),
           "rank 6 (with the batch dim) is over the hardware's 5");
  CHECK_EQ(Why(Window({16, 16}, {8, 8}, {1, 2}, 4)),
           "the innermost stride must be 1 for TMA (got 2)");
  CHECK_EQ(Why(Window({100, 16}, {8, 8}, {9, 1}, 4)), "strides[0] = 9 is over the hardware's 8");
  CHECK_EQ(Why(Window({0, 16}, {8, 8}, {1, 1}, 4)),
           "x dim 0 is 0: a tensor map cannot describe an empty input");
  CHECK_EQ(Why(Window({2, (int64_t{1} << 30) + 16}, {1, 16}, {1, 1}, 1)),
           "x dim 1 = 1073741840 is over 2^30");
  CHECK_EQ(Why(Window({2, (int64_t{1} << 29) + 16}, {1, 16}, {1, 1}, 16)),
           "x dim 1 = 536870928 is over 2^29 (complex128 moves as two 8-byte elements)");
  CHECK_EQ(Why(Window({3, 16}, {1, 16}, {4, 1}, 4)),
           "x dim 0 = 3 is below strides[0] = 4 (a TMA element stride may not exceed its dim)");
  const WindowGeometry ok = Window({16, 16}, {8, 8}, {1, 1}, 4);
  const auto* off = static_cast<const char*>(kAligned) + 8;
  CHECK_EQ(Why(ok, off), "x address is not 16-B aligned");
  CHECK_EQ(Why(ok, kAligned, off), "output address is not 16-B aligned");
  CHECK_EQ(Why(Window({8, 18}, {4, 16}, {1, 1}, 1)), "x row stride 18 B is not a multiple of 16");
  CHECK_EQ(Why(Window({8, 32}, {4, 20}, {1, 1}, 1)),
           "output row stride 20 B is not a multiple of 16");
  CHECK_EQ(Why(Window({2, int64_t{1} << 21, int64_t{1} << 20}, {1, 1, 16}, {1, 1, 1}, 1)),
           "x dim 0 stride 2199023255552 B is not below 2^40");
  CHECK_EQ(Why(Window({20}, {16}, {1}, 1, 2, true)), "x batch stride 20 B is not a multiple of 16");
  CHECK(!TiledWindowFits(ok, off, kAlignedOut, nullptr));  // no reason wanted: no crash
}

void TestGrid() {
  // One round of tiles per CTA at most: 4 x 32 KiB stages leave one CTA per
  // H100 SM, so 2144 tiles take 536 CTAs of 4.
  TiledWindowPlan p;
  CHECK(PlanTiledWindow(Window({8192, 8192}, {4096, 4096}, {1, 1}, 4), kAligned, kAlignedOut,
                        &p, nullptr));
  std::string why;
  CHECK(PlanTiledWindowGrid(kH100, &p, &why));
  CHECK_EQ(p.smem, 4 * 32768 + 128);
  CHECK_EQ(p.args.tiles_per_cta, int64_t{4});
  CHECK_EQ(p.blocks, int64_t{536});
  // A small window spreads one tile per CTA over the resident CTAs.
  TiledWindowPlan q;
  CHECK(PlanTiledWindow(Window({512, 512}, {256, 256}, {1, 1}, 4), kAligned, kAlignedOut, &q,
                        nullptr));
  CHECK(PlanTiledWindowGrid(kH100, &q, &why));
  CHECK_EQ(q.args.tiles_per_cta, int64_t{1});
  CHECK_EQ(q.blocks, q.args.total_tiles);
}

void TestKernelChoice() {
  const WindowGeometry ok = Window({64, 64}, {32, 32}, {1, 1}, 4);
  const auto* off = static_cast<const char*>(kAligned) + 4;
  WindowPlan p;
  // auto and simt: SIMT's vector form where it runs, TMA or not; tma: tiled.
  CHECK(PlanWindow(ok, Method::kAuto, 0, kH100, 0, kAligned, kAlignedOut, &p).success());
  CHECK(p.kernel == WindowKernel::kVector);
  CHECK_EQ(p.vector.vectors, uint32_t{32} * 32 * 4 / 16);
  CHECK(p.simt());
  CHECK(PlanWindow(ok, Method::kAuto, 0, kA100, 0, kAligned, kAlignedOut, &p).success());
  CHECK(p.kernel == WindowKernel::kVector);
  CHECK(PlanWindow(ok, Method::kSimt, 0, kH100, 0, kAligned, kAlignedOut, &p).success());
  CHECK(p.kernel == WindowKernel::kVector);
  CHECK(PlanWindow(ok, Method::kTma, 0, kH100, 0, kAligned, kAlignedOut, &p).success());
  CHECK(p.kernel == WindowKernel::kTiled);
  CHECK(!p.simt());
  CHECK_EQ(p.tiled.blocks, p.tiled.args.total_tiles);  // the grid is planned too
  // Neither the vector form nor the tiled kernel takes a misaligned x.
  CHECK(PlanWindow(ok, Method::kAuto, 0, kH100, 0, off, kAlignedOut, &p).success());
  CHECK(p.kernel == WindowKernel::kRows);
  // Where the vector form cannot run (2^31 output vectors), auto takes the
  // tiled kernel only from a known start of a multiple of 16 B (f32: of 4
  // elements, either side of 0); tma from any start.
  const WindowGeometry big = Window({1 << 15, 1 << 18}, {1 << 15, 1 << 18}, {1, 1}, 4);
  CHECK(!PlanVectorWindow(big, kAligned, kAlignedOut, &p.vector));
  for (const auto& [start, tiled] : std::vector<std::pair<int64_t, bool>>{
           {4, true}, {-4, true}, {int64_t{1} << 62, true}, {2, false}, {-6, false},
           {kUnknownStart, false}}) {
    CHECK_EQ(InnerStartAligned(big, start), tiled);
    CHECK(PlanWindow(big, Method::kAuto, start, kH100, 0, kAligned, kAlignedOut, &p).success());
    CHECK(p.kernel == (tiled ? WindowKernel::kTiled : WindowKernel::kRows));
    CHECK(PlanWindow(big, Method::kTma, start, kH100, 0, kAligned, kAlignedOut, &p).success());
    CHECK(p.kernel == WindowKernel::kTiled);
  }
  CHECK(PlanWindow(big, Method::kSimt, 4, kH100, 0, kAligned, kAlignedOut, &p).success());
  CHECK(p.kernel == WindowKernel::kRows);
  ffi::Error err = PlanWindow(ok, Method::kTma, 0, kH100, 0, off, kAlignedOut, &p);
  CHECK_EQ(err.message(),
           "jax_tma.window: method='tma' cannot run this window: x address is not 16-B aligned");
  err = PlanWindow(ok, Method::kTma, 0, kA100, 3, kAligned, kAlignedOut, &p);
  CHECK_EQ(err.message(), "jax_tma.window: method='tma' needs TMA, but device 3 has compute "
                          "capability 8.0 (TMA needs >= 9.0); use method='auto' or 'simt'");
}

void TestVectorForm() {
  // The vector form: forward, innermost stride 1 (or 2 below 16-B elements),
  // rows of whole 16-B vectors, aligned buffers; its divisors.
  VectorWindowArgs a;
  CHECK(PlanVectorWindow(Window({8192, 8192}, {4096, 4096}, {1, 1}, 2, 3), kAligned,
                         kAlignedOut, &a));
  CHECK_EQ(a.vectors, uint32_t{3} * 4096 * 4096 * 2 / 16);
  CHECK_EQ(a.vectors_per_row, 512u);
  CHECK_EQ(a.rows_per_batch, 4096u);
  CHECK_EQ(a.dims[0].Divide(4095), 0u);
  CHECK_EQ(a.dims[0].Divide(4096 * 3 + 5), 3u);
  CHECK(PlanVectorWindow(Window({7, 9, 5}, {2, 3, 4}, {3, 2, 1}, 4), kAligned, kAlignedOut, &a));
  CHECK_EQ(a.vectors_per_row, 1u);
  CHECK_EQ(a.rows_per_batch, 6u);
  CHECK_EQ(a.dims[0].Divide(5), 2u);
  CHECK_EQ(a.dims[1].Divide(5), 1u);
  const char* const bytes = static_cast<const char*>(kAligned);
  for (const auto& [g, src] : std::vector<std::pair<WindowGeometry, const void*>>{
           {Window({64, 64}, {32, 6}, {1, 1}, 2), kAligned},   // 12-B rows
           {Window({64, 64}, {32, 32}, {1, 3}, 4), kAligned},  // innermost stride 3
           {Window({64, 64}, {32, 32}, {1, 2}, 16), kAligned},  // stride 2 of 16-B elements
           {Window({64, 64}, {0, 32}, {1, 1}, 4), kAligned},   // empty
           {Window({64, 64}, {32, 32}, {1, 1}, 4), bytes + 4},  // misaligned x
           {Window({1 << 16, 1 << 16}, {1 << 15, 1 << 16}, {1, 1}, 16), kAligned},  // 2^31 vectors
       }) {
    CHECK(!PlanVectorWindow(g, src, kAlignedOut, &a));
  }
  WindowGeometry t = Window({64, 64}, {32, 32}, {1, 1}, 4);
  t.transpose = true;
  CHECK(!PlanVectorWindow(t, kAligned, kAlignedOut, &a));
  CHECK(PlanVectorWindow(Window({1 << 16, 1 << 16}, {(1 << 15) - 1, 1 << 16}, {1, 1}, 16),
                         kAligned, kAlignedOut, &a));
  for (const int64_t eb : {1, 2, 4, 8}) {  // x[::2, ::2]: 16 B of output a vector, whatever it reads
    CHECK(PlanVectorWindow(Window({64, 64}, {32, 32}, {2, 2}, eb), kAligned, kAlignedOut, &a));
    CHECK_EQ(a.vectors, static_cast<uint32_t>(32 * 32 * eb / 16));
  }
}

}  // namespace
}  // namespace jax_tma

int main() {
  jax_tma::TestFittingWindow();
  jax_tma::TestTiling();
  jax_tma::TestEmptyWindowFits();
  jax_tma::TestRules();
  jax_tma::TestGrid();
  jax_tma::TestKernelChoice();
  jax_tma::TestVectorForm();
  return jax_tma::testing::Failures("test_window_plan");
}
