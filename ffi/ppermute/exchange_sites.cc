// Per-step participants of an exchange and its legs (exchange_sites.h).
#include "ppermute/exchange_sites.h"

#include <string>

#include "cuda/device_info.h"

namespace jax_tma {

ffi::TypeId ExchangeSites::id = {};
const ffi::TypeInfo kExchangeSitesTypeInfo = ffi::MakeTypeInfo<ExchangeSites>();
void* ExchangeSitesTypeId() { return &ExchangeSites::id; }
const void* ExchangeSitesTypeInfo() { return &kExchangeSitesTypeInfo; }

ExchangeSites::~ExchangeSites() {
  for (const auto& [device, check] : checks_) UnregisterPeerWaits(check.site);
}

PeerSites* ExchangeSites::Step(int k) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& sites = steps_[k];
  if (sites == nullptr) sites = std::make_unique<PeerSites>();
  return sites.get();
}

ffi::Error ExchangeSites::Check(const ExchangeGroup& group, int device, PeerWait* check) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = checks_.find(device);
  if (it == checks_.end()) {
    PeerWait wait;
    JAX_TMA_RETURN_IF_FAILED(ThePeerFault(&wait.fault));
    JAX_TMA_RETURN_IF_FAILED(PeerGoneWord(-1, &wait.gone));
    wait.site = RegisterPeerWaits(group.where.op,
                                  group.where.site + " on " + group.Describe(group.self), "", "",
                                  group.where.timeout);
    it = checks_.emplace(device, wait).first;
  }
  *check = it->second;
  return ffi::Error::Success();
}

ffi::Error ExchangeLegs(ExchangeSites* sites, Method method, std::size_t bytes,
                        const ExchangeGroup& group, int device, const void* output,
                        const void* recv_sizes, PeerLegs* legs) {
  const std::vector<PermuteRoute>& steps = group.steps;
  const ProcessPlan& where = group.where;
  if (steps.size() > static_cast<size_t>(kMaxPeerLegs)) {
    return InvalidArgument(kPeerOp, "a group of ", steps.size() + 1,
                           " devices; the exchange runs in groups of at most ",
                           kMaxPeerLegs + 1);
  }
  JAX_TMA_RETURN_IF_FAILED(RecordedPeerFault());
  legs->count = static_cast<int>(steps.size());
  for (int k = 1; k <= legs->count; ++k) {
    const PermuteRoute& route = steps[k - 1];
    const ProcessPlan plan = group.StepPlan(k);
    // The meeting only compares `bytes`; the step's own copy is PeerScatter's.
    const PpermuteCall call{method, ByteCopy{nullptr, nullptr, bytes}, route, plan};
    const PeerSite* site = nullptr;
    JAX_TMA_RETURN_IF_FAILED(sites->Step(k)->Get(call, device, &site));
    PeerLeg& leg = legs->leg[k - 1];
    const LinkPeer& by = where.peer(route.partnered_by());
    leg = PeerLeg{site->box, site->by_box, site->partner_box, 0, 0,
                  site->wait_partner, site->wait_by};
    JAX_TMA_RETURN_IF_FAILED(
        AddressIn(by, device, output, where.timeout, plan.site + "#buffers", &leg.published));
    if (recv_sizes != nullptr) {
      JAX_TMA_RETURN_IF_FAILED(AddressIn(by, device, recv_sizes, where.timeout,
                                         plan.site + "#buffers", &leg.published_sizes));
    }
  }
  return ffi::Error::Success();
}

ffi::Error ExchangeUsesTma(std::string_view op, Method method, const DeviceInfo& info,
                           int device, bool* tma) {
  if (method == Method::kTma && !info.has_tma()) {
    return InvalidArgument(op, info.NeedsTma("tma", device));
  }
  *tma = method == Method::kTma || (method == Method::kAuto && info.has_tma());
  return ffi::Error::Success();
}

}  // namespace jax_tma
