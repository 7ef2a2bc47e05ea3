// CPU handler for jax_tma_moe_dispatch (moe_dispatch.h): every index value is
// checked on the host, the rows of this participant's own operand are
// written, then each step reads one position's rows: in one process through
// ppermute's rendezvous, each reader reading its source's call and copying
// the rows it names; across the processes of one host over the process link,
// first each reader's tokens to its source, then the rows they name back. A
// value that breaks a rule writes nothing and fails the call with an error
// naming it, after every step has met as usual (so that no peer waits for
// this one, and the call site stays usable).
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

// Writes row i of `rows` (the rows position s sends here, in order) to its
// slots of `call`'s result.
void WriteRow(const MoeDispatchCall& call, int64_t s, int64_t i, const char* row) {
  const int32_t* slots = call.slots + (s * call.per_part + i) * call.choices;
  for (int64_t j = 0; j < call.choices; ++j) {
    if (slots[j] < 0) continue;
    // memmove: nothing keeps a caller from handing the same buffer twice.
    std::memmove(static_cast<char*>(call.result) + slots[j] * call.row_bytes, row,
                 call.row_bytes);
  }
}

// The rows of position s's operand `from` that this participant reads.
void ReadRows(const MoeDispatchCall& call, int64_t s, const void* from) {
  for (int64_t i = 0; i < call.recv_sizes[s]; ++i) {
    const int64_t token = call.tokens[s * call.per_part + i];
    WriteRow(call, s, i, static_cast<const char*>(from) + token * call.row_bytes);
  }
}

// Step k in one process: this participant reads its source's operand (the
// participant at position + k, published for the step). Each step is
// synchronous on the host: leaving the meeting means the reader of this
// participant's operand has finished.
ffi::Error StepInProcess(const MoeDispatchCall& call, int k, int64_t instance, ffi::RunId run,
                         bool own_ok) {
  const PermuteRoute& route = call.steps[k - 1];
  const int64_t s = call.positions[route.destination];
  return ExchangeBlocks(
      instance + k - 1, route, call.where.timeout,
      PermuteBlock{run.run_id, const_cast<MoeDispatchCall*>(&call)},
      [&](const PermuteBlock* partner) {
        if (partner != nullptr && own_ok) {
          ReadRows(call, s, static_cast<const MoeDispatchCall*>(partner->data)->operand);
        }
        return ffi::Error::Success();
      },
      [](void*) { return ffi::Error::Success(); });
}

// Step k across processes: this participant's tokens for its source go to
// it (behind whether its own values passed its checks), and the tokens of
// the participant that reads this one's rows come here; then the rows they
// name travel back.
ffi::Error StepAcrossProcesses(const MoeDispatchCall& call, int k, bool own_ok) {
  const PermuteRoute& route = call.steps[k - 1];
  const ProcessPlan plan = call.StepPlan(k);
  const int64_t s = call.positions[route.destination];
  std::vector<std::string> got;
  JAX_TMA_RETURN_IF_FAILED(ExchangeAtSite(
      route, plan, call.row_bytes, {route.destination},
      [&](int, const std::string&, std::string* payload) {
        std::vector<int32_t> words(2 + call.per_part, 0);
        words[0] = own_ok ? 1 : 0;
        words[1] = own_ok ? call.recv_sizes[s] : 0;
        if (own_ok) {
          std::memcpy(words.data() + 2, call.tokens + s * call.per_part,
                      static_cast<size_t>(words[1]) * sizeof(int32_t));
        }
        payload->assign(reinterpret_cast<const char*>(words.data()),
                        words.size() * sizeof(int32_t));
        return ffi::Error::Success();
      },
      {route.source}, (2 + call.per_part) * sizeof(int32_t), "the tokens", &got));
  std::vector<int32_t> theirs(2 + call.per_part);
  std::memcpy(theirs.data(), got[0].data(), theirs.size() * sizeof(int32_t));
  // The reader checked its tokens against its own operand's rows, which are
  // this one's (the group's shapes are the same on all).
  const bool send = theirs[0] == 1;
  JAX_TMA_RETURN_IF_FAILED(ExchangeAtSite(
      route, plan, call.row_bytes, {route.source},
      [&](int, const std::string&, std::string* payload) {
        payload->clear();
        if (!send) return ffi::Error::Success();
        for (int32_t i = 0; i < theirs[1]; ++i) {
          payload->append(static_cast<const char*>(call.operand) + theirs[2 + i] * call.row_bytes,
                          call.row_bytes);
        }
        return ffi::Error::Success();
      },
      {route.destination}, own_ok ? call.recv_sizes[s] * call.row_bytes : 0, "the rows", &got));
  if (!own_ok) return ffi::Error::Success();
  for (int64_t i = 0; i < call.recv_sizes[s]; ++i) {
    WriteRow(call, s, i, got[0].data() + i * call.row_bytes);
  }
  return ffi::Error::Success();
}

ffi::Error MoeDispatchCpuImpl(int32_t device, ffi::RunId run, ffi::AnyBuffer operand,
                           ffi::AnyBuffer tokens, ffi::AnyBuffer slots, ffi::AnyBuffer recv_sizes,
                           ffi::Result<ffi::AnyBuffer> result, int64_t instance,
                           ffi::Span<const int64_t> devices, ffi::Span<const int64_t> sources,
                           ffi::Span<const int64_t> positions, int64_t parts,
                           std::string_view method, int64_t ctas, int64_t process,
                           ffi::Span<const int64_t> processes, std::string_view links,
                           std::string_view site, int64_t timeout_ms) {
  // Every method is the same memcpy on the host, on the calling thread (ctas: checked only).
  MoeDispatchCall call;
  JAX_TMA_RETURN_IF_FAILED(DecodeMoeDispatch(device, operand, tokens, slots, recv_sizes, result,
                                          devices, sources, positions, parts, method, ctas,
                                          process, processes, links, site, timeout_ms, &call));
  CountPath(Path::kMoeDispatchCpu);
  ffi::Error checks = CheckMoeDispatchIndices(call);
  const bool own_ok = checks.success();
  if (own_ok) ReadRows(call, call.position, call.operand);
  for (int k = 1; k < call.parts; ++k) {
    JAX_TMA_RETURN_IF_FAILED(call.where.spans_processes()
                                 ? StepAcrossProcesses(call, k, own_ok)
                                 : StepInProcess(call, k, instance, run, own_ok));
  }
  return checks;
}

}  // namespace
}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTmaMoeDispatchCpu, jax_tma::MoeDispatchCpuImpl,
                              jax_tma::BindMoeDispatchCall(xla::ffi::Ffi::Bind()));
