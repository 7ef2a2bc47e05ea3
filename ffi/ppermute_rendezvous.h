// The host-side meeting point of the devices taking part in one
// jax_tma.ppermute. Each device's handler (CPU or CUDA, one host thread per
// device) publishes where its block lives, learns where its source's block
// lives, and before returning waits until every device reading its block has
// finished reading, so the block's buffer is never reused under a reader.
#ifndef JAX_TMA_FFI_PPERMUTE_RENDEZVOUS_H_
#define JAX_TMA_FFI_PPERMUTE_RENDEZVOUS_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "common.h"

namespace jax_tma {

inline constexpr std::string_view kPpermuteOp = "jax_tma.ppermute";

// One device's part in a permutation over `size` participants (logical ids
// 0..size-1, the order of the mesh's devices).
struct PermutePlan {
  int size = 0;
  int self = -1;               // this device's logical id
  int source = -1;             // the logical id whose block this device receives; -1: none (zeros)
  std::vector<int> readers;    // logical ids that receive this device's block
  std::vector<int64_t> devices;  // device ordinal of each logical id
};

// Checks the attributes Python passes (device ordinals by logical id, and per
// logical id the logical id it receives from or -1) and finds `device`'s part.
ffi::Error PlanPermute(int device, ffi::Span<const int64_t> devices,
                       ffi::Span<const int64_t> sources, PermutePlan* plan);

// What a participant publishes for one call. `ready` and `done` are opaque
// tokens for the caller's own ordering (CUDA events on GPU, unused on CPU):
// `ready` is complete once the block may be read, `done` once this
// participant finished reading its source's block.
struct PermuteBlock {
  int64_t run_id = 0;  // XLA's id of the execution (shared by its devices)
  const void* data = nullptr;
  void* ready = nullptr;
  void* done = nullptr;
};

// One call of one lowered ppermute (identified by `instance`) as seen by one
// participant. Calls are matched by generation: the k-th call of an instance
// on one device meets the k-th call on every other device; the run ids must
// agree, so executions that reached two devices in different orders fail
// loudly instead of exchanging the wrong blocks.
class PermuteMeeting {
 public:
  // Publishes this device's block and waits until the source (if any) has
  // published the block of the same generation; `source_block` receives it.
  ffi::Error Arrive(int64_t instance, const PermutePlan& plan,
                    const PermuteBlock& own, PermuteBlock* source_block);
  // Says this device finished reading (its `done` token is complete or
  // enqueued) and waits until every reader of this device's block has said
  // the same; `reader_done` receives their `done` tokens.
  ffi::Error Depart(std::vector<void*>* reader_done);
  // Tells every participant still waiting on this call that this device
  // failed, so they return an error instead of waiting for it.
  void Abort(std::string_view why);

  struct State;

 private:
  State* state_ = nullptr;
  const PermutePlan* plan_ = nullptr;
  int64_t generation_ = 0;
};

// One participant's whole call: meet, `receive(source_block or nullptr)`
// (move the source's block into the output, or zero it), depart, then
// `release(reader_done)` (order the reuse of this device's block after its
// readers). A failure anywhere aborts the meeting so no peer waits on it.
template <typename Receive, typename Release>
ffi::Error ExchangeBlocks(int64_t instance, const PermutePlan& plan,
                          const PermuteBlock& own, Receive receive, Release release) {
  PermuteMeeting meeting;
  PermuteBlock source;
  std::vector<void*> reader_done;
  ffi::Error err = meeting.Arrive(instance, plan, own, &source);
  if (err.success()) err = receive(plan.source >= 0 ? &source : nullptr);
  if (err.success()) err = meeting.Depart(&reader_done);
  if (err.success()) err = release(reader_done);
  if (err.failure()) meeting.Abort(err.message());
  return err;
}

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PPERMUTE_RENDEZVOUS_H_
