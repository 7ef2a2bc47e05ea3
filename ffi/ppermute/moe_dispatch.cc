// Decoding of jax_tma_moe_dispatch's calls, and the host check of their index
// values (moe_dispatch.h).
#include "ppermute/moe_dispatch.h"

#include <string>

namespace jax_tma {
namespace {

constexpr std::string_view kOp = kMoeDispatchOp;

// An int32 index array of `rank` dims, the first `rows`.
ffi::Error CheckIndexArray(const char* name, const ffi::AnyBuffer& a, size_t rank) {
  if (a.element_type() != ffi::DataType::S32) {
    return InvalidArgument(kOp, name, " has element type ", DataTypeName(a.element_type()),
                           "; it takes s32");
  }
  if (a.dimensions().size() != rank) {
    return InvalidArgument(kOp, name, " must have rank ", rank, ", got shape ",
                           ShapeOf(a.dimensions()));
  }
  if (a.size_bytes() != 0 && a.untyped_data() == nullptr) {
    return InvalidArgument(kOp, "null buffer for ", name);
  }
  return ffi::Error::Success();
}

}  // namespace

ffi::Error DecodeMoeDispatch(int device, const ffi::AnyBuffer& operand,
                          const ffi::AnyBuffer& tokens, const ffi::AnyBuffer& slots,
                          const ffi::AnyBuffer& recv_sizes, ffi::Result<ffi::AnyBuffer>& result,
                          ffi::Span<const int64_t> devices, ffi::Span<const int64_t> sources,
                          ffi::Span<const int64_t> positions, int64_t parts,
                          std::string_view method, int64_t ctas, int64_t process,
                          ffi::Span<const int64_t> processes, std::string_view links,
                          std::string_view site, int64_t timeout_ms, MoeDispatchCall* call) {
  JAX_TMA_RETURN_IF_FAILED(ParseMethod(kOp, method, &call->method, TmaSpelling::kTma));
  const ffi::DataType type = operand.element_type();
  if (result->element_type() != type) {
    return InvalidArgument(kOp, "the result has element type ",
                           DataTypeName(result->element_type()), " but operand has ",
                           DataTypeName(type));
  }
  if (IsSubByte(type)) {
    return InvalidArgument(kOp, "sub-byte element type ", DataTypeName(type),
                           " must be widened before the call");
  }
  const ffi::Span<const int64_t> in_dims = operand.dimensions();
  const ffi::Span<const int64_t> out_dims = result->dimensions();
  if (in_dims.size() == 0 || !SameDims(in_dims, out_dims, 1)) {
    return InvalidArgument(kOp, "operand and result must have rows (dim 0) of one shape, got "
                                "shapes ", ShapeOf(in_dims), " and ", ShapeOf(out_dims));
  }
  JAX_TMA_RETURN_IF_FAILED(CheckIndexArray("tokens", tokens, 1));
  JAX_TMA_RETURN_IF_FAILED(CheckIndexArray("slots", slots, 2));
  JAX_TMA_RETURN_IF_FAILED(CheckIndexArray("recv_sizes", recv_sizes, 1));
  JAX_TMA_RETURN_IF_FAILED(DecodeExchangeGroup(kOp, device, devices, sources, positions, parts,
                                               process, processes, links, site, timeout_ms,
                                               call));
  const int64_t entries = tokens.dimensions()[0];
  if (slots.dimensions()[0] != entries || entries % parts != 0 ||
      recv_sizes.dimensions()[0] != parts) {
    return InvalidArgument(kOp, "tokens has ", entries, " entries, slots shape ",
                           ShapeOf(slots.dimensions()), " and recv_sizes ",
                           recv_sizes.dimensions()[0], " entries; they must be T * ", parts,
                           " entries, (T * ", parts, ", k) and ", parts, " for the ", parts,
                           " positions");
  }
  JAX_TMA_RETURN_IF_FAILED(CheckCtas(kOp, ctas));
  call->ctas = ctas;
  call->per_part = entries / parts;
  call->choices = slots.dimensions()[1];
  call->operand_rows = in_dims[0];
  call->result_rows = out_dims[0];
  size_t row_elements = 1;
  for (size_t i = 1; i < in_dims.size(); ++i) row_elements *= static_cast<size_t>(in_dims[i]);
  call->row_bytes = row_elements * ffi::ByteWidth(type);
  call->operand = operand.untyped_data();
  call->result = result->untyped_data();
  call->tokens = static_cast<const int32_t*>(tokens.untyped_data());
  call->slots = static_cast<const int32_t*>(slots.untyped_data());
  call->recv_sizes = static_cast<const int32_t*>(recv_sizes.untyped_data());
  if ((operand.size_bytes() != 0 && call->operand == nullptr) ||
      (result->size_bytes() != 0 && call->result == nullptr)) {
    return InvalidArgument(kOp, "null buffer for a ", operand.size_bytes(), "-byte operand or a ",
                           result->size_bytes(), "-byte result");
  }
  return ffi::Error::Success();
}

ffi::Error CheckMoeDispatchIndices(const MoeDispatchCall& call) {
  const std::string me = call.Describe(call.self);
  for (int64_t s = 0; s < call.parts; ++s) {
    const int64_t size = call.recv_sizes[s];
    if (size < 0 || size > call.per_part) {
      return InvalidArgument(kOp, "recv_sizes[", s, "] = ", size, " on ", me,
                             " is outside [0, ", call.per_part, "]");
    }
    for (int64_t e = s * call.per_part; e < s * call.per_part + size; ++e) {
      const int64_t token = call.tokens[e];
      if (token < 0 || token >= call.operand_rows) {
        return InvalidArgument(kOp, "tokens[", e, "] = ", token, " on ", me,
                               " is outside the operand's ", call.operand_rows, " rows");
      }
      for (int64_t j = 0; j < call.choices; ++j) {
        const int64_t slot = call.slots[e * call.choices + j];
        if (slot < -1 || slot >= call.result_rows) {
          return InvalidArgument(kOp, "slots[", e, ", ", j, "] = ", slot, " on ", me,
                                 " is neither -1 nor a row of the result's ", call.result_rows);
        }
      }
    }
  }
  return ffi::Error::Success();
}

}  // namespace jax_tma
