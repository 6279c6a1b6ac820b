#include "net/http_head.h"

#include <algorithm>
#include <cctype>

namespace tern::net {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

}  // namespace

bool transfer_coding_supported(std::string_view te) {
  te = trim(te);
  return te.empty() || iequals(te, "chunked");
}

std::string origin_form(std::string_view target) {
  const size_t scheme_end = target.find("://");
  if (target.empty() || target.front() == '/' || scheme_end == std::string_view::npos) return std::string(target);
  const std::string_view scheme = target.substr(0, scheme_end);
  if (!iequals(scheme, "http") && !iequals(scheme, "https")) return std::string(target);
  const std::string_view rest = target.substr(scheme_end + 3);
  const size_t path = rest.find_first_of("/?");
  if (path == std::string_view::npos) return "/";
  std::string out(rest[path] == '?' ? "/" : "");
  out += rest.substr(path);
  return out;
}

}  // namespace tern::net
