// The block exchange of a call whose devices live in several processes of
// one host (jax_tma.ppermute's on the CPU, and the first call of its GPU path,
// which trades mailboxes and addresses): every participant sends its block to
// its destination's process over the process link (peer_link.h) and receives
// its source's block the same way. The k-th call of a participant at a call
// site meets the k-th call of its peers there; a block carries a digest of
// the permutation and its size, so a peer that makes another call fails both
// sides instead of mixing blocks. After a failure (a timeout, a peer gone, a
// mismatch) the call site refuses every later call in this process: its
// processes are out of step there.
#ifndef JAX_TMA_FFI_PEER_PEER_EXCHANGE_H_
#define JAX_TMA_FFI_PEER_PEER_EXCHANGE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common.h"
#include "peer/peer_link.h"
#include "peer/peer_route.h"

namespace jax_tma {

// Where each participant lives: its process (by logical id), every process's
// link name (by process index), this call site, and how long to wait.
struct ProcessPlan {
  int process = -1;                // this process's index
  std::vector<int64_t> processes;  // process of each logical id
  std::vector<std::string> links;  // link name of each process index
  std::string site;
  std::chrono::milliseconds timeout{0};
  // The op its errors name.
  std::string op{kPeerOp};
  // Where set (an exchange's steps: its call site), a failure is told under
  // this key, not the meeting's own: every later wait of the processes at
  // any meeting under it fails at once with the reason, as the processes
  // are out of step there. Empty: under the meeting's site and call.
  std::string abort_site;

  bool spans_processes() const;
  LinkPeer peer(int logical) const;
};

// Checks the attributes Python passes and fills `out`; `links` holds the
// link names of the processes, one per line.
ffi::Error DecodeProcessPlan(int64_t process, ffi::Span<const int64_t> processes,
                             std::string_view links, std::string_view site, int64_t timeout_ms,
                             size_t participants, ProcessPlan* out);

// "device D of process P" for the participant with logical id `logical`.
std::string Describe(const PermuteRoute& route, const ProcessPlan& where, int logical);

// Makes the payload for logical id `to`; `abort_key` is the meeting's, under
// which its waits learn that a participant failed.
using PayloadFor =
    std::function<ffi::Error(int to, const std::string& abort_key, std::string* payload)>;

// One meeting of this participant with others at its call site, in or across
// processes: sends a payload (`payload_for`) to each logical id of `sends`
// and receives one of `payload_bytes` from each logical id of `receives`
// into `got`, in order. Each message carries a digest of the permutation and
// `bytes` (the call's block size), so a participant that makes another call
// fails both sides. `what` names a payload in errors ("the block"). A
// failure, making a payload included, is told to every participant.
ffi::Error ExchangeAtSite(const PermuteRoute& route, const ProcessPlan& where, size_t bytes,
                          const std::vector<int>& sends, const PayloadFor& payload_for,
                          const std::vector<int>& receives, size_t payload_bytes,
                          std::string_view what, std::vector<std::string>* got);

// This participant's whole call: send `bytes` of `src` to the destination's
// process (if any), then receive the source's block into `dst` (zeros where
// there is no source).
ffi::Error ExchangeAcrossProcesses(const PermuteRoute& route, const ProcessPlan& where,
                                   const void* src, void* dst, size_t bytes);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PEER_PEER_EXCHANGE_H_
