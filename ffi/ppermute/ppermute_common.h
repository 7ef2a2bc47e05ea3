// The call of jax_tma.ppermute, decoded and re-validated once from the FFI
// buffers and attributes, then shared by the CPU and CUDA handlers: the
// method, the bytes to move and this device's part of the permutation.
#ifndef JAX_TMA_FFI_PPERMUTE_PPERMUTE_COMMON_H_
#define JAX_TMA_FFI_PPERMUTE_PPERMUTE_COMMON_H_

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common.h"
#include "peer/peer_exchange.h"

namespace jax_tma {

inline constexpr std::string_view kPpermuteOp = "jax_tma.ppermute";

// "(3, 4)" for dims [2, 3, 4] from 1 on, as Python writes a shape.
inline std::string ShapeOf(ffi::Span<const int64_t> dims, size_t from = 0) {
  Message m;
  m << "(";
  for (size_t i = from; i < dims.size(); ++i) {
    m << (i > from ? ", " : "") << dims[i];
  }
  m << (dims.size() - from == 1 ? ",)" : ")");
  return m.str();
}

// Whether a and b have the same rank and the same dims from `from` on.
inline bool SameDims(ffi::Span<const int64_t> a, ffi::Span<const int64_t> b, size_t from = 0) {
  if (a.size() != b.size()) return false;
  for (size_t i = from; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

// The context, operands, results and attributes that jax_tma's calls on the
// peer transport (ppermute, all_to_all, ragged_all_to_all) share: `Context`
// first, then the op's buffers, `Route` after them, the op's own attributes,
// and `Tail` last. `Head` is the whole front of a call of one operand and one
// result (ppermute's and all_to_all's).
template <typename Binding>
auto BindPeerContext(Binding&& binding) {
  return std::move(binding).template Ctx<ffi::DeviceOrdinal>()  // device
      .template Ctx<ffi::RunId>();                              // run
}
template <typename Binding>
auto BindPeerRoute(Binding&& binding) {
  return std::move(binding).template Attr<int64_t>("instance")  // instance
      .template Attr<ffi::Span<const int64_t>>("devices")       // devices
      .template Attr<ffi::Span<const int64_t>>("sources");      // sources
}
template <typename Binding>
auto BindPeerCallHead(Binding&& binding) {
  return BindPeerRoute(BindPeerContext(std::move(binding))
                           .template Arg<ffi::AnyBuffer>()   // x
                           .template Ret<ffi::AnyBuffer>());  // y
}
template <typename Binding>
auto BindPeerCallTail(Binding&& binding) {
  return std::move(binding).template Attr<int64_t>("process")  // process
      .template Attr<ffi::Span<const int64_t>>("processes")    // processes
      .template Attr<std::string_view>("links")                // links
      .template Attr<std::string_view>("site")                 // site
      .template Attr<int64_t>("timeout_ms");                   // timeout_ms
}

// The context, operands and attributes of "jax_tma_ppermute" after the
// platform's own context (the stream on CUDA, none on the CPU).
template <typename Binding>
auto BindPpermuteCall(Binding binding) {
  return BindPeerCallTail(BindPeerCallHead(std::move(binding))
                              .template Attr<bool>("push")                 // push
                              .template Attr<std::string_view>("method"));  // method
}

// The "ctas" attribute of the exchanges that copy rows (ragged_all_to_all,
// moe_dispatch): on a GPU, at most that many CTAs copy at once, so the copy
// holds at most that many SMs, but one for each copy of the call (a slice,
// or a source's rows) at least (peer_copy.h's launchers, max_ctas); 0: as
// many as the device's plan takes.
inline ffi::Error CheckCtas(std::string_view op, int64_t ctas) {
  if (ctas < 0) {
    return InvalidArgument(op, "ctas must be >= 0 (0: the device's choice), got ", ctas);
  }
  return ffi::Error::Success();
}

// Checks the attributes Python passes (device ordinals and processes by
// logical id, and per logical id the logical id it receives from or -1) and
// finds the part of `device` of process `process`.
inline ffi::Error RoutePermute(int device, int process, ffi::Span<const int64_t> devices,
                               ffi::Span<const int64_t> processes,
                               ffi::Span<const int64_t> sources, bool push,
                               PermuteRoute* route) {
  const int64_t n = static_cast<int64_t>(devices.size());
  if (n < 1 || static_cast<int64_t>(sources.size()) != n ||
      static_cast<int64_t>(processes.size()) != n) {
    return InvalidArgument(kPpermuteOp, "devices has ", n, " entries, sources ", sources.size(),
                           " and processes ", processes.size(),
                           "; each needs one entry per device");
  }
  route->size = static_cast<int>(n);
  route->self = -1;
  route->push = push;
  route->devices.assign(devices.begin(), devices.end());
  route->sources.assign(sources.begin(), sources.end());
  std::vector<int> receivers(n, -1);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < i; ++j) {
      if (devices[i] == devices[j] && processes[i] == processes[j]) {
        return InvalidArgument(kPpermuteOp, "device ", devices[i], " of process ", processes[i],
                               " appears twice in devices (positions ", j, " and ", i, ")");
      }
    }
    const int64_t s = sources[i];
    if (s < -1 || s >= n) {
      return InvalidArgument(kPpermuteOp, "sources[", i, "] = ", s,
                             " is not a position in [0, ", n, ") or -1");
    }
    if (s >= 0) {
      if (receivers[s] >= 0) {
        return InvalidArgument(kPpermuteOp, "position ", s,
                               " is the source of both ", receivers[s], " and ",
                               i, "; sources must be a permutation");
      }
      receivers[s] = static_cast<int>(i);
    }
    if (devices[i] == device && processes[i] == process) route->self = static_cast<int>(i);
  }
  if (route->self < 0) {
    return InvalidArgument(kPpermuteOp, "device ", device, " of process ", process,
                           " is not among the devices of this ppermute");
  }
  route->source = static_cast<int>(sources[route->self]);
  route->destination = receivers[route->self];
  return ffi::Error::Success();
}

// A call of "jax_tma_ppermute", re-validated: the method, the bytes to move,
// this device's part and where the participants live.
struct PpermuteCall {
  Method method = Method::kAuto;
  ByteCopy bytes;
  PermuteRoute route;
  ProcessPlan where;
};

inline ffi::Error DecodePpermute(int device, const ffi::AnyBuffer& x,
                                 ffi::Result<ffi::AnyBuffer>& y,
                                 ffi::Span<const int64_t> devices,
                                 ffi::Span<const int64_t> sources, bool push,
                                 std::string_view method, int64_t process,
                                 ffi::Span<const int64_t> processes, std::string_view links,
                                 std::string_view site, int64_t timeout_ms,
                                 PpermuteCall* call) {
  JAX_TMA_RETURN_IF_FAILED(
      ParseMethod(kPpermuteOp, method, &call->method, TmaSpelling::kTmaOrBulk));
  JAX_TMA_RETURN_IF_FAILED(CheckWholeCopy(kPpermuteOp, x, y, &call->bytes));
  if (process < 0 || process > std::numeric_limits<int>::max()) {
    return InvalidArgument(kPpermuteOp, "process must be in [0, ",
                           std::numeric_limits<int>::max(), "], got ", process);
  }
  JAX_TMA_RETURN_IF_FAILED(RoutePermute(device, static_cast<int>(process), devices, processes,
                                        sources, push, &call->route));
  return DecodeProcessPlan(process, processes, links, site, timeout_ms, devices.size(),
                           &call->where);
}

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PPERMUTE_PPERMUTE_COMMON_H_
