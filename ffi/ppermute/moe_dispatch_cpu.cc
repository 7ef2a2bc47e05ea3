// CPU handler for jax_tma_moe_dispatch (moe_dispatch.h): every index value is
// checked on the host, the pairs of this participant's own sent are
// written, then each step reads one position's: in one process through
// ppermute's rendezvous, each reader reading its source's call and copying
// the rows its pairs name; across the processes of one host over the process
// link, each source first telling its reader how many pairs it sends, then
// sending them with their rows. A value that breaks a rule writes nothing
// and fails the call with an error naming it, after every step has met as
// usual (so that no peer waits for this one, and the call site stays
// usable); its readers then write nothing of its pairs either.
#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "handlers.h"
#include "path_counts.h"
#include "peer/peer_exchange.h"
#include "peer/peer_rendezvous.h"
#include "ppermute/moe_dispatch.h"

namespace jax_tma {
namespace {

// Writes pair i of those position s sends here (`entry`: its token and
// slots) to row s * T + i of the slots result and, unless the pair is past
// the pairs (token T), its token's row `row` to each of its slots of the
// result.
void WritePair(const MoeDispatchCall& call, int64_t s, int64_t i, const int32_t* entry,
               const char* row) {
  int32_t* slots = call.slots + (s * call.per_part + i) * call.choices;
  const bool pair = entry[0] < call.per_part;
  for (int64_t j = 0; j < call.choices; ++j) {
    slots[j] = pair ? entry[1 + j] : -1;
    if (slots[j] < 0) continue;
    // memmove: nothing keeps a caller from handing the same buffer twice.
    std::memmove(static_cast<char*>(call.result) + slots[j] * call.row_bytes, row,
                 call.row_bytes);
  }
}

// -1 in the rows of the slots result that position s fills no pair of
// (from `from` on).
void ClearRegion(const MoeDispatchCall& call, int64_t s, int64_t from) {
  int32_t* slots = call.slots + (s * call.per_part + from) * call.choices;
  std::fill(slots, slots + (call.per_part - from) * call.choices, -1);
}

// The pairs position s sends here, from `from` (s's call, in this process).
void ReadPairs(const MoeDispatchCall& call, int64_t s, const MoeDispatchCall& from) {
  const int32_t* route = call.routes + s * kMoePlanColumns;
  const int64_t count = route[3];
  for (int64_t i = 0; i < count; ++i) {
    const int32_t* entry = from.sent + (route[4] + i) * (call.choices + 1);
    WritePair(call, s, i, entry,
              static_cast<const char*>(from.operand) +
                  std::min<int64_t>(entry[0], call.per_part - 1) * call.row_bytes);
  }
  ClearRegion(call, s, count);
}

// Step k in one process: this participant reads its source's call (the
// participant at position + k, published for the step). Each step is
// synchronous on the host: leaving the meeting means the reader of this
// participant's call has finished.
ffi::Error StepInProcess(const MoeDispatchCall& call, int k, int64_t instance, ffi::RunId run) {
  const PermuteRoute& route = call.steps[k - 1];
  const int64_t s = call.positions[route.destination];
  return ExchangeBlocks(
      instance + k - 1, route, call.where.timeout,
      PermuteBlock{run.run_id, const_cast<MoeDispatchCall*>(&call)},
      [&](const PermuteBlock* partner) {
        const auto* from = partner == nullptr ? nullptr
                                              : static_cast<const MoeDispatchCall*>(partner->data);
        if (call.checked && from != nullptr && from->checked) ReadPairs(call, s, *from);
        return ffi::Error::Success();
      },
      [](void*) { return ffi::Error::Success(); });
}

// Step k across processes: this participant tells the one that reads it
// how many pairs it sends (0 where its values broke a rule) and learns the
// same from its source; then the pairs travel, each with its token's row.
ffi::Error StepAcrossProcesses(const MoeDispatchCall& call, int k) {
  const PermuteRoute& route = call.steps[k - 1];
  const ProcessPlan plan = call.StepPlan(k);
  const int64_t s = call.positions[route.destination];
  const int64_t reader = call.positions[route.source];
  const int64_t width = call.choices + 1;
  const size_t pair_bytes = width * sizeof(int32_t) + call.row_bytes;
  const int32_t* to_reader = call.routes + reader * kMoePlanColumns;
  const int32_t sends = call.checked ? to_reader[1] : -1;
  std::vector<std::string> got;
  JAX_TMA_RETURN_IF_FAILED(ExchangeAtSite(
      route, plan, call.row_bytes, {route.source},
      [&](int, const std::string&, std::string* payload) {
        payload->assign(reinterpret_cast<const char*>(&sends), sizeof(sends));
        return ffi::Error::Success();
      },
      {route.destination}, sizeof(int32_t), "the count of pairs", &got));
  int32_t gets;
  std::memcpy(&gets, got[0].data(), sizeof(gets));
  JAX_TMA_RETURN_IF_FAILED(ExchangeAtSite(
      route, plan, call.row_bytes, {route.source},
      [&](int, const std::string&, std::string* payload) {
        payload->clear();
        for (int32_t i = 0; i < sends; ++i) {
          const int32_t* entry = call.sent + (to_reader[0] + i) * width;
          payload->append(reinterpret_cast<const char*>(entry), width * sizeof(int32_t));
          const int64_t token = std::min<int64_t>(entry[0], call.per_part - 1);
          payload->append(static_cast<const char*>(call.operand) + token * call.row_bytes,
                          call.row_bytes);
        }
        return ffi::Error::Success();
      },
      {route.destination}, gets < 0 ? 0 : gets * pair_bytes, "the pairs", &got));
  if (!call.checked || gets < 0) return ffi::Error::Success();
  const int64_t expected = call.routes[s * kMoePlanColumns + 3];
  if (gets != expected) {
    return InvalidArgument(kMoeDispatchOp, call.Describe(route.destination), " sends ", gets,
                           " pairs to ", call.Describe(call.self), ", whose routes[", s,
                           ", 3] = ", expected);
  }
  std::vector<int32_t> entry(width);
  for (int64_t i = 0; i < gets; ++i) {
    const char* at = got[0].data() + i * pair_bytes;
    std::memcpy(entry.data(), at, width * sizeof(int32_t));
    WritePair(call, s, i, entry.data(), at + width * sizeof(int32_t));
  }
  ClearRegion(call, s, gets);
  return ffi::Error::Success();
}

ffi::Error MoeDispatchCpuImpl(int32_t device, ffi::RunId run, ffi::AnyBuffer operand,
                              ffi::AnyBuffer sent, ffi::AnyBuffer routes,
                              ffi::Result<ffi::AnyBuffer> result,
                              ffi::Result<ffi::AnyBuffer> slots, int64_t instance,
                              ffi::Span<const int64_t> devices, ffi::Span<const int64_t> sources,
                              ffi::Span<const int64_t> positions, int64_t parts,
                              std::string_view method, int64_t ctas, int64_t process,
                              ffi::Span<const int64_t> processes, std::string_view links,
                              std::string_view site, int64_t timeout_ms) {
  // Every method is the same memcpy on the host, on the calling thread (ctas: checked only).
  MoeDispatchCall call;
  JAX_TMA_RETURN_IF_FAILED(DecodeMoeDispatch(device, operand, sent, routes, result, slots,
                                             devices, sources, positions, parts, method, ctas,
                                             process, processes, links, site, timeout_ms,
                                             &call));
  CountPath(Path::kMoeDispatchCpu);
  ffi::Error checks = CheckMoeDispatchIndices(call);
  call.checked = checks.success();
  if (call.checked) ReadPairs(call, call.position, call);
  for (int k = 1; k < call.parts; ++k) {
    JAX_TMA_RETURN_IF_FAILED(call.where.spans_processes() ? StepAcrossProcesses(call, k)
                                                          : StepInProcess(call, k, instance, run));
  }
  return checks;
}

}  // namespace
}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTmaMoeDispatchCpu, jax_tma::MoeDispatchCpuImpl,
                              jax_tma::BindMoeDispatchCall(xla::ffi::Ffi::Bind()));
