// Decoding of jax_tma.all_to_all's calls (all_to_all.h).
#include "ppermute/all_to_all.h"

#include <limits>
#include <string>

namespace jax_tma {
namespace {

// ppermute's checks (the route of a step, where the participants live),
// named as all_to_all's.
ffi::Error AsAllToAll(ffi::Error err) {
  if (err.success() || err.message().rfind(kPpermuteOp, 0) != 0) return err;
  return ffi::Error(*err.errc(), std::string(kAllToAllOp) +
                                     std::string(err.message().substr(kPpermuteOp.size())));
}

}  // namespace

ffi::Error DecodeAllToAll(int device, const ffi::AnyBuffer& x, ffi::Result<ffi::AnyBuffer>& y,
                          ffi::Span<const int64_t> devices, ffi::Span<const int64_t> sources,
                          ffi::Span<const int64_t> positions, int64_t parts,
                          std::string_view method, int64_t process,
                          ffi::Span<const int64_t> processes, std::string_view links,
                          std::string_view site, int64_t timeout_ms, AllToAllCall* call) {
  JAX_TMA_RETURN_IF_FAILED(
      ParseMethod(kAllToAllOp, method, &call->method, TmaSpelling::kTma));
  JAX_TMA_RETURN_IF_FAILED(CheckWholeCopy(kAllToAllOp, x, y, &call->bytes));
  const auto n = static_cast<int64_t>(devices.size());
  if (parts < 1 || parts > n) {
    return InvalidArgument(kAllToAllOp, "parts must be in [1, ", n, "] (the devices), got ",
                           parts);
  }
  if (call->bytes.bytes % static_cast<size_t>(parts) != 0) {
    return InvalidArgument(kAllToAllOp, "x has ", call->bytes.bytes,
                           " bytes, not a whole number of chunks for ", parts, " parts");
  }
  if (static_cast<int64_t>(positions.size()) != n) {
    return InvalidArgument(kAllToAllOp, "positions has ", positions.size(),
                           " entries; it needs one per device (", n, ")");
  }
  for (int64_t i = 0; i < n; ++i) {
    if (positions[i] < 0 || positions[i] >= parts) {
      return InvalidArgument(kAllToAllOp, "positions[", i, "] = ", positions[i],
                             " is not a position in [0, ", parts, ")");
    }
  }
  if (static_cast<int64_t>(sources.size()) != (parts - 1) * n) {
    return InvalidArgument(kAllToAllOp, "sources has ", sources.size(),
                           " entries; it needs one per device for each of the ", parts - 1,
                           " steps (", (parts - 1) * n, ")");
  }
  if (process < 0 || process > std::numeric_limits<int>::max()) {
    return InvalidArgument(kAllToAllOp, "process must be in [0, ",
                           std::numeric_limits<int>::max(), "], got ", process);
  }
  call->parts = static_cast<int>(parts);
  call->positions.assign(positions.begin(), positions.end());
  call->steps.assign(static_cast<size_t>(parts - 1), PermuteRoute{});
  for (int k = 1; k < parts; ++k) {
    PermuteRoute& route = call->steps[k - 1];
    const ffi::Span<const int64_t> step(sources.begin() + (k - 1) * n, static_cast<size_t>(n));
    JAX_TMA_RETURN_IF_FAILED(AsAllToAll(RoutePermute(
        device, static_cast<int>(process), devices, processes, step, /*push=*/true, &route)));
    const int64_t me = positions[route.self];
    // Every participant sends and receives a chunk at every step, to and
    // from the positions k after and before its own.
    if (route.source < 0 || route.destination < 0 ||
        positions[route.destination] != (me + k) % parts ||
        positions[route.source] != (me - k + parts) % parts) {
      return InvalidArgument(kAllToAllOp, "step ", k, " of sources is not the shift by ", k,
                             " of the positions (device ", device, " of process ", process,
                             " at position ", me, ")");
    }
    call->position = static_cast<int>(me);
  }
  // One part (a group of one): the only chunk stays, at position 0.
  return AsAllToAll(DecodeProcessPlan(process, processes, links, site, timeout_ms,
                                      devices.size(), &call->where));
}

}  // namespace jax_tma
