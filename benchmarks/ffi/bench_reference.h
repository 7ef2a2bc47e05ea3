// Handler symbols of the benchmarks' reference targets (bench_reference.cu),
// registered by _jax_tma_bench, never by jax_tma itself; and the peer-copy
// timing that _jax_tma_bench.peer_copy exposes (the link's ceiling).
#ifndef JAX_TMA_BENCHMARKS_FFI_BENCH_REFERENCE_H_
#define JAX_TMA_BENCHMARKS_FFI_BENCH_REFERENCE_H_

#include <cstddef>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaBenchMemcpyCuda);   // "jax_tma_bench_memcpy"
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaBenchSeedCopyCuda); // "jax_tma_bench_seed_copy"
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaBenchReadCuda);     // "jax_tma_bench_read"
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxTmaBenchWriteCuda);    // "jax_tma_bench_write"

namespace jax_tma::bench {

// What PeerCopyTime measured. Per pair: the µs of one copy (its copies' time
// by CUDA events on its stream, ÷ their count) and whether its two devices
// have peer access both ways (without it the driver stages a copy through the
// host: no link's ceiling). And the host's µs to queue every copy against the
// µs the streams were held for: the copies ran back to back only where
// queue_us < hold_us.
struct PeerCopyTimes {
  std::vector<double> us_per_copy;
  std::vector<bool> peer_access;
  double queue_us = 0;
  double hold_us = 0;
};

// `iters` cudaMemcpyPeerAsync of `bytes` for every (source, destination)
// device pair at once, each pair from a buffer of its own on the source to
// one on the destination, on a stream of the source device; peer access is
// enabled where the devices have it (and left enabled: jax_tma relies on
// it). Buffers, streams and events are its own, freed on return; the current
// device is restored. Throws std::invalid_argument for empty pairs, zero
// bytes or iters < 1, std::runtime_error naming the CUDA call that failed.
PeerCopyTimes PeerCopyTime(const std::vector<std::pair<int, int>>& pairs, std::size_t bytes,
                           int iters);

}  // namespace jax_tma::bench

#endif  // JAX_TMA_BENCHMARKS_FFI_BENCH_REFERENCE_H_
