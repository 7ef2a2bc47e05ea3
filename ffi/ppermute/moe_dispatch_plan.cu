// CUDA handlers of the routing plan's calls (moe_dispatch_plan.h): one CTA a
// batch member, where XLA's formulation of the same plan takes about fifteen
// small kernels (benchmarks/TUNING.md, the decode dispatch's plan).
//
// The member's ids are read once, coalesced, into shared memory (each
// choice's expert in 16 bits, with a table of each expert's device), where
// every pass reads them. The choices, in (t, j) order, are cut into one run
// a warp, and the tokens too (whole rounds of 32: at a decode step's 128
// tokens four warps hold them all, and the others skip the token passes).
// The ranks come in two passes over the runs, 32 choices at a time: the
// first counts each warp's choices of each expert (and tokens of each
// device), a scan over the warps turns the counts into each warp's start,
// and the second adds each choice's rank among the equal experts of its 32
// (__match_any_sync), advances the start and leaves the choice's slot in
// shared memory; the pass over the tokens then writes each pair's row.
// One SM issues every instruction of a member, so the passes do as few a
// warp as they can (Nsight Compute, H200: the first form's 68 K warp
// instructions took 21 us at a decode step, at 2.3 a cycle).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/cuda_status.h"
#include "cuda/handlers.h"
#include "path_counts.h"
#include "ppermute/moe_dispatch_plan.h"

namespace jax_tma {
namespace {

// Eight warps: each runs the passes' fixed work (its runs, its pointers), so
// that more issue more instructions on the member's one SM than their rounds
// save (on an H200, 128 tokens' top-8 of 32 experts: 7.8 us with 1,024
// threads, 7.5 with 256; of 256 experts, 10.0 and 9.2; 512 tokens of 32, 17.4
// and 18.5).
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kAll = 0xffffffffu;

struct RouteDims {
  int32_t tokens, choices, experts, parts, capacity;  // capacity -1: none
  int32_t local;                                      // experts / parts
  __device__ int32_t Choices() const { return tokens * choices; }
  __device__ int32_t Width() const { return experts + parts + 1; }
  __device__ int32_t Pairs() const { return tokens * min(choices, parts); }
};

// A member's choices in shared memory (StageExperts): each one's expert
// (`experts` where it is not valid), and each expert's device (`parts` for
// `experts`).
struct Staged {
  uint16_t* expert;  // [Choices()]
  uint8_t* device;   // [experts + 1]
  // The devices of token t's valid choices, one bit each.
  __device__ uint64_t Devices(const RouteDims& d, int32_t t) const {
    uint64_t mask = 0;
    for (int32_t j = 0; j < d.choices; ++j) {
      const int32_t dev = device[expert[t * d.choices + j]];
      mask |= dev < d.parts ? uint64_t{1} << dev : 0;
    }
    return mask;
  }
};

// One coalesced read of the member's ids into `s`, which every pass then
// reads; a __syncthreads must follow.
__device__ void StageExperts(const RouteDims& d, const int32_t* ids, const Staged& s) {
#pragma unroll 4
  for (int32_t c = threadIdx.x; c < d.Choices(); c += kThreads) {
    const int32_t id = __ldg(ids + c);
    s.expert[c] = static_cast<uint16_t>(id >= 0 && id < d.experts ? id : d.experts);
  }
  for (int32_t e = threadIdx.x; e <= d.experts; e += kThreads) {
    s.device[e] = static_cast<uint8_t>(e / d.local);
  }
}

__device__ uint64_t WarpOr(uint64_t v) {
  const unsigned lo = __reduce_or_sync(kAll, static_cast<unsigned>(v));
  const unsigned hi = __reduce_or_sync(kAll, static_cast<unsigned>(v >> 32));
  return (uint64_t{hi} << 32) | lo;
}

__device__ unsigned LanesBelow() {
  return (1u << (threadIdx.x % 32)) - 1;
}

// The warp's run of `items` (choices or tokens): [*lo, *hi), whole rounds of
// 32 but the last, so that no warp walks a round of few lanes that another
// could have taken.
__device__ void WarpRun(int32_t items, int32_t* lo, int32_t* hi) {
  const int32_t per = (items + 32 * kWarps - 1) / (32 * kWarps) * 32;
  const int32_t warp = static_cast<int32_t>(threadIdx.x / 32);
  *lo = min(items, warp * per);
  *hi = min(items, *lo + per);
}

// Calls visit(c, expert, same) for each choice c of [lo, hi) (32 lanes a
// round; lanes past hi see c >= hi and expert `experts`), `same` the lanes
// of the round whose choices have the same expert.
template <typename Visit>
__device__ void ForChoices(const RouteDims& d, const Staged& s, int32_t lo, int32_t hi,
                           Visit visit) {
  for (int32_t base = lo; base < hi; base += 32) {
    const int32_t c = base + static_cast<int32_t>(threadIdx.x % 32);
    const int32_t e = c < hi ? s.expert[c] : d.experts;
    visit(c, e, __match_any_sync(kAll, e));
  }
}

// Calls visit(t, devices, present) for each token t of [lo, hi) (32 lanes a
// round; lanes past hi see no devices), `present` the devices of the
// round's tokens together.
template <typename Visit>
__device__ void ForTokens(const RouteDims& d, const Staged& s, int32_t lo, int32_t hi,
                          Visit visit) {
  for (int32_t base = lo; base < hi; base += 32) {
    const int32_t t = base + static_cast<int32_t>(threadIdx.x % 32);
    const uint64_t mask = t < hi ? s.Devices(d, t) : 0;
    visit(t, mask, WarpOr(mask));
  }
}

// Calls visit(dev, has) for each device of `present` (ForTokens's), `has`
// the lanes whose token has a choice there.
template <typename Visit>
__device__ void ForDevices(uint64_t mask, uint64_t present, Visit visit) {
  for (uint64_t left = present; left != 0; left &= left - 1) {
    const int32_t dev = __ffsll(static_cast<long long>(left)) - 1;
    visit(dev, __ballot_sync(kAll, (mask >> dev) & 1));
  }
}

// The counts every position sends (moe_dispatch_plan.h): shared counters,
// each round's equal experts added once by their lowest lane.
__global__ void __launch_bounds__(kThreads) MoeDispatchCountsKernel(const int32_t* ids,
                                                                    int32_t* send, RouteDims d) {
  extern __shared__ int32_t smem[];
  int32_t* counts = smem;  // experts, then parts
  uint16_t* expert = reinterpret_cast<uint16_t*>(counts + d.experts + d.parts);
  const Staged s{expert, reinterpret_cast<uint8_t*>(expert + d.Choices())};
  ids += static_cast<int64_t>(blockIdx.x) * d.Choices();
  send += static_cast<int64_t>(blockIdx.x) * d.parts * d.Width();
  StageExperts(d, ids, s);
  for (int32_t i = threadIdx.x; i < d.experts + d.parts; i += kThreads) counts[i] = 0;
  __syncthreads();
  int32_t lo, hi;
  WarpRun(d.Choices(), &lo, &hi);
  ForChoices(d, s, lo, hi, [&](int32_t, int32_t e, unsigned same) {
    if (e < d.experts && (same & LanesBelow()) == 0) atomicAdd(&counts[e], __popc(same));
  });
  WarpRun(d.tokens, &lo, &hi);
  ForTokens(d, s, lo, hi, [&](int32_t, uint64_t mask, uint64_t present) {
    ForDevices(mask, present, [&](int32_t dev, unsigned has) {
      if (threadIdx.x % 32 == 0) atomicAdd(&counts[d.experts + dev], __popc(has));
    });
  });
  __syncthreads();
  const int32_t w = d.Width();
  for (int32_t i = threadIdx.x; i < d.parts * w; i += kThreads) {
    const int32_t col = i % w;
    send[i] = col < d.experts + d.parts ? counts[col] : i / w;
  }
}

// An exclusive scan over the 32 lanes, modulo 2^32.
__device__ uint32_t WarpExclusive(uint32_t v, uint32_t* total) {
  uint32_t sum = v;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const uint32_t up = __shfl_up_sync(kAll, sum, off);
    if (threadIdx.x % 32 >= static_cast<unsigned>(off)) sum += up;
  }
  *total = __shfl_sync(kAll, sum, 31);
  return sum - v;
}

// counts[w * stride] for w < kWarps, each warp's count, into each warp's
// exclusive start; returns their total.
__device__ int32_t WarpStarts(uint16_t* counts, int32_t stride) {
  uint16_t count[kWarps];
#pragma unroll
  for (int w = 0; w < kWarps; ++w) count[w] = counts[w * stride];
  int32_t sum = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    counts[w * stride] = static_cast<uint16_t>(sum);
    sum += count[w];
  }
  return sum;
}

struct RouteOut {
  int32_t* group;
  bool* dropped;
  int32_t* routes;
  int32_t* pair_token;
  int32_t* choice_row;
  int32_t* sent;
};

// The shared memory of MoeDispatchCountsKernel and MoeDispatchPlanKernel, in
// bytes: int32 arrays, then 16-bit, then 8-bit.
__host__ __device__ constexpr int64_t CountsSmem(int64_t experts, int64_t parts,
                                                 int64_t choices) {
  return 4 * (experts + parts) + 2 * choices + (experts + 1);
}
__host__ __device__ constexpr int64_t PlanSmem(int64_t experts, int64_t parts, int64_t choices) {
  return 4 * (3 * experts + parts + choices) + 2 * (kWarps * (experts + parts) + choices) +
         (experts + 1);
}
static_assert(PlanSmem(kMoePlanMaxExperts, kMoePlanMaxParts, kMoePlanMaxChoices) + 4 <=
                  48 * 1024,
              "the plan's limits (and its static word) fit the 48 KiB every device gives a CTA");

// The plan (moe_dispatch_plan.h). Shared memory: each expert's place (the
// rows from lower positions), kept total (then its slot start: its device's
// kept rows of lower experts) and kept rows of lower experts, this member's
// pairs to each device, each choice's slot; each warp's count of each
// expert (then its start among the member's choices of it) and of each
// device's tokens (then its first pair row there), each choice's expert.
// Counts and starts are below kMoePlanMaxChoices: 16 bits.
__global__ void __launch_bounds__(kThreads) MoeDispatchPlanKernel(const int32_t* ids,
                                                                  const int32_t* table,
                                                                  RouteOut out, RouteDims d) {
  extern __shared__ int32_t smem[];
  __shared__ int32_t used[1];  // the member's pairs
  const int32_t E = d.experts, n = d.parts, k = d.choices, w = d.Width(), P = d.Pairs();
  int32_t* place = smem;                  // [E]
  int32_t* start = place + E;             // [E]
  int32_t* prefix = start + E;            // [E]
  int32_t* pairs = prefix + E;            // [n]
  int32_t* slot = pairs + n;              // [Choices()]
  uint16_t* by_expert = reinterpret_cast<uint16_t*>(slot + d.Choices());  // [kWarps][E]
  uint16_t* by_device = by_expert + kWarps * E;                           // [kWarps][n]
  uint16_t* expert = by_device + kWarps * n;                              // [Choices()]
  const Staged st{expert, reinterpret_cast<uint8_t*>(expert + d.Choices())};  // [E + 1]
  const int64_t b = blockIdx.x;
  ids += b * d.Choices();
  table += b * n * w;
  out.group += b * d.local;
  out.dropped += b * d.Choices();
  out.routes += b * n * kMoePlanColumns;
  out.pair_token += b * P;
  out.choice_row += b * d.Choices();
  out.sent += b * P * (k + 1);
  const int32_t me = table[E + n];
  if (me < 0 || me >= n) __trap();  // not a table of the counts' exchange
  StageExperts(d, ids, st);
  for (int32_t i = threadIdx.x; i < kWarps * (E + n); i += kThreads) by_expert[i] = 0;
  // Sums of the table's entries wrap modulo 2^32 (moe_dispatch_plan.h).
  for (int32_t e = threadIdx.x; e < E; e += kThreads) {
    uint32_t below = 0, total = 0;
    for (int32_t src = 0; src < n; ++src) {
      const uint32_t count = static_cast<uint32_t>(table[src * w + e]);
      below += src < me ? count : 0;
      total += count;
    }
    place[e] = static_cast<int32_t>(below);
    start[e] = d.capacity < 0 ? static_cast<int32_t>(total)
                              : min(static_cast<int32_t>(total), d.capacity);
  }
  __syncthreads();

  const int32_t warp = static_cast<int32_t>(threadIdx.x / 32);
  const int32_t lane = static_cast<int32_t>(threadIdx.x % 32);
  int32_t lo, hi, t_lo, t_hi;
  WarpRun(d.Choices(), &lo, &hi);
  WarpRun(d.tokens, &t_lo, &t_hi);
  ForChoices(d, st, lo, hi, [&](int32_t, int32_t e, unsigned same) {
    if (e < E && (same & LanesBelow()) == 0) by_expert[warp * E + e] += __popc(same);
    __syncwarp();
  });
  ForTokens(d, st, t_lo, t_hi, [&](int32_t, uint64_t mask, uint64_t present) {
    ForDevices(mask, present, [&](int32_t dev, unsigned has) {
      if (lane == 0) by_device[warp * n + dev] += __popc(has);
    });
  });
  if (warp == 0) {  // the group sizes, then each expert's start within its device's
    const int32_t local = d.local;
    for (int32_t i = lane; i < local; i += 32) out.group[i] = start[me * local + i];
    uint32_t carry = 0;
    for (int32_t base = 0; base < E; base += 32) {
      const int32_t e = base + lane;
      uint32_t total;
      const uint32_t below = carry + WarpExclusive(e < E ? start[e] : 0, &total);
      if (e < E) prefix[e] = static_cast<int32_t>(below);
      carry += total;
    }
    __syncwarp();
    for (int32_t e = lane; e < E; e += 32) {
      start[e] = static_cast<int32_t>(static_cast<uint32_t>(prefix[e]) -
                                      static_cast<uint32_t>(prefix[e - e % local]));
    }
  }
  __syncthreads();

  // Each warp's start per expert and per device: a thread each, its loads
  // of the warps' counts in flight together.
  for (int32_t i = threadIdx.x; i < E + n; i += kThreads) {
    if (i < E) {
      WarpStarts(by_expert + i, E);
    } else {
      pairs[i - E] = WarpStarts(by_device + i - E, n);
    }
  }
  __syncthreads();
  if (warp == 0) {  // routes, and the first pair row to each device
    int32_t carry = 0;
    for (int32_t base = 0; base < n; base += 32) {
      const int32_t dev = base + lane;
      const int32_t count = dev < n ? pairs[dev] : 0;
      uint32_t total;
      const int32_t first = carry + static_cast<int32_t>(WarpExclusive(count, &total));
      carry += static_cast<int32_t>(total);
      if (dev < n) {
        uint32_t below = 0;
        for (int32_t dd = 0; dd < me; ++dd) below += static_cast<uint32_t>(table[dev * w + E + dd]);
        int32_t* route = out.routes + dev * kMoePlanColumns;
        route[0] = first;
        route[1] = count;
        route[2] = static_cast<int32_t>(static_cast<uint32_t>(me) *
                                        static_cast<uint32_t>(d.tokens));
        route[3] = table[dev * w + E + me];
        route[4] = static_cast<int32_t>(below);
        pairs[dev] = first;
      }
    }
    if (lane == 0) *used = carry;
  }
  __syncthreads();
  for (int32_t i = threadIdx.x; i < kWarps * n; i += kThreads) by_device[i] += pairs[i % n];

  // Each choice's slot (-1 where not kept), and what a choice that is not
  // valid writes.
  ForChoices(d, st, lo, hi, [&](int32_t c, int32_t e, unsigned same) {
    const uint32_t rank = e < E ? by_expert[warp * E + e] + __popc(same & LanesBelow()) : 0;
    __syncwarp();
    if (e < E && (same & LanesBelow()) == 0) by_expert[warp * E + e] += __popc(same);
    __syncwarp();
    if (c >= hi) return;
    const uint32_t at = static_cast<uint32_t>(place[e < E ? e : 0]) + rank;
    const bool kept = e < E && (d.capacity < 0 || static_cast<int32_t>(at) < d.capacity);
    slot[c] = kept ? static_cast<int32_t>(static_cast<uint32_t>(start[e]) + at) : -1;
    out.dropped[c] = e < E && !kept;
    if (e == E) out.choice_row[c] = -1;
  });
  __syncthreads();
  // The pairs: each token's row to each of its devices in `sent`, with the
  // slots of its choices there, and each of those choices' pair row.
  ForTokens(d, st, t_lo, t_hi, [&](int32_t t, uint64_t mask, uint64_t present) {
    ForDevices(mask, present, [&](int32_t dev, unsigned has) {
      if ((mask >> dev) & 1) {
        const int32_t row = by_device[warp * n + dev] + __popc(has & LanesBelow());
        out.pair_token[row] = t;
        int32_t* sent = out.sent + static_cast<int64_t>(row) * (k + 1);
        sent[0] = t;
        for (int32_t j = 0; j < k; ++j) {
          const bool on = st.device[expert[t * k + j]] == dev;
          sent[1 + j] = on ? slot[t * k + j] : -1;
          if (on) out.choice_row[t * k + j] = row;
        }
      }
      __syncwarp();
      if (lane == 0) by_device[warp * n + dev] += __popc(has);
      __syncwarp();
    });
  });
  // The rows past the pairs.
  for (int64_t i = *used * int64_t{k + 1} + threadIdx.x; i < int64_t{P} * (k + 1);
       i += kThreads) {
    out.sent[i] = i % (k + 1) == 0 ? d.tokens : -1;
  }
  for (int32_t p = *used + threadIdx.x; p < P; p += kThreads) out.pair_token[p] = d.tokens;
}

RouteDims DimsOf(const MoePlanShape& s) {
  return RouteDims{static_cast<int32_t>(s.tokens),   static_cast<int32_t>(s.choices),
                   static_cast<int32_t>(s.experts),  static_cast<int32_t>(s.parts),
                   static_cast<int32_t>(s.capacity), static_cast<int32_t>(s.Local())};
}

ffi::Error MoeDispatchCountsCudaImpl(cudaStream_t stream, ffi::AnyBuffer ids,
                                     ffi::Result<ffi::AnyBuffer> send, int64_t experts,
                                     int64_t parts) {
  MoePlanShape s;
  JAX_TMA_RETURN_IF_FAILED(DecodeMoeDispatchCounts(ids, *send, experts, parts, &s));
  if (s.batch == 0) return ffi::Error::Success();
  const auto smem = static_cast<size_t>(CountsSmem(s.experts, s.parts, s.tokens * s.choices));
  MoeDispatchCountsKernel<<<static_cast<unsigned>(s.batch), kThreads, smem, stream>>>(
      ids.typed_data<int32_t>(), send->typed_data<int32_t>(), DimsOf(s));
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  CountPath(Path::kMoeDispatchCountsSimt);
  return ffi::Error::Success();
}

ffi::Error MoeDispatchPlanCudaImpl(cudaStream_t stream, ffi::AnyBuffer ids, ffi::AnyBuffer table,
                                   ffi::Result<ffi::AnyBuffer> group,
                                   ffi::Result<ffi::AnyBuffer> dropped,
                                   ffi::Result<ffi::AnyBuffer> routes,
                                   ffi::Result<ffi::AnyBuffer> pair_token,
                                   ffi::Result<ffi::AnyBuffer> choice_row,
                                   ffi::Result<ffi::AnyBuffer> sent, int64_t experts, int64_t parts,
                                   int64_t capacity) {
  MoePlanShape s;
  MoePlanResults r;
  JAX_TMA_RETURN_IF_FAILED(DecodeMoeDispatchPlan(ids, table, group, dropped, routes,
                                                 pair_token, choice_row, sent, experts, parts,
                                                 capacity, &s, &r));
  if (s.batch == 0) return ffi::Error::Success();
  // Within the 48 KiB every device gives a CTA: the limits of moe_dispatch_plan.h.
  const auto smem = static_cast<size_t>(PlanSmem(s.experts, s.parts, s.tokens * s.choices));
  const RouteOut out{r.group, r.dropped, r.routes, r.pair_token, r.choice_row, r.sent};
  MoeDispatchPlanKernel<<<static_cast<unsigned>(s.batch), kThreads, smem, stream>>>(
      ids.typed_data<int32_t>(), table.typed_data<int32_t>(), out, DimsOf(s));
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  CountPath(Path::kMoeDispatchPlanSimt);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaMoeDispatchCountsCuda, jax_tma::MoeDispatchCountsCudaImpl,
    jax_tma::BindMoeDispatchCountsCall(
        xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()),
    {xla::ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaMoeDispatchPlanCuda, jax_tma::MoeDispatchPlanCudaImpl,
    jax_tma::BindMoeDispatchPlanCall(
        xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()),
    {xla::ffi::Traits::kCmdBufferCompatible});
