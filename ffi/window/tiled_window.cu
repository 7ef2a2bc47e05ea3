// The TMA tiled window kernel and its launcher. The window is cut into tiles
// (window_plan.cc lays them out); each tile is one strided tensor-map load of
// the input (the hardware skips the stride and fills what lies outside the
// input) and one tensor-map store into the output (which clips at the
// output's edge), staged in shared memory and pipelined. Out-of-bounds fills
// other than zero, and starts that are not 16-B aligned along the innermost
// dim, get a small in-shared-memory fix-up.
#include <cstdint>
#include <string>

#include "cuda/device_helpers.cuh"
#include "cuda/device_info.h"
#include "cuda/launch.h"
#include "cuda/tensor_copy.cuh"
#include "cuda/tensor_map.h"
#include "window/window_launch.h"

namespace jax_tma {
namespace {

constexpr int kThreads = 128;
constexpr int kStages = kTiledWindowStages;
constexpr int kMaxRank = kMaxTiledWindowRank;
// Every instantiation may use this much dynamic shared memory.
constexpr int kMaxDynamicSmem = SmemWithAlignSlack(int64_t{kStages} * kTiledWindowStageBudget);

// What a stage needs between its load and its store (all threads do it).
constexpr uint32_t kCompact = 1;   // loaded `shift` elements early into a wider box
constexpr uint32_t kPatch = 2;     // partly out of bounds and the fill is not zero
constexpr uint32_t kFillAll = 4;   // entirely out of bounds, fill not zero: no load

// Written by the issuing thread before its arrival on the stage's barrier,
// read by every thread after the barrier phase completes.
struct StageFix {
  uint32_t flags;
  uint32_t shift;                  // kCompact: elements loaded before the tile
  uint32_t lo[kMaxRank];           // tile-local in-bounds index range [lo, hi)
  uint32_t hi[kMaxRank];
};

JAX_TMA_HOST_DEVICE inline int64_t ClampCoord(int64_t c) {
  return c < -kCoordClamp ? -kCoordClamp : (c > kCoordClamp ? kCoordClamp : c);
}

JAX_TMA_HOST_DEVICE inline int64_t MinI64(int64_t x, int64_t y) { return x < y ? x : y; }

// Linear tile index = ((b * ntiles[0] + i0) * ntiles[1] + i1) ...
template <int R>
struct TileCursor {
  int64_t b;
  int32_t idx[R];

  JAX_TMA_HOST_DEVICE void Seek(int64_t t, const TiledWindowArgs& a) {
    for (int d = R - 1; d >= 0; --d) {
      idx[d] = static_cast<int32_t>(t % a.ntiles[d]);
      t /= a.ntiles[d];
    }
    b = t;
  }
  JAX_TMA_HOST_DEVICE void Next(const TiledWindowArgs& a) {
    for (int d = R - 1; d >= 0; --d) {
      if (++idx[d] < a.ntiles[d]) return;
      idx[d] = 0;
    }
    ++b;
  }
};

enum class TileLoad { kNone, kTile, kWide };

// The load of tile `idx` for window start `s` (clamped start values of its
// batch entry): the spatial box coordinates crd[0..R-1] (innermost first),
// which map to load through, and the stage's fix-up in *f.
template <int R>
JAX_TMA_HOST_DEVICE TileLoad PlanTileLoad(const TiledWindowArgs& a, const int64_t* s,
                                          const int32_t* idx, StageFix* f, int32_t* crd) {
  f->flags = 0;
  f->shift = 0;
  bool empty = false;
  bool partial = false;
  for (int d = 0; d < R; ++d) {
    // s[d] is within +-2^62 and the offset below 2^34: no overflow.
    int64_t c = ClampCoord(s[d] + static_cast<int64_t>(idx[d]) * a.tile_step[d] * a.stride[d]);
    int64_t step = a.stride[d];
    if (d == R - 1) {
      c = ClampCoord(c * a.scale);
      step = 1;
    }
    const int64_t t = a.tile[d];
    const int64_t lo = c >= 0 ? 0 : MinI64(t, (-c + step - 1) / step);
    const int64_t hi = c >= a.src_dim[d] ? 0 : MinI64(t, (a.src_dim[d] - c + step - 1) / step);
    f->lo[d] = static_cast<uint32_t>(lo);
    f->hi[d] = static_cast<uint32_t>(hi);
    empty |= lo >= hi;
    partial |= lo > 0 || hi < t;
    crd[R - 1 - d] = static_cast<int32_t>(c);
  }
  if (empty && a.patch_fill) {
    f->flags = kFillAll;
    return TileLoad::kNone;
  }
  if (empty) {
    // Any box entirely outside gives zeros; this one is 16-B aligned.
    crd[0] = static_cast<int32_t>(kCoordClamp);
  } else if (partial && a.patch_fill) {
    f->flags |= kPatch;
  }
  // The box's start address must be 16-B aligned: load from the aligned
  // column below through the wide map (tile + 16 B per row) and shift.
  const int32_t q = a.align_elems;
  const uint32_t shift = static_cast<uint32_t>(((crd[0] % q) + q) % q);
  if (shift == 0) return TileLoad::kTile;
  f->flags |= kCompact;
  f->shift = shift;
  crd[0] -= static_cast<int32_t>(shift);
  return TileLoad::kWide;
}

// For each o < outer: buf[o * block + first + [0, len)) = fill; thread `tid`
// of `nthreads` writes its share. buf is 16-B aligned, and a complex128
// element is two E whose halves the pattern gives by the E's position.
template <typename E>
JAX_TMA_HOST_DEVICE void FillRuns(E* buf, uint32_t outer, uint32_t block, uint32_t first,
                                  uint32_t len, const FillPattern& fill, uint32_t tid,
                                  uint32_t nthreads) {
  const E even = fill.At<E>(0);
  const E odd = fill.At<E>(sizeof(E));  // differs from `even` for complex128 alone
  const uint32_t n = outer * len;
  for (uint32_t x = tid; x < n; x += nthreads) {
    const uint32_t o = x / len;
    const uint32_t k = o * block + first + (x - o * len);
    buf[k] = (k & 1) != 0 ? odd : even;
  }
}

// Overwrites the out-of-bounds part of a dense tile with `fill`: for each dim,
// the slabs below lo and at or above hi (slabs may overlap; same value).
template <typename E, int R>
JAX_TMA_HOST_DEVICE void PatchOutOfBounds(E* buf, const StageFix& f, const TiledWindowArgs& a,
                                          const FillPattern& fill, uint32_t tid,
                                          uint32_t nthreads) {
  uint32_t inner = 1;
  for (int d = R - 1; d >= 0; --d) {
    const uint32_t t = static_cast<uint32_t>(a.tile[d]);
    uint32_t outer = 1;
    for (int e = 0; e < d; ++e) outer *= static_cast<uint32_t>(a.tile[e]);
    const uint32_t block = t * inner;
    if (f.lo[d] > 0) FillRuns<E>(buf, outer, block, 0, f.lo[d] * inner, fill, tid, nthreads);
    if (f.hi[d] < t) {
      FillRuns<E>(buf, outer, block, f.hi[d] * inner, (t - f.hi[d]) * inner, fill, tid, nthreads);
    }
    inner *= t;
  }
}

#if JAX_TMA_HAS_BULK_COPY

// The wide box holds `rows` rows of `width` = tile + align_elems elements and
// the tile starts `shift` elements into each; packs the rows densely in place.
// Output x comes from x + (x / tile) * align + shift >= x, so walking chunks
// upward never overwrites a source that a later chunk still reads; within a
// chunk every thread reads before any writes (the barrier in between).
template <typename E>
__device__ void CompactRows(E* buf, uint32_t rows, uint32_t tile, uint32_t width,
                            uint32_t shift) {
  constexpr int kPerThread = 8;
  const uint32_t n = rows * tile;
  for (uint32_t base = 0; base < n; base += kThreads * kPerThread) {
    E v[kPerThread];
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const uint32_t x = base + i * kThreads + threadIdx.x;
      if (x < n) {
        const uint32_t row = x / tile;
        v[i] = buf[row * width + shift + (x - row * tile)];
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const uint32_t x = base + i * kThreads + threadIdx.x;
      if (x < n) buf[x] = v[i];
    }
  }
}

template <typename E, int R>
__device__ void FixTileAs(void* stage, const StageFix& f, const TiledWindowArgs& a) {
  E* buf = static_cast<E*>(stage);
  const uint32_t t = static_cast<uint32_t>(a.tile[R - 1]);
  if (f.flags & kFillAll) {
    const uint32_t n = a.rows * t;
    FillRuns<E>(buf, 1, n, 0, n, a.fill, threadIdx.x, kThreads);
  } else {
    if (f.flags & kCompact) {
      CompactRows<E>(buf, a.rows, t, t + a.align_elems, f.shift);
      __syncthreads();  // the patch may write where other threads compacted
    }
    if (f.flags & kPatch) PatchOutOfBounds<E, R>(buf, f, a, a.fill, threadIdx.x, kThreads);
  }
  // The tensor store that follows reads this through the async proxy.
  device::fence_proxy_async_shared();
}

template <int R>
__device__ void FixTile(void* stage, const StageFix& f, const TiledWindowArgs& a) {
  switch (a.elem_bytes) {
    case 1: FixTileAs<uint8_t, R>(stage, f, a); break;
    case 2: FixTileAs<uint16_t, R>(stage, f, a); break;
    case 4: FixTileAs<uint32_t, R>(stage, f, a); break;
    default: FixTileAs<uint64_t, R>(stage, f, a); break;
  }
}

#endif  // JAX_TMA_HAS_BULK_COPY

// One CTA copies tiles [blockIdx.x * tiles_per_cta, ...) of the window through
// kStages shared-memory stages. Thread 0 issues every load and store; all
// threads wait for each load and share any fix-up.
//
// Barrier phases: local tile j always lives in stage j % kStages and is the
// (j / kStages)-th use of that stage's barrier, so its wait parity is
// (j / kStages) & 1. A CTA-wide barrier closes every iteration, so no thread
// can still be waiting on phase p of a stage when thread 0 issues the load of
// phase p + 1 (parity aliasing), and thread 0 rewrites a stage's StageFix only
// after every thread has read it. A stage is reloaded only after
// store_wait_read shows the store that last read it is done reading.
template <int R, bool kSrcBatch, bool kDstBatch>
__global__ void __launch_bounds__(kThreads)
    TiledWindowKernel(const __grid_constant__ CUtensorMap src_map,
                      const __grid_constant__ CUtensorMap wide_map,
                      const __grid_constant__ CUtensorMap dst_map,
                      const TiledWindowArgs a) {
#if JAX_TMA_HAS_BULK_COPY
  using namespace device;
  constexpr int kSrcRank = R + (kSrcBatch ? 1 : 0);
  constexpr int kDstRank = R + (kDstBatch ? 1 : 0);
  __shared__ uint64_t full[kStages];
  __shared__ StageFix fix[kStages];
  extern __shared__ uint8_t dynamic_smem[];

  const int64_t first = static_cast<int64_t>(blockIdx.x) * a.tiles_per_cta;
  if (first >= a.total_tiles) return;
  const int n = static_cast<int>(min(a.tiles_per_cta, a.total_tiles - first));
  // Tensor copies need 128-B aligned shared memory; the launch adds the slack.
  uint8_t* const stages =
      dynamic_smem + ((kSmemTileAlign - (smem_addr(dynamic_smem) & (kSmemTileAlign - 1))) &
                      (kSmemTileAlign - 1));
  const bool leader = threadIdx.x == 0;

  // Thread 0's state: where the next load and store go, and the start of the
  // batch entry being loaded.
  TileCursor<R> load_at{};
  TileCursor<R> store_at{};
  int64_t start_entry = -1;
  int64_t s[R];

  auto issue = [&](int j) {
    const int st = j % kStages;
    const int64_t entry = a.starts.batched ? load_at.b : 0;
    if (entry != start_entry) {
#pragma unroll
      for (int d = 0; d < R; ++d) s[d] = ReadStart(a.starts, R, entry, d);
      start_entry = entry;
    }
    StageFix f;
    int32_t crd[kSrcRank];
    const TileLoad kind = PlanTileLoad<R>(a, s, load_at.idx, &f, crd);
    if constexpr (kSrcBatch) crd[R] = static_cast<int32_t>(load_at.b);
    load_at.Next(a);
    fix[st] = f;
    if (kind == TileLoad::kNone) {
      expect_tx(&full[st], 0);  // nothing to load: a plain arrival completes the phase
      return;
    }
    const bool wide = kind == TileLoad::kWide;
    expect_tx(&full[st], wide ? a.wide_bytes : a.tile_bytes);
    tensor_load<kSrcRank>(stages + static_cast<size_t>(st) * a.stage_bytes,
                          wide ? &wide_map : &src_map, &full[st], crd);
  };

  if (leader) {
    for (int i = 0; i < kStages; ++i) mbarrier_init(&full[i], 1);
    fence_mbarrier_init();
    prefetch_tensor_map(&src_map);
    prefetch_tensor_map(&wide_map);
    prefetch_tensor_map(&dst_map);
  }
  __syncthreads();  // barriers initialised before anyone waits on them
  if (leader) {
    load_at.Seek(first, a);
    store_at = load_at;
    for (int j = 0; j < min(kStages, n); ++j) issue(j);
  }

  for (int j = 0; j < n; ++j) {
    const int st = j % kStages;
    uint8_t* const buf = stages + static_cast<size_t>(st) * a.stage_bytes;
    mbarrier_wait(&full[st], static_cast<uint32_t>((j / kStages) & 1));
    const StageFix f = fix[st];
    if (f.flags != 0) FixTile<R>(buf, f, a);  // uniform branch
    __syncthreads();
    if (leader) {
      int32_t crd[kDstRank];
#pragma unroll
      for (int d = 0; d < R; ++d) crd[R - 1 - d] = store_at.idx[d] * a.tile[d];
      if constexpr (kDstBatch) crd[R] = static_cast<int32_t>(store_at.b);
      store_at.Next(a);
      tensor_store<kDstRank>(&dst_map, buf, crd);
      store_commit_group();
      // Refill the stage of tile j - 1 once its store has finished reading
      // it (at most one group, tile j's, may still read shared memory).
      if (j >= 1 && j - 1 + kStages < n) {
        store_wait_read<1>();
        issue(j - 1 + kStages);
      }
    }
  }
  // Shared memory must outlive every store reading it; the global writes
  // themselves are complete when the grid is.
  if (leader) store_wait_read<0>();
#endif
}

using KernelFn = void (*)(const CUtensorMap, const CUtensorMap, const CUtensorMap,
                          const TiledWindowArgs);

// variant 0: no batch dim; 1: batch in the output only; 2: in both.
template <int R>
KernelFn KernelForRank(int variant) {
  if constexpr (R < kMaxRank) {
    if (variant == 1) return TiledWindowKernel<R, false, true>;
    if (variant == 2) return TiledWindowKernel<R, true, true>;
  }
  return variant == 0 ? TiledWindowKernel<R, false, false> : nullptr;
}

KernelFn PickKernel(int rank, int variant) {
  switch (rank) {
    case 1: return KernelForRank<1>(variant);
    case 2: return KernelForRank<2>(variant);
    case 3: return KernelForRank<3>(variant);
    case 4: return KernelForRank<4>(variant);
    case 5: return KernelForRank<5>(variant);
    default: return nullptr;
  }
}

// Every instantiation may use up to kMaxDynamicSmem (over the 48 KiB default)
// on the current device, `device`.
ffi::Error SetTiledWindowSmemLimit(int /*device*/, bool* done) {
  for (int r = 1; r <= kMaxRank; ++r) {
    for (int v = 0; v < 3; ++v) {
      KernelFn fn = PickKernel(r, v);
      if (fn == nullptr) continue;
      JAX_TMA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
          reinterpret_cast<const void*>(fn), cudaFuncAttributeMaxDynamicSharedMemorySize,
          kMaxDynamicSmem));
    }
  }
  *done = true;
  return ffi::Error::Success();
}

}  // namespace

ffi::Error LaunchTiledWindow(const WindowGeometry& g, const TiledWindowPlan& plan,
                             cudaStream_t stream, int device) {
  constexpr std::string_view kOp = "jax_tma.window(method='tma')";
  static PerDevice<bool> smem_limit_set;
  bool set = false;
  JAX_TMA_RETURN_IF_FAILED(smem_limit_set.Get(device, SetTiledWindowSmemLimit, &set));

  // Encoded on every call: the addresses change between calls and the
  // descriptors travel by value as kernel parameters.
  CUtensorMap src_map;
  CUtensorMap wide_map;
  CUtensorMap dst_map;
  JAX_TMA_RETURN_IF_FAILED(EncodeTiled(kOp, plan.src, &src_map));
  JAX_TMA_RETURN_IF_FAILED(EncodeTiled(kOp, plan.wide, &wide_map));
  JAX_TMA_RETURN_IF_FAILED(EncodeTiled(kOp, plan.dst, &dst_map));

  KernelFn fn = PickKernel(g.rank, plan.variant);
  if (fn == nullptr) {
    return InvalidArgument(kOp, "no kernel for rank ", g.rank, " variant ", plan.variant);
  }
  fn<<<static_cast<unsigned>(plan.blocks), kThreads, plan.smem, stream>>>(src_map, wide_map,
                                                                          dst_map, plan.args);
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ffi::Error::Success();
}

}  // namespace jax_tma
