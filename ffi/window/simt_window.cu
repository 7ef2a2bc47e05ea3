// The SIMT window kernel and its launcher: any rank, strides, alignment and start, forward
// and transpose (window_common.h). Two forms: where PlanVectorWindow takes the
// window (forward, innermost stride 1 or 2, rows of whole 16-B vectors), a thread
// per 16-B output vector over a grid that covers the window; else warps copy
// runs of output rows, what lies inside the input as one strided copy, the
// rest as fill. The path for every geometry the TMA tiled kernel cannot take,
// and for traced or unaligned starts under method="auto" (jax_tma/_window.py
// says why).
#include <algorithm>
#include <cstdint>

#include "cuda/device_info.h"
#include "window/window_launch.h"
#include "window/window_plan.h"

namespace jax_tma {
namespace {

constexpr int kWindowThreads = 256;

struct Bytes16 {
  uint64_t lo, hi;
};

// One warp takes kWindowRun consecutive elements of one window row per item:
// the row's source offset is decoded once per item (the divisions). The part
// of the run that reads the input (InnerSpan) is copied with no per-element
// checks: lane-strided loads, kPer per lane in flight, then the stores
// (coalesced when the innermost stride is 1); the rest is fill. Strided
// transposes map each element (MapCoord), kSlowPer in flight. 8 elements (or
// 16-B vectors) per lane, runs of 1024 and registers capped for two
// 256-thread blocks per SM were chosen over other shapes with
// benchmarks/bench_window.py.
template <typename T>
constexpr int kWindowPer = sizeof(T) <= 4 ? 8 : 4;
template <typename T>
constexpr int64_t kWindowRun = int64_t{32} * kWindowPer<T> * 4;
constexpr int kSlowPer = 4;
constexpr int kWindowMinBlocks = 2;

// dst[i] = src[i * step] for i in [0, n): lane `lane` of a warp, kPer
// loads per lane in flight.
template <typename V, int kPer>
__device__ __forceinline__ void CopyStrided(const V* __restrict__ src, int64_t step,
                                            V* __restrict__ dst, int64_t n, int lane) {
  constexpr int64_t kStep = 32 * kPer;
  const int64_t whole = n / kStep * kStep;
  const V* p = src + lane * step;
  V* q = dst + lane;
  for (int64_t k = 0; k < whole; k += kStep) {
    V v[kPer];
#pragma unroll
    for (int u = 0; u < kPer; ++u) v[u] = p[u * 32 * step];
#pragma unroll
    for (int u = 0; u < kPer; ++u) q[u * 32] = v[u];
    p += kStep * step;
    q += kStep;
  }
  for (int64_t i = whole + lane; i < n; i += 32) dst[i] = src[i * step];
}

// The same for a span of the window. A contiguous span whose source and
// destination are equally aligned modulo 16 B (a traced start may be
// anything) moves in 16-B vectors after a scalar head; other spans move
// element by element, the warp's loads still coalesced (faster than aligned
// vector loads shifted into place: benchmarks/TUNING.md, CopySpan).
template <typename T>
__device__ __forceinline__ void CopySpan(const T* __restrict__ src, int64_t step,
                                         T* __restrict__ dst, int64_t n, int lane) {
  const auto s = reinterpret_cast<std::uintptr_t>(src);
  const auto d = reinterpret_cast<std::uintptr_t>(dst);
  if (sizeof(T) < 16 && step == 1 && ((s ^ d) & 15) == 0) {  // warp-uniform
    constexpr int64_t kPerVec = 16 / sizeof(T);
    const int64_t head = min(n, static_cast<int64_t>((16 - (d & 15)) & 15) / sizeof(T));
    const int64_t nvec = (n - head) / kPerVec;
    const int64_t tail = head + nvec * kPerVec;
    for (int64_t i = lane; i < head; i += 32) dst[i] = src[i];
    CopyStrided<uint4, 8>(reinterpret_cast<const uint4*>(src + head), 1,
                          reinterpret_cast<uint4*>(dst + head), nvec, lane);
    for (int64_t i = tail + lane; i < n; i += 32) dst[i] = src[i];
    return;
  }
  CopyStrided<T, kWindowPer<T>>(src, step, dst, n, lane);
}

template <typename T, bool kMapEach>
__global__ void __launch_bounds__(kWindowThreads, kWindowMinBlocks)
    SimtWindowKernel(const WindowGeometry g, const T* __restrict__ src, T* __restrict__ dst,
                     T fill) {
  const int last = g.rank - 1;
  const int64_t inner = g.dst_dims[last];
  const int64_t rows_per_batch = g.dst_spatial / inner;
  const int64_t rows = g.batch * rows_per_batch;
  const int64_t runs = (inner + kWindowRun<T> - 1) / kWindowRun<T>;
  const int lane = threadIdx.x % 32;
  const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  int64_t s[kMaxWindowRank];
  int64_t loaded_bt = -1;
  for (int64_t item = warp; item < rows * runs; item += warps) {
    const int64_t row = item / runs;
    const int64_t first = (item - row * runs) * kWindowRun<T>;
    const int64_t len = min(kWindowRun<T>, inner - first);
    const int64_t b = row / rows_per_batch;
    const int64_t bt = g.starts.batched ? b : 0;
    if (bt != loaded_bt) {
      for (int d = 0; d < g.rank; ++d) s[d] = ReadStart(g.starts, g.rank, bt, d);
      loaded_bt = bt;
    }
    const int64_t base = WindowRowSource(g, s, row - b * rows_per_batch);
    const T* sb = src + (g.src_batched ? b : 0) * g.src_spatial;
    T* const drow = dst + row * inner;
    if constexpr (kMapEach) {
      for (int64_t k = first + lane; k < first + len; k += 32 * kSlowPer) {
        T v[kSlowPer];
#pragma unroll
        for (int u = 0; u < kSlowPer; ++u) {
          const int64_t i = k + u * 32;
          const int64_t c = base >= 0 && i < first + len ? MapCoord(g, last, i, s[last]) : -1;
          v[u] = c >= 0 ? sb[base + c] : fill;
        }
#pragma unroll
        for (int u = 0; u < kSlowPer; ++u) {
          if (k + u * 32 < first + len) drow[k + u * 32] = v[u];
        }
      }
    } else {
      int64_t lo = first + len;  // a row that reads nothing is all fill
      int64_t hi = lo;
      int64_t c_lo = 0;
      int64_t step = 0;
      if (base >= 0) InnerSpan(g, s[last], first, len, &lo, &hi, &c_lo, &step);
      for (int64_t i = first + lane; i < lo; i += 32) drow[i] = fill;
      if (hi > lo) CopySpan<T>(sb + base + c_lo, step, drow + lo, hi - lo, lane);
      for (int64_t i = hi + lane; i < first + len; i += 32) drow[i] = fill;
    }
  }
}

// The 16 bytes at `p` (any alignment) from the aligned 16-B vectors that hold
// them: one load where `p` is aligned, else two, shifted into place.
__device__ __forceinline__ uint4 LoadUnaligned16(const unsigned char* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const uint32_t m = static_cast<uint32_t>(a & 15);
  const uint4* q = reinterpret_cast<const uint4*>(a - m);
  if (m == 0) return q[0];
  const uint4 lo = q[0];
  const uint4 hi = q[1];
  const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  const uint32_t k = m / 4;           // whole words to skip
  const uint32_t bits = m % 4 * 8;    // then bits
  uint32_t s[5];
#pragma unroll
  for (int j = 0; j < 5; ++j) {  // selects, not a dynamically indexed (local) array
    s[j] = k == 0 ? w[j] : (k == 1 ? w[j + 1] : (k == 2 ? w[j + 2] : w[j + 3]));
  }
  return make_uint4(__funnelshift_r(s[0], s[1], bits), __funnelshift_r(s[1], s[2], bits),
                    __funnelshift_r(s[2], s[3], bits), __funnelshift_r(s[3], s[4], bits));
}

// The vector form (VectorWindowArgs): each thread writes kVectorsPerThread
// output vectors, kWindowThreads apart (the warp's stores coalesce). A
// vector's row comes from its coordinates (FastDivisor); its elements from one
// run of kStride (the innermost stride, 1 or 2) 16-B vectors of that row's
// source, every kStride-th element kept. The starts (one set for the window),
// where any is traced, are read once a block, every dimension's at once, into
// shared memory, while the threads divide their coordinates; where all are
// static they are kernel parameters (VectorStarts; batched: each batch entry
// has its own, read per vector); every data load is issued before the first
// store.
// Two vectors a thread were ahead of one and of four on an H200
// (benchmarks/TUNING.md, "The SIMT kernel's vector form").
constexpr int kVectorsPerThread = 2;

// Where a vector window's starts come from, a kernel's template parameter
// (tested once, on the host): the operands, one set for the window, read
// once a block (any start traced); the operands, a set per batch entry, read
// per vector; or the kernel's parameters (every start static: no load, no
// barrier, before the data's).
enum class VectorStarts { kLoaded, kBatched, kParameters };

template <typename T, VectorStarts kStarts, int kStride>
__global__ void __launch_bounds__(kWindowThreads)
    VectorWindowKernel(const WindowGeometry g, const VectorWindowArgs a,
                       const T* __restrict__ src, uint4* __restrict__ dst) {
  constexpr int kPerVec = 16 / sizeof(T);
  constexpr int kSpan = kPerVec * kStride;  // source elements a vector's run covers
  constexpr int kU = kVectorsPerThread;
  const uint32_t v0 = blockIdx.x * (kWindowThreads * kU) + threadIdx.x;
  const int last = g.rank - 1;
  uint32_t rest[kU];
  uint32_t b[kU];
  int64_t c0[kU];  // the source column of the vector's first element
  int64_t off[kU];
  bool inside[kU];
#pragma unroll
  for (int k = 0; k < kU; ++k) {
    // Past the end: vector 0's coordinates, never stored.
    const uint32_t v = v0 + k * kWindowThreads < a.vectors ? v0 + k * kWindowThreads : 0;
    const uint32_t row = a.per_row.Divide(v);
    c0[k] = (v - row * a.vectors_per_row) * kSpan;  // window column * stride, until d == last
    b[k] = g.batch > 1 ? a.per_batch.Divide(row) : 0;
    rest[k] = row - b[k] * a.rows_per_batch;
    off[k] = (g.src_batched ? b[k] : 0) * g.src_spatial;
    inside[k] = true;
  }
  constexpr bool kBatched = kStarts == VectorStarts::kBatched;
  __shared__ int64_t block_starts[kMaxWindowRank];
  if constexpr (kStarts == VectorStarts::kLoaded) {
    const int t = static_cast<int>(threadIdx.x);
    if (t < g.rank) block_starts[t] = ClampStart(LoadStart(g.starts, g.rank, 0, t));
    __syncthreads();
  }
  for (int d = last; d >= 0; --d) {
    const int64_t s = kStarts == VectorStarts::kLoaded     ? block_starts[d]
                      : kStarts == VectorStarts::kParameters ? ClampStart(g.starts.known[d])
                                                             : 0;
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      const int64_t sk = kBatched ? ClampStart(LoadStart(g.starts, g.rank, b[k], d)) : s;
      if (d == last) {
        c0[k] += sk;
        continue;
      }
      const uint32_t q = a.dims[d].Divide(rest[k]);
      const int64_t c = sk + (rest[k] - q * static_cast<uint32_t>(g.dst_dims[d])) * g.strides[d];
      rest[k] = q;
      if (c < 0 || c >= g.src_dims[d]) {
        inside[k] = false;
      } else {
        off[k] += c * g.src_pitch[d];
      }
    }
  }
  const uint4 fill = make_uint4(
      static_cast<uint32_t>(g.fill.lo), static_cast<uint32_t>(g.fill.lo >> 32),
      static_cast<uint32_t>(g.fill.hi), static_cast<uint32_t>(g.fill.hi >> 32));
  const int64_t width = g.src_dims[last];
  uint4 out[kU];
#pragma unroll
  for (int k = 0; k < kU; ++k) {
    const int64_t c = c0[k];
    const T* const row_src = src + off[k];
    out[k] = fill;
    if (inside[k] && c >= 0 && c + kSpan <= width) {
      const auto* p = reinterpret_cast<const unsigned char*>(row_src + c);
      if constexpr (kStride == 1) {
        out[k] = LoadUnaligned16(p);
      } else {
        union {
          uint4 v[kStride];
          T e[kSpan];
        } run;
#pragma unroll
        for (int h = 0; h < kStride; ++h) run.v[h] = LoadUnaligned16(p + 16 * h);
        union {
          uint4 v;
          T e[kPerVec];
        } u;
#pragma unroll
        for (int j = 0; j < kPerVec; ++j) u.e[j] = run.e[j * kStride];
        out[k] = u.v;
      }
    } else if (inside[k] && c < width && c + kSpan > 0) {  // the input's edge
      union {
        uint4 v;
        T e[kPerVec];
      } u;
      u.v = fill;
#pragma unroll
      for (int j = 0; j < kPerVec; ++j) {
        const int64_t cj = c + j * kStride;
        if (cj >= 0 && cj < width) u.e[j] = row_src[cj];
      }
      out[k] = u.v;
    }
  }
#pragma unroll
  for (int k = 0; k < kU; ++k) {
    if (v0 + k * kWindowThreads < a.vectors) dst[v0 + k * kWindowThreads] = out[k];
  }
}

template <typename T, int kStride>
auto VectorKernelOf(VectorStarts starts) {
  switch (starts) {
    case VectorStarts::kBatched: return VectorWindowKernel<T, VectorStarts::kBatched, kStride>;
    case VectorStarts::kParameters:
      return VectorWindowKernel<T, VectorStarts::kParameters, kStride>;
    default: return VectorWindowKernel<T, VectorStarts::kLoaded, kStride>;
  }
}

template <typename T>
ffi::Error Launch(const WindowGeometry& g, const WindowPlan& plan, const void* src, void* dst,
                  T fill, cudaStream_t stream, const DeviceInfo& info) {
  if (plan.kernel == WindowKernel::kVector) {
    constexpr uint32_t kPerBlock = kWindowThreads * kVectorsPerThread;
    const uint32_t blocks = (plan.vector.vectors + kPerBlock - 1) / kPerBlock;
    const VectorStarts starts = g.starts.batched     ? VectorStarts::kBatched
                                : g.starts.all_known ? VectorStarts::kParameters
                                                     : VectorStarts::kLoaded;
    auto kernel = VectorKernelOf<T, 1>(starts);
    if constexpr (sizeof(T) < 16) {  // PlanVectorWindow: innermost stride 2 below 16-B elements
      if (g.strides[g.rank - 1] == 2) kernel = VectorKernelOf<T, 2>(starts);
    }
    kernel<<<blocks, kWindowThreads, 0, stream>>>(g, plan.vector, static_cast<const T*>(src),
                                                  static_cast<uint4*>(dst));
    JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return ffi::Error::Success();
  }
  const int64_t inner = g.dst_dims[g.rank - 1];
  const int64_t items = g.batch * (g.dst_spatial / inner) *
                        ((inner + kWindowRun<T> - 1) / kWindowRun<T>);
  const int64_t warps_per_block = kWindowThreads / 32;
  const int grid = static_cast<int>(std::clamp<int64_t>(
      (items + warps_per_block - 1) / warps_per_block, 1,
      static_cast<int64_t>(info.sm_count) * 16));
  // Strided transposes interleave src elements with zeros: no span form.
  const bool map_each = g.transpose && g.strides[g.rank - 1] != 1;
  auto kernel = map_each ? SimtWindowKernel<T, true> : SimtWindowKernel<T, false>;
  kernel<<<grid, kWindowThreads, 0, stream>>>(g, static_cast<const T*>(src),
                                              static_cast<T*>(dst), fill);
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ffi::Error::Success();
}

}  // namespace

ffi::Error LaunchSimtWindow(const WindowGeometry& g, const WindowPlan& plan, const void* src,
                            void* dst, cudaStream_t stream, int device) {
  if (g.batch * g.dst_spatial == 0) return ffi::Error::Success();
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  const FillPattern& f = g.fill;
  switch (g.elem_bytes) {
    case 1: return Launch<uint8_t>(g, plan, src, dst, f.At<uint8_t>(0), stream, info);
    case 2: return Launch<uint16_t>(g, plan, src, dst, f.At<uint16_t>(0), stream, info);
    case 4: return Launch<uint32_t>(g, plan, src, dst, f.At<uint32_t>(0), stream, info);
    case 8: return Launch<uint64_t>(g, plan, src, dst, f.At<uint64_t>(0), stream, info);
    case 16: return Launch<Bytes16>(g, plan, src, dst, f.At<Bytes16>(0), stream, info);
    default:
      return InvalidArgument(kWindowOp, "element size ", g.elem_bytes, " B is not supported");
  }
}

}  // namespace jax_tma
