// Who takes part in one call on the peer transport and which partners this
// device has in it: the route that the host rendezvous (peer_rendezvous.h),
// the cross-process exchange (peer_exchange.h) and the device-side mailboxes
// (peer_copy.h) follow. A family decodes and checks its own call into one.
#ifndef JAX_TMA_FFI_PEER_PEER_ROUTE_H_
#define JAX_TMA_FFI_PEER_PEER_ROUTE_H_

#include <cstdint>
#include <string_view>
#include <vector>

namespace jax_tma {

// The op that the transport's errors name. jax_tma.ppermute is its one user so
// far; the next family on the transport makes this the caller's name.
inline constexpr std::string_view kPeerOp = "jax_tma.ppermute";

// One device's part in a permutation over `size` participants (logical ids
// 0..size-1, the order of the mesh's devices).
struct PermuteRoute {
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

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PEER_PEER_ROUTE_H_
