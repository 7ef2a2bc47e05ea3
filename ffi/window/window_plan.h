// Host rules of jax_tma.window's CUDA path: which kernel a method runs
// (PlanWindow, once per call), every rule the TMA tiled kernel relies on
// (tensor-map limits, alignment, rank), its tiling into tensor-map boxes and
// its grid. Pure host C++, unit-tested
// without a GPU (tests/cpp/test_window_plan.cc).
#ifndef JAX_TMA_FFI_WINDOW_WINDOW_PLAN_H_
#define JAX_TMA_FFI_WINDOW_WINDOW_PLAN_H_

#include <cstdint>
#include <string>

#include "cuda/device_info.h"
#include "cuda/tensor_map.h"
#include "fast_divisor.h"
#include "window/window_common.h"

namespace jax_tma {

inline constexpr int kTiledWindowStages = 4;
// Shared memory per stage, for the widest box a tile loads: 4 stages of
// 32 KiB in flight per CTA, one CTA per SM (chosen over 4 x 16 KiB at three
// CTAs per SM and over 3, 6 or 8 stages with benchmarks/bench_window.py).
inline constexpr uint32_t kTiledWindowStageBudget = 32 * 1024;
// One round of tiles per CTA: the block scheduler balances (as for the bulk copy).
inline constexpr int64_t kMaxTilesPerCta = kTiledWindowStages;
inline constexpr int kMaxTiledWindowRank = kMaxTensorMapRank;

// Coordinates are s32. Input dims stay <= 2^30 (in tensor-map elements), so
// clamping a coordinate into [-2^30, 2^30] keeps a box that was entirely out
// of bounds entirely out of bounds (boxes span <= 256 elements): the fill is
// unchanged. 2^30 is a multiple of every 16-B element count.
inline constexpr int64_t kCoordClamp = int64_t{1} << 30;
inline constexpr int64_t kMaxSrcMapDim = int64_t{1} << 30;
inline constexpr int64_t kMaxDstMapDim = (int64_t{1} << 31) - 1;  // store coordinates < dim

// The tiled kernel's parameters (by value).
struct TiledWindowArgs {
  WindowStarts starts;
  FillPattern fill;
  int64_t total_tiles;             // batch x tiles per batch entry
  int64_t tiles_per_cta;
  // Per spatial dim, outermost first. Inner dim in tensor-map elements
  // (complex128 counts two 8-byte elements), others in window elements.
  int64_t src_dim[kMaxTiledWindowRank];   // tensor-map dims of x
  int32_t tile[kMaxTiledWindowRank];      // tile shape = store box
  int32_t tile_step[kMaxTiledWindowRank]; // window elements one tile advances (inner: tile / scale)
  int32_t ntiles[kMaxTiledWindowRank];
  int32_t stride[kMaxTiledWindowRank];
  int32_t scale;                   // tensor-map elements per window element, inner dim
  int32_t align_elems;             // tensor-map elements per 16 B
  int32_t elem_bytes;              // tensor-map element size: 1, 2, 4 or 8
  uint32_t rows;                   // tile elements / tile[inner]
  uint32_t tile_bytes;             // dense tile in shared memory
  uint32_t wide_bytes;             // tile loaded through the wide map
  uint32_t stage_bytes;            // >= wide_bytes, multiple of kSmemTileAlign
  bool patch_fill;                 // a fill other than zero: the hardware's zero fill is patched
};

struct TiledWindowPlan {
  bool empty = false;  // nothing to write: no launch
  int variant = 0;     // 0: no batch dim; 1: batch in the output only; 2: in both
  TiledMapSpec src;    // tile boxes over x
  TiledMapSpec wide;   // the same, 16 B wider per row (misaligned starts)
  TiledMapSpec dst;
  TiledWindowArgs args{};
  int smem = 0;        // dynamic shared memory per CTA (PlanTiledWindowGrid)
  int64_t blocks = 0;
};

// Checks every rule the tiled kernel relies on and lays out the tiles and the
// tensor maps; false with the first broken rule in *why (may be null),
// phrased for a user, e.g. "strides[1] = 9 is over the hardware's 8" or
// "x row stride 18 B is not a multiple of 16". `src` / `dst` are the input and
// output device addresses (only their alignment is looked at). A window with
// no elements fits (plan->empty). Any fill value fits: out-of-bounds elements
// get g.fill exactly (NaN payloads included).
bool PlanTiledWindow(const WindowGeometry& g, const void* src, const void* dst,
                     TiledWindowPlan* plan, std::string* why);

// PlanTiledWindow's verdict alone.
bool TiledWindowFits(const WindowGeometry& g, const void* src, const void* dst,
                     std::string* why);

// The grid of a planned, non-empty window on `info`'s device: tiles per CTA,
// CTAs and shared memory. False (*why) past the grid limit.
bool PlanTiledWindowGrid(const DeviceInfo& info, TiledWindowPlan* plan, std::string* why);

// The SIMT kernel's vector form (simt_window.cu): one 16-B output vector per
// thread, a grid that covers the window, 32-bit index arithmetic with the
// divisors fixed here. A vector whose elements all lie inside the input is one
// load where its source is 16-B aligned, else two aligned loads shifted into
// place; one that lies outside is the fill.
struct VectorWindowArgs {
  uint32_t vectors = 0;             // output vectors, batch included
  uint32_t vectors_per_row = 1;
  uint32_t rows_per_batch = 1;      // output rows per batch entry
  FastDivisor per_row;              // by vectors_per_row
  FastDivisor per_batch;            // by rows_per_batch
  FastDivisor dims[kMaxWindowRank]; // by g.dst_dims[d], for d < rank - 1
};

// Whether the vector form takes the window, and its divisors in *args: a
// forward window with innermost stride 1 (or 2, for elements below 16 B:
// each vector from two source vectors), output rows of whole 16-B vectors,
// both buffers 16-B aligned, and between 1 and 2^31 - 1 output vectors
// (kFastDivisorLimit). Other windows take the SIMT kernel's row form.
bool PlanVectorWindow(const WindowGeometry& g, const void* src, const void* dst,
                      VectorWindowArgs* args);

// The kernels: TMA tiled, and SIMT in its vector form (VectorWindowArgs) or
// its row form (any geometry, the transpose included).
enum class WindowKernel { kTiled, kVector, kRows };

// What one call runs: the kernel and, for kTiled, its tiles, tensor maps and
// grid (nothing to launch where tiled.empty), for kVector its divisors.
struct WindowPlan {
  WindowKernel kernel = WindowKernel::kRows;
  TiledWindowPlan tiled;
  VectorWindowArgs vector;
  bool simt() const { return kernel != WindowKernel::kTiled; }
};

// Whether the innermost start (the last entry of the call's "static_start",
// in elements) is known and a multiple of 16 bytes. Only then does
// Method::kAuto take the tiled kernel, where SIMT's vector form cannot run: a
// TMA box starts 16-B aligned, so any other start is loaded wider and shifted
// in shared memory, which measured slower than the SIMT kernel
// (benchmarks/bench_window.py). A start known only on the device
// (kUnknownStart) may be anything, so it takes SIMT too.
bool InnerStartAligned(const WindowGeometry& g, int64_t inner_start);

// Plans a call once. Method::kSimt: the vector form where it fits
// (PlanVectorWindow), else the row form. Method::kAuto: the same, but where
// the vector form cannot run, the tiled kernel where the device has TMA, the
// window fits it (PlanTiledWindow and PlanTiledWindowGrid; never the
// transpose) and its innermost start is aligned (InnerStartAligned). The
// vector form measured ahead of the tiled kernel on every window both take
// (benchmarks/results, window). Method::kTma: the tiled kernel, or an error
// naming the rule it breaks.
ffi::Error PlanWindow(const WindowGeometry& g, Method method, int64_t inner_start,
                      const DeviceInfo& info, int device, const void* src, const void* dst,
                      WindowPlan* plan);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_WINDOW_WINDOW_PLAN_H_
