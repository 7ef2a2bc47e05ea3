// CPU handlers of "jax_tma_gather" and "jax_tma_scatter": the reference
// semantics of gather_common.h on the host, one slab row at a time in row
// order. Scatter therefore always applies its updates in index order: the
// last duplicate wins under set, and add sums in index order (what
// deterministic=True gives on the GPU too). Every method name is accepted.
#include <cstring>
#include <string_view>

#include "gather/gather_common.h"
#include "handlers.h"
#include "keep_subnormals.h"
#include "path_counts.h"
#include "rules.h"

namespace jax_tma {
namespace {

void GatherTable(const GatherGeometry& g) {
  const auto* table = static_cast<const uint8_t*>(g.x);
  auto* dst = static_cast<uint8_t*>(g.out);
  const auto s = static_cast<size_t>(g.slab_bytes);
  if (s == 0) return;
  uint8_t fill[16];
  std::memcpy(fill, &g.fill.lo, 8);
  std::memcpy(fill + 8, &g.fill.hi, 8);
  for (int64_t r = 0; r < g.rows(); ++r, dst += s) {
    const int64_t row = g.TableRow(r);
    if (row >= 0) {
      std::memcpy(dst, table + static_cast<size_t>(row) * s, s);
    } else {
      for (size_t o = 0; o < s; o += 16) std::memcpy(dst + o, fill, s - o < 16 ? s - o : 16);
    }
  }
}

ffi::Error GatherCpuImpl(ffi::AnyBuffer indices, ffi::RemainingArgs args,
                         ffi::RemainingRets rets, int64_t axis, int64_t batch,
                         ffi::Span<const int64_t> fill, std::string_view method) {
  GatherGeometry gs[kMaxGatherTables];
  size_t n = 0;
  JAX_TMA_RETURN_IF_FAILED(
      DecodeGatherCall(indices, args, rets, axis, batch, fill, method, gs, &n));
  CountPath(Path::kGatherCpu);
  for (size_t t = 0; t < n; ++t) GatherTable(gs[t]);
  return ffi::Error::Success();
}

// out[row] += updates[r], component by component, rounded to the element
// type after every add (as XLA's sequential scatter-add rounds).
struct AddRows {
  const GatherGeometry& g;

  template <SumKind K>
  void operator()() const {
    using S = ElementSum<K>;
    using T = typename S::T;
    const int64_t n = g.slab_bytes / static_cast<int64_t>(sizeof(T));
    const T* src = static_cast<const T*>(g.slabs);
    T* dst = static_cast<T*>(g.out);
    for (int64_t r = 0; r < g.rows(); ++r, src += n) {
      const int64_t row = g.TableRow(r);
      if (row < 0) continue;
      T* d = dst + row * n;
      for (int64_t e = 0; e < n; ++e) {
        d[e] = S::Store(static_cast<typename S::Acc>(S::Load(d[e]) + S::Load(src[e])));
      }
    }
  }
};

void ScatterTable(const GatherGeometry& g) {
  // Not aliased (x still live elsewhere, or a raw call): start from a copy.
  if (g.out != g.x && g.table_bytes != 0) {
    std::memcpy(g.out, g.x, static_cast<size_t>(g.table_bytes));
  }
  if (g.slab_bytes == 0) return;
  if (g.mode == ScatterMode::kAdd) {
    KeepSubnormals keep;
    DispatchSumKind(g.sum, AddRows{g});
    return;
  }
  const auto s = static_cast<size_t>(g.slab_bytes);
  const auto* src = static_cast<const uint8_t*>(g.slabs);
  auto* dst = static_cast<uint8_t*>(g.out);
  for (int64_t r = 0; r < g.rows(); ++r, src += s) {
    const int64_t row = g.TableRow(r);
    if (row >= 0) std::memcpy(dst + static_cast<size_t>(row) * s, src, s);
  }
}

ffi::Error ScatterCpuImpl(ffi::AnyBuffer indices, ffi::AnyBuffer order, ffi::RemainingArgs args,
                          ffi::RemainingRets rets, int64_t axis, int64_t batch,
                          std::string_view mode, bool deterministic, std::string_view method) {
  GatherGeometry gs[kMaxGatherTables];
  size_t n = 0;
  JAX_TMA_RETURN_IF_FAILED(DecodeScatterCall(indices, order, args, rets, axis, batch, mode,
                                             deterministic, method, gs, &n));
  CountPath(Path::kScatterCpu);
  for (size_t t = 0; t < n; ++t) ScatterTable(gs[t]);
  return ffi::Error::Success();
}

}  // namespace

void GatherRules(Rules* rules) {
  rules->Int("gather.max_tables", kMaxGatherTables);
  rules->Dtypes("gather.bulk_add_dtypes", [](ffi::DataType t) {
    SumKind kind;
    int components;
    return SumKindOf(t, &kind, &components) && BulkAddSums(kind);
  });
}

}  // namespace jax_tma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTmaGatherCpu, jax_tma::GatherCpuImpl,
                              jax_tma::BindGatherCall(xla::ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxTmaScatterCpu, jax_tma::ScatterCpuImpl,
                              jax_tma::BindScatterCall(xla::ffi::Ffi::Bind()));
