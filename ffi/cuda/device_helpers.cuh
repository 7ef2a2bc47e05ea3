// Device-side wrappers for the Hopper async-copy instructions every jax_tma
// kernel uses: mbarriers with transaction counts, 1D bulk copies
// (cp.async.bulk) and their bulk-group completion, and the thread-block
// cluster primitives (rank, cluster barrier, peer addresses, SM-to-SM bulk
// push). One small function per instruction form, so kernels read like the
// algorithm rather than PTX.
#ifndef JAX_TMA_FFI_CUDA_DEVICE_HELPERS_CUH_
#define JAX_TMA_FFI_CUDA_DEVICE_HELPERS_CUH_

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace jax_tma::device {

// Shared-state-space address (32-bit) of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define JAX_TMA_HAS_BULK_COPY 1
#else
#define JAX_TMA_HAS_BULK_COPY 0
#endif

#if JAX_TMA_HAS_BULK_COPY

// mbarrier that completes a phase after `arrivals` arrivals and all expected
// transaction bytes. 8-byte aligned shared memory.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(arrivals)
               : "memory");
}

// Makes mbarrier initialisation visible to the async proxy (the TMA unit
// signals complete_tx on it), which ordinary fences do not cover.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Arrives once and adds `bytes` to the phase's expected transaction count.
// One phase tracks < 2^20 bytes (PTX tx-count range).
__device__ __forceinline__ void expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                   smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

// Spins until the phase with the given parity (0/1) has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n"
        " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// global -> shared bulk copy completing on `bar`. Addresses 16-B aligned,
// bytes a multiple of 16.
__device__ __forceinline__ void bulk_load(void* smem_dst, const void* gmem_src,
                                          uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
      "[%0], [%1], %2, [%3];" ::"r"(smem_addr(smem_dst)),
      "l"(gmem_src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// shared -> global bulk copy, tracked by the issuing thread's bulk groups.
// Same alignment rules as bulk_load.
__device__ __forceinline__ void bulk_store(void* gmem_dst, const void* smem_src,
                                           uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(
                   gmem_dst),
               "r"(smem_addr(smem_src)), "r"(bytes)
               : "memory");
}

// Closes the bulk stores issued so far into one group.
__device__ __forceinline__ void store_commit_group() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until at most N committed store groups still read shared memory:
// their source buffers may be overwritten afterwards.
template <int N>
__device__ __forceinline__ void store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// Makes this thread's ordinary writes to shared memory visible to the async
// proxy: a bulk store issued after it (and after a barrier, by any thread
// of the CTA) then reads them.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// shared -> global bulk reduce-add, tracked by the issuing thread's bulk
// groups like bulk_store: dst[i] += src[i] for each element of type T
// (float, double, uint32_t, uint64_t, __half, __nv_bfloat16; signed
// integers add as the unsigned type of their width). Same alignment rules as
// bulk_store; f32 adds may flush subnormals, f16/bf16 do not (.noftz).
template <typename T>
__device__ __forceinline__ void bulk_reduce_add(void* gmem_dst, const void* smem_src,
                                                uint32_t bytes);
#define JAX_TMA_BULK_REDUCE_ADD(T, ptx_type)                                              \
  template <>                                                                             \
  __device__ __forceinline__ void bulk_reduce_add<T>(void* gmem_dst, const void* smem_src, \
                                                     uint32_t bytes) {                    \
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add." ptx_type       \
                 " [%0], [%1], %2;" ::"l"(gmem_dst),                                      \
                 "r"(smem_addr(smem_src)), "r"(bytes)                                     \
                 : "memory");                                                             \
  }
JAX_TMA_BULK_REDUCE_ADD(float, "f32")
JAX_TMA_BULK_REDUCE_ADD(double, "f64")
JAX_TMA_BULK_REDUCE_ADD(uint32_t, "u32")
JAX_TMA_BULK_REDUCE_ADD(uint64_t, "u64")
JAX_TMA_BULK_REDUCE_ADD(__half, "noftz.f16")
JAX_TMA_BULK_REDUCE_ADD(__nv_bfloat16, "noftz.bf16")
#undef JAX_TMA_BULK_REDUCE_ADD

// ---- thread-block clusters (sm_90) ----

// This CTA's rank in its cluster, 0 .. cluster size - 1.
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}

// Cluster-wide barrier: every thread of every CTA in the cluster arrives
// (release: its earlier writes, and mbarrier inits after
// fence_mbarrier_init, become visible to the cluster) and waits for all
// (acquire). Every thread of the CTA must call it (.aligned), converged.
__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n\t"
      "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The shared::cluster address of the object at `p` (this CTA's shared
// memory) in the shared memory of the cluster's CTA `rank`.
__device__ __forceinline__ uint32_t peer_smem_addr(const void* p, uint32_t rank) {
  uint32_t addr;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(addr)
               : "r"(smem_addr(p)), "r"(rank));
  return addr;
}

// SM-to-SM bulk copy: `bytes` of this CTA's shared memory at `src` -> a
// peer CTA's shared memory at `peer_dst` (from peer_smem_addr), completing
// `bytes` transactions on the peer's mbarrier at `peer_bar` (remote
// complete_tx). 16-B aligned, bytes a multiple of 16. The source may be
// reused only once the peer has seen its barrier complete.
__device__ __forceinline__ void bulk_push_to_peer(uint32_t peer_dst, const void* src,
                                                  uint32_t bytes, uint32_t peer_bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes"
      " [%0], [%1], %2, [%3];" ::"r"(peer_dst),
      "r"(smem_addr(src)), "r"(bytes), "r"(peer_bar)
      : "memory");
}

#endif  // JAX_TMA_HAS_BULK_COPY

}  // namespace jax_tma::device

#endif  // JAX_TMA_FFI_CUDA_DEVICE_HELPERS_CUH_
