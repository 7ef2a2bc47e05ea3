// CPU handler for jax_tma.ragged_all_to_all: the output is copied into the
// result (where XLA did not alias them), every index value is checked on the
// host, the slices that stay are copied, then each step of the exchange
// (ragged_all_to_all.h) pushes one position's slices: in one process through
// ppermute's rendezvous, each sender reading its receiver's call and writing
// its rows with memcpy; across the processes of one host over the process
// link, first the slices' sizes and offsets, then their rows. A value that
// breaks a rule writes nothing of the slices it concerns and fails the call
// with an error naming it, after every step has met as usual (so that no
// peer waits for this one, and the call site stays usable).
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "handlers.h"
#include "path_counts.h"
#include "peer/peer_exchange.h"
#include "peer/peer_rendezvous.h"
#include "ppermute/ragged_all_to_all.h"

namespace jax_tma {
namespace {

// The slices that `call`'s participant sends to position `to`: their input
// offsets, sizes and output offsets.
struct Slices {
  std::vector<int64_t> input_offsets, sizes, output_offsets;
};

Slices SlicesFor(const RaggedAllToAllCall& call, int to) {
  Slices s;
  const int64_t first = call.FirstSlice(to);
  for (int64_t t = 0; t < call.slices_per_part; ++t) {
    s.input_offsets.push_back(call.HostIndex(call.input_offsets, first + t));
    s.sizes.push_back(call.HostIndex(call.send_sizes, first + t));
    s.output_offsets.push_back(call.HostIndex(call.output_offsets, first + t));
  }
  return s;
}

// Copies the checked slices `s` of `call`'s operand into `result`.
void WriteSlices(const RaggedAllToAllCall& call, const Slices& s, void* result) {
  for (size_t t = 0; t < s.sizes.size(); ++t) {
    const size_t bytes = static_cast<size_t>(s.sizes[t]) * call.row_bytes;
    if (bytes == 0) continue;
    // memmove: nothing keeps a caller from handing the same buffer twice.
    std::memmove(static_cast<char*>(result) + s.output_offsets[t] * call.row_bytes,
                 static_cast<const char*>(call.operand) + s.input_offsets[t] * call.row_bytes,
                 bytes);
  }
}

// Keeps the first failure of a check.
void Keep(ffi::Error* first, ffi::Error err) {
  if (first->success() && err.failure()) *first = std::move(err);
}

// Step k in one process: this participant reads its destination's call
// (published for the step) and, where its own values and the pair's agree,
// writes its slices into the destination's result. `checks` receives a
// broken rule; the return value is the meeting's failure.
ffi::Error StepInProcess(const RaggedAllToAllCall& call, int k, int64_t instance, ffi::RunId run,
                         bool own_ok, ffi::Error* checks) {
  const PermuteRoute& route = call.steps[k - 1];
  // Step k meets under its own instance (Python numbers the steps of a
  // lowered exchange consecutively from `instance`). Each step is synchronous
  // on the host, so leaving the meeting means the partner has finished.
  return ExchangeBlocks(
      instance + k - 1, route, call.where.timeout,
      PermuteBlock{run.run_id, const_cast<RaggedAllToAllCall*>(&call)},
      [&](const PermuteBlock* partner) {
        if (partner == nullptr || !own_ok) return ffi::Error::Success();
        const auto& to = *static_cast<const RaggedAllToAllCall*>(partner->data);
        const Slices s = SlicesFor(call, to.position);
        ffi::Error err =
            CheckReceived(to, call.Describe(call.self), call.position, s.sizes, s.output_offsets);
        if (err.success()) {
          WriteSlices(call, s, to.result);
        } else {
          Keep(checks, std::move(err));
        }
        return ffi::Error::Success();
      },
      [](void*) { return ffi::Error::Success(); });
}

// What travels ahead of a step's rows across processes: whether the sender's
// own values passed its checks, then its slices' sizes and output offsets.
std::string SizesMessage(bool own_ok, const Slices& s) {
  std::vector<int64_t> words{own_ok ? 1 : 0};
  words.insert(words.end(), s.sizes.begin(), s.sizes.end());
  words.insert(words.end(), s.output_offsets.begin(), s.output_offsets.end());
  return std::string(reinterpret_cast<const char*>(words.data()),
                     words.size() * sizeof(int64_t));
}

// Step k across processes: the sizes and output offsets of the slices go to
// the destination first, so that it knows how many rows follow; then the
// rows (none where the sender's values broke a rule). The receiver checks
// what it got against its own recv_sizes and output, and writes the rows
// where they agree.
ffi::Error StepAcrossProcesses(const RaggedAllToAllCall& call, int k, bool own_ok,
                               ffi::Error* checks) {
  const PermuteRoute& route = call.steps[k - 1];
  const ProcessPlan plan = call.StepPlan(k);
  const int64_t per = call.slices_per_part;
  const Slices mine = SlicesFor(call, static_cast<int>(call.positions[route.destination]));
  std::vector<std::string> got;
  JAX_TMA_RETURN_IF_FAILED(ExchangeAtSite(
      route, plan, call.row_bytes, {route.destination},
      [&](int, const std::string&, std::string* payload) {
        *payload = SizesMessage(own_ok, mine);
        return ffi::Error::Success();
      },
      {route.source}, (1 + 2 * per) * sizeof(int64_t), "the slice sizes", &got));
  std::vector<int64_t> words(1 + 2 * per);
  std::memcpy(words.data(), got[0].data(), words.size() * sizeof(int64_t));
  const bool their_ok = words[0] == 1;
  Slices theirs;
  theirs.sizes.assign(words.begin() + 1, words.begin() + 1 + per);
  theirs.output_offsets.assign(words.begin() + 1 + per, words.end());
  size_t rows = 0;
  for (int64_t size : theirs.sizes) rows += size > 0 ? static_cast<size_t>(size) : 0;
  bool take = their_ok;
  if (their_ok) {
    ffi::Error err = CheckReceived(call, call.Describe(route.source),
                                   static_cast<int>(call.positions[route.source]), theirs.sizes,
                                   theirs.output_offsets);
    take = err.success();
    Keep(checks, std::move(err));
  }
  JAX_TMA_RETURN_IF_FAILED(ExchangeAtSite(
      route, plan, call.row_bytes, {route.destination},
      [&](int, const std::string&, std::string* payload) {
        payload->clear();
        if (!own_ok) return ffi::Error::Success();
        for (size_t t = 0; t < mine.sizes.size(); ++t) {
          payload->append(static_cast<const char*>(call.operand) +
                              mine.input_offsets[t] * call.row_bytes,
                          static_cast<size_t>(mine.sizes[t]) * call.row_bytes);
        }
        return ffi::Error::Success();
      },
      {route.source}, their_ok ? rows * call.row_bytes : 0, "the rows", &got));
  if (!take) return ffi::Error::Success();
  const char* from = got[0].data();
  for (int64_t t = 0; t < per; ++t) {
    const size_t bytes = static_cast<size_t>(theirs.sizes[t]) * call.row_bytes;
    if (bytes == 0) continue;
    std::memcpy(static_cast<char*>(call.result) + theirs.output_offsets[t] * call.row_bytes, from,
                bytes);
    from += bytes;
  }
  return ffi::Error::Success();
}

ffi::Error RaggedAllToAllCpuImpl(
    int32_t device, ffi::RunId run, ffi::AnyBuffer operand, ffi::AnyBuffer output,
    ffi::AnyBuffer input_offsets, ffi::AnyBuffer send_sizes, ffi::AnyBuffer output_offsets,
    ffi::AnyBuffer recv_sizes, ffi::Result<ffi::AnyBuffer> result, int64_t instance,
    ffi::Span<const int64_t> devices, ffi::Span<const int64_t> sources,
    ffi::Span<const int64_t> positions, int64_t parts, std::string_view method, int64_t ctas,
    int64_t process, ffi::Span<const int64_t> processes, std::string_view links,
    std::string_view site, int64_t timeout_ms) {
  // Every method is the same memcpy on the host, on the calling thread (ctas: checked only).
  RaggedAllToAllCall call;
  JAX_TMA_RETURN_IF_FAILED(DecodeRaggedAllToAll(
      device, operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, result,
      devices, sources, positions, parts, method, ctas, process, processes, links, site,
      timeout_ms, &call));
  CountPath(Path::kRaggedAllToAllCpu);
  // Rows that no slice writes keep the output's values (XLA aliases the two
  // buffers where Python asks it to; a raw call may not).
  if (call.result != call.output && output.size_bytes() != 0) {
    std::memcpy(call.result, call.output, output.size_bytes());
  }
  return RunRaggedAllToAllCpu(call, instance, run);
}

}  // namespace

ffi::Error RunRaggedAllToAllCpu(const RaggedAllToAllCall& call, int64_t instance,
                                ffi::RunId run, ffi::Error checks) {
  if (checks.success()) checks = CheckOwnSlices(call);
  const bool own_ok = checks.success();
  if (own_ok) {  // the slices that stay
    const Slices s = SlicesFor(call, call.position);
    ffi::Error err = CheckReceived(call, call.Describe(call.self), call.position, s.sizes,
                                   s.output_offsets);
    if (err.success()) {
      WriteSlices(call, s, call.result);
    } else {
      Keep(&checks, std::move(err));
    }
  }
  for (int k = 1; k < call.parts; ++k) {
    JAX_TMA_RETURN_IF_FAILED(call.where.spans_processes()
                                 ? StepAcrossProcesses(call, k, own_ok, &checks)
                                 : StepInProcess(call, k, instance, run, own_ok, &checks));
  }
  return checks;
}

}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTmaRaggedAllToAllCpu, jax_tma::RaggedAllToAllCpuImpl,
                              jax_tma::BindRaggedAllToAllCall(xla::ffi::Ffi::Bind()));
