// The element arithmetic of the ops that add (col2im, scatter mode="add"),
// identical on the host and the device: which sum an element type takes
// (SumKind), its storage and accumulator types (ElementSum) and the 16-bit
// float conversions they need.
#ifndef JAX_TMA_FFI_ELEMENT_SUM_H_
#define JAX_TMA_FFI_ELEMENT_SUM_H_

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common.h"

namespace jax_tma {

// How one component of an element adds (complex: two components).
enum class SumKind : int32_t { kU8, kU16, kU32, kU64, kF16, kBF16, kF32, kF64 };

// The SumKind of element type `t` and its components per element; false for
// a type that does not add (bool, float8).
inline bool SumKindOf(ffi::DataType t, SumKind* kind, int* components) {
  *components = 1;
  switch (t) {
    case ffi::DataType::S8: case ffi::DataType::U8: *kind = SumKind::kU8; return true;
    case ffi::DataType::S16: case ffi::DataType::U16: *kind = SumKind::kU16; return true;
    case ffi::DataType::S32: case ffi::DataType::U32: *kind = SumKind::kU32; return true;
    case ffi::DataType::S64: case ffi::DataType::U64: *kind = SumKind::kU64; return true;
    case ffi::DataType::F16: *kind = SumKind::kF16; return true;
    case ffi::DataType::BF16: *kind = SumKind::kBF16; return true;
    case ffi::DataType::F32: *kind = SumKind::kF32; return true;
    case ffi::DataType::F64: *kind = SumKind::kF64; return true;
    case ffi::DataType::C64: *kind = SumKind::kF32; *components = 2; return true;
    case ffi::DataType::C128: *kind = SumKind::kF64; *components = 2; return true;
    default: return false;
  }
}

// Whether a bulk reduce-add (cp.reduce.async.bulk .add) sums components of
// kind `k`: 32/64-bit integers, f16, bf16, f32, f64 (complex as its parts).
JAX_TMA_HOST_DEVICE inline bool BulkAddSums(SumKind k) {
  switch (k) {
    case SumKind::kU32: case SumKind::kU64: case SumKind::kF16: case SumKind::kBF16:
    case SumKind::kF32: case SumKind::kF64:
      return true;
    default:
      return false;
  }
}

// 16-bit floats add in f32 and round once to nearest-even; f32 and f64 add in
// their own type; integers add in the unsigned type of their width (wrap).
// A NaN sum is stored as the positive quiet NaN: the GPU's float add returns
// a canonical NaN where x86 propagates an operand's payload, so payloads
// cannot be kept alike on both.

// A bit cast of a u32 to f32, an f32 to u32 or a u64 to f64: a register move
// on the device, where memcpy can cost a stack slot.
template <typename To, typename From>
JAX_TMA_HOST_DEVICE inline To BitCast(From v) {
  static_assert(sizeof(To) == sizeof(From), "a bit cast keeps the size");
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<To, float>) {
    return __uint_as_float(v);
  } else if constexpr (std::is_same_v<To, double>) {
    return __longlong_as_double(static_cast<long long>(v));
  } else {
    return __float_as_uint(v);
  }
#else
  To to;
  std::memcpy(&to, &v, sizeof(To));
  return to;
#endif
}

JAX_TMA_HOST_DEVICE inline float Bf16ToF32(uint16_t h) {
  return BitCast<float>(static_cast<uint32_t>(h) << 16);
}

JAX_TMA_HOST_DEVICE inline uint16_t F32ToBf16(float f) {
  const uint32_t u = BitCast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

JAX_TMA_HOST_DEVICE inline float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in f32
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return BitCast<float>(BitCast<uint32_t>(v) | sign);
  }
  if (exp == 31) return BitCast<float>(sign | 0x7f800000u | (man << 13));
  return BitCast<float>(sign | ((exp + 112u) << 23) | (man << 13));
}

JAX_TMA_HOST_DEVICE inline uint16_t F32ToF16(float f) {
  const uint32_t u = BitCast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to infinity
  if (a < 0x33000000u) return static_cast<uint16_t>(sign);            // below 2^-25: zero
  if (a < 0x38800000u) {  // a half subnormal: round(value / 2^-24)
    const uint32_t man = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - (a >> 23);  // 14..24
    uint32_t q = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  const uint32_t r = a - 0x38000000u;  // rebias 127 -> 15
  return static_cast<uint16_t>(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
}

// Storage and accumulator types per SumKind.
template <SumKind K> struct ElementSum;
template <typename U>
struct WrappingSum {  // integers: the unsigned type of their width
  using T = U; using Acc = U;
  JAX_TMA_HOST_DEVICE static Acc Load(T v) { return v; }
  JAX_TMA_HOST_DEVICE static T Store(Acc a) { return a; }
};
template <> struct ElementSum<SumKind::kU8> : WrappingSum<uint8_t> {};
template <> struct ElementSum<SumKind::kU16> : WrappingSum<uint16_t> {};
template <> struct ElementSum<SumKind::kU32> : WrappingSum<uint32_t> {};
template <> struct ElementSum<SumKind::kU64> : WrappingSum<uint64_t> {};
template <> struct ElementSum<SumKind::kF16> {
  using T = uint16_t; using Acc = float;
  JAX_TMA_HOST_DEVICE static Acc Load(T v) { return F16ToF32(v); }
  JAX_TMA_HOST_DEVICE static T Store(Acc a) { return a != a ? 0x7e00 : F32ToF16(a); }
};
template <> struct ElementSum<SumKind::kBF16> {
  using T = uint16_t; using Acc = float;
  JAX_TMA_HOST_DEVICE static Acc Load(T v) { return Bf16ToF32(v); }
  JAX_TMA_HOST_DEVICE static T Store(Acc a) { return a != a ? 0x7fc0 : F32ToBf16(a); }
};
template <> struct ElementSum<SumKind::kF32> {
  using T = float; using Acc = float;
  JAX_TMA_HOST_DEVICE static Acc Load(T v) { return v; }
  JAX_TMA_HOST_DEVICE static T Store(Acc a) { return a != a ? BitCast<float>(0x7fc00000u) : a; }
};
template <> struct ElementSum<SumKind::kF64> {
  using T = double; using Acc = double;
  JAX_TMA_HOST_DEVICE static Acc Load(T v) { return v; }
  JAX_TMA_HOST_DEVICE static T Store(Acc a) {
    return a != a ? BitCast<double>(0x7ff8000000000000ull) : a;
  }
};

// What a sum of one or more addends starts from: -0.0 for floats, IEEE's
// additive identity (-0.0 + v is v for every v, -0.0 included, where +0.0 +
// -0.0 is +0.0), so that a sum whose addends are all -0.0 is -0.0, as the
// sum of one -0.0 is (XLA's transpose of a lone slice gives it back); 0 for
// integers. A sum of no addends is +0 (zeros, as XLA's transposes write
// where nothing lands): callers store EmptySum<K>() there.
template <SumKind K>
JAX_TMA_HOST_DEVICE constexpr typename ElementSum<K>::Acc SumStart() {
  using Acc = typename ElementSum<K>::Acc;
  if constexpr (std::is_floating_point_v<Acc>) {
    return static_cast<Acc>(-0.0);
  } else {
    return Acc{0};
  }
}

template <SumKind K>
JAX_TMA_HOST_DEVICE constexpr typename ElementSum<K>::Acc EmptySum() {
  return typename ElementSum<K>::Acc{0};
}

// Runs fn.template operator()<K>() for `kind`.
template <typename Fn>
auto DispatchSumKind(SumKind kind, Fn&& fn) {
  switch (kind) {
    case SumKind::kU8: return fn.template operator()<SumKind::kU8>();
    case SumKind::kU16: return fn.template operator()<SumKind::kU16>();
    case SumKind::kU32: return fn.template operator()<SumKind::kU32>();
    case SumKind::kU64: return fn.template operator()<SumKind::kU64>();
    case SumKind::kF16: return fn.template operator()<SumKind::kF16>();
    case SumKind::kBF16: return fn.template operator()<SumKind::kBF16>();
    case SumKind::kF32: return fn.template operator()<SumKind::kF32>();
    default: return fn.template operator()<SumKind::kF64>();
  }
}

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_ELEMENT_SUM_H_
