// Launcher of jax_tma.ppermute's CUDA path: this device's part of one call,
// the copy between its own memory and a peer GPU's with the copy kernels
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
#ifndef JAX_TMA_FFI_PPERMUTE_PPERMUTE_LAUNCH_H_
#define JAX_TMA_FFI_PPERMUTE_PPERMUTE_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ppermute/ppermute_common.h"
#include "ppermute/ppermute_plan.h"

namespace jax_tma {

// Meets the call's other devices (ExchangeBlocks) and runs this device's copy
// of `call` as `plan` says, ordered on `stream` as above. `instance` names
// the lowered ppermute, `run_id` XLA's execution.
ffi::Error LaunchPpermute(const PpermuteCall& call, const PpermutePlan& plan, int64_t instance,
                          int64_t run_id, cudaStream_t stream, int device);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PPERMUTE_PPERMUTE_LAUNCH_H_
