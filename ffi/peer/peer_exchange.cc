// The block exchange across the processes of one host (see the header).
#include "peer/peer_exchange.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <utility>

namespace jax_tma {
namespace {

// What travels in front of a block: the permutation's digest and the size.
struct BlockHeader {
  uint64_t digest = 0;
  uint64_t bytes = 0;
};

// FNV-1a (64 bits) of where each participant lives and, with
// `permutation`, whose block it receives.
uint64_t Digest(const PermuteRoute& route, const ProcessPlan& where, bool permutation = true) {
  uint64_t h = 14695981039346656037ull;
  auto mix = [&](int64_t v) {
    for (int i = 0; i < 8; ++i) {
      h = (h ^ static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i))) * 1099511628211ull;
    }
  };
  for (int i = 0; i < route.size; ++i) {
    mix(where.processes[i]);
    mix(route.devices[i]);
    if (permutation) mix(route.sources[i]);
  }
  return h;
}

// The meetings of one call site over one set of participants: the same
// line of code over another mesh (another set) counts its calls apart, while
// another permutation over the same set meets, and fails on the digest.
std::string MeetingKey(const PermuteRoute& route, const ProcessPlan& where) {
  return where.site + "@" + std::to_string(Digest(route, where, /*permutation=*/false));
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

std::string BlockKey(const std::string& meeting, int64_t call, int from, int to) {
  return meeting + "#" + std::to_string(call) + ":" + std::to_string(from) + ">" +
         std::to_string(to);
}

}  // namespace

std::string Describe(const PermuteRoute& route, const ProcessPlan& where, int logical) {
  return "device " + std::to_string(route.devices[logical]) + " of process " +
         std::to_string(where.processes[logical]);
}

bool ProcessPlan::spans_processes() const {
  for (int64_t p : processes) {
    if (p != process) return true;
  }
  return false;
}

LinkPeer ProcessPlan::peer(int logical) const {
  const int p = static_cast<int>(processes[logical]);
  return p == process ? LinkPeer{p, {}} : LinkPeer{p, links[p]};
}

ffi::Error DecodeProcessPlan(int64_t process, ffi::Span<const int64_t> processes,
                             std::string_view links, std::string_view site, int64_t timeout_ms,
                             size_t participants, ProcessPlan* out) {
  if (processes.size() != participants) {
    return InvalidArgument(kPeerOp, "processes has ", processes.size(),
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
    return InvalidArgument(kPeerOp, "timeout_ms must be positive, got ", timeout_ms);
  }
  if (!out->spans_processes()) return ffi::Error::Success();
  for (int64_t p : processes) {
    if (p < 0 || p >= static_cast<int64_t>(out->links.size()) || out->links[p].empty()) {
      return InvalidArgument(kPeerOp, "process ", p, " has no link name (", out->links.size(),
                             " given)");
    }
  }
  ffi::Error err = ListenLink(LinkPeer{out->process, out->links[out->process]}, out->timeout);
  if (err.failure()) {
    return ffi::Error(*err.errc(), std::string(kPeerOp) + ": " + std::string(err.message()));
  }
  return ffi::Error::Success();
}

namespace {

// How long to wait for `from`: the timeout, and a second more for a
// participant of this process, whose own wait (with the same timeout) then
// fails first and tells its reason, the one that names the late process.
std::chrono::milliseconds Patience(const ProcessPlan& where, int from) {
  const bool here = where.processes[from] == where.process;
  return where.timeout + (here ? std::chrono::milliseconds(1000) : std::chrono::milliseconds(0));
}

}  // namespace

ffi::Error ExchangeAtSite(const PermuteRoute& route, const ProcessPlan& where, size_t bytes,
                          const std::vector<int>& sends, const PayloadFor& payload_for,
                          const std::vector<int>& receives, size_t payload_bytes,
                          std::string_view what, std::vector<std::string>* got) {
  const std::string meeting = MeetingKey(route, where);
  int64_t call;
  {
    std::lock_guard<std::mutex> lock(sites_mu);
    Site& site = Sites()[meeting];
    if (!site.broken.empty()) {
      return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                        where.op + " at " + where.site +
                            ": an earlier call here failed (" + site.broken +
                            "), so the processes are out of step at this call site and it "
                            "refuses every later call; restart the processes");
    }
    call = site.calls[route.self]++;
  }
  const std::string self = Describe(route, where, route.self);
  const BlockHeader header{Digest(route, where), bytes};
  const std::string abort_key =
      where.abort_site.empty() ? meeting + "#" + std::to_string(call) : where.abort_site;
  auto fail = [&](ffi::Error err) {
    std::string why(err.message());
    // A peer that failed first and then exited shows here as gone: its own
    // reason names the root cause.
    if (err.errc() != ffi::ErrorCode::kAborted) {
      if (std::string first = LinkAbortReason(abort_key); !first.empty()) {
        why += "; before that, " + first;
      }
    }
    {
      std::lock_guard<std::mutex> lock(sites_mu);
      Sites()[meeting].broken = why;
    }
    // Every participant of this call stops waiting, with this reason.
    std::set<int64_t> told;
    for (int i = 0; i < route.size; ++i) {
      if (told.insert(where.processes[i]).second) {
        AbortLink(where.peer(i), abort_key, self + " failed: " + why);
      }
    }
    return ffi::Error(*err.errc(), where.op + " at " + where.site + ", call " +
                                       std::to_string(call) + " on " + self + ": " + why);
  };
  for (int to : sends) {
    std::string payload;
    ffi::Error made = payload_for(to, abort_key, &payload);
    if (made.failure()) return fail(std::move(made));
    std::string message(sizeof(header) + payload.size(), '\0');
    std::memcpy(message.data(), &header, sizeof(header));
    std::memcpy(message.data() + sizeof(header), payload.data(), payload.size());
    ffi::Error err = SendLink(where.peer(to), BlockKey(meeting, call, route.self, to), message);
    if (err.failure()) return fail(std::move(err));
  }
  got->clear();
  for (int from : receives) {
    std::string message;
    const std::string theirs_is = std::string(what) + " of " + Describe(route, where, from);
    ffi::Error err = ReceiveLink(where.peer(from), BlockKey(meeting, call, from, route.self),
                                 abort_key, theirs_is, Patience(where, from), &message);
    if (err.failure()) return fail(std::move(err));
    BlockHeader theirs;
    if (message.size() >= sizeof(theirs)) {
      std::memcpy(&theirs, message.data(), sizeof(theirs));
    }
    if (message.size() < sizeof(header) || theirs.bytes != bytes ||
        theirs.digest != header.digest) {
      return fail(ffi::Error(
          ffi::ErrorCode::kFailedPrecondition,
          Describe(route, where, from) + " sent " + std::string(what) + " for a call of " +
              std::to_string(theirs.bytes) + " bytes" +
              (theirs.digest == header.digest ? "" : " with another permutation") +
              " (this call moves " + std::to_string(bytes) +
              " bytes): the processes make different calls here"));
    }
    if (message.size() != sizeof(header) + payload_bytes) {
      return fail(ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                             Describe(route, where, from) + " sent " + std::string(what) +
                                 " of " + std::to_string(message.size() - sizeof(header)) +
                                 " bytes where this call takes " +
                                 std::to_string(payload_bytes)));
    }
    got->push_back(message.substr(sizeof(header)));
  }
  return ffi::Error::Success();
}

ffi::Error ExchangeAcrossProcesses(const PermuteRoute& route, const ProcessPlan& where,
                                   const void* src, void* dst, size_t bytes) {
  std::vector<int> sends, receives;
  if (route.destination >= 0) sends.push_back(route.destination);
  if (route.source >= 0) receives.push_back(route.source);
  std::vector<std::string> got;
  JAX_TMA_RETURN_IF_FAILED(ExchangeAtSite(
      route, where, bytes, sends,
      [&](int, const std::string&, std::string* block) {
        block->assign(static_cast<const char*>(src), bytes);
        return ffi::Error::Success();
      },
      receives, bytes, "the block", &got));
  if (route.source < 0) {
    std::memset(dst, 0, bytes);
  } else {
    std::memcpy(dst, got[0].data(), bytes);
  }
  return ffi::Error::Success();
}

}  // namespace jax_tma
