// Device-side wrappers for the tensor-map (cp.async.bulk.tensor) forms of the
// Hopper async copy: tiled loads and stores of 1..5-d boxes, tensor-map
// prefetch. Companion of device_helpers.cuh (mbarriers, 1D bulk copies, the
// proxy fence that hands generic shared-memory writes to a tensor store).
#ifndef JAX_TMA_FFI_CUDA_TENSOR_COPY_CUH_
#define JAX_TMA_FFI_CUDA_TENSOR_COPY_CUH_

#include <cuda.h>  // CUtensorMap only

#include <cstdint>

#include "device_helpers.cuh"

namespace jax_tma::device {

#if JAX_TMA_HAS_BULK_COPY

// Generic address of a tensor map: a __grid_constant__ kernel parameter (or
// global/const memory), as the tensor instructions expect.
__device__ __forceinline__ uint64_t tensor_map_addr(const CUtensorMap* map) {
  return reinterpret_cast<uint64_t>(map);
}

// Pulls the 128-B descriptor into the TMA unit's cache ahead of first use.
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(tensor_map_addr(map)) : "memory");
}

// Tiled tensor loads: the box at coordinates {c0 (innermost), c1, ...} of
// `map` -> dense shared memory at `smem` (128-B aligned), completing
// box-bytes transactions on `bar` (out-of-bounds elements are filled and still
// counted). The box's global start address must be 16-B aligned, i.e.
// c0 * element size a multiple of 16; otherwise the instruction faults.
__device__ __forceinline__ void tensor_load_1d(void* smem, const CUtensorMap* map,
                                               uint64_t* bar, int32_t c0) {
  asm volatile(
      "cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3}], [%2];" ::"r"(smem_addr(smem)),
      "l"(tensor_map_addr(map)), "r"(smem_addr(bar)), "r"(c0)
      : "memory");
}

__device__ __forceinline__ void tensor_load_2d(void* smem, const CUtensorMap* map,
                                               uint64_t* bar, int32_t c0, int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(smem_addr(smem)),
      "l"(tensor_map_addr(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1)
      : "memory");
}

__device__ __forceinline__ void tensor_load_3d(void* smem, const CUtensorMap* map,
                                               uint64_t* bar, int32_t c0, int32_t c1,
                                               int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(smem_addr(smem)),
      "l"(tensor_map_addr(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

__device__ __forceinline__ void tensor_load_4d(void* smem, const CUtensorMap* map,
                                               uint64_t* bar, int32_t c0, int32_t c1,
                                               int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(smem_addr(smem)),
      "l"(tensor_map_addr(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2),
      "r"(c3)
      : "memory");
}

__device__ __forceinline__ void tensor_load_5d(void* smem, const CUtensorMap* map,
                                               uint64_t* bar, int32_t c0, int32_t c1,
                                               int32_t c2, int32_t c3, int32_t c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];" ::"r"(smem_addr(smem)),
      "l"(tensor_map_addr(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2),
      "r"(c3), "r"(c4)
      : "memory");
}

// Multicast tiled load: the 3-d box at {c0, c1, c2} lands at the same
// shared-memory offset `smem` in every CTA of the cluster whose bit is set in
// `cta_mask`, and completes its bytes on the mbarrier at offset `bar` in each
// of them. Every receiving CTA must expect those bytes on its own barrier,
// which must be initialised (and the init made cluster-visible) first.
__device__ __forceinline__ void tensor_load_3d_multicast(void* smem, const CUtensorMap* map,
                                                         uint64_t* bar, int32_t c0, int32_t c1,
                                                         int32_t c2, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%3, %4, %5}], [%2], %6;" ::"r"(smem_addr(smem)),
      "l"(tensor_map_addr(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2),
      "h"(cta_mask)
      : "memory");
}

// Tiled tensor stores: dense shared memory at `smem` -> the box at
// non-negative coordinates {c0, ...} of `map`; elements outside the tensor are
// not written. Tracked by the issuing thread's bulk groups
// (store_commit_group / store_wait_read). Same 16-B rule for c0 as loads.
__device__ __forceinline__ void tensor_store_1d(const CUtensorMap* map, const void* smem,
                                                int32_t c0) {
  asm volatile("cp.async.bulk.tensor.1d.global.shared::cta.bulk_group [%0, {%2}], [%1];" ::"l"(
                   tensor_map_addr(map)),
               "r"(smem_addr(smem)), "r"(c0)
               : "memory");
}

__device__ __forceinline__ void tensor_store_2d(const CUtensorMap* map, const void* smem,
                                                int32_t c0, int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
          tensor_map_addr(map)),
      "r"(smem_addr(smem)), "r"(c0), "r"(c1)
      : "memory");
}

__device__ __forceinline__ void tensor_store_3d(const CUtensorMap* map, const void* smem,
                                                int32_t c0, int32_t c1, int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(
          tensor_map_addr(map)),
      "r"(smem_addr(smem)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

__device__ __forceinline__ void tensor_store_4d(const CUtensorMap* map, const void* smem,
                                                int32_t c0, int32_t c1, int32_t c2,
                                                int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group"
      " [%0, {%2, %3, %4, %5}], [%1];" ::"l"(tensor_map_addr(map)),
      "r"(smem_addr(smem)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

__device__ __forceinline__ void tensor_store_5d(const CUtensorMap* map, const void* smem,
                                                int32_t c0, int32_t c1, int32_t c2,
                                                int32_t c3, int32_t c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.global.shared::cta.bulk_group"
      " [%0, {%2, %3, %4, %5, %6}], [%1];" ::"l"(tensor_map_addr(map)),
      "r"(smem_addr(smem)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
}

// Rank-generic forms over a coordinate array (innermost first), for kernels
// templated on the tensor-map rank.
template <int N>
__device__ __forceinline__ void tensor_load(void* smem, const CUtensorMap* map,
                                            uint64_t* bar, const int32_t (&c)[N]) {
  static_assert(N >= 1 && N <= 5, "tensor maps have rank 1..5");
  if constexpr (N == 1) {
    tensor_load_1d(smem, map, bar, c[0]);
  } else if constexpr (N == 2) {
    tensor_load_2d(smem, map, bar, c[0], c[1]);
  } else if constexpr (N == 3) {
    tensor_load_3d(smem, map, bar, c[0], c[1], c[2]);
  } else if constexpr (N == 4) {
    tensor_load_4d(smem, map, bar, c[0], c[1], c[2], c[3]);
  } else {
    tensor_load_5d(smem, map, bar, c[0], c[1], c[2], c[3], c[4]);
  }
}

template <int N>
__device__ __forceinline__ void tensor_store(const CUtensorMap* map, const void* smem,
                                             const int32_t (&c)[N]) {
  static_assert(N >= 1 && N <= 5, "tensor maps have rank 1..5");
  if constexpr (N == 1) {
    tensor_store_1d(map, smem, c[0]);
  } else if constexpr (N == 2) {
    tensor_store_2d(map, smem, c[0], c[1]);
  } else if constexpr (N == 3) {
    tensor_store_3d(map, smem, c[0], c[1], c[2]);
  } else if constexpr (N == 4) {
    tensor_store_4d(map, smem, c[0], c[1], c[2], c[3]);
  } else {
    tensor_store_5d(map, smem, c[0], c[1], c[2], c[3], c[4]);
  }
}

// Im2col tensor loads: pixels_per_column pixels x channels_per_pixel
// channels of the im2col map, walking the pixel box from {c, w, h, d, n}
// (innermost first; the tap-0 pixel of the first output pixel) with the
// map's traversal strides, each pixel shifted by the kernel-tap offsets
// {ow, oh, od}. Pixels outside the tensor read as zero and are still counted
// on `bar`. Rows land densely in `smem` (128-B aligned), one per pixel.
__device__ __forceinline__ void im2col_load_3d(void* smem, const CUtensorMap* map,
                                               uint64_t* bar, int32_t c, int32_t w,
                                               int32_t n, uint16_t ow) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2], {%6};" ::"r"(smem_addr(smem)),
      "l"(tensor_map_addr(map)), "r"(smem_addr(bar)), "r"(c), "r"(w), "r"(n), "h"(ow)
      : "memory");
}

__device__ __forceinline__ void im2col_load_4d(void* smem, const CUtensorMap* map,
                                               uint64_t* bar, int32_t c, int32_t w,
                                               int32_t h, int32_t n, uint16_t ow,
                                               uint16_t oh) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2], {%7, %8};" ::"r"(smem_addr(smem)),
      "l"(tensor_map_addr(map)), "r"(smem_addr(bar)), "r"(c), "r"(w), "r"(h), "r"(n),
      "h"(ow), "h"(oh)
      : "memory");
}

__device__ __forceinline__ void im2col_load_5d(void* smem, const CUtensorMap* map,
                                               uint64_t* bar, int32_t c, int32_t w,
                                               int32_t h, int32_t d, int32_t n, uint16_t ow,
                                               uint16_t oh, uint16_t od) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6, %7}], [%2], {%8, %9, %10};" ::"r"(smem_addr(smem)),
      "l"(tensor_map_addr(map)), "r"(smem_addr(bar)), "r"(c), "r"(w), "r"(h), "r"(d),
      "r"(n), "h"(ow), "h"(oh), "h"(od)
      : "memory");
}

#endif  // JAX_TMA_HAS_BULK_COPY

}  // namespace jax_tma::device

#endif  // JAX_TMA_FFI_CUDA_TENSOR_COPY_CUH_
