// The call of "jax_tma_moe_dispatch" (the token rows' exchange of
// jax_tma.moe_dispatch), decoded and re-validated once from the FFI buffers
// and attributes, then shared by the CPU and CUDA handlers. Each participant
// of an exchange group (all_to_all's: ExchangeGroup, `parts` positions) has
// T operand rows, its pairs in send order (`sent`: P rows of k + 1 int32, a
// token, then the slots of its choices on the pair's device, -1 elsewhere;
// rows past the pairs have token T) and its plan's `routes` (parts rows of
// kMoePlanColumns, moe_dispatch_plan.h). From each position s of its group
// (its own included) it reads the routes[s, 3] pairs that start at row
// routes[s, 4] of s's `sent`, and for pair i the row of its token from s's
// operand, once, which it writes to each of the pair's slots >= 0 of its
// result; row s * T + i of its `slots` result gets the pair's slots (-1
// where its token is T), the rows past what s sends -1. A row crosses the
// link once, whatever its slots. The result's rows that no slot names are
// unspecified. Step k (1 .. parts - 1) reads the operand and `sent` of the
// participant at position + k, which publishes both to its readers and ends
// its call once they are done reading: the pairs travel with the rows, in
// the meeting the rows need anyway.
#ifndef JAX_TMA_FFI_PPERMUTE_MOE_DISPATCH_H_
#define JAX_TMA_FFI_PPERMUTE_MOE_DISPATCH_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "common.h"
#include "ppermute/all_to_all.h"
#include "ppermute/moe_dispatch_plan.h"
#include "ppermute/ppermute_common.h"

namespace jax_tma {

inline constexpr std::string_view kMoeDispatchOp = "jax_tma.moe_dispatch";

// The context, operands, result and attributes of "jax_tma_moe_dispatch" after
// the platform's own context; the attributes are all_to_all's.
template <typename Binding>
auto BindMoeDispatchCall(Binding binding) {
  return BindPeerCallTail(
      BindPeerRoute(BindPeerContext(std::move(binding))
                        .template Arg<ffi::AnyBuffer>()   // operand
                        .template Arg<ffi::AnyBuffer>()   // sent
                        .template Arg<ffi::AnyBuffer>()   // routes
                        .template Ret<ffi::AnyBuffer>()   // result
                        .template Ret<ffi::AnyBuffer>())  // slots
          .template Attr<ffi::Span<const int64_t>>("positions")  // positions
          .template Attr<int64_t>("parts")                       // parts
          .template Attr<std::string_view>("method")             // method
          .template Attr<int64_t>("ctas"));                      // ctas (CheckCtas)
}

// A call of "jax_tma_moe_dispatch", re-validated: the group, the row arrays
// and the int32 index arrays (device memory on a GPU). Their values are
// checked by their owner before any reader sees them (the CPU handler:
// CheckMoeDispatchIndices; the GPU: the pull's meet kernel).
struct MoeDispatchCall : ExchangeGroup {
  Method method = Method::kAuto;
  int64_t ctas = 0;               // CheckCtas
  const void* operand = nullptr;  // per_part rows of row_bytes
  void* result = nullptr;         // result_rows rows
  int64_t result_rows = 0;
  size_t row_bytes = 0;
  const int32_t* sent = nullptr;    // pairs rows of choices + 1
  const int32_t* routes = nullptr;  // parts rows of kMoePlanColumns
  int32_t* slots = nullptr;         // parts * per_part rows of choices
  int64_t per_part = 0;             // T: the operand's rows, the most pairs a position sends here
  int64_t pairs = 0;                // P
  int64_t choices = 0;              // k: the slots a row may fill
  bool checked = false;             // CheckMoeDispatchIndices passed (the CPU handler's)
};

ffi::Error DecodeMoeDispatch(int device, const ffi::AnyBuffer& operand,
                          const ffi::AnyBuffer& sent, const ffi::AnyBuffer& routes,
                          ffi::Result<ffi::AnyBuffer>& result, ffi::Result<ffi::AnyBuffer>& slots,
                          ffi::Span<const int64_t> devices, ffi::Span<const int64_t> sources,
                          ffi::Span<const int64_t> positions, int64_t parts,
                          std::string_view method, int64_t ctas, int64_t process,
                          ffi::Span<const int64_t> processes, std::string_view links,
                          std::string_view site, int64_t timeout_ms, MoeDispatchCall* call);

// The host check of this participant's index values (host memory), which
// its readers rely on: in each row s of routes, the pairs it sends to s
// (column 1) and those s sends here (column 3) in [0, T], where they start
// (columns 0 and 4) in [0, P - their count]; each row of sent's token in
// [0, T] and its slots -1 or rows of the result (every participant's result
// has the same rows). The error names the op, the participant, the array,
// the entry and its value.
ffi::Error CheckMoeDispatchIndices(const MoeDispatchCall& call);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PPERMUTE_MOE_DISPATCH_H_
