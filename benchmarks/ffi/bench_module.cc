// The benchmarks' extension module _jax_tma_bench (built with JAX_TMA_BENCH=ON,
// never part of a jax_tma wheel): the capsules of the reference targets the
// benchmarks time jax_tma against, a raw launch hook of jax_tma's copy
// kernels (the same objects as the product's) for the bulk-pipeline sweep and
// the GPU tests of addresses that XLA's aligned buffers never have, and the
// timing of cudaMemcpyPeerAsync between devices (ppermute's link ceiling).
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bench_reference.h"
#include "common.h"
#include "copy/copy_launch.h"
#include "xla/ffi/api/c_api.h"

namespace nb = nanobind;

namespace {

template <typename Fn>
nb::capsule Capsule(Fn* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

void CheckCuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
  }
}

// Launches a copy of `nbytes` from address `src` to address `dst` on
// `device` with the given method and pipeline shape, on `stream` (0: the
// default stream), and returns without waiting: call Synchronize before
// reading `dst`. Raw device addresses, so any misaligned offset can be
// exercised. The dynamic schedule claims chunks from this module's counter
// slot, so dynamic launches must not overlap: keep them on one stream.
void RawCopy(const std::string& method, int device, std::uintptr_t dst,
             std::uintptr_t src, std::size_t nbytes, uint32_t chunk_bytes,
             int stages, int64_t chunks_per_cta, bool dynamic, std::uintptr_t stream) {
  constexpr std::string_view kOp = "_jax_tma_bench.raw_copy";
  jax_tma::Method parsed;
  xla::ffi::Error err =
      jax_tma::ParseMethod(kOp, method, &parsed, jax_tma::TmaSpelling::kTmaOrBulk);
  if (err.failure()) throw nb::value_error(err.message().c_str());
  CheckCuda(cudaSetDevice(device), "cudaSetDevice");
  const jax_tma::BulkCopyConfig config{chunk_bytes, stages, chunks_per_cta, dynamic};
  const jax_tma::ByteCopy c{reinterpret_cast<const void*>(src), reinterpret_cast<void*>(dst),
                            nbytes};
  jax_tma::DeviceInfo info;
  jax_tma::CopyPlan plan;
  err = jax_tma::GetDeviceInfo(device, &info);
  if (err.success()) {
    err = jax_tma::PlanCopy(kOp, parsed, c, info, device, jax_tma::kRawCounterSlot, &config, &plan);
  }
  if (err.success()) {
    err = jax_tma::LaunchCopy(plan, c, reinterpret_cast<cudaStream_t>(stream), device);
  }
  if (err.failure()) throw std::runtime_error(err.message());
}

// Waits for all work on `device`; raises the first error a kernel left.
void Synchronize(int device) {
  CheckCuda(cudaSetDevice(device), "cudaSetDevice");
  CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

// bench::PeerCopyTime as a dict: {"us_per_copy": [per pair], "peer_access":
// [per pair], "queue_us", "hold_us"}.
nb::dict PeerCopy(const std::vector<std::pair<int, int>>& pairs, std::size_t nbytes,
                  int iters) {
  const jax_tma::bench::PeerCopyTimes t = jax_tma::bench::PeerCopyTime(pairs, nbytes, iters);
  nb::list us, access;
  for (double v : t.us_per_copy) us.append(v);
  for (bool v : t.peer_access) access.append(v);
  nb::dict d;
  d["us_per_copy"] = us;
  d["peer_access"] = access;
  d["queue_us"] = t.queue_us;
  d["hold_us"] = t.hold_us;
  return d;
}

}  // namespace

NB_MODULE(_jax_tma_bench, m) {
  m.doc() = "jax_tma's benchmark reference targets and raw launch hook (benchmarks/references.py)";

  m.def("cuda_registrations", []() {
    nb::dict d;
    d["jax_tma_bench_memcpy"] = Capsule(JaxTmaBenchMemcpyCuda);
    d["jax_tma_bench_seed_copy"] = Capsule(JaxTmaBenchSeedCopyCuda);
    d["jax_tma_bench_read"] = Capsule(JaxTmaBenchReadCuda);
    d["jax_tma_bench_write"] = Capsule(JaxTmaBenchWriteCuda);
    return d;
  });

  const auto& d = jax_tma::kDefaultBulkCopyConfig;
  m.def("raw_copy", &RawCopy, nb::arg("method"), nb::arg("device"),
        nb::arg("dst"), nb::arg("src"), nb::arg("nbytes"),
        nb::arg("chunk_bytes") = d.chunk_bytes, nb::arg("stages") = d.stages,
        nb::arg("chunks_per_cta") = d.chunks_per_cta, nb::arg("dynamic") = false,
        nb::arg("stream") = 0);
  m.def("synchronize", &Synchronize, nb::arg("device"));
  // `iters` cudaMemcpyPeerAsync of `nbytes` for each (source, destination)
  // pair of device ordinals, all pairs at once (bench_reference.h).
  m.def("peer_copy", &PeerCopy, nb::arg("pairs"), nb::arg("nbytes"), nb::arg("iters"));
  // The shapes jax_tma.copy launches on `device`, for the sweep to rank
  // (bench_tune_bulk.py).
  m.def("shipped_bulk_configs", [](int device) {
    jax_tma::DeviceInfo info;
    const xla::ffi::Error err = jax_tma::GetDeviceInfo(device, &info);
    if (err.failure()) throw std::runtime_error(err.message());
    const auto as_tuple = [](const jax_tma::BulkCopyConfig& c) {
      return nb::make_tuple(c.chunk_bytes, c.stages, c.chunks_per_cta, c.dynamic);
    };
    nb::dict shipped;
    shipped["static"] = as_tuple(jax_tma::kDefaultBulkCopyConfig);
    shipped["dynamic"] = as_tuple(jax_tma::CopyDevicePlanFor(info.memory_tbps).dynamic);
    return shipped;
  }, nb::arg("device"));
  m.attr("dynamic_bulk_min_bytes") = jax_tma::kDynamicBulkMinBytes;
  m.attr("ffi_api_version") = nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
}
