// Host rule of jax_tma.ppermute's CUDA path: which copy kernel moves the
// block. Peer copies are latency-bound at every size, which is what the TMA
// bulk pipeline's many bytes in flight per SM are for, so method "auto" takes
// it wherever the GPU has TMA. Each copy is then planned against the
// partner's address (PlanCopy).
#ifndef JAX_TMA_FFI_PPERMUTE_PPERMUTE_PLAN_H_
#define JAX_TMA_FFI_PPERMUTE_PPERMUTE_PLAN_H_

#include "common.h"
#include "cuda/device_info.h"
#include "ppermute/ppermute_common.h"

namespace jax_tma {

struct PpermutePlan {
  Method method = Method::kSimt;  // kTma or kSimt, for PlanCopy
  DeviceInfo info;
};

inline ffi::Error PlanPpermute(const PpermuteCall& call, const DeviceInfo& info,
                               PpermutePlan* plan) {
  plan->info = info;
  plan->method = call.method;
  if (call.method == Method::kAuto) plan->method = info.has_tma() ? Method::kTma : Method::kSimt;
  return ffi::Error::Success();
}

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PPERMUTE_PPERMUTE_PLAN_H_
