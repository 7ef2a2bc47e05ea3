// The one extension module, jax_tma._jax_tma: hands Python the FFI handler
// capsules (CPU always, CUDA when built) and what was compiled. Benchmark
// targets and the raw launch hook live in benchmarks/ffi/ (_jax_tma_bench).
#include <stdexcept>
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "handlers.h"
#include "path_counts.h"
#include "ppermute/peer_link.h"
#include "xla/ffi/api/c_api.h"

#if JAX_TMA_WITH_CUDA
#include <cuda_runtime_api.h>

#include "copy/copy_plan.h"  // kDynamicBulkMinBytes
#include "cuda/handlers.h"
#endif

namespace nb = nanobind;

namespace {

template <typename Fn>
nb::capsule Capsule(Fn* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

#if JAX_TMA_WITH_CUDA
void CheckCuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
  }
}

// Whether `device` can map `peer`'s memory (what jax_tma.ppermute reads
// through); lowering falls back to lax.ppermute where it cannot.
bool CanAccessPeer(int device, int peer) {
  if (device == peer) return true;
  int can = 0;
  CheckCuda(cudaDeviceCanAccessPeer(&can, device, peer), "cudaDeviceCanAccessPeer");
  return can != 0;
}
#endif

}  // namespace

NB_MODULE(_jax_tma, m) {
  m.doc() = "jax_tma FFI handlers (see jax_tma/_ffi.py)";

  m.def("cpu_registrations", []() {
    nb::dict d;
    d["jax_tma_copy"] = Capsule(JaxTmaCopyCpu);
    d["jax_tma_window"] = Capsule(JaxTmaWindowCpu);
    d["jax_tma_ppermute"] = Capsule(JaxTmaPpermuteCpu);
    d["jax_tma_broadcast"] = Capsule(JaxTmaBroadcastCpu);
    d["jax_tma_im2col"] = Capsule(JaxTmaIm2colCpu);
    d["jax_tma_gather"] = Capsule(JaxTmaGatherCpu);
    d["jax_tma_scatter"] = Capsule(JaxTmaScatterCpu);
    return d;
  });

  m.def("cuda_registrations", []() {
    nb::dict d;
#if JAX_TMA_WITH_CUDA
    nb::dict copy;
    copy["instantiate"] = Capsule(JaxTmaCopyCudaInstantiate);
    copy["execute"] = Capsule(JaxTmaCopyCuda);
    d["jax_tma_copy"] = copy;
    d["jax_tma_window"] = Capsule(JaxTmaWindowCuda);
    d["jax_tma_ppermute"] = Capsule(JaxTmaPpermuteCuda);
    d["jax_tma_broadcast"] = Capsule(JaxTmaBroadcastCuda);
    d["jax_tma_im2col"] = Capsule(JaxTmaIm2colCuda);
    d["jax_tma_gather"] = Capsule(JaxTmaGatherCuda);
    d["jax_tma_scatter"] = Capsule(JaxTmaScatterCuda);
#endif
    return d;
  });

  // FFI types of the CUDA targets' per-call-site state, registered before
  // the targets.
  m.def("cuda_types", []() {
    nb::dict d;
#if JAX_TMA_WITH_CUDA
    nb::dict site;
    site["type_id"] = nb::capsule(jax_tma::CopySiteTypeId());
    site["type_info"] = nb::capsule(jax_tma::CopySiteTypeInfo());
    d["jax_tma_copy_site"] = site;
#endif
    return d;
  });

  // Calls per op and path ("window.tiled": ...) since the module loaded; a
  // CUDA graph that XLA replays counts once, when it is recorded.
  m.def("path_counts", []() {
    nb::dict d;
    for (int p = 0; p < static_cast<int>(jax_tma::Path::kCount); ++p) {
      d[jax_tma::kPathNames[p]] = jax_tma::PathCount(static_cast<jax_tma::Path>(p));
    }
    return d;
  });

  // Starts this process's end of jax_tma.ppermute's process link (see
  // ffi/ppermute/peer_link.h) before its name is published.
  m.def(
      "listen_link",
      [](const std::string& name, int process) {
        xla::ffi::Error err = jax_tma::ListenLink(jax_tma::LinkPeer{process, name});
        if (err.failure()) throw std::runtime_error(std::string(err.message()));
      },
      nb::arg("name"), nb::arg("process"));

  m.attr("cuda_compiled") = static_cast<bool>(JAX_TMA_WITH_CUDA);
  m.attr("cuda_archs") = JAX_TMA_CUDA_ARCHS;
  m.attr("ffi_api_version") =
      nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);

#if JAX_TMA_WITH_CUDA
  m.attr("cuda_runtime_version") = CUDART_VERSION;
  m.def("can_access_peer", &CanAccessPeer, nb::arg("device"), nb::arg("peer"));
  m.attr("_dynamic_bulk_min_bytes") = jax_tma::kDynamicBulkMinBytes;
  m.attr("_auto_bulk_min_bytes") = jax_tma::kAutoBulkMinBytes;
#endif
}
