// A jax_tma.ppermute across the processes of one host (see the header).
#include "ppermute/ppermute_processes.h"

#include "ppermute/ppermute_common.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

namespace jax_tma {
namespace {

// What travels in front of a block: the permutation's digest and the size.
struct BlockHeader {
  uint64_t digest = 0;
  uint64_t bytes = 0;
};

uint64_t Digest(const PermuteRoute& route, const ProcessPlan& where) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a, 64 bits
  auto mix = [&](int64_t v) {
    for (int i = 0; i < 8; ++i) {
      h = (h ^ static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i))) * 1099511628211ull;
    }
  };
  for (int i = 0; i < route.size; ++i) {
    mix(where.processes[i]);
    mix(route.devices[i]);
    mix(route.sources[i]);
  }
  return h;
}

// Per call site of this process: how many calls each participant has made,
// and why the site broke, once it has.
struct Site {
  std::map<int, int64_t> calls;
  std::string broken;
};

std::mutex sites_mu;
std::map<std::string, Site>& Sites() {
  static auto* sites = new std::map<std::string, Site>();
  return *sites;
}

std::string BlockKey(const ProcessPlan& where, int64_t call, int from, int to) {
  return where.site + "#" + std::to_string(call) + ":" + std::to_string(from) + ">" +
         std::to_string(to);
}

std::string Describe(const PermuteRoute& route, const ProcessPlan& where, int logical) {
  return "device " + std::to_string(route.devices[logical]) + " of process " +
         std::to_string(where.processes[logical]);
}

}  // namespace

bool ProcessPlan::spans_processes() const {
  for (int64_t p : processes) {
    if (p != process) return true;
  }
  return false;
}

LinkPeer ProcessPlan::peer(int logical) const {
  const int p = static_cast<int>(processes[logical]);
  return LinkPeer{p, links[p]};
}

ffi::Error DecodeProcessPlan(int64_t process, ffi::Span<const int64_t> processes,
                             std::string_view links, std::string_view site, int64_t timeout_ms,
                             size_t participants, ProcessPlan* out) {
  if (processes.size() != participants) {
    return InvalidArgument(kPpermuteOp, "processes has ", processes.size(),
                           " entries for ", participants, " devices");
  }
  out->process = static_cast<int>(process);
  out->processes.assign(processes.begin(), processes.end());
  out->links.clear();
  for (size_t start = 0; start <= links.size() && !links.empty();) {
    size_t end = std::min(links.find('\n', start), links.size());
    out->links.emplace_back(links.substr(start, end - start));
    start = end + 1;
  }
  out->site = std::string(site);
  out->timeout = std::chrono::milliseconds(timeout_ms);
  if (timeout_ms <= 0) {
    return InvalidArgument(kPpermuteOp, "timeout_ms must be positive, got ", timeout_ms);
  }
  if (!out->spans_processes()) return ffi::Error::Success();
  for (int64_t p : processes) {
    if (p < 0 || p >= static_cast<int64_t>(out->links.size()) || out->links[p].empty()) {
      return InvalidArgument(kPpermuteOp, "process ", p, " has no link name (", out->links.size(),
                             " given)");
    }
  }
  ffi::Error err = ListenLink(LinkPeer{out->process, out->links[out->process]});
  if (err.failure()) {
    return ffi::Error(*err.errc(), std::string(kPpermuteOp) + ": " + std::string(err.message()));
  }
  return ffi::Error::Success();
}

ffi::Error ExchangeAcrossProcesses(const PermuteRoute& route, const ProcessPlan& where,
                                   const void* src, void* dst, size_t bytes) {
  int64_t call;
  {
    std::lock_guard<std::mutex> lock(sites_mu);
    Site& site = Sites()[where.site];
    if (!site.broken.empty()) {
      return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                        std::string(kPpermuteOp) + " at " + where.site +
                            ": an earlier call here failed (" + site.broken +
                            "), so the processes are out of step at this call site and it "
                            "refuses every later call; restart the processes");
    }
    call = site.calls[route.self]++;
  }
  const std::string self = Describe(route, where, route.self);
  const BlockHeader header{Digest(route, where), bytes};
  const std::string abort_key = where.site + "#" + std::to_string(call);
  auto fail = [&](ffi::Error err) {
    std::string why(err.message());
    {
      std::lock_guard<std::mutex> lock(sites_mu);
      Sites()[where.site].broken = why;
    }
    // Every participant of this call stops waiting, with this reason.
    std::vector<bool> told(where.links.size(), false);
    for (int64_t p : where.processes) {
      if (!told[p]) {
        told[p] = true;
        AbortLink(LinkPeer{static_cast<int>(p), where.links[p]}, abort_key,
                  self + " failed: " + why);
      }
    }
    return ffi::Error(*err.errc(), std::string(kPpermuteOp) + " at " + where.site + ", call " +
                                       std::to_string(call) + " on " + self + ": " + why);
  };
  if (route.destination >= 0) {
    std::string block(sizeof(header) + bytes, '\0');
    std::memcpy(block.data(), &header, sizeof(header));
    std::memcpy(block.data() + sizeof(header), src, bytes);
    ffi::Error err = SendLink(where.peer(route.destination),
                              BlockKey(where, call, route.self, route.destination), block);
    if (err.failure()) return fail(std::move(err));
  }
  if (route.source < 0) {
    std::memset(dst, 0, bytes);
    return ffi::Error::Success();
  }
  LinkMessage got;
  ffi::Error err =
      ReceiveLink(where.peer(route.source), BlockKey(where, call, route.source, route.self),
                  abort_key, "the block of " + Describe(route, where, route.source), where.timeout,
                  &got);
  if (err.failure()) return fail(std::move(err));
  BlockHeader theirs;
  if (got.bytes.size() >= sizeof(theirs)) std::memcpy(&theirs, got.bytes.data(), sizeof(theirs));
  if (got.bytes.size() != sizeof(header) + bytes || theirs.digest != header.digest) {
    return fail(ffi::Error(
        ffi::ErrorCode::kFailedPrecondition,
        Describe(route, where, route.source) + " sent a block of " +
            std::to_string(got.bytes.size() - std::min(got.bytes.size(), sizeof(header))) +
            " bytes for another permutation or shape (this call moves " + std::to_string(bytes) +
            " bytes" + (theirs.digest == header.digest ? "" : " with another permutation") +
            "): the processes make different calls here"));
  }
  std::memcpy(dst, got.bytes.data() + sizeof(header), bytes);
  return ffi::Error::Success();
}

}  // namespace jax_tma
