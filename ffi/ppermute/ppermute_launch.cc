// This device's part of one jax_tma.ppermute on the GPU (see ppermute_launch.h).
#include "ppermute/ppermute_launch.h"

#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "copy/copy_launch.h"
#include "cuda/cuda_status.h"
#include "path_counts.h"
#include "ppermute/ppermute_rendezvous.h"

namespace jax_tma {
namespace {

struct PermuteEvents {
  cudaEvent_t ready = nullptr;
  cudaEvent_t done = nullptr;
};

// One pair of events per lowered ppermute and device, made once by that
// device's own handler thread (the current device is the handler's device)
// and reused by every later call: a call records them only after the
// previous call's waits on them were enqueued.
ffi::Error GetEvents(int64_t instance, int device, PermuteEvents* out) {
  static std::mutex mu;
  static auto* events = new std::map<std::pair<int64_t, int>, PermuteEvents>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = events->find({instance, device});
  if (it == events->end()) {
    PermuteEvents e;
    JAX_TMA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e.ready, cudaEventDisableTiming));
    JAX_TMA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e.done, cudaEventDisableTiming));
    it = events->emplace(std::make_pair(instance, device), e).first;
  }
  *out = it->second;
  return ffi::Error::Success();
}

// Lets `device` (the current one) read `peer`'s memory, once per pair.
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

}  // namespace

ffi::Error LaunchPpermute(const PpermuteCall& call, const PpermutePlan& plan, int64_t instance,
                          int64_t run_id, cudaStream_t stream, int device) {
  const ByteCopy& c = call.bytes;
  const PermuteRoute& route = call.route;
  const bool push = route.push;
  // Every participant has the same block size, so all skip together.
  if (c.bytes == 0) return ffi::Error::Success();
  const int partner = route.partner();
  if (partner >= 0) {
    JAX_TMA_RETURN_IF_FAILED(
        EnablePeerAccess(device, static_cast<int>(route.devices[partner])));
  }
  if (route.source < 0) {
    JAX_TMA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(c.dst, 0, c.bytes, stream));
  }
  PermuteEvents events;
  JAX_TMA_RETURN_IF_FAILED(GetEvents(instance, device, &events));
  // Pull publishes the input, complete at this point of the stream; push
  // publishes the output, whose memory is free at this point of the stream.
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaEventRecord(events.ready, stream));
  void* published = push ? c.dst : const_cast<void*>(c.src);
  return ExchangeBlocks(
      instance, route, call.where.timeout,
      PermuteBlock{run_id, published, events.ready, events.done},
      [&](const PermuteBlock* other) -> ffi::Error {
        if (other != nullptr) {
          JAX_TMA_CUDA_RETURN_IF_ERROR(
              cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(other->ready), 0));
          const void* from = push ? c.src : other->data;
          void* to = push ? other->data : c.dst;
          const ByteCopy peer_copy{from, to, c.bytes};
          CopyPlan copy;
          JAX_TMA_RETURN_IF_FAILED(PlanCopy(kPpermuteOp, plan.method, peer_copy, plan.info, device,
                                            kNoCounterSlot, nullptr, &copy));
          JAX_TMA_RETURN_IF_FAILED(LaunchCopy(copy, peer_copy, stream, device));
          CountPath(copy.kernel == CopyKernel::kTma ? Path::kPpermuteTma : Path::kPpermuteSimt);
        }
        JAX_TMA_CUDA_RETURN_IF_ERROR(cudaEventRecord(events.done, stream));
        return ffi::Error::Success();
      },
      [&](void* other_done) -> ffi::Error {
        if (other_done != nullptr) {
          JAX_TMA_CUDA_RETURN_IF_ERROR(
              cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(other_done), 0));
        }
        return ffi::Error::Success();
      });
}

}  // namespace jax_tma
