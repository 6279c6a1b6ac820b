// Admission of generation requests (docs/serving.md, "Admission"): the state a request may come to hold
// (prompts x n x (prompt + max_tokens) tokens) is bounded per request, and over its requests in flight
// per client, so that no single request or client takes the server. A client is a peer address, or the
// address a trusted proxy (`tern route`) forwards; the engine schedules clients fairly by the same key.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "net/http.h"

namespace tern::server {

struct AdmissionLimits {
  int64_t max_request_tokens = 0;  // one request's prompts x n x (prompt + max_tokens)
  int64_t max_client_tokens = 0;   // a client's requests in flight together
  // Peers (IP addresses) whose X-Forwarded-For names the client: the proxies in front of this server.
  std::vector<std::string> trusted_proxies;
};

// The client a request counts for: the last address of X-Forwarded-For when the peer is a trusted proxy
// (the one that proxy saw), else the peer address.
std::string client_of(const net::HttpRequest& request, const std::vector<std::string>& trusted_proxies);
// A stable key of a client for the engine's fair scheduling (never 0, which the engine reads as "no client").
uint64_t client_key(const std::string& client);

class Admission {
 public:
  explicit Admission(AdmissionLimits limits) : limits_(std::move(limits)) {}
  const AdmissionLimits& limits() const { return limits_; }

  // Counts `tokens` for `client` until release(); `what` describes the request's tokens for the
  // message. Throws net::ApiError 400 when the request alone passes its limit, 429 when the client's tokens
  // in flight would pass theirs (nothing is counted then).
  void admit(const std::string& client, int64_t tokens, const std::string& what);
  void release(const std::string& client, int64_t tokens);
  int64_t in_flight(const std::string& client) const;
  size_t clients() const { return in_flight_.size(); }  // with tokens in flight

 private:
  AdmissionLimits limits_;
  std::unordered_map<std::string, int64_t> in_flight_;
};

}  // namespace tern::server
