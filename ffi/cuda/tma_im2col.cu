// The TMA im2col kernel and its launcher (tap-major im2col). The patch
// matrix is cut into jobs of (pixels_per_column output pixels) x (one channel
// chunk) x (one kernel tap). Each job is one im2col-mode tensor load (the
// hardware walks the output pixels with the convolution strides, applies the
// tap's offsets and reads padding as zero) and one tiled tensor store of the
// same shared-memory tile into the patch columns of that tap, so the data
// never passes through registers. One thread per CTA issues everything.
#include <algorithm>
#include <cstdint>

#include "device_helpers.cuh"
#include "device_info.h"
#include "im2col_launch.h"
#include "tensor_copy.cuh"
#include "tensor_map.h"

namespace jax_tma {
namespace {

constexpr int kThreads = 32;   // one issuing lane; the warp is the unit of launch
constexpr int kStages = 4;
constexpr uint32_t kStageBudget = 16 * 1024;  // bytes per stage: 4 x 16 KiB per CTA
constexpr uint32_t kStageAlign = 128;         // tensor-copy shared-memory alignment
constexpr int kMaxDynamicSmem = kStages * kStageBudget + kStageAlign;
constexpr int64_t kMaxCoord = (int64_t{1} << 31) - 1;

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
      dynamic_smem + ((kStageAlign - (smem_addr(dynamic_smem) & (kStageAlign - 1))) &
                      (kStageAlign - 1));
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

struct TmaIm2colPlan {
  bool empty = false;
  Im2colMapSpec in;
  TiledMapSpec out;
  TmaIm2colArgs args{};
};

bool PlanTmaIm2col(const Im2colGeometry& g, const void* x, const void* out, TmaIm2colPlan* p,
                   std::string* why) {
  Message os;
  auto fail = [&] {
    *why = os.str();
    return false;
  };
  if (g.transpose) {
    os << "col2im has no TMA path";
    return fail();
  }
  if (g.channel_major) {
    os << "order='channel_major' has no TMA path (the hardware moves whole channel runs; "
          "use order='tap_major')";
    return fail();
  }
  if (g.batch == 0 || g.out_pixels == 0 || g.channels == 0) {
    p->empty = true;
    return true;
  }
  const int r = g.rank;
  const int tensor_rank = r + 2;
  const int64_t eb = g.elem_bytes;
  if (eb != 1 && eb != 2 && eb != 4 && eb != 8 && eb != 16) {
    os << "element size " << eb << " B has no TMA data type";
    return fail();
  }
  // complex128 moves as two 8-byte elements per channel.
  const int64_t e = std::min<int64_t>(eb, 8);
  const int64_t ch = g.channels * (eb / e);
  if ((g.channels * eb) % kTensorMapAlign != 0) {
    os << "a pixel's channels (" << g.channels << " x " << eb << " B = " << g.channels * eb
       << " B) are not a multiple of 16 B";
    return fail();
  }
  const int32_t corner = Im2colCornerMax(tensor_rank);
  for (int d = 0; d < r; ++d) {
    if (g.strides[d] > static_cast<int64_t>(kMaxTensorMapElementStride)) {
      os << "strides[" << d << "] = " << g.strides[d] << " is over the hardware's "
         << "traversal-stride limit " << kMaxTensorMapElementStride;
      return fail();
    }
    if (g.pad_lo[d] > corner + 1) {
      os << "padding low " << g.pad_lo[d] << " of spatial dim " << d << " is over the "
         << "hardware's pixel-box corner limit " << corner + 1 << " for a rank-" << tensor_rank
         << " input";
      return fail();
    }
    const int64_t span = g.dilation[d] * (g.kernel[d] - 1);
    const int64_t upper = g.pad_hi[d] - span;
    if (upper < -corner - 1 || upper > corner) {
      os << "padding high " << g.pad_hi[d] << " minus the kernel's dilated extent " << span
         << " along spatial dim " << d << " (" << upper << ") is outside the hardware's "
         << "pixel-box corner range [" << -corner - 1 << ", " << corner << "] for a rank-"
         << tensor_rank << " input";
      return fail();
    }
    if (span > corner) {
      os << "the kernel's dilated extent " << span << " along spatial dim " << d
         << " is over the hardware's im2col offset limit " << corner << " for a rank-"
         << tensor_rank << " input";
      return fail();
    }
  }
  for (int d = 0; d < r; ++d) {
    if (g.in_dims[d] + g.pad_lo[d] > kMaxCoord) {
      os << "spatial dim " << d << " = " << g.in_dims[d] << " plus its low padding is over "
         << "the int32 coordinate range";
      return fail();
    }
  }
  const int64_t rows = g.batch * g.out_pixels;
  if (rows > kMaxCoord || g.taps * ch > kMaxCoord) {
    os << "the patch matrix (" << rows << " x " << g.taps * ch
       << " tensor-map elements) is over the int32 coordinate range";
    return fail();
  }
  const auto addr = reinterpret_cast<std::uintptr_t>(x) | reinterpret_cast<std::uintptr_t>(out);
  if (addr % kTensorMapAlign != 0) {
    os << "the input or output address is not 16-B aligned";
    return fail();
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
  const int64_t pixels = std::clamp<int64_t>(kStageBudget / (chunk * e), 1, kMaxTensorMapBox);

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
  a.stage_bytes = (a.job_bytes + kStageAlign - 1) / kStageAlign * kStageAlign;
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
  if (!broken.empty()) {
    os << "tensor-map rule broken: " << broken;
    return fail();
  }
  return true;
}

}  // namespace

bool TmaIm2colFits(const Im2colGeometry& g, const void* x, const void* out, std::string* why) {
  TmaIm2colPlan plan;
  std::string reason;
  const bool fits = PlanTmaIm2col(g, x, out, &plan, &reason);
  if (!fits && why != nullptr) *why = reason;
  return fits;
}

ffi::Error LaunchTmaIm2col(const Im2colGeometry& g, const void* x, void* out,
                           cudaStream_t stream, int device) {
  constexpr std::string_view kOp = "jax_tma.im2col(method='tma')";
  TmaIm2colPlan plan;
  std::string why;
  if (!PlanTmaIm2col(g, x, out, &plan, &why)) return InvalidArgument(kOp, why);
  if (plan.empty) return ffi::Error::Success();
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  if (!info.has_tma()) return InvalidArgument(kOp, info.NoTmaReason(device));
  static PerDevice<bool> smem_limit_set;
  bool set = false;
  JAX_TMA_RETURN_IF_FAILED(smem_limit_set.Get(device, SetSmemLimit, &set));

  CUtensorMap in_map;
  CUtensorMap out_map;
  JAX_TMA_RETURN_IF_FAILED(EncodeIm2col(kOp, plan.in, &in_map));
  JAX_TMA_RETURN_IF_FAILED(EncodeTiled(kOp, plan.out, &out_map));

  TmaIm2colArgs& a = plan.args;
  const int smem = static_cast<int>(kStages * a.stage_bytes + kStageAlign);
  const int64_t per_cta_smem = smem + 1024 + 1024;  // static part and the per-CTA reservation
  const int64_t ctas_per_sm =
      std::max<int64_t>(1, static_cast<int64_t>(info.smem_per_sm) / per_cta_smem);
  const int64_t slots = std::max<int64_t>(1, info.sm_count * ctas_per_sm);
  a.jobs_per_cta = std::max<int64_t>(1, (a.total_jobs + slots - 1) / slots);
  const int64_t blocks = (a.total_jobs + a.jobs_per_cta - 1) / a.jobs_per_cta;
  PickKernel(g.rank + 2)<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(
      in_map, out_map, a);
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ffi::Error::Success();
}

}  // namespace jax_tma
