// The SIMT im2col and col2im kernels and their launcher: every geometry and order, every dtype.
// im2col (tap-major): one thread per (output pixel, vector of a channel run)
// walks the kernel taps, twelve loads in flight, 16-B accesses where the
// channel run allows, streaming stores; channel runs that are not whole 32-B
// sectors take the staged kernel (input rows in shared memory, patch rows
// written in output order) or, where it does not fit, one thread per output
// unit in output order.
// im2col (channel-major): one thread per output element.
// col2im: the gather form, one thread per (input pixel, channel vector)
// summing its patch entries in increasing tap order, so results are
// deterministic and match the CPU handler bit for bit (no atomics).
#include <algorithm>

#include "cuda/device_info.h"
#include "fast_divisor.h"
#include "im2col/im2col_launch.h"

namespace jax_tma {
namespace {

constexpr int kThreads = 256;
// im2col loads issued before their stores (12 chosen over 8 and over 9, one
// round for 3x3, with benchmarks/bench_im2col.py).
constexpr int kTapsInFlight = 12;
constexpr int kSumTapsInFlight = 4;     // col2im loads issued before they are added

// The patch matrix is written once and never read here: streaming stores
// (evict-first) keep the input, which every tap re-reads, in L2.
template <typename V>
__device__ __forceinline__ void StoreStreaming(V* p, V v) {
  __stcs(p, v);
}

template <typename T, int L>
struct alignas(sizeof(T) * L) Lanes {
  T v[L];
};

int64_t GridSize(int64_t items, const DeviceInfo& info) {
  return std::clamp<int64_t>((items + kThreads - 1) / kThreads, 1,
                             static_cast<int64_t>(info.sm_count) * 32);
}

// What one tap more moves in each spatial dim, for SimtIm2colKernel: the
// input offset, in access units, of one dilation step (`step`) and of a whole
// kernel row (`wrap`, taken off when the tap wraps to the dim's first), and
// the coordinate span of a kernel row (`span`). Loop-invariant, computed on the
// host: kernel parameters, not registers.
struct TapSteps {
  int64_t step[kMaxIm2colRank] = {};
  int64_t wrap[kMaxIm2colRank] = {};
  int64_t span[kMaxIm2colRank] = {};
};

TapSteps TapStepsOf(const Im2colGeometry& g, int64_t run) {
  TapSteps s;
  int64_t pitch = run;  // access units from one input pixel to the next along dim d
  for (int d = g.rank - 1; d >= 0; --d) {
    s.step[d] = g.dilation[d] * pitch;
    s.wrap[d] = g.kernel[d] * s.step[d];
    s.span[d] = g.kernel[d] * g.dilation[d];
    pitch *= g.in_dims[d];
  }
  return s;
}

// Division by a divisor fixed on the host, past 2^31 units, where
// FastDivisor does not reach: a plain division.
struct WideDivisor {
  uint64_t d = 1;
  static WideDivisor Of(uint64_t v) { return WideDivisor{v}; }
  JAX_TMA_HOST_DEVICE uint64_t Divide(uint64_t n) const { return n / d; }
};

// The index type of a divisor: what it divides.
template <typename D>
using DivIndex = decltype(D{}.Divide(0u));

// What the tap-major kernels divide their index by, fixed on the host: D =
// FastDivisor (a multiply-high and a shift) where every index is below 2^31,
// else WideDivisor. Dim 0 needs none: what is left of the index is its
// coordinate.
template <typename D>
struct Im2colDivisors {
  D row;                            // by taps * run: units a patch row (the flat kernel's)
  D run;                            // by run: units a channel run
  D out_pixels;
  D out_dims[kMaxIm2colRank];       // dims 1 and up
  D kernel[kMaxIm2colRank];         // dims 1 and up (the flat kernel's)
};

// The divisors of a launch whose indices D's index type holds (`flat`: the
// flat kernel's, whose indices run over taps too; the whole-sector kernel's
// do not, and taps * run may be past them).
template <typename D>
Im2colDivisors<D> Im2colDivisorsOf(const Im2colGeometry& g, int64_t run, bool flat) {
  using I = DivIndex<D>;
  Im2colDivisors<D> f;
  f.run = D::Of(static_cast<I>(run));
  f.out_pixels = D::Of(static_cast<I>(g.out_pixels));
  for (int d = 1; d < g.rank; ++d) f.out_dims[d] = D::Of(static_cast<I>(g.out_dims[d]));
  if (flat) {
    f.row = D::Of(static_cast<I>(g.taps * run));
    for (int d = 1; d < g.rank; ++d) f.kernel[d] = D::Of(static_cast<I>(g.kernel[d]));
  }
  return f;
}

// Tap-major im2col over R = g.rank spatial dims (a template parameter so the
// per-dim arrays stay in registers). V is the access unit; `run` =
// C * elem_bytes / sizeof(V) units per pixel. A thread's (pixel, unit) splits
// into coordinates by the divisors of `f`; each tap's input coordinates and
// offset follow from the last tap's by adds (TapSteps), row-major: no
// multiply or division per tap.
template <typename V, int R, typename D>
__global__ void __launch_bounds__(kThreads)
    SimtIm2colKernel(const Im2colGeometry g, const TapSteps s, const Im2colDivisors<D> f,
                     const V* __restrict__ x, V* __restrict__ out, DivIndex<D> run) {
  using I = DivIndex<D>;
  const I total = static_cast<I>(g.batch * g.out_pixels) * run;
  const I out_pixels = static_cast<I>(g.out_pixels);
  constexpr int r = R;
  for (I idx = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<I>(gridDim.x) * blockDim.x) {
    const I pix = f.run.Divide(idx);
    const I v = idx - pix * run;
    const I n = f.out_pixels.Divide(pix);
    I m = pix - n * out_pixels;
    int64_t c[kMaxIm2colRank];  // the tap's input coordinate per dim, tap 0's first
#pragma unroll
    for (int d = r - 1; d >= 0; --d) {
      I o = m;
      if (d > 0) {
        const I q = f.out_dims[d].Divide(m);
        o = m - q * static_cast<I>(g.out_dims[d]);
        m = q;
      }
      c[d] = static_cast<int64_t>(o) * g.strides[d] - g.pad_lo[d];
    }
    int64_t off = 0;  // the tap's input pixel, in access units from xn (negative: outside)
#pragma unroll
    for (int d = 0; d < r; ++d) off = off * g.in_dims[d] + c[d];
    off *= run;
    const V* xn = x + static_cast<int64_t>(n) * g.in_pixels * run + v;
    V* dst = out + static_cast<int64_t>(pix) * g.taps * run + v;
    int64_t k[kMaxIm2colRank] = {0, 0, 0};
    for (int64_t t0 = 0; t0 < g.taps; t0 += kTapsInFlight) {
      V val[kTapsInFlight];
#pragma unroll
      for (int u = 0; u < kTapsInFlight; ++u) {
        val[u] = V{};
        if (t0 + u >= g.taps) continue;
        bool inside = true;
#pragma unroll
        for (int d = 0; d < r; ++d) {
          inside &= static_cast<uint64_t>(c[d]) < static_cast<uint64_t>(g.in_dims[d]);
        }
        if (inside) val[u] = xn[off];
#pragma unroll
        for (int d = r - 1; d >= 0; --d) {  // next tap, row-major
          c[d] += g.dilation[d];
          off += s.step[d];
          if (++k[d] < g.kernel[d]) break;
          k[d] = 0;
          c[d] -= s.span[d];
          off -= s.wrap[d];
        }
      }
#pragma unroll
      for (int u = 0; u < kTapsInFlight; ++u) {
        if (t0 + u < g.taps) StoreStreaming(dst, val[u]);
        dst += run;
      }
    }
  }
}

// Units of the flat kernel's each thread loads before it stores them.
constexpr int kFlatInFlight = 4;

// Tap-major im2col for channel runs that are not whole 32-B sectors: one
// thread per output unit, in output order, so a warp's stores are contiguous.
// (The per-pixel mapping above leaves partial sectors per store there, a
// fraction of the bandwidth.) Each thread takes kFlatInFlight units a grid
// apart, every load issued before the first store; an index splits into
// (pixel, tap, unit) and those into coordinates by the divisors of `f`.
template <typename V, int R, typename D>
__global__ void __launch_bounds__(kThreads)
    SimtIm2colFlatKernel(const Im2colGeometry g, const Im2colDivisors<D> f, const V* __restrict__ x,
                         V* __restrict__ out, DivIndex<D> run) {
  using I = DivIndex<D>;
  const I row = static_cast<I>(g.taps) * run;
  const I total = static_cast<I>(g.batch * g.out_pixels) * row;
  const I out_pixels = static_cast<I>(g.out_pixels);
  const I stride = static_cast<I>(gridDim.x) * blockDim.x;
  for (I first = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; first < total;
       first += stride * kFlatInFlight) {
    V val[kFlatInFlight];
#pragma unroll
    for (int u = 0; u < kFlatInFlight; ++u) {
      const I idx = first + u * stride;
      val[u] = V{};
      if (idx >= total) continue;
      const I pix = f.row.Divide(idx);
      const I rem = idx - pix * row;
      I t = f.run.Divide(rem);
      const I v = rem - t * run;
      const I n = f.out_pixels.Divide(pix);
      I m = pix - n * out_pixels;
      int64_t p = 0;  // the input pixel, row-major from dim 0
      int64_t pitch = 1;
      bool inside = true;
#pragma unroll
      for (int d = R - 1; d >= 0; --d) {
        I o = m;  // dim 0: what is left is its coordinate
        I k = t;
        if (d > 0) {
          const I mq = f.out_dims[d].Divide(m);
          const I tq = f.kernel[d].Divide(t);
          o = m - mq * static_cast<I>(g.out_dims[d]);
          k = t - tq * static_cast<I>(g.kernel[d]);
          m = mq;
          t = tq;
        }
        const int64_t c = static_cast<int64_t>(o) * g.strides[d] - g.pad_lo[d] +
                          static_cast<int64_t>(k) * g.dilation[d];
        inside &= c >= 0 && c < g.in_dims[d];
        p += c * pitch;
        pitch *= g.in_dims[d];
      }
      if (inside) val[u] = x[(static_cast<int64_t>(n) * g.in_pixels + p) * run + v];
    }
#pragma unroll
    for (int u = 0; u < kFlatInFlight; ++u) {
      const I idx = first + u * stride;
      if (idx < total) StoreStreaming(out + idx, val[u]);
    }
  }
}

// Tap-major im2col through shared memory (PlanStagedIm2col): a block takes
// tiles of consecutive output pixels along the innermost dim; it stages the
// input rows a tile reads (row r: the r-th tap of the outer kernel dims, its
// `span` pixels from the tile's first's leftmost tap on, zeros outside x), then
// writes the tile's patch rows, contiguous in the output, in output order.
template <int R>
__global__ void __launch_bounds__(kThreads)
    SimtIm2colStagedKernel(const Im2colGeometry g, const StagedIm2colArgs a,
                           const uint4* __restrict__ x, uint4* __restrict__ out) {
  extern __shared__ uint4 staged[];
  constexpr int L = R - 1;  // the innermost dim, along which a tile runs
  const uint32_t run = a.run;
  const uint32_t staged_units = a.rows * a.span * run;
  const uint32_t patch_row = static_cast<uint32_t>(g.taps) * run;
  const int64_t inner = g.out_dims[L];
  for (int64_t tile = blockIdx.x; tile < a.tiles; tile += gridDim.x) {
    int64_t rest = tile / a.tiles_per_row;
    const int64_t first = (tile - rest * a.tiles_per_row) * a.tile_pixels;
    const auto pixels = static_cast<uint32_t>(inner - first < a.tile_pixels ? inner - first
                                                                             : a.tile_pixels);
    int64_t o[kMaxIm2colRank] = {};  // the tile's output coordinates, dims 0 .. L - 1
    int64_t pixel = first;           // its first output pixel within the image
    int64_t pitch = inner;
#pragma unroll
    for (int d = L - 1; d >= 0; --d) {
      const int64_t q = rest / g.out_dims[d];
      o[d] = rest - q * g.out_dims[d];
      rest = q;
      pixel += o[d] * pitch;
      pitch *= g.out_dims[d];
    }
    const uint4* xn = x + rest * g.in_pixels * run;
    const int64_t left = first * g.strides[L] - g.pad_lo[L];
    for (uint32_t u = threadIdx.x; u < staged_units; u += kThreads) {
      const uint32_t q = a.by_run.Divide(u);
      const uint32_t v = u - q * run;
      const uint32_t row = a.by_span.Divide(q);
      uint32_t k[kMaxIm2colRank] = {};  // the row's taps of dims 0 .. L - 1
      if constexpr (R == 3) {
        k[0] = a.by_kernel1.Divide(row);
        k[1] = row - k[0] * static_cast<uint32_t>(g.kernel[1]);
      } else if constexpr (R == 2) {
        k[0] = row;
      }
      int64_t c = left + (q - row * a.span);
      bool inside = static_cast<uint64_t>(c) < static_cast<uint64_t>(g.in_dims[L]);
      int64_t p = c;
      int64_t in_pitch = g.in_dims[L];
#pragma unroll
      for (int d = L - 1; d >= 0; --d) {
        c = o[d] * g.strides[d] - g.pad_lo[d] + static_cast<int64_t>(k[d]) * g.dilation[d];
        inside &= static_cast<uint64_t>(c) < static_cast<uint64_t>(g.in_dims[d]);
        p += c * in_pitch;
        in_pitch *= g.in_dims[d];
      }
      staged[u] = inside ? xn[p * run + v] : uint4{};
    }
    __syncthreads();
    uint4* dst = out + (rest * g.out_pixels + pixel) * patch_row;
    const uint32_t units = pixels * patch_row;
#pragma unroll 4
    for (uint32_t u = threadIdx.x; u < units; u += kThreads) {
      const uint32_t p = a.by_patch_row.Divide(u);
      const uint32_t rem = u - p * patch_row;
      const uint32_t t = a.by_run.Divide(rem);
      const uint32_t v = rem - t * run;
      const uint32_t row = a.by_inner_kernel.Divide(t);
      const uint32_t j = t - row * static_cast<uint32_t>(g.kernel[L]);
      const uint32_t col = p * static_cast<uint32_t>(g.strides[L]) +
                           j * static_cast<uint32_t>(g.dilation[L]);
      StoreStreaming(dst + u, staged[(row * a.span + col) * run + v]);
    }
    __syncthreads();
  }
}

// Channel-major im2col: one thread per output element.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    SimtIm2colChannelMajorKernel(const Im2colGeometry g, const T* __restrict__ x,
                                 T* __restrict__ out) {
  const int64_t row = g.taps * g.channels;
  const int64_t total = g.batch * g.out_pixels * row;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t pix = idx / row;
    const int64_t col = idx - pix * row;
    const int64_t c = col / g.taps;
    const int64_t t = col - c * g.taps;
    const int64_t n = pix / g.out_pixels;
    const int64_t p = TapSource(g, pix - n * g.out_pixels, t);
    out[idx] = p < 0 ? T{} : x[(n * g.in_pixels + p) * g.channels + c];
  }
}

// Tap-major col2im over R = g.rank spatial dims and `lanes` = C * components
// scalars per pixel, L per thread (L divides lanes).
template <SumKind K, int L, int R>
__global__ void __launch_bounds__(kThreads)
    SimtCol2imKernel(const Im2colGeometry g, const typename ElementSum<K>::T* __restrict__ patches,
                     typename ElementSum<K>::T* __restrict__ x, int64_t lanes) {
  using S = ElementSum<K>;
  using Vec = Lanes<typename S::T, L>;
  const int64_t per_pixel = lanes / L;
  const int64_t total = g.batch * g.in_pixels * per_pixel;
  constexpr int r = R;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t pix = idx / per_pixel;
    const int64_t v = idx - pix * per_pixel;
    const int64_t n = pix / g.in_pixels;
    int64_t p = pix - n * g.in_pixels;
    int64_t shifted[kMaxIm2colRank];  // input coordinate + pad_lo per dim
#pragma unroll
    for (int d = r - 1; d >= 0; --d) {
      shifted[d] = p % g.in_dims[d] + g.pad_lo[d];
      p /= g.in_dims[d];
    }
    typename S::Acc acc[L];
#pragma unroll
    for (int l = 0; l < L; ++l) acc[l] = SumStart<K>();
    bool any = false;  // a pixel no tap reads is +0 (EmptySum)
    const Vec* src = reinterpret_cast<const Vec*>(patches) +
                     n * g.out_pixels * g.taps * per_pixel + v;
    // Taps in increasing order, kSumTapsInFlight loads issued before they are
    // added (in the same order).
    int64_t k[kMaxIm2colRank] = {0, 0, 0};
    for (int64_t t0 = 0; t0 < g.taps; t0 += kSumTapsInFlight) {
      Vec e[kSumTapsInFlight];
      bool hit[kSumTapsInFlight];
#pragma unroll
      for (int u = 0; u < kSumTapsInFlight; ++u) {
        hit[u] = false;
        if (t0 + u >= g.taps) continue;
        int64_t m = 0;
        bool h = true;
#pragma unroll
        for (int d = 0; d < r; ++d) {
          const int64_t q = shifted[d] - k[d] * g.dilation[d];
          int64_t o = q;
          if (g.strides[d] != 1) {
            o = q / g.strides[d];
            h &= o * g.strides[d] == q;
          }
          h &= q >= 0 && o < g.out_dims[d];
          m = m * g.out_dims[d] + o;
        }
        hit[u] = h;
        if (h) e[u] = src[(m * g.taps + t0 + u) * per_pixel];
#pragma unroll
        for (int d = r - 1; d >= 0; --d) {
          if (++k[d] < g.kernel[d]) break;
          k[d] = 0;
        }
      }
#pragma unroll
      for (int u = 0; u < kSumTapsInFlight; ++u) {
        if (!hit[u]) continue;
        any = true;
#pragma unroll
        for (int l = 0; l < L; ++l) {
          acc[l] = static_cast<typename S::Acc>(acc[l] + S::Load(e[u].v[l]));
        }
      }
    }
    Vec outv;
#pragma unroll
    for (int l = 0; l < L; ++l) outv.v[l] = S::Store(any ? acc[l] : EmptySum<K>());
    reinterpret_cast<Vec*>(x)[idx] = outv;
  }
}

// Channel-major col2im: one thread per element component.
template <SumKind K>
__global__ void __launch_bounds__(kThreads)
    SimtCol2imChannelMajorKernel(const Im2colGeometry g,
                                 const typename ElementSum<K>::T* __restrict__ patches,
                                 typename ElementSum<K>::T* __restrict__ x) {
  const int comps = g.components;
  const int64_t total = g.batch * g.in_pixels * g.channels * comps;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int j = static_cast<int>(idx % comps);
    const int64_t e = idx / comps;
    const int64_t c = e % g.channels;
    const int64_t pix = e / g.channels;
    const int64_t n = pix / g.in_pixels;
    x[idx] = Col2imElement<K>(g, patches, n, pix - n * g.in_pixels, c, j);
  }
}

// fn.template operator()<R>() for R = g.rank (1, 2 or 3).
template <typename Fn>
void ForRank(int rank, Fn&& fn) {
  if (rank == 1) {
    fn.template operator()<1>();
  } else if (rank == 2) {
    fn.template operator()<2>();
  } else {
    fn.template operator()<3>();
  }
}

template <typename V>
struct TapMajorLaunch {
  const Im2colGeometry& g;
  const V* x;
  V* out;
  int64_t run;
  const DeviceInfo& info;
  cudaStream_t stream;
  template <int R>
  void operator()() const {
    const int64_t units = g.batch * g.out_pixels * g.taps * run;
    if constexpr (sizeof(V) == 16) {
      StagedIm2colArgs staged;
      if (PlanStagedIm2col(g, run, &staged)) {
        const auto grid = static_cast<unsigned>(std::min<int64_t>(staged.tiles, INT32_MAX));
        SimtIm2colStagedKernel<R><<<grid, kThreads, staged.smem, stream>>>(g, staged, x, out);
        return;
      }
    }
    if ((run * static_cast<int64_t>(sizeof(V))) % 32 == 0) {  // whole sectors per pixel
      const int64_t items = g.batch * g.out_pixels * run;
      const auto grid = static_cast<unsigned>(GridSize(items, info));
      if (items < kFastDivisorLimit) {
        SimtIm2colKernel<V, R, FastDivisor><<<grid, kThreads, 0, stream>>>(
            g, TapStepsOf(g, run), Im2colDivisorsOf<FastDivisor>(g, run, false), x, out,
            static_cast<uint32_t>(run));
      } else {
        SimtIm2colKernel<V, R, WideDivisor><<<grid, kThreads, 0, stream>>>(
            g, TapStepsOf(g, run), Im2colDivisorsOf<WideDivisor>(g, run, false), x, out,
            static_cast<uint64_t>(run));
      }
    } else {
      const auto grid = static_cast<unsigned>(
          GridSize((units + kFlatInFlight - 1) / kFlatInFlight, info));
      if (std::max(units, g.batch * g.in_pixels * run) < kFastDivisorLimit) {
        SimtIm2colFlatKernel<V, R, FastDivisor><<<grid, kThreads, 0, stream>>>(
            g, Im2colDivisorsOf<FastDivisor>(g, run, true), x, out, static_cast<uint32_t>(run));
      } else {
        SimtIm2colFlatKernel<V, R, WideDivisor><<<grid, kThreads, 0, stream>>>(
            g, Im2colDivisorsOf<WideDivisor>(g, run, true), x, out, static_cast<uint64_t>(run));
      }
    }
  }
};

template <SumKind K, int L>
struct Col2imRankLaunch {
  const Im2colGeometry& g;
  const typename ElementSum<K>::T* patches;
  typename ElementSum<K>::T* x;
  int64_t lanes;
  cudaStream_t stream;
  const DeviceInfo& info;
  template <int R>
  void operator()() const {
    const int64_t grid = GridSize(g.batch * g.in_pixels * lanes / L, info);
    SimtCol2imKernel<K, L, R><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
        g, patches, x, lanes);
  }
};

template <typename V>
ffi::Error LaunchTapMajor(const Im2colGeometry& g, const void* x, void* out,
                          cudaStream_t stream, const DeviceInfo& info) {
  const int64_t run = g.channels * g.elem_bytes / static_cast<int64_t>(sizeof(V));
  ForRank(g.rank, TapMajorLaunch<V>{g, static_cast<const V*>(x), static_cast<V*>(out), run,
                                    info, stream});
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ffi::Error::Success();
}

template <typename T>
ffi::Error LaunchChannelMajor(const Im2colGeometry& g, const void* x, void* out,
                              cudaStream_t stream, const DeviceInfo& info) {
  const int64_t grid = GridSize(g.batch * g.out_pixels * g.taps * g.channels, info);
  SimtIm2colChannelMajorKernel<T><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
      g, static_cast<const T*>(x), static_cast<T*>(out));
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ffi::Error::Success();
}

struct Col2imLaunch {
  const Im2colGeometry& g;
  const void* patches;
  void* x;
  bool aligned16;  // both buffers 16-B aligned
  cudaStream_t stream;
  const DeviceInfo& info;

  template <SumKind K>
  ffi::Error operator()() const {
    using T = typename ElementSum<K>::T;
    const T* src = static_cast<const T*>(patches);
    T* dst = static_cast<T*>(x);
    if (g.channel_major) {
      const int64_t grid = GridSize(g.batch * g.in_pixels * g.channels * g.components, info);
      SimtCol2imChannelMajorKernel<K><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
          g, src, dst);
    } else {
      // Tap-major: a pixel's C complex channels are 2C scalar lanes.
      constexpr int kWide = static_cast<int>(16 / sizeof(T));
      const int64_t lanes = g.channels * g.components;
      if (lanes % kWide == 0 && aligned16) {
        ForRank(g.rank, Col2imRankLaunch<K, kWide>{g, src, dst, lanes, stream, info});
      } else {
        ForRank(g.rank, Col2imRankLaunch<K, 1>{g, src, dst, lanes, stream, info});
      }
    }
    JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return ffi::Error::Success();
  }
};

}  // namespace

ffi::Error LaunchSimtIm2col(const Im2colGeometry& g, const void* src, void* dst,
                            cudaStream_t stream, int device) {
  const int64_t out_elems = g.transpose ? g.batch * g.in_pixels * g.channels
                                        : g.batch * g.out_pixels * g.taps * g.channels;
  if (out_elems == 0) return ffi::Error::Success();  // no empty grid: a launch error
  if (g.transpose && g.out_pixels == 0) {  // batch, channels > 0 here
    // An empty patch matrix (an output dim of 0: the dilated kernel is larger
    // than the padded input) adds nothing: x is zeros. A memset node is
    // graph-safe, and the gather kernel would walk every tap for nothing.
    JAX_TMA_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(dst, 0, static_cast<size_t>(out_elems * g.elem_bytes), stream));
    return ffi::Error::Success();
  }
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  const auto addr = reinterpret_cast<std::uintptr_t>(src) | reinterpret_cast<std::uintptr_t>(dst);
  if (g.transpose) {
    return DispatchSumKind(g.sum, Col2imLaunch{g, src, dst, addr % 16 == 0, stream, info});
  }
  const int64_t eb = g.elem_bytes;
  if (g.channel_major) {
    switch (eb) {
      case 1: return LaunchChannelMajor<uint8_t>(g, src, dst, stream, info);
      case 2: return LaunchChannelMajor<uint16_t>(g, src, dst, stream, info);
      case 4: return LaunchChannelMajor<uint32_t>(g, src, dst, stream, info);
      case 8: return LaunchChannelMajor<uint64_t>(g, src, dst, stream, info);
      case 16: return LaunchChannelMajor<uint4>(g, src, dst, stream, info);
      default: break;
    }
  } else {
    // The widest access unit that divides a pixel's channel run and both
    // buffer addresses.
    const int64_t unit = static_cast<int64_t>(g.channels * eb | 16 | addr);
    const int64_t widest = unit & -unit;  // lowest set bit: 1, 2, 4, 8 or 16
    if (widest == 16) return LaunchTapMajor<uint4>(g, src, dst, stream, info);
    if (widest == 8) return LaunchTapMajor<uint64_t>(g, src, dst, stream, info);
    if (widest == 4) return LaunchTapMajor<uint32_t>(g, src, dst, stream, info);
    if (widest == 2) return LaunchTapMajor<uint16_t>(g, src, dst, stream, info);
    return LaunchTapMajor<uint8_t>(g, src, dst, stream, info);
  }
  return InvalidArgument(kIm2colOp, "element size ", eb, " B is not supported");
}

}  // namespace jax_tma
