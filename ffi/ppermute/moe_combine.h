// The call of "jax_tma_moe_combine" (jax_tma.moe_combine's rows home),
// decoded and re-validated once from the FFI buffers and attributes, then
// shared by the CPU and CUDA handlers. Each participant of an exchange group
// sums, for each of its P pair rows r (one per (token, source device) it
// received), the weighted rows of y that the pair's choices here name:
//   row[r] = Σ_j y[slots[r, j]] · weights[r, j] over slots[r, j] >= 0,
// ascending j, each product rounded in the accumulator (f32; f64 for f64
// rows) before it is added (no fused multiply-add), the sum started from its
// first term (-0.0 stays -0.0), +0.0 where no choice is here, then rounded to
// y's dtype (ElementSum's conversions; a NaN sum is the positive quiet NaN).
// Those rows are the operand of a ragged exchange (ragged_all_to_all.h's
// slices, its four index arrays): each slice goes to its position's result,
// whose rows that no slice writes are unspecified. The sums are computed as
// the rows are sent (on a GPU: in PeerScatter's copy stage), never stored
// here.
#ifndef JAX_TMA_FFI_PPERMUTE_MOE_COMBINE_H_
#define JAX_TMA_FFI_PPERMUTE_MOE_COMBINE_H_

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include "common.h"
#include "element_sum.h"
#include "ppermute/ragged_all_to_all.h"

namespace jax_tma {

inline constexpr std::string_view kMoeCombineOp = "jax_tma.moe_combine";

// The context, operands, result and attributes of "jax_tma_moe_combine"
// after the platform's own context; the attributes are all_to_all's.
template <typename Binding>
auto BindMoeCombineCall(Binding binding) {
  return BindPeerCallTail(
      BindPeerRoute(BindPeerContext(std::move(binding))
                        .template Arg<ffi::AnyBuffer>()   // y
                        .template Arg<ffi::AnyBuffer>()   // weights
                        .template Arg<ffi::AnyBuffer>()   // slots
                        .template Arg<ffi::AnyBuffer>()   // input_offsets
                        .template Arg<ffi::AnyBuffer>()   // send_sizes
                        .template Arg<ffi::AnyBuffer>()   // output_offsets
                        .template Arg<ffi::AnyBuffer>()   // recv_sizes
                        .template Ret<ffi::AnyBuffer>())  // result
          .template Attr<ffi::Span<const int64_t>>("positions")  // positions
          .template Attr<int64_t>("parts")                       // parts
          .template Attr<std::string_view>("method")             // method
          .template Attr<int64_t>("ctas"));                      // ctas (CheckCtas)
}

// A call of "jax_tma_moe_combine", re-validated: the ragged exchange of its
// P summed rows (operand_rows = P; `operand` is null until a handler has the
// rows), and what the sums read (device memory on a GPU). The slots' values
// are checked by whoever reads them (the CPU handler: CheckMoeCombineSlots;
// the GPU: the exchange's meet kernel, before any copy).
struct MoeCombineCall : RaggedAllToAllCall {
  SumKind kind = SumKind::kF32;  // y's: kF16, kBF16, kF32 or kF64
  const void* y = nullptr;       // y_rows rows of row_bytes
  int64_t y_rows = 0;
  const void* weights = nullptr;  // P rows of `choices` accumulators (f32, f64 for f64 y)
  const int32_t* slots = nullptr;  // P rows of `choices`
  int64_t choices = 0;             // k
};

ffi::Error DecodeMoeCombine(int device, const ffi::AnyBuffer& y, const ffi::AnyBuffer& weights,
                            const ffi::AnyBuffer& slots, const ffi::AnyBuffer& input_offsets,
                            const ffi::AnyBuffer& send_sizes,
                            const ffi::AnyBuffer& output_offsets,
                            const ffi::AnyBuffer& recv_sizes,
                            ffi::Result<ffi::AnyBuffer>& result,
                            ffi::Span<const int64_t> devices, ffi::Span<const int64_t> sources,
                            ffi::Span<const int64_t> positions, int64_t parts,
                            std::string_view method, int64_t ctas, int64_t process,
                            ffi::Span<const int64_t> processes, std::string_view links,
                            std::string_view site, int64_t timeout_ms, MoeCombineCall* call);

// The host check of this participant's slots (host memory): each -1 or a
// row of y. The error names the op, the participant, the entry and its value.
ffi::Error CheckMoeCombineSlots(const MoeCombineCall& call);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PPERMUTE_MOE_COMBINE_H_
