// The router's servers, in pools (plain: `both` servers; prefill; decode), with what the router knows
// of each: health (from /health and /pd/info), a circuit breaker (from request outcomes) and load (from
// its own in-flight requests). A server is available when healthy and its breaker lets requests through.
//
// Circuit breaker: `failures` consecutive failed requests open it for `cooldown`; then it is half-open:
// the first request to it is its trial (success closes it, failure opens it again). While the trial
// runs, other requests go to other servers; when there is none, they join the trial rather than being
// refused (a server that came back with /health 200 must not answer 503 to all but one request).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "router/policy.h"

namespace tern::router {

using Clock = std::chrono::steady_clock;

enum class PoolKind { plain, prefill, decode };
const char* pool_name(PoolKind k);

struct BreakerOptions {
  int failures = 3;
  std::chrono::milliseconds cooldown{10000};
};

struct ServerState {
  std::string url;  // http://host:port
  std::string host;
  uint16_t port = 0;
  PoolKind pool = PoolKind::plain;
  size_t index = 0;
  // health
  bool healthy = false;
  bool ever_healthy = false;
  std::string bootstrap;  // prefill: the transfer bootstrap "host:port" (/pd/info)
  std::string model;
  std::string last_error;
  // breaker
  int consecutive_failures = 0;
  bool open = false;
  bool trial = false;  // half-open: the trial request is in flight
  Clock::time_point opened_at;
  // load
  int64_t in_flight = 0;
  int64_t load_tokens = 0;
  // counters
  uint64_t requests = 0, failures = 0;

  // Healthy, and its circuit closed or half-open (cooled down).
  bool available(Clock::time_point now, const BreakerOptions& b) const;
  bool on_trial() const { return open && trial; }
};

// "http://host:port" (numeric host) -> host, port; throws tern::Error naming the problem.
void parse_server_url(const std::string& url, std::string& host, uint16_t& port);

class Pool {
 public:
  Pool(PoolKind kind, const std::vector<std::string>& urls, Policy policy, BreakerOptions breaker);
  PoolKind kind() const { return kind_; }
  Policy policy() const { return policy_; }
  std::vector<std::unique_ptr<ServerState>>& servers() { return servers_; }
  const std::vector<std::unique_ptr<ServerState>>& servers() const { return servers_; }
  bool any_available(Clock::time_point now) const;
  // An available server, preferring those not in `avoid` (servers that failed this request already),
  // then those not on trial; nullptr when none is available. Marks a half-open server's trial.
  ServerState* pick(std::string_view affinity_key, const std::vector<const ServerState*>& avoid, Clock::time_point now);
  void succeeded(ServerState& s);
  void failed(ServerState& s, const std::string& why, Clock::time_point now);

 private:
  PoolKind kind_;
  Policy policy_;
  BreakerOptions breaker_;
  PolicyState state_;
  std::vector<std::unique_ptr<ServerState>> servers_;
};

}  // namespace tern::router
