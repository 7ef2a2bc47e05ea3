// Launcher of jax_tma.ppermute's CUDA path: this device's part of one call,
// the copy between its own buffer and its partner's, in this process (peer
// access) or another one of this host (mapped VMM allocations), with the
// device-side transport of peer_copy.h: no staging buffer, no NCCL, no host
// meeting after the first call of a lowered ppermute on a device. That first
// call exchanges the participants' mailboxes (ExchangeAtSite).
#ifndef JAX_TMA_FFI_PPERMUTE_PPERMUTE_LAUNCH_H_
#define JAX_TMA_FFI_PPERMUTE_PPERMUTE_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ppermute/ppermute_common.h"
#include "ppermute/ppermute_plan.h"

namespace jax_tma {

// Runs this device's part of `call` as `plan` says on `stream`. `instance`
// names the lowered ppermute.
ffi::Error LaunchPpermute(const PpermuteCall& call, const PpermutePlan& plan, int64_t instance,
                          cudaStream_t stream, int device);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PPERMUTE_PPERMUTE_LAUNCH_H_
