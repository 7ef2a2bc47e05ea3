// The peer transport's device side (jax_tma.ppermute's, and the next
// collectives'): the participants of a call hand
// each other their buffers and signals through mailboxes in device memory
// that every participant maps (peer access within a process, imported VMM
// allocations across processes: peer_memory.h), so a call needs no host
// meeting and replays from a CUDA graph.
//
// Each participant (device) of a lowered ppermute owns one PeerMailbox. Per
// call, on its own stream, it runs:
//   PeerMeet    calls += 1 (the call's number k); publishes its buffer (push:
//               its output; pull: its input) to the participant that copies
//               from or into it (`partnered_by`): that one's `buffer`, then
//               `ready` = k (release); then, if it has a partner, waits until
//               its own `ready` is k (acquire) and keeps the partner's buffer.
//   PeerCopy    (if it has a partner) copies between its own buffer and the
//               partner's with the TMA bulk pipeline (or SIMT); the last CTA
//               to finish sets the partner's `done` = k (release).
//   PeerFinish  (if partnered) waits until its own `done` is k: nothing later
//               on its stream touches the published buffer too early.
// Calls are matched by number, counted on the device, so a stale signal of
// an earlier call is never taken for a new one, across loop iterations,
// re-executions and graph replays. A participant can be at most one call
// ahead of the one it waits for, so a `ready` past k means the participants
// are out of step.
//
// Waits are bounded: past the timeout, or once the host marks the awaited
// process gone, the kernel writes a PeerFault (host-mapped) and traps, so
// the step fails instead of returning a block that never arrived; the
// fault's description reaches stderr (peer_memory.h).
#ifndef JAX_TMA_FFI_PEER_PEER_COPY_H_
#define JAX_TMA_FFI_PEER_PEER_COPY_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common.h"

namespace jax_tma {

struct alignas(64) PeerMailbox {
  // Written by the partner: the number of the call whose buffer it published
  // and that buffer, in this process's address space.
  unsigned long long ready;
  unsigned long long buffer;
  // Written by the participant that copies this one's buffer: the number of
  // the call whose copy it finished.
  unsigned long long done;
  // This participant's own: calls started; the partner's buffer of the
  // current call (PeerMeet -> PeerCopy); CTAs of the current copy finished.
  unsigned long long calls;
  unsigned long long peer;
  unsigned int ctas;
};

// What a participant waited for when it gave up.
enum class PeerWaitFor : unsigned int { kNone = 0, kPublish = 1, kDone = 2 };
// Why it gave up.
enum class PeerGaveUp : unsigned int { kTimeout = 1, kGone = 2, kOutOfStep = 3 };

// Written once per process by the first wait that gives up (host-mapped).
struct PeerFault {
  unsigned int raised;  // 0 until a fault is written, then 1
  unsigned int wait_for;
  unsigned int gave_up;
  unsigned int pad;
  unsigned long long site;  // the waiting participant's PeerSiteId
  unsigned long long call;
  unsigned long long seen;  // the awaited field's value at that point
};

// How a kernel waits on one other participant.
struct PeerWait {
  unsigned long long timeout_ns = 0;
  const volatile unsigned int* gone = nullptr;  // host-mapped; nonzero: that process is gone
  PeerFault* fault = nullptr;
  unsigned long long site = 0;
};

// PeerMeet. `by_box` (the partnered_by participant's mailbox in this
// address space) and `published` (this participant's buffer in that one's
// address space) are null where nobody copies this participant's buffer;
// `await_partner` is false where it has no partner.
ffi::Error LaunchPeerMeet(PeerMailbox* own, PeerMailbox* by_box, unsigned long long published,
                          bool await_partner, const PeerWait& wait, cudaStream_t stream);

// PeerCopy of `bytes` between `local` (push: the input, read; pull: the
// output, written) and the partner's buffer kept in `own`, with the TMA bulk
// pipeline where `tma` and both addresses are equal modulo 16 B, else SIMT.
// `partner_box` is the partner's mailbox in this address space.
ffi::Error LaunchPeerCopy(PeerMailbox* own, PeerMailbox* partner_box, void* local,
                          std::size_t bytes, bool push, bool tma, cudaStream_t stream,
                          int device);

// PeerFinish.
ffi::Error LaunchPeerFinish(PeerMailbox* own, const PeerWait& wait, cudaStream_t stream);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PEER_PEER_COPY_H_
