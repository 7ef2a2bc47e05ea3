// Host-side meeting of the devices of one call on the peer transport (see
// the header).
// XLA runs each device's part of a multi-device program on its own host
// thread, so the handlers of one call meet here concurrently; a device whose
// peer never arrives returns an error after the call's timeout instead of
// hanging.
#include "peer/peer_rendezvous.h"

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace jax_tma {
namespace {

struct Slot {
  int64_t calls = 0;       // calls this participant has started
  int64_t published = -1;  // generation of `block`
  int64_t departed = -1;   // generation whose copy finished
  PermuteBlock block;
};

}  // namespace

struct PermuteMeeting::State {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Slot> slots;
  std::string abort_message;  // non-empty once a participant failed
};

namespace {

// States live as long as the process: a lowered ppermute may run again at
// any time, and a handful of bytes per lowering is all they cost.
ffi::Error GetState(int64_t instance, int size, PermuteMeeting::State** out) {
  static std::mutex mu;
  static auto* states =
      new std::unordered_map<int64_t, std::unique_ptr<PermuteMeeting::State>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& state = (*states)[instance];
  if (!state) {
    state = std::make_unique<PermuteMeeting::State>();
    state->slots.resize(size);
  }
  if (static_cast<int>(state->slots.size()) != size) {
    return InvalidArgument(kPeerOp, "instance ", instance, " was first run on ",
                           state->slots.size(), " devices and now on ", size);
  }
  *out = state.get();
  return ffi::Error::Success();
}

template <typename Ready>
ffi::Error Await(PermuteMeeting::State* s, std::unique_lock<std::mutex>& lock,
                 const PermuteRoute& route, std::chrono::milliseconds timeout, int peer,
                 int64_t generation, const char* what, Ready ready) {
  const bool ok = s->cv.wait_for(lock, timeout, [&] {
    return !s->abort_message.empty() || ready();
  });
  if (!s->abort_message.empty()) {
    return ffi::Error::Internal(std::string(kPeerOp) + ": " + s->abort_message);
  }
  if (!ok) {
    Message m;
    m << kPeerOp << ": device " << route.devices[route.self] << " waited "
      << timeout.count() / 1000.0 << " s for device " << route.devices[peer] << " to " << what
      << " call " << generation << " of this ppermute; every device of the mesh must run the "
      << "program";
    return ffi::Error(ffi::ErrorCode::kDeadlineExceeded, m.str());
  }
  return ffi::Error::Success();
}

}  // namespace

ffi::Error PermuteMeeting::Arrive(int64_t instance, const PermuteRoute& route,
                                  std::chrono::milliseconds timeout, const PermuteBlock& own,
                                  PermuteBlock* partner_block) {
  State* s = nullptr;
  JAX_TMA_RETURN_IF_FAILED(GetState(instance, route.size, &s));
  state_ = s;
  route_ = &route;
  timeout_ = timeout;
  std::unique_lock<std::mutex> lock(s->mu);
  Slot& me = s->slots[route.self];
  const int64_t gen = generation_ = me.calls++;
  me.block = own;
  me.published = gen;
  s->cv.notify_all();
  const int partner = route.partner();
  if (partner < 0) return ffi::Error::Success();
  const Slot& other = s->slots[partner];
  // The partner cannot move past this generation before this device
  // departs (it waits for it in Depart), so the block read here is `gen`'s.
  JAX_TMA_RETURN_IF_FAILED(Await(s, lock, route, timeout, partner, gen, "publish its buffer for",
                                 [&] { return other.published >= gen; }));
  if (other.block.run_id != own.run_id) {
    return ffi::Error::Internal(
        std::string(kPeerOp) + ": call " + std::to_string(gen) + " on device " +
        std::to_string(route.devices[route.self]) + " belongs to run " +
        std::to_string(own.run_id) + " but on device " +
        std::to_string(route.devices[partner]) + " to run " +
        std::to_string(other.block.run_id) +
        "; executions of this program reached the devices in different orders");
  }
  *partner_block = other.block;
  return ffi::Error::Success();
}

ffi::Error PermuteMeeting::Depart(void** partnered_by_done) {
  State* s = state_;
  const PermuteRoute& route = *route_;
  const int64_t gen = generation_;
  std::unique_lock<std::mutex> lock(s->mu);
  s->slots[route.self].departed = gen;
  s->cv.notify_all();
  const int by = route.partnered_by();
  if (by < 0) return ffi::Error::Success();
  const Slot& other = s->slots[by];
  JAX_TMA_RETURN_IF_FAILED(Await(s, lock, route, timeout_, by, gen, "finish its copy in",
                                 [&] { return other.departed >= gen; }));
  *partnered_by_done = other.block.done;
  return ffi::Error::Success();
}

void PermuteMeeting::Abort(std::string_view why) {
  if (state_ == nullptr) return;
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->abort_message.empty()) {
    state_->abort_message = "device " + std::to_string(route_->devices[route_->self]) +
                            " failed (" + std::string(why) +
                            "); this ppermute cannot run again in this process";
  }
  state_->cv.notify_all();
}

}  // namespace jax_tma
