// The call of "jax_tma_moe_dispatch" (the token rows' exchange of
// jax_tma.moe_dispatch), decoded and re-validated once from the FFI buffers
// and attributes, then shared by the CPU and CUDA handlers. Each participant
// of an exchange group (all_to_all's: ExchangeGroup, `parts` positions)
// reads, from the operand of every position s of its group (its own
// included), the rows tokens[s * T + i] for i < recv_sizes[s] (T: tokens'
// entries / parts), and writes each to the rows slots[s * T + i][j] >= 0 of
// its result: a row crosses the link once, whatever its slots. The result's
// rows that no slot names are unspecified. Step k (1 .. parts - 1) reads the
// operand of the participant at position + k, which publishes it to its
// readers and ends its call once they are done reading.
#ifndef JAX_TMA_FFI_PPERMUTE_MOE_DISPATCH_H_
#define JAX_TMA_FFI_PPERMUTE_MOE_DISPATCH_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "common.h"
#include "ppermute/all_to_all.h"
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
                        .template Arg<ffi::AnyBuffer>()   // tokens
                        .template Arg<ffi::AnyBuffer>()   // slots
                        .template Arg<ffi::AnyBuffer>()   // recv_sizes
                        .template Ret<ffi::AnyBuffer>())  // result
          .template Attr<ffi::Span<const int64_t>>("positions")  // positions
          .template Attr<int64_t>("parts")                       // parts
          .template Attr<std::string_view>("method")             // method
          .template Attr<int64_t>("ctas"));                      // ctas (CheckCtas)
}

// A call of "jax_tma_moe_dispatch", re-validated: the group, the row arrays
// and the int32 index arrays (device memory on a GPU). Their values are
// checked by whoever reads them (the CPU handler: CheckMoeDispatchIndices; the GPU:
// its copy kernel, before any copy).
struct MoeDispatchCall : ExchangeGroup {
  Method method = Method::kAuto;
  int64_t ctas = 0;               // CheckCtas
  const void* operand = nullptr;  // operand_rows rows of row_bytes
  int64_t operand_rows = 0;
  void* result = nullptr;  // result_rows rows
  int64_t result_rows = 0;
  size_t row_bytes = 0;
  const int32_t* tokens = nullptr;      // parts * per_part
  const int32_t* slots = nullptr;       // parts * per_part rows of `choices`
  const int32_t* recv_sizes = nullptr;  // parts
  int64_t per_part = 0;                 // T: the rows a position may send here
  int64_t choices = 0;                  // k: the slots a row may fill
};

ffi::Error DecodeMoeDispatch(int device, const ffi::AnyBuffer& operand,
                          const ffi::AnyBuffer& tokens, const ffi::AnyBuffer& slots,
                          const ffi::AnyBuffer& recv_sizes, ffi::Result<ffi::AnyBuffer>& result,
                          ffi::Span<const int64_t> devices, ffi::Span<const int64_t> sources,
                          ffi::Span<const int64_t> positions, int64_t parts,
                          std::string_view method, int64_t ctas, int64_t process,
                          ffi::Span<const int64_t> processes, std::string_view links,
                          std::string_view site, int64_t timeout_ms, MoeDispatchCall* call);

// The host check of this participant's index values (host memory): each
// recv_sizes entry in [0, T], each token it reads inside the operand's rows
// (every position's operand has the same), each of their slots -1 or a row
// of the result. The error names the op, the participant, the array, the
// entry and its value.
ffi::Error CheckMoeDispatchIndices(const MoeDispatchCall& call);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PPERMUTE_MOE_DISPATCH_H_
