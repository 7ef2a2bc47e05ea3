// Host rules of jax_tma.im2col's CUDA path: which kernel a method runs
// (PlanIm2col, once per call), every
// rule the TMA im2col kernel relies on (im2col tensor-map limits: traversal
// strides, pixel-box corners, offsets, alignment), its jobs and its grid.
// Pure host C++, unit-tested without a GPU (tests/cpp/test_im2col_plan.cc).
#ifndef JAX_TMA_FFI_IM2COL_IM2COL_PLAN_H_
#define JAX_TMA_FFI_IM2COL_IM2COL_PLAN_H_

#include <cstdint>
#include <string>

#include "cuda/device_info.h"
#include "cuda/tensor_map.h"
#include "fast_divisor.h"
#include "im2col/im2col_common.h"

namespace jax_tma {

inline constexpr int kTmaIm2colStages = 4;
inline constexpr uint32_t kTmaIm2colStageBudget = 16 * 1024;  // bytes per stage
inline constexpr int64_t kMaxIm2colCoord = (int64_t{1} << 31) - 1;  // s32 coordinates

// The TMA im2col kernel's parameters (by value). The patch matrix is cut into
// jobs of (pixels output pixels) x (one channel chunk) x (one kernel tap).
struct TmaIm2colArgs {
  int64_t total_jobs;
  int64_t jobs_per_cta;
  int64_t taps;
  int64_t chunks;              // channel chunks per pixel
  int32_t chunk;               // channels (tensor-map elements) per chunk
  int32_t channels;            // channels per pixel (tensor-map elements)
  int32_t pixels;              // output pixels per job
  uint32_t job_bytes;
  uint32_t stage_bytes;
  int64_t out_pixels;          // per image
  int32_t out_dims[kMaxIm2colRank];   // outermost first
  int32_t strides[kMaxIm2colRank];
  int32_t pad_lo[kMaxIm2colRank];
  int32_t kernel[kMaxIm2colRank];
  int32_t dilation[kMaxIm2colRank];
};

struct TmaIm2colPlan {
  bool empty = false;  // nothing to write: no launch
  Im2colMapSpec in;    // im2col-mode map over x
  TiledMapSpec out;    // tiled map over the patch matrix
  TmaIm2colArgs args{};
  int smem = 0;        // dynamic shared memory per CTA (PlanTmaIm2colGrid)
  int64_t blocks = 0;
};

// Checks every rule the TMA im2col kernel relies on and lays out its jobs and
// tensor maps; false with the first broken rule in *why (may be null),
// phrased for a user, e.g. "strides[0] = 9 is over the hardware's
// traversal-stride limit 8". `x` and `out` are device addresses (only their
// alignment is looked at). An empty patch matrix fits (plan->empty).
bool PlanTmaIm2col(const Im2colGeometry& g, const void* x, const void* out, TmaIm2colPlan* plan,
                   std::string* why);

// PlanTmaIm2col's verdict alone.
bool TmaIm2colFits(const Im2colGeometry& g, const void* x, const void* out, std::string* why);

// The grid of a planned, non-empty im2col on `info`'s device: jobs per CTA,
// CTAs and shared memory.
void PlanTmaIm2colGrid(const DeviceInfo& info, TmaIm2colPlan* plan);

// The SIMT staged kernel (tap-major, 16-B units): a tile is `tile_pixels`
// consecutive output pixels along the innermost dim; a block stages the
// input they read, one row of `span` pixels per tap of the outer kernel dims
// (`rows` of them, zeros outside x), in shared memory once, then writes the
// tile's patch rows from there (contiguous, streaming stores). The input
// crosses L2 once, where the other kernels re-read it for every tap. It
// runs where a pixel's channels are not whole 32-B sectors (the flat
// kernel's case, which it beat: benchmarks/TUNING.md, "The staged kernel").
inline constexpr int64_t kStagedIm2colSmem = 16 * 1024;  // bytes a block stages, at most
struct StagedIm2colArgs {
  uint32_t run = 1;             // 16-B units of a pixel's channels
  uint32_t rows = 1;            // taps / kernel[r - 1]
  uint32_t span = 1;            // input pixels of a staged row
  uint32_t tile_pixels = 1;
  int64_t tiles_per_row = 1;    // ceil(out_dims[r - 1] / tile_pixels)
  int64_t tiles = 0;            // batch * (out_pixels / out_dims[r - 1]) * tiles_per_row
  uint32_t smem = 0;            // bytes: rows * span * run * 16
  FastDivisor by_run;
  FastDivisor by_span;
  FastDivisor by_patch_row;     // taps * run
  FastDivisor by_inner_kernel;  // kernel[r - 1]
  FastDivisor by_kernel1;       // kernel[1] (r == 3: a staged row's two outer taps)
};

// The staged kernel's tiles for a tap-major im2col of `run` 16-B units a
// pixel: the widest tile whose staged rows fit kStagedIm2colSmem. False
// where another SIMT kernel runs it: whole 32-B sectors a pixel (an even
// run), taps of the innermost dim that overlap no other's pixels
// (kernel <= stride there), or not even one output pixel's rows fit.
bool PlanStagedIm2col(const Im2colGeometry& g, int64_t run, StagedIm2colArgs* a);

enum class Im2colKernel { kTma, kSimt };

// What one call runs: the kernel and, for kTma, its jobs, tensor maps and
// grid (nothing to launch where tma.empty).
struct Im2colPlan {
  Im2colKernel kernel = Im2colKernel::kSimt;
  TmaIm2colPlan tma;
};

// Plans a call once: the TMA kernel only where asked (Method::kTma, forward;
// an error naming the broken rule where it cannot run), the SIMT kernels
// otherwise: auto takes SIMT, the faster one on every shape measured
// (benchmarks/bench_im2col.py; the TMA unit moves one pixel's channel run per
// request).
ffi::Error PlanIm2col(const Im2colGeometry& g, Method method, const DeviceInfo& info, int device,
                      const void* x, const void* out, Im2colPlan* plan);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_IM2COL_IM2COL_PLAN_H_
