#include "net/room.h"

#include "core/error.h"

namespace tern::net {

std::string room_hex(uint64_t room) {
  static const char* digits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, room >>= 4) s[i] = digits[room & 15];
  return s;
}

uint64_t parse_room(std::string_view hex) {
  TERN_CHECK(!hex.empty() && hex.size() <= 16, "room id: expected 1 to 16 hex digits, found \"", hex, "\"");
  uint64_t v = 0;
  for (char c : hex) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    TERN_CHECK(d >= 0, "room id: expected hex digits, found \"", hex, "\"");
    v = v << 4 | static_cast<uint64_t>(d);
  }
  return v;
}

}  // namespace tern::net
