// The TMA im2col kernel and its launcher (tap-major im2col; im2col_plan.cc
// lays out the jobs). The patch
// matrix is cut into jobs of (pixels_per_column output pixels) x (one channel
// chunk) x (one kernel tap). Each job is one im2col-mode tensor load (the
// hardware walks the output pixels with the convolution strides, applies the
// tap's offsets and reads padding as zero) and one tiled tensor store of the
// same shared-memory tile into the patch columns of that tap, so the data
// never passes through registers. One thread per CTA issues everything.
#include <cstdint>
#include <string>

#include "cuda/device_helpers.cuh"
#include "cuda/device_info.h"
#include "cuda/launch.h"
#include "cuda/tensor_copy.cuh"
#include "cuda/tensor_map.h"
#include "im2col/im2col_launch.h"

namespace jax_tma {
namespace {

constexpr int kThreads = 32;   // one issuing lane; the warp is the unit of launch
constexpr int kStages = kTmaIm2colStages;
constexpr int kMaxDynamicSmem = SmemWithAlignSlack(int64_t{kStages} * kTmaIm2colStageBudget);

#if JAX_TMA_HAS_BULK_COPY

// Job j: ((pixel tile * chunks) + chunk) * taps + tap. Loads its tile into
// `smem`, completing on `bar`.
template <int R>
__device__ void IssueJob(const CUtensorMap* map, const TmaIm2colArgs& a, int64_t j,
                         void* smem, uint64_t* bar) {
  constexpr int r = R - 2;
  const int64_t tap = j % a.taps;
  const int64_t rest = j / a.taps;
  const int32_t c0 = static_cast<int32_t>((rest % a.chunks) * a.chunk);
  const int64_t m0 = (rest / a.chunks) * a.pixels;
  const int64_t n = m0 / a.out_pixels;
  int64_t m = m0 - n * a.out_pixels;
  int32_t start[r];  // tap-0 input coordinate, outermost first
  uint16_t off[r];
  int64_t t = tap;
#pragma unroll
  for (int d = r - 1; d >= 0; --d) {
    const int64_t o = m % a.out_dims[d];
    m /= a.out_dims[d];
    start[d] = static_cast<int32_t>(o * a.strides[d] - a.pad_lo[d]);
    off[d] = static_cast<uint16_t>((t % a.kernel[d]) * a.dilation[d]);
    t /= a.kernel[d];
  }
  device::expect_tx(bar, a.job_bytes);
  const int32_t nn = static_cast<int32_t>(n);
  if constexpr (r == 1) {
    device::im2col_load_3d(smem, map, bar, c0, start[0], nn, off[0]);
  } else if constexpr (r == 2) {
    device::im2col_load_4d(smem, map, bar, c0, start[1], start[0], nn, off[1], off[0]);
  } else {
    device::im2col_load_5d(smem, map, bar, c0, start[2], start[1], start[0], nn, off[2],
                           off[1], off[0]);
  }
}

#endif  // JAX_TMA_HAS_BULK_COPY

// Barrier phases: local job i lives in stage i % kStages and is the
// (i / kStages)-th use of that stage's barrier (parity (i / kStages) & 1).
// A stage is reloaded only after store_wait_read shows that the store which
// last read it is done reading; the single issuing thread orders the rest.
template <int R>
__global__ void __launch_bounds__(kThreads)
    TmaIm2colKernel(const __grid_constant__ CUtensorMap in_map,
                    const __grid_constant__ CUtensorMap out_map, const TmaIm2colArgs a) {
#if JAX_TMA_HAS_BULK_COPY
  using namespace device;
  __shared__ uint64_t full[kStages];
  extern __shared__ uint8_t dynamic_smem[];
  if (threadIdx.x != 0) return;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * a.jobs_per_cta;
  if (first >= a.total_jobs) return;
  const int n = static_cast<int>(min(a.jobs_per_cta, a.total_jobs - first));
  uint8_t* const stages =
      dynamic_smem + ((kSmemTileAlign - (smem_addr(dynamic_smem) & (kSmemTileAlign - 1))) &
                      (kSmemTileAlign - 1));
  for (int i = 0; i < kStages; ++i) mbarrier_init(&full[i], 1);
  fence_mbarrier_init();
  prefetch_tensor_map(&in_map);
  prefetch_tensor_map(&out_map);
  for (int i = 0; i < min(kStages, n); ++i) {
    IssueJob<R>(&in_map, a, first + i, stages + static_cast<size_t>(i) * a.stage_bytes,
                &full[i]);
  }
  for (int i = 0; i < n; ++i) {
    const int st = i % kStages;
    uint8_t* const buf = stages + static_cast<size_t>(st) * a.stage_bytes;
    mbarrier_wait(&full[st], static_cast<uint32_t>((i / kStages) & 1));
    const int64_t j = first + i;
    const int64_t tap = j % a.taps;
    const int64_t rest = j / a.taps;
    const int32_t col = static_cast<int32_t>(tap * a.channels + (rest % a.chunks) * a.chunk);
    const int32_t row = static_cast<int32_t>((rest / a.chunks) * a.pixels);
    tensor_store_2d(&out_map, buf, col, row);
    store_commit_group();
    // Refill the stage of job i - 1 once its store has finished reading it
    // (at most one group, job i's, may still read shared memory).
    if (i >= 1 && i - 1 + kStages < n) {
      store_wait_read<1>();
      const int prev = (i - 1) % kStages;
      IssueJob<R>(&in_map, a, j - 1 + kStages, stages + static_cast<size_t>(prev) * a.stage_bytes,
                  &full[prev]);
    }
  }
  store_wait_read<0>();  // shared memory must outlive every store reading it
#endif
}

using KernelFn = void (*)(const CUtensorMap, const CUtensorMap, const TmaIm2colArgs);

KernelFn PickKernel(int tensor_rank) {
  switch (tensor_rank) {
    case 3: return TmaIm2colKernel<3>;
    case 4: return TmaIm2colKernel<4>;
    case 5: return TmaIm2colKernel<5>;
    default: return nullptr;
  }
}

ffi::Error SetSmemLimit(int /*device*/, bool* done) {
  for (int r = 3; r <= 5; ++r) {
    JAX_TMA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
        reinterpret_cast<const void*>(PickKernel(r)),
        cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxDynamicSmem));
  }
  *done = true;
  return ffi::Error::Success();
}

}  // namespace

ffi::Error LaunchTmaIm2col(const Im2colGeometry& g, const TmaIm2colPlan& plan,
                           cudaStream_t stream, int device) {
  constexpr std::string_view kOp = "jax_tma.im2col(method='tma')";
  static PerDevice<bool> smem_limit_set;
  bool set = false;
  JAX_TMA_RETURN_IF_FAILED(smem_limit_set.Get(device, SetSmemLimit, &set));

  CUtensorMap in_map;
  CUtensorMap out_map;
  JAX_TMA_RETURN_IF_FAILED(EncodeIm2col(kOp, plan.in, &in_map));
  JAX_TMA_RETURN_IF_FAILED(EncodeTiled(kOp, plan.out, &out_map));
  PickKernel(g.rank + 2)<<<static_cast<unsigned>(plan.blocks), kThreads, plan.smem, stream>>>(
      in_map, out_map, plan.args);
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ffi::Error::Success();
}

}  // namespace jax_tma
