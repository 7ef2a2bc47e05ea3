// The SIMT gather/scatter kernels: slabs the bulk path cannot or should not
// move (sizes or addresses off the 16-byte grid, the calls "auto" gives them:
// kAutoSimtMaxSlabBytes in gather_plan.h, GPUs without TMA), scatter-add of
// any summable type with atomics (f32, f16 and bf16 in vector reductions),
// and the ordered scatter of deterministic=True.
#include <algorithm>
#include <cstdint>
#include <type_traits>

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
                          : g.fill.At<V>(col * int64_t{sizeof(V)});
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

// *w = w(indices[i]) for a table of n < 2^31 rows, in 32-bit arithmetic
// where the index type has at most 32 bits; false where out of range.
template <typename I>
__device__ __forceinline__ bool NarrowRow(const I* indices, uint32_t i, uint32_t n,
                                          uint32_t* w) {
  if constexpr (sizeof(I) == 8) {
    uint64_t v = indices[i];
    if (std::is_signed_v<I> && static_cast<int64_t>(v) < 0) v += n;
    *w = static_cast<uint32_t>(v);
    return v < n;
  } else if constexpr (std::is_signed_v<I>) {
    int32_t v = indices[i];
    if (v < 0) v += static_cast<int32_t>(n);  // no overflow: n < 2^31
    *w = static_cast<uint32_t>(v);
    return *w < n;
  } else {
    *w = indices[i];
    return *w < n;
  }
}

// What a flat kernel reads on its hot path, passed as its first parameter.
// Kernel parameters start at c[0x0][0x210] of the constant bank on sm_90, so
// these 48 bytes lie in one 64-byte line, which each SM fetches once a
// launch, where the same fields spread over the geometry, tiling and tables
// take four (benchmarks/TUNING.md, FlatArgs). The buffers and table rows hold
// for narrow calls of one table (LaunchFlat); the other kernels take their
// table's from GatherTables.
struct FlatArgs {
  const void* indices;
  const void* src;  // the table (gather) or the updates (scatter)
  void* dst;        // the output
  uint32_t tiles;   // < 2^31
  uint32_t vectors_per_row;
  uint32_t table_rows;
  FastDivisor per_row;
  uint32_t threads;  // a block's: blockDim.x is read from c[0x0][0x0], another line
};
static_assert(sizeof(FlatArgs) <= 48, "FlatArgs must fit in one line of the constant bank");

// The vector of this thread in a flat tiling (a thread per vector, 32-bit
// arithmetic): false past the last; else *i, its index in the output
// (gather) or the updates (scatter), *col, its column in the slab, *at, its
// vector in the table, and *in_range, whether its index is. I: void for any
// call (TableRow: batch or outer dims, the index kind read at run time,
// 64-bit offsets); else the index type of a narrow call of one table.
template <typename I>
__device__ __forceinline__ bool FlatVector(const FlatArgs& a, const GatherGeometry& g,
                                           uint32_t* i, uint32_t* col, int64_t* at,
                                           bool* in_range) {
  *i = blockIdx.x * a.threads + threadIdx.x;
  if (*i >= a.tiles) return false;
  const uint32_t r = a.per_row.Divide(*i);
  *col = *i - r * a.vectors_per_row;
  if constexpr (std::is_void_v<I>) {
    const int64_t row = g.TableRow(r);
    *in_range = row >= 0;
    *at = row * a.vectors_per_row + *col;
  } else {
    uint32_t row;
    *in_range = NarrowRow(static_cast<const I*>(a.indices), r, a.table_rows, &row);
    *at = row * a.vectors_per_row + *col;  // < 2^32 where in range
  }
  return true;
}

// The geometry of this block's table in a flat kernel (see FlatVector), and
// the buffers it moves from and to.
template <typename I>
__device__ __forceinline__ GatherGeometry FlatTable(const GatherGeometry& g,
                                                    const GatherTables& tables) {
  if constexpr (std::is_void_v<I>) {
    return BlockTable(g, tables);
  } else {
    return g;
  }
}
template <typename I, bool kScatter>
__device__ __forceinline__ const void* FlatSrc(const FlatArgs& a, const GatherGeometry& g) {
  if constexpr (std::is_void_v<I>) {
    return kScatter ? g.slabs : g.x;
  } else {
    return a.src;
  }
}
template <typename I>
__device__ __forceinline__ void* FlatDst(const FlatArgs& a, const GatherGeometry& g) {
  if constexpr (std::is_void_v<I>) {
    return g.out;
  } else {
    return a.dst;
  }
}

// Gather (kScatter false) or scatter set of a flat tiling: thread i moves
// vector i of the output (gather) or the updates (scatter).
template <typename V, bool kScatter, typename I>
__global__ void __launch_bounds__(kSimtFlatWaveThreads)
    SimtFlatKernel(const FlatArgs a, const GatherGeometry g0, const GatherTables tables) {
  const GatherGeometry g = FlatTable<I>(g0, tables);
  uint32_t i, col;
  int64_t at;
  bool in_range;
  if (!FlatVector<I>(a, g, &i, &col, &at, &in_range)) return;
  const V* src = static_cast<const V*>(FlatSrc<I, kScatter>(a, g));
  V* dst = static_cast<V*>(FlatDst<I>(a, g));
  if constexpr (kScatter) {
    if (in_range) dst[at] = src[i];
  } else {
    dst[i] = in_range ? src[at] : g.fill.At<V>(col * int64_t{sizeof(V)});
  }
}

// dst += v with the element arithmetic of ElementSum<K>, atomically. 1- and
// 2-byte elements swap their aligned 4-byte word (XLA's buffers are
// 16-B-aligned allocations, so the word lies inside one; the other bytes are
// written back unchanged, or the swap retries).
template <SumKind K>
__device__ __forceinline__ void AtomicAdd(typename ElementSum<K>::T* dst,
                                          typename ElementSum<K>::T v) {
  using S = ElementSum<K>;
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
  using T = typename ElementSum<K>::T;
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
// ElementSum<K>, with one vector reduction (sm_90; element atomics before).
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
  using T = typename ElementSum<K>::T;
  T parts[sizeof(uint4) / sizeof(T)];
  memcpy(parts, &v, sizeof(v));
  for (int e = 0; e < static_cast<int>(sizeof(uint4) / sizeof(T)); ++e) {
    AtomicAdd<K>(reinterpret_cast<T*>(dst) + e, parts[e]);
  }
#endif
}

// Scatter add of a flat tiling of 16-byte vectors (VectorAddFits): thread i
// adds vector i of the updates into its slab.
template <SumKind K, typename I>
__global__ void __launch_bounds__(kSimtFlatWaveThreads)
    SimtVectorAddKernel(const FlatArgs a, const GatherGeometry g0, const GatherTables tables) {
  const GatherGeometry g = FlatTable<I>(g0, tables);
  uint32_t i, col;
  int64_t at;
  bool in_range;
  if (!FlatVector<I>(a, g, &i, &col, &at, &in_range) || !in_range) return;
  VectorAtomicAdd<K>(static_cast<uint4*>(FlatDst<I>(a, g)) + at,
                     static_cast<const uint4*>(FlatSrc<I, true>(a, g))[i]);
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
  using S = ElementSum<K>;
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

// The kernels of a flat family: kKernel<I> for each index type I (void: any
// call), as FlatVector takes them.
using FlatKernel = void (*)(FlatArgs, GatherGeometry, GatherTables);
template <typename V, bool kMoveScatter>
struct FlatMoves {
  static constexpr bool kScatter = kMoveScatter;
  template <typename I>
  static constexpr FlatKernel kKernel = SimtFlatKernel<V, kScatter, I>;
};
template <SumKind K>
struct FlatAdds {
  static constexpr bool kScatter = true;
  template <typename I>
  static constexpr FlatKernel kKernel = SimtVectorAddKernel<K, I>;
};

// Launches the flat kernel of `Family` for the call: its index type's for a
// narrow tiling of one table, which reads no table by blockIdx.y, skips
// TableRow's test for batch and outer dims and the index kind's branches,
// and finds rows and offsets in 32-bit arithmetic (what small calls gain:
// benchmarks/TUNING.md, LaunchFlat); else the kernel of any call.
template <typename Family>
void LaunchFlat(const GatherGeometry& g, const GatherTables& tables, const SimtGatherTiling& t,
                cudaStream_t stream) {
  const FlatArgs a{g.indices,
                   Family::kScatter ? g.slabs : g.x,
                   g.out,
                   static_cast<uint32_t>(t.tiles),
                   static_cast<uint32_t>(t.vectors_per_row),
                   static_cast<uint32_t>(g.table_rows),
                   t.per_row,
                   static_cast<uint32_t>(t.flat_threads)};
  FlatKernel kernel = Family::template kKernel<void>;
  if (t.narrow && tables.count == 1) {
    switch (g.index_kind) {
      case IndexKind::kS8: kernel = Family::template kKernel<int8_t>; break;
      case IndexKind::kS16: kernel = Family::template kKernel<int16_t>; break;
      case IndexKind::kS32: kernel = Family::template kKernel<int32_t>; break;
      case IndexKind::kS64: kernel = Family::template kKernel<int64_t>; break;
      case IndexKind::kU8: kernel = Family::template kKernel<uint8_t>; break;
      case IndexKind::kU16: kernel = Family::template kKernel<uint16_t>; break;
      case IndexKind::kU32: kernel = Family::template kKernel<uint32_t>; break;
      case IndexKind::kU64: kernel = Family::template kKernel<uint64_t>; break;
    }
  }
  kernel<<<Grid(t.blocks, tables), t.flat_threads, 0, stream>>>(a, g, tables);
}

template <typename V>
ffi::Error LaunchMove(const GatherGeometry& g, const GatherTables& tables, bool scatter,
                      const SimtGatherTiling& t, cudaStream_t stream) {
  const dim3 grid = Grid(t.blocks, tables);
  if (t.flat && scatter) {
    LaunchFlat<FlatMoves<V, true>>(g, tables, t, stream);
  } else if (t.flat) {
    LaunchFlat<FlatMoves<V, false>>(g, tables, t, stream);
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
        LaunchFlat<FlatAdds<K>>(g, tables, t, stream);
        JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        return ffi::Error::Success();
      }
    }
    using T = typename ElementSum<K>::T;
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
      (t.flat && (t.tile_rows != 1 || t.segment != 1 || t.tiles > 0x7fffffff ||
                  (t.flat_threads != kSimtFlatThreads && t.flat_threads != kSimtFlatWaveThreads) ||
                  t.blocks * t.flat_threads < t.tiles))) {
    return InvalidArgument(name, "bad SIMT tiling: ", t.vector_bytes, "-byte vectors, ",
                           t.tile_rows, " rows x ", t.segment, " vectors a tile, ", t.tiles,
                           t.flat ? " tiles (flat), " : " tiles, ", t.blocks, " blocks of ",
                           t.flat ? t.flat_threads : kSimtGatherThreads, " threads");
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
