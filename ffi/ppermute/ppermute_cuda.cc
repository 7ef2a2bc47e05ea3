// CUDA handler of "jax_tma_ppermute": each device copies its block straight
// between its own memory and a peer GPU's with the TMA bulk copy pipeline
// (peer access; no staging buffer, no NCCL): pull reads the source's input,
// push writes into the destination's output.
//
// Ordering across the two streams, per call (see ppermute_rendezvous.h for
// the host side): the device that publishes a buffer records `ready` on its
// stream where that buffer may be touched (pull: its input is complete;
// push: its output's memory is free); the peer's stream waits on `ready`
// before its copy kernel and records `done` after it; the publisher's stream
// waits on `done` before anything later on it may reuse the buffer (pull) or
// read the output (push). Host threads meet before each event is waited on,
// so every wait sees the event of its own call.
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "copy/copy_launch.h"
#include "cuda/device_info.h"
#include "cuda/handlers.h"
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

ffi::Error PpermuteCudaImpl(cudaStream_t stream, int32_t device, ffi::RunId run,
                            ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                            int64_t instance, ffi::Span<const int64_t> devices,
                            ffi::Span<const int64_t> sources, bool push,
                            std::string_view method, int64_t process,
                            ffi::Span<const int64_t> processes, std::string_view links,
                            std::string_view site, int64_t timeout_ms) {
  PpermuteCall call;
  JAX_TMA_RETURN_IF_FAILED(DecodePpermute(device, x, y, devices, sources, push, method,
                                          process, processes, links, site, timeout_ms, &call));
  if (call.where.spans_processes()) {
    // Lowering sends a mesh across processes on GPUs to lax.ppermute.
    return InvalidArgument(kPpermuteOp, "the CUDA handler runs within one process; the devices "
                                        "of this call live in several");
  }
  const ByteCopy& c = call.bytes;
  const PermutePlan& plan = call.plan;
  CopyMethod parsed = call.method;
  // Every participant has the same block size, so all skip together.
  if (c.bytes == 0) return ffi::Error::Success();
  const int partner = plan.partner();
  if (partner >= 0) {
    JAX_TMA_RETURN_IF_FAILED(
        EnablePeerAccess(device, static_cast<int>(plan.devices[partner])));
  }
  DeviceInfo info;
  JAX_TMA_RETURN_IF_FAILED(GetDeviceInfo(device, &info));
  // Peer copies are latency-bound at every size, which is what the bulk
  // pipeline's many bytes in flight per SM are for; `auto` takes it wherever
  // the GPU has TMA.
  if (parsed == CopyMethod::kAuto) {
    parsed = info.has_tma() ? CopyMethod::kBulk : CopyMethod::kSimt;
  }
  if (plan.source < 0) {
    JAX_TMA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(c.dst, 0, c.bytes, stream));
  }
  PermuteEvents events;
  JAX_TMA_RETURN_IF_FAILED(GetEvents(instance, device, &events));
  // Pull publishes the input, complete at this point of the stream; push
  // publishes the output, whose memory is free at this point of the stream.
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaEventRecord(events.ready, stream));
  void* published = push ? c.dst : const_cast<void*>(c.src);
  return ExchangeBlocks(
      instance, plan, call.where.timeout,
      PermuteBlock{run.run_id, published, events.ready, events.done},
      [&](const PermuteBlock* other) -> ffi::Error {
        if (other != nullptr) {
          JAX_TMA_CUDA_RETURN_IF_ERROR(
              cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(other->ready), 0));
          const void* from = push ? c.src : other->data;
          void* to = push ? other->data : c.dst;
          CopyKernel ran;
          JAX_TMA_RETURN_IF_FAILED(LaunchCopy(kPpermuteOp, parsed, from, to, c.bytes, stream,
                                              device, kNoCounterSlot, nullptr, &ran));
          CountPath(ran == CopyKernel::kBulk ? Path::kPpermuteBulk : Path::kPpermuteSimt);
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

}  // namespace
}  // namespace jax_tma

// Not command-buffer compatible: host threads of the devices meet on every
// call, which a captured graph would skip.
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxTmaPpermuteCuda, jax_tma::PpermuteCudaImpl,
    jax_tma::BindPpermuteCall(
        xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()));  // stream
