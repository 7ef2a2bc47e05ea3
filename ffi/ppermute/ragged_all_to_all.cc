// Decoding of jax_tma.ragged_all_to_all's calls, and the host checks of their
// index values (ragged_all_to_all.h).
#include "ppermute/ragged_all_to_all.h"

#include <string>

namespace jax_tma {
namespace {

constexpr std::string_view kOp = kRaggedAllToAllOp;

// The offsets and sizes are s32 or s64 (XLA converts other integer types to
// s64 first; Python does the same), all four of one type, as XLA's
// ragged-all-to-all requires.
ffi::Error CheckIndexArrays(const ffi::AnyBuffer* arrays[4], RaggedAllToAllCall* call) {
  static constexpr const char* kNames[4] = {"input_offsets", "send_sizes", "output_offsets",
                                            "recv_sizes"};
  const ffi::DataType type = arrays[0]->element_type();
  for (int a = 0; a < 4; ++a) {
    const ffi::AnyBuffer& b = *arrays[a];
    if (b.element_type() != ffi::DataType::S32 && b.element_type() != ffi::DataType::S64) {
      return InvalidArgument(call->op, kNames[a], " has element type ",
                             DataTypeName(b.element_type()),
                             "; the offsets and sizes take s32 or s64");
    }
    if (b.element_type() != type) {
      return InvalidArgument(call->op, kNames[a], " has element type ",
                             DataTypeName(b.element_type()), " but input_offsets has ",
                             DataTypeName(type),
                             "; the four offset and size arrays share one element type");
    }
    if (b.dimensions().size() != 1) {
      return InvalidArgument(call->op, kNames[a], " must have rank 1, got shape ",
                             ShapeOf(b.dimensions()));
    }
    if (b.dimensions()[0] != arrays[0]->dimensions()[0]) {
      return InvalidArgument(call->op, kNames[a], " has ", b.dimensions()[0],
                             " entries but input_offsets has ", arrays[0]->dimensions()[0],
                             "; the four offset and size arrays have one entry per slice");
    }
    if (b.dimensions()[0] > 0 && b.untyped_data() == nullptr) {
      return InvalidArgument(call->op, "null buffer for ", kNames[a]);
    }
  }
  if (arrays[0]->dimensions()[0] < 1) {
    return InvalidArgument(call->op, "input_offsets has 0 entries; the call needs at least one "
                                "slice per position");
  }
  call->index_type = type;
  call->slices = arrays[0]->dimensions()[0];
  call->input_offsets = arrays[0]->untyped_data();
  call->send_sizes = arrays[1]->untyped_data();
  call->output_offsets = arrays[2]->untyped_data();
  call->recv_sizes = arrays[3]->untyped_data();
  return ffi::Error::Success();
}

// "input_offsets[3] + send_sizes[3] = 6 + 4"
std::string Sum(const char* a, const char* b, int64_t i, int64_t x, int64_t y) {
  Message m;
  m << a << "[" << i << "] + " << b << "[" << i << "] = " << x << " + " << y;
  return m.str();
}

// Whether rows [offset, offset + size) lie in [0, rows), without overflow.
bool Inside(int64_t offset, int64_t size, int64_t rows) {
  return offset >= 0 && size >= 0 && offset <= rows && size <= rows - offset;
}

}  // namespace

ffi::Error DecodeRaggedSlices(int device, const ffi::AnyBuffer& input_offsets,
                              const ffi::AnyBuffer& send_sizes,
                              const ffi::AnyBuffer& output_offsets,
                              const ffi::AnyBuffer& recv_sizes, ffi::Span<const int64_t> devices,
                              ffi::Span<const int64_t> sources,
                              ffi::Span<const int64_t> positions, int64_t parts, int64_t ctas,
                              int64_t process, ffi::Span<const int64_t> processes,
                              std::string_view links, std::string_view site, int64_t timeout_ms,
                              RaggedAllToAllCall* call) {
  const ffi::AnyBuffer* arrays[4] = {&input_offsets, &send_sizes, &output_offsets,
                                     &recv_sizes};
  JAX_TMA_RETURN_IF_FAILED(CheckIndexArrays(arrays, call));
  JAX_TMA_RETURN_IF_FAILED(DecodeExchangeGroup(call->op, device, devices, sources, positions,
                                               parts, process, processes, links, site,
                                               timeout_ms, call));
  if (call->slices % parts != 0) {
    return InvalidArgument(call->op, "input_offsets has ", call->slices,
                           " entries, not a whole number of slices for each of the ", parts,
                           " positions");
  }
  call->slices_per_part = call->slices / parts;
  JAX_TMA_RETURN_IF_FAILED(CheckCtas(call->op, ctas));
  call->ctas = ctas;
  return ffi::Error::Success();
}

ffi::Error DecodeRaggedAllToAll(
    int device, const ffi::AnyBuffer& operand, const ffi::AnyBuffer& output,
    const ffi::AnyBuffer& input_offsets, const ffi::AnyBuffer& send_sizes,
    const ffi::AnyBuffer& output_offsets, const ffi::AnyBuffer& recv_sizes,
    ffi::Result<ffi::AnyBuffer>& result, ffi::Span<const int64_t> devices,
    ffi::Span<const int64_t> sources, ffi::Span<const int64_t> positions, int64_t parts,
    std::string_view method, int64_t ctas, int64_t process, ffi::Span<const int64_t> processes,
    std::string_view links, std::string_view site, int64_t timeout_ms,
    RaggedAllToAllCall* call) {
  JAX_TMA_RETURN_IF_FAILED(ParseMethod(kOp, method, &call->method, TmaSpelling::kTma));
  const ffi::DataType type = operand.element_type();
  if (output.element_type() != type) {
    return InvalidArgument(kOp, "output has element type ", DataTypeName(output.element_type()),
                           " but operand has ", DataTypeName(type));
  }
  if (result->element_type() != type) {
    return InvalidArgument(kOp, "the result has element type ",
                           DataTypeName(result->element_type()), " but output has ",
                           DataTypeName(type));
  }
  if (IsSubByte(type)) {
    return InvalidArgument(kOp, "sub-byte element type ", DataTypeName(type),
                           " must be widened before the call");
  }
  const ffi::Span<const int64_t> in_dims = operand.dimensions();
  const ffi::Span<const int64_t> out_dims = output.dimensions();
  if (in_dims.size() == 0 || out_dims.size() == 0) {
    return InvalidArgument(kOp, "operand and output must have rank >= 1 (rows first), got "
                                "shapes ", ShapeOf(in_dims), " and ", ShapeOf(out_dims));
  }
  if (!SameDims(in_dims, out_dims, 1)) {
    return InvalidArgument(kOp, "operand's rows have shape ", ShapeOf(in_dims, 1),
                           " but output's ", ShapeOf(out_dims, 1),
                           " (operand shape ", ShapeOf(in_dims), ", output shape ",
                           ShapeOf(out_dims), ")");
  }
  // An output of no rows gives a result of rows of its own, those that no
  // slice writes unspecified (jax_tma's compositions: nothing fills a
  // buffer only for the exchange to overwrite it).
  const ffi::Span<const int64_t> res_dims = result->dimensions();
  if (!SameDims(res_dims, out_dims) && !(out_dims[0] == 0 && SameDims(res_dims, out_dims, 1))) {
    return InvalidArgument(kOp, "the result has shape ", ShapeOf(res_dims), " but output has ",
                           ShapeOf(out_dims), "; they must be equal, or output must have 0 "
                           "rows of the result's row shape (a result of rows of its own)");
  }
  JAX_TMA_RETURN_IF_FAILED(DecodeRaggedSlices(device, input_offsets, send_sizes, output_offsets,
                                              recv_sizes, devices, sources, positions, parts,
                                              ctas, process, processes, links, site,
                                              timeout_ms, call));
  call->operand_rows = in_dims[0];
  call->output_rows = res_dims[0];
  size_t row_elements = 1;
  for (size_t i = 1; i < in_dims.size(); ++i) row_elements *= static_cast<size_t>(in_dims[i]);
  call->row_bytes = row_elements * ffi::ByteWidth(type);
  call->operand = operand.untyped_data();
  call->output = output.untyped_data();
  call->result = result->untyped_data();
  if ((operand.size_bytes() != 0 && call->operand == nullptr) ||
      (output.size_bytes() != 0 && call->output == nullptr) ||
      (result->size_bytes() != 0 && call->result == nullptr)) {
    return InvalidArgument(kOp, "null buffer for a ", operand.size_bytes(), "-byte operand, a ",
                           output.size_bytes(), "-byte output or a ", result->size_bytes(),
                           "-byte result");
  }
  return ffi::Error::Success();
}

ffi::Error CheckOwnSlices(const RaggedAllToAllCall& call) {
  const std::string me = call.Describe(call.self);
  for (int64_t i = 0; i < call.slices; ++i) {
    const int64_t in = call.HostIndex(call.input_offsets, i);
    const int64_t size = call.HostIndex(call.send_sizes, i);
    const int64_t out = call.HostIndex(call.output_offsets, i);
    const int64_t recv = call.HostIndex(call.recv_sizes, i);
    const std::pair<const char*, int64_t> values[4] = {
        {"input_offsets", in}, {"send_sizes", size}, {"output_offsets", out},
        {"recv_sizes", recv}};
    for (const auto& [name, value] : values) {
      if (value < 0) {
        return InvalidArgument(call.op, name, "[", i, "] = ", value, " on ", me, " is negative");
      }
    }
    if (!Inside(in, size, call.operand_rows)) {
      return InvalidArgument(call.op, Sum("input_offsets", "send_sizes", i, in, size), " on ", me,
                             " runs past the operand's ", call.operand_rows, " rows");
    }
    if (!Inside(out, size, call.output_rows)) {
      return InvalidArgument(call.op, Sum("output_offsets", "send_sizes", i, out, size), " on ", me,
                             " runs past the output's ", call.output_rows,
                             " rows (on the device at position ", i / call.slices_per_part,
                             ", which receives slice ", i, ")");
    }
  }
  return ffi::Error::Success();
}

ffi::Error CheckReceived(const RaggedAllToAllCall& receiver, const std::string& sender,
                         int sender_position, const std::vector<int64_t>& sizes,
                         const std::vector<int64_t>& output_offsets) {
  const int64_t theirs = receiver.FirstSlice(receiver.position);
  const int64_t mine = receiver.FirstSlice(sender_position);
  for (int64_t t = 0; t < receiver.slices_per_part; ++t) {
    const int64_t expected = receiver.HostIndex(receiver.recv_sizes, mine + t);
    if (sizes[t] != expected) {
      return InvalidArgument(receiver.op, "recv_sizes[", mine + t, "] = ", expected, " on ",
                             receiver.Describe(receiver.self), " differs from send_sizes[",
                             theirs + t, "] = ", sizes[t], " on ", sender,
                             ", the slice it sends there");
    }
    if (!Inside(output_offsets[t], sizes[t], receiver.output_rows)) {
      return InvalidArgument(receiver.op, Sum("output_offsets", "send_sizes", theirs + t,
                                      output_offsets[t], sizes[t]),
                             " on ", sender, " runs past the ", receiver.output_rows,
                             " rows of the output of ", receiver.Describe(receiver.self));
    }
  }
  return ffi::Error::Success();
}

}  // namespace jax_tma
