// Functions that a family adds to the extension module jax_tma._jax_tma
// beside its handlers (a JAX_TMA_MODULE(Name) line in its manifest):
// jax_tma::<Name>Module, defined in the family's CPU sources (always built)
// and called once by module.cc when the module loads.
#ifndef JAX_TMA_FFI_MODULE_DEFS_H_
#define JAX_TMA_FFI_MODULE_DEFS_H_

#include <nanobind/nanobind.h>

namespace jax_tma {

#define JAX_TMA_MODULE(Name) void Name##Module(nanobind::module_& m);
#include "families.inc"

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_MODULE_DEFS_H_
