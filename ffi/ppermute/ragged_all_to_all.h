// The call of jax_tma.ragged_all_to_all, decoded and re-validated once from
// the FFI buffers and attributes, then shared by the CPU and CUDA handlers.
// The operand and the output are row arrays (dim 0: rows; a row is the
// product of the other dims times the element size, the same for both); the
// result is the output with the received rows written (Python aliases the
// two, so the call writes in place); an output of no rows gives a result of
// rows of its own, where the rows no slice writes are unspecified. Four index arrays of N entries, one type
// (s32 or s64), say which rows move: slice i, rows
// [input_offsets[i], input_offsets[i] + send_sizes[i]) of the operand, goes to
// the participant at position i / S of this one's group (S = N / parts
// slices each) and lands at rows [output_offsets[i], ... + send_sizes[i]) of
// its output; recv_sizes[i] is the size of the slice received from position
// i / S, the one it sends as its slice (this position) * S + i % S.
// The group is all_to_all's (ExchangeGroup): the slices that stay are copied
// locally, then `parts` - 1 steps each push one position's slices.
#ifndef JAX_TMA_FFI_PPERMUTE_RAGGED_ALL_TO_ALL_H_
#define JAX_TMA_FFI_PPERMUTE_RAGGED_ALL_TO_ALL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common.h"
#include "ppermute/all_to_all.h"
#include "ppermute/ppermute_common.h"

namespace jax_tma {

inline constexpr std::string_view kRaggedAllToAllOp = "jax_tma.ragged_all_to_all";

// The context, operands, result and attributes of
// "jax_tma_ragged_all_to_all" after the platform's own context; the
// attributes are all_to_all's.
template <typename Binding>
auto BindRaggedAllToAllCall(Binding binding) {
  return BindPeerCallTail(
      BindPeerRoute(BindPeerContext(std::move(binding))
                        .template Arg<ffi::AnyBuffer>()   // operand
                        .template Arg<ffi::AnyBuffer>()   // output
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

// A call of "jax_tma_ragged_all_to_all", re-validated: the group (positions,
// steps, where the participants live: ExchangeGroup), the row arrays and the
// index arrays. The index arrays' values are checked by whoever reads them
// (the CPU handler on the host: CheckOwnSlices, CheckReceived).
struct RaggedAllToAllCall : ExchangeGroup {
  std::string_view op = kRaggedAllToAllOp;  // what errors name
  Method method = Method::kAuto;
  int64_t ctas = 0;               // CheckCtas
  const void* operand = nullptr;  // operand_rows rows of row_bytes
  int64_t operand_rows = 0;
  const void* output = nullptr;  // output_rows rows of row_bytes, or none
  void* result = nullptr;        // output_rows rows: output, then what arrives
  int64_t output_rows = 0;
  size_t row_bytes = 0;
  // The four index arrays, `slices` entries each, of `index_type` (S32 or
  // S64); device memory on a GPU.
  ffi::DataType index_type = ffi::DataType::S64;
  const void* input_offsets = nullptr;
  const void* send_sizes = nullptr;
  const void* output_offsets = nullptr;
  const void* recv_sizes = nullptr;
  int64_t slices = 0;            // N
  int64_t slices_per_part = 0;   // S = N / parts: the slices of each position

  size_t index_bytes() const { return index_type == ffi::DataType::S32 ? 4 : 8; }
  // The first slice for (or, in recv_sizes, from) the participant at
  // position `p`.
  int64_t FirstSlice(int p) const { return p * slices_per_part; }
  // Entry i of an index array in host memory (the CPU handler's buffers).
  int64_t HostIndex(const void* array, int64_t i) const {
    return index_type == ffi::DataType::S32 ? static_cast<const int32_t*>(array)[i]
                                            : static_cast<const int64_t*>(array)[i];
  }
};

ffi::Error DecodeRaggedAllToAll(
    int device, const ffi::AnyBuffer& operand, const ffi::AnyBuffer& output,
    const ffi::AnyBuffer& input_offsets, const ffi::AnyBuffer& send_sizes,
    const ffi::AnyBuffer& output_offsets, const ffi::AnyBuffer& recv_sizes,
    ffi::Result<ffi::AnyBuffer>& result, ffi::Span<const int64_t> devices,
    ffi::Span<const int64_t> sources, ffi::Span<const int64_t> positions, int64_t parts,
    std::string_view method, int64_t ctas, int64_t process, ffi::Span<const int64_t> processes,
    std::string_view links, std::string_view site, int64_t timeout_ms,
    RaggedAllToAllCall* call);

// The index arrays and the group of a ragged exchange of `call->op` whose
// rows (operand_rows, output_rows, row_bytes) are set by the caller: the
// arrays' types and shapes, the group (ExchangeGroup), a whole number of
// slices a position, and `ctas`.
ffi::Error DecodeRaggedSlices(int device, const ffi::AnyBuffer& input_offsets,
                              const ffi::AnyBuffer& send_sizes,
                              const ffi::AnyBuffer& output_offsets,
                              const ffi::AnyBuffer& recv_sizes, ffi::Span<const int64_t> devices,
                              ffi::Span<const int64_t> sources,
                              ffi::Span<const int64_t> positions, int64_t parts, int64_t ctas,
                              int64_t process, ffi::Span<const int64_t> processes,
                              std::string_view links, std::string_view site, int64_t timeout_ms,
                              RaggedAllToAllCall* call);

// The exchange of a decoded call on the host (ragged_all_to_all_cpu.cc),
// after the output's rows are in the result: the index values checked
// (below), the slices that stay copied, then each step, which meets its
// partners whatever the checks found (so that none waits for this one) but
// sends no rows where they failed. `checks`: the caller's own, of what made
// the operand (a failure there sends nothing either). `instance` and `run`
// are the call's (steps meet under instance + k - 1). Returns the first
// failure.
ffi::Error RunRaggedAllToAllCpu(const RaggedAllToAllCall& call, int64_t instance,
                                ffi::RunId run, ffi::Error checks = ffi::Error::Success());

// The checks of the index values, on the host. Each error names the op, the
// participant, the array, the entry and its value.
//
// This participant's own arrays: every offset and size non-negative, each
// slice inside the operand and, at its output offset, inside an output of
// output_rows rows (every participant's output has the same rows).
ffi::Error CheckOwnSlices(const RaggedAllToAllCall& call);

// The slices that the participant at logical id `from` sends to this one
// (`receiver`): sizes[t] and output_offsets[t] of its slice
// FirstSlice(receiver.position) + t, for t < slices_per_part. Each must be
// the size this one expects (recv_sizes) and land inside its output.
ffi::Error CheckReceived(const RaggedAllToAllCall& receiver, const std::string& sender,
                         int sender_position, const std::vector<int64_t>& sizes,
                         const std::vector<int64_t>& output_offsets);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PPERMUTE_RAGGED_ALL_TO_ALL_H_
