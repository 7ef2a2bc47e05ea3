// CPU handler for jax_tma_moe_combine (moe_combine.h): the slots are checked
// on the host, this participant's pair rows are summed into a host buffer
// (subnormals kept, as the GPU keeps them), and that buffer is the operand of
// the ragged exchange's host steps (RunRaggedAllToAllCpu: in one process
// through ppermute's rendezvous, across the processes of one host over the
// process link). A value that breaks a
// rule sends nothing and fails the call with an error naming it, after every
// step has met as usual.
#include <cstring>
#include <vector>

#include "element_sum.h"
#include "handlers.h"
#include "keep_subnormals.h"
#include "path_counts.h"
#include "ppermute/moe_combine.h"

namespace jax_tma {
namespace {

// Row r of the sums, into `out` (row_bytes): each element the sum over
// the row's choices here (moe_combine.h's order and rounding).
template <SumKind K>
void SumRow(const MoeCombineCall& call, int64_t r, char* out) {
  using E = ElementSum<K>;
  using T = typename E::T;
  using Acc = typename E::Acc;
  const int64_t elements = static_cast<int64_t>(call.row_bytes / sizeof(T));
  const auto* weights = static_cast<const Acc*>(call.weights) + r * call.choices;
  const int32_t* slots = call.slots + r * call.choices;
  std::vector<Acc> acc(static_cast<size_t>(elements), SumStart<K>());
  bool any = false;
  for (int64_t j = 0; j < call.choices; ++j) {
    if (slots[j] < 0) continue;
    any = true;
    const char* row = static_cast<const char*>(call.y) + slots[j] * call.row_bytes;
    for (int64_t e = 0; e < elements; ++e) {
      T v;
      std::memcpy(&v, row + e * sizeof(T), sizeof(T));
      const Acc product = E::Load(v) * weights[j];  // rounded: the build does not contract
      acc[static_cast<size_t>(e)] += product;
    }
  }
  for (int64_t e = 0; e < elements; ++e) {
    const T v = E::Store(any ? acc[static_cast<size_t>(e)] : EmptySum<K>());
    std::memcpy(out + e * sizeof(T), &v, sizeof(T));
  }
}

// Every pair row of `call` into `rows`.
template <SumKind K>
void SumRows(const MoeCombineCall& call, char* rows) {
  for (int64_t r = 0; r < call.operand_rows; ++r) {
    SumRow<K>(call, r, rows + r * static_cast<int64_t>(call.row_bytes));
  }
}

ffi::Error MoeCombineCpuImpl(
    int32_t device, ffi::RunId run, ffi::AnyBuffer y, ffi::AnyBuffer weights,
    ffi::AnyBuffer slots, ffi::AnyBuffer input_offsets, ffi::AnyBuffer send_sizes,
    ffi::AnyBuffer output_offsets, ffi::AnyBuffer recv_sizes, ffi::Result<ffi::AnyBuffer> result,
    int64_t instance, ffi::Span<const int64_t> devices, ffi::Span<const int64_t> sources,
    ffi::Span<const int64_t> positions, int64_t parts, std::string_view method, int64_t ctas,
    int64_t process, ffi::Span<const int64_t> processes, std::string_view links,
    std::string_view site, int64_t timeout_ms) {
  // Every method is the same host code, on the calling thread (ctas: checked only).
  MoeCombineCall call;
  JAX_TMA_RETURN_IF_FAILED(DecodeMoeCombine(
      device, y, weights, slots, input_offsets, send_sizes, output_offsets, recv_sizes, result,
      devices, sources, positions, parts, method, ctas, process, processes, links, site,
      timeout_ms, &call));
  CountPath(Path::kMoeCombineCpu);
  ffi::Error checks = CheckMoeCombineSlots(call);
  std::vector<char> rows(checks.success() ? call.operand_rows * call.row_bytes : 0);
  if (checks.success()) {
    KeepSubnormals keep;  // as the GPU kernel keeps them
    switch (call.kind) {  // DecodeMoeCombine's kinds
      case SumKind::kF16: SumRows<SumKind::kF16>(call, rows.data()); break;
      case SumKind::kBF16: SumRows<SumKind::kBF16>(call, rows.data()); break;
      case SumKind::kF32: SumRows<SumKind::kF32>(call, rows.data()); break;
      default: SumRows<SumKind::kF64>(call, rows.data()); break;
    }
  }
  call.operand = rows.data();
  return RunRaggedAllToAllCpu(call, instance, run, std::move(checks));
}

}  // namespace
}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTmaMoeCombineCpu, jax_tma::MoeCombineCpuImpl,
                              jax_tma::BindMoeCombineCall(xla::ffi::Ffi::Bind()));
