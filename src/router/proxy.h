// One client request through the router: attempts (a server, or a prefill and a decode server with a
// room id), relaying the response, retries and client disconnects.
//
// Retries: an attempt fails before the first byte reaches the client when a server cannot be reached,
// closes the connection, answers 5xx / 429 / 503, or streams an error event first; the request then
// goes to other servers, up to --retries more times. Once the first byte is out, a failure ends the
// client's stream with an error event and [DONE]. Blame (the circuit breaker) goes to a server whose
// own connection failed or that answered 5xx; an error event inside a stream (a failed state transfer)
// is retried but blames nobody, since either side or the link between them may have caused it.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "net/sse.h"
#include "router/router.h"
#include "router/upstream.h"

namespace tern::router {

// What the router reads from a request body: the prompt's first bytes (affinity) and load estimates
// (prompt: bytes / 4; whole request: prompt + max_tokens x n). Never throws: a body the router cannot
// read goes to a server as is.
struct RouteInfo {
  std::string affinity_key;
  int64_t load_tokens = 0;    // what a plain or decode server carries
  int64_t prompt_tokens = 0;  // what a prefill server carries
  bool generation = false;  // completions / chat: in PD mode a prefill server takes part
};
RouteInfo route_info(const std::string& target, const std::string& body);

class ProxyJob : public std::enable_shared_from_this<ProxyJob> {
 public:
  ProxyJob(Router& router, net::HttpRequest request, std::shared_ptr<net::Exchange> exchange, RouteInfo info);
  void start();
  void client_gone();
  // Shutdown: ends the request with an error (an error event when streaming).
  void abort(const std::string& why);

 private:
  struct Attempt {
    ServerState* prefill = nullptr;
    ServerState* server = nullptr;  // the one whose response the client gets (decode or plain)
    std::shared_ptr<UpstreamCall> prefill_call, call;
    int status = 0;
    bool event_stream = false;
    std::string content_type, body;
    net::SseParser sse;
    bool server_released = false, prefill_released = false;
  };

  void attempt();
  void on_head(int status, const std::string& content_type);
  void on_body(std::string_view bytes);
  void on_end(const std::string& error, bool connect_failed);
  void on_prefill_end(int status, const std::string& body, const std::string& error, bool connect_failed);
  // The attempt failed before anything reached the client: retry or answer with the error.
  void retry_or_fail(int status, const std::string& why);
  void send_event(const std::string& data);
  void release_server(bool ok, bool blame, const std::string& why);
  void release_prefill(bool ok, bool blame, const std::string& why);
  void finish(bool ok);
  std::vector<std::pair<std::string, std::string>> headers(uint64_t room, const std::string& bootstrap) const;

  Router& router_;
  net::HttpRequest request_;
  std::shared_ptr<net::Exchange> exchange_;
  RouteInfo info_;
  std::unique_ptr<Attempt> a_;
  std::vector<const ServerState*> avoid_;
  int attempts_ = 0;
  bool committed_ = false, done_ = false;
  Clock::time_point arrival_;
};

}  // namespace tern::router
