// The link between the processes of one host that take part in a
// collective across processes (jax_tma.ppermute). Each process listens on an abstract Unix
// socket whose name the others learn through jax.distributed's key-value
// store (jax_tma/_ppermute.py); a message carries a key, bytes and, where a
// transport needs one, a file descriptor (SCM_RIGHTS works between any two
// processes of one user, where pidfd_getfd needs ptrace rights).
//
// Only the job's own processes get in. Abstract sockets have no file
// permissions and their names are listed in /proc/net/unix, so the link
// checks who is at the other end (SO_PEERCRED) before it reads or sends a
// byte: a connection in must come from this process's uid and from the pid
// that the process it claims to be published beside its name (KnowLinkPeer),
// and a connection out must reach that pid. A refused connection is closed
// and changes nothing but the refusal records (TakeLinkRefusals), which
// Python logs; so is one whose messages break the wire format.
//
// Waits are bounded. A peer whose connection closes (it exited or was
// killed), or that no longer listens, is gone, and every wait on it fails at
// once; a peer that fails a call sends an abort under that call's key, and
// the waits on it fail with its reason. Errors name the peer process and
// what was waited for.
#ifndef JAX_TMA_FFI_PEER_PEER_LINK_H_
#define JAX_TMA_FFI_PEER_PEER_LINK_H_

#include <sys/types.h>

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

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
// a no-op, with another one an error). A connection whose pid no process has
// been published with yet waits, unread, for KnowLinkPeer up to the longest
// `timeout` given here (a peer that waits longer has failed its call anyway).
ffi::Error ListenLink(const LinkPeer& self, std::chrono::milliseconds timeout);

// Tells the link who process `peer.process` is: the name it listens under
// and its pid, as it published them. Fails for a pid that no process can
// have, and where that process is known otherwise (the key-value store
// gives each process one entry).
ffi::Error KnowLinkPeer(const LinkPeer& peer, long long pid);

// Process `process` as KnowLinkPeer told it (an empty name where it did not).
LinkPeer KnownLinkPeer(int process);

// This process as the others reach it (an empty name before ListenLink).
LinkPeer LinkSelf();

// Sends `bytes` (and `fd` unless -1, which stays the caller's) under `key`
// to `to`, which may be this process (bytes only). The first message to a
// peer connects to its name and checks that its published pid listens there.
ffi::Error SendLink(const LinkPeer& to, std::string_view key, std::string_view bytes,
                    int fd = -1);

// Waits up to `timeout` for the bytes of message `key` from `from`. Fails
// with kDeadlineExceeded when none came, kUnavailable when `from` is gone,
// kAborted when any process sent an abort under `abort_key`. `what`
// describes the awaited message for the error text.
ffi::Error ReceiveLink(const LinkPeer& from, std::string_view key, std::string_view abort_key,
                       std::string_view what, std::chrono::milliseconds timeout,
                       std::string* out);

// Handles a message as it arrives, on the link's reader thread, instead of
// filing it: returns true if it took the message (and its descriptor).
// Descriptors reach this handler only: a message that it does not take is
// filed as bytes, and one of those that came with a descriptor breaks the
// wire format (its connection is closed).
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

// An eventfd that becomes readable when the link has refused a connection,
// closed one that broke the wire format, or found an impostor at a peer's
// name; TakeLinkRefusals returns what happened, one line each (with the
// other side's pid and uid), oldest first. Python logs them (_ppermute.py).
int LinkRefusalSignal();
std::vector<std::string> TakeLinkRefusals();

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PEER_PEER_LINK_H_
