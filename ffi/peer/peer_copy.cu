// The kernels of the peer transport's device side and their
// launchers (see peer_copy.h): PeerMeet and PeerFinish, one thread each,
// and PeerCopy, the copy between this participant's buffer and its
// partner's through the TMA bulk pipeline of jax_tma.copy.
#include "peer/peer_copy.h"

#include <algorithm>
#include <string>

#include "copy/bulk_pipeline.cuh"
#include "copy/copy_launch.h"
#include "copy/copy_plan.h"
#include "cuda/cuda_status.h"
#include "cuda/device_info.h"
#include "cuda/launch.h"
#include "element_sum.h"

namespace jax_tma {
namespace {

constexpr int kBulkThreads = 32;   // thread 0 drives the pipeline; the warp copies the edges
constexpr int kSimtThreads = 256;  // method "simt", and buffers unequal modulo 16 B
// How often a waiting thread looks at the clock and at the host's word for
// the awaited process (a read across PCIe), in polls of its mailbox.
constexpr unsigned int kChecksEvery = 256;

__device__ __forceinline__ unsigned long long LoadAcquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void StoreRelease(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ unsigned int AtomicAddAcqRel(unsigned int* p, unsigned int v) {
  unsigned int old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;"
               : "=r"(old)
               : "l"(p), "r"(v)
               : "memory");
  return old;
}

__device__ __forceinline__ unsigned long long GlobalNanoseconds() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Records why this wait gave up and ends the kernel with a trap, which fails
// the step. The record is host memory: plain stores, `raised` last.
__device__ __noinline__ void GiveUp(const PeerWait& w, PeerWaitFor what, PeerGaveUp why,
                                    unsigned long long call, unsigned long long seen) {
  volatile PeerFault* f = w.fault;
  f->wait_for = static_cast<unsigned int>(what);
  f->gave_up = static_cast<unsigned int>(why);
  f->site = w.site;
  f->call = call;
  f->seen = seen;
  __threadfence_system();
  f->raised = 1;
  __threadfence_system();
  __trap();
}

// Waits until *field holds `call` (see peer_copy.h for why more is an error).
__device__ void AwaitCall(const unsigned long long* field, unsigned long long call,
                          const PeerWait& w, PeerWaitFor what) {
  const unsigned long long start = GlobalNanoseconds();
  for (unsigned int polls = 1;; ++polls) {
    const unsigned long long v = LoadAcquire(field);
    if (v == call) return;
    if (v > call) GiveUp(w, what, PeerGaveUp::kOutOfStep, call, v);
    if (polls % kChecksEvery == 0) {
      if (*w.gone != 0) GiveUp(w, what, PeerGaveUp::kGone, call, v);
      if (GlobalNanoseconds() - start > w.timeout_ns) {
        GiveUp(w, what, PeerGaveUp::kTimeout, call, v);
      }
    }
    __nanosleep(100);
  }
}

__global__ void PeerMeetKernel(PeerMailbox* own, PeerMailbox* by_box,
                               unsigned long long published, bool await_partner, PeerWait wait) {
  const unsigned long long call = own->calls + 1;
  own->calls = call;
  if (by_box != nullptr) {
    by_box->buffer = published;
    StoreRelease(&by_box->ready, call);  // the buffer travels ahead of the number
  }
  if (await_partner) {
    AwaitCall(&own->ready, call, wait, PeerWaitFor::kPublish);
    own->peer = *static_cast<volatile unsigned long long*>(&own->buffer);
  }
}

__global__ void PeerFinishKernel(PeerMailbox* own, PeerWait wait) {
  AwaitCall(&own->done, own->calls, wait, PeerWaitFor::kDone);
}

// Vectors a thread of SimtCopy loads before it stores them: one trip to
// memory (or across the link) for all of them, not one each.
constexpr int kSimtBatch = 4;

// A vectorised grid-stride copy by every thread of `ctas` CTAs, this one
// being `cta`.
__device__ void SimtCopy(const uint8_t* src, uint8_t* dst, int64_t bytes, int64_t cta,
                         int64_t ctas) {
  const int64_t threads = ctas * blockDim.x;
  const int64_t t = cta * blockDim.x + threadIdx.x;
  const auto rel = reinterpret_cast<uintptr_t>(src) ^ reinterpret_cast<uintptr_t>(dst);
  if ((rel & 15) == 0) {
    const int64_t lead =
        std::min<int64_t>(bytes, (16 - reinterpret_cast<uintptr_t>(src) % 16) % 16);
    const int64_t nvec = (bytes - lead) / 16;
    const auto* sv = reinterpret_cast<const uint4*>(src + lead);
    auto* dv = reinterpret_cast<uint4*>(dst + lead);
    for (int64_t i = t; i < nvec; i += kSimtBatch * threads) {
      uint4 v[kSimtBatch];
#pragma unroll
      for (int j = 0; j < kSimtBatch; ++j) {
        if (i + j * threads < nvec) v[j] = sv[i + j * threads];
      }
#pragma unroll
      for (int j = 0; j < kSimtBatch; ++j) {
        if (i + j * threads < nvec) dv[i + j * threads] = v[j];
      }
    }
    if (t < lead) dst[t] = src[t];
    for (int64_t i = lead + nvec * 16 + t; i < bytes; i += threads) dst[i] = src[i];
  } else {
    for (int64_t i = t; i < bytes; i += threads) dst[i] = src[i];
  }
}

// The bulk pipeline where `tma` and src, dst are equal modulo 16 B (`head`,
// `body`, `chunk`... from PlanBulkCopy), else a vectorised grid-stride copy.
// The last CTA to finish signals the partner.
__global__ void __launch_bounds__(kSimtThreads)
    PeerCopyKernel(PeerMailbox* own, PeerMailbox* partner_box, uint8_t* local, int64_t bytes,
                   bool push, bool tma, int64_t head, int64_t body, uint32_t chunk, int stages,
                   int64_t chunks_per_cta) {
  auto* peer = reinterpret_cast<uint8_t*>(own->peer);  // PeerMeet's, earlier on this stream
  const uint8_t* src = push ? local : peer;
  uint8_t* dst = push ? peer : local;
  const auto rel = reinterpret_cast<uintptr_t>(src) ^ reinterpret_cast<uintptr_t>(dst);
#if JAX_TMA_HAS_BULK_COPY
  extern __shared__ __align__(128) uint8_t stage_buf[];
  __shared__ uint64_t full[kMaxBulkStages];
  __shared__ int64_t chunk_of[kMaxBulkStages];
  if (tma && (rel & 15) == 0) {
    device::CopyBulkEdges(src, dst, bytes, head, body, blockIdx.x);
    if (threadIdx.x == 0) {
      device::StreamBulkChunks(src, dst, head, body, chunk, stages, chunks_per_cta, blockIdx.x,
                               gridDim.x, nullptr, stage_buf, full, chunk_of);
      // The stores' writes complete, then ordered before the generic-proxy
      // signal below.
      asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
      asm volatile("fence.proxy.async.global;" ::: "memory");
    }
    tma = false;
    bytes = 0;  // copied
  }
#endif
  if (bytes > 0) SimtCopy(src, dst, bytes, blockIdx.x, gridDim.x);
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    if (atomicAdd(&own->ctas, 1u) == gridDim.x - 1) {
      own->ctas = 0;
      __threadfence_system();
      StoreRelease(&partner_box->done, own->calls);
    }
  }
}

// ---- PeerScatter (peer_copy.h) ----

constexpr int kScatterThreads = 128;  // copy: thread 0 drives the pipeline, all copy the edges
// Kernel parameters are at most 4 KiB (before CUDA 12.1 and Volta).
static_assert(sizeof(PeerLegs) + sizeof(PeerSlices) + sizeof(PeerWait) <= 4096);

// Programmatic dependent launch (sm_90 on): a kernel lets the next one on
// its stream launch now, its CTAs waiting in AwaitPreviousGrid until this
// one is done and its writes visible. Both are no-ops elsewhere, and
// AwaitPreviousGrid for a kernel launched without the attribute.
__device__ __forceinline__ void LaunchNextGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void AwaitPreviousGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ int64_t IndexAt(const void* a, bool index64, int64_t i) {
  return index64 ? static_cast<const int64_t*>(a)[i] : static_cast<const int32_t*>(a)[i];
}

// The leg carrying slice i (0: the slices for this participant itself).
__device__ __forceinline__ int LegOf(const PeerSlices& s, int64_t i) {
  const int j = static_cast<int>(i / s.per_part);
  return (j - s.position + s.parts) % s.parts;
}

// A broken size rule; the lowest slice that breaks one is reported.
struct BadSlice {
  long long index;
  unsigned int rule;
  long long value, size, limit;
};

__device__ void ReportBadSlice(const PeerWait& w, BadSlice mine) {
  __shared__ unsigned long long lowest;
  if (threadIdx.x == 0) lowest = ~0ull;
  __syncthreads();
  if (mine.rule != 0) atomicMin(&lowest, static_cast<unsigned long long>(mine.index));
  __syncthreads();
  if (mine.rule != 0 && static_cast<unsigned long long>(mine.index) == lowest) {
    volatile PeerFault* f = w.fault;
    f->wait_for = static_cast<unsigned int>(PeerWaitFor::kNone);
    f->gave_up = static_cast<unsigned int>(PeerGaveUp::kBadSize);
    f->rule = mine.rule;
    f->site = w.site;
    f->index = mine.index;
    f->call = static_cast<unsigned long long>(mine.value);
    f->seen = static_cast<unsigned long long>(mine.size);
    f->limit = mine.limit;
    __threadfence_system();
    f->raised = 1;
    __threadfence_system();
    __trap();
  }
  __syncthreads();
}

// The rule slice i of `size` rows at `in` of the operand, placed at `out`
// of its destination's output, breaks (PeerSizeRule), as a BadSlice;
// rule 0 if none.
__device__ BadSlice CheckSlice(const PeerSlices& s, int64_t i, int64_t in, int64_t size,
                               int64_t out) {
  if (in < 0 || size < 0 || in > s.src_rows - size) {
    return {i, static_cast<unsigned int>(PeerSizeRule::kOperand), in, size, s.src_rows};
  }
  if (out < 0 || out > s.dst_rows - size) {
    return {i, static_cast<unsigned int>(PeerSizeRule::kOutput), out, size, s.dst_rows};
  }
  return {0, 0, 0, 0, 0};
}

// Every thread of the CTA: this participant's ragged slices against the
// operand and the output, trapping on the first that breaks a rule.
__device__ __noinline__ void CheckOwnSlices(const PeerSlices& s, const PeerWait& check) {
  BadSlice mine{0, 0, 0, 0, 0};
  for (int64_t i = threadIdx.x; i < s.slices && mine.rule == 0; i += blockDim.x) {
    mine = CheckSlice(s, i, IndexAt(s.input_offsets, s.index64, i),
                      IndexAt(s.send_sizes, s.index64, i),
                      IndexAt(s.output_offsets, s.index64, i));
  }
  ReportBadSlice(check, mine);
}

// How a kernel numbers the call it runs: kRaised, its meet raises each leg's
// count of calls first (PeerScatterSum, PeerPull: their copy and finish
// read the raised count); kAtEnd, the call is the count plus one until the
// kernel's last CTA raises it (PeerScatter, whose CTAs all read the count
// first, as PeerInboxExchange's do).
enum class CallCount : int { kRaised = 0, kAtEnd = 1 };

// Thread t < legs.count of the meet: leg t publishes this participant's
// buffer (and receive sizes) to its source, waits for its destination's and
// keeps it; returns the destination's receive sizes (0 for other threads).
__device__ unsigned long long MeetLeg(const PeerLegs& legs, int t,
                                      CallCount count = CallCount::kRaised) {
  if (t >= legs.count) return 0;
  const PeerLeg leg = legs.leg[t];  // a copy: a reference would copy every leg to the stack
  const unsigned long long call = leg.own->calls + 1;
  if (count == CallCount::kRaised) leg.own->calls = call;
  leg.by_box->buffer = leg.published;
  leg.by_box->sizes = leg.published_sizes;
  StoreRelease(&leg.by_box->ready, call);  // the buffer travels ahead of the number
  AwaitCall(&leg.own->ready, call, leg.wait_partner, PeerWaitFor::kPublish);
  const volatile PeerMailbox* own = leg.own;
  leg.own->peer = own->buffer;
  return own->sizes;
}

// Checks this participant's slices, publishes its output (and receive
// sizes) to every source, waits for every destination's, then checks each
// destination's receive size for the slices it gets.
__device__ void ScatterMeet(const PeerLegs& legs, const PeerSlices& s, const PeerWait& check,
                            CallCount count = CallCount::kRaised) {
  const int t = threadIdx.x;
  BadSlice mine{0, 0, 0, 0, 0};
  if (s.ragged()) CheckOwnSlices(s, check);
  __shared__ unsigned long long recv_of[kMaxPeerLegs + 1];  // each leg's receive sizes
  const unsigned long long theirs = MeetLeg(legs, t, count);
  if (t < legs.count) recv_of[t + 1] = theirs;
  if (t == 0) recv_of[0] = reinterpret_cast<unsigned long long>(s.recv_sizes);
  __syncthreads();
  if (!s.ragged()) return;
  for (int64_t i = t; i < s.slices && mine.rule == 0; i += blockDim.x) {
    const auto* recv = reinterpret_cast<const void*>(recv_of[LegOf(s, i)]);
    const int64_t theirs = IndexAt(recv, s.index64, s.position * s.per_part + i % s.per_part);
    const int64_t size = IndexAt(s.send_sizes, s.index64, i);
    if (theirs != size) {
      mine = {i, static_cast<unsigned int>(PeerSizeRule::kRecv), theirs, size, 0};
    }
  }
  ReportBadSlice(check, mine);
}

// After a CTA's part of a slice of leg k (0: this participant's own): the
// last of the leg's `leg_ctas` CTAs to finish tells its destination, once
// every CTA's writes are visible there, that call own->calls + `count` is
// done.
__device__ __forceinline__ void ScatterLegDone(const PeerLegs& legs, int k, int64_t leg_ctas,
                                               CallCount count = CallCount::kRaised) {
  __syncthreads();
  if (k != 0 && threadIdx.x == 0) {
    const PeerLeg& leg = legs.leg[k - 1];
    const unsigned long long call = leg.own->calls + static_cast<int>(count);
    __threadfence_system();
    if (atomicAdd(&leg.own->ctas, 1u) == leg_ctas - 1) {
      leg.own->ctas = 0;
      __threadfence_system();
      StoreRelease(&leg.partner_box->done, call);
    }
  }
}

// Thread 0 of every CTA of a PeerScatter: waits until CTA 0 has met every
// peer (and checked the slices) for `call`. Unbounded: CTA 0's own waits
// are bounded, and where one gives up its trap ends this grid too.
__device__ __forceinline__ void AwaitMet(const unsigned long long* met, unsigned long long call) {
  while (LoadAcquire(met) != call) __nanosleep(100);
}

// PeerScatter, one kernel: CTA b copies its part of slice b mod slices, with
// the other CTAs of that slice (ctas of them): the slices' CTAs interleave,
// so the GPU starts every slice at once instead of one after another. CTA 0
// first checks the slices and meets every peer (ScatterMeet); the others
// wait for it on this participant's first leg (`met`). The last CTA of a
// leg's slices signals its destination; the grid's last CTA waits until
// every source has signalled this participant, then raises each leg's count
// of calls, which every CTA read first. Without legs (one participant)
// every CTA checks the slices itself: nobody else's word is needed. One
// launch where a meet, a copy and a finish took three: outside a CUDA graph
// each launch is host time the GPU waits for (benchmarks/TUNING.md).
__global__ void __launch_bounds__(kScatterThreads)
    PeerScatterKernel(PeerLegs legs, PeerSlices s, PeerWait check, bool tma, uint32_t chunk,
                      int stages) {
  if (legs.count == 0) {
    ScatterMeet(legs, s, check);  // the checks alone
  } else {
    unsigned long long* met = &legs.leg[0].own->met;
    const unsigned long long call = legs.leg[0].own->calls + 1;
    if (blockIdx.x == 0) {
      ScatterMeet(legs, s, check, CallCount::kAtEnd);
      __syncthreads();
      if (threadIdx.x == 0) StoreRelease(met, call);  // the peers' buffers travel ahead
    }
    if (threadIdx.x == 0) AwaitMet(met, call);
    __syncthreads();
    LoadAcquire(met);  // each thread's own acquire of the peers' buffers thread 0 saw kept
  }
  const int64_t i = blockIdx.x % s.slices;
  const int64_t cta = blockIdx.x / s.slices, ctas = gridDim.x / s.slices;
  const int k = LegOf(s, i);
  uint8_t* base = k == 0 ? s.local : reinterpret_cast<uint8_t*>(legs.leg[k - 1].own->peer);
  int64_t from = i * s.bytes, to = s.position * s.bytes, bytes = s.bytes;
  if (s.ragged()) {
    from = IndexAt(s.input_offsets, s.index64, i) * s.bytes;
    to = IndexAt(s.output_offsets, s.index64, i) * s.bytes;
    bytes = IndexAt(s.send_sizes, s.index64, i) * s.bytes;
  }
  const uint8_t* src = s.src + from;
  uint8_t* dst = base + to;
#if JAX_TMA_HAS_BULK_COPY
  extern __shared__ __align__(128) uint8_t stage_buf[];
  __shared__ uint64_t full[kMaxBulkStages];
  __shared__ int64_t chunk_of[kMaxBulkStages];
  const auto rel = reinterpret_cast<uintptr_t>(src) ^ reinterpret_cast<uintptr_t>(dst);
  if (tma && bytes > 0 && (rel & 15) == 0) {
    const int64_t head =
        min(bytes, static_cast<int64_t>((16 - reinterpret_cast<uintptr_t>(src) % 16) % 16));
    const int64_t body = (bytes - head) / 16 * 16;
    device::CopyBulkEdges(src, dst, bytes, head, body, cta);
    if (threadIdx.x == 0 && body > 0) {
      const int64_t nchunks = (body + chunk - 1) / chunk;
      device::StreamBulkChunks(src, dst, head, body, chunk, stages, (nchunks + ctas - 1) / ctas,
                               cta, ctas, nullptr, stage_buf, full, chunk_of);
      asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
      asm volatile("fence.proxy.async.global;" ::: "memory");
    }
    bytes = 0;  // copied
  }
#endif
  if (bytes > 0) SimtCopy(src, dst, bytes, cta, ctas);
  if (legs.count == 0) return;
  ScatterLegDone(legs, k, ctas * s.per_part, CallCount::kAtEnd);
  __shared__ bool last;
  if (threadIdx.x == 0) {
    last = AtomicAddAcqRel(&legs.leg[0].own->finished, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  for (int t = threadIdx.x; t < legs.count; t += blockDim.x) {
    const PeerLeg leg = legs.leg[t];  // as in MeetLeg
    const unsigned long long leg_call = leg.own->calls + 1;
    AwaitCall(&leg.own->done, leg_call, leg.wait_by, PeerWaitFor::kDone);
    leg.own->calls = leg_call;
  }
  if (threadIdx.x == 0) legs.leg[0].own->finished = 0;
}

__global__ void PeerScatterFinishKernel(PeerLegs legs) {
  AwaitPreviousGrid();  // the copy
  for (int t = threadIdx.x; t < legs.count; t += blockDim.x) {
    const PeerLeg leg = legs.leg[t];  // as in MeetLeg
    AwaitCall(&leg.own->done, leg.own->calls, leg.wait_by, PeerWaitFor::kDone);
  }
}

// ---- PeerScatterSum (peer_copy.h) ----

constexpr int kSumThreads = 256;     // a warp per piece of a row at a time
constexpr int kSumMeetThreads = 1024;  // the meet checks every slot
constexpr int kSumCheckBatch = 4;      // slots a thread loads before it tests them
static_assert(sizeof(PeerLegs) + sizeof(PeerSlices) + sizeof(PeerSumRows) + sizeof(PeerWait) <=
              4096);

// Every thread of the CTA: each of the sums' slots -1 or a row of y,
// trapping on the first that breaks the rule (the flat entry is the index
// reported, so no two threads report one). A thread loads kSumCheckBatch
// entries before it tests them.
__device__ __forceinline__ void CheckSumSlots(const PeerSumRows& sums, int64_t rows,
                                              const PeerWait& check) {
  const int64_t entries = rows * sums.choices, step = blockDim.x;
  BadSlice mine{0, 0, 0, 0, 0};
  for (int64_t e0 = threadIdx.x; e0 < entries && mine.rule == 0;
       e0 += kSumCheckBatch * step) {
    int64_t slot[kSumCheckBatch];
#pragma unroll
    for (int u = 0; u < kSumCheckBatch; ++u) {
      slot[u] = e0 + u * step < entries ? sums.slots[e0 + u * step] : -1;
    }
#pragma unroll
    for (int u = 0; u < kSumCheckBatch; ++u) {
      if (mine.rule == 0 && (slot[u] < -1 || slot[u] >= sums.y_rows)) {
        mine = {e0 + u * step, static_cast<unsigned int>(PeerSizeRule::kSumSlot), slot[u],
                sums.choices, sums.y_rows};
      }
    }
  }
  ReportBadSlice(check, mine);
}

// The slots, then the slices and the meeting as PeerScatter's meet.
__global__ void __launch_bounds__(kSumMeetThreads)
    PeerScatterSumMeetKernel(PeerLegs legs, PeerSlices s, PeerSumRows sums, PeerWait check) {
  LaunchNextGrid();  // the sums' CTAs take their SMs while this one waits for the peers
  CheckSumSlots(sums, s.src_rows, check);
  ScatterMeet(legs, s, check);
}

// Products and sums rounded on their own: never fused into a multiply-add.
__device__ __forceinline__ float MulRn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double MulRn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float AddRn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double AddRn(double a, double b) { return __dadd_rn(a, b); }

// The `rows` rows of the operand from `first` on, summed (PeerSumRows) into
// `dst` (a row of `bytes` each), by this CTA (`cta` of `ctas`): a warp a
// piece of a row at a time, each lane V elements (16 B). The choices go in
// groups of kSumBatch: their slots and weights loaded together (the same
// for every lane: one line, broadcast), then their rows' pieces, then the
// products added in ascending j; so a group costs two round trips to
// memory, not two a choice.
constexpr int kSumBatch = 4;

template <SumKind K>
__device__ void SumRowsInto(const PeerSumRows& sums, int64_t bytes, int64_t first, int64_t rows,
                            uint8_t* dst, int64_t cta, int64_t ctas) {
  using E = ElementSum<K>;
  using T = typename E::T;
  using Acc = typename E::Acc;
  constexpr int V = 16 / sizeof(T);
  union Piece {
    uint4 vec;
    T el[V];
  };
  const int64_t elements = bytes / static_cast<int64_t>(sizeof(T));
  const int64_t span = int64_t{32} * V;
  const int64_t pieces = (elements + span - 1) / span;
  const bool vector = bytes % 16 == 0 &&
                      (reinterpret_cast<uintptr_t>(sums.y) | reinterpret_cast<uintptr_t>(dst)) %
                              16 == 0;
  const int warps = blockDim.x / 32, lane = threadIdx.x % 32;
  const auto* weights = static_cast<const Acc*>(sums.weights);
  for (int64_t unit = cta * warps + threadIdx.x / 32; unit < rows * pieces;
       unit += ctas * warps) {
    const int64_t r = unit / pieces;
    const int64_t e0 = (unit - r * pieces) * span + lane * V;
    if (e0 >= elements) continue;
    const bool whole = vector && e0 + V <= elements;
    const int64_t entry = (first + r) * sums.choices;
    Acc acc[V];
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = SumStart<K>();
    bool any = false;
    for (int64_t j0 = 0; j0 < sums.choices; j0 += kSumBatch) {
      int64_t slot[kSumBatch];
      Acc w[kSumBatch];
#pragma unroll
      for (int u = 0; u < kSumBatch; ++u) {
        slot[u] = j0 + u < sums.choices ? sums.slots[entry + j0 + u] : -1;
        w[u] = j0 + u < sums.choices ? weights[entry + j0 + u] : Acc{0};
      }
      Piece x[kSumBatch];
#pragma unroll
      for (int u = 0; u < kSumBatch; ++u) {
        if (slot[u] < 0) continue;
        const T* from = reinterpret_cast<const T*>(sums.y + slot[u] * bytes) + e0;
        if (whole) {
          x[u].vec = *reinterpret_cast<const uint4*>(from);
        } else {
#pragma unroll
          for (int v = 0; v < V; ++v) x[u].el[v] = e0 + v < elements ? from[v] : T{};
        }
      }
#pragma unroll
      for (int u = 0; u < kSumBatch; ++u) {
        if (slot[u] < 0) continue;
        any = true;
#pragma unroll
        for (int v = 0; v < V; ++v) acc[v] = AddRn(acc[v], MulRn(E::Load(x[u].el[v]), w[u]));
      }
    }
    Piece out;
#pragma unroll
    for (int v = 0; v < V; ++v) out.el[v] = E::Store(any ? acc[v] : EmptySum<K>());
    T* to = reinterpret_cast<T*>(dst + r * bytes) + e0;
    if (whole) {
      *reinterpret_cast<uint4*>(to) = out.vec;
    } else {
#pragma unroll
      for (int v = 0; v < V; ++v) {
        if (e0 + v < elements) to[v] = out.el[v];
      }
    }
  }
}

// CTA b sums its part of slice b mod slices into the slice's destination
// (this participant's own result, or a destination's across the link), as
// PeerScatterKernel copies one.
__global__ void __launch_bounds__(kSumThreads)
    PeerScatterSumKernel(PeerLegs legs, PeerSlices s, PeerSumRows sums) {
  LaunchNextGrid();
  AwaitPreviousGrid();  // the meet: every destination's result is known, the indices checked
  const int64_t i = blockIdx.x % s.slices;
  const int64_t cta = blockIdx.x / s.slices, ctas = gridDim.x / s.slices;
  const int k = LegOf(s, i);
  uint8_t* base = k == 0 ? s.local : reinterpret_cast<uint8_t*>(legs.leg[k - 1].own->peer);
  const int64_t first = IndexAt(s.input_offsets, s.index64, i);
  const int64_t rows = IndexAt(s.send_sizes, s.index64, i);
  uint8_t* dst = base + IndexAt(s.output_offsets, s.index64, i) * s.bytes;
  const int64_t bytes = s.bytes;
  switch (static_cast<SumKind>(sums.kind)) {
    case SumKind::kF16:
      SumRowsInto<SumKind::kF16>(sums, bytes, first, rows, dst, cta, ctas);
      break;
    case SumKind::kBF16:
      SumRowsInto<SumKind::kBF16>(sums, bytes, first, rows, dst, cta, ctas);
      break;
    case SumKind::kF32:
      SumRowsInto<SumKind::kF32>(sums, bytes, first, rows, dst, cta, ctas);
      break;
    default:
      SumRowsInto<SumKind::kF64>(sums, bytes, first, rows, dst, cta, ctas);
      break;
  }
  ScatterLegDone(legs, k, ctas * s.per_part);
}

// ---- PeerPull (peer_copy.h) ----

constexpr int kPullThreads = 256;  // a warp per piece of a row at a time
constexpr unsigned kAll = 0xffffffffu;
constexpr int kPullBatch = 4;      // vectors a lane loads before it stores them
static_assert(sizeof(PeerLegs) + sizeof(PeerPullRows) + sizeof(PeerWait) <= 4096);

// The pull's meet: the index checks are most of its work (a DeepEP-shaped
// dispatch checks 32,768 entries of nine int32 each), so it takes a whole
// CTA of its own size, and each thread checks kPullCheckBatch entries at once.
constexpr int kPullMeetThreads = 1024;
constexpr int kPullCheckBatch = 4;

// Every thread of the CTA: this participant's routes (a thread a row, each
// count before where its pairs start), then its pairs, each token before its
// slots, the slots in order (PeerSizeRule::kPull*), trapping on the first
// that breaks a rule (each row checked by one thread, so no two threads
// report one index). A thread loads the tokens of its batch of pairs, then
// their slots a choice at a time, before it tests any: the loads of a batch
// are in flight together, not one after another.
__device__ __forceinline__ void CheckPullRows(const PeerPullRows& p, const PeerWait& check) {
  constexpr int kCountThenStart[] = {kPullCount, kPullFirst, kPullFrom, kPullFromAt};
  BadSlice route{0, 0, 0, 0, 0};
  for (int64_t s = threadIdx.x; s < p.parts && route.rule == 0; s += blockDim.x) {
    const int32_t* row = p.routes + s * kPullRouteColumns;
    for (int u = 0; u < 4 && route.rule == 0; ++u) {
      const int c = kCountThenStart[u];
      const int64_t value = row[c];
      const int64_t limit = u % 2 == 0 ? p.per_part : p.pairs - row[kCountThenStart[u - 1]];
      if (value < 0 || value > limit) {
        route = {s, static_cast<unsigned int>(PeerSizeRule::kPullRoute), value, c, limit};
      }
    }
  }
  ReportBadSlice(check, route);
  constexpr int kBatch = kPullCheckBatch;
  const int64_t step = blockDim.x, width = p.choices + 1;
  BadSlice mine{0, 0, 0, 0, 0};
  for (int64_t e0 = threadIdx.x; e0 < p.pairs && mine.rule == 0; e0 += kBatch * step) {
    int64_t token[kBatch], slot_j[kBatch], slot[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      token[u] = e0 + u * step < p.pairs ? p.sent[(e0 + u * step) * width] : 0;
      slot_j[u] = -1;
      slot[u] = 0;
    }
    // Down from the last choice: what is left is each pair's first bad one.
    for (int64_t j = width - 1; j >= 1; --j) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (e0 + u * step >= p.pairs) continue;
        const int64_t v = p.sent[(e0 + u * step) * width + j];
        if (v < -1 || v >= p.dst_rows) {
          slot_j[u] = j;
          slot[u] = v;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t e = e0 + u * step;
      if (mine.rule != 0 || e >= p.pairs) continue;
      if (token[u] < 0 || token[u] > p.per_part) {
        mine = {e, static_cast<unsigned int>(PeerSizeRule::kPullToken), token[u], 0, p.per_part};
      } else if (slot_j[u] >= 0) {
        mine = {e, static_cast<unsigned int>(PeerSizeRule::kPullSlot), slot[u], slot_j[u],
                p.dst_rows};
      }
    }
  }
  ReportBadSlice(check, mine);
}

// Checks the routes and pairs, publishes this participant's operand and
// pairs to every reader of them and waits for every source's.
__global__ void __launch_bounds__(kPullMeetThreads)
    PeerPullMeetKernel(PeerLegs legs, PeerPullRows p, PeerWait check) {
  LaunchNextGrid();  // the copy's CTAs take their SMs while this one waits for the peers
  CheckPullRows(p, check);
  MeetLeg(legs, threadIdx.x);
}

// A row's pieces, each a warp's span of 32 * kPullBatch 16-B vectors (one
// piece where the row is not copied in vectors): the unit of the pull's
// work, so that a few rows (a decode step's) still spread over the GPU.
JAX_TMA_HOST_DEVICE inline int64_t PullPieces(int64_t bytes, bool vector) {
  constexpr int64_t kPiece = int64_t{32} * kPullBatch;
  const int64_t pieces = (bytes / 16 + kPiece - 1) / kPiece;
  return vector && pieces > 1 ? pieces : 1;
}

// CTA b reads leg b mod parts's pairs (0: this participant's own), a warp a
// piece of a pair's row at a time: the warp reads the pair (its token and
// slots) in one load across the link, then the piece once, from wherever
// its source's operand lies, and stores it to each of the pair's slots; the
// warp of a pair's first piece writes its row of `slots`. The last CTA of a
// leg tells its source that its operand and pairs are read.
__global__ void __launch_bounds__(kPullThreads)
    PeerPullCopyKernel(PeerLegs legs, PeerPullRows p) {
  LaunchNextGrid();
  AwaitPreviousGrid();  // the meet: every source's operand and pairs known, this one's checked
  const int k = static_cast<int>(blockIdx.x % p.parts);
  const int64_t cta = blockIdx.x / p.parts, ctas = gridDim.x / p.parts;
  const int s = (p.position + k) % p.parts;
  const uint8_t* src = p.src;
  const int32_t* sent = p.sent;
  if (k != 0) {
    const PeerMailbox* own = legs.leg[k - 1].own;
    src = reinterpret_cast<const uint8_t*>(own->peer);
    sent = reinterpret_cast<const int32_t*>(own->sizes);
  }
  const int32_t* route = p.routes + s * kPullRouteColumns;
  const int64_t count = route[kPullFrom], width = p.choices + 1;
  sent += route[kPullFromAt] * width;
  int32_t* slots = p.slots + s * p.per_part * p.choices;
  const int warps = kPullThreads / 32, lane = threadIdx.x % 32;
  const bool vector = p.bytes % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(p.dst) % 16 == 0;
  const int64_t pieces = PullPieces(p.bytes, vector);
  const int64_t units = count * pieces;
  for (int64_t unit = cta * warps + threadIdx.x / 32; unit < units; unit += ctas * warps) {
    const int64_t i = unit / pieces;
    const int32_t* entry = sent + i * width;
    // Lane l holds the pair's word l: its token, then its slots (those past
    // the 31st are read on their own, below).
    const int32_t head = lane < width ? entry[lane] : -1;
    const int64_t token = __shfl_sync(kAll, head, 0);
    const int32_t next = __shfl_down_sync(kAll, head, 1);  // lane j: slot j
    const bool pair = token < p.per_part;  // token T: past the pairs
    if (unit == i * pieces) {
      for (int64_t j = lane; j < p.choices; j += 32) {
        slots[i * p.choices + j] = !pair ? -1 : j < 31 ? next : entry[1 + j];
      }
    }
    if (!pair) continue;
    const uint8_t* row = src + token * p.bytes;
    if (vector) {
      const int64_t nvec = p.bytes / 16;
      const int64_t v = (unit - i * pieces) * (kPullBatch * 32) + lane;
      uint4 r[kPullBatch];
#pragma unroll
      for (int u = 0; u < kPullBatch; ++u) {
        if (v + u * 32 < nvec) r[u] = reinterpret_cast<const uint4*>(row)[v + u * 32];
      }
      for (int64_t j = 0; j < p.choices; ++j) {
        const int32_t slot = j < 31 ? __shfl_sync(kAll, head, static_cast<int>(1 + j))
                                    : entry[1 + j];
        if (slot < 0) continue;
        auto* out = reinterpret_cast<uint4*>(p.dst + slot * p.bytes);
#pragma unroll
        for (int u = 0; u < kPullBatch; ++u) {
          if (v + u * 32 < nvec) out[v + u * 32] = r[u];
        }
      }
    } else {
      for (int64_t b = lane; b < p.bytes; b += 32) {
        const uint8_t byte = row[b];
        for (int64_t j = 0; j < p.choices; ++j) {
          const int64_t slot = entry[1 + j];
          if (slot >= 0) p.dst[slot * p.bytes + b] = byte;
        }
      }
    }
  }
  // The rows of `slots` past s's pairs.
  for (int64_t e = count * p.choices + cta * kPullThreads + threadIdx.x;
       e < p.per_part * p.choices; e += ctas * kPullThreads) {
    slots[e] = -1;
  }
  __syncthreads();
  if (k != 0 && threadIdx.x == 0) {
    const PeerLeg& leg = legs.leg[k - 1];
    __threadfence_system();
    if (atomicAdd(&leg.own->ctas, 1u) == ctas - 1) {
      leg.own->ctas = 0;
      __threadfence_system();
      StoreRelease(&leg.partner_box->done, leg.own->calls);
    }
  }
}

// ---- The inbox's low-latency form (peer_copy.h) ----

// The n (at most 8) bytes at p as a word's low bytes, and back.
__device__ __forceinline__ unsigned long long LoadUpTo8(const uint8_t* p, int64_t n) {
  if (n == kPeerLowLatencyData && reinterpret_cast<uintptr_t>(p) % 8 == 0) {
    return *reinterpret_cast<const unsigned long long*>(p);
  }
  unsigned long long v = 0;
  for (int64_t b = 0; b < n; ++b) v |= static_cast<unsigned long long>(p[b]) << (8 * b);
  return v;
}
__device__ __forceinline__ void StoreUpTo8(uint8_t* p, int64_t n, unsigned long long v) {
  if (n == kPeerLowLatencyData && reinterpret_cast<uintptr_t>(p) % 8 == 0) {
    *reinterpret_cast<unsigned long long*>(p) = v;
    return;
  }
  for (int64_t b = 0; b < n; ++b) p[b] = static_cast<uint8_t>(v >> (8 * b));
}

// Unit u of a slot: each half of `data` in a word with `flag` above it.
__device__ __forceinline__ void StoreUnit(uint8_t* slot, int64_t u, unsigned long long data,
                                          unsigned int flag) {
  const unsigned long long f = static_cast<unsigned long long>(flag) << 32;
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(slot + u * kPeerLowLatencyUnit),
               "l"((data & 0xffffffffull) | f), "l"((data >> 32) | f)
               : "memory");
}

// Unit u of a slot, whole: its data, and the flag it holds (`flag` where
// both words hold it; otherwise one that differs, from a call before or
// after).
__device__ __forceinline__ unsigned int LoadUnit(const uint8_t* slot, int64_t u,
                                                 unsigned int flag, unsigned long long* data) {
  unsigned long long w0, w1;
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];"
               : "=l"(w0), "=l"(w1)
               : "l"(slot + u * kPeerLowLatencyUnit)
               : "memory");
  *data = (w0 & 0xffffffffull) | (w1 << 32);
  const auto f0 = static_cast<unsigned int>(w0 >> 32), f1 = static_cast<unsigned int>(w1 >> 32);
  return f0 != flag ? f0 : f1;
}

// Waits until units at[0 .. count) of a slot hold call `call`'s flag, as
// AwaitCall waits for a flag (a flag past the call's: out of step), and
// returns their data; the loads of every unit not yet there are in flight
// together.
template <int N>
__device__ void AwaitUnits(const uint8_t* slot, const int64_t (&at)[N], int count,
                           unsigned long long call, const PeerWait& w,
                           unsigned long long (&data)[N]) {
  const auto flag = static_cast<unsigned int>(call);
  unsigned int missing = (1u << count) - 1, seen = flag;
  unsigned long long start = 0;
  for (unsigned int polls = 0;; ++polls) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      if ((missing >> j & 1u) == 0) continue;
      const unsigned int f = LoadUnit(slot, at[j], flag, &data[j]);
      if (f == flag) {
        missing &= ~(1u << j);
      } else {
        seen = f;
        if (static_cast<int>(f - flag) > 0) {
          GiveUp(w, PeerWaitFor::kDone, PeerGaveUp::kOutOfStep, call, f);
        }
      }
    }
    if (missing == 0) return;
    if (polls == 0) start = GlobalNanoseconds();
    if (polls % kChecksEvery == kChecksEvery - 1) {
      if (*w.gone != 0) GiveUp(w, PeerWaitFor::kDone, PeerGaveUp::kGone, call, seen);
      if (GlobalNanoseconds() - start > w.timeout_ns) {
        GiveUp(w, PeerWaitFor::kDone, PeerGaveUp::kTimeout, call, seen);
      }
    }
    __nanosleep(32);
  }
}

// Thread t of `threads`: `rows` rows of `row_bytes` from src (contiguous)
// into a slot's units from `first`, each row in PeerRowUnits of its own.
__device__ void PushUnits(const uint8_t* src, int64_t row_bytes, int64_t rows, uint8_t* slot,
                          int64_t first, unsigned int flag, int64_t t, int64_t threads) {
  const int64_t per_row = PeerRowUnits(row_bytes), units = rows * per_row;
  for (int64_t u0 = t; u0 < units; u0 += kSimtBatch * threads) {
    unsigned long long data[kSimtBatch];
#pragma unroll
    for (int j = 0; j < kSimtBatch; ++j) {
      const int64_t u = u0 + j * threads;
      if (u >= units) break;
      const int64_t r = rows == 1 ? 0 : u / per_row, at = (u - r * per_row) * kPeerLowLatencyData;
      data[j] = LoadUpTo8(src + r * row_bytes + at, min(kPeerLowLatencyData, row_bytes - at));
    }
#pragma unroll
    for (int j = 0; j < kSimtBatch; ++j) {
      const int64_t u = u0 + j * threads;
      if (u >= units) break;
      StoreUnit(slot, first + u, data[j], flag);
    }
  }
}

// PushUnits' counterpart: waits for each unit of call `call` (from the
// source `w` waits for) and copies its bytes to dst.
__device__ void PullUnits(const uint8_t* slot, int64_t first, uint8_t* dst, int64_t row_bytes,
                          int64_t rows, unsigned long long call, const PeerWait& w, int64_t t,
                          int64_t threads) {
  const int64_t per_row = PeerRowUnits(row_bytes), units = rows * per_row;
  for (int64_t u0 = t; u0 < units; u0 += kSimtBatch * threads) {
    int64_t at[kSimtBatch];
    int count = 0;
#pragma unroll
    for (int j = 0; j < kSimtBatch; ++j) {
      at[j] = first + u0 + j * threads;
      if (u0 + j * threads < units) count = j + 1;
    }
    unsigned long long data[kSimtBatch];
    AwaitUnits(slot, at, count, call, w, data);
#pragma unroll
    for (int j = 0; j < kSimtBatch; ++j) {
      const int64_t u = u0 + j * threads;
      if (u >= units) break;
      const int64_t r = rows == 1 ? 0 : u / per_row, b = (u - r * per_row) * kPeerLowLatencyData;
      StoreUpTo8(dst + r * row_bytes + b, min(kPeerLowLatencyData, row_bytes - b), data[j]);
    }
  }
}

// A ragged slot's entry j, three units (its fields in order), once there.
__device__ PeerInboxEntry AwaitEntry(const uint8_t* slot, int64_t j, unsigned long long call,
                                     const PeerWait& w) {
  const int64_t at[3] = {3 * j, 3 * j + 1, 3 * j + 2};
  unsigned long long data[3];
  AwaitUnits(slot, at, 3, call, w, data);
  return {static_cast<long long>(data[0]), static_cast<long long>(data[1]),
          static_cast<long long>(data[2])};
}

// ---- PeerInboxExchange (peer_copy.h) ----

constexpr int kInboxThreads = 256;
// A flag-form piece is one pass of a CTA's SimtCopy.
static_assert(kPeerInboxPieceBytes == int64_t{kInboxThreads} * kSimtBatch * 16);
// The low-latency form's threads a unit: each unit's trip (the sender's load
// and store, the receiver's poll) is a latency, not a share of bandwidth, so
// the form takes as many CTAs as keep every unit's trip in flight at once.
// Measured (2 x H200, 2026-11-30, one process): the later GPU's kernel of a
// 64 KiB all_to_all 5.7-6.1 us with 3 CTAs a position (the vector share),
// 3.7-4.0 with 16 or 32; 16 KiB: 4.8-5.0 with 1, 3.6-4.0 with 8 to 32.
constexpr int kInboxThreadsPerUnit = 2;
constexpr int64_t kInboxUnitsPerCta = kInboxThreads / kInboxThreadsPerUnit;
// ... and its grid takes at most one SM in kInboxLowLatencySmShare. A
// scratch build that took the form up to 128 KiB chunks (2 x 66 CTAs on
// 2 x H200) ran a loop of 100 such calls at 112 us a call, where 2 x 33 CTAs
// (32 KiB chunks) ran at 5.7-6.4 and the flag form's 2 x 9 (128 KiB) at
// 5.5-5.8; not yet explained, so the form stays within the grids measured.
constexpr int kInboxLowLatencySmShare = 2;
static_assert(sizeof(PeerInboxLegs) + sizeof(PeerSlices) <= 4096);

// The receiver's check of the per_part slices it gets from the participant
// at `source` (`entry(j)` the j-th): each against the operand's and the
// output's rows, then its size against this participant's recv_sizes entry
// for it; a slice is named by the index its source gives it.
template <typename Entry>
__device__ void CheckReceived(const PeerSlices& s, const PeerWait& check, int source,
                              Entry entry) {
  BadSlice mine{0, 0, 0, 0, 0};
  for (int64_t j = threadIdx.x; j < s.per_part && mine.rule == 0; j += blockDim.x) {
    // Loaded first: in flight while the entry arrives.
    const int64_t expected = IndexAt(s.recv_sizes, s.index64, source * s.per_part + j);
    const PeerInboxEntry e = entry(j);
    const int64_t index = s.position * s.per_part + j;
    mine = CheckSlice(s, index, e.in, e.size, e.out);
    if (mine.rule == 0 && expected != e.size) {
      mine = {index, static_cast<unsigned int>(PeerSizeRule::kRecv), expected, e.size, 0};
    }
  }
  ReportBadSlice(check, mine);
}

// One CTA of a leg in the low-latency form (PeerInboxExchangeKernel): it
// pushes its part of the slices for position i into the destination's slot
// `to` (a ragged exchange's CTA 0 also their entries), the leg's last CTA
// raises the leg's count of calls, then it copies its part of what the
// source at `from` put in this participant's slot `box`, each unit once its
// flags say it is there: a ragged exchange's entries first, each checked
// before any row is.
__device__ void InboxLowLatencyLeg(const PeerInboxLeg& leg, const PeerSlices& s,
                                   const PeerWait& check, int i, int from, int64_t cta,
                                   int64_t ctas, unsigned long long call, uint8_t* to,
                                   const uint8_t* box) {
  const auto flag = static_cast<unsigned int>(call);
  const int64_t t = cta * blockDim.x + threadIdx.x, threads = ctas * blockDim.x;
  const int64_t rows = s.bytes, per_row = PeerRowUnits(rows), first = 3 * int64_t{s.per_part};
  if (!s.ragged()) {
    PushUnits(s.src + i * s.bytes, s.bytes, 1, to, 0, flag, t, threads);
  } else {
    for (int64_t j = 0; j < s.per_part; ++j) {
      const int64_t slice = int64_t{i} * s.per_part + j;
      const int64_t in = IndexAt(s.input_offsets, s.index64, slice);
      PushUnits(s.src + in * rows, rows, IndexAt(s.send_sizes, s.index64, slice), to,
                first + in * per_row, flag, t, threads);
      if (cta == 0 && threadIdx.x < 3) {  // the entry's fields, in order
        const void* field = threadIdx.x == 0   ? s.input_offsets
                            : threadIdx.x == 1 ? s.send_sizes
                                               : s.output_offsets;
        StoreUnit(to, 3 * j + threadIdx.x,
                  static_cast<unsigned long long>(IndexAt(field, s.index64, slice)), flag);
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0 && AtomicAddAcqRel(&leg.own->ctas, 1u) == ctas - 1) {
    leg.own->ctas = 0;  // every CTA of the leg read the count before this
    leg.own->calls = call;
  }
  if (!s.ragged()) {
    PullUnits(box, 0, s.local + from * s.bytes, s.bytes, 1, call, leg.wait_by, t, threads);
    return;
  }
  // The first kKept entries as checked, for every thread's copies after
  // CheckReceived's closing barrier; the rest awaited again (at once).
  constexpr int kKept = 32;
  __shared__ PeerInboxEntry kept[kKept];
  CheckReceived(s, check, from, [&](int64_t j) {
    const PeerInboxEntry e = AwaitEntry(box, j, call, leg.wait_by);
    if (j < kKept) kept[j] = e;
    return e;
  });
  for (int64_t j = 0; j < s.per_part; ++j) {
    const PeerInboxEntry e = j < kKept ? kept[j] : AwaitEntry(box, j, call, leg.wait_by);
    PullUnits(box, first + e.in * per_row, s.local + e.out * rows, rows, e.size, call,
              leg.wait_by, t, threads);
  }
}

// The part [a, b) of slot bytes [lo, hi) that a chunk of `bytes` starting
// `at` bytes into a slot covers; false where it covers none.
__device__ __forceinline__ bool SlotPart(int64_t at, int64_t bytes, int64_t lo, int64_t hi,
                                         int64_t* a, int64_t* b) {
  *a = max(lo, at);
  *b = min(hi, at + bytes);
  return *a < *b;
}

// One CTA of a leg in the flag form (PeerInboxExchangeKernel): it pushes
// the slot's pieces cta, cta + ctas, ... of what goes to position i into
// the destination's slot `to`, raising each piece's flag once the piece is
// there; the leg's last CTA raises the leg's count of calls; then it copies
// the same pieces of this participant's slot `box`, each once its flag holds
// the call (a ragged exchange's header first, its entries checked before any
// row is). The pieces are the slot's, so the two participants' grids need
// not agree.
__device__ void InboxFlagLeg(const PeerInboxLeg& leg, const PeerSlices& s, const PeerWait& check,
                             int i, int from, int64_t cta, int64_t ctas, unsigned long long call,
                             uint8_t* to, const uint8_t* box) {
  const int64_t header = PeerInboxHeader(s), rows = s.bytes, pieces = PeerInboxPieces(s);
  auto* flags = reinterpret_cast<unsigned long long*>(to + PeerInboxFlags(s));
  const auto* arrived = reinterpret_cast<const unsigned long long*>(box + PeerInboxFlags(s));
  int64_t a, b;
  for (int64_t p = cta; p < pieces; p += ctas) {
    const int64_t lo = p * kPeerInboxPieceBytes, hi = lo + kPeerInboxPieceBytes;
    if (!s.ragged()) {
      const int64_t at = i * s.bytes % 16;
      if (SlotPart(at, s.bytes, lo, hi, &a, &b)) {
        SimtCopy(s.src + i * s.bytes + (a - at), to + a, b - a, 0, 1);
      }
    } else {
      for (int64_t j = 0; j < s.per_part; ++j) {
        const int64_t slice = int64_t{i} * s.per_part + j;
        const int64_t in = IndexAt(s.input_offsets, s.index64, slice);
        const int64_t at = header + in * rows;
        if (SlotPart(at, IndexAt(s.send_sizes, s.index64, slice) * rows, lo, hi, &a, &b)) {
          SimtCopy(s.src + in * rows + (a - at), to + a, b - a, 0, 1);
        }
      }
      // The entries that start in this piece (one may end in the next).
      const int64_t sz = sizeof(PeerInboxEntry);
      for (int64_t j = (lo + sz - 1) / sz + threadIdx.x; j < s.per_part && j * sz < hi;
           j += blockDim.x) {
        const int64_t slice = int64_t{i} * s.per_part + j;
        reinterpret_cast<PeerInboxEntry*>(to)[j] =
            PeerInboxEntry{IndexAt(s.input_offsets, s.index64, slice),
                           IndexAt(s.send_sizes, s.index64, slice),
                           IndexAt(s.output_offsets, s.index64, slice)};
      }
    }
    // The CTA's stores of the piece (ordered before the flag by the barrier)
    // travel ahead of it: the release is cumulative.
    __syncthreads();
    if (threadIdx.x == 0) StoreRelease(&flags[p], call);
  }
  __syncthreads();
  if (threadIdx.x == 0 && AtomicAddAcqRel(&leg.own->ctas, 1u) == ctas - 1) {
    leg.own->ctas = 0;  // every CTA of the leg read the count before this
    leg.own->calls = call;
  }
  // Waits for piece p of this participant's slot (each thread's own acquire
  // of what thread 0 saw arrive).
  auto await_piece = [&](int64_t p) {
    if (threadIdx.x == 0) AwaitCall(&arrived[p], call, leg.wait_by, PeerWaitFor::kDone);
    __syncthreads();
    LoadAcquire(&arrived[p]);
  };
  if (!s.ragged()) {
    const int64_t at = s.position * s.bytes % 16;
    for (int64_t p = cta; p < pieces; p += ctas) {
      await_piece(p);
      if (SlotPart(at, s.bytes, p * kPeerInboxPieceBytes, (p + 1) * kPeerInboxPieceBytes, &a,
                   &b)) {
        SimtCopy(box + a, s.local + from * s.bytes + (a - at), b - a, 0, 1);
      }
    }
    return;
  }
  for (int64_t p = 0; p * kPeerInboxPieceBytes < header; ++p) await_piece(p);
  const auto* entries = reinterpret_cast<const PeerInboxEntry*>(box);
  CheckReceived(s, check, from, [&](int64_t j) { return entries[j]; });
  for (int64_t p = cta; p < pieces; p += ctas) {
    if (p * kPeerInboxPieceBytes >= header) await_piece(p);
    for (int64_t j = 0; j < s.per_part; ++j) {
      const PeerInboxEntry e = entries[j];
      const int64_t at = header + e.in * rows;
      if (SlotPart(at, e.size * rows, p * kPeerInboxPieceBytes, (p + 1) * kPeerInboxPieceBytes,
                   &a, &b)) {
        SimtCopy(box + a, s.local + e.out * rows + (a - at), b - a, 0, 1);
      }
    }
  }
}

// CTA b works on what goes to position b mod parts, with the other CTAs of
// that position (ctas of them). What this participant keeps is copied into
// its result. For another position, the CTAs push into the destination's
// slot and copy out of this participant's slot for the leg's source, in the
// flag form (InboxFlagLeg) or the low-latency form (InboxLowLatencyLeg). A
// ragged exchange's CTAs check this participant's slices before any copy,
// and what each source sent before copying it. The grid fits on the device
// at once (LaunchPeerInboxExchange), so no CTA waits for a CTA that cannot
// start.
__global__ void __launch_bounds__(kInboxThreads)
    PeerInboxExchangeKernel(PeerInboxLegs legs, PeerSlices s, PeerWait check) {
  const int i = static_cast<int>(blockIdx.x % s.parts);
  const int64_t cta = blockIdx.x / s.parts, ctas = gridDim.x / s.parts;
  const int k = LegOf(s, int64_t{i} * s.per_part);
  const int64_t header = PeerInboxHeader(s), rows = s.bytes;  // ragged: a row's bytes
  auto sent = [&](int64_t j) {  // this participant's j-th slice for position i
    const int64_t slice = int64_t{i} * s.per_part + j;
    return PeerInboxEntry{IndexAt(s.input_offsets, s.index64, slice),
                          IndexAt(s.send_sizes, s.index64, slice),
                          IndexAt(s.output_offsets, s.index64, slice)};
  };
  if (s.ragged()) CheckOwnSlices(s, check);
  if (k == 0) {
    if (!s.ragged()) {
      SimtCopy(s.src + i * s.bytes, s.local + s.position * s.bytes, s.bytes, cta, ctas);
      return;
    }
    CheckReceived(s, check, s.position, sent);
    for (int64_t j = 0; j < s.per_part; ++j) {
      const PeerInboxEntry e = sent(j);
      SimtCopy(s.src + e.in * rows, s.local + e.out * rows, e.size * rows, cta, ctas);
    }
    return;
  }
  const PeerInboxLeg leg = legs.leg[k - 1];  // a copy, as in MeetLeg
  // Every CTA of the leg reads the count before the last one raises it.
  const unsigned long long call = *static_cast<volatile unsigned long long*>(&leg.own->calls) + 1;
  const int64_t slot = (call & 1) * PeerInboxStride(PeerInboxPayload(s));
  uint8_t* to = leg.partner_inbox + slot;
  const uint8_t* box = leg.inbox + slot;
  const int from = (s.position - k + s.parts) % s.parts;
  if (PeerInboxLowLatency(s)) {
    InboxLowLatencyLeg(leg, s, check, i, from, cta, ctas, call, to, box);
    return;
  }
  InboxFlagLeg(leg, s, check, i, from, cta, ctas, call, to, box);
}

// `kernel` on `stream`; `early`: with programmatic dependent launch.
template <typename... Params, typename... Args>
ffi::Error LaunchOn(cudaStream_t stream, bool early, void (*kernel)(Params...), unsigned grid,
                    unsigned block, std::size_t smem, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(block);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attr;
  config.numAttrs = early ? 1 : 0;
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...));
  return ffi::Error::Success();
}

}  // namespace

ffi::Error LaunchPeerMeet(PeerMailbox* own, PeerMailbox* by_box, unsigned long long published,
                          bool await_partner, const PeerWait& wait, cudaStream_t stream) {
  PeerMeetKernel<<<1, 1, 0, stream>>>(own, by_box, published, await_partner, wait);
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ffi::Error::Success();
}

ffi::Error LaunchPeerFinish(PeerMailbox* own, const PeerWait& wait, cudaStream_t stream) {
  PeerFinishKernel<<<1, 1, 0, stream>>>(own, wait);
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ffi::Error::Success();
}

ffi::Error LaunchPeerCopy(PeerMailbox* own, PeerMailbox* partner_box, void* local,
                          std::size_t bytes, bool push, bool tma, cudaStream_t stream,
                          int device) {
  constexpr std::string_view kOp = "jax_tma.ppermute";
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  BulkCopyPlan plan;
  int threads = kSimtThreads;
  if (tma) {
    // Laid out from this side's address: the partner's must share it modulo
    // 16 B (XLA aligns its buffers), else the kernel copies with SIMT.
    std::string why;
    if (!PlanBulkCopy(kDefaultBulkCopyConfig, kNoCounterSlot, bytes, local, info.sm_count, 0,
                      &plan, &why)) {
      return InvalidArgument(kOp, why);
    }
    static PerDevice<int> smem_limit;
    int limit = 0;
    JAX_TMA_RETURN_IF_FAILED(smem_limit.Get(
        device,
        [](int d, int* l) {
          return AllowBulkSmem(reinterpret_cast<const void*>(PeerCopyKernel), d, l);
        },
        &limit));
    if (plan.smem > static_cast<std::size_t>(limit)) {
      return InvalidArgument(kOp, "the bulk pipeline needs ", plan.smem,
                             " B of shared memory; device ", device, " allows ", limit, " B");
    }
    threads = kBulkThreads;
  } else {
    const int64_t vectors = static_cast<int64_t>(bytes / 16) + 1;
    plan.blocks = std::min<int64_t>((vectors + kSimtThreads - 1) / kSimtThreads,
                                    int64_t{info.sm_count} * 8);
  }
  PeerCopyKernel<<<static_cast<int>(plan.blocks), threads, plan.smem, stream>>>(
      own, partner_box, static_cast<uint8_t*>(local), static_cast<int64_t>(bytes), push, tma,
      plan.head, plan.body, plan.chunk, kDefaultBulkCopyConfig.stages, plan.chunks_per_cta);
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ffi::Error::Success();
}

ffi::Error LaunchPeerScatter(std::string_view op, const PeerLegs& legs,
                             const PeerSlices& slices, bool tma, int64_t expected_bytes,
                             int64_t max_ctas, const PeerWait& check, cudaStream_t stream,
                             int device) {
  if (slices.slices < 1) return InvalidArgument(op, "an exchange needs a slice");
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  // The slices share the SMs (those of the budget): each gets the CTAs a
  // copy of its expected size would have on its share.
  const int64_t share = std::max<int64_t>(
      1, std::min<int64_t>(info.sm_count, max_ctas > 0 ? max_ctas : info.sm_count) /
             slices.slices);
  const int sms = static_cast<int>(share);
  BulkCopyPlan plan;
  const auto bytes = static_cast<std::size_t>(std::max<int64_t>(expected_bytes, 1));
  if (tma) {
    std::string why;
    if (!PlanBulkCopy(kDefaultBulkCopyConfig, kNoCounterSlot, bytes, slices.src, sms, 0, &plan,
                      &why)) {
      return InvalidArgument(op, why);
    }
    static PerDevice<int> smem_limit;
    int limit = 0;
    JAX_TMA_RETURN_IF_FAILED(smem_limit.Get(
        device,
        [](int d, int* l) {
          return AllowBulkSmem(reinterpret_cast<const void*>(PeerScatterKernel), d, l);
        },
        &limit));
    if (plan.smem > static_cast<std::size_t>(limit)) {
      return InvalidArgument(op, "the bulk pipeline needs ", plan.smem,
                             " B of shared memory; device ", device, " allows ", limit, " B");
    }
  } else {
    const int64_t vectors = static_cast<int64_t>(bytes / 16) + 1;
    plan.blocks = std::min<int64_t>((vectors + kScatterThreads - 1) / kScatterThreads,
                                    int64_t{sms} * 8);
  }
  if (max_ctas > 0) {
    plan.blocks = std::min<int64_t>(plan.blocks, std::max<int64_t>(1, max_ctas / slices.slices));
  }
  const int64_t grid = plan.blocks * slices.slices;
  if (grid > 0x7fffffff) {
    return InvalidArgument(op, "an exchange of ", slices.slices, " slices of ", plan.blocks,
                           " CTAs each, over the grid limit");
  }
  return LaunchOn(stream, false, PeerScatterKernel, static_cast<unsigned int>(grid),
                  kScatterThreads, plan.smem, legs, slices, check, tma, plan.chunk,
                  kDefaultBulkCopyConfig.stages);
}

ffi::Error LaunchPeerScatterSum(std::string_view op, const PeerLegs& legs,
                                const PeerSlices& slices, const PeerSumRows& sums,
                                int64_t max_ctas, const PeerWait& check, cudaStream_t stream,
                                int device) {
  if (slices.slices < 1 || !slices.ragged()) {
    return InvalidArgument(op, "a summed exchange needs ragged slices");
  }
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  // The slices share two CTAs an SM (or the budget), each no more than a
  // warp a piece of the rows an even share of the operand gives it.
  const int64_t warps = kSumThreads / 32;
  const int64_t budget = max_ctas > 0 ? max_ctas : int64_t{2} * info.sm_count;
  const int64_t piece = int64_t{32} * 16;
  const int64_t units = (slices.src_rows / slices.slices + 1) * ((slices.bytes + piece - 1) / piece);
  const int64_t ctas = std::max<int64_t>(
      1, std::min<int64_t>(budget / slices.slices, (units + warps - 1) / warps));
  const int64_t grid = ctas * slices.slices;
  if (grid > 0x7fffffff) {
    return InvalidArgument(op, "an exchange of ", slices.slices, " slices of ", ctas,
                           " CTAs each, over the grid limit");
  }
  const bool early = info.cc_major >= 9;
  JAX_TMA_RETURN_IF_FAILED(LaunchOn(stream, false, PeerScatterSumMeetKernel, 1, kSumMeetThreads,
                                    0, legs, slices, sums, check));
  JAX_TMA_RETURN_IF_FAILED(LaunchOn(stream, early, PeerScatterSumKernel,
                                    static_cast<unsigned int>(grid), kSumThreads, 0, legs,
                                    slices, sums));
  if (legs.count > 0) {
    JAX_TMA_RETURN_IF_FAILED(
        LaunchOn(stream, early, PeerScatterFinishKernel, 1, 32, 0, legs));
  }
  return ffi::Error::Success();
}

ffi::Error LaunchPeerPull(std::string_view op, const PeerLegs& legs, const PeerPullRows& rows,
                          int64_t max_ctas, const PeerWait& check, cudaStream_t stream,
                          int device) {
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  // Each leg gets its share of two CTAs an SM (or of the budget), and no
  // more than a warp a piece of a row (the pieces of rows copied in vectors).
  const int64_t warps = kPullThreads / 32;
  const int64_t budget = max_ctas > 0 ? max_ctas : int64_t{2} * info.sm_count;
  const int64_t units = rows.per_part * PullPieces(rows.bytes, rows.bytes % 16 == 0);
  const int64_t ctas =
      std::max<int64_t>(1, std::min<int64_t>(budget / rows.parts, (units + warps - 1) / warps));
  const int64_t grid = ctas * rows.parts;
  if (grid > 0x7fffffff) {
    return InvalidArgument(op, "a pull of ", rows.parts, " legs of ", ctas,
                           " CTAs each, over the grid limit");
  }
  const bool early = info.cc_major >= 9;
  JAX_TMA_RETURN_IF_FAILED(
      LaunchOn(stream, false, PeerPullMeetKernel, 1, kPullMeetThreads, 0, legs, rows, check));
  JAX_TMA_RETURN_IF_FAILED(LaunchOn(stream, early, PeerPullCopyKernel,
                                    static_cast<unsigned int>(grid), kPullThreads, 0, legs,
                                    rows));
  if (legs.count > 0) {
    JAX_TMA_RETURN_IF_FAILED(
        LaunchOn(stream, early, PeerScatterFinishKernel, 1, 32, 0, legs));
  }
  return ffi::Error::Success();
}

ffi::Error LaunchPeerInboxExchange(std::string_view op, const PeerInboxLegs& legs,
                                   const PeerSlices& slices, int64_t max_ctas,
                                   const PeerWait& check, cudaStream_t stream, int device) {
  if (slices.slices != int64_t{slices.parts} * slices.per_part ||
      legs.count != slices.parts - 1 || (!slices.ragged() && slices.per_part != 1)) {
    return InvalidArgument(op, "an inbox exchange takes per_part slices for each of its ",
                           slices.parts, " parts (one without ragged sizes)");
  }
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  // The flag form takes a CTA a piece of the slot (PeerInboxPieces); the
  // low-latency form a unit for every kInboxThreadsPerUnit threads of what
  // an equal share of the operand would be, within one SM in
  // kInboxLowLatencySmShare. The whole grid is at most one CTA per SM (and
  // within the budget): every CTA is resident while the others wait.
  const bool low_latency = PeerInboxLowLatency(slices);
  const int64_t share =
      slices.ragged() ? slices.src_rows * slices.bytes / slices.parts : slices.bytes;
  const int64_t wanted =
      low_latency ? (PeerRowUnits(share) + 1 + kInboxUnitsPerCta - 1) / kInboxUnitsPerCta
                  : PeerInboxPieces(slices);
  const int64_t sms = low_latency ? info.sm_count / kInboxLowLatencySmShare : info.sm_count;
  const int64_t budget = std::min<int64_t>(sms, max_ctas > 0 ? max_ctas : sms);
  const int64_t ctas =
      std::clamp<int64_t>(wanted, 1, std::max<int64_t>(1, budget / slices.parts));
  if (ctas * slices.parts > info.sm_count) {
    return InvalidArgument(op, "an inbox exchange of ", slices.parts, " parts needs ",
                           slices.parts, " CTAs at once; device ", device, " has ",
                           info.sm_count, " SMs");
  }
  PeerInboxExchangeKernel<<<static_cast<unsigned int>(ctas * slices.parts), kInboxThreads, 0,
                            stream>>>(legs, slices, check);
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ffi::Error::Success();
}

}  // namespace jax_tma
