// Standalone driver of the gather/scatter kernels (TMA bulk pipeline, SIMT,
// ordered deterministic scatter) for compute-sanitizer, without JAX: random
// geometries (batch and outer dims, out-of-range and negative indices of
// every integer type, slabs on and off the 16-byte grid, slabs split into
// pieces) checked byte for byte against a host evaluation of
// gather_common.h; outputs poisoned and guarded by a poisoned tail; some
// cases move several tables in one launch (GatherTables). Exit status 1 on
// any mismatch or launch error.
//   usage: gather_selftest [seed]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gather/gather_launch.h"

namespace {

using jax_tma::GatherGeometry;
using jax_tma::GatherOp;
using jax_tma::SumKind;

constexpr uint8_t kPoison = 0xA5;
constexpr size_t kTail = 64;  // poisoned bytes past every output

bool Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
  return err == cudaSuccess;
}

template <typename T>
T* ToDevice(const std::vector<T>& v, size_t extra_bytes = 0, bool* ok = nullptr) {
  void* d = nullptr;
  const size_t bytes = v.size() * sizeof(T);
  bool good = Check(cudaMalloc(&d, bytes + extra_bytes + 16), "malloc") &&
              Check(cudaMemset(d, kPoison, bytes + extra_bytes + 16), "memset") &&
              (bytes == 0 || Check(cudaMemcpy(d, v.data(), bytes, cudaMemcpyHostToDevice), "h2d"));
  if (ok != nullptr) *ok = *ok && good;
  return static_cast<T*>(d);
}

// a + b as ElementSum<K> adds, on raw little-endian element bytes.
template <SumKind K>
void AddElement(uint8_t* a, const uint8_t* b) {
  using S = jax_tma::ElementSum<K>;
  typename S::T x, y;
  std::memcpy(&x, a, sizeof(x));
  std::memcpy(&y, b, sizeof(y));
  x = S::Store(static_cast<typename S::Acc>(S::Load(x) + S::Load(y)));
  std::memcpy(a, &x, sizeof(x));
}

struct HostAdd {
  uint8_t* dst;
  const uint8_t* src;
  int64_t bytes;
  template <SumKind K>
  void operator()() const {
    using T = typename jax_tma::ElementSum<K>::T;
    for (int64_t o = 0; o < bytes; o += sizeof(T)) AddElement<K>(dst + o, src + o);
  }
};

enum class Path { kBulk, kSimt, kOrdered };
const char* PathName(Path p) { return p == Path::kBulk ? "bulk" : p == Path::kSimt ? "simt" : "ordered"; }

// Cases per kind of launch.
struct Counts {
  int bulk = 0;    // on the bulk path
  int multi = 0;   // of several tables
  int narrow = 0;  // on the flat kernels' instantiation for their index type
  int wide = 0;    // flat, in blocks of kSimtFlatWaveThreads
};

// One random case; false on a mismatch or an error.
bool RunCase(std::mt19937_64& gen, int trial, Counts* counts) {
  auto pick = [&](int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(gen() % (hi - lo + 1)); };
  GatherGeometry g;
  const int op_pick = trial % 3;
  const GatherOp op = op_pick == 0 ? GatherOp::kGather
                      : op_pick == 1 ? GatherOp::kScatterSet : GatherOp::kScatterAdd;
  g.mode = op == GatherOp::kScatterAdd ? jax_tma::ScatterMode::kAdd : jax_tma::ScatterMode::kSet;
  // Half the cases have no batch or outer dims: with one table in 16-byte
  // vectors (or a small call), the flat kernels' narrow instantiations.
  const bool plain = trial / 3 % 2 == 0;
  g.batch = plain ? 1 : pick(1, 2);
  g.outer = plain ? 1 : pick(1, 3);
  g.table_rows = pick(1, 40);
  g.count = pick(0, 50);
  const int64_t widths[] = {1, 2, 4, 8, 16};
  g.elem_bytes = widths[pick(0, 4)];
  if (op == GatherOp::kScatterAdd) {
    const SumKind kinds[] = {SumKind::kU8, SumKind::kU16, SumKind::kU32, SumKind::kU64,
                             SumKind::kF16, SumKind::kBF16, SumKind::kF32, SumKind::kF64};
    g.sum = kinds[pick(0, 7)];
    const int64_t kb[] = {1, 2, 4, 8, 2, 2, 4, 8};
    g.elem_bytes = kb[static_cast<int>(g.sum)];
  }
  // Slab sizes: 16-B multiples (1 to 64 rows a unit, or pieces), and odd ones.
  const int shape = trial % 5;
  int64_t bytes = shape == 0 ? 16 * pick(1, 8) : shape == 1 ? 16 * pick(60, 200)
                  : shape == 2 ? 16 * pick(1100, 2600) : g.elem_bytes * pick(1, 40);
  g.slab_bytes = (bytes + g.elem_bytes - 1) / g.elem_bytes * g.elem_bytes;
  const bool integer_add = op == GatherOp::kScatterAdd && static_cast<int>(g.sum) <= 3;
  // Half the scatters take the ordered kernel; the others have no order
  // that matters: sets write each row once, float adds sum small integers
  // (exact in every order and format).
  g.deterministic = op != GatherOp::kGather && gen() % 2 == 0;

  const int64_t b = g.batch, m = g.count, n = g.table_rows, s = g.slab_bytes;
  std::vector<int32_t> idx(b * m);
  for (auto& v : idx) v = static_cast<int32_t>(pick(-n - 2, n + 1));
  if (op == GatherOp::kScatterSet && !g.deterministic) {  // one update per row
    for (int64_t i = 0; i < b; ++i) {
      std::vector<bool> seen(n, false);
      for (int64_t j = 0; j < m; ++j) {
        int32_t& v = idx[i * m + j];
        const int64_t w = jax_tma::SlabRow(&v, jax_tma::IndexKind::kS32, 0, n);
        if (w >= 0 && seen[w]) v = static_cast<int32_t>(n);
        if (w >= 0) seen[w] = true;
      }
    }
  }
  // Every index type (the flat kernels have an instantiation for each):
  // values in [-42, 41] are themselves in every signed type, and negative
  // ones out of range in the unsigned types, so no new duplicates arise.
  g.index_kind = static_cast<jax_tma::IndexKind>(trial % 16 < 8 ? 2 : pick(0, 7));
  const int width = 1 << (static_cast<int>(g.index_kind) & 3);
  std::vector<uint8_t> idx_bytes(idx.size() * width);
  for (size_t i = 0; i < idx.size(); ++i) {
    const int64_t v = idx[i];  // its low `width` bytes, little-endian
    std::memcpy(idx_bytes.data() + i * width, &v, width);
  }
  std::vector<int32_t> order(g.deterministic ? b * m : 0);
  for (int64_t i = 0; g.deterministic && i < b; ++i) {
    auto key = [&](int64_t j) {
      const int64_t w = jax_tma::SlabRow(idx_bytes.data(), g.index_kind, i * m + j, n);
      return w < 0 ? n : w;
    };
    std::iota(order.begin() + i * m, order.begin() + (i + 1) * m, 0);
    std::stable_sort(order.begin() + i * m, order.begin() + (i + 1) * m,
                     [&](int32_t x, int32_t y) { return key(x) < key(y); });
  }
  // Some cases move several tables through the same indices in one launch
  // (GatherTables), each with its own buffers.
  const int table_count = trial % 8 >= 5 ? static_cast<int>(pick(2, 3)) : 1;
  const int64_t table_bytes = b * g.outer * n * s, rows_bytes = b * g.outer * m * s;
  const size_t want_bytes = op == GatherOp::kGather ? rows_bytes : table_bytes;
  bool ok = true;
  uint8_t* d_idx = ToDevice(idx_bytes, 0, &ok);
  int32_t* d_order = ToDevice(order, 0, &ok);
  std::vector<void*> buffers = {d_idx, d_order};
  std::vector<std::vector<uint8_t>> wants;
  jax_tma::GatherTables tables;
  for (int t = 0; t < table_count; ++t) {
    // Random bits everywhere; float adds get small finite values instead
    // (multiples of 1/64 in index order, integers in [-4, 4] in any order).
    std::vector<uint8_t> table(table_bytes),
        slabs(op == GatherOp::kGather ? g.elem_bytes : rows_bytes);
    for (auto& v : table) v = static_cast<uint8_t>(gen());
    for (auto& v : slabs) v = static_cast<uint8_t>(gen());
    if (op == GatherOp::kScatterAdd && !integer_add) {
      for (auto* buf : {&table, &slabs}) {
        for (size_t o = 0; o < buf->size(); o += g.elem_bytes) {
          const float f = g.deterministic
                              ? static_cast<float>(static_cast<int>(gen() % 2001) - 1000) / 64.0f
                              : static_cast<float>(static_cast<int>(gen() % 9) - 4);
          uint8_t* e = buf->data() + o;
          if (g.sum == SumKind::kF32) std::memcpy(e, &f, 4);
          else if (g.sum == SumKind::kF64) { const double d = f; std::memcpy(e, &d, 8); }
          else if (g.sum == SumKind::kF16) { const uint16_t h = jax_tma::F32ToF16(f); std::memcpy(e, &h, 2); }
          else { const uint16_t h = jax_tma::F32ToBf16(f); std::memcpy(e, &h, 2); }
        }
      }
    }

    // The host evaluation: the CPU handler's row order.
    g.indices = idx_bytes.data();
    std::vector<uint8_t> want(want_bytes);
    if (op == GatherOp::kGather) {
      for (int64_t r = 0; r < g.rows(); ++r) {
        const int64_t row = g.TableRow(r);
        for (int64_t o = 0; o < s; ++o) {
          want[r * s + o] = row >= 0 ? table[row * s + o] : slabs[o % g.elem_bytes];
        }
      }
    } else {
      want = table;
      for (int64_t r = 0; r < g.rows(); ++r) {
        const int64_t row = g.TableRow(r);
        if (row < 0) continue;
        if (op == GatherOp::kScatterSet) {
          std::memcpy(want.data() + row * s, slabs.data() + r * s, s);
        } else {
          jax_tma::DispatchSumKind(g.sum, HostAdd{want.data() + row * s, slabs.data() + r * s, s});
        }
      }
    }
    wants.push_back(std::move(want));

    uint8_t* d_table = ToDevice(table, 0, &ok);
    uint8_t* d_slabs = op == GatherOp::kGather ? nullptr : ToDevice(slabs, 0, &ok);
    uint8_t* d_out = op == GatherOp::kGather
                         ? ToDevice(std::vector<uint8_t>(), rows_bytes + kTail, &ok)
                         : ToDevice(table, kTail, &ok);  // in place
    buffers.insert(buffers.end(), {d_table, d_slabs, d_out});
    GatherGeometry gt = g;
    gt.x = op == GatherOp::kGather ? d_table : d_out;
    gt.out = d_out;
    if (op == GatherOp::kGather) {  // the fill element, repeated to 16 bytes (ffi/fill.h)
      uint8_t pattern[16];
      for (int k = 0; k < 16; ++k) pattern[k] = slabs[k % g.elem_bytes];
      std::memcpy(&gt.fill.lo, pattern, 8);
      std::memcpy(&gt.fill.hi, pattern + 8, 8);
    } else {
      gt.slabs = d_slabs;
    }
    tables.Add(gt);
  }
  g.indices = d_idx;
  g.order = d_order;
  g.table_bytes = table_bytes;

  Path path = Path::kSimt;
  std::string why;
  bool bulk_fits = true;
  for (int t = 0; t < table_count; ++t) {
    bulk_fits = bulk_fits && jax_tma::BulkGatherFits(tables.Of(g, t), op, &why);
  }
  if (g.deterministic) {
    path = Path::kOrdered;
  } else if (trial % 2 == 0 && bulk_fits) {
    path = Path::kBulk;
  }
  counts->bulk += path == Path::kBulk;
  counts->multi += table_count > 1;
  // The tiling is planned on table 0 (the launchers read its geometry).
  const GatherGeometry g0 = tables.Of(g, 0);
  if (ok && g.rows() != 0) {
    xla::ffi::Error err = xla::ffi::Error::Success();
    if (path == Path::kBulk) {
      err = jax_tma::LaunchBulkGather(g0, tables, op, jax_tma::TileBulkGather(g0, 132), nullptr,
                                      0);
    } else if (path == Path::kSimt) {
      // A one-SM tiling on some trials keeps the small cases' tiles whole.
      const int sms = trial % 4 == 1 ? 1 : 132;
      const jax_tma::SimtGatherTiling t = jax_tma::TileSimtGather(g0, op, sms);
      counts->narrow += t.narrow && table_count == 1;
      counts->wide += t.flat && t.flat_threads == jax_tma::kSimtFlatWaveThreads;
      err = jax_tma::LaunchSimtGather(g0, tables, op, t, nullptr, 0);
    } else {
      err = jax_tma::LaunchOrderedScatter(g0, tables, nullptr, 0);
    }
    if (err.failure()) {
      std::fprintf(stderr, "launch failed: %s\n", err.message().c_str());
      ok = false;
    }
  }
  ok = ok && Check(cudaDeviceSynchronize(), "sync");
  bool same = true, tail_ok = true;
  for (int t = 0; ok && t < table_count; ++t) {
    std::vector<uint8_t> got(want_bytes + kTail);
    ok = Check(cudaMemcpy(got.data(), tables.out[t], got.size(), cudaMemcpyDeviceToHost), "d2h");
    for (size_t i = want_bytes; i < got.size(); ++i) tail_ok &= got[i] == kPoison;
    got.resize(want_bytes);
    same = same && got == wants[t];
  }
  for (void* p : buffers) cudaFree(p);
  same = same && tail_ok;
  if (!ok || !same) {
    std::fprintf(stderr,
                 "%s: op=%d path=%s tables=%d B=%lld P=%lld N=%lld M=%lld slab=%lld B "
                 "elem=%lld B sum=%d deterministic=%d index kind=%d%s\n",
                 ok ? "mismatch" : "error", static_cast<int>(op), PathName(path), table_count,
                 static_cast<long long>(b), static_cast<long long>(g.outer),
                 static_cast<long long>(n), static_cast<long long>(m), static_cast<long long>(s),
                 static_cast<long long>(g.elem_bytes), static_cast<int>(g.sum), g.deterministic,
                 static_cast<int>(g.index_kind), tail_ok ? "" : " (wrote past the end)");
  }
  return ok && same;
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t seed = argc > 1 ? std::stoull(argv[1]) : std::random_device{}();
  std::mt19937_64 gen(seed);
  int cases = 0, failures = 0;
  Counts counts;
  for (int trial = 0; trial < 90; ++trial) {
    ++cases;
    failures += !RunCase(gen, trial, &counts);
    if (cudaPeekAtLastError() != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
      std::printf("gather_selftest: seed %llu: sticky CUDA error after %d cases\n",
                  static_cast<unsigned long long>(seed), cases);
      return 1;
    }
  }
  std::printf("gather_selftest: seed %llu: %d cases (%d on the bulk path, %d of several tables, "
              "%d narrow, %d flat in blocks of %d), %d failures\n",
              static_cast<unsigned long long>(seed), cases, counts.bulk, counts.multi,
              counts.narrow, counts.wide, jax_tma::kSimtFlatWaveThreads, failures);
  return failures == 0 ? 0 : 1;
}
