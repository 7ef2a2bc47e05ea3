// The TMA bulk copy pipeline of the whole-buffer copy kernels (bulk_copy.cu
// and those of other families that move whole buffers): the edges of a copy
// and the chunks of its 16-B aligned body, streamed global -> shared -> global with
// cp.async.bulk, several stages in flight. copy_plan.h lays out the chunks.
#ifndef JAX_TMA_FFI_COPY_BULK_PIPELINE_CUH_
#define JAX_TMA_FFI_COPY_BULK_PIPELINE_CUH_

#include <cstdint>

#include "copy/copy_plan.h"
#include "cuda/device_helpers.cuh"

namespace jax_tma::device {

#if JAX_TMA_HAS_BULK_COPY
// Bytes [0, head) and [head + body, bytes) are edges, copied by the copy's
// CTA 0 (`cta`: this CTA's index among the copy's) with ordinary stores;
// they never overlap the body the async proxy writes, so no proxy fence is
// needed between them. Every thread of the CTA calls it.
__device__ __forceinline__ void CopyBulkEdges(const uint8_t* __restrict__ src,
                                              uint8_t* __restrict__ dst, int64_t bytes,
                                              int64_t head, int64_t body, int64_t cta) {
  if (cta == 0) {
    for (int64_t i = threadIdx.x; i < head; i += blockDim.x) dst[i] = src[i];
    for (int64_t i = head + body + threadIdx.x; i < bytes; i += blockDim.x) {
      dst[i] = src[i];
    }
  }
}

// One chunk of `bytes` (16-B aligned addresses, a multiple of 16) from
// `src` to `dst` through `buf` by the calling thread alone: a bulk load
// completing on `bar` (initialised here), then a bulk store. Returns once
// shared memory is no longer read; the store may still be writing global
// memory.
__device__ __forceinline__ void CopyOneBulkChunk(const uint8_t* __restrict__ src,
                                                 uint8_t* __restrict__ dst, uint32_t bytes,
                                                 uint8_t* buf, uint64_t* bar) {
  mbarrier_init(bar, 1);
  fence_mbarrier_init();
  expect_tx(bar, bytes);
  bulk_load(buf, src, bytes, bar);
  mbarrier_wait(bar, 0);
  bulk_store(dst, buf, bytes);
  store_commit_group();
  store_wait_read<0>();
}

// One thread drives the whole pipeline of this CTA (the copy engine does the
// moving): CTA b (`cta` of the copy's `ctas`, in a grid that may run other
// copies too) copies the chunks [b * chunks_per_cta, (b+1) * chunks_per_cta)
// of the body, then, where `counters` is a work counter (the dynamic
// schedule), claims chunks past the copy's static round one at a time.
// `stage_buf` holds `stages` chunks; `full` and `chunk_of` one entry per
// stage. Returns once shared memory is no longer read; the stores may still
// be writing global memory.
__device__ __forceinline__ void StreamBulkChunks(
    const uint8_t* __restrict__ src, uint8_t* __restrict__ dst, int64_t head, int64_t body,
    uint32_t chunk, int stages, int64_t chunks_per_cta, int64_t cta, int64_t ctas,
    unsigned long long* counters, uint8_t* stage_buf, uint64_t* full, int64_t* chunk_of) {
  const int64_t nchunks = (body + chunk - 1) / chunk;
  const int64_t body_end = head + body;
  const int64_t first = cta * chunks_per_cta;
  const int64_t static_end = min(first + chunks_per_cta, nchunks);
  const int64_t claimed_from = ctas * chunks_per_cta;

  // Chunk index of this CTA's next chunk (>= nchunks: none left). Claims
  // come in order, so once one comes back empty every later one would too.
  int64_t taken = 0;
  auto next_chunk = [&]() -> int64_t {
    const int64_t j = taken++;
    if (first + j < static_end) return first + j;
    if (counters == nullptr || claimed_from >= nchunks) return nchunks;
    return claimed_from + static_cast<int64_t>(atomicAdd(&counters[0], 1ull));
  };
  auto size_of = [&](int64_t k) {
    return static_cast<uint32_t>(min(static_cast<int64_t>(chunk), body_end - (head + k * chunk)));
  };
  // Stages are used round robin; stage indices and each stage's barrier
  // parity are kept as running values: 64-bit divisions for them slow the
  // issuing thread, and with it the whole dynamic schedule.
  int load_stage = 0, wait_stage = 0;
  uint32_t parity = 0;  // bit s: parity of the next phase of stage s
  auto load = [&](int64_t k) {
    const int s = load_stage;
    load_stage = s + 1 == stages ? 0 : s + 1;
    chunk_of[s] = k;
    expect_tx(&full[s], size_of(k));
    bulk_load(stage_buf + static_cast<size_t>(s) * chunk, src + head + k * chunk,
              size_of(k), &full[s]);
  };

  for (int s = 0; s < stages; ++s) mbarrier_init(&full[s], 1);
  fence_mbarrier_init();
  int64_t in_flight = 0;
  // The next chunk is fetched one load ahead, so a claim's round trip
  // overlaps the wait for data already in flight.
  int64_t pending = next_chunk();
  while (in_flight < stages && pending < nchunks) {
    load(pending);
    ++in_flight;
    pending = next_chunk();
  }
  for (int64_t waited = 0; in_flight > 0; ++waited) {
    const int s = wait_stage;
    wait_stage = s + 1 == stages ? 0 : s + 1;
    const int64_t k = chunk_of[s];  // this thread's own write: read ahead of the wait
    mbarrier_wait(&full[s], (parity >> s) & 1u);
    parity ^= 1u << s;
    bulk_store(dst + head + k * chunk, stage_buf + static_cast<size_t>(s) * chunk, size_of(k));
    store_commit_group();
    --in_flight;
    // From the second chunk on, refill the previous chunk's stage once its
    // store has finished reading it (at most one group, this chunk's, may
    // still read shared memory). Only a full pipeline refills, so that stage
    // is always the next one round robin.
    if (waited > 0 && pending < nchunks) {
      store_wait_read<1>();
      load(pending);
      ++in_flight;
      pending = next_chunk();
    }
  }
  // Shared memory must outlive every store that reads it.
  store_wait_read<0>();
}
#endif  // JAX_TMA_HAS_BULK_COPY

}  // namespace jax_tma::device

#endif  // JAX_TMA_FFI_COPY_BULK_PIPELINE_CUH_
