// Cached per-device attributes (see device_info.h).
#include "device_info.h"

namespace jax_tma {

static ffi::Error QueryDeviceInfo(int device, DeviceInfo* info) {
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &info->cc_major, cudaDevAttrComputeCapabilityMajor, device));
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &info->cc_minor, cudaDevAttrComputeCapabilityMinor, device));
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &info->sm_count, cudaDevAttrMultiProcessorCount, device));
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &info->smem_per_block_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
      device));
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &info->smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  int clock_khz = 0;
  int bus_bits = 0;
  JAX_TMA_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device));
  JAX_TMA_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device));
  // Double data rate: two transfers a clock.
  info->memory_tbps = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e12;
  return ffi::Error::Success();
}

ffi::Error GetDeviceInfo(int device, DeviceInfo* out) {
  static PerDevice<DeviceInfo> cache;
  return cache.Get(device, QueryDeviceInfo, out);
}

}  // namespace jax_tma
