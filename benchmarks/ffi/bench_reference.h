// Handler symbols of the benchmarks' reference targets (bench_reference.cu),
// registered by _jax_tma_bench, never by jax_tma itself.
#ifndef JAX_TMA_BENCHMARKS_FFI_BENCH_REFERENCE_H_
#define JAX_TMA_BENCHMARKS_FFI_BENCH_REFERENCE_H_

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaBenchMemcpyCuda);   // "jax_tma_bench_memcpy"
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaBenchSeedCopyCuda); // "jax_tma_bench_seed_copy"
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaBenchReadCuda);     // "jax_tma_bench_read"
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaBenchWriteCuda);    // "jax_tma_bench_write"

#endif  // JAX_TMA_BENCHMARKS_FFI_BENCH_REFERENCE_H_
