// The API: routes, authentication, readiness and the handlers of serving.md's endpoints. Handlers run
// on the IO thread, parse with schemas.h, hand generation to the engine through GenerationJob, and
// never block.
#pragma once

#include <chrono>
#include <list>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "net/http.h"
#include "server/admission.h"
#include "server/job.h"
#include "server/metrics_text.h"
#include "server/pd_jobs.h"
#include "server/schemas.h"
#include "server/text_codec.h"

namespace tern::server {

class Job;

struct ServiceOptions {
  std::string model_name = "deepseek-v4-flash";
  std::string api_key;  // empty: no authentication
  std::chrono::milliseconds request_timeout{600000};
  int64_t max_model_len = 0;
  int64_t created = 0;  // model creation time shown by /v1/models
  AdmissionLimits admission;  // tokens of state per request and per client
};

class ApiService {
 public:
  ApiService(engine::Engine& engine, const TextCodec& codec, net::HttpServer& http, ServiceOptions options,
             PdContext pd = {});
  void handle(net::HttpRequest&& request, std::shared_ptr<net::Exchange> exchange);
  // The HTTP layer's check of a request's head, before its body is read (net::HeadCheck): unknown routes,
  // the API key, loading and draining are answered from the head.
  std::optional<net::Refusal> check_head(const net::HttpRequest& head) const;
  void set_ready() { ready_ = true; }
  void set_draining() { draining_ = true; }
  size_t live_jobs() const { return live_jobs_; }
  std::string metrics() const;

 private:
  void route(const net::HttpRequest& request, const std::shared_ptr<net::Exchange>& exchange);
  // Throws the net::ApiError a request gets from its head alone (route, key, readiness), or returns.
  void preflight(const net::HttpRequest& request) const;
  void answer(net::Exchange& exchange, int status, std::string body, const net::Headers& headers = {});
  void fail(net::Exchange& exchange, const net::ApiError& e);
  bool authorized(const net::HttpRequest& request) const;
  void completions(const net::HttpRequest& request, const std::shared_ptr<net::Exchange>& exchange);
  void chat(const net::HttpRequest& request, const std::shared_ptr<net::Exchange>& exchange);
  void tokenize(const net::HttpRequest& request, net::Exchange& exchange);
  void detokenize(const net::HttpRequest& request, net::Exchange& exchange);
  void run_job(const std::shared_ptr<Job>& job, const std::shared_ptr<net::Exchange>& exchange);
  // Starts a generation as this server's role has it: here (both), its prompts only (prefill) or its
  // decoding only (decode).
  void generate(bool chat, const net::HttpRequest& request, const std::shared_ptr<net::Exchange>& exchange, GenerationParams params,
                std::vector<std::vector<int32_t>> prompts, const std::function<std::unique_ptr<OutputParser>()>& parser);
  // After admission: the job of this server's role, started.
  void start_generation(bool chat, const net::HttpRequest& request, const std::shared_ptr<net::Exchange>& exchange,
                        GenerationParams params, std::vector<std::vector<int32_t>> prompts,
                        const std::function<std::unique_ptr<OutputParser>()>& parser, JobContext ctx);
  std::string pd_info() const;
  // `param` is the request's field that holds the prompt: prompt (completions) or messages (chat).
  void check_length(const GenerationParams& p, const std::vector<int32_t>& prompt, const char* param) const;
  // Tokens of state the request may come to hold (prompts x n x (prompt + max_tokens)) and what they are,
  // for admission; a chat without max_tokens gets the rest of the context within --max-request-tokens.
  int64_t state_tokens(GenerationParams& p, const std::vector<std::vector<int32_t>>& prompts, std::string& what) const;
  ResponseHead head(const char* prefix, const std::string& model);

  engine::Engine& engine_;
  const TextCodec& codec_;
  net::HttpServer& http_;
  ServiceOptions options_;
  PdContext pd_;
  ParseLimits limits_;
  Admission admission_;
  bool ready_ = false;
  bool draining_ = false;
  size_t live_jobs_ = 0;
  uint64_t next_id_ = 1;
  ServerCounters counters_;
};

}  // namespace tern::server
