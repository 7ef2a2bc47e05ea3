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
                          const ffi::AnyBuffer& sent, const ffi::AnyBuffer& routes,
                          ffi::Result<ffi::AnyBuffer>& result, ffi::Result<ffi::AnyBuffer>& slots,
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
  JAX_TMA_RETURN_IF_FAILED(CheckIndexArray("sent", sent, 2));
  JAX_TMA_RETURN_IF_FAILED(CheckIndexArray("routes", routes, 2));
  JAX_TMA_RETURN_IF_FAILED(CheckIndexArray("the slots result", *slots, 2));
  JAX_TMA_RETURN_IF_FAILED(DecodeExchangeGroup(kOp, device, devices, sources, positions, parts,
                                               process, processes, links, site, timeout_ms,
                                               call));
  const ffi::Span<const int64_t> sent_dims = sent.dimensions();
  const ffi::Span<const int64_t> route_dims = routes.dimensions();
  const ffi::Span<const int64_t> slot_dims = slots->dimensions();
  if (sent_dims[1] < 2 || route_dims[0] != parts || route_dims[1] != kMoePlanColumns ||
      slot_dims[0] != parts * in_dims[0] || slot_dims[1] != sent_dims[1] - 1) {
    return InvalidArgument(kOp, "sent has shape ", ShapeOf(sent_dims), ", routes ",
                           ShapeOf(route_dims), " and the slots result ", ShapeOf(slot_dims),
                           "; they must be (P, k + 1) with k >= 1, (", parts, ", ",
                           kMoePlanColumns, ") and (", parts, " * T, k) for the ", parts,
                           " positions and the operand's T = ", in_dims[0], " rows");
  }
  JAX_TMA_RETURN_IF_FAILED(CheckCtas(kOp, ctas));
  call->ctas = ctas;
  call->per_part = in_dims[0];
  call->pairs = sent_dims[0];
  call->choices = slot_dims[1];
  call->result_rows = out_dims[0];
  size_t row_elements = 1;
  for (size_t i = 1; i < in_dims.size(); ++i) row_elements *= static_cast<size_t>(in_dims[i]);
  call->row_bytes = row_elements * ffi::ByteWidth(type);
  call->operand = operand.untyped_data();
  call->result = result->untyped_data();
  call->sent = static_cast<const int32_t*>(sent.untyped_data());
  call->routes = static_cast<const int32_t*>(routes.untyped_data());
  call->slots = static_cast<int32_t*>(slots->untyped_data());
  if ((operand.size_bytes() != 0 && call->operand == nullptr) ||
      (result->size_bytes() != 0 && call->result == nullptr)) {
    return InvalidArgument(kOp, "null buffer for a ", operand.size_bytes(), "-byte operand or a ",
                           result->size_bytes(), "-byte result");
  }
  return ffi::Error::Success();
}

ffi::Error CheckMoeDispatchIndices(const MoeDispatchCall& call) {
  const std::string me = call.Describe(call.self);
  // Each row's two counts (columns 1 and 3), each before where its pairs
  // start (columns 0 and 4).
  constexpr int kCountThenStart[][2] = {{1, 0}, {3, 4}};
  for (int64_t s = 0; s < call.parts; ++s) {
    const int32_t* route = call.routes + s * kMoePlanColumns;
    for (const auto& columns : kCountThenStart) {
      for (int c : columns) {
        const int64_t value = route[c];
        const int64_t limit = c == columns[0] ? call.per_part : call.pairs - route[columns[0]];
        if (value < 0 || value > limit) {
          return InvalidArgument(kOp, "routes[", s, ", ", c, "] = ", value, " on ", me,
                                 " is outside [0, ", limit, "]");
        }
      }
    }
  }
  const int64_t width = call.choices + 1;
  for (int64_t i = 0; i < call.pairs; ++i) {
    const int64_t token = call.sent[i * width];
    if (token < 0 || token > call.per_part) {
      return InvalidArgument(kOp, "sent[", i, ", 0] = ", token, " on ", me, " is outside [0, ",
                             call.per_part, "]");
    }
    for (int64_t j = 1; j < width; ++j) {
      const int64_t slot = call.sent[i * width + j];
      if (slot < -1 || slot >= call.result_rows) {
        return InvalidArgument(kOp, "sent[", i, ", ", j, "] = ", slot, " on ", me,
                               " is neither -1 nor a row of the result's ", call.result_rows);
      }
    }
  }
  return ffi::Error::Success();
}

}  // namespace jax_tma
