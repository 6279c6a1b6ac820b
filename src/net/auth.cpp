#include "net/auth.h"

#include <algorithm>
#include <cctype>
#include <string_view>

namespace tern::net {

bool bearer_authorized(const std::string& authorization, const std::string& key) {
  if (key.empty()) return true;
  // The scheme is case-insensitive (RFC 9110, 11.1); one or more spaces before the token.
  static constexpr std::string_view scheme = "bearer";
  const bool bearer = authorization.size() > scheme.size() && authorization[scheme.size()] == ' ' &&
                      std::equal(scheme.begin(), scheme.end(), authorization.begin(), [](char a, char b) {
                        return a == std::tolower(static_cast<unsigned char>(b));
                      });
  const size_t token = bearer ? authorization.find_first_not_of(' ', scheme.size()) : std::string::npos;
  const std::string given = token == std::string::npos ? std::string() : authorization.substr(token);
  const size_t n = std::max(given.size(), key.size());
  unsigned char diff = given.size() == key.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    const unsigned char y = i < key.size() ? static_cast<unsigned char>(key[i]) : 0;
    diff = static_cast<unsigned char>(diff | (x ^ y));
  }
  return diff == 0;
}

}  // namespace tern::net
