// The CUDA side of the exchanges on the peer transport that run every step
// at once (jax_tma.all_to_all, jax_tma.ragged_all_to_all): each lowered
// exchange of an executable keeps, per step, ppermute's participants
// (PeerSites), set up by the step's first call on each device, and per call
// hands PeerScatter (peer_copy.h) its legs.
#ifndef JAX_TMA_FFI_PPERMUTE_EXCHANGE_SITES_H_
#define JAX_TMA_FFI_PPERMUTE_EXCHANGE_SITES_H_

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "peer/peer_copy.h"
#include "ppermute/all_to_all.h"
#include "ppermute/ragged_all_to_all.h"
#include "ppermute/ppermute_launch.h"

namespace jax_tma {

// One lowered exchange of an executable (its FFI instantiate state), freed
// with the executable as PeerSites are.
class ExchangeSites {
 public:
  static ffi::TypeId id;
  ExchangeSites() = default;
  ~ExchangeSites();
  ExchangeSites(const ExchangeSites&) = delete;
  ExchangeSites& operator=(const ExchangeSites&) = delete;
  // The participants of step k (1 .. parts - 1).
  PeerSites* Step(int k);
  // The wait under which this participant (`group`'s, on `device`) reports
  // a ragged exchange's broken sizes, registered at its first call.
  ffi::Error Check(const ExchangeGroup& group, int device, PeerWait* check);

  // This participant's inbox (PeerInboxExchange) on `device`, and per step
  // its destination's slots for this participant, in this address space.
  struct Inbox {
    void* base = nullptr;
    std::vector<uint8_t*> partner_slots;  // by step - 1
  };
  // The inbox of `group`'s participant on `device` for slots of `payload`
  // bytes (calls of `bytes`), set up (and its slots traded with every step's
  // source and destination) by its first call.
  ffi::Error GetInbox(const ExchangeGroup& group, int device, std::size_t bytes,
                      int64_t payload, const Inbox** inbox);

 private:
  std::mutex mu_;
  std::map<int, std::unique_ptr<PeerSites>> steps_;
  std::map<int, PeerWait> checks_;  // by device
  std::map<int, Inbox> inboxes_;    // by device
};

// This device's part of one exchange of `group`: step k (1-based) is the
// shift route group.steps[k - 1], meeting at group.StepPlan(k); every
// participant pushes into its destination at every step. Fills `legs` with
// each step's mailboxes and waits, and publishes `output` (and
// `recv_sizes`, if any) to each step's source. `bytes` is what every
// participant's call moves (checked equal at the first meeting).
ffi::Error ExchangeLegs(ExchangeSites* sites, Method method, std::size_t bytes,
                        const ExchangeGroup& group, int device, const void* output,
                        const void* recv_sizes, PeerLegs* legs);

// As ExchangeLegs, for PeerInboxExchange: each step's mailboxes and wait,
// and the slots of this participant's inbox and of its destination's, of
// `payload` bytes (PeerInboxPayload; `bytes` per call).
ffi::Error ExchangeInboxLegs(ExchangeSites* sites, Method method, std::size_t bytes,
                             const ExchangeGroup& group, int device, int64_t payload,
                             PeerInboxLegs* legs);

// The slices of a decoded ragged exchange for PeerScatter and
// PeerInboxExchange: `call`'s operand (src), result (local), group and
// index arrays, a row of row_bytes.
PeerSlices RaggedPeerSlices(const RaggedAllToAllCall& call);

// The copy kernel of `method` on a device (`info`): the bulk pipeline for
// kTma and, where the device has TMA, kAuto; an error for kTma without it.
ffi::Error ExchangeUsesTma(std::string_view op, Method method, const DeviceInfo& info,
                           int device, bool* tma);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PPERMUTE_EXCHANGE_SITES_H_
