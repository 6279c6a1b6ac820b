#include "server/service.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/log.h"
#include "net/auth.h"
#include "net/room.h"
#include "server/job.h"

namespace tern::server {

namespace {

constexpr const char* kJson = "application/json";
constexpr size_t kMaxLiveJobs = 8192;  // beyond this: 429

std::string path_of(const std::string& target) { return target.substr(0, target.find('?')); }

}  // namespace

ApiService::ApiService(engine::Engine& engine, const TextCodec& codec, net::HttpServer& http, ServiceOptions options,
                       PdContext pd)
    : engine_(engine), codec_(codec), http_(http), options_(std::move(options)), pd_(std::move(pd)),
      admission_(options_.admission) {
  limits_.model = options_.model_name;
  limits_.vocab_size = codec_.vocab_size();
}

void ApiService::handle(net::HttpRequest&& request, std::shared_ptr<net::Exchange> exchange) {
  ++counters_.http_requests_total;
  try {
    route(request, exchange);
  } catch (const net::ApiError& e) {
    fail(*exchange, e);
  } catch (const Error& e) {
    fail(*exchange, net::ApiError(400, e.what()));
  } catch (const std::exception& e) {
    log::error("internal error on ", request.method, " ", request.target, ": ", e.what());
    fail(*exchange, net::ApiError(500, cat("internal error: ", e.what()), "", "internal_server_error"));
  }
}

void ApiService::answer(net::Exchange& exchange, int status, std::string body, const net::Headers& headers) {
  if (status >= 500) ++counters_.http_errors_5xx_total;
  else if (status >= 400) ++counters_.http_errors_4xx_total;
  exchange.reply(status, kJson, std::move(body), headers);
}

void ApiService::fail(net::Exchange& exchange, const net::ApiError& e) { answer(exchange, e.status, net::render_error(e), net::error_headers(e)); }

bool ApiService::authorized(const net::HttpRequest& request) const {
  return net::bearer_authorized(request.authorization, options_.api_key);
}

void ApiService::preflight(const net::HttpRequest& request) const {
  const std::string path = path_of(request.target);
  if (path == "/health" || path == "/metrics" || path == "/pd/info") return;
  const bool known = path == "/v1/models" || path == "/v1/completions" || path == "/v1/chat/completions" ||
                     path == "/tokenize" || path == "/detokenize";
  if (!known) throw net::ApiError(404, cat("no route ", request.method, " ", path), "", "not_found_error");
  if (!authorized(request)) throw net::ApiError(401, "a valid API key is required: Authorization: Bearer <key>", "", "authentication_error", "invalid_api_key");
  if (!ready_) throw net::ApiError(503, "the model is loading", "", "unavailable");
  if (draining_) throw net::ApiError(503, "the server is shutting down", "", "unavailable");
}

std::optional<net::Refusal> ApiService::check_head(const net::HttpRequest& head) const {
  try {
    preflight(head);
    return std::nullopt;
  } catch (const net::ApiError& e) {
    return net::Refusal{e.status, net::render_error(e), net::error_headers(e)};
  }
}

void ApiService::route(const net::HttpRequest& request, const std::shared_ptr<net::Exchange>& exchange) {
  const std::string path = path_of(request.target);
  const std::string& m = request.method;
  preflight(request);
  if (path == "/health") {
    if (m != "GET") throw net::ApiError(405, "use GET /health");
    if (!ready_ || draining_) throw net::ApiError(503, ready_ ? "the server is shutting down" : "the model is loading", "", "unavailable");
    return answer(*exchange, 200, R"({"status":"ok"})");
  }
  if (path == "/metrics") {
    if (m != "GET") throw net::ApiError(405, "use GET /metrics");
    return exchange->reply(200, "text/plain; version=0.0.4", metrics());
  }
  if (path == "/pd/info") {  // for `tern route`: this server's role and bootstrap address
    if (m != "GET") throw net::ApiError(405, "use GET /pd/info");
    return answer(*exchange, 200, pd_info());
  }
  if (path == "/v1/models") {
    if (m != "GET") throw net::ApiError(405, "use GET /v1/models");
    return answer(*exchange, 200, net::render_models(options_.model_name, options_.created, options_.max_model_len));
  }
  if (m != "POST") throw net::ApiError(405, cat("use POST ", path));
  if (path == "/tokenize") return tokenize(request, *exchange);
  if (path == "/detokenize") return detokenize(request, *exchange);
  if (live_jobs_ >= kMaxLiveJobs) throw net::ApiError(429, "too many requests in flight; retry later", "", "rate_limit_error");
  if (path == "/v1/completions") return completions(request, exchange);
  chat(request, exchange);
}

void ApiService::check_length(const GenerationParams& p, const std::vector<int32_t>& prompt, const char* param) const {
  const auto n = static_cast<int64_t>(prompt.size());
  if (n >= options_.max_model_len)
    throw net::ApiError(400, cat("This model's maximum context length is ", options_.max_model_len, " tokens; the prompt has ", n,
                            " tokens"), param, "invalid_request_error", "context_length_exceeded");
  if (p.max_tokens_given && n + p.stop.max_tokens > options_.max_model_len)
    throw net::ApiError(400, cat("This model's maximum context length is ", options_.max_model_len, " tokens; you requested ",
                            n + p.stop.max_tokens, " tokens (", n, " in the prompt, ", p.stop.max_tokens,
                            " for the completion)"), "max_tokens", "invalid_request_error", "context_length_exceeded");
}

int64_t ApiService::state_tokens(GenerationParams& p, const std::vector<std::vector<int32_t>>& prompts,
                                 std::string& what) const {
  int64_t longest = 0;
  for (const auto& t : prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(t.size()));
  const auto choices = static_cast<int64_t>(prompts.size()) * p.n;
  const int64_t limit = options_.admission.max_request_tokens;
  // A chat without max_tokens may use the rest of the context, within what one request may hold (not
  // behind `tern route`: a prefill and a decode server must agree on max_tokens, and their limits may differ).
  if (!p.max_tokens_given && limit > 0 && pd_.role == Role::both)
    p.stop.max_tokens = std::max<int64_t>(1, std::min(p.stop.max_tokens, limit / choices - longest));
  // A prefill server holds a prompt and its first token; the others its whole generation.
  const int64_t generated = pd_.role == Role::prefill ? 1 : p.stop.max_tokens;
  int64_t tokens = 0;
  for (const auto& t : prompts) tokens += p.n * (static_cast<int64_t>(t.size()) + generated);
  what = cat(prompts.size(), prompts.size() == 1 ? " prompt" : " prompts", " x n ", p.n, " x (prompt + max_tokens ",
             generated, "), the longest prompt ", longest, " tokens");
  return tokens;
}

ResponseHead ApiService::head(const char* prefix, const std::string& model) {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return {cat(prefix, std::chrono::duration_cast<std::chrono::microseconds>(now).count(), "-", next_id_++), model,
          std::chrono::duration_cast<std::chrono::seconds>(now).count()};
}

void ApiService::run_job(const std::shared_ptr<Job>& job, const std::shared_ptr<net::Exchange>& exchange) {
  ++live_jobs_;
  try {
    job->start();
  } catch (...) {
    --live_jobs_;
    throw;
  }
  std::weak_ptr<Job> weak = job;
  exchange->on_client_gone([this, weak] {
    if (auto j = weak.lock(); j && !j->finished()) {
      ++counters_.client_disconnects_total;
      j->abort(false);
    }
  });
  job->on_complete(http_.schedule(options_.request_timeout, [this, weak] {
    if (auto j = weak.lock(); j && !j->finished()) {
      ++counters_.request_timeouts_total;
      j->abort(true);
    }
  }));
}

void ApiService::completions(const net::HttpRequest& request, const std::shared_ptr<net::Exchange>& exchange) {
  CompletionRequest r = parse_completion(request.body, limits_);
  std::vector<std::vector<int32_t>> prompts = std::move(r.token_prompts);
  for (const auto& t : r.text_prompts) prompts.push_back(codec_.encode(t, true));
  for (const auto& p : prompts) {
    if (p.empty()) throw net::ApiError(400, "the prompt is empty", "prompt");
    check_length(r.params, p, "prompt");
  }
  if (!r.params.max_tokens_given) r.params.stop.max_tokens = 16;
  generate(false, request, exchange, std::move(r.params), std::move(prompts), nullptr);
}

void ApiService::chat(const net::HttpRequest& request, const std::shared_ptr<net::Exchange>& exchange) {
  ChatRequest r = parse_chat(request.body, limits_);
  std::vector<int32_t> prompt = codec_.chat_prompt(r);
  check_length(r.params, prompt, "messages");
  if (!r.params.max_tokens_given) r.params.stop.max_tokens = options_.max_model_len - static_cast<int64_t>(prompt.size());
  std::vector<std::vector<int32_t>> prompts;
  prompts.push_back(std::move(prompt));
  generate(true, request, exchange, std::move(r.params), std::move(prompts), [&] { return codec_.output_parser(r); });
}

void ApiService::generate(bool chat, const net::HttpRequest& request, const std::shared_ptr<net::Exchange>& exchange,
                          GenerationParams params, std::vector<std::vector<int32_t>> prompts,
                          const std::function<std::unique_ptr<OutputParser>()>& parser) {
  const bool pd = !request.tern_room.empty();
  if (pd && pd_.role == Role::both)
    throw net::ApiError(400, "this server does not take part in prefill-decode disaggregation (--role both) but got X-Tern-Room");
  if (!pd && pd_.role != Role::both)
    throw net::ApiError(400, cat("this is a ", role_name(pd_.role), " server (--role ", role_name(pd_.role),
                            "): requests come through `tern route` with X-Tern-Room"), "", "invalid_request_error");
  std::string what;
  const int64_t tokens = state_tokens(params, prompts, what);
  const std::string client = client_of(request, options_.admission.trusted_proxies);
  admission_.admit(client, tokens, what);
  auto release = [this, client, tokens] { admission_.release(client, tokens); };
  JobContext ctx{&engine_, &codec_, [this](auto fn) { http_.post(std::move(fn)); },
                 [this, release](int) {
                   --live_jobs_;
                   release();
                 },
                 nullptr, client_key(client)};
  try {
    start_generation(chat, request, exchange, std::move(params), std::move(prompts), parser, std::move(ctx));
  } catch (...) {
    release();  // refused before it ran: nothing of it is in flight
    throw;
  }
}

void ApiService::start_generation(bool chat, const net::HttpRequest& request, const std::shared_ptr<net::Exchange>& exchange,
                                  GenerationParams params, std::vector<std::vector<int32_t>> prompts,
                                  const std::function<std::unique_ptr<OutputParser>()>& parser, JobContext ctx) {
  const bool pd = !request.tern_room.empty();
  uint64_t room = 0;
  if (pd) {
    try {
      room = net::parse_room(request.tern_room);
    } catch (const Error& e) {
      throw net::ApiError(400, cat("X-Tern-Room: ", e.what()));
    }
  }
  if (pd_.role == Role::prefill) {
    auto job = std::make_shared<PrefillJob>(room, std::move(params), exchange, std::move(ctx), *pd_.prefill);
    for (auto& p : prompts) job->add_prompt(std::move(p));
    return run_job(job, exchange);
  }
  if (pd_.role == Role::decode) {
    try {
      transfer::parse_host_port(request.tern_bootstrap);
    } catch (const Error& e) {
      throw net::ApiError(400, cat("X-Tern-Bootstrap: ", e.what()));
    }
    ctx.submit = remote_submit(engine_, *pd_.decode, ctx.post, room, request.tern_bootstrap);
  }
  const auto kind = chat ? GenerationJob::Kind::chat : GenerationJob::Kind::completion;
  auto job = std::make_shared<GenerationJob>(kind, head(chat ? "chatcmpl-" : "cmpl-", params.model), params, exchange,
                                             std::move(ctx));
  for (auto& p : prompts) job->add_prompt(std::move(p), parser);
  run_job(job, exchange);
}

std::string ApiService::pd_info() const {
  return cat(R"({"role":")", role_name(pd_.role), R"(","bootstrap":)",
             pd_.bootstrap.empty() ? std::string("null") : cat('"', pd_.bootstrap, '"'), R"(,"model":")",
             options_.model_name, R"(","max_model_len":)", options_.max_model_len, "}");
}

void ApiService::tokenize(const net::HttpRequest& request, net::Exchange& exchange) {
  TokenizeRequest r = parse_tokenize(request.body, limits_);
  const auto tokens = r.chat ? codec_.chat_prompt(*r.chat) : codec_.encode(r.prompt, r.add_special_tokens);
  answer(exchange, 200, render_tokenize(tokens, options_.max_model_len));
}

void ApiService::detokenize(const net::HttpRequest& request, net::Exchange& exchange) {
  DetokenizeRequest r = parse_detokenize(request.body, limits_);
  answer(exchange, 200, render_detokenize(codec_.decode(r.tokens)));
}

std::string ApiService::metrics() const {
  ServerCounters c = counters_;
  c.http = http_.stats();
  c.admission_clients = admission_.clients();
  std::string out = render_metrics(engine_.metrics(), c, options_.model_name);
  if (pd_.prefill) out += render_pd_metrics(pd_.prefill->metrics(), "prefill", options_.model_name);
  if (pd_.decode) out += render_pd_metrics(pd_.decode->metrics(), "decode", options_.model_name);
  return out;
}

}  // namespace tern::server
