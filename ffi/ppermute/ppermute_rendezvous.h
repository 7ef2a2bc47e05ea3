// The host-side meeting point of the devices taking part in one
// jax_tma.ppermute. Each device's handler (CPU or CUDA, one host thread per
// device) publishes one of its buffers, learns its partner's, copies between
// them, and before returning waits until the device that touches its own
// buffer has finished, so that buffer is never reused under a peer's copy.
//   pull: a device publishes its input and reads its source's input.
//   push: a device publishes its output and writes into its destination's.
#ifndef JAX_TMA_FFI_PPERMUTE_PPERMUTE_RENDEZVOUS_H_
#define JAX_TMA_FFI_PPERMUTE_PPERMUTE_RENDEZVOUS_H_

#include <chrono>
#include <cstdint>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

#include "common.h"
#include "ppermute/ppermute_processes.h"

namespace jax_tma {

inline constexpr std::string_view kPpermuteOp = "jax_tma.ppermute";

// One device's part in a permutation over `size` participants (logical ids
// 0..size-1, the order of the mesh's devices).
struct PermutePlan {
  int size = 0;
  int self = -1;         // this device's logical id
  int source = -1;       // whose block this device receives; -1: nobody's (zeros)
  int destination = -1;  // who receives this device's block; -1: nobody
  bool push = false;
  std::vector<int64_t> devices;  // device ordinal of each logical id (in its process)
  std::vector<int64_t> sources;  // whose block each logical id receives; -1: nobody's

  // The participant whose published buffer this device copies from (pull:
  // its source's input) or into (push: its destination's output); -1: none.
  int partner() const { return push ? destination : source; }
  // The participant that copies from or into this device's published buffer.
  int partnered_by() const { return push ? source : destination; }
};

// The context, operands and attributes of "jax_tma_ppermute" after the
// platform's own context (the stream on CUDA, none on the CPU).
template <typename Binding>
auto BindPpermuteCall(Binding binding) {
  return std::move(binding).template Ctx<ffi::DeviceOrdinal>()  // device
      .template Ctx<ffi::RunId>()                               // run
      .template Arg<ffi::AnyBuffer>()                           // x
      .template Ret<ffi::AnyBuffer>()                           // y
      .template Attr<int64_t>("instance")                       // instance
      .template Attr<ffi::Span<const int64_t>>("devices")       // devices
      .template Attr<ffi::Span<const int64_t>>("sources")       // sources
      .template Attr<bool>("push")                              // push
      .template Attr<std::string_view>("method")                // method
      .template Attr<int64_t>("process")                        // process
      .template Attr<ffi::Span<const int64_t>>("processes")     // processes
      .template Attr<std::string_view>("links")                 // links
      .template Attr<std::string_view>("site")                  // site
      .template Attr<int64_t>("timeout_ms");                    // timeout_ms
}

// Checks the attributes Python passes (device ordinals and processes by
// logical id, and per logical id the logical id it receives from or -1) and
// finds the part of `device` of process `process`.
ffi::Error PlanPermute(int device, int process, ffi::Span<const int64_t> devices,
                       ffi::Span<const int64_t> processes, ffi::Span<const int64_t> sources,
                       bool push, PermutePlan* plan);

// A call of "jax_tma_ppermute", re-validated: the method, the bytes to move,
// this device's part and where the participants live.
struct PpermuteCall {
  CopyMethod method = CopyMethod::kAuto;
  ByteCopy bytes;
  PermutePlan plan;
  ProcessPlan where;
};

inline ffi::Error DecodePpermute(int device, const ffi::AnyBuffer& x,
                                 ffi::Result<ffi::AnyBuffer>& y,
                                 ffi::Span<const int64_t> devices,
                                 ffi::Span<const int64_t> sources, bool push,
                                 std::string_view method, int64_t process,
                                 ffi::Span<const int64_t> processes, std::string_view links,
                                 std::string_view site, int64_t timeout_ms,
                                 PpermuteCall* call) {
  JAX_TMA_RETURN_IF_FAILED(ParseCopyMethodAttr(kPpermuteOp, method, &call->method));
  JAX_TMA_RETURN_IF_FAILED(CheckWholeCopy(kPpermuteOp, x, y, &call->bytes));
  if (process < 0 || process > std::numeric_limits<int>::max()) {
    return InvalidArgument(kPpermuteOp, "process must be in [0, ",
                           std::numeric_limits<int>::max(), "], got ", process);
  }
  JAX_TMA_RETURN_IF_FAILED(PlanPermute(device, static_cast<int>(process), devices, processes,
                                       sources, push, &call->plan));
  return DecodeProcessPlan(process, processes, links, site, timeout_ms, devices.size(),
                           &call->where);
}

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
  ffi::Error Arrive(int64_t instance, const PermutePlan& plan,
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
  const PermutePlan* plan_ = nullptr;
  std::chrono::milliseconds timeout_{0};
  int64_t generation_ = 0;
};

// One participant's whole call: meet, `copy(partner_block or nullptr)`,
// depart, then `release(partnered_by_done or nullptr)` (order the reuse of
// this device's buffer after the peer's copy). A failure anywhere aborts
// the meeting so no peer waits on this device.
template <typename Copy, typename Release>
ffi::Error ExchangeBlocks(int64_t instance, const PermutePlan& plan,
                          std::chrono::milliseconds timeout, const PermuteBlock& own, Copy copy,
                          Release release) {
  PermuteMeeting meeting;
  PermuteBlock partner;
  void* partnered_by_done = nullptr;
  ffi::Error err = meeting.Arrive(instance, plan, timeout, own, &partner);
  if (err.success()) err = copy(plan.partner() >= 0 ? &partner : nullptr);
  if (err.success()) err = meeting.Depart(&partnered_by_done);
  if (err.success()) err = release(plan.partnered_by() >= 0 ? partnered_by_done : nullptr);
  if (err.failure()) meeting.Abort(err.message());
  return err;
}

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PPERMUTE_PPERMUTE_RENDEZVOUS_H_
