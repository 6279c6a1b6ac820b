#include "router/pool.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"

namespace tern::router {

const char* pool_name(PoolKind k) {
  switch (k) {
    case PoolKind::plain: return "plain";
    case PoolKind::prefill: return "prefill";
    case PoolKind::decode: return "decode";
  }
  return "?";
}

bool ServerState::available(Clock::time_point now, const BreakerOptions& b) const {
  if (!healthy) return false;
  return !open || now - opened_at >= b.cooldown;
}

void parse_server_url(const std::string& url, std::string& host, uint16_t& port) {
  const std::string bad = cat("server URL: expected http://host:port with a numeric host, found \"", url, "\"");
  TERN_CHECK(url.rfind("http://", 0) == 0, bad);
  std::string rest = url.substr(7);
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  const size_t colon = rest.rfind(':');
  TERN_CHECK(colon != std::string::npos && colon > 0 && rest.find('/') == std::string::npos, bad);
  host = rest.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  try {
    size_t used = 0;
    const unsigned long p = std::stoul(rest.substr(colon + 1), &used);
    TERN_CHECK(used == rest.size() - colon - 1 && p > 0 && p < 65536, bad);
    port = static_cast<uint16_t>(p);
  } catch (const std::logic_error&) {
    throw Error(bad);
  }
}

Pool::Pool(PoolKind kind, const std::vector<std::string>& urls, Policy policy, BreakerOptions breaker)
    : kind_(kind), policy_(policy), breaker_(breaker) {
  for (const auto& u : urls) {
    auto s = std::make_unique<ServerState>();
    s->url = u;
    while (!s->url.empty() && s->url.back() == '/') s->url.pop_back();
    parse_server_url(s->url, s->host, s->port);
    s->pool = kind;
    s->index = servers_.size();
    for (const auto& other : servers_)
      TERN_CHECK(other->url != s->url, "server ", s->url, " is listed twice in the ", pool_name(kind), " pool");
    servers_.push_back(std::move(s));
  }
}

bool Pool::any_available(Clock::time_point now) const {
  return std::any_of(servers_.begin(), servers_.end(), [&](const auto& s) { return s->available(now, breaker_); });
}

ServerState* Pool::pick(std::string_view key, const std::vector<const ServerState*>& avoid, Clock::time_point now) {
  // Tiers, best first: not avoided and not on trial; not avoided; avoided and not on trial; the rest.
  std::vector<Candidate> tiers[4];
  for (const auto& s : servers_) {
    if (!s->available(now, breaker_)) continue;
    const bool avoided = std::find(avoid.begin(), avoid.end(), s.get()) != avoid.end();
    tiers[(avoided ? 2 : 0) + (s->on_trial() ? 1 : 0)].push_back({s->url, s->index, s->load_tokens, s->in_flight});
  }
  const auto tier = std::find_if(std::begin(tiers), std::end(tiers), [](const auto& t) { return !t.empty(); });
  if (tier == std::end(tiers)) return nullptr;
  auto& from = *tier;
  ServerState* s = servers_[from[choose(policy_, from, key, state_)].index].get();
  if (s->open) s->trial = true;
  return s;
}

void Pool::succeeded(ServerState& s) {
  s.consecutive_failures = 0;
  if (s.open) log::info("router: ", s.url, " answered again; circuit closed");
  s.open = s.trial = false;
}

void Pool::failed(ServerState& s, const std::string& why, Clock::time_point now) {
  ++s.failures;
  ++s.consecutive_failures;
  s.last_error = why;
  if (s.open) {  // the half-open trial failed
    s.trial = false;
    s.opened_at = now;
    return;
  }
  if (s.consecutive_failures >= breaker_.failures) {
    s.open = true;
    s.opened_at = now;
    log::warn("router: ", s.url, " failed ", s.consecutive_failures, " requests in a row (", why, "); circuit open for ",
              breaker_.cooldown.count(), " ms");
  }
}

}  // namespace tern::router
