// The call of jax_tma.all_to_all, decoded and re-validated once from the FFI
// buffers and attributes, then shared by the CPU and CUDA handlers. The
// operand and the result are in the exchange's canonical layout: `parts`
// chunks of equal size one after another, chunk j of the operand for the
// participant at position j of this one's group, chunk i of the result from
// the one at position i (Python moves the split and concat dims there).
// The exchange is `parts` - 1 steps of ppermute's transport, each a
// permutation in which every participant pushes one chunk straight into its
// destination's result; the chunk that stays is copied locally. The group
// and its steps (ExchangeGroup) are ragged_all_to_all's too.
#ifndef JAX_TMA_FFI_PPERMUTE_ALL_TO_ALL_H_
#define JAX_TMA_FFI_PPERMUTE_ALL_TO_ALL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common.h"
#include "ppermute/ppermute_common.h"

namespace jax_tma {

// Exchanges of at most this many bytes per participant (the operand) take
// the peer transport's inbox (PeerInboxExchange, ffi/peer/peer_copy.h: one
// crossing of the link a call); larger ones PeerScatter, which moves every
// byte once. Not swept (benchmarks/TUNING.md). jax_tma/_moe.py reads it
// (exchange_inbox_max_bytes) to keep the combine's small sums on the inbox.
inline constexpr std::size_t kPeerInboxMaxBytes = std::size_t{4} << 20;

inline constexpr std::string_view kAllToAllOp = "jax_tma.all_to_all";

// The context, operands and attributes of "jax_tma_all_to_all" after the
// platform's own context.
template <typename Binding>
auto BindAllToAllCall(Binding binding) {
  return BindPeerCallTail(BindPeerCallHead(std::move(binding))
                              .template Attr<ffi::Span<const int64_t>>("positions")  // positions
                              .template Attr<int64_t>("parts")                        // parts
                              .template Attr<std::string_view>("method"));            // method
}

// The participants of an exchange among the groups of a mesh axis (what
// all_to_all's and ragged_all_to_all's calls share, decoded by
// DecodeExchangeGroup): this participant's group has `parts` positions, and
// the exchange runs in `parts` - 1 steps. Step k (1 .. parts - 1) is
// steps[k - 1]: this participant pushes to the one at position
// (position + k) mod parts and receives from the one at
// (position - k) mod parts.
struct ExchangeGroup {
  int parts = 1;
  int position = 0;  // this participant's position in its group
  std::vector<int64_t> positions;  // the position of each logical id
  std::vector<PermuteRoute> steps;
  ProcessPlan where;
  int self = -1;                 // this participant's logical id
  std::vector<int64_t> devices;  // the device ordinal of each logical id

  // Step k's meetings, apart from those of the other steps; a failure in any
  // step fails the others' waits too.
  ProcessPlan StepPlan(int k) const {
    ProcessPlan plan = where;
    plan.site += "#step" + std::to_string(k);
    plan.abort_site = where.site;
    return plan;
  }
  // "device D of process P (position p)", for errors.
  std::string Describe(int logical) const;
};

// Checks the attributes of an exchange (Python's, ffi/ppermute's transport:
// device ordinals, processes and positions by logical id, one permutation of
// sources a step) and fills `group` for `device` of process `process`; the
// errors name `op`.
ffi::Error DecodeExchangeGroup(std::string_view op, int device,
                               ffi::Span<const int64_t> devices,
                               ffi::Span<const int64_t> sources,
                               ffi::Span<const int64_t> positions, int64_t parts,
                               int64_t process, ffi::Span<const int64_t> processes,
                               std::string_view links, std::string_view site,
                               int64_t timeout_ms, ExchangeGroup* group);

// A call of "jax_tma_all_to_all", re-validated: the group (above) and the
// bytes, `parts` chunks of chunk() bytes each.
struct AllToAllCall : ExchangeGroup {
  Method method = Method::kAuto;
  ByteCopy bytes;  // the whole operand and result

  size_t chunk() const { return bytes.bytes / static_cast<size_t>(parts); }
  // The chunk that stays: from the operand's slot `position` to the result's.
  ByteCopy Local() const { return Slot(position, position); }
  // Step k's copy: this participant's chunk for its destination, and the
  // result's slot of its source's chunk (what it publishes).
  ByteCopy Step(int k) const {
    const PermuteRoute& r = steps[k - 1];
    return Slot(static_cast<int>(positions[r.destination]),
                static_cast<int>(positions[r.source]));
  }

 private:
  ByteCopy Slot(int from, int to) const {
    return ByteCopy{static_cast<const char*>(bytes.src) + from * chunk(),
                    static_cast<char*>(bytes.dst) + to * chunk(), chunk()};
  }
};

ffi::Error DecodeAllToAll(int device, const ffi::AnyBuffer& x, ffi::Result<ffi::AnyBuffer>& y,
                          ffi::Span<const int64_t> devices, ffi::Span<const int64_t> sources,
                          ffi::Span<const int64_t> positions, int64_t parts,
                          std::string_view method, int64_t process,
                          ffi::Span<const int64_t> processes, std::string_view links,
                          std::string_view site, int64_t timeout_ms, AllToAllCall* call);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PPERMUTE_ALL_TO_ALL_H_
