// This device's part of one jax_tma.ppermute on the GPU (see ppermute_launch.h).
#include "ppermute/ppermute_launch.h"

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cuda/cuda_status.h"
#include "path_counts.h"
#include "peer/peer_copy.h"
#include "peer/peer_memory.h"

namespace jax_tma {

ffi::TypeId PeerSites::id = {};
PeerSites::PeerSites() = default;
PeerSites::~PeerSites() = default;

namespace {

// Lets `device` (the current one) read and write `peer`'s memory, once per pair.
ffi::Error EnablePeerAccess(int device, int peer) {
  if (device == peer) return ffi::Error::Success();
  static std::mutex mu;
  static auto* enabled = new std::set<std::pair<int, int>>();
  std::lock_guard<std::mutex> lock(mu);
  if (enabled->count({device, peer})) return ffi::Error::Success();
  int can = 0;
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, device, peer));
  if (!can) {
    return InvalidArgument(kPpermuteOp, "device ", device, " cannot access device ",
                           peer, "'s memory (no peer access between them)");
  }
  cudaError_t err = cudaDeviceEnablePeerAccess(peer, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();  // enabled earlier (by XLA, say): not an error
  } else {
    JAX_TMA_CUDA_RETURN_IF_ERROR(err);
  }
  enabled->insert({device, peer});
  return ffi::Error::Success();
}

// The first call of a participant: its mailbox, the meeting that trades
// mailboxes with its partner and the participant copying its buffer, and
// its waits.
ffi::Error SetUpSite(const PpermuteCall& call, int device, PeerSite* site) {
  const PermuteRoute& route = call.route;
  const ProcessPlan& where = call.where;
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  const int partner = route.partner(), by = route.partnered_by();
  if (partner >= 0 && where.processes[partner] == where.process) {
    JAX_TMA_RETURN_IF_FAILED(EnablePeerAccess(device, static_cast<int>(route.devices[partner])));
  }
  JAX_TMA_RETURN_IF_FAILED(NewPeerMailbox(device, &site->box));
  std::vector<int> peers;  // partner and partnered_by, once each
  for (int p : {partner, by}) {
    if (p >= 0 && (peers.empty() || peers[0] != p)) peers.push_back(p);
  }
  std::vector<std::string> got;
  JAX_TMA_RETURN_IF_FAILED(ExchangeAtSite(
      route, where, call.bytes.bytes, peers,
      [&](int p, const std::string& abort_key, std::string* payload) {
        unsigned long long at = 0;
        JAX_TMA_RETURN_IF_FAILED(
            AddressIn(where.peer(p), device, site->box, where.timeout, abort_key, &at));
        payload->assign(reinterpret_cast<const char*>(&at), sizeof(at));
        return ffi::Error::Success();
      },
      peers, sizeof(unsigned long long), "the mailbox", &got));
  for (size_t i = 0; i < peers.size(); ++i) {
    unsigned long long at = 0;
    std::memcpy(&at, got[i].data(), sizeof(at));
    auto* box = reinterpret_cast<PeerMailbox*>(at);
    if (peers[i] == partner) site->partner_box = box;
    if (peers[i] == by) site->by_box = box;
  }
  PeerFault* fault = nullptr;
  JAX_TMA_RETURN_IF_FAILED(ThePeerFault(&fault));
  site->waits = RegisterPeerWaits(
      where.op, where.site + " on " + Describe(route, where, route.self),
      partner >= 0 ? Describe(route, where, partner) : "",
      by >= 0 ? Describe(route, where, by) : "", where.timeout);
  const auto timeout_ns = static_cast<unsigned long long>(where.timeout.count()) * 1000000ull;
  for (auto [p, wait] : {std::make_pair(partner, &site->wait_partner),
                         std::make_pair(by, &site->wait_by)}) {
    if (p < 0) continue;
    wait->timeout_ns = timeout_ns;
    wait->fault = fault;
    wait->site = site->waits;
    JAX_TMA_RETURN_IF_FAILED(PeerGoneWord(static_cast<int>(where.processes[p]), &wait->gone));
  }
  return ffi::Error::Success();
}

}  // namespace

ffi::Error PeerSites::Get(const PpermuteCall& call, int device, const PeerSite** out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sites_.find(device);
    if (it != sites_.end()) {
      *out = it->second.get();
      return ffi::Error::Success();
    }
  }
  // Off this thread: XLA may be capturing a command buffer on it.
  auto site = std::make_unique<PeerSite>(device);
  ffi::Error err = ffi::Error::Success();
  std::thread([&] { err = SetUpSite(call, device, site.get()); }).join();
  // A peer whose side of a failed meeting finished may hold this mailbox's
  // address and write to it: it is never reused.
  if (err.failure()) site->box = nullptr;
  if (err.failure() && err.message().rfind(call.where.op, 0) != 0) {
    return ffi::Error(*err.errc(), call.where.op + " at " + call.where.site + " on " +
                                       Describe(call.route, call.where, call.route.self) +
                                       ": " + std::string(err.message()));
  }
  JAX_TMA_RETURN_IF_FAILED(err);
  std::lock_guard<std::mutex> lock(mu_);
  *out = site.get();
  sites_[device] = std::move(site);
  return ffi::Error::Success();
}

ffi::Error LaunchPpermute(const PpermuteCall& call, const PpermutePlan& plan, PeerSites* sites,
                          cudaStream_t stream, int device) {
  const ByteCopy& c = call.bytes;
  const PermuteRoute& route = call.route;
  // Every participant has the same block size, so all skip together.
  if (c.bytes == 0) return ffi::Error::Success();
  JAX_TMA_RETURN_IF_FAILED(RecordedPeerFault());
  const PeerSite* site = nullptr;
  JAX_TMA_RETURN_IF_FAILED(sites->Get(call, device, &site));
  if (route.source < 0) {
    JAX_TMA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(c.dst, 0, c.bytes, stream));
  }
  const int partner = route.partner(), by = route.partnered_by();
  unsigned long long published = 0;
  if (by >= 0) {
    // Push publishes the output, whose memory is free at this point of the
    // stream; pull the input, complete at this point.
    const void* buffer = route.push ? c.dst : c.src;
    JAX_TMA_RETURN_IF_FAILED(AddressIn(call.where.peer(by), device, buffer, call.where.timeout,
                                       call.where.site + "#buffers", &published));
  }
  if (partner < 0 && by < 0) return ffi::Error::Success();
  JAX_TMA_RETURN_IF_FAILED(LaunchPeerMeet(site->box, by >= 0 ? site->by_box : nullptr, published,
                                          partner >= 0, site->wait_partner, stream));
  if (partner >= 0) {
    const bool tma = plan.method == Method::kTma;
    void* local = route.push ? const_cast<void*>(c.src) : c.dst;
    JAX_TMA_RETURN_IF_FAILED(LaunchPeerCopy(site->box, site->partner_box, local, c.bytes,
                                            route.push, tma, stream, device));
    CountPath(tma ? Path::kPpermuteTma : Path::kPpermuteSimt);
  }
  if (by >= 0) JAX_TMA_RETURN_IF_FAILED(LaunchPeerFinish(site->box, site->wait_by, stream));
  return ffi::Error::Success();
}

}  // namespace jax_tma
