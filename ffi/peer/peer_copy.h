// The peer transport's device side (jax_tma.ppermute's, and the next
// collectives'): the participants of a call hand
// each other their buffers and signals through mailboxes in device memory
// that every participant maps (peer access within a process, imported VMM
// allocations across processes: peer_memory.h), so a call needs no host
// meeting and replays from a CUDA graph.
//
// Each participant (device) of a lowered ppermute owns one PeerMailbox. Per
// call, on its own stream, it runs:
//   PeerMeet    calls += 1 (the call's number k); publishes its buffer (push:
//               its output; pull: its input) to the participant that copies
//               from or into it (`partnered_by`): that one's `buffer`, then
//               `ready` = k (release); then, if it has a partner, waits until
//               its own `ready` is k (acquire) and keeps the partner's buffer.
//   PeerCopy    (if it has a partner) copies between its own buffer and the
//               partner's with the TMA bulk pipeline (or SIMT); the last CTA
//               to finish sets the partner's `done` = k (release).
//   PeerFinish  (if partnered) waits until its own `done` is k: nothing later
//               on its stream touches the published buffer too early.
// Calls are matched by number, counted on the device, so a stale signal of
// an earlier call is never taken for a new one, across loop iterations,
// re-executions and graph replays. A participant can be at most one call
// ahead of the one it waits for, so a `ready` past k means the participants
// are out of step.
//
// Waits are bounded: past the timeout, or once the host marks the awaited
// process gone, the kernel writes a PeerFault (host-mapped) and traps, so
// the step fails instead of returning a block that never arrived; the
// fault's description reaches stderr (peer_memory.h).
#ifndef JAX_TMA_FFI_PEER_PEER_COPY_H_
#define JAX_TMA_FFI_PEER_PEER_COPY_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common.h"

namespace jax_tma {

struct alignas(64) PeerMailbox {
  // Written by the partner: the number of the call whose buffer it published
  // and that buffer, in this process's address space.
  unsigned long long ready;
  unsigned long long buffer;
  // Written by the participant that copies this one's buffer: the number of
  // the call whose copy it finished.
  unsigned long long done;
  // This participant's own: calls started; the partner's buffer of the
  // current call (PeerMeet -> PeerCopy); CTAs of the current copy finished.
  unsigned long long calls;
  unsigned long long peer;
  unsigned int ctas;
  // Written by the partner with `buffer` in a ragged exchange (PeerScatter):
  // its receive sizes, in this process's address space; 0 otherwise.
  unsigned long long sizes;
  // A PeerScatter's own, on its first leg's mailbox: the number of the last
  // call whose meeting its CTA 0 finished (the others wait for it), and the
  // CTAs of the current call finished.
  unsigned long long met;
  unsigned int finished;
};

// What a participant waited for when it gave up.
enum class PeerWaitFor : unsigned int { kNone = 0, kPublish = 1, kDone = 2 };
// Why it gave up.
enum class PeerGaveUp : unsigned int { kTimeout = 1, kGone = 2, kOutOfStep = 3, kBadSize = 4 };
// Which rule a ragged exchange's sizes broke (PeerGaveUp::kBadSize).
enum class PeerSizeRule : unsigned int {
  kNone = 0,
  kOperand = 1,  // input_offsets[i] + send_sizes[i] in [0, operand rows]
  kOutput = 2,   // output_offsets[i] + send_sizes[i] in [0, output rows]
  kRecv = 3,     // the receiver's recv_sizes entry is this slice's send_sizes[i]
  kPullRoute = 4,  // a pull's routes[i][c]: a count in [0, T], a start in [0, pairs - count]
  kPullToken = 5,  // a pull's sent[i][0] in [0, T]
  kPullSlot = 6,   // a pull's sent[i][1 + j] -1 or in [0, result rows)
  kSumSlot = 7,    // a summed exchange's slots[r][j] -1 or in [0, y's rows)
};

// Written once per process by the first wait that gives up (host-mapped).
// For kBadSize: `rule`, the slice `index`, `call` its offset (kRecv: the
// receiver's recv_sizes entry), `seen` its size and `limit` the rows of the
// buffer it runs past.
struct PeerFault {
  unsigned int raised;  // 0 until a fault is written, then 1
  unsigned int wait_for;
  unsigned int gave_up;
  unsigned int rule;
  unsigned long long site;  // the waiting participant's PeerSiteId
  unsigned long long call;
  unsigned long long seen;  // the awaited field's value at that point
  long long index;
  long long limit;
};

// How a kernel waits on one other participant.
struct PeerWait {
  unsigned long long timeout_ns = 0;
  const volatile unsigned int* gone = nullptr;  // host-mapped; nonzero: that process is gone
  PeerFault* fault = nullptr;
  unsigned long long site = 0;
};

// PeerMeet. `by_box` (the partnered_by participant's mailbox in this
// address space) and `published` (this participant's buffer in that one's
// address space) are null where nobody copies this participant's buffer;
// `await_partner` is false where it has no partner.
ffi::Error LaunchPeerMeet(PeerMailbox* own, PeerMailbox* by_box, unsigned long long published,
                          bool await_partner, const PeerWait& wait, cudaStream_t stream);

// PeerCopy of `bytes` between `local` (push: the input, read; pull: the
// output, written) and the partner's buffer kept in `own`, with the TMA bulk
// pipeline where `tma` and both addresses are equal modulo 16 B, else SIMT.
// `partner_box` is the partner's mailbox in this address space.
ffi::Error LaunchPeerCopy(PeerMailbox* own, PeerMailbox* partner_box, void* local,
                          std::size_t bytes, bool push, bool tma, cudaStream_t stream,
                          int device);

// PeerFinish.
ffi::Error LaunchPeerFinish(PeerMailbox* own, const PeerWait& wait, cudaStream_t stream);

// ---- PeerScatter: every step of an exchange at once ----
//
// An all_to_all (or ragged all_to_all) of `parts` participants is parts - 1
// steps (legs), one per shift k: this participant pushes into the one k
// positions after it and receives from the one k before. Each leg has its
// own mailboxes, trading as above, and one kernel runs every leg at once:
// its CTA 0 publishes this participant's output to every source and waits
// for every destination's (the meet), while the other CTAs wait for it;
// then every CTA pushes its part of a slice straight into its destination's
// output (the slices for itself into its own), the last CTA of a leg
// signalling its destination; the grid's last CTA waits until every source
// has finished (the finish). A call's number is each leg's count of calls
// plus one, which that last CTA raises once every CTA has read it.

// At most this many legs per exchange: the legs travel as kernel parameters.
inline constexpr int kMaxPeerLegs = 31;

// One leg, as PeerSite holds it (ppermute_launch.h): this participant's
// mailbox, its destination's (`partner_box`) and its source's (`by_box`) in
// this address space, and this call's output and receive sizes in the
// source's address space.
struct PeerLeg {
  PeerMailbox* own = nullptr;
  PeerMailbox* by_box = nullptr;
  PeerMailbox* partner_box = nullptr;
  unsigned long long published = 0;
  unsigned long long published_sizes = 0;
  PeerWait wait_partner;
  PeerWait wait_by;
};

struct PeerLegs {
  int count = 0;  // parts - 1
  PeerLeg leg[kMaxPeerLegs];
};

// What this participant sends: `slices` slices, `per_part` for each
// destination position in order (slice i goes to position i / per_part);
// leg k - 1 carries those for position (position + k) mod parts, and those
// for `position` itself are copied into `local`.
//   Equal (all_to_all): slice i is `bytes` at src + i * bytes, placed at
//     position * bytes of its destination's output.
//   Ragged (`sizes` set): slice i is send_sizes[i] rows at input_offsets[i]
//     of src, placed at output_offsets[i] of its destination's output; the
//     four arrays (int32, or int64 where `index64`) are read on the device
//     and checked against `src_rows` and `dst_rows` before any copy (a
//     broken rule traps with a PeerFault of kBadSize), as is each
//     destination's recv_sizes entry for this participant's slice.
struct PeerSlices {
  const uint8_t* src = nullptr;
  uint8_t* local = nullptr;
  int parts = 1;
  int position = 0;
  int per_part = 1;
  int64_t slices = 1;
  int64_t bytes = 0;  // equal: a slice's bytes; ragged: a row's
  // Ragged only:
  const void* input_offsets = nullptr;
  const void* send_sizes = nullptr;
  const void* output_offsets = nullptr;
  const void* recv_sizes = nullptr;
  bool index64 = false;
  int64_t src_rows = 0;
  int64_t dst_rows = 0;
  JAX_TMA_HOST_DEVICE bool ragged() const { return send_sizes != nullptr; }
};

// The kernel of one exchange on `stream`, with the TMA bulk pipeline
// where `tma` (slices whose source and destination differ modulo 16 B, and
// every slice without `tma`, with SIMT). `expected_bytes` (a slice's bytes,
// or what a ragged one is expected to hold) sizes the grid, of at most
// `max_ctas` copying CTAs where that is not 0 (but one a slice at least). A ragged
// exchange's broken size rule is reported under `check`'s site. Errors
// name `op`.
ffi::Error LaunchPeerScatter(std::string_view op, const PeerLegs& legs,
                             const PeerSlices& slices, bool tma, int64_t expected_bytes,
                             int64_t max_ctas, const PeerWait& check, cudaStream_t stream,
                             int device);

// ---- PeerScatterSum: a ragged exchange whose rows are sums ----
//
// PeerScatter of the ragged slices `slices` (per_part of them a position)
// of an operand that is never stored: its row r is
//   Σ_j y[slots[r * choices + j]] · weights[r * choices + j] over slots >= 0,
// ascending j, of `kind` (SumKind: f16, bf16, f32, f64) in ElementSum's
// accumulator, each product rounded before it is added, +0.0 where no slot
// is set (ppermute/moe_combine.h). The meet checks the slices as
// PeerScatter's does and every slot (PeerSizeRule::kSumSlot, the entry's
// flat index reported, `seen` = choices) before any copy; the copy stage
// computes each row's pieces and stores them straight into the
// destination's result.
struct PeerSumRows {
  const uint8_t* y = nullptr;
  int64_t y_rows = 0;
  const void* weights = nullptr;  // operand rows of `choices` accumulators
  const int32_t* slots = nullptr;  // operand rows of `choices`
  int64_t choices = 0;
  int kind = 0;  // SumKind
};

// The three kernels of one summed exchange on `stream`: `slices.src` is not
// read (the rows are the sums), `slices.src_rows` is the operand's rows. At
// most `max_ctas` summing CTAs where that is not 0 (but one a slice at
// least). A broken rule is reported under `check`'s site. Errors name `op`.
ffi::Error LaunchPeerScatterSum(std::string_view op, const PeerLegs& legs,
                                const PeerSlices& slices, const PeerSumRows& sums,
                                int64_t max_ctas, const PeerWait& check, cudaStream_t stream,
                                int device);

// ---- PeerPull: rows read from every source, each written to its slots ----
//
// The legs of PeerScatter, published the other way: a participant publishes
// its operand and its pairs (the `published` and `published_sizes` of
// ExchangeLegs) to each leg's source, which reads them. PeerPullMeet checks
// this participant's routes and pairs and trades the operands and pairs;
// PeerPullCopy reads, for every position s of the group (its own included),
// the routes[s][kPullFrom] pairs at row routes[s][kPullFromAt] of s's pairs
// (a token, then `choices` slots), and for each pair i its token's row of
// s's operand, once, which it stores to each of the pair's slots >= 0 of
// its result; row s * per_part + i of `slots` gets the pair's slots (-1
// for a pair whose token is per_part, past the pairs), the rows past s's
// pairs -1. The last CTA of a leg tells its source it is done;
// PeerScatterFinish waits until every reader of this participant's operand
// and pairs is.
// The columns of a routes row (jax_tma.moe_dispatch's plan): where this
// participant's pairs to position s start and how many, then, from s, how
// many pairs it sends here and where they start among its own.
enum PeerPullRoute : int {
  kPullFirst = 0,
  kPullCount = 1,
  kPullFrom = 3,
  kPullFromAt = 4,
  kPullRouteColumns = 5,
};

struct PeerPullRows {
  const uint8_t* src = nullptr;     // this participant's operand: per_part rows
  uint8_t* dst = nullptr;           // its result: dst_rows rows
  const int32_t* sent = nullptr;    // its pairs: `pairs` rows of choices + 1
  const int32_t* routes = nullptr;  // parts rows of kPullRouteColumns
  int32_t* slots = nullptr;         // parts * per_part rows of choices
  int parts = 1;
  int position = 0;
  int64_t per_part = 0;  // T
  int64_t pairs = 0;
  int64_t choices = 0;
  int64_t bytes = 0;  // a row's
  int64_t dst_rows = 0;
};

// The three kernels of one pull on `stream`, at most `max_ctas` copying CTAs
// where that is not 0 (but one a position at least). A broken index rule is
// reported under `check`'s site. Errors name `op`.
ffi::Error LaunchPeerPull(std::string_view op, const PeerLegs& legs, const PeerPullRows& rows,
                          int64_t max_ctas, const PeerWait& check, cudaStream_t stream,
                          int device);

// ---- PeerInboxExchange: an exchange of small chunks in one kernel ----
//
// PeerScatter's two meetings cost two crossings of the link a call, which
// is most of a small exchange's time. Here each participant owns an inbox
// (peer memory registered once per lowered exchange and device) with two
// slots per leg, used by call parity; the source of a leg pushes its chunk
// into the slot of the call's parity, a piece of the slot at a time, and
// raises each piece's flag in the slot to the call's number once the piece
// is there; the receiver copies each piece into its result once its flag
// holds the call. One kernel does both, so a call is one launch and one
// crossing. A slot is never overwritten early: the
// source reuses it two calls later, after a call whose completion needs
// this participant's own push of that call, which it makes only once its
// earlier call (and so its copy out of the slot) is done.

// A ragged slot's header entry, one per slice for the receiver: where the
// slice's rows sit in the source's operand (and so in the slot's data), how
// many, and where they go in the receiver's output.
struct PeerInboxEntry {
  long long in, size, out;
};

// Small payloads travel in the low-latency form: each 8 bytes of payload
// as one 16-byte unit of two 8-byte words, each word four bytes of data and
// the call's number (its low 32 bits) as a flag, stored and loaded whole
// (a word is single-copy atomic). The receiver copies a unit out as soon
// as both its flags hold the call: no release of a flag after the data,
// and no wait for one, on the way; twice the bytes cross the link, so it
// pays only while a call is latency.
inline constexpr int64_t kPeerInboxLowLatencyBytes = int64_t{64} << 10;  // plain payload a leg
inline constexpr int64_t kPeerLowLatencyData = 8;   // payload bytes a unit
inline constexpr int64_t kPeerLowLatencyUnit = 16;  // slot bytes a unit
static_assert(sizeof(PeerInboxEntry) == 3 * kPeerLowLatencyData, "an entry: three units");

// What a slot holds for `s`. Equal: the chunk, starting (position * chunk)
// mod 16 B into the slot for the participant at `position` (its offset in
// the source's operand), so the push is vectorised when both buffers are
// aligned. Ragged: a header of the slices' PeerInboxEntry (rounded up to
// 256 B), then the source's operand as it lies, each slice's rows where
// they sit in it: the receiver checks each slice's size against its own
// recv_sizes before it copies any. In the low-latency form: equal, the
// chunk's units from the slot's start; ragged, three units an entry (one a
// field), then each row of the operand in units of its own (a row's last
// unit padded), so that no two slices share a unit. Otherwise (the flag
// form) the slot's pieces' flags follow its data (PeerInboxFlags).
JAX_TMA_HOST_DEVICE inline int64_t PeerInboxHeader(const PeerSlices& s) {
  return s.ragged() ? (s.per_part * int64_t{sizeof(PeerInboxEntry)} + 255) / 256 * 256 : 0;
}
JAX_TMA_HOST_DEVICE inline int64_t PeerInboxPlainPayload(const PeerSlices& s) {
  return s.ragged() ? PeerInboxHeader(s) + s.src_rows * s.bytes : s.bytes + 16;
}
// Whether `s` takes the low-latency form: a payload of at most
// kPeerInboxLowLatencyBytes, and something to send (an equal exchange of
// empty chunks keeps the flag that makes it a meeting).
JAX_TMA_HOST_DEVICE inline bool PeerInboxLowLatency(const PeerSlices& s) {
  return PeerInboxPlainPayload(s) <= kPeerInboxLowLatencyBytes && (s.ragged() || s.bytes > 0);
}
// A row's units in the low-latency form (equal: the chunk is one row).
JAX_TMA_HOST_DEVICE inline int64_t PeerRowUnits(int64_t bytes) {
  return (bytes + kPeerLowLatencyData - 1) / kPeerLowLatencyData;
}
// The flag form's pieces: a slot's data in pieces of kPeerInboxPieceBytes,
// each pushed whole by one CTA, which then raises the piece's flag (a call
// number); a receiving CTA copies a piece out once its flag holds the call.
// The pieces depend on the slot alone, not on either participant's grid.
inline constexpr int64_t kPeerInboxPieceBytes = int64_t{16} << 10;
JAX_TMA_HOST_DEVICE inline int64_t PeerInboxPieces(const PeerSlices& s) {
  return (PeerInboxPlainPayload(s) + kPeerInboxPieceBytes - 1) / kPeerInboxPieceBytes;
}
// Where the flag form's flags start in a slot: one 8-byte flag a piece.
JAX_TMA_HOST_DEVICE inline int64_t PeerInboxFlags(const PeerSlices& s) {
  return (PeerInboxPlainPayload(s) + 127) / 128 * 128;
}
JAX_TMA_HOST_DEVICE inline int64_t PeerInboxPayload(const PeerSlices& s) {
  if (!PeerInboxLowLatency(s)) return PeerInboxFlags(s) + 8 * PeerInboxPieces(s);
  const int64_t units = s.ragged() ? 3 * int64_t{s.per_part} + s.src_rows * PeerRowUnits(s.bytes)
                                   : PeerRowUnits(s.bytes);
  return units * kPeerLowLatencyUnit;
}
// The bytes between a leg's two slots for a payload of `payload` bytes, and
// an inbox's bytes for `parts` participants.
JAX_TMA_HOST_DEVICE inline int64_t PeerInboxStride(int64_t payload) {
  return (payload + 255) / 256 * 256;
}
inline int64_t PeerInboxBytes(int parts, int64_t payload) {
  return int64_t{2} * (parts - 1) * PeerInboxStride(payload);
}

// One leg k (1 .. parts - 1), in this address space: this participant's
// mailbox, its destination's, the destination's two slots for this
// participant's chunk, this participant's two slots for its source's, and
// the wait for that source.
struct PeerInboxLeg {
  PeerMailbox* own = nullptr;
  PeerMailbox* partner_box = nullptr;
  uint8_t* partner_inbox = nullptr;
  const uint8_t* inbox = nullptr;
  PeerWait wait_by;
};

struct PeerInboxLegs {
  int count = 0;  // parts - 1
  PeerInboxLeg leg[kMaxPeerLegs];
};

// The exchange of `slices` on `stream`, one kernel, the slots of `legs`
// holding PeerInboxPayload(slices). A ragged exchange's broken size rule is
// reported under `check`'s site: this participant's slices before any copy,
// and each slice it receives (against its recv_sizes) before it copies that
// one. At most `max_ctas` CTAs where that is not 0 (but one a position at
// least).
// Errors name `op`.
ffi::Error LaunchPeerInboxExchange(std::string_view op, const PeerInboxLegs& legs,
                                   const PeerSlices& slices, int64_t max_ctas,
                                   const PeerWait& check, cudaStream_t stream, int device);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PEER_PEER_COPY_H_
