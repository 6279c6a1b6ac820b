#include "core/env.h"

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <system_error>

#include "core/error.h"

namespace tern {
namespace {

// `NAME="value"`: the start of every refusal.
std::string quoted(const char* name, std::string_view value) { return cat(name, "=\"", value, "\""); }

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

}  // namespace

std::optional<std::string> env_string(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

bool env_flag(const char* name, bool dflt) {
  const std::optional<std::string> v = env_string(name);
  if (!v) return dflt;
  for (const char* on : {"1", "on", "true"})
    if (iequals(*v, on)) return true;
  for (const char* off : {"0", "off", "false"})
    if (iequals(*v, off)) return false;
  fail(quoted(name, *v), ": expected 1, on, true or 0, off, false (unset: ", dflt ? "on" : "off", ")");
}

int64_t env_int(const char* name, int64_t dflt, int64_t lo, int64_t hi) {
  const std::optional<std::string> v = env_string(name);
  if (!v) return dflt;
  int64_t n = 0;
  const char* first = v->data();
  const char* last = first + v->size();
  const auto [end, ec] = std::from_chars(first, last, n);
  const std::string range = cat("an integer from ", lo, " to ", hi, " (unset: ", dflt, ")");
  if (ec == std::errc::result_out_of_range) fail(quoted(name, *v), ": out of range, expected ", range);
  if (ec != std::errc() || end != last) fail(quoted(name, *v), ": not an integer, expected ", range);
  if (n < lo || n > hi) fail(quoted(name, *v), ": out of range, expected ", range);
  return n;
}

std::string env_choice(const char* name, std::initializer_list<std::string_view> allowed, std::string_view dflt) {
  const std::optional<std::string> v = env_string(name);
  if (!v) return std::string(dflt);
  for (const std::string_view a : allowed)
    if (*v == a) return *v;
  std::string list;
  size_t i = 0;
  for (const std::string_view a : allowed) {
    list += i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ";
    list += a;
    ++i;
  }
  fail(quoted(name, *v), ": expected ", list, " (unset: ", dflt, ")");
}

}  // namespace tern
