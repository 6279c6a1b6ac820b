// `tern route`: the OpenAI-compatible endpoint in front of pools of tern servers (docs/disaggregation.md).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "net/http.h"
#include "router/router.h"
#include "tools/http_options.h"
#include "tools/verb.h"

namespace {

using namespace tern;
using Clock = std::chrono::steady_clock;

struct RouteArgs {
  std::string host = "127.0.0.1", policy = "round-robin", decode_policy = "least-loaded", api_key, upstream_api_key;
  int port = 8000;
  std::vector<std::string> servers, prefill, decode;
  int retries = 2, breaker_failures = 3;
  size_t max_requests = 4096;
  double breaker_cooldown_s = 10, connect_timeout_s = 3, request_timeout_s = 600, health_interval_s = 2,
         health_timeout_s = 2, drain_timeout_s = 30;
  net::HttpOptions http;
};

std::chrono::milliseconds ms(double seconds, const char* name) {
  TERN_CHECK(seconds > 0, name, ": expected a positive number of seconds, found ", seconds);
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

router::RouterOptions router_options(const RouteArgs& a) {
  router::RouterOptions o;
  o.plain = a.servers;
  o.prefill = a.prefill;
  o.decode = a.decode;
  o.policy = router::parse_policy(a.policy);
  o.decode_policy = router::parse_policy(a.decode_policy);
  o.api_key = a.api_key;
  o.upstream_api_key = a.upstream_api_key;
  o.retries = a.retries;
  o.max_requests = a.max_requests;
  o.breaker.failures = a.breaker_failures;
  o.breaker.cooldown = ms(a.breaker_cooldown_s, "--breaker-cooldown");
  o.connect_timeout = ms(a.connect_timeout_s, "--connect-timeout");
  o.request_timeout = ms(a.request_timeout_s, "--request-timeout");
  o.health_interval = ms(a.health_interval_s, "--health-interval");
  o.health_timeout = ms(a.health_timeout_s, "--health-timeout");
  return o;
}

int run_route(const RouteArgs& a) {
  TERN_CHECK(a.port >= 0 && a.port <= 65535, "--port: expected 0 to 65535, found ", a.port);
  const router::RouterOptions options = router_options(a);  // checked before binding: bad flags change nothing
  std::unique_ptr<router::Router> r;
  // Each client connection may bring two upstream connections (a prefill and a decode server).
  net::HttpServer http(
      a.host, static_cast<uint16_t>(a.port), net::http_limits(a.http, 3),
      [&r](net::HttpRequest&& req, std::shared_ptr<net::Exchange> ex) { r->handle(std::move(req), std::move(ex)); },
      [&r](const net::HttpRequest& head) { return r->check_head(head); });
  r = std::make_unique<router::Router>(options, http);
  // SIGTERM / SIGINT: stop accepting, let requests finish for up to --drain-timeout, then end the rest
  // with an error, and exit 0.
  Clock::time_point deadline;
  bool draining = false, aborted = false;
  std::function<void()> poll = [&] {
    if (r->live() == 0 && http.connections() == 0) {
      log::info("drained; exiting");
      return http.stop();
    }
    if (Clock::now() >= deadline) {
      if (aborted) return http.stop();
      log::warn("drain timeout: ending ", r->live(), " requests");
      r->abort_all("the router is shutting down");
      aborted = true;
      deadline = Clock::now() + std::chrono::seconds(2);
    }
    http.schedule(std::chrono::milliseconds(20), poll);
  };
  http.on_signal([&](int sig) {
    if (draining) return;
    draining = true;
    log::info("signal ", sig, ": draining (", r->live(), " requests in flight)");
    r->set_draining();
    http.stop_accepting();
    deadline = Clock::now() + ms(a.drain_timeout_s, "--drain-timeout");
    poll();
  });
  log::info("router listening on ", http.address(), "; ", r->describe(), "; waiting for the servers");
  http.post([&] {
    r->start([&](const std::string& model) {
      log::info("ready: routing ", model, " at ", http.address(), " (", r->describe(), ")",
                a.api_key.empty() ? "" : ", API key required");
    });
  });
  http.run();
  r.reset();  // before the HttpServer's io_context goes
  return 0;
}

void add_options(CLI::App& app, RouteArgs& a) {
  app.add_option("--host", a.host, "Address to bind")->capture_default_str();
  app.add_option("--port", a.port, "Port (0: any free port)")->capture_default_str();
  app.add_option("--server", a.servers, "A `both` server (plain mode), e.g. http://127.0.0.1:8001; repeatable");
  app.add_option("--prefill", a.prefill, "A prefill server (PD mode); repeatable");
  app.add_option("--decode", a.decode, "A decode server (PD mode); repeatable");
  app.add_option("--policy", a.policy, "Plain and prefill pools: round-robin, least-loaded or prefix-affinity")
      ->capture_default_str();
  app.add_option("--decode-policy", a.decode_policy, "Decode pool policy")->capture_default_str();
  app.add_option("--api-key", a.api_key, "Require Authorization: Bearer <key> from clients")->envname("TERN_API_KEY");
  app.add_option("--upstream-api-key", a.upstream_api_key, "Key sent to the servers")->envname("TERN_UPSTREAM_API_KEY");
  app.add_option("--retries", a.retries, "Further attempts before the first byte reached the client")->capture_default_str();
  app.add_option("--max-requests", a.max_requests, "Requests in flight at most (beyond: 429)")->capture_default_str();
  app.add_option("--breaker-failures", a.breaker_failures, "Consecutive failures that open a server's circuit")
      ->capture_default_str();
  app.add_option("--breaker-cooldown", a.breaker_cooldown_s, "Seconds a circuit stays open before a trial request")
      ->capture_default_str();
  app.add_option("--connect-timeout", a.connect_timeout_s, "Seconds to connect to a server")->capture_default_str();
  app.add_option("--request-timeout", a.request_timeout_s, "Seconds a request to a server may take")->capture_default_str();
  app.add_option("--health-interval", a.health_interval_s, "Seconds between health checks")->capture_default_str();
  app.add_option("--health-timeout", a.health_timeout_s, "Seconds a health check may take")->capture_default_str();
  app.add_option("--drain-timeout", a.drain_timeout_s, "Seconds to finish requests after SIGTERM")->capture_default_str();
  tools::add_http_options(app, a.http);
}

const bool registered = tern::tools::register_verb(
    {"route", "Route OpenAI-compatible requests to pools of tern servers (prefill/decode or plain)", [](CLI::App& app) {
       auto a = std::make_shared<RouteArgs>();
       add_options(app, *a);
       return std::function<int()>([a] { return run_route(*a); });
     }});

}  // namespace
