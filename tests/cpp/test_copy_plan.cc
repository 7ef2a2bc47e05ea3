// jax_tma.copy's host rules (ffi/copy/copy_plan.h): the kernel each method
// takes, the bulk configurations and each rule that rejects one (with its
// reason), the bulk kernel's chunking and grid, and the counter-slot pool.
#include <cstdint>
#include <string>
#include <vector>

#include "check.h"
#include "copy/copy_plan.h"

namespace jax_tma {
namespace {

const void* Addr(std::uintptr_t a) { return reinterpret_cast<const void*>(a); }

constexpr std::size_t kMiB = std::size_t{1} << 20;

void TestKernelChoice() {
  const void* s = Addr(0x100000);
  const void* d = Addr(0x200000);
  CHECK(ChooseCopyKernel(Method::kAuto, 0, true, s, d) == CopyKernel::kNone);
  CHECK(ChooseCopyKernel(Method::kAuto, 1, true, s, d) == CopyKernel::kSimt);
  CHECK(ChooseCopyKernel(Method::kAuto, 4096 * kMiB, true, s, d) == CopyKernel::kSimt);
  CHECK(ChooseCopyKernel(Method::kAuto, 64 * kMiB, false, s, d) == CopyKernel::kSimt);
  CHECK(ChooseCopyKernel(Method::kTma, 1, true, s, d) == CopyKernel::kTma);
  CHECK(ChooseCopyKernel(Method::kSimt, 64 * kMiB, true, s, d) == CopyKernel::kSimt);
  // Equally misaligned buffers share an aligned body; others have none.
  CHECK(ChooseCopyKernel(Method::kTma, kMiB, true, Addr(0x100003), Addr(0x200003)) ==
        CopyKernel::kTma);
  CHECK(ChooseCopyKernel(Method::kTma, kMiB, true, Addr(0x100008), d) == CopyKernel::kSimt);
  CHECK(HasBulkBody(Addr(0x10), Addr(0x20)));
  CHECK(!HasBulkBody(Addr(0x10), Addr(0x21)));
}

void TestConfigChoice() {
  const BulkCopyConfig& dynamic = kCopyDevicePlans[1].dynamic;
  CHECK_EQ(&ChooseBulkCopyConfig(64 * kMiB, 5, dynamic), &dynamic);
  CHECK_EQ(ChooseBulkCopyConfig(kDynamicBulkMinBytes - 1, 5, dynamic).dynamic, false);
  CHECK_EQ(ChooseBulkCopyConfig(64 * kMiB, kNoCounterSlot, dynamic).dynamic, false);
  CHECK_EQ(ChooseBulkCopyConfig(64 * kMiB, kNoCounterSlot, dynamic).chunk_bytes,
           kDefaultBulkCopyConfig.chunk_bytes);
}

std::string ConfigWhy(BulkCopyConfig c, int slot = kRawCounterSlot) {
  std::string why;
  return CheckBulkCopyConfig(c, slot, &why) ? "ok" : why;
}

void TestConfigRules() {
  CHECK_EQ(ConfigWhy(kDefaultBulkCopyConfig), "ok");
  CHECK_EQ(ConfigWhy(kCopyDevicePlans[0].dynamic), "ok");
  CHECK_EQ(ConfigWhy({32768, 1, 4}),
           "bad pipeline config: chunk_bytes=32768 (a multiple of 128 in [1024, 2^20)) "
           "stages=1 (2..16) chunks_per_cta=4 (>= 1)");
  CHECK(ConfigWhy({32768, 17, 4}) != "ok");
  CHECK(ConfigWhy({1000, 4, 4}) != "ok");
  CHECK(ConfigWhy({1024 + 64, 4, 4}) != "ok");
  CHECK(ConfigWhy({1u << 20, 4, 4}) != "ok");
  CHECK(ConfigWhy({32768, 4, 0}) != "ok");
  CHECK_EQ(ConfigWhy({(1u << 20) - 128, 2, 1}), "ok");
  CHECK_EQ(ConfigWhy(kCopyDevicePlans[0].dynamic, kNoCounterSlot),
           "the dynamic schedule needs a counter slot in [0, 1024), got -1");
  CHECK(ConfigWhy(kCopyDevicePlans[0].dynamic, kBulkCounterSlots) != "ok");
  CHECK_EQ(ConfigWhy(kDefaultBulkCopyConfig, kNoCounterSlot), "ok");  // static needs none
}

// Each measured device gets its own plan; others the nearest in memory
// bandwidth; a device that reports none the first.
void TestDevicePlans() {
  for (const CopyDevicePlan& p : kCopyDevicePlans) {
    CHECK_EQ(&CopyDevicePlanFor(p.memory_tbps), &p);
    CHECK_EQ(ConfigWhy(p.dynamic), "ok");
    CHECK(p.dynamic.dynamic);
  }
  CHECK_EQ(std::string(CopyDevicePlanFor(3.36).measured_on), "NVIDIA H100 80GB HBM3");
  CHECK_EQ(std::string(CopyDevicePlanFor(2.0).measured_on), "NVIDIA H100 80GB HBM3");
  CHECK_EQ(std::string(CopyDevicePlanFor(4.92).measured_on), "NVIDIA H200");
  CHECK_EQ(std::string(CopyDevicePlanFor(8.0).measured_on), "NVIDIA H200");
  CHECK_EQ(&CopyDevicePlanFor(0), &kCopyDevicePlans[0]);
}

void TestStaticLayout() {
  // 1 MiB on 132 SMs: chunks shrink to 2 KiB so every SM gets a full
  // pipeline, 4 per CTA.
  BulkCopyPlan p;
  std::string why;
  CHECK(PlanBulkCopy(kDefaultBulkCopyConfig, kNoCounterSlot, kMiB, Addr(0x100000), 132, 0, &p,
                     &why));
  CHECK_EQ(p.head, int64_t{0});
  CHECK_EQ(p.body, static_cast<int64_t>(kMiB));
  CHECK_EQ(p.chunk, 2048u);
  CHECK_EQ(p.chunks_per_cta, int64_t{4});
  CHECK_EQ(p.blocks, int64_t{128});
  CHECK_EQ(p.smem, std::size_t{4 * 2048});
  CHECK(!p.one_chunk);
  // Large copies keep the configured chunk; one round per CTA.
  CHECK(PlanBulkCopy(kDefaultBulkCopyConfig, kNoCounterSlot, 1024 * kMiB, Addr(0x100000), 132,
                     0, &p, &why));
  CHECK_EQ(p.chunk, 32768u);
  CHECK_EQ(p.chunks_per_cta, int64_t{4});
  CHECK_EQ(p.blocks, int64_t{8192});
  // An unaligned start: the head reaches the next 16-B boundary, the tail
  // is what is left below a whole 16 B.
  CHECK(PlanBulkCopy(kDefaultBulkCopyConfig, kNoCounterSlot, 100, Addr(0x100003), 132, 0, &p,
                     &why));
  CHECK_EQ(p.head, int64_t{13});
  CHECK_EQ(p.body, int64_t{80});
  CHECK_EQ(p.chunk, 1024u);
  CHECK_EQ(p.blocks, int64_t{1});
  // Tiny copies have no body at all.
  CHECK(PlanBulkCopy(kDefaultBulkCopyConfig, kNoCounterSlot, 5, Addr(0x100003), 132, 0, &p, &why));
  CHECK_EQ(p.head, int64_t{5});
  CHECK_EQ(p.body, int64_t{0});
  CHECK(!p.one_chunk);  // nothing for the bulk engine
  // Past the grid limit.
  CHECK(!PlanBulkCopy({1024, 2, 1}, kNoCounterSlot, std::size_t{1} << 50, Addr(0x100000), 132, 0,
                      &p, &why));
  CHECK_EQ(why, "the copy of 1125899906842624 B needs 1099511627776 CTAs, over the grid limit");
}

void TestOneChunkPlans() {
  // Up to one chunk an SM, each CTA copies one chunk alone (BulkChunkKernel):
  // 8 KiB in eight CTAs of 1 KiB, 132 KiB in 132; the pipeline's shared
  // memory stays in `smem` for the exchanges' launchers.
  BulkCopyPlan p;
  std::string why;
  CHECK(PlanBulkCopy(kDefaultBulkCopyConfig, kNoCounterSlot, 8192, Addr(0x100000), 132, 0, &p,
                     &why));
  CHECK(p.one_chunk);
  CHECK_EQ(p.chunk, 1024u);
  CHECK_EQ(p.blocks, int64_t{8});
  CHECK_EQ(p.smem, std::size_t{4 * 1024});
  CHECK(PlanBulkCopy(kDefaultBulkCopyConfig, kNoCounterSlot, 132 * 1024, Addr(0x100000), 132, 0,
                     &p, &why));
  CHECK(p.one_chunk);
  CHECK_EQ(p.blocks, int64_t{132});
  // One chunk more than SMs: two chunks for some CTAs, the pipeline.
  CHECK(PlanBulkCopy(kDefaultBulkCopyConfig, kNoCounterSlot, 133 * 1024, Addr(0x100000), 132, 0,
                     &p, &why));
  CHECK(!p.one_chunk);
  CHECK_EQ(p.chunks_per_cta, int64_t{2});
  // A shape of one chunk a CTA at any size: one-chunk plans up to 48-KiB
  // chunks, the pipeline above (its shared memory needs the opt-in).
  CHECK(PlanBulkCopy({32768, 2, 1}, kNoCounterSlot, 1024 * kMiB, Addr(0x100000), 132, 0, &p,
                     &why));
  CHECK(p.one_chunk);
  CHECK_EQ(p.blocks, int64_t{32768});
  CHECK(PlanBulkCopy({65536, 2, 1}, kNoCounterSlot, 1024 * kMiB, Addr(0x100000), 132, 0, &p,
                     &why));
  CHECK(!p.one_chunk);
  CHECK_EQ(p.chunk, 65536u);
  // The dynamic schedule never.
  CHECK(PlanBulkCopy({1024, 2, 1, true}, 3, 8192, Addr(0x100000), 132, 1, &p, &why));
  CHECK(!p.one_chunk);
}

void TestDynamicLayout() {
  // One CTA per free slot (132 SMs x 3 resident), whatever the size.
  BulkCopyPlan p;
  std::string why;
  CHECK(PlanBulkCopy(kCopyDevicePlans[0].dynamic, 7, 1024 * kMiB, Addr(0x100000), 132, 3, &p, &why));
  CHECK_EQ(p.chunk, kCopyDevicePlans[0].dynamic.chunk_bytes);
  CHECK_EQ(p.chunks_per_cta, kCopyDevicePlans[0].dynamic.chunks_per_cta);
  CHECK_EQ(p.blocks, int64_t{132 * 3});
  CHECK_EQ(p.smem, std::size_t{16 * 8192});
  // Fewer chunks than slots: one static round covers them.
  CHECK(PlanBulkCopy(kCopyDevicePlans[0].dynamic, 7, 64 * 8192, Addr(0x100000), 132, 3, &p, &why));
  CHECK_EQ(p.blocks, int64_t{16});
  CHECK(!PlanBulkCopy(kCopyDevicePlans[0].dynamic, kNoCounterSlot, kMiB, Addr(0x100000), 132, 3, &p,
                      &why));
  CHECK_EQ(why, "the dynamic schedule needs a counter slot in [0, 1024), got -1");
}

void TestSlotPool() {
  // Every slot but the raw hook's can be taken once; then none is left
  // until one is released.
  std::vector<int> taken;
  for (int slot = AcquireBulkCounterSlot(); slot != kNoCounterSlot;
       slot = AcquireBulkCounterSlot()) {
    CHECK(slot != kRawCounterSlot);
    taken.push_back(slot);
  }
  CHECK_EQ(static_cast<int>(taken.size()), kBulkCounterSlots - 1);
  ReleaseBulkCounterSlot(taken.back());
  CHECK_EQ(AcquireBulkCounterSlot(), taken.back());
  CHECK_EQ(AcquireBulkCounterSlot(), kNoCounterSlot);
  ReleaseBulkCounterSlot(kRawCounterSlot);  // never handed out: ignored
  CHECK_EQ(AcquireBulkCounterSlot(), kNoCounterSlot);
  for (int slot : taken) ReleaseBulkCounterSlot(slot);
}

}  // namespace
}  // namespace jax_tma

int main() {
  jax_tma::TestKernelChoice();
  jax_tma::TestConfigChoice();
  jax_tma::TestDevicePlans();
  jax_tma::TestConfigRules();
  jax_tma::TestStaticLayout();
  jax_tma::TestOneChunkPlans();
  jax_tma::TestDynamicLayout();
  jax_tma::TestSlotPool();
  return jax_tma::testing::Failures("test_copy_plan");
}
