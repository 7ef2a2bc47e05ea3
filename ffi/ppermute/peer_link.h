// The link between the processes of one host that take part in a
// jax_tma.ppermute across processes. Each process listens on an abstract Unix
// socket whose name the others learn through jax.distributed's key-value
// store (jax_tma/_ppermute.py); a message carries a key, bytes and, where a
// transport needs one, a file descriptor (SCM_RIGHTS works between any two
// processes of one user, where pidfd_getfd needs ptrace rights).
//
// Waits are bounded. A peer whose connection closes (it exited or was
// killed), or that no longer listens, is gone, and every wait on it fails at
// once; a peer that fails a call sends an abort under that call's key, and
// the waits on it fail with its reason. Errors name the peer process and
// what was waited for.
#ifndef JAX_TMA_FFI_PPERMUTE_PEER_LINK_H_
#define JAX_TMA_FFI_PPERMUTE_PEER_LINK_H_

#include <chrono>
#include <string>
#include <string_view>

#include "common.h"

namespace jax_tma {

// A process of the link: its index (jax.process_index()) and the abstract
// socket name it listens under; an empty name is this process itself, whose
// messages to itself stay in its inbox (no socket, no listening needed).
struct LinkPeer {
  int process = -1;
  std::string_view name;
};

struct LinkMessage {
  std::string bytes;
  int fd = -1;  // received descriptor, owned by the receiver; -1: none
};

// Starts listening as `self` (once per process; again with the same peer is
// a no-op, with another one an error).
ffi::Error ListenLink(const LinkPeer& self);

// This process as the others reach it (an empty name before ListenLink).
LinkPeer LinkSelf();

// Sends `bytes` (and `fd` unless -1, which stays the caller's) under `key`
// to `to`, which may be this process.
ffi::Error SendLink(const LinkPeer& to, std::string_view key, std::string_view bytes,
                    int fd = -1);

// Waits up to `timeout` for the message `key` from `from`. Fails with
// kDeadlineExceeded when none came, kUnavailable when `from` is gone,
// kAborted when any process sent an abort under `abort_key`. `what`
// describes the awaited message for the error text.
ffi::Error ReceiveLink(const LinkPeer& from, std::string_view key, std::string_view abort_key,
                       std::string_view what, std::chrono::milliseconds timeout,
                       LinkMessage* out);

// Handles a message as it arrives, on the link's reader thread, instead of
// filing it: returns true if it took the message (and its descriptor).
using LinkHandler = bool (*)(int sender, const std::string& key, LinkMessage* message);
// Called on the link's reader thread when process `process` is gone.
using LinkGoneHandler = void (*)(int process);
// Sets the handlers (one each per process; null: none).
void SetLinkHandlers(LinkHandler on_message, LinkGoneHandler on_gone);

// Tells `to` that the work under `abort_key` failed here (`why`): its
// ReceiveLink calls with that abort key fail with the reason instead of
// waiting. Best effort: a peer that is gone is not waited for.
void AbortLink(const LinkPeer& to, std::string_view abort_key, std::string_view why);

// The reason a process sent under `abort_key` ("process <p>: <why>"), or an
// empty string where none came (yet).
std::string LinkAbortReason(std::string_view abort_key);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PPERMUTE_PEER_LINK_H_
