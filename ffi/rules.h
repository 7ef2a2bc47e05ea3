// The constants and rule tables that Python checks against, owned by the C++
// that enforces them and handed to Python by module.cc (jax_tma._jax_tma.rules(),
// read through jax_tma._ffi.rules()): no rule is spelled a second time in
// Python. module.cc adds the rules every family shares; a family adds its own
// through a JAX_TMA_RULES(Name) line in its manifest, defining
// jax_tma::<Name>Rules in its CPU source (always built).
#ifndef JAX_TMA_FFI_RULES_H_
#define JAX_TMA_FFI_RULES_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common.h"

namespace jax_tma {

struct Rules {
  // Named integers, e.g. {"<family>.max_tables", 8}.
  std::vector<std::pair<std::string, int64_t>> ints;
  // Named tuples of integers, e.g. {"<family>.cluster_sizes", {2, 4, 8, 16}}.
  std::vector<std::pair<std::string, std::vector<int64_t>>> tuples;
  // Named sets of element types, by NumPy's names, e.g. {"summed_dtypes", {"int8", ...}}.
  std::vector<std::pair<std::string, std::vector<std::string>>> dtypes;
  // Named words of a rule that Python states as the handlers do, e.g.
  // {"<family>.<rule>", "order='channel_major' has no TMA path ..."}.
  std::vector<std::pair<std::string, std::string>> texts;

  void Int(std::string name, int64_t value) { ints.emplace_back(std::move(name), value); }
  void Tuple(std::string name, std::vector<int64_t> values) {
    tuples.emplace_back(std::move(name), std::move(values));
  }
  void Text(std::string name, std::string_view words) {
    texts.emplace_back(std::move(name), std::string(words));
  }
  // The element types for which keep(type) holds.
  template <typename Keep>
  void Dtypes(std::string name, Keep keep) {
    std::vector<std::string> names;
    for (const ElementTypeName& e : kElementTypeNames) {
      if (keep(e.type)) names.emplace_back(e.numpy);
    }
    dtypes.emplace_back(std::move(name), std::move(names));
  }
};

#define JAX_TMA_RULES(Name) void Name##Rules(Rules* rules);
#include "families.inc"

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_RULES_H_
