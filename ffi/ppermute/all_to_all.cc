// Decoding of jax_tma.all_to_all's calls (all_to_all.h), and of the exchange
// group that ragged_all_to_all's calls share with them.
#include "ppermute/all_to_all.h"

#include <limits>
#include <string>

namespace jax_tma {
namespace {

// ppermute's checks (the route of a step, where the participants live),
// named as `op`'s.
ffi::Error AsOp(std::string_view op, ffi::Error err) {
  if (err.success() || err.message().rfind(kPpermuteOp, 0) != 0) return err;
  return ffi::Error(*err.errc(),
                    std::string(op) + std::string(err.message().substr(kPpermuteOp.size())));
}

}  // namespace

std::string ExchangeGroup::Describe(int logical) const {
  Message m;
  m << "device " << devices[logical] << " of process " << where.processes[logical]
    << " (position " << positions[logical] << ")";
  return m.str();
}

ffi::Error DecodeExchangeGroup(std::string_view op, int device,
                               ffi::Span<const int64_t> devices,
                               ffi::Span<const int64_t> sources,
                               ffi::Span<const int64_t> positions, int64_t parts,
                               int64_t process, ffi::Span<const int64_t> processes,
                               std::string_view links, std::string_view site,
                               int64_t timeout_ms, ExchangeGroup* group) {
  const auto n = static_cast<int64_t>(devices.size());
  if (parts < 1 || parts > n) {
    return InvalidArgument(op, "parts must be in [1, ", n, "] (the devices), got ", parts);
  }
  if (static_cast<int64_t>(positions.size()) != n) {
    return InvalidArgument(op, "positions has ", positions.size(),
                           " entries; it needs one per device (", n, ")");
  }
  for (int64_t i = 0; i < n; ++i) {
    if (positions[i] < 0 || positions[i] >= parts) {
      return InvalidArgument(op, "positions[", i, "] = ", positions[i],
                             " is not a position in [0, ", parts, ")");
    }
  }
  if (static_cast<int64_t>(sources.size()) != (parts - 1) * n) {
    return InvalidArgument(op, "sources has ", sources.size(),
                           " entries; it needs one per device for each of the ", parts - 1,
                           " steps (", (parts - 1) * n, ")");
  }
  if (process < 0 || process > std::numeric_limits<int>::max()) {
    return InvalidArgument(op, "process must be in [0, ", std::numeric_limits<int>::max(),
                           "], got ", process);
  }
  if (static_cast<int64_t>(processes.size()) != n) {
    return InvalidArgument(op, "processes has ", processes.size(), " entries for ", n,
                           " devices");
  }
  group->parts = static_cast<int>(parts);
  group->positions.assign(positions.begin(), positions.end());
  group->devices.assign(devices.begin(), devices.end());
  group->self = -1;
  for (int64_t i = 0; i < n && group->self < 0; ++i) {
    if (devices[i] == device && processes[i] == process) group->self = static_cast<int>(i);
  }
  if (group->self < 0) {
    return InvalidArgument(op, "device ", device, " of process ", process,
                           " is not among the devices of this call");
  }
  group->position = static_cast<int>(positions[group->self]);
  group->steps.assign(static_cast<size_t>(parts - 1), PermuteRoute{});
  for (int k = 1; k < parts; ++k) {
    PermuteRoute& route = group->steps[k - 1];
    const ffi::Span<const int64_t> step(sources.begin() + (k - 1) * n, static_cast<size_t>(n));
    JAX_TMA_RETURN_IF_FAILED(AsOp(op, RoutePermute(device, static_cast<int>(process), devices,
                                                   processes, step, /*push=*/true, &route)));
    const int64_t me = positions[route.self];
    // Every participant sends and receives at every step, to and from the
    // positions k after and before its own.
    if (route.source < 0 || route.destination < 0 ||
        positions[route.destination] != (me + k) % parts ||
        positions[route.source] != (me - k + parts) % parts) {
      return InvalidArgument(op, "step ", k, " of sources is not the shift by ", k,
                             " of the positions (device ", device, " of process ", process,
                             " at position ", me, ")");
    }
  }
  // One part (a group of one): everything stays, at position 0.
  JAX_TMA_RETURN_IF_FAILED(AsOp(op, DecodeProcessPlan(process, processes, links, site,
                                                     timeout_ms, devices.size(),
                                                     &group->where)));
  group->where.op = std::string(op);
  return ffi::Error::Success();
}

ffi::Error DecodeAllToAll(int device, const ffi::AnyBuffer& x, ffi::Result<ffi::AnyBuffer>& y,
                          ffi::Span<const int64_t> devices, ffi::Span<const int64_t> sources,
                          ffi::Span<const int64_t> positions, int64_t parts,
                          std::string_view method, int64_t process,
                          ffi::Span<const int64_t> processes, std::string_view links,
                          std::string_view site, int64_t timeout_ms, AllToAllCall* call) {
  JAX_TMA_RETURN_IF_FAILED(
      ParseMethod(kAllToAllOp, method, &call->method, TmaSpelling::kTma));
  JAX_TMA_RETURN_IF_FAILED(CheckWholeCopy(kAllToAllOp, x, y, &call->bytes));
  JAX_TMA_RETURN_IF_FAILED(DecodeExchangeGroup(kAllToAllOp, device, devices, sources,
                                               positions, parts, process, processes, links,
                                               site, timeout_ms, call));
  if (call->bytes.bytes % static_cast<size_t>(parts) != 0) {
    return InvalidArgument(kAllToAllOp, "x has ", call->bytes.bytes,
                           " bytes, not a whole number of chunks for ", parts, " parts");
  }
  return ffi::Error::Success();
}

}  // namespace jax_tma
