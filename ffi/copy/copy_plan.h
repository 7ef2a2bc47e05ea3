// Host rules of jax_tma.copy's CUDA path: which kernel a method runs
// (PlanCopy, once per call), the TMA bulk pipeline's configurations and their
// limits, its chunking and grid, and the work-counter slots of its dynamic
// schedule. Pure host C++, unit-tested without a GPU
// (tests/cpp/test_copy_plan.cc).
#ifndef JAX_TMA_FFI_COPY_COPY_PLAN_H_
#define JAX_TMA_FFI_COPY_COPY_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common.h"

namespace jax_tma {

struct DeviceInfo;  // cuda/device_info.h, not included: CPU builds read the constants below

// Shape of the bulk pipeline: each CTA streams `chunks_per_cta` chunks of
// `chunk_bytes` through `stages` shared-memory buffers (static schedule), or
// `chunks_per_cta` chunks and then chunks claimed from a work counter
// (dynamic).
struct BulkCopyConfig {
  uint32_t chunk_bytes;
  int stages;
  int64_t chunks_per_cta;
  bool dynamic = false;
};

// One round of 4 x 32 KiB per CTA, the block scheduler handing out CTAs; the
// sweep behind it is benchmarks/bench_tune_bulk.py (results in
// benchmarks/results/).
inline constexpr BulkCopyConfig kDefaultBulkCopyConfig{32 * 1024, 4, 4};
// The dynamic schedule, from kDynamicBulkMinBytes up where a counter slot is
// available: many small stages keep every SM's pipeline full to the end of
// large copies. Its shape is the device's: each entry below is the shape that
// benchmarks/bench_tune_bulk.py ranked first on the device it names
// (benchmarks/TUNING.md), with that device's peak memory bandwidth; a device
// takes the entry nearest to its own bandwidth (CopyDevicePlanFor), so that
// one measured on neither gets the nearest measured plan.
struct CopyDevicePlan {
  const char* measured_on;  // the device's name, as CUDA reports it
  double memory_tbps;       // its peak: DeviceInfo::memory_tbps
  BulkCopyConfig dynamic;
};
inline constexpr CopyDevicePlan kCopyDevicePlans[] = {
    {"NVIDIA H100 80GB HBM3", 3.35, {8 * 1024, 16, 4, true}},
    {"NVIDIA H200", 4.8, {12 * 1024, 16, 4, true}},
};
// The entry of kCopyDevicePlans nearest to `memory_tbps` (the first for 0,
// a device that did not report its memory).
const CopyDevicePlan& CopyDevicePlanFor(double memory_tbps);
inline constexpr std::size_t kDynamicBulkMinBytes = std::size_t{32} << 20;
inline constexpr int kMaxBulkStages = 16;
// cp.async.bulk moves 16-B aligned addresses and sizes.
inline constexpr std::size_t kBulkAlign = kTmaAlignBytes;

// Work counters of the dynamic schedule. A launch that uses a slot must not
// overlap in time with another launch on the same slot and device: each FFI
// call site owns one (an XLA executable never runs concurrently with itself
// on a device); the benchmarks' raw hook, whose launches its callers keep on
// one stream, uses kRawCounterSlot (in its own module, so its own copy of the
// counters).
inline constexpr int kBulkCounterSlots = 1024;
inline constexpr int kRawCounterSlot = 0;
inline constexpr int kNoCounterSlot = -1;
// A free slot for a call site, or kNoCounterSlot when all are taken (the call
// site then copies with the static schedule). Thread-safe.
int AcquireBulkCounterSlot();
void ReleaseBulkCounterSlot(int slot);

// Whether src and dst are equal modulo 16 B: only then do the two buffers
// share an aligned body that cp.async.bulk can move.
inline bool HasBulkBody(const void* src, const void* dst) {
  const auto rel = reinterpret_cast<std::uintptr_t>(src) ^ reinterpret_cast<std::uintptr_t>(dst);
  return (rel & (kBulkAlign - 1)) == 0;
}

enum class CopyKernel { kNone, kTma, kSimt };

// The kernel that copies `bytes` from `src` to `dst` for `method` (kTma was
// checked to have TMA): SIMT without TMA, for Method::kSimt, for kAuto (at
// every size SIMT ran at least as fast as the bulk pipeline's best shape on an
// H100 and faster on an H200: benchmarks/TUNING.md), and where the buffers
// have no common aligned body (HasBulkBody); else the TMA bulk pipeline.
// kNone for an empty copy.
CopyKernel ChooseCopyKernel(Method method, std::size_t bytes, bool has_tma,
                            const void* src, const void* dst);

// The bulk configuration of a copy of `bytes` that names none: the dynamic
// schedule (`dynamic`, the device's) from kDynamicBulkMinBytes up when the
// call site has a counter slot, else the default static one.
const BulkCopyConfig& ChooseBulkCopyConfig(std::size_t bytes, int counter_slot,
                                           const BulkCopyConfig& dynamic);

// What one copy runs: the kernel and, for kTma, the pipeline configuration
// and the work-counter slot of its dynamic schedule.
struct CopyPlan {
  CopyKernel kernel = CopyKernel::kNone;
  BulkCopyConfig config = kDefaultBulkCopyConfig;
  int counter_slot = kNoCounterSlot;
};

// Plans the copy `c` for `method` on `device` (`info`): the kernel
// (ChooseCopyKernel) and the bulk configuration, `config` where given, else
// ChooseBulkCopyConfig's with the device's dynamic shape (CopyDevicePlanFor). Method::kTma on a device without TMA is an error
// naming `op` (an empty copy plans kNone on any device).
ffi::Error PlanCopy(std::string_view op, Method method, const ByteCopy& c, const DeviceInfo& info,
                    int device, int counter_slot, const BulkCopyConfig* config, CopyPlan* plan);

// The bulk kernel's launch: bytes [0, head) and [head + body, bytes) are
// copied with ordinary stores, the body (16-B aligned in both buffers, a
// multiple of 16 B) in `chunk`-byte pieces, `chunks_per_cta` per CTA first.
struct BulkCopyPlan {
  int64_t head = 0;
  int64_t body = 0;
  uint32_t chunk = 0;
  int64_t chunks_per_cta = 0;
  int64_t blocks = 0;
  std::size_t smem = 0;  // dynamic shared memory per CTA
  // A static plan of one chunk a CTA, each at most kOneChunkMaxBytes: the
  // copy family's launch copies each chunk with one bulk load and one bulk
  // store, without the pipeline (BulkChunkKernel), in one chunk of shared
  // memory. (`smem` stays the pipeline's: other launchers run the pipeline
  // on the same plan with CTAs of their own.)
  bool one_chunk = false;
};

// The largest chunk of a one-chunk plan: the dynamic shared memory any
// launch may take without opting in.
inline constexpr uint32_t kOneChunkMaxBytes = 48 * 1024;

// The configuration rules: stages in [2, kMaxBulkStages], chunks a multiple of
// 128 B in [1 KiB, 1 MiB) (one mbarrier phase counts < 2^20 transaction
// bytes), at least one chunk per CTA, and a counter slot for the dynamic
// schedule. False with the broken rule in *why (may be null).
bool CheckBulkCopyConfig(const BulkCopyConfig& config, int counter_slot, std::string* why);

// CheckBulkCopyConfig, then lays out the copy
// of `bytes` from `src` on `sm_count` SMs. The dynamic schedule runs one CTA
// per free CTA slot: `dynamic_ctas_per_sm` is the kernel's occupancy at
// config.stages x config.chunk_bytes. The static one shrinks chunks and
// chunks per CTA for small bodies, so that every SM gets a full pipeline.
// False with the broken rule in *why (may be null).
bool PlanBulkCopy(const BulkCopyConfig& config, int counter_slot, std::size_t bytes,
                  const void* src, int sm_count, int dynamic_ctas_per_sm, BulkCopyPlan* plan,
                  std::string* why);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_COPY_COPY_PLAN_H_
