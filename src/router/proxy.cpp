#include "router/proxy.h"

#include <nlohmann/json.hpp>

#include "core/bounded_json.h"
#include "core/error.h"
#include "core/log.h"
#include "net/openai.h"
#include "net/room.h"

namespace tern::router {

using nlohmann::json;

namespace {

// A request body, a server's answer or a stream event, read under the JSON limits (a discarded value
// when it is not JSON or is over them).
json parse_event(std::string_view text) {
  try {
    return parse_bounded<json>(text);
  } catch (const JsonLimitError&) {
    return json(json::value_t::discarded);
  }
}

}  // namespace

RouteInfo route_info(const std::string& target, const std::string& body) {
  RouteInfo info;
  const std::string path = target.substr(0, target.find('?'));
  info.generation = path == "/v1/completions" || path == "/v1/chat/completions";
  info.prompt_tokens = static_cast<int64_t>(body.size() / 4);
  info.load_tokens = info.prompt_tokens + 16;
  const json j = parse_event(body);  // over the JSON limits: the server answers it (a 400 naming the field)
  if (j.is_discarded() || !j.is_object()) return info;
  std::string prompt;
  if (auto m = j.find("messages"); m != j.end()) prompt = m->dump();
  else if (auto p = j.find("prompt"); p != j.end()) prompt = p->is_string() ? p->get<std::string>() : p->dump();
  info.affinity_key = target.substr(0, target.find('?')) + "\n" + prompt.substr(0, 256);
  int64_t max_tokens = 16;
  for (const char* k : {"max_tokens", "max_completion_tokens"})
    if (auto t = j.find(k); t != j.end() && t->is_number_integer()) max_tokens = t->get<int64_t>();
  int64_t n = 1;
  if (auto t = j.find("n"); t != j.end() && t->is_number_integer()) n = std::max<int64_t>(1, t->get<int64_t>());
  info.prompt_tokens = static_cast<int64_t>(prompt.size() / 4) * n;
  info.load_tokens = info.prompt_tokens + std::clamp<int64_t>(max_tokens, 0, 1 << 20) * n;
  return info;
}

ProxyJob::ProxyJob(Router& router, net::HttpRequest request, std::shared_ptr<net::Exchange> exchange, RouteInfo info)
    : router_(router), request_(std::move(request)), exchange_(std::move(exchange)), info_(std::move(info)),
      arrival_(Clock::now()) {}

void ProxyJob::start() { attempt(); }

std::vector<std::pair<std::string, std::string>> ProxyJob::headers(uint64_t room, const std::string& bootstrap) const {
  std::vector<std::pair<std::string, std::string>> h{{"Content-Type", "application/json"}};
  const auto& key = router_.options().upstream_api_key;
  if (!key.empty()) h.emplace_back("Authorization", "Bearer " + key);
  // The client as this router saw it, appended as proxies do; servers that list this router in
  // --forwarded-allow-ips count the request for that client (admission, fair scheduling).
  h.emplace_back("X-Forwarded-For",
                 request_.forwarded_for.empty() ? request_.peer : request_.forwarded_for + ", " + request_.peer);
  if (room) h.emplace_back("X-Tern-Room", net::room_hex(room));
  if (!bootstrap.empty()) h.emplace_back("X-Tern-Bootstrap", bootstrap);
  return h;
}

void ProxyJob::attempt() {
  ++attempts_;
  const auto now = Clock::now();
  Pool* pool = router_.stream_pool();
  Pool* prefill_pool = info_.generation ? router_.prefill_pool() : nullptr;
  ServerState* p = prefill_pool ? prefill_pool->pick(info_.affinity_key, avoid_, now) : nullptr;
  ServerState* s = pool->pick(info_.affinity_key, avoid_, now);
  if (!s || (prefill_pool && !p)) {
    const char* which = !s ? pool_name(pool->kind()) : "prefill";
    if (p && p->open) p->trial = false;  // picked for a trial that never happens
    if (s && s->open) s->trial = false;
    return retry_or_fail(503, cat("no ", which, " server is available"));
  }
  a_ = std::make_unique<Attempt>();
  a_->server = s;
  a_->prefill = p;
  for (ServerState* x : {p, s}) {
    if (!x) continue;
    ++x->in_flight;
    ++x->requests;
    x->load_tokens += x == p ? info_.prompt_tokens : info_.load_tokens;
  }
  const uint64_t room = p ? router_.new_room() : 0;
  auto self = shared_from_this();
  Attempt* a = a_.get();
  if (p) {
    UpstreamRequest r{p->host, p->port, request_.method, request_.target, headers(room, ""), request_.body,
                      router_.options().connect_timeout, router_.options().request_timeout};
    auto status = std::make_shared<int>(0);
    auto body = std::make_shared<std::string>();
    a->prefill_call = start_upstream(
        router_.io(), std::move(r),
        {[status](int st, const std::string&) { *status = st; },
         [body](std::string_view b) {
           if (body->size() < 4096) body->append(b.substr(0, 4096 - body->size()));
         },
         [self, a, status, body](const std::string& error, bool connect_failed) {
           if (self->a_.get() == a) self->on_prefill_end(*status, *body, error, connect_failed);
         }});
  }
  UpstreamRequest r{s->host, s->port, request_.method, request_.target, headers(room, p ? p->bootstrap : ""),
                    request_.body, router_.options().connect_timeout, router_.options().request_timeout};
  a->call = start_upstream(router_.io(), std::move(r),
                           {[self, a](int status, const std::string& ct) {
                              if (self->a_.get() == a) self->on_head(status, ct);
                            },
                            [self, a](std::string_view bytes) {
                              if (self->a_.get() == a) self->on_body(bytes);
                            },
                            [self, a](const std::string& error, bool connect_failed) {
                              if (self->a_.get() == a) self->on_end(error, connect_failed);
                            }});
}

void ProxyJob::on_head(int status, const std::string& content_type) {
  a_->status = status;
  a_->content_type = content_type;
  a_->event_stream = status == 200 && content_type.rfind("text/event-stream", 0) == 0;
}

void ProxyJob::on_body(std::string_view bytes) {
  if (!a_->event_stream) {
    if (a_->body.size() < (size_t{64} << 20)) a_->body.append(bytes);
    return;
  }
  std::vector<std::string> events;
  a_->sse.feed(bytes, events);
  for (auto& e : events) {
    if (!a_ || done_) return;
    if (!committed_) {
      const json j = parse_event(e);
      if (j.is_object() && j.contains("error")) {
        const json& err = j["error"];
        const std::string why = err.is_object() ? err.value("message", err.dump()) : err.dump();
        if (a_->call) a_->call->cancel();
        release_server(false, false, why);
        return retry_or_fail(502, why);
      }
      committed_ = true;
      router_.metrics().first_byte_seconds.observe(std::chrono::duration<double>(Clock::now() - arrival_).count());
      exchange_->begin_stream();
    }
    send_event(e);
  }
}

void ProxyJob::send_event(const std::string& data) { exchange_->send("data: " + data + "\n\n"); }

void ProxyJob::on_end(const std::string& error, bool connect_failed) {
  Attempt& a = *a_;
  a.call = nullptr;
  if (connect_failed) router_.server_down(*a.server, error);
  if (a.event_stream) {
    if (error.empty()) {
      on_body("\n\n");  // ends an unterminated last event, if any
      if (done_ || a_.get() != &a) return;
    }
    if (committed_) {
      if (!error.empty()) {  // the stream broke after the client got its first bytes
        const net::ApiError e(502, cat("the server failed mid-stream: ", error), "", "upstream_error");
        send_event(net::render_error(e));
        send_event("[DONE]");
      }
      exchange_->end_stream();
      release_server(error.empty(), !error.empty(), error);
      return finish(error.empty());
    }
    release_server(false, !error.empty(), error);
    return retry_or_fail(502, error.empty() ? "the server ended the stream without an event" : error);
  }
  if (!error.empty()) {
    release_server(false, true, error);
    return retry_or_fail(502, error);
  }
  const int st = a.status;
  if (st == 200 || (st >= 400 && st < 500 && st != 429)) {  // an answer (or the client's mistake): pass it on
    committed_ = true;
    router_.metrics().first_byte_seconds.observe(std::chrono::duration<double>(Clock::now() - arrival_).count());
    exchange_->reply(st, a.content_type.empty() ? "application/json" : a.content_type, std::move(a.body));
    release_server(true, false, "");
    return finish(st == 200);
  }
  const bool blame = st >= 500 && st != 503;
  const json j = parse_event(a.body);
  std::string why = cat("HTTP ", st);
  if (j.is_object() && j.contains("error") && j["error"].is_object()) why += ": " + j["error"].value("message", "");
  release_server(false, blame, why);
  retry_or_fail(st, why);
}

void ProxyJob::on_prefill_end(int status, const std::string& body, const std::string& error, bool connect_failed) {
  a_->prefill_call = nullptr;
  if (error.empty() && status == 200) return release_prefill(true, false, "");
  if (connect_failed) router_.server_down(*a_->prefill, error);
  std::string why = error;
  if (why.empty()) {
    const json j = parse_event(body);
    why = cat("HTTP ", status);
    if (j.is_object() && j.contains("error") && j["error"].is_object()) why += ": " + j["error"].value("message", "");
  }
  // The prefill server's own failure (unreachable, closed, 5xx other than a failed transfer) is its
  // blame; a failed transfer (502) may be either side's.
  release_prefill(false, !error.empty() || (status >= 500 && status != 502 && status != 503), why);
  // The decode side fails the room by itself; before the first byte, retrying now saves its timeout.
  if (!committed_ && !error.empty()) {
    if (a_->call) a_->call->cancel();
    a_->call = nullptr;
    release_server(false, false, why);
    retry_or_fail(502, cat("prefill server: ", why));
  }
}

void ProxyJob::release_server(bool ok, bool blame, const std::string& why) {
  Attempt& a = *a_;
  if (a.server_released) return;
  a.server_released = true;
  ServerState& s = *a.server;
  --s.in_flight;
  s.load_tokens -= info_.load_tokens;
  Pool* pool = router_.stream_pool();
  if (ok) pool->succeeded(s);
  else if (blame) pool->failed(s, why, Clock::now());
  else if (s.open) s.trial = false;
  if (!ok) avoid_.push_back(&s);
}

void ProxyJob::release_prefill(bool ok, bool blame, const std::string& why) {
  Attempt& a = *a_;
  if (!a.prefill || a.prefill_released) return;
  a.prefill_released = true;
  ServerState& p = *a.prefill;
  --p.in_flight;
  p.load_tokens -= info_.prompt_tokens;
  Pool* pool = router_.prefill_pool();
  if (ok) pool->succeeded(p);
  else if (blame) pool->failed(p, why, Clock::now());
  else if (p.open) p.trial = false;
  if (!ok) avoid_.push_back(&p);
}

void ProxyJob::retry_or_fail(int status, const std::string& why) {
  if (a_) {
    if (a_->call) a_->call->cancel();
    if (a_->prefill_call) a_->prefill_call->cancel();  // the prefill server aborts the room
    a_->call = a_->prefill_call = nullptr;
    release_server(false, false, why);
    release_prefill(false, false, why);
  }
  if (done_) return;
  if (attempts_ <= router_.options().retries && !exchange_->client_gone()) {
    log::info("router: attempt ", attempts_, " failed (", why, "); retrying");
    ++router_.metrics().retries;
    a_.reset();
    return attempt();
  }
  const int st = status == 503 || status == 429 ? status : status == 504 ? 504 : 502;
  const net::ApiError e(st, cat("all attempts failed; last: ", why), "", st == 503 ? "unavailable" : "upstream_error");
  exchange_->reply(e.status, "application/json", net::render_error(e),
                   st == 503 || st == 429 ? net::Headers{{"Retry-After", "1"}} : net::Headers{});
  finish(false);
}

void ProxyJob::client_gone() {
  if (done_) return;
  ++router_.metrics().client_gone;
  if (a_) {
    if (a_->call) a_->call->cancel();
    if (a_->prefill_call) a_->prefill_call->cancel();
    a_->call = a_->prefill_call = nullptr;
    release_server(false, false, "client gone");
    release_prefill(false, false, "client gone");
  }
  done_ = true;
  router_.metrics().request_seconds.observe(std::chrono::duration<double>(Clock::now() - arrival_).count());
  router_.finished(this);
}

void ProxyJob::abort(const std::string& why) {
  if (done_) return;
  if (a_) {
    if (a_->call) a_->call->cancel();
    if (a_->prefill_call) a_->prefill_call->cancel();
    a_->call = a_->prefill_call = nullptr;
    release_server(false, false, why);
    release_prefill(false, false, why);
  }
  const net::ApiError e(503, why, "", "unavailable");
  if (committed_) {
    send_event(net::render_error(e));
    send_event("[DONE]");
    exchange_->end_stream();
  } else {
    exchange_->reply(e.status, "application/json", net::render_error(e), {{"Retry-After", "1"}});
  }
  finish(false);
}

void ProxyJob::finish(bool ok) {
  if (done_) return;
  done_ = true;
  // A prefill call still going after success finishes by itself (its room is complete).
  if (ok) ++router_.metrics().ok;
  else ++router_.metrics().errors;
  router_.metrics().request_seconds.observe(std::chrono::duration<double>(Clock::now() - arrival_).count());
  router_.finished(this);
}

}  // namespace tern::router
