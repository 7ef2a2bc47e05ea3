// Probe of a compute-sanitizer limitation, run by scripts/gpu_check.sh
// before the broadcast self-test under synccheck. Each CTA of a cluster loads
// 1 KiB into its own shared memory with one cp.async.bulk completing on its
// own mbarrier, between two cluster barriers: no cross-CTA copy, nothing for
// synccheck to object to. Plain, memcheck and racecheck runs pass at every
// cluster size; under synccheck (CUDA 13.0, H100, 2026-11-22) a 16-CTA
// (non-portable) cluster ends in "an illegal memory access" with any
// --num-cuda-barriers, while 8 passes. While this probe fails, synccheck
// cannot judge 16-CTA kernels, and the script runs it on clusters of up to 8.
//   usage: synccheck_cluster_probe CLUSTER_SIZE   (exit 0: loads all correct)
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/device_helpers.cuh"
#include "cuda/launch.h"

namespace {

constexpr int kBytes = 1024;
constexpr int kClustersInGrid = 64;
constexpr int kSmem = 32 * 1024 + 128;  // as the broadcast kernel: one CTA per 32 KiB

__global__ void ProbeKernel(const uint8_t* src, uint32_t* out) {
#if JAX_TMA_HAS_BULK_COPY
  using namespace jax_tma::device;
  extern __shared__ __align__(128) uint8_t buf[];
  __shared__ uint64_t full;
  const uint32_t rank = cluster_ctarank();
  if (threadIdx.x == 0) {
    mbarrier_init(&full, 1);
    fence_mbarrier_init();
  }
  __syncwarp();
  cluster_sync();
  if (threadIdx.x == 0) {
    expect_tx(&full, kBytes);
    bulk_load(buf, src + static_cast<size_t>(blockIdx.x) * kBytes, kBytes, &full);
    mbarrier_wait(&full, 0);
    out[blockIdx.x] = buf[rank] + 1u;
  }
  __syncwarp();
  cluster_sync();
#endif
}

}  // namespace

int main(int argc, char** argv) {
  const int cluster = argc > 1 ? std::atoi(argv[1]) : 16;
  const int grid = cluster * kClustersInGrid;
  std::vector<uint8_t> h_src(static_cast<size_t>(grid) * kBytes);
  for (size_t i = 0; i < h_src.size(); ++i) h_src[i] = static_cast<uint8_t>(i * 7 + 3);
  uint8_t* src = nullptr;
  uint32_t* out = nullptr;
  cudaMalloc(&src, h_src.size());
  cudaMalloc(&out, grid * sizeof(uint32_t));
  cudaMemcpy(src, h_src.data(), h_src.size(), cudaMemcpyHostToDevice);
  cudaMemset(out, 0, grid * sizeof(uint32_t));
  cudaFuncSetAttribute(ProbeKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  const jax_tma::ClusterLaunch config(grid, 32, kSmem, cluster);
  const cudaError_t launch =
      cudaLaunchKernelEx(&config.config, ProbeKernel, static_cast<const uint8_t*>(src), out);
  const cudaError_t sync = cudaDeviceSynchronize();
  std::vector<uint32_t> h_out(grid);
  cudaMemcpy(h_out.data(), out, grid * sizeof(uint32_t), cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int b = 0; b < grid; ++b) {
    bad += h_out[b] != h_src[static_cast<size_t>(b) * kBytes + b % cluster] + 1u;
  }
  std::printf("synccheck_cluster_probe: cluster %d: launch %s, sync %s, %d of %d CTAs wrong\n",
              cluster, cudaGetErrorString(launch), cudaGetErrorString(sync), bad, grid);
  return launch == cudaSuccess && sync == cudaSuccess && bad == 0 ? 0 : 1;
}
