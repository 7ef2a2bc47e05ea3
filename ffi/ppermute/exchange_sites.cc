// Per-step participants of an exchange and its legs (exchange_sites.h).
#include "ppermute/exchange_sites.h"

#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "cuda/cuda_status.h"
#include "cuda/device_info.h"

namespace jax_tma {

ffi::TypeId ExchangeSites::id = {};
const ffi::TypeInfo kExchangeSitesTypeInfo = ffi::MakeTypeInfo<ExchangeSites>();
void* ExchangeSitesTypeId() { return &ExchangeSites::id; }
const void* ExchangeSitesTypeInfo() { return &kExchangeSitesTypeInfo; }

ExchangeSites::~ExchangeSites() {
  for (const auto& [device, check] : checks_) UnregisterPeerWaits(check.site);
  for (const auto& [device, inbox] : inboxes_) ReleasePeerInbox(device, inbox.base);
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

namespace {

// The slots of this participant's inbox for step k's source, the first
// of two.
uint8_t* InboxSlots(void* base, int k, int64_t payload) {
  return static_cast<uint8_t*>(base) + int64_t{2} * (k - 1) * PeerInboxStride(payload);
}

// Allocates this participant's inbox and trades its slots with every step's
// source for the destination's, in step order (each step's own meeting).
ffi::Error SetUpInbox(const ExchangeGroup& group, int device, std::size_t bytes,
                      int64_t payload, ExchangeSites::Inbox* inbox) {
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  JAX_TMA_RETURN_IF_FAILED(
      NewPeerInbox(device, PeerInboxBytes(group.parts, payload), &inbox->base));
  for (int k = 1; k < group.parts; ++k) {
    const PermuteRoute& route = group.steps[k - 1];
    ProcessPlan plan = group.StepPlan(k);
    plan.site += "#inbox";
    std::vector<std::string> got;
    JAX_TMA_RETURN_IF_FAILED(ExchangeAtSite(
        route, plan, bytes, {route.source},
        [&](int to, const std::string& abort_key, std::string* message) {
          unsigned long long at = 0;
          JAX_TMA_RETURN_IF_FAILED(AddressIn(plan.peer(to), device,
                                             InboxSlots(inbox->base, k, payload), plan.timeout,
                                             abort_key, &at));
          message->assign(reinterpret_cast<const char*>(&at), sizeof(at));
          return ffi::Error::Success();
        },
        {route.destination}, sizeof(unsigned long long), "the inbox", &got));
    unsigned long long at = 0;
    std::memcpy(&at, got[0].data(), sizeof(at));
    inbox->partner_slots.push_back(reinterpret_cast<uint8_t*>(at));
  }
  return ffi::Error::Success();
}

// The participant of step k on `device`, set up by its first call; the
// meeting only compares `bytes`.
ffi::Error StepSite(ExchangeSites* sites, Method method, std::size_t bytes,
                    const ExchangeGroup& group, int device, int k, const PeerSite** site) {
  const PpermuteCall call{method, ByteCopy{nullptr, nullptr, bytes}, group.steps[k - 1],
                          group.StepPlan(k)};
  return sites->Step(k)->Get(call, device, site);
}

ffi::Error CheckLegs(const ExchangeGroup& group) {
  if (group.steps.size() > static_cast<size_t>(kMaxPeerLegs)) {
    return InvalidArgument(kPeerOp, "a group of ", group.steps.size() + 1,
                           " devices; the exchange runs in groups of at most ",
                           kMaxPeerLegs + 1);
  }
  return RecordedPeerFault();
}

}  // namespace

ffi::Error ExchangeSites::GetInbox(const ExchangeGroup& group, int device, std::size_t bytes,
                                   int64_t payload, const Inbox** out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = inboxes_.find(device);
    if (it != inboxes_.end()) {
      *out = &it->second;
      return ffi::Error::Success();
    }
  }
  // Off this thread: XLA may be capturing a command buffer on it.
  Inbox inbox;
  ffi::Error err = ffi::Error::Success();
  std::thread([&] { err = SetUpInbox(group, device, bytes, payload, &inbox); }).join();
  // A peer whose side of a failed meeting finished may hold this inbox's
  // address and write to it: it is never reused.
  JAX_TMA_RETURN_IF_FAILED(err);
  std::lock_guard<std::mutex> lock(mu_);
  *out = &(inboxes_[device] = std::move(inbox));
  return ffi::Error::Success();
}

ffi::Error ExchangeInboxLegs(ExchangeSites* sites, Method method, std::size_t bytes,
                             const ExchangeGroup& group, int device, int64_t payload,
                             PeerInboxLegs* legs) {
  JAX_TMA_RETURN_IF_FAILED(CheckLegs(group));
  legs->count = static_cast<int>(group.steps.size());
  std::vector<const PeerSite*> steps(legs->count);
  for (int k = 1; k <= legs->count; ++k) {
    JAX_TMA_RETURN_IF_FAILED(StepSite(sites, method, bytes, group, device, k, &steps[k - 1]));
  }
  if (legs->count == 0) return ffi::Error::Success();  // a group of one: no inbox
  const ExchangeSites::Inbox* inbox = nullptr;
  JAX_TMA_RETURN_IF_FAILED(sites->GetInbox(group, device, bytes, payload, &inbox));
  for (int k = 1; k <= legs->count; ++k) {
    const PeerSite* site = steps[k - 1];
    legs->leg[k - 1] = PeerInboxLeg{site->box, site->partner_box, inbox->partner_slots[k - 1],
                                    InboxSlots(inbox->base, k, payload), site->wait_by};
  }
  return ffi::Error::Success();
}

ffi::Error ExchangeLegs(ExchangeSites* sites, Method method, std::size_t bytes,
                        const ExchangeGroup& group, int device, const void* output,
                        const void* recv_sizes, PeerLegs* legs) {
  const std::vector<PermuteRoute>& steps = group.steps;
  const ProcessPlan& where = group.where;
  JAX_TMA_RETURN_IF_FAILED(CheckLegs(group));
  legs->count = static_cast<int>(steps.size());
  for (int k = 1; k <= legs->count; ++k) {
    const PermuteRoute& route = steps[k - 1];
    const ProcessPlan plan = group.StepPlan(k);
    // The step's own copy is PeerScatter's.
    const PeerSite* site = nullptr;
    JAX_TMA_RETURN_IF_FAILED(StepSite(sites, method, bytes, group, device, k, &site));
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

PeerSlices RaggedPeerSlices(const RaggedAllToAllCall& call) {
  PeerSlices slices;
  slices.src = static_cast<const uint8_t*>(call.operand);
  slices.local = static_cast<uint8_t*>(call.result);
  slices.parts = call.parts;
  slices.position = call.position;
  slices.per_part = static_cast<int>(call.slices_per_part);
  slices.slices = call.slices;
  slices.bytes = static_cast<int64_t>(call.row_bytes);
  slices.input_offsets = call.input_offsets;
  slices.send_sizes = call.send_sizes;
  slices.output_offsets = call.output_offsets;
  slices.recv_sizes = call.recv_sizes;
  slices.index64 = call.index_type == ffi::DataType::S64;
  slices.src_rows = call.operand_rows;
  slices.dst_rows = call.output_rows;
  return slices;
}

}  // namespace jax_tma
