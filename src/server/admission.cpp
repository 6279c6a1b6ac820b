#include "server/admission.h"

#include <algorithm>

#include "core/error.h"
#include "net/openai.h"

namespace tern::server {

namespace {

std::string trim(std::string s) {
  const auto space = [](char c) { return c == ' ' || c == '\t'; };
  s.erase(s.begin(), std::find_if_not(s.begin(), s.end(), space));
  while (!s.empty() && space(s.back())) s.pop_back();
  return s;
}

}  // namespace

std::string client_of(const net::HttpRequest& r, const std::vector<std::string>& trusted_proxies) {
  if (r.forwarded_for.empty() || std::find(trusted_proxies.begin(), trusted_proxies.end(), r.peer) == trusted_proxies.end())
    return r.peer;
  // Each proxy appends the address it saw: the last entry is the one our trusted proxy vouches for.
  const size_t comma = r.forwarded_for.rfind(',');
  const std::string last = trim(comma == std::string::npos ? r.forwarded_for : r.forwarded_for.substr(comma + 1));
  return last.empty() || last.size() > 64 ? r.peer : last;
}

uint64_t client_key(const std::string& client) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : client) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h == 0 ? 1 : h;
}

void Admission::admit(const std::string& client, int64_t tokens, const std::string& what) {
  if (limits_.max_request_tokens > 0 && tokens > limits_.max_request_tokens)
    throw net::ApiError(400, cat("this request asks for up to ", tokens, " tokens of state (", what, "); the limit is ",
                            limits_.max_request_tokens, " tokens a request (--max-request-tokens, by default what the "
                            "state memory holds): send fewer prompts, a smaller n or a smaller max_tokens"),
                   "max_tokens", "invalid_request_error", "request_too_large");
  int64_t& held = in_flight_[client];
  if (limits_.max_client_tokens > 0 && held + tokens > limits_.max_client_tokens) {
    const int64_t now = held;
    if (held == 0) in_flight_.erase(client);
    throw net::ApiError(429, cat("this client has ", now, " tokens of state in flight; with this request's ", tokens,
                            " it would pass its limit of ", limits_.max_client_tokens,
                            " (--max-client-tokens); retry when a request has finished"),
                   "", "rate_limit_error", "client_tokens_exceeded");
  }
  held += tokens;
}

void Admission::release(const std::string& client, int64_t tokens) {
  auto it = in_flight_.find(client);
  if (it == in_flight_.end()) return;
  it->second -= tokens;
  if (it->second <= 0) in_flight_.erase(it);
}

int64_t Admission::in_flight(const std::string& client) const {
  auto it = in_flight_.find(client);
  return it == in_flight_.end() ? 0 : it->second;
}

}  // namespace tern::server
