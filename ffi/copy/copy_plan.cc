// Host rules of jax_tma.copy's CUDA path (see copy_plan.h).
#include "copy/copy_plan.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "cuda/device_info.h"
#include "cuda/launch.h"

namespace jax_tma {
namespace {

// Slots 1.. are handed to call sites; kRawCounterSlot is the raw hook's.
struct SlotPool {
  std::mutex mu;
  std::vector<int> free;
  int next = kRawCounterSlot + 1;
};

SlotPool& Pool() {
  static auto* pool = new SlotPool();
  return *pool;
}

}  // namespace

int AcquireBulkCounterSlot() {
  SlotPool& p = Pool();
  std::lock_guard<std::mutex> lock(p.mu);
  if (!p.free.empty()) {
    const int slot = p.free.back();
    p.free.pop_back();
    return slot;
  }
  return p.next < kBulkCounterSlots ? p.next++ : kNoCounterSlot;
}

void ReleaseBulkCounterSlot(int slot) {
  if (slot <= kRawCounterSlot || slot >= kBulkCounterSlots) return;
  SlotPool& p = Pool();
  std::lock_guard<std::mutex> lock(p.mu);
  p.free.push_back(slot);
}

CopyKernel ChooseCopyKernel(Method method, std::size_t bytes, bool has_tma,
                            const void* src, const void* dst) {
  if (bytes == 0) return CopyKernel::kNone;
  const bool simt = method != Method::kTma || !has_tma || !HasBulkBody(src, dst);
  return simt ? CopyKernel::kSimt : CopyKernel::kTma;
}

ffi::Error PlanCopy(std::string_view op, Method method, const ByteCopy& c, const DeviceInfo& info,
                    int device, int counter_slot, const BulkCopyConfig* config, CopyPlan* plan) {
  if (c.bytes == 0) {
    plan->kernel = CopyKernel::kNone;
    return ffi::Error::Success();
  }
  if (method == Method::kTma && !info.has_tma()) {
    return InvalidArgument(op, info.NeedsTma("tma", device));
  }
  plan->kernel = ChooseCopyKernel(method, c.bytes, info.has_tma(), c.src, c.dst);
  plan->config = config != nullptr ? *config
                                   : ChooseBulkCopyConfig(c.bytes, counter_slot,
                                                          CopyDevicePlanFor(info.memory_tbps).dynamic);
  plan->counter_slot = counter_slot;
  return ffi::Error::Success();
}

const CopyDevicePlan& CopyDevicePlanFor(double memory_tbps) {
  const CopyDevicePlan* nearest = &kCopyDevicePlans[0];
  for (const CopyDevicePlan& p : kCopyDevicePlans) {
    if (std::abs(p.memory_tbps - memory_tbps) < std::abs(nearest->memory_tbps - memory_tbps)) {
      nearest = &p;
    }
  }
  return memory_tbps > 0 ? *nearest : kCopyDevicePlans[0];
}

const BulkCopyConfig& ChooseBulkCopyConfig(std::size_t bytes, int counter_slot,
                                           const BulkCopyConfig& dynamic) {
  const bool use_dynamic = counter_slot != kNoCounterSlot && bytes >= kDynamicBulkMinBytes;
  return use_dynamic ? dynamic : kDefaultBulkCopyConfig;
}

bool CheckBulkCopyConfig(const BulkCopyConfig& config, int counter_slot, std::string* why) {
  if (config.stages < 2 || config.stages > kMaxBulkStages || config.chunk_bytes < 1024 ||
      config.chunk_bytes % 128 != 0 || config.chunk_bytes >= (1u << 20) ||
      config.chunks_per_cta < 1) {
    return Reject(why, "bad pipeline config: chunk_bytes=", config.chunk_bytes,
                  " (a multiple of 128 in [1024, 2^20)) stages=", config.stages, " (2..",
                  kMaxBulkStages, ") chunks_per_cta=", config.chunks_per_cta, " (>= 1)");
  }
  if (config.dynamic && (counter_slot < 0 || counter_slot >= kBulkCounterSlots)) {
    return Reject(why, "the dynamic schedule needs a counter slot in [0, ", kBulkCounterSlots,
                  "), got ", counter_slot);
  }
  return true;
}

bool PlanBulkCopy(const BulkCopyConfig& config, int counter_slot, std::size_t bytes,
                  const void* src, int sm_count, int dynamic_ctas_per_sm, BulkCopyPlan* p,
                  std::string* why) {
  if (!CheckBulkCopyConfig(config, counter_slot, why)) return false;
  const auto s = reinterpret_cast<std::uintptr_t>(src);
  const int64_t n = static_cast<int64_t>(bytes);
  const int64_t align = static_cast<int64_t>(kBulkAlign);
  p->head = std::min<int64_t>(
      n, static_cast<int64_t>((kBulkAlign - (s & (kBulkAlign - 1))) & (kBulkAlign - 1)));
  p->body = (n - p->head) / align * align;
  const int64_t sms = sm_count;
  p->chunk = config.chunk_bytes;
  p->chunks_per_cta = config.chunks_per_cta;
  if (config.dynamic) {
    // chunks_per_cta static chunks per CTA, then claims; as many CTAs as fit
    // on the GPU at once.
    const int64_t nchunks = (p->body + p->chunk - 1) / p->chunk;
    p->blocks = std::clamp<int64_t>((nchunks + p->chunks_per_cta - 1) / p->chunks_per_cta, 1,
                                    sms * std::max(dynamic_ctas_per_sm, 1));
  } else {
    // Small bodies use smaller chunks and fewer per CTA, so that every SM
    // gets a full pipeline's worth of them.
    const int64_t even = (p->body + sms * config.stages - 1) / (sms * config.stages);
    p->chunk = static_cast<uint32_t>(
        std::clamp<int64_t>((even + 127) / 128 * 128, 1024, config.chunk_bytes));
    const int64_t nchunks = (p->body + p->chunk - 1) / p->chunk;
    p->chunks_per_cta = std::clamp<int64_t>((nchunks + sms - 1) / sms, 1, config.chunks_per_cta);
    p->blocks = std::max<int64_t>(1, (nchunks + p->chunks_per_cta - 1) / p->chunks_per_cta);
    if (p->blocks > 0x7fffffff) {
      return Reject(why, "the copy of ", bytes, " B needs ", p->blocks,
                    " CTAs, over the grid limit");
    }
  }
  p->one_chunk = !config.dynamic && p->body > 0 && p->chunks_per_cta == 1 &&
                 p->chunk <= kOneChunkMaxBytes;
  p->smem = static_cast<std::size_t>(config.stages) * p->chunk;
  return true;
}

}  // namespace jax_tma
