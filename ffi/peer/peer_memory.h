// The host side of the peer transport's device side (peer_copy.h): the
// memory that participants in other processes must reach, and what the
// kernels' bounded waits read and write.
//
// - Mailboxes live in VMM allocations of this process made exportable
//   (POSIX file descriptors), one slab per device, carved in PeerMailbox
//   slots; every local device may access them.
// - An address on this process's GPU is handed to another process as an
//   address in that process's space: the VMM allocation holding it (XLA's
//   buffers live in a few large ones) is exported once per process, its
//   descriptor passed over the process link (peer_link.h, SCM_RIGHTS), and
//   the other process's link thread maps it and answers with where. Later
//   addresses in the same allocation are translated without a meeting.
// - Per process index, a host-mapped word that the link's thread sets when
//   that process is gone; a waiting kernel polls it.
// - One host-mapped PeerFault per process and a thread that reports it on
//   stderr, with the call site and peer that a kernel waited for.
#ifndef JAX_TMA_FFI_PEER_PEER_MEMORY_H_
#define JAX_TMA_FFI_PEER_PEER_MEMORY_H_

#include <chrono>
#include <string>

#include "common.h"
#include "peer/peer_copy.h"
#include "peer/peer_link.h"

namespace jax_tma {

// Lets the process link map the allocations other processes offer and tell
// the waits of a process that is gone; called as the link starts listening,
// before any peer knows its name.
void InstallPeerLinkHandlers();

// A zeroed mailbox on `device`, until ReleasePeerMailbox: one the kernels of
// its last user no longer touch (its executable is freed, which XLA does
// once the last execution is done on the device) is reused, else a slot of
// a mapped slab.
ffi::Error NewPeerMailbox(int device, PeerMailbox** box);
void ReleasePeerMailbox(int device, PeerMailbox* box);

// An inbox of at least `bytes` on `device` (peer_copy.h's
// PeerInboxExchange) that every local device and, through AddressIn, other
// processes may reach, until ReleasePeerInbox; as with mailboxes, a released
// one is reused, so other processes map it once. Its first `bytes` are
// zero, a reused one's too: a slot in the low-latency form holds its own
// flags, and a unit of an earlier user's must not pass for a new call's.
ffi::Error NewPeerInbox(int device, size_t bytes, void** inbox);
void ReleasePeerInbox(int device, void* inbox);

// `ptr` (memory of this process on `device`) as an address in the space of
// process `to`: `ptr` itself for this process (`to.name` empty); else its
// VMM allocation is exported to `to` on first use, waiting up to `timeout`
// for the mapping there (or for an abort under `abort_key`).
ffi::Error AddressIn(const LinkPeer& to, int device, const void* ptr,
                     std::chrono::milliseconds timeout, const std::string& abort_key,
                     unsigned long long* out);

// The word a waiting kernel polls to learn that process `process` is gone.
ffi::Error PeerGoneWord(int process, const volatile unsigned int** word);

// This process's fault record (its reporting thread starts with it), and an
// id for a participant's waits: `op` the op its faults name, `site`
// describes the participant ("at FILE:LINE, device 0 of process 1"),
// `publisher` and `copier` the participants it waits for to publish and to
// finish copying, `timeout` its bound.
ffi::Error ThePeerFault(PeerFault** fault);
unsigned long long RegisterPeerWaits(std::string op, std::string site, std::string publisher,
                                     std::string copier, std::chrono::milliseconds timeout);
void UnregisterPeerWaits(unsigned long long id);

// What this process holds for the transport, for tests that look for
// leaks: participants set up (registered waits), mailboxes and inboxes in
// use, VA reservations (mailbox slabs, inboxes and mapped allocations of
// other processes), allocations of other processes mapped here and of this
// one mapped by others.
struct PeerResources {
  long long sites = 0;
  long long mailboxes = 0;
  long long inboxes = 0;
  long long reservations = 0;
  long long imported = 0;
  long long exported = 0;
};
PeerResources CountPeerResources();

// The fault a kernel of this process recorded, as an error; success if none.
ffi::Error RecordedPeerFault();

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PEER_PEER_MEMORY_H_
