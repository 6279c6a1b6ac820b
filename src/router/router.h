// `tern route`: one OpenAI-compatible endpoint in front of pools of tern servers (docs/disaggregation.md).
//   PD mode:    a prefill pool and a decode pool; each request goes to one prefill and one decode server
//               with a fresh room id; the client gets the decode server's response.
//   plain mode: one pool of `both` servers.
// The router parses nothing it does not need (the prompt's first bytes for affinity, max_tokens for
// load); servers answer malformed requests as they would directly. Everything runs on the HTTP server's
// IO thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/histogram.h"
#include "net/http.h"
#include "net/openai.h"
#include "router/pool.h"

namespace tern::router {

struct RouterOptions {
  std::vector<std::string> plain, prefill, decode;  // server URLs
  Policy policy = Policy::round_robin;               // plain and prefill pools
  Policy decode_policy = Policy::least_loaded;
  std::string api_key;           // clients must send it (empty: no check)
  std::string upstream_api_key;  // sent to the servers
  int retries = 2;               // further attempts before the first token has been sent
  size_t max_requests = 4096;    // in flight; beyond: 429
  BreakerOptions breaker;
  std::chrono::milliseconds connect_timeout{3000};
  std::chrono::milliseconds request_timeout{600000};
  std::chrono::milliseconds health_interval{2000};
  std::chrono::milliseconds health_timeout{2000};
};

struct RouterMetrics {
  uint64_t ok = 0, errors = 0, rejected = 0, client_gone = 0, retries = 0;
  Histogram first_byte_seconds;  // request arrival to the first byte sent to the client
  Histogram request_seconds;
  RouterMetrics();
};

class ProxyJob;

class Router {
 public:
  Router(RouterOptions options, net::HttpServer& http);
  ~Router();
  void handle(net::HttpRequest&& request, std::shared_ptr<net::Exchange> exchange);
  // The HTTP layer's check of a request's head (net::HeadCheck): unknown routes, the API key,
  // readiness and draining are answered before the body is read.
  std::optional<net::Refusal> check_head(const net::HttpRequest& head) const;
  // Starts the health checks; `on_ready` is called once every pool has a server up.
  void start(std::function<void(const std::string& model)> on_ready);
  void set_draining() { draining_ = true; }
  size_t live() const { return jobs_.size(); }
  void abort_all(const std::string& why);
  bool pd() const { return decode_ != nullptr; }
  std::string describe() const;  // for the log: pools and policies

  // For ProxyJob.
  boost::asio::io_context& io();
  const RouterOptions& options() const { return options_; }
  Pool* stream_pool() { return pd() ? decode_.get() : plain_.get(); }
  Pool* prefill_pool() { return prefill_.get(); }
  RouterMetrics& metrics() { return metrics_; }
  uint64_t new_room() { return rng_() | 1; }
  void finished(ProxyJob* job);
  void server_down(ServerState& s, const std::string& why);

 private:
  void route(const net::HttpRequest& request, const std::shared_ptr<net::Exchange>& exchange);
  // Throws the ApiError a request gets from its head alone, or returns.
  void preflight(const net::HttpRequest& request) const;
  void check_health();
  void check_server(ServerState& s);
  void server_up(ServerState& s, const std::string& role, const std::string& bootstrap, const std::string& model,
                 int64_t max_model_len);
  bool all_pools_up(Clock::time_point now) const;
  std::string render_metrics() const;
  void reply_error(net::Exchange& ex, int status, const std::string& message, const std::string& type);
  void fail(net::Exchange& ex, const net::ApiError& e);

  RouterOptions options_;
  net::HttpServer& http_;
  std::unique_ptr<Pool> plain_, prefill_, decode_;
  std::list<std::shared_ptr<ProxyJob>> jobs_;
  RouterMetrics metrics_;
  std::mt19937_64 rng_;
  std::function<void(const std::string&)> on_ready_;
  std::string model_;
  int64_t max_model_len_ = 0;
  bool ready_ = false, draining_ = false;
  uint64_t created_ = 0;
};

}  // namespace tern::router
