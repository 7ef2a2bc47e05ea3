// The launch configuration of a kernel in thread-block clusters, for
// cudaLaunchKernelEx and cudaOccupancyMaxActiveClusters.
#ifndef JAX_TMA_FFI_CUDA_CLUSTER_LAUNCH_H_
#define JAX_TMA_FFI_CUDA_CLUSTER_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstddef>

namespace jax_tma {

// `grid` CTAs of `block` threads with `smem` bytes of dynamic shared memory
// each, on `stream`, in clusters of `cluster` consecutive CTAs along x (0:
// no cluster attribute). `config` points at the attribute held here, so the
// object is neither copied nor moved.
struct ClusterLaunch {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attr = {};

  ClusterLaunch(unsigned grid, unsigned block, std::size_t smem, unsigned cluster,
                cudaStream_t stream = nullptr) {
    config.gridDim = dim3(grid);
    config.blockDim = dim3(block);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = cluster;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    config.attrs = &attr;
    config.numAttrs = cluster > 0 ? 1 : 0;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_CUDA_CLUSTER_LAUNCH_H_
