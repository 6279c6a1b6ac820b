#include "router/router.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/bounded_json.h"
#include "core/error.h"
#include "core/log.h"
#include "net/auth.h"
#include "net/openai.h"
#include "net/prometheus.h"
#include "router/proxy.h"
#include "router/upstream.h"

namespace tern::router {

using nlohmann::json;

RouterMetrics::RouterMetrics()
    : first_byte_seconds({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0}),
      request_seconds({0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0}) {}

Router::Router(RouterOptions options, net::HttpServer& http)
    : options_(std::move(options)), http_(http), rng_(std::random_device{}()) {
  const bool pd = !options_.prefill.empty() || !options_.decode.empty();
  TERN_CHECK(pd || !options_.plain.empty(), "no servers: pass --server URL (plain mode) or --prefill URL and --decode URL (PD mode)");
  TERN_CHECK(!pd || options_.plain.empty(), "--server (plain mode) and --prefill/--decode (PD mode) cannot be mixed");
  TERN_CHECK(!pd || (!options_.prefill.empty() && !options_.decode.empty()),
             "PD mode needs at least one --prefill and one --decode server");
  TERN_CHECK(options_.retries >= 0, "--retries must not be negative");
  TERN_CHECK(options_.breaker.failures >= 1, "--breaker-failures must be at least 1");
  if (pd) {
    prefill_ = std::make_unique<Pool>(PoolKind::prefill, options_.prefill, options_.policy, options_.breaker);
    decode_ = std::make_unique<Pool>(PoolKind::decode, options_.decode, options_.decode_policy, options_.breaker);
  } else {
    plain_ = std::make_unique<Pool>(PoolKind::plain, options_.plain, options_.policy, options_.breaker);
  }
  created_ = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count());
}

Router::~Router() = default;

boost::asio::io_context& Router::io() { return http_.io_context(); }

std::string Router::describe() const {
  if (pd())
    return cat("PD mode: ", prefill_->servers().size(), " prefill (", policy_name(prefill_->policy()), "), ",
               decode_->servers().size(), " decode (", policy_name(decode_->policy()), ")");
  return cat("plain mode: ", plain_->servers().size(), " servers (", policy_name(plain_->policy()), ")");
}

void Router::start(std::function<void(const std::string&)> on_ready) {
  on_ready_ = std::move(on_ready);
  check_health();
}

bool Router::all_pools_up(Clock::time_point now) const {
  for (const Pool* p : {plain_.get(), prefill_.get(), decode_.get()})
    if (p && !p->any_available(now)) return false;
  return true;
}

void Router::check_health() {
  for (Pool* p : {plain_.get(), prefill_.get(), decode_.get()})
    if (p)
      for (auto& s : p->servers()) check_server(*s);
  http_.schedule(options_.health_interval, [this] { check_health(); });
}

// GET /health, then GET /pd/info (role, bootstrap address, model).
void Router::check_server(ServerState& s) {
  auto fetch = [this, &s](const std::string& target, std::function<void(int, std::string, std::string)> done) {
    auto body = std::make_shared<std::string>();
    auto status = std::make_shared<int>(0);
    UpstreamRequest r{s.host, s.port, "GET", target, {}, "", options_.health_timeout, options_.health_timeout};
    start_upstream(io(), std::move(r),
                   {[status](int st, const std::string&) { *status = st; },
                    [body](std::string_view b) {
                      if (body->size() < 65536) body->append(b);
                    },
                    [status, body, done](const std::string& error, bool) { done(*status, *body, error); }});
  };
  fetch("/health", [this, &s, fetch](int status, std::string, std::string error) {
    if (!error.empty()) return server_down(s, error);
    if (status != 200) return server_down(s, cat("/health answered ", status));
    fetch("/pd/info", [this, &s](int status, std::string body, std::string error) {
      if (!error.empty() || status != 200) return server_down(s, error.empty() ? cat("/pd/info answered ", status) : error);
      json j;
      try {
        j = parse_bounded<json>(body);
      } catch (const JsonLimitError& e) {
        return server_down(s, cat("/pd/info: ", e.what()));
      }
      if (!j.is_object()) return server_down(s, "/pd/info is not a JSON object");
      server_up(s, j.value("role", ""), j.contains("bootstrap") && j["bootstrap"].is_string() ? j["bootstrap"].get<std::string>() : "",
                j.value("model", ""), j.value("max_model_len", int64_t{0}));
    });
  });
}

void Router::server_up(ServerState& s, const std::string& role, const std::string& bootstrap, const std::string& model,
                       int64_t max_model_len) {
  const char* want = s.pool == PoolKind::plain ? "both" : pool_name(s.pool);
  if (role != want) return server_down(s, cat("it is a ", role, " server (--role ", role, "), this pool needs ", want));
  if (!model_.empty() && model != model_) return server_down(s, cat("it serves ", model, ", the others ", model_));
  if (s.pool == PoolKind::prefill) {
    if (bootstrap.empty()) return server_down(s, "it reports no bootstrap address");
    // A bootstrap on the wildcard address is reached at the server's own address.
    const size_t colon = bootstrap.rfind(':');
    const std::string host = bootstrap.substr(0, colon);
    s.bootstrap = host == "0.0.0.0" || host == "[::]" || host == "::" ? cat(s.host, bootstrap.substr(colon)) : bootstrap;
  }
  if (model_.empty()) {
    model_ = model;
    max_model_len_ = max_model_len;
  }
  s.model = model;
  if (!s.healthy) log::info("router: ", pool_name(s.pool), " server ", s.url, " is up");
  s.healthy = s.ever_healthy = true;
  if (!ready_ && all_pools_up(Clock::now())) {
    ready_ = true;
    if (on_ready_) on_ready_(model_);
  }
}

void Router::server_down(ServerState& s, const std::string& why) {
  if (s.healthy) log::warn("router: ", pool_name(s.pool), " server ", s.url, " is down: ", why);
  s.healthy = false;
  s.last_error = why;
}

void Router::reply_error(net::Exchange& ex, int status, const std::string& message, const std::string& type) {
  fail(ex, net::ApiError(status, message, "", type));
}

void Router::fail(net::Exchange& ex, const net::ApiError& e) {
  ex.reply(e.status, "application/json", net::render_error(e), net::error_headers(e));
}

void Router::preflight(const net::HttpRequest& request) const {
  const std::string path = request.target.substr(0, request.target.find('?'));
  if (path == "/health" || path == "/metrics") return;
  const bool known = path == "/v1/completions" || path == "/v1/chat/completions" || path == "/tokenize" ||
                     path == "/detokenize" || path == "/v1/models";
  if (!known) throw net::ApiError(404, cat("no route ", request.method, " ", path), "", "not_found_error");
  if (!net::bearer_authorized(request.authorization, options_.api_key))
    throw net::ApiError(401, "a valid API key is required: Authorization: Bearer <key>", "", "authentication_error",
                           "invalid_api_key");
  if (draining_) throw net::ApiError(503, "the router is shutting down", "", "unavailable");
  if (!ready_) throw net::ApiError(503, "no server is up yet", "", "unavailable");
}

std::optional<net::Refusal> Router::check_head(const net::HttpRequest& head) const {
  try {
    preflight(head);
    return std::nullopt;
  } catch (const net::ApiError& e) {
    return net::Refusal{e.status, net::render_error(e), net::error_headers(e)};
  }
}

void Router::handle(net::HttpRequest&& request, std::shared_ptr<net::Exchange> exchange) {
  try {
    route(request, exchange);
  } catch (const net::ApiError& e) {
    fail(*exchange, e);
  } catch (const std::exception& e) {
    log::error("router: internal error on ", request.method, " ", request.target, ": ", e.what());
    reply_error(*exchange, 500, cat("internal error: ", e.what()), "internal_server_error");
  }
}

void Router::route(const net::HttpRequest& request, const std::shared_ptr<net::Exchange>& exchange) {
  const std::string path = request.target.substr(0, request.target.find('?'));
  const std::string& m = request.method;
  const auto now = Clock::now();
  if (path == "/health") {
    if (m != "GET") return reply_error(*exchange, 405, "use GET /health", "invalid_request_error");
    if (draining_) return reply_error(*exchange, 503, "the router is shutting down", "unavailable");
    if (!ready_ || !all_pools_up(now)) return reply_error(*exchange, 503, "no server is available in some pool", "unavailable");
    return exchange->reply(200, "application/json", R"({"status":"ok"})");
  }
  if (path == "/metrics") {
    if (m != "GET") return reply_error(*exchange, 405, "use GET /metrics", "invalid_request_error");
    return exchange->reply(200, "text/plain; version=0.0.4", render_metrics());
  }
  preflight(request);
  if (path == "/v1/models") {
    if (m != "GET") return reply_error(*exchange, 405, "use GET /v1/models", "invalid_request_error");
    return exchange->reply(200, "application/json", net::render_models(model_, static_cast<int64_t>(created_), max_model_len_));
  }
  if (m != "POST") return reply_error(*exchange, 405, cat("use POST ", path), "invalid_request_error");
  if (jobs_.size() >= options_.max_requests) {
    ++metrics_.rejected;
    return reply_error(*exchange, 429, "too many requests in flight (--max-requests); retry later", "rate_limit_error");
  }
  // The client's own X-Tern-* headers are never forwarded: the router sets them per attempt.
  auto job = std::make_shared<ProxyJob>(*this, request, exchange, route_info(request.target, request.body));
  jobs_.push_back(job);
  std::weak_ptr<ProxyJob> weak = job;
  exchange->on_client_gone([weak] {
    if (auto j = weak.lock()) j->client_gone();
  });
  job->start();
}

void Router::finished(ProxyJob* job) {
  jobs_.remove_if([job](const std::shared_ptr<ProxyJob>& j) { return j.get() == job; });
}

void Router::abort_all(const std::string& why) {
  auto jobs = jobs_;
  for (auto& j : jobs) j->abort(why);
}

std::string Router::render_metrics() const {
  using net::prom_header;
  using net::prom_scalar;
  std::string out;
  const std::string l = "role=\"router\"";
  prom_header(out, "router_requests_total", "counter", "Client requests by result.");
  for (auto [name, v] : {std::pair{"ok", metrics_.ok}, {"error", metrics_.errors}, {"rejected", metrics_.rejected},
                         {"client_gone", metrics_.client_gone}})
    out += fmt::format("tern:router_requests_total{{{},result=\"{}\"}} {}\n", l, name, v);
  prom_scalar(out, "router_retries_total", "counter", "Attempts retried before the first byte.", double(metrics_.retries), l);
  prom_scalar(out, "router_requests_in_flight", "gauge", "Client requests in flight.", double(jobs_.size()), l);
  out += net::render_http_metrics(http_.stats(), l);
  net::prom_histogram(out, "router_first_byte_seconds", "Request arrival to the first byte sent to the client.",
                      metrics_.first_byte_seconds, l);
  net::prom_histogram(out, "router_request_seconds", "Request arrival to its end.", metrics_.request_seconds, l);
  const auto now = Clock::now();
  struct Row {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const ServerState&, Clock::time_point, const BreakerOptions&);
  };
  static const Row rows[] = {
      {"router_server_up", "gauge", "1 when the server is healthy and its circuit lets requests through.",
       [](const ServerState& s, Clock::time_point t, const BreakerOptions& b) { return s.available(t, b) ? 1.0 : 0.0; }},
      {"router_server_healthy", "gauge", "1 when the last health check passed.",
       [](const ServerState& s, Clock::time_point, const BreakerOptions&) { return s.healthy ? 1.0 : 0.0; }},
      {"router_server_circuit_open", "gauge", "1 while the circuit breaker is open (half-open included).",
       [](const ServerState& s, Clock::time_point, const BreakerOptions&) { return s.open ? 1.0 : 0.0; }},
      {"router_server_on_trial", "gauge", "1 while a half-open circuit's trial request is in flight.",
       [](const ServerState& s, Clock::time_point, const BreakerOptions&) { return s.on_trial() ? 1.0 : 0.0; }},
      {"router_server_in_flight", "gauge", "Requests in flight on the server.",
       [](const ServerState& s, Clock::time_point, const BreakerOptions&) { return double(s.in_flight); }},
      {"router_server_load_tokens", "gauge", "Estimated tokens in flight on the server.",
       [](const ServerState& s, Clock::time_point, const BreakerOptions&) { return double(s.load_tokens); }},
      {"router_server_requests_total", "counter", "Requests sent to the server.",
       [](const ServerState& s, Clock::time_point, const BreakerOptions&) { return double(s.requests); }},
      {"router_server_failures_total", "counter", "Requests the server failed (its blame).",
       [](const ServerState& s, Clock::time_point, const BreakerOptions&) { return double(s.failures); }},
  };
  for (const auto& row : rows) {
    prom_header(out, row.name, row.type, row.help);
    for (const Pool* p : {plain_.get(), prefill_.get(), decode_.get()})
      if (p)
        for (const auto& s : p->servers())
          out += fmt::format("tern:{}{{server=\"{}\",pool=\"{}\"}} {}\n", row.name, s->url, pool_name(p->kind()),
                             row.value(*s, now, options_.breaker));
  }
  return out;
}

}  // namespace tern::router
