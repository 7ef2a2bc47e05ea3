// Decoding of jax_tma_moe_combine's calls, and the host check of their slots
// (moe_combine.h).
#include "ppermute/moe_combine.h"

#include <string>

namespace jax_tma {
namespace {

constexpr std::string_view kOp = kMoeCombineOp;

// y's SumKind: the float types the combine's kernels sum.
bool CombinedKind(ffi::DataType t, SumKind* kind) {
  int components = 0;
  return (t == ffi::DataType::F16 || t == ffi::DataType::BF16 || t == ffi::DataType::F32 ||
          t == ffi::DataType::F64) &&
         SumKindOf(t, kind, &components);
}

// weights or slots: (P, k) of `type`.
ffi::Error CheckPairArray(const char* name, const ffi::AnyBuffer& a, ffi::DataType type,
                          const char* why) {
  if (a.element_type() != type) {
    return InvalidArgument(kOp, name, " has element type ", DataTypeName(a.element_type()),
                           "; it takes ", DataTypeName(type), why);
  }
  if (a.dimensions().size() != 2) {
    return InvalidArgument(kOp, name, " must have rank 2 (pair rows, choices), got shape ",
                           ShapeOf(a.dimensions()));
  }
  if (a.size_bytes() != 0 && a.untyped_data() == nullptr) {
    return InvalidArgument(kOp, "null buffer for ", name);
  }
  return ffi::Error::Success();
}

}  // namespace

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
                            std::string_view site, int64_t timeout_ms, MoeCombineCall* call) {
  call->op = kOp;
  JAX_TMA_RETURN_IF_FAILED(ParseMethod(kOp, method, &call->method, TmaSpelling::kTma));
  const ffi::DataType type = y.element_type();
  if (!CombinedKind(type, &call->kind)) {
    return InvalidArgument(kOp, "y has element type ", DataTypeName(type),
                           "; the combine's kernel sums f16, bf16, f32 or f64 rows");
  }
  if (result->element_type() != type) {
    return InvalidArgument(kOp, "the result has element type ",
                           DataTypeName(result->element_type()), " but y has ",
                           DataTypeName(type));
  }
  const ffi::Span<const int64_t> y_dims = y.dimensions();
  const ffi::Span<const int64_t> res_dims = result->dimensions();
  if (y_dims.size() == 0 || !SameDims(y_dims, res_dims, 1)) {
    return InvalidArgument(kOp, "y and the result must have rows (dim 0) of one shape, got "
                                "shapes ", ShapeOf(y_dims), " and ", ShapeOf(res_dims));
  }
  const ffi::DataType acc = type == ffi::DataType::F64 ? ffi::DataType::F64 : ffi::DataType::F32;
  JAX_TMA_RETURN_IF_FAILED(CheckPairArray(
      "weights", weights, acc,
      acc == ffi::DataType::F64 ? " for f64 rows" : ", the sums' type, for f16, bf16 and f32 rows"));
  JAX_TMA_RETURN_IF_FAILED(CheckPairArray("slots", slots, ffi::DataType::S32, ""));
  if (!SameDims(slots.dimensions(), weights.dimensions())) {
    return InvalidArgument(kOp, "slots has shape ", ShapeOf(slots.dimensions()),
                           " but weights has ", ShapeOf(weights.dimensions()),
                           "; both are (pair rows, choices)");
  }
  JAX_TMA_RETURN_IF_FAILED(DecodeRaggedSlices(device, input_offsets, send_sizes, output_offsets,
                                              recv_sizes, devices, sources, positions, parts,
                                              ctas, process, processes, links, site,
                                              timeout_ms, call));
  size_t row_elements = 1;
  for (size_t i = 1; i < y_dims.size(); ++i) row_elements *= static_cast<size_t>(y_dims[i]);
  call->row_bytes = row_elements * ffi::ByteWidth(type);
  call->operand_rows = weights.dimensions()[0];
  call->output_rows = res_dims[0];
  call->y = y.untyped_data();
  call->y_rows = y_dims[0];
  call->weights = weights.untyped_data();
  call->slots = static_cast<const int32_t*>(slots.untyped_data());
  call->choices = weights.dimensions()[1];
  call->result = result->untyped_data();
  if ((y.size_bytes() != 0 && call->y == nullptr) ||
      (result->size_bytes() != 0 && call->result == nullptr)) {
    return InvalidArgument(kOp, "null buffer for a ", y.size_bytes(), "-byte y or a ",
                           result->size_bytes(), "-byte result");
  }
  return ffi::Error::Success();
}

ffi::Error CheckMoeCombineSlots(const MoeCombineCall& call) {
  for (int64_t e = 0; e < call.operand_rows * call.choices; ++e) {
    const int64_t slot = call.slots[e];
    if (slot < -1 || slot >= call.y_rows) {
      return InvalidArgument(kOp, "slots[", e / call.choices, ", ", e % call.choices, "] = ",
                             slot, " on ", call.Describe(call.self),
                             " is neither -1 nor a row of y's ", call.y_rows);
    }
  }
  return ffi::Error::Success();
}

}  // namespace jax_tma
