#include "core/hex.h"

namespace tern {

std::string to_hex(const void* bytes, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    const auto b = static_cast<const unsigned char*>(bytes)[i];
    s += kDigits[b >> 4];
    s += kDigits[b & 15];
  }
  return s;
}

bool from_hex(std::string_view digits, void* out, size_t n) {
  if (digits.size() != 2 * n) return false;
  const auto value = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  for (size_t i = 0; i < n; ++i) {
    const int hi = value(digits[2 * i]), lo = value(digits[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    static_cast<unsigned char*>(out)[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return true;
}

}  // namespace tern
