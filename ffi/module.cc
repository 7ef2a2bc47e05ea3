// The one extension module, jax_tma._jax_tma: hands Python the FFI handler
// capsules (CPU always, CUDA when built) and what was compiled. Benchmark
// targets and the raw launch hook live in benchmarks/ffi/ (_jax_tma_bench).
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "handlers.h"
#include "element_sum.h"
#include "module_defs.h"
#include "path_counts.h"
#include "rules.h"
#include "xla/ffi/api/c_api.h"

#if JAX_TMA_WITH_CUDA
#include <cuda_runtime_api.h>

#include "copy/copy_plan.h"
#include "cuda/device_info.h"
#include "cuda/handlers.h"
#endif

namespace nb = nanobind;

namespace {

template <typename Fn>
nb::capsule Capsule(Fn* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

NB_MODULE(_jax_tma, m) {
  m.doc() = "jax_tma FFI handlers (see jax_tma/_ffi.py)";

  // Every target, state type and path of the family list (families.inc).
  m.def("cpu_registrations", []() {
    nb::dict d;
#define JAX_TMA_CPU_TARGET(Name, target) d[target] = Capsule(JaxTma##Name##Cpu);
#include "families.inc"
    return d;
  });

  m.def("cuda_registrations", []() {
    nb::dict d;
#if JAX_TMA_WITH_CUDA
#define JAX_TMA_CUDA_TARGET(Name, target) d[target] = Capsule(JaxTma##Name##Cuda);
#include "families.inc"
    // A target with an instantiate stage registers both stages.
#define JAX_TMA_CUDA_INSTANTIATE(Name, target)                          \
  {                                                                     \
    nb::dict stages;                                                    \
    stages["instantiate"] = Capsule(JaxTma##Name##CudaInstantiate);     \
    stages["execute"] = Capsule(JaxTma##Name##Cuda);                    \
    d[target] = stages;                                                 \
  }
#include "families.inc"
#endif
    return d;
  });

  // FFI types of the CUDA targets' per-call-site state, registered before
  // the targets.
  m.def("cuda_types", []() {
    nb::dict d;
#if JAX_TMA_WITH_CUDA
#define JAX_TMA_CUDA_STATE(Name, type)                                  \
  {                                                                     \
    nb::dict t;                                                         \
    t["type_id"] = nb::capsule(jax_tma::Name##TypeId());                \
    t["type_info"] = nb::capsule(jax_tma::Name##TypeInfo());            \
    d[type] = t;                                                        \
  }
#include "families.inc"
#endif
    return d;
  });

  // Each family of the list with its FFI targets (all have a CPU handler),
  // those of them with a CUDA handler in the manifest (built or not), its
  // batch-partitionable targets and its path counters, in the list's order:
  // what registration (jax_tma/_ffi.py) and the tests' family descriptors
  // (tests/families/) read.
  m.def("families", []() {
    nb::dict d;
    nb::list targets;
    nb::list cuda_targets;
    nb::list batch_partitionable;
    nb::list paths;
#define JAX_TMA_FAMILY(name)                                            \
  targets = nb::list();                                                 \
  cuda_targets = nb::list();                                            \
  batch_partitionable = nb::list();                                     \
  paths = nb::list();                                                   \
  {                                                                     \
    nb::dict family;                                                    \
    family["targets"] = targets;                                        \
    family["cuda_targets"] = cuda_targets;                              \
    family["batch_partitionable"] = batch_partitionable;                \
    family["paths"] = paths;                                            \
    d[#name] = family;                                                  \
  }
#define JAX_TMA_CPU_TARGET(Name, target) targets.append(target);
#define JAX_TMA_CUDA_TARGET(Name, target) cuda_targets.append(target);
#define JAX_TMA_BATCH_PARTITIONABLE(target) batch_partitionable.append(target);
#define JAX_TMA_PATH(Name, path) paths.append(path);
#include "families.inc"
    return d;
  });

  // The rules Python checks against (rules.h): the shared ones, then each
  // family's, by name.
  m.def("rules", []() {
    jax_tma::Rules rules;
    rules.Int("tma_align_bytes", jax_tma::kTmaAlignBytes);
    rules.Tuple("tma_min_compute_capability", {jax_tma::kTmaMinComputeMajor, 0});
    rules.Dtypes("summed_dtypes", [](xla::ffi::DataType t) {
      jax_tma::SumKind kind;
      int components;
      return jax_tma::SumKindOf(t, &kind, &components);
    });
#define JAX_TMA_RULES(Name) jax_tma::Name##Rules(&rules);
#include "families.inc"
    nb::dict d;
    for (const auto& [name, value] : rules.ints) d[name.c_str()] = value;
    for (const auto& [name, values] : rules.tuples) d[name.c_str()] = nb::tuple(nb::cast(values));
    for (const auto& [name, names] : rules.dtypes) d[name.c_str()] = nb::tuple(nb::cast(names));
    for (const auto& [name, words] : rules.texts) d[name.c_str()] = words;
    return d;
  });

  // Calls per op and path ("<op>.<path>": ...) since the module loaded; a
  // CUDA graph that XLA replays counts once, when it is recorded.
  m.def("path_counts", []() {
    nb::dict d;
    for (int p = 0; p < static_cast<int>(jax_tma::Path::kCount); ++p) {
      d[jax_tma::kPathNames[p]] = jax_tma::PathCount(static_cast<jax_tma::Path>(p));
    }
    return d;
  });

  // What families add beside their handlers (module_defs.h).
#define JAX_TMA_MODULE(Name) jax_tma::Name##Module(m);
#include "families.inc"

  m.attr("cuda_compiled") = static_cast<bool>(JAX_TMA_WITH_CUDA);
  m.attr("cuda_archs") = JAX_TMA_CUDA_ARCHS;
  m.attr("ffi_api_version") =
      nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);

#if JAX_TMA_WITH_CUDA
  m.attr("cuda_runtime_version") = CUDART_VERSION;
  // The measured device whose tuned plans CUDA device `device` runs
  // (copy/copy_plan.h: the nearest in peak memory bandwidth); "" where the
  // device cannot be queried.
  m.def("device_plan", [](int device) -> std::string {
    jax_tma::DeviceInfo info;
    if (jax_tma::GetDeviceInfo(device, &info).failure()) return "";
    return jax_tma::CopyDevicePlanFor(info.memory_tbps).measured_on;
  }, nb::arg("device"));
#endif
}
