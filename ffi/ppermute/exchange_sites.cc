// Per-step participants of an exchange and its legs (exchange_sites.h).
#include "ppermute/exchange_sites.h"

#include <string>

#include "cuda/device_info.h"

namespace jax_tma {

ffi::TypeId ExchangeSites::id = {};

PeerSites* ExchangeSites::Step(int k) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& sites = steps_[k];
  if (sites == nullptr) sites = std::make_unique<PeerSites>();
  return sites.get();
}

ffi::Error ExchangeLegs(ExchangeSites* sites, Method method, std::size_t bytes,
                        const std::vector<PermuteRoute>& steps, const ProcessPlan& where,
                        int device, const void* output, const void* recv_sizes,
                        PeerLegs* legs) {
  if (steps.size() > static_cast<size_t>(kMaxPeerLegs)) {
    return InvalidArgument(kPeerOp, "a group of ", steps.size() + 1,
                           " devices; the exchange runs in groups of at most ",
                           kMaxPeerLegs + 1);
  }
  JAX_TMA_RETURN_IF_FAILED(RecordedPeerFault());
  legs->count = static_cast<int>(steps.size());
  for (int k = 1; k <= legs->count; ++k) {
    const PermuteRoute& route = steps[k - 1];
    ProcessPlan plan = where;
    plan.site += "#step" + std::to_string(k);
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
