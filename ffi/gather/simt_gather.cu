// The SIMT gather/scatter kernels: slabs the bulk path cannot or should not
// move (sizes or addresses off the 16-byte grid, the calls "auto" gives them:
// kAutoSimtMaxSlabBytes in gather_plan.h, GPUs without TMA), scatter-add of
// any summable type with atomics (f32, f16 and bf16 in vector reductions),
// and the ordered scatter of deterministic=True.
#include <algorithm>
#include <cstdint>

#include "cuda/cuda_status.h"
#include "cuda/device_info.h"
#include "gather/gather_launch.h"

namespace jax_tma {
namespace {

constexpr int kUnroll = 8;          // vectors each lane of SimtMoveKernel has in flight

// Gather (kScatter false) or scatter set in V-sized vectors, tiled as
// SimtGatherTiling says: per tile, lane l reads the index of the tile's row
// l, then the warp walks the tile's vectors (row-major, `width` per row),
// each lane taking the row's index from its owner by a shuffle and keeping
// kUnroll independent loads in flight before it stores.
template <typename V, bool kScatter>
__global__ void __launch_bounds__(kSimtGatherThreads, kSimtGatherBlocksPerSm)
    SimtMoveKernel(const GatherGeometry g0, const SimtGatherTiling t, const GatherTables tables) {
  const GatherGeometry g = BlockTable(g0, tables);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kSimtGatherThreads / 32);
  const int64_t rows = g.rows();
  const int64_t vpr = t.vectors_per_row;
  const V* table = static_cast<const V*>(g.x);
  V* out = static_cast<V*>(g.out);
  const V* updates = static_cast<const V*>(g.slabs);
  for (int64_t tile = (blockIdx.x * static_cast<int64_t>(kSimtGatherThreads) + threadIdx.x) / 32;
       tile < t.tiles; tile += warps) {
    const int64_t chunk = tile / t.segments;
    const int64_t c0 = (tile - chunk * t.segments) * t.segment;
    const int64_t r0 = chunk * t.tile_rows;
    const int64_t mine = lane < t.tile_rows && r0 + lane < rows ? g.TableRow(r0 + lane) : -1;
    const auto width = static_cast<uint32_t>(min(t.segment, vpr - c0));
    const auto total = static_cast<uint32_t>(min(t.tile_rows, rows - r0)) * width;
    const int shift = (width & (width - 1)) == 0 ? __ffs(width) - 1 : -1;
    // Vector j of the tile: its row of the tile, and its column of the slab.
    auto row_of = [&](uint32_t j) { return shift >= 0 ? j >> shift : j / width; };
    auto col_of = [&](uint32_t j, uint32_t q) { return c0 + (j - q * width); };
    for (uint32_t j0 = 0; j0 < total; j0 += 32 * kUnroll) {
      // Every lane shuffles, also those past the tile's end. The stores
      // redo the shuffles and the address arithmetic rather than hold them
      // in registers, which the loads in flight need.
      V v[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        if (j0 + k * 32 >= total) break;  // the whole warp is past the tile's end
        const uint32_t j = j0 + k * 32 + lane;
        const uint32_t q = row_of(j);
        const int64_t row = __shfl_sync(~0u, mine, static_cast<int>(q % 32));
        v[k] = V{};
        if (j >= total) continue;
        const int64_t col = col_of(j, q);
        if constexpr (kScatter) {
          if (row >= 0) v[k] = updates[(r0 + q) * vpr + col];
        } else {
          v[k] = row >= 0 ? table[row * vpr + col]
                          : FillVector<V>(g.slabs, g.elem_bytes, col * int64_t{sizeof(V)});
        }
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        if (j0 + k * 32 >= total) break;
        const uint32_t j = j0 + k * 32 + lane;
        const uint32_t q = row_of(j);
        if constexpr (kScatter) {
          const int64_t row = __shfl_sync(~0u, mine, static_cast<int>(q % 32));
          if (j < total && row >= 0) out[row * vpr + col_of(j, q)] = v[k];
        } else {
          if (j < total) out[(r0 + q) * vpr + col_of(j, q)] = v[k];
        }
      }
    }
  }
}

// The vector of this thread in a flat tiling (a thread per vector, 32-bit
// arithmetic: t.tiles < 2^31): false past the last; else *i, its index in
// the output (gather) or the updates (scatter), *col, its column in the
// slab, and *row, the table row of its slab (-1: out of range). kPlain: no
// batch or outer dims and one table, so that small calls skip even
// TableRow's test for them (0.09 µs a call) and the choice of table (0.07 µs,
// H100, 2026-11-23).
template <bool kPlain>
__device__ __forceinline__ bool FlatVector(const GatherGeometry& g, const SimtGatherTiling& t,
                                           uint32_t* i, uint32_t* col, int64_t* row) {
  *i = blockIdx.x * kSimtFlatThreads + threadIdx.x;
  if (*i >= static_cast<uint32_t>(t.tiles)) return false;
  const auto vpr = static_cast<uint32_t>(t.vectors_per_row);
  const uint32_t r = (vpr & (vpr - 1)) == 0 ? *i >> (__ffs(vpr) - 1) : *i / vpr;
  *col = *i - r * vpr;
  *row = kPlain ? SlabRow(g.indices, g.index_kind, r, g.table_rows) : g.TableRow(r);
  return true;
}

// Gather (kScatter false) or scatter set of a flat tiling: thread i moves
// vector i of the output (gather) or the updates (scatter).
template <typename V, bool kScatter, bool kPlain>
__global__ void __launch_bounds__(kSimtFlatThreads)
    SimtFlatKernel(const GatherGeometry g0, const SimtGatherTiling t, const GatherTables tables) {
  const GatherGeometry g = kPlain ? g0 : BlockTable(g0, tables);
  uint32_t i, col;
  int64_t row;
  if (!FlatVector<kPlain>(g, t, &i, &col, &row)) return;
  const int64_t at = row * t.vectors_per_row + col;
  if constexpr (kScatter) {
    if (row >= 0) static_cast<V*>(g.out)[at] = static_cast<const V*>(g.slabs)[i];
  } else {
    static_cast<V*>(g.out)[i] =
        row >= 0 ? static_cast<const V*>(g.x)[at]
                 : FillVector<V>(g.slabs, g.elem_bytes, col * int64_t{sizeof(V)});
  }
}

// dst += v with the element arithmetic of Col2imSum<K>, atomically. 1- and
// 2-byte elements swap their aligned 4-byte word (XLA's buffers are
// 16-B-aligned allocations, so the word lies inside one; the other bytes are
// written back unchanged, or the swap retries).
template <SumKind K>
__device__ __forceinline__ void AtomicAdd(typename Col2imSum<K>::T* dst,
                                          typename Col2imSum<K>::T v) {
  using S = Col2imSum<K>;
  using T = typename S::T;
  if constexpr (K == SumKind::kU32) {
    atomicAdd(reinterpret_cast<unsigned*>(dst), static_cast<unsigned>(v));
  } else if constexpr (K == SumKind::kU64) {
    atomicAdd(reinterpret_cast<unsigned long long*>(dst), static_cast<unsigned long long>(v));
  } else if constexpr (K == SumKind::kF32 || K == SumKind::kF64) {
    atomicAdd(dst, v);
  } else {
    const auto addr = reinterpret_cast<uintptr_t>(dst);
    auto* word = reinterpret_cast<unsigned*>(addr & ~uintptr_t{3});
    const unsigned shift = static_cast<unsigned>(addr & 3) * 8;
    const unsigned mask = ((1u << (8 * sizeof(T))) - 1u) << shift;
    unsigned old = *word;
    unsigned assumed;
    do {
      assumed = old;
      const T cur = static_cast<T>((assumed & mask) >> shift);
      const T sum = S::Store(static_cast<typename S::Acc>(S::Load(cur) + S::Load(v)));
      old = atomicCAS(word, assumed, (assumed & ~mask) | (static_cast<unsigned>(sum) << shift));
    } while (old != assumed);
  }
}

template <SumKind K>
__global__ void __launch_bounds__(kSimtGatherThreads)
    SimtAddKernel(const GatherGeometry g0, const GatherTables tables) {
  const GatherGeometry g = BlockTable(g0, tables);
  using T = typename Col2imSum<K>::T;
  const int64_t per_row = g.slab_bytes / static_cast<int64_t>(sizeof(T));
  const int64_t total = g.rows() * per_row;
  const T* updates = static_cast<const T*>(g.slabs);
  T* out = static_cast<T*>(g.out);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row;
    const int64_t row = g.TableRow(r);
    if (row >= 0) AtomicAdd<K>(out + row * per_row + (i - r * per_row), updates[i]);
  }
}

// dst[0..16) += v, v holding the 16 bytes of f32, f16 or bf16 elements of
// Col2imSum<K>, with one vector reduction (sm_90; element atomics before).
template <SumKind K>
__device__ __forceinline__ void VectorAtomicAdd(uint4* dst, uint4 v) {
#if __CUDA_ARCH__ >= 900
  if constexpr (K == SumKind::kF32) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst),
                 "f"(__uint_as_float(v.x)), "f"(__uint_as_float(v.y)),
                 "f"(__uint_as_float(v.z)), "f"(__uint_as_float(v.w))
                 : "memory");
  } else if constexpr (K == SumKind::kF16) {
    asm volatile("red.global.add.noftz.v4.f16x2 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v.x),
                 "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
  } else {
    static_assert(K == SumKind::kBF16, "vector reductions: f32, f16 and bf16");
    asm volatile("red.global.add.noftz.v4.bf16x2 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v.x),
                 "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
  }
#else
  using T = typename Col2imSum<K>::T;
  T parts[sizeof(uint4) / sizeof(T)];
  memcpy(parts, &v, sizeof(v));
  for (int e = 0; e < static_cast<int>(sizeof(uint4) / sizeof(T)); ++e) {
    AtomicAdd<K>(reinterpret_cast<T*>(dst) + e, parts[e]);
  }
#endif
}

// Scatter add of a flat tiling of 16-byte vectors (VectorAddFits): thread i
// adds vector i of the updates into its slab.
template <SumKind K, bool kPlain>
__global__ void __launch_bounds__(kSimtFlatThreads)
    SimtVectorAddKernel(const GatherGeometry g0, const SimtGatherTiling t,
                        const GatherTables tables) {
  const GatherGeometry g = kPlain ? g0 : BlockTable(g0, tables);
  uint32_t i, col;
  int64_t row;
  if (!FlatVector<kPlain>(g, t, &i, &col, &row) || row < 0) return;
  VectorAtomicAdd<K>(static_cast<uint4*>(g.out) + row * t.vectors_per_row + col,
                     static_cast<const uint4*>(g.slabs)[i]);
}

// The table row of the update at sorted position k of batch entry b, or -1
// (dropped, or an order entry outside [0, M)).
__device__ __forceinline__ int64_t SortedRow(const GatherGeometry& g, int64_t b, int64_t k,
                                             int64_t* m) {
  const int64_t at = b * g.count + k;
  *m = g.order_64 ? static_cast<const int64_t*>(g.order)[at]
                  : static_cast<const int32_t*>(g.order)[at];
  if (*m < 0 || *m >= g.count) return -1;
  return SlabRow(g.indices, g.index_kind, b * g.count + *m, g.table_rows);
}

// One warp per run of equal rows in each batch entry's sorted order: the run
// applies its updates in order (g.order is a stable sort of the rows, so in
// index order). kAdd false: the last update of the run is stored.
template <SumKind K, bool kAdd>
// (A minimum of one block a SM: without it ptxas 13.0 held the 64-bit adds
// to 48 registers and spilled.)
__global__ void __launch_bounds__(kSimtGatherThreads, 1)
    OrderedScatterKernel(const GatherGeometry g, const GatherTables tables) {
  using S = Col2imSum<K>;
  using T = typename S::T;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int64_t per_row = g.slab_bytes / static_cast<int64_t>(sizeof(T));
  for (int64_t pos = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
       pos < g.batch * g.count; pos += warps) {
    const int64_t b = pos / g.count;
    const int64_t k = pos - b * g.count;
    int64_t m = 0, prev_m = 0;
    const int64_t row = SortedRow(g, b, k, &m);
    if (row < 0 || (k > 0 && SortedRow(g, b, k - 1, &prev_m) == row)) continue;
    int64_t end = k + 1;  // the run is [k, end)
    while (end < g.count && SortedRow(g, b, end, &prev_m) == row) ++end;
    for (int64_t p = 0; p < g.outer; ++p) {
      const int64_t bp = b * g.outer + p;
      // g's own buffers are table 0's: this block's table is blockIdx.y.
      T* dst = static_cast<T*>(tables.out[blockIdx.y]) + (bp * g.table_rows + row) * per_row;
      const T* src = static_cast<const T*>(tables.slabs[blockIdx.y]) + bp * g.count * per_row;
      for (int64_t e = lane; e < per_row; e += 32) {
        if constexpr (kAdd) {
          T acc = dst[e];
          for (int64_t j = k; j < end; ++j) {
            SortedRow(g, b, j, &m);
            acc = S::Store(static_cast<typename S::Acc>(S::Load(acc) + S::Load(src[m * per_row + e])));
          }
          dst[e] = acc;
        } else {
          SortedRow(g, b, end - 1, &m);
          dst[e] = src[m * per_row + e];
        }
      }
    }
  }
}

int Blocks(int64_t work, const DeviceInfo& info) {
  return static_cast<int>(std::clamp<int64_t>((work + kSimtGatherThreads - 1) / kSimtGatherThreads, 1,
                                              static_cast<int64_t>(info.sm_count) * 16));
}

// The grid of a launch: `blocks` for each table.
dim3 Grid(int64_t blocks, const GatherTables& tables) {
  return dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(tables.count));
}

// Launches a flat kernel: `plain` for one table without batch or outer dims.
using FlatKernel = void (*)(GatherGeometry, SimtGatherTiling, GatherTables);
void LaunchFlat(FlatKernel plain, FlatKernel general, const GatherGeometry& g,
                const GatherTables& tables, const SimtGatherTiling& t, cudaStream_t stream) {
  const FlatKernel kernel = g.batch == 1 && g.outer == 1 && tables.count == 1 ? plain : general;
  kernel<<<Grid(t.blocks, tables), kSimtFlatThreads, 0, stream>>>(g, t, tables);
}

template <typename V>
ffi::Error LaunchMove(const GatherGeometry& g, const GatherTables& tables, bool scatter,
                      const SimtGatherTiling& t, cudaStream_t stream) {
  const dim3 grid = Grid(t.blocks, tables);
  if (t.flat && scatter) {
    LaunchFlat(SimtFlatKernel<V, true, true>, SimtFlatKernel<V, true, false>, g, tables, t,
               stream);
  } else if (t.flat) {
    LaunchFlat(SimtFlatKernel<V, false, true>, SimtFlatKernel<V, false, false>, g, tables, t,
               stream);
  } else if (scatter) {
    SimtMoveKernel<V, true><<<grid, kSimtGatherThreads, 0, stream>>>(g, t, tables);
  } else {
    SimtMoveKernel<V, false><<<grid, kSimtGatherThreads, 0, stream>>>(g, t, tables);
  }
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ffi::Error::Success();
}

struct LaunchAdd {
  const GatherGeometry& g;
  const GatherTables& tables;
  const SimtGatherTiling& t;
  cudaStream_t stream;
  const DeviceInfo& info;

  template <SumKind K>
  ffi::Error operator()() const {
    if constexpr (K == SumKind::kF32 || K == SumKind::kF16 || K == SumKind::kBF16) {
      if (VectorAddFits(g, t)) {
        LaunchFlat(SimtVectorAddKernel<K, true>, SimtVectorAddKernel<K, false>, g, tables, t,
                   stream);
        JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        return ffi::Error::Success();
      }
    }
    using T = typename Col2imSum<K>::T;
    const int blocks = Blocks(g.rows() * (g.slab_bytes / static_cast<int64_t>(sizeof(T))), info);
    SimtAddKernel<K><<<Grid(blocks, tables), kSimtGatherThreads, 0, stream>>>(g, tables);
    JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return ffi::Error::Success();
  }
};

struct LaunchOrdered {
  const GatherGeometry& g;
  const GatherTables& tables;
  cudaStream_t stream;
  int blocks;
  bool add;

  template <SumKind K>
  ffi::Error operator()() const {
    const dim3 grid = Grid(blocks, tables);
    if (add) {
      OrderedScatterKernel<K, true><<<grid, kSimtGatherThreads, 0, stream>>>(g, tables);
    } else {
      OrderedScatterKernel<K, false><<<grid, kSimtGatherThreads, 0, stream>>>(g, tables);
    }
    JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return ffi::Error::Success();
  }
};

// Runs fn.template operator()<K>() for the geometry's SumKind, or for the
// unsigned type of the element's width where nothing is summed (ordered set).
template <typename Fn>
ffi::Error ForSumKind(const GatherGeometry& g, bool add, const Fn& fn) {
  if (add) return DispatchSumKind(g.sum, fn);
  switch (g.elem_bytes) {
    case 1: return fn.template operator()<SumKind::kU8>();
    case 2: return fn.template operator()<SumKind::kU16>();
    case 4: return fn.template operator()<SumKind::kU32>();
    default: return fn.template operator()<SumKind::kU64>();  // 8 and 16 B: 8-byte words
  }
}

}  // namespace

ffi::Error LaunchSimtGather(const GatherGeometry& g, const GatherTables& tables, GatherOp op,
                            const SimtGatherTiling& t, cudaStream_t stream, int device) {
  if (g.rows() == 0 || g.slab_bytes == 0) return ffi::Error::Success();
  const std::string_view name = op == GatherOp::kGather ? kGatherOp : kScatterOp;
  JAX_TMA_RETURN_IF_FAILED(CheckTables(name, tables));
  if (t.tiles <= 0 || t.blocks <= 0 || t.blocks > 0x7fffffff || t.segment <= 0 ||
      t.vectors_per_row * t.vector_bytes != g.slab_bytes ||
      t.segment * t.vector_bytes > kSimtSegmentBytes || t.tile_rows <= 0 ||
      t.tile_rows > kSimtTileRows ||
      (t.flat && (t.tile_rows != 1 || t.segment != 1 || t.tiles > 0x7fffffff))) {
    return InvalidArgument(name, "bad SIMT tiling: ", t.vector_bytes, "-byte vectors, ",
                           t.tile_rows, " rows x ", t.segment, " vectors a tile, ", t.tiles,
                           t.flat ? " tiles (flat), " : " tiles, ", t.blocks, " blocks");
  }
  if (op == GatherOp::kScatterAdd) {
    DeviceInfo info;
    JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
    return DispatchSumKind(g.sum, LaunchAdd{g, tables, t, stream, info});
  }
  const bool scatter = op == GatherOp::kScatterSet;
  switch (t.vector_bytes) {
    case 16: return LaunchMove<uint4>(g, tables, scatter, t, stream);
    case 8: return LaunchMove<uint2>(g, tables, scatter, t, stream);
    case 4: return LaunchMove<uint32_t>(g, tables, scatter, t, stream);
    case 2: return LaunchMove<uint16_t>(g, tables, scatter, t, stream);
    default: return LaunchMove<uint8_t>(g, tables, scatter, t, stream);
  }
}

ffi::Error LaunchOrderedScatter(const GatherGeometry& g, const GatherTables& tables,
                                cudaStream_t stream, int device) {
  if (g.rows() == 0 || g.slab_bytes == 0) return ffi::Error::Success();
  JAX_TMA_RETURN_IF_FAILED(CheckTables(kScatterOp, tables));
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  const bool add = g.mode == ScatterMode::kAdd;
  const int blocks = Blocks(g.batch * g.count * 32, info);
  return ForSumKind(g, add, LaunchOrdered{g, tables, stream, blocks, add});
}

}  // namespace jax_tma
