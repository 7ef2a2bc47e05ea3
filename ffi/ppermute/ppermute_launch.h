// Launcher of jax_tma.ppermute's CUDA path: this device's part of one call,
// the copy between its own buffer and its partner's, in this process (peer
// access) or another one of this host (mapped VMM allocations), with the
// device-side transport of peer_copy.h: no staging buffer, no NCCL, no host
// meeting after the first call of a lowered ppermute on a device. That first
// call exchanges the participants' mailboxes (ExchangeAtSite).
#ifndef JAX_TMA_FFI_PPERMUTE_PPERMUTE_LAUNCH_H_
#define JAX_TMA_FFI_PPERMUTE_PPERMUTE_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <mutex>

#include "peer/peer_copy.h"
#include "peer/peer_memory.h"
#include "ppermute/ppermute_common.h"
#include "ppermute/ppermute_plan.h"

namespace jax_tma {

// A participant of a lowered ppermute on one device, once set up: its own
// mailbox and, in this process's address space, those of its partner and of
// the participant that copies its buffer; and how its kernels wait. Its
// mailbox and waits go back with it.
struct PeerSite {
  explicit PeerSite(int device) : device(device) {}
  ~PeerSite() {
    if (box != nullptr) ReleasePeerMailbox(device, box);
    if (waits != 0) UnregisterPeerWaits(waits);
  }
  PeerSite(const PeerSite&) = delete;
  PeerSite& operator=(const PeerSite&) = delete;
  int device;
  PeerMailbox* box = nullptr;
  PeerMailbox* partner_box = nullptr;
  PeerMailbox* by_box = nullptr;
  unsigned long long waits = 0;  // RegisterPeerWaits's id
  PeerWait wait_partner;         // for the partner's buffer
  PeerWait wait_by;              // for the copy of this participant's buffer
};

// A lowered ppermute of one executable (its FFI instantiate state): the
// participant set up on each device at its first call there. Freed with the
// executable, which XLA keeps until its last execution is done on the
// device (PjRt releases it on the compute stream), so no kernel of this
// site still touches the mailboxes it returns; nor do the peers' kernels,
// whose processes free the same call site's executable in step (SPMD). A
// participant whose setup failed keeps its mailbox.
class PeerSites {
 public:
  static ffi::TypeId id;
  PeerSites();
  ~PeerSites();
  PeerSites(const PeerSites&) = delete;
  PeerSites& operator=(const PeerSites&) = delete;
  // The participant on `device`, set up by its first call.
  ffi::Error Get(const PpermuteCall& call, int device, const PeerSite** out);

 private:
  std::mutex mu_;
  std::map<int, std::unique_ptr<PeerSite>> sites_;
};

// Runs this device's part of `call` as `plan` says on `stream`, with the
// participants of `sites`.
ffi::Error LaunchPpermute(const PpermuteCall& call, const PpermutePlan& plan, PeerSites* sites,
                          cudaStream_t stream, int device);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PPERMUTE_PPERMUTE_LAUNCH_H_
