// Error-message text without iostreams. Handlers format numbers with
// std::to_chars, which touches no locale state: a module whose toolchain links
// libstdc++ statically carries a second copy of the locale machinery, and
// streams there can fail or crash (README, "Installing").
#ifndef JAX_TMA_FFI_MESSAGE_H_
#define JAX_TMA_FFI_MESSAGE_H_

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace jax_tma {

// Appends text, integers (decimal), floating-point values (shortest
// round-trip form) and pointers (0x-prefixed hex) to a string.
class Message {
 public:
  Message& operator<<(std::string_view s) {
    text_.append(s.data(), s.size());
    return *this;
  }
  Message& operator<<(const char* s) { return *this << std::string_view(s); }
  Message& operator<<(const std::string& s) { return *this << std::string_view(s); }
  Message& operator<<(char c) {
    text_.push_back(c);
    return *this;
  }
  Message& operator<<(bool b) { return *this << (b ? "true" : "false"); }
  Message& operator<<(const void* p) {
    *this << "0x";
    return Append(reinterpret_cast<std::uintptr_t>(p), 16);
  }
  template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T> ||
                                                    std::is_enum_v<T>>>
  Message& operator<<(T v) {
    if constexpr (std::is_enum_v<T>) {
      return *this << static_cast<std::underlying_type_t<T>>(v);
    } else if constexpr (std::is_floating_point_v<T>) {
      char buf[64];
      const auto r = std::to_chars(buf, buf + sizeof(buf), v);
      text_.append(buf, r.ptr);
      return *this;
    } else {
      return Append(v, 10);
    }
  }

  // The text so far.
  const std::string& str() const { return text_; }

 private:
  template <typename T>
  Message& Append(T v, int base) {
    char buf[72];  // 64 binary digits and a sign fit
    const auto r = std::to_chars(buf, buf + sizeof(buf), v, base);
    text_.append(buf, r.ptr);
    return *this;
  }

  std::string text_;
};

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_MESSAGE_H_
