// The host-side meeting point of the devices of one process taking part in
// one call on the peer transport (jax_tma.ppermute's CPU handler). Each device's handler (CPU or CUDA, one host thread per
// device) publishes one of its buffers, learns its partner's, copies between
// them, and before returning waits until the device that touches its own
// buffer has finished, so that buffer is never reused under a peer's copy.
//   pull: a device publishes its input and reads its source's input.
//   push: a device publishes its output and writes into its destination's.
#ifndef JAX_TMA_FFI_PEER_PEER_RENDEZVOUS_H_
#define JAX_TMA_FFI_PEER_PEER_RENDEZVOUS_H_

#include <chrono>
#include <cstdint>
#include <string_view>

#include "common.h"
#include "peer/peer_route.h"

namespace jax_tma {

// What a participant publishes for one call. `ready` and `done` are opaque
// tokens for the caller's own ordering (CUDA events on GPU, unused on CPU):
// `ready` is complete once the buffer may be touched (pull: the input is
// written; push: the output's memory is free), `done` once this participant
// finished its own copy.
struct PermuteBlock {
  int64_t run_id = 0;  // XLA's id of the execution (shared by its devices)
  void* data = nullptr;
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
  // Publishes this device's buffer and waits until the partner (if any) has
  // published its buffer of the same generation; `partner_block` receives it.
  ffi::Error Arrive(int64_t instance, const PermuteRoute& route,
                    std::chrono::milliseconds timeout, const PermuteBlock& own,
                    PermuteBlock* partner_block);
  // Says this device finished its copy (its `done` token is complete or
  // enqueued) and waits until the participant touching this device's buffer
  // (if any) has said the same; `partnered_by_done` receives its `done`.
  ffi::Error Depart(void** partnered_by_done);
  // Tells every participant still waiting on this call that this device
  // failed, so they return an error instead of waiting for it.
  void Abort(std::string_view why);

  struct State;

 private:
  State* state_ = nullptr;
  const PermuteRoute* route_ = nullptr;
  std::chrono::milliseconds timeout_{0};
  int64_t generation_ = 0;
};

// One participant's whole call: meet, `copy(partner_block or nullptr)`,
// depart, then `release(partnered_by_done or nullptr)` (order the reuse of
// this device's buffer after the peer's copy). A failure anywhere aborts
// the meeting so no peer waits on this device.
template <typename Copy, typename Release>
ffi::Error ExchangeBlocks(int64_t instance, const PermuteRoute& route,
                          std::chrono::milliseconds timeout, const PermuteBlock& own, Copy copy,
                          Release release) {
  PermuteMeeting meeting;
  PermuteBlock partner;
  void* partnered_by_done = nullptr;
  ffi::Error err = meeting.Arrive(instance, route, timeout, own, &partner);
  if (err.success()) err = copy(route.partner() >= 0 ? &partner : nullptr);
  if (err.success()) err = meeting.Depart(&partnered_by_done);
  if (err.success()) err = release(route.partnered_by() >= 0 ? partnered_by_done : nullptr);
  if (err.failure()) meeting.Abort(err.message());
  return err;
}

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PEER_PEER_RENDEZVOUS_H_
