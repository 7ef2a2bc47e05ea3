// CPU handler for jax_tma.ppermute: every host device's part meets the others
// through the same rendezvous as the CUDA handler and copies straight between
// the two devices' buffers (pull or push, as on the GPU), or writes zeros.
// Where the devices live in several processes of one host, the blocks travel
// over the process link instead (peer/peer_exchange.h).
#include <cstring>
#include <string_view>

#include "handlers.h"
#include "path_counts.h"
#include "peer/peer_exchange.h"
#include "peer/peer_rendezvous.h"
#include "ppermute/ppermute_common.h"

namespace jax_tma {

static ffi::Error PpermuteCpuImpl(int32_t device, ffi::RunId run,
                                  ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                                  int64_t instance, ffi::Span<const int64_t> devices,
                                  ffi::Span<const int64_t> sources, bool push,
                                  std::string_view method, int64_t process,
                                  ffi::Span<const int64_t> processes, std::string_view links,
                                  std::string_view site, int64_t timeout_ms) {
  PpermuteCall call;  // every method is the same memcpy on the host
  JAX_TMA_RETURN_IF_FAILED(DecodePpermute(device, x, y, devices, sources, push, method,
                                          process, processes, links, site, timeout_ms, &call));
  const ByteCopy& c = call.bytes;
  const PermuteRoute& route = call.route;
  // Every participant has the same block size, so all skip together.
  if (c.bytes == 0) return ffi::Error::Success();
  CountPath(Path::kPpermuteCpu);
  if (call.where.spans_processes()) {
    return ExchangeAcrossProcesses(route, call.where, c.src, c.dst, c.bytes);
  }
  if (route.source < 0) std::memset(c.dst, 0, c.bytes);
  void* published = push ? c.dst : const_cast<void*>(c.src);
  // Each step is synchronous on the host, so reaching Depart means this
  // device's copy is finished and returning after it means the peer's is.
  return ExchangeBlocks(
      instance, route, call.where.timeout, PermuteBlock{run.run_id, published},
      [&](const PermuteBlock* partner) {
        if (partner != nullptr) {
          if (push) {
            std::memcpy(partner->data, c.src, c.bytes);
          } else {
            std::memcpy(c.dst, partner->data, c.bytes);
          }
        }
        return ffi::Error::Success();
      },
      [](void*) { return ffi::Error::Success(); });
}

}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTmaPpermuteCpu, jax_tma::PpermuteCpuImpl,
                              jax_tma::BindPpermuteCall(xla::ffi::Ffi::Bind()));
