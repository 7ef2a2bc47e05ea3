// Shared host-side helpers for every jax_tma FFI handler (CPU and CUDA):
// error construction, byte-level views of XLA buffers, and the "method"
// attribute that Python passes.
#ifndef JAX_TMA_FFI_COMMON_H_
#define JAX_TMA_FFI_COMMON_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "message.h"
#include "xla/ffi/api/ffi.h"

// Marks helpers shared by host code and CUDA kernels, and keeps a function
// out of line (a cold path whose code would otherwise sit in a hot one).
#if defined(__CUDACC__)
#define JAX_TMA_HOST_DEVICE __host__ __device__
#define JAX_TMA_NOINLINE __noinline__
#else
#define JAX_TMA_HOST_DEVICE
#define JAX_TMA_NOINLINE __attribute__((noinline))
#endif

// Returns the ffi::Error of `expr` from the enclosing handler if it failed.
#define JAX_TMA_RETURN_IF_FAILED(expr)                                      \
  do {                                                                      \
    ::xla::ffi::Error jax_tma_error_ = (expr);                              \
    if (jax_tma_error_.failure()) return jax_tma_error_;                    \
  } while (0)

namespace jax_tma {

namespace ffi = xla::ffi;

// Builds "op: message" from parts that Message formats, e.g.
// InvalidArgument("jax_tma.copy", "input has ", n, " bytes").
template <typename... Parts>
ffi::Error InvalidArgument(std::string_view op, const Parts&... parts) {
  Message m;
  m << op << ": ";
  (m << ... << parts);
  return ffi::Error::InvalidArgument(m.str());
}

// Sub-byte types have no defined byte layout at the FFI boundary (ByteWidth
// reports 1 byte per element for them); Python widens them before the call.
inline bool IsSubByte(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::S1:
    case ffi::DataType::S2:
    case ffi::DataType::S4:
    case ffi::DataType::U1:
    case ffi::DataType::U2:
    case ffi::DataType::U4:
    case ffi::DataType::F4E2M1FN:
      return true;
    default:
      return false;
  }
}

// Every element type at the FFI boundary with XLA's short name (error
// messages) and NumPy's (the rule tables Python reads, rules.h).
struct ElementTypeName {
  ffi::DataType type;
  const char* xla;
  const char* numpy;
};
inline constexpr ElementTypeName kElementTypeNames[] = {
    {ffi::DataType::PRED, "pred", "bool"},
    {ffi::DataType::S1, "s1", "int1"},
    {ffi::DataType::S2, "s2", "int2"},
    {ffi::DataType::S4, "s4", "int4"},
    {ffi::DataType::S8, "s8", "int8"},
    {ffi::DataType::S16, "s16", "int16"},
    {ffi::DataType::S32, "s32", "int32"},
    {ffi::DataType::S64, "s64", "int64"},
    {ffi::DataType::U1, "u1", "uint1"},
    {ffi::DataType::U2, "u2", "uint2"},
    {ffi::DataType::U4, "u4", "uint4"},
    {ffi::DataType::U8, "u8", "uint8"},
    {ffi::DataType::U16, "u16", "uint16"},
    {ffi::DataType::U32, "u32", "uint32"},
    {ffi::DataType::U64, "u64", "uint64"},
    {ffi::DataType::F16, "f16", "float16"},
    {ffi::DataType::BF16, "bf16", "bfloat16"},
    {ffi::DataType::F32, "f32", "float32"},
    {ffi::DataType::F64, "f64", "float64"},
    {ffi::DataType::C64, "c64", "complex64"},
    {ffi::DataType::C128, "c128", "complex128"},
    {ffi::DataType::F8E5M2, "f8e5m2", "float8_e5m2"},
    {ffi::DataType::F8E4M3, "f8e4m3", "float8_e4m3"},
    {ffi::DataType::F8E4M3FN, "f8e4m3fn", "float8_e4m3fn"},
    {ffi::DataType::F8E4M3B11FNUZ, "f8e4m3b11fnuz", "float8_e4m3b11fnuz"},
    {ffi::DataType::F8E5M2FNUZ, "f8e5m2fnuz", "float8_e5m2fnuz"},
    {ffi::DataType::F8E4M3FNUZ, "f8e4m3fnuz", "float8_e4m3fnuz"},
    {ffi::DataType::F8E3M4, "f8e3m4", "float8_e3m4"},
    {ffi::DataType::F8E8M0FNU, "f8e8m0fnu", "float8_e8m0fnu"},
    {ffi::DataType::F4E2M1FN, "f4e2m1fn", "float4_e2m1fn"},
};

// XLA's short name of an element type, for error messages.
inline const char* DataTypeName(ffi::DataType t) {
  for (const ElementTypeName& e : kElementTypeNames) {
    if (e.type == t) return e.xla;
  }
  return "unknown";
}

// TMA's granule: the addresses, sizes and strides that bulk copies and
// tensor maps move are multiples of 16 bytes.
inline constexpr int64_t kTmaAlignBytes = 16;
// TMA exists from compute capability 9.0 (Hopper) on.
inline constexpr int kTmaMinComputeMajor = 9;

// A string attribute outside its choices, spelled as Python's
// _checks.check_choice spells it: "jax_tma.<op>: method must be one of
// 'auto', 'tma', 'simt', got 'fast'".
inline ffi::Error BadChoice(std::string_view op, std::string_view name, std::string_view value,
                            std::initializer_list<std::string_view> choices) {
  Message m;
  m << op << ": " << name << " must be one of ";
  const char* sep = "";
  for (std::string_view c : choices) {
    m << sep << "'" << c << "'";
    sep = ", ";
  }
  m << ", got '" << value << "'";
  return ffi::Error::InvalidArgument(m.str());
}

// The "method" attribute of the families that choose between a TMA kernel and
// a SIMT one: the family's plan picks the kernel from the geometry and the
// device ("auto"), the TMA kernel or an error naming the broken rule ("tma"),
// or the SIMT kernel ("simt"). A family with other kernels has methods of its
// own.
enum class Method { kAuto, kTma, kSimt };

// Which spellings of Method::kTma a family accepts: kTmaOrBulk takes "bulk"
// too, for the families whose Python API sent it before "tma".
enum class TmaSpelling { kTma, kTmaOrBulk };

// Parses a handler's "method" attribute; the error names `op` and the
// choices.
inline ffi::Error ParseMethod(std::string_view op, std::string_view name, Method* out,
                              TmaSpelling spelling = TmaSpelling::kTma) {
  const bool bulk = spelling == TmaSpelling::kTmaOrBulk;
  if (name == "auto") {
    *out = Method::kAuto;
  } else if (name == "tma" || (bulk && name == "bulk")) {
    *out = Method::kTma;
  } else if (name == "simt") {
    *out = Method::kSimt;
  } else if (bulk) {
    return BadChoice(op, "method", name, {"auto", "tma", "bulk", "simt"});
  } else {
    return BadChoice(op, "method", name, {"auto", "tma", "simt"});
  }
  return ffi::Error::Success();
}

// The element-type rules every handler shares: the output has the input's
// type, and that type is not a sub-byte one (Python widens those).
inline ffi::Error CheckElementTypes(std::string_view op, ffi::DataType in, ffi::DataType out) {
  if (in != out) {
    return InvalidArgument(op, "output element type ", DataTypeName(out),
                           " differs from input element type ", DataTypeName(in));
  }
  if (IsSubByte(in)) {
    return InvalidArgument(op, "sub-byte element type ", DataTypeName(in),
                           " must be widened before the call");
  }
  return ffi::Error::Success();
}

// The byte range a whole-buffer copy moves, after re-checking what the kernels
// rely on: same dtype, same element count, real pointers for non-empty data.
struct ByteCopy {
  const void* src = nullptr;
  void* dst = nullptr;
  std::size_t bytes = 0;
};

inline ffi::Error CheckWholeCopy(std::string_view op, const ffi::AnyBuffer& x,
                                 ffi::Result<ffi::AnyBuffer>& y, ByteCopy* out) {
  JAX_TMA_RETURN_IF_FAILED(CheckElementTypes(op, x.element_type(), y->element_type()));
  if (x.element_count() != y->element_count()) {
    return InvalidArgument(op, "output has ", y->element_count(),
                           " elements but input has ", x.element_count());
  }
  *out = ByteCopy{x.untyped_data(), y->untyped_data(), x.size_bytes()};
  if (out->bytes != 0 && (out->src == nullptr || out->dst == nullptr)) {
    return InvalidArgument(op, "null buffer for a ", out->bytes, "-byte copy");
  }
  return ffi::Error::Success();
}

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_COMMON_H_
