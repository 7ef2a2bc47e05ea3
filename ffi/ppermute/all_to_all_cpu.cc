// CPU handler for jax_tma.all_to_all: the chunk that stays is copied, then
// each step of the exchange (all_to_all.h) meets through ppermute's
// rendezvous and pushes one chunk into the destination's result with
// memcpy; where the devices live in several processes of one host, each
// step's chunks travel over the process link instead.
#include <cstring>
#include <string_view>

#include "handlers.h"
#include "path_counts.h"
#include "ppermute/all_to_all.h"
#include "peer/peer_rendezvous.h"

namespace jax_tma {

static ffi::Error AllToAllCpuImpl(int32_t device, ffi::RunId run, ffi::AnyBuffer x,
                                  ffi::Result<ffi::AnyBuffer> y, int64_t instance,
                                  ffi::Span<const int64_t> devices,
                                  ffi::Span<const int64_t> sources,
                                  ffi::Span<const int64_t> positions, int64_t parts,
                                  std::string_view method, int64_t process,
                                  ffi::Span<const int64_t> processes, std::string_view links,
                                  std::string_view site, int64_t timeout_ms) {
  AllToAllCall call;  // every method is the same memcpy on the host
  JAX_TMA_RETURN_IF_FAILED(DecodeAllToAll(device, x, y, devices, sources, positions, parts,
                                          method, process, processes, links, site, timeout_ms,
                                          &call));
  // Every participant has the same chunk size, so all skip together.
  if (call.bytes.bytes == 0) return ffi::Error::Success();
  CountPath(Path::kAllToAllCpu);
  const ByteCopy local = call.Local();
  std::memcpy(local.dst, local.src, local.bytes);
  for (int k = 1; k < call.parts; ++k) {
    const PermuteRoute& route = call.steps[k - 1];
    const ByteCopy c = call.Step(k);
    if (call.where.spans_processes()) {
      JAX_TMA_RETURN_IF_FAILED(
          ExchangeAcrossProcesses(route, call.StepPlan(k), c.src, c.dst, c.bytes));
      continue;
    }
    // Step k meets under its own instance (Python numbers the steps of a
    // lowered all_to_all consecutively from `instance`).
    JAX_TMA_RETURN_IF_FAILED(ExchangeBlocks(
        instance + k - 1, route, call.where.timeout, PermuteBlock{run.run_id, c.dst},
        [&](const PermuteBlock* partner) {
          std::memcpy(partner->data, c.src, c.bytes);
          return ffi::Error::Success();
        },
        [](void*) { return ffi::Error::Success(); }));
  }
  return ffi::Error::Success();
}

}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTmaAllToAllCpu, jax_tma::AllToAllCpuImpl,
                              jax_tma::BindAllToAllCall(xla::ffi::Ffi::Bind()));
