// The routing plan of jax_tma.moe_dispatch (jax_tma/_moe.py, _plan_sends) as
// two calls around the exchange of its counts, shared by the CPU handlers
// (moe_dispatch_plan.cc) and the CUDA kernels (moe_dispatch_plan.cu):
//
//   "jax_tma_moe_dispatch_counts"  ids (..., T, k) int32 -> send (..., n, E + n + 1)
//       int32: every row i the same counts (the valid choices of each expert,
//       the tokens with a choice on each device) and, last, i: the position
//       that the tiled all_to_all sends row i to.
//   "jax_tma_moe_dispatch_plan"  ids, table (..., n, E + n + 1) int32 (what that
//       all_to_all delivered: row s from position s) -> group (..., E / n),
//       dropped (..., T, k) bool, routes (..., n, 5), pair_token (..., P),
//       choice_row (..., T, k), sent (..., P, k + 1), all int32 but dropped;
//       P = T * min(k, n).
//
// A choice (t, j) is valid where its id is in [0, E); its device is id / (E /
// n). Leading dims are a batch (vmap), each member its own plan. The results
// are _plan_sends's, bit for bit: with me = the table's last entry,
//   rank      the valid choices of the same expert before it in (t, j) order;
//   place     the table's counts of that expert from positions below me, plus rank;
//   kept      valid and (no capacity, or place < capacity);
//   slot      the expert's start among its device's kept rows (the kept totals
//             of lower experts there, each min(total, capacity)), plus place; -1
//             where not kept;
//   pair rows the (token, device) pairs of a valid choice, device-major, then by
//             token, from row 0; pair_token[row] = its token, T past them;
//   sent      (pair_token, then each choice's slot where it is on the row's
//             device, -1 elsewhere) a row, (T, -1, ...) past the pairs;
//   choice_row  the pair row of a valid choice, -1 for the others;
//   dropped   valid and not kept;
//   routes[i] (the first pair row to device i, the pairs to it, me * T, the
//             pairs position i sends here, the pairs position i sends below
//             me: the table's);
//   group     the kept totals of me's experts.
// Sums of the table's entries wrap modulo 2^32 (int32 two's complement), so
// that any table gives the same bits on every platform; a table whose last
// entry is not a position fails the call (on a GPU, a trap). The counts'
// exchange gives neither.
#ifndef JAX_TMA_FFI_PPERMUTE_MOE_DISPATCH_PLAN_H_
#define JAX_TMA_FFI_PPERMUTE_MOE_DISPATCH_PLAN_H_

#include <cstdint>
#include <string_view>
#include <utility>

#include "common.h"

namespace jax_tma {

inline constexpr std::string_view kMoePlanOp = "jax_tma.moe_dispatch";

// The plan's limits, where one CTA holds a member's experts and slots and
// each warp's count of every expert and device in shared memory (Python
// takes its jnp formulation beyond them: at DeepEP's 32,768 choices, XLA's
// kernels spread over the GPU are faster than one CTA).
inline constexpr int64_t kMoePlanMaxExperts = 256;
inline constexpr int64_t kMoePlanMaxParts = 64;
inline constexpr int64_t kMoePlanMaxChoices = 4096;  // T * k: a decode step's
// The columns of routes (above).
inline constexpr int64_t kMoePlanColumns = 5;

// The operands, results and attributes of "jax_tma_moe_dispatch_counts" and of
// "jax_tma_moe_dispatch_plan" after the platform's own context.
template <typename Binding>
auto BindMoeDispatchCountsCall(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()  // ids
      .template Ret<ffi::AnyBuffer>()  // send
      .template Attr<int64_t>("experts")
      .template Attr<int64_t>("parts");
}

template <typename Binding>
auto BindMoeDispatchPlanCall(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()  // ids
      .template Arg<ffi::AnyBuffer>()  // table
      .template Ret<ffi::AnyBuffer>()  // group
      .template Ret<ffi::AnyBuffer>()  // dropped
      .template Ret<ffi::AnyBuffer>()  // routes
      .template Ret<ffi::AnyBuffer>()  // pair_token
      .template Ret<ffi::AnyBuffer>()  // choice_row
      .template Ret<ffi::AnyBuffer>()  // sent
      .template Attr<int64_t>("experts")
      .template Attr<int64_t>("parts")
      .template Attr<int64_t>("capacity");
}

// A call's shape after its checks.
struct MoePlanShape {
  int64_t batch = 1;      // the product of the leading dims
  int64_t tokens = 0;     // T
  int64_t choices = 0;    // k
  int64_t experts = 0;    // E
  int64_t parts = 0;      // n
  int64_t capacity = -1;  // -1: none
  int64_t Local() const { return experts / parts; }
  int64_t Width() const { return experts + parts + 1; }  // a table row
  int64_t Pairs() const { return tokens * (choices < parts ? choices : parts); }
};

// The shape of "jax_tma_moe_dispatch_counts" (ids, send), checked: int32 ids of
// rank >= 2 with k >= 1, T * k, E and n within the limits above,
// E a multiple of n, and send (..., n, E + n + 1) with ids' leading dims.
ffi::Error DecodeMoeDispatchCounts(const ffi::AnyBuffer& ids, const ffi::AnyBuffer& send,
                                   int64_t experts, int64_t parts, MoePlanShape* shape);

// The results of "jax_tma_moe_dispatch_plan", in their order.
struct MoePlanResults {
  int32_t* group = nullptr;
  bool* dropped = nullptr;
  int32_t* routes = nullptr;
  int32_t* pair_token = nullptr;
  int32_t* choice_row = nullptr;
  int32_t* sent = nullptr;
};

// The shape of "jax_tma_moe_dispatch_plan", checked as above, and the table and every
// result shaped as the header says; capacity -1 or >= 0.
ffi::Error DecodeMoeDispatchPlan(const ffi::AnyBuffer& ids, const ffi::AnyBuffer& table,
                                 ffi::Result<ffi::AnyBuffer>& group,
                                 ffi::Result<ffi::AnyBuffer>& dropped,
                                 ffi::Result<ffi::AnyBuffer>& routes,
                                 ffi::Result<ffi::AnyBuffer>& pair_token,
                                 ffi::Result<ffi::AnyBuffer>& choice_row,
                                 ffi::Result<ffi::AnyBuffer>& sent, int64_t experts, int64_t parts,
                                 int64_t capacity, MoePlanShape* shape, MoePlanResults* results);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PPERMUTE_MOE_DISPATCH_PLAN_H_
