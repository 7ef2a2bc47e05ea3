// The routing plan's calls (moe_dispatch_plan.h): their checks, their CPU handlers
// (the plan's rules in plain loops, one batch member after another) and the
// limits that Python reads.
#include "ppermute/moe_dispatch_plan.h"

#include <algorithm>
#include <vector>

#include "handlers.h"
#include "path_counts.h"
#include "rules.h"

namespace jax_tma {
namespace {

// The array `name` (of element type `type`, dims `dims`) is `want` with the
// dims `lead` then `tail`, else an error naming it, its shape and the one
// expected, and `why`.
ffi::Error CheckArray(std::string_view name, ffi::DataType type, ffi::DataType want,
                      ffi::Span<const int64_t> dims, ffi::Span<const int64_t> lead,
                      std::initializer_list<int64_t> tail, std::string_view why) {
  if (type != want) {
    return InvalidArgument(kMoePlanOp, "the routing plan's ", name, " has element type ",
                           DataTypeName(type), "; it takes ", DataTypeName(want));
  }
  const bool same = dims.size() == lead.size() + tail.size() &&
              std::equal(lead.begin(), lead.end(), dims.begin()) &&
              std::equal(tail.begin(), tail.end(), dims.begin() + lead.size());
  if (same) return ffi::Error::Success();
  Message m;
  m << kMoePlanOp << ": the routing plan's " << name << " has shape (";
  for (size_t i = 0; i < dims.size(); ++i) m << (i ? ", " : "") << dims[i];
  m << "); expected (";
  const char* sep = "";
  for (int64_t d : lead) m << sep << d, sep = ", ";
  for (int64_t d : tail) m << sep << d, sep = ", ";
  m << ") (" << why << ")";
  return ffi::Error::InvalidArgument(m.str());
}

// The checks both calls share: the ids and the attributes.
ffi::Error DecodeIds(const ffi::AnyBuffer& ids, int64_t experts, int64_t parts,
                     MoePlanShape* s) {
  const auto dims = ids.dimensions();
  if (ids.element_type() != ffi::DataType::S32 || dims.size() < 2) {
    return InvalidArgument(kMoePlanOp, "the routing plan's ids have element type ",
                           DataTypeName(ids.element_type()), " and rank ", dims.size(),
                           "; it takes s32 ids of rank 2 or more");
  }
  s->tokens = dims[dims.size() - 2];
  s->choices = dims[dims.size() - 1];
  s->batch = 1;
  for (size_t i = 0; i + 2 < dims.size(); ++i) s->batch *= dims[i];
  if (s->choices < 1 || s->tokens * s->choices > kMoePlanMaxChoices) {
    return InvalidArgument(kMoePlanOp, "the routing plan's ids have ", s->tokens, " tokens of ",
                           s->choices, " choices (their last two dims); it takes up to ",
                           kMoePlanMaxChoices, " choices a member, 1 or more a token");
  }
  if (parts < 1 || parts > kMoePlanMaxParts || experts < parts ||
      experts > kMoePlanMaxExperts || experts % parts != 0) {
    return InvalidArgument(kMoePlanOp, "the routing plan takes 1 to ", kMoePlanMaxParts,
                           " positions and a multiple of them up to ", kMoePlanMaxExperts,
                           " experts, got ", parts, " positions and ", experts, " experts");
  }
  s->experts = experts;
  s->parts = parts;
  return ffi::Error::Success();
}

ffi::Span<const int64_t> Lead(const ffi::AnyBuffer& ids) {
  const auto dims = ids.dimensions();
  return ffi::Span<const int64_t>(dims.begin(), dims.size() - 2);
}

// The CPU plan of one member (moe_dispatch_plan.h's rules, in order).
void RouteCounts(const MoePlanShape& s, const int32_t* ids, int32_t* send) {
  const int64_t local = s.Local();
  std::vector<int32_t> counts(static_cast<size_t>(s.experts + s.parts), 0);
  for (int64_t t = 0; t < s.tokens; ++t) {
    std::vector<bool> has(static_cast<size_t>(s.parts), false);
    for (int64_t j = 0; j < s.choices; ++j) {
      const int32_t e = ids[t * s.choices + j];
      if (e < 0 || e >= s.experts) continue;
      ++counts[static_cast<size_t>(e)];
      has[static_cast<size_t>(e / local)] = true;
    }
    for (int64_t d = 0; d < s.parts; ++d) counts[static_cast<size_t>(s.experts + d)] += has[d];
  }
  for (int64_t i = 0; i < s.parts; ++i) {
    int32_t* row = send + i * s.Width();
    std::copy(counts.begin(), counts.end(), row);
    row[s.experts + s.parts] = static_cast<int32_t>(i);
  }
}

ffi::Error Route(const MoePlanShape& s, const int32_t* ids, const int32_t* table,
                 const MoePlanResults& r) {
  const int64_t E = s.experts, n = s.parts, k = s.choices, local = s.Local(), w = s.Width();
  const int32_t me = table[E + n];
  if (me < 0 || me >= n) {
    return InvalidArgument(kMoePlanOp, "the routing plan's table names position ", me,
                           " of ", n, " (not a table of the counts' exchange)");
  }
  // The table's sums wrap modulo 2^32, as the kernel's do (moe_dispatch_plan.h).
  auto add = [](int32_t a, int64_t b) {
    return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
  };
  std::vector<int32_t> place(static_cast<size_t>(E), 0), start(static_cast<size_t>(E), 0);
  std::vector<int32_t> kept_total(static_cast<size_t>(E), 0);
  for (int64_t e = 0; e < E; ++e) {
    int32_t total = 0;
    for (int64_t src = 0; src < n; ++src) {
      if (src < me) place[e] = add(place[e], table[src * w + e]);
      total = add(total, table[src * w + e]);
    }
    kept_total[e] = s.capacity < 0 ? total : std::min<int32_t>(total, s.capacity);
    start[e] = e % local == 0 ? 0 : add(start[e - 1], kept_total[e - 1]);
  }
  for (int64_t i = 0; i < local; ++i) r.group[i] = kept_total[me * local + i];
  // The pairs: device-major, then by token.
  std::vector<int64_t> per_device(static_cast<size_t>(n), 0);
  for (int64_t t = 0; t < s.tokens; ++t) {
    std::vector<bool> has(static_cast<size_t>(n), false);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[t * k + j];
      if (e >= 0 && e < E) has[static_cast<size_t>(e / local)] = true;
    }
    for (int64_t d = 0; d < n; ++d) per_device[d] += has[d];
  }
  std::vector<int64_t> next(static_cast<size_t>(n), 0);
  for (int64_t d = 0, at = 0; d < n; at += per_device[d], ++d) {
    next[d] = at;
    int32_t below = 0;
    for (int64_t dd = 0; dd < me; ++dd) below = add(below, table[d * w + E + dd]);
    int32_t* route = r.routes + d * kMoePlanColumns;
    route[0] = static_cast<int32_t>(at);
    route[1] = static_cast<int32_t>(per_device[d]);
    route[2] = static_cast<int32_t>(me * s.tokens);
    route[3] = table[d * w + E + me];
    route[4] = below;
  }
  const int64_t pairs = s.Pairs();
  for (int64_t p = 0; p < pairs; ++p) {
    r.pair_token[p] = static_cast<int32_t>(s.tokens);
    r.sent[p * (k + 1)] = static_cast<int32_t>(s.tokens);
    std::fill(r.sent + p * (k + 1) + 1, r.sent + (p + 1) * (k + 1), -1);
  }
  std::vector<int32_t> rank(static_cast<size_t>(E), 0);
  std::vector<int64_t> row(static_cast<size_t>(n), -1);
  for (int64_t t = 0; t < s.tokens; ++t) {
    std::fill(row.begin(), row.end(), -1);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[t * k + j];
      const int64_t c = t * k + j;
      if (e < 0 || e >= E) {
        r.dropped[c] = false;
        r.choice_row[c] = -1;
        continue;
      }
      const int64_t d = e / local;
      if (row[d] < 0) {
        row[d] = next[d]++;
        r.pair_token[row[d]] = static_cast<int32_t>(t);
        r.sent[row[d] * (k + 1)] = static_cast<int32_t>(t);
      }
      const int32_t at = add(place[e], rank[e]++);
      const bool kept = s.capacity < 0 || at < s.capacity;
      r.dropped[c] = !kept;
      r.choice_row[c] = static_cast<int32_t>(row[d]);
      r.sent[row[d] * (k + 1) + 1 + j] = kept ? add(start[e], at) : -1;
    }
  }
  return ffi::Error::Success();
}

ffi::Error MoeDispatchCountsCpuImpl(ffi::AnyBuffer ids, ffi::Result<ffi::AnyBuffer> send,
                                    int64_t experts, int64_t parts) {
  MoePlanShape s;
  JAX_TMA_RETURN_IF_FAILED(DecodeMoeDispatchCounts(ids, *send, experts, parts, &s));
  CountPath(Path::kMoeDispatchCountsCpu);
  for (int64_t b = 0; b < s.batch; ++b) {
    RouteCounts(s, ids.typed_data<int32_t>() + b * s.tokens * s.choices,
                send->typed_data<int32_t>() + b * s.parts * s.Width());
  }
  return ffi::Error::Success();
}

ffi::Error MoeDispatchPlanCpuImpl(ffi::AnyBuffer ids, ffi::AnyBuffer table,
                                  ffi::Result<ffi::AnyBuffer> group,
                                  ffi::Result<ffi::AnyBuffer> dropped,
                                  ffi::Result<ffi::AnyBuffer> routes,
                                  ffi::Result<ffi::AnyBuffer> pair_token,
                                  ffi::Result<ffi::AnyBuffer> choice_row,
                                  ffi::Result<ffi::AnyBuffer> sent, int64_t experts, int64_t parts,
                                  int64_t capacity) {
  MoePlanShape s;
  MoePlanResults r;
  JAX_TMA_RETURN_IF_FAILED(DecodeMoeDispatchPlan(ids, table, group, dropped, routes,
                                                 pair_token, choice_row, sent, experts, parts,
                                                 capacity, &s, &r));
  CountPath(Path::kMoeDispatchPlanCpu);
  const int64_t choices = s.tokens * s.choices, pairs = s.Pairs();
  for (int64_t b = 0; b < s.batch; ++b) {
    MoePlanResults m{r.group + b * s.Local(),       r.dropped + b * choices,
                      r.routes + b * s.parts * kMoePlanColumns, r.pair_token + b * pairs,
                      r.choice_row + b * choices,    r.sent + b * pairs * (s.choices + 1)};
    JAX_TMA_RETURN_IF_FAILED(Route(s, ids.typed_data<int32_t>() + b * choices,
                                   table.typed_data<int32_t>() + b * s.parts * s.Width(), m));
  }
  return ffi::Error::Success();
}

}  // namespace

ffi::Error DecodeMoeDispatchCounts(const ffi::AnyBuffer& ids, const ffi::AnyBuffer& send,
                                   int64_t experts, int64_t parts, MoePlanShape* shape) {
  JAX_TMA_RETURN_IF_FAILED(DecodeIds(ids, experts, parts, shape));
  return CheckArray("send", send.element_type(), ffi::DataType::S32, send.dimensions(),
                    Lead(ids), {parts, shape->Width()}, "a row of counts for each position");
}

ffi::Error DecodeMoeDispatchPlan(const ffi::AnyBuffer& ids, const ffi::AnyBuffer& table,
                                 ffi::Result<ffi::AnyBuffer>& group,
                                 ffi::Result<ffi::AnyBuffer>& dropped,
                                 ffi::Result<ffi::AnyBuffer>& routes,
                                 ffi::Result<ffi::AnyBuffer>& pair_token,
                                 ffi::Result<ffi::AnyBuffer>& choice_row,
                                 ffi::Result<ffi::AnyBuffer>& sent, int64_t experts, int64_t parts,
                                 int64_t capacity, MoePlanShape* shape, MoePlanResults* results) {
  MoePlanShape& s = *shape;
  JAX_TMA_RETURN_IF_FAILED(DecodeIds(ids, experts, parts, &s));
  if (capacity < -1 || capacity > INT32_MAX) {
    return InvalidArgument(kMoePlanOp, "the routing plan's capacity must be -1 (none) or in "
                           "[0, 2^31 - 1], got ", capacity);
  }
  s.capacity = capacity;
  const auto lead = Lead(ids);
  constexpr auto kS32 = ffi::DataType::S32;
  const int64_t T = s.tokens, k = s.choices, n = s.parts, P = s.Pairs();
  JAX_TMA_RETURN_IF_FAILED(CheckArray("table", table.element_type(), kS32, table.dimensions(),
                                      lead, {n, s.Width()}, "a row of counts from each position"));
  JAX_TMA_RETURN_IF_FAILED(CheckArray("group", group->element_type(), kS32, group->dimensions(),
                                      lead, {s.Local()}, "one entry a local expert"));
  JAX_TMA_RETURN_IF_FAILED(CheckArray("dropped", dropped->element_type(), ffi::DataType::PRED,
                                      dropped->dimensions(), lead, {T, k}, "one a choice"));
  JAX_TMA_RETURN_IF_FAILED(CheckArray("routes", routes->element_type(), kS32,
                                      routes->dimensions(), lead, {n, kMoePlanColumns},
                                      "one row a position"));
  JAX_TMA_RETURN_IF_FAILED(CheckArray("pair_token", pair_token->element_type(), kS32,
                                      pair_token->dimensions(), lead, {P},
                                      "T * min(k, n) pairs"));
  JAX_TMA_RETURN_IF_FAILED(CheckArray("choice_row", choice_row->element_type(), kS32,
                                      choice_row->dimensions(), lead, {T, k}, "one a choice"));
  JAX_TMA_RETURN_IF_FAILED(CheckArray("sent", sent->element_type(), kS32, sent->dimensions(),
                                      lead, {P, k + 1}, "a pair's token and its k slots"));
  *results = MoePlanResults{group->typed_data<int32_t>(),      dropped->typed_data<bool>(),
                             routes->typed_data<int32_t>(),     pair_token->typed_data<int32_t>(),
                             choice_row->typed_data<int32_t>(), sent->typed_data<int32_t>()};
  return ffi::Error::Success();
}

void PpermuteRules(Rules* rules) {
  rules->Int("ppermute.moe_plan_max_experts", kMoePlanMaxExperts);
  rules->Int("ppermute.moe_plan_max_parts", kMoePlanMaxParts);
  rules->Int("ppermute.moe_plan_max_choices", kMoePlanMaxChoices);
}

}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTmaMoeDispatchCountsCpu, jax_tma::MoeDispatchCountsCpuImpl,
                              jax_tma::BindMoeDispatchCountsCall(xla::ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTmaMoeDispatchPlanCpu, jax_tma::MoeDispatchPlanCpuImpl,
                              jax_tma::BindMoeDispatchPlanCall(xla::ffi::Ffi::Bind()));
