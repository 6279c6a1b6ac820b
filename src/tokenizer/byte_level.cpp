#include "tokenizer/byte_level.h"

#include <unordered_map>

#include "tokenizer/unicode.h"

namespace tern::tokenizer::byte_level {
namespace {

struct Tables {
  std::array<char32_t, 256> to_char{};
  std::unordered_map<char32_t, unsigned char> to_byte;
  Tables() {
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_char[b] = printable ? static_cast<char32_t>(b) : next++;
      to_byte[to_char[b]] = static_cast<unsigned char>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

char32_t char_of_byte(unsigned char b) { return tables().to_char[b]; }

std::optional<unsigned char> byte_of_char(char32_t c) {
  const auto& m = tables().to_byte;
  const auto it = m.find(c);
  if (it == m.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> to_bytes(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  for (std::size_t pos = 0; pos < token.size();) {
    const auto b = byte_of_char(unicode::decode_at(token, pos));
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
  }
  return out;
}

std::string from_bytes(std::string_view bytes) {
  std::string out;
  for (const char b : bytes) unicode::append_utf8(out, char_of_byte(static_cast<unsigned char>(b)));
  return out;
}

}  // namespace tern::tokenizer::byte_level
