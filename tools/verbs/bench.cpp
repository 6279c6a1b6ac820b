// `tern bench`: benchmark any OpenAI-compatible server (docs/bench.md).
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>

#include "bench/runner.h"
#include "core/error.h"
#include "tools/verb.h"

namespace {

using namespace tern::bench;

struct Cli {
  BenchConfig config;
  std::string api = "chat", dataset = "random", semantics = "sglang", slo, extra_body, request_rate = "inf";
  std::string report_from;
  int output_len = 0;
  bool no_progress = false;
  bool no_server_metrics = false;
};

void add_target_options(CLI::App& app, Cli& c) {
  Target& t = c.config.target;
  app.add_option("--base-url", c.config.base_url, "Server URL, e.g. http://127.0.0.1:30000 (overrides --host/--port)");
  app.add_option("--host", t.host, "Server host")->capture_default_str();
  app.add_option("--port", t.port, "Server port")->capture_default_str();
  app.add_option("--api", c.api, "chat (/v1/chat/completions) or completions (/v1/completions)")
      ->check(CLI::IsMember({"chat", "completions"}))->capture_default_str();
  app.add_option("--endpoint", t.path, "Request path (default: the API's)");
  app.add_option("--model", t.model, "Model name sent in each request (default: the first of GET /v1/models)");
  app.add_option("--api-key", t.api_key, "Bearer key (default: $OPENAI_API_KEY)");
  app.add_flag("--ignore-eos", t.ignore_eos, "Ask the server to ignore EOS so every request gets max_tokens");
  app.add_option("--extra-request-body", c.extra_body, "JSON object merged into every request body");
  app.add_option("--timeout", t.timeout_s, "Per-request timeout in seconds (send to end of stream)")
      ->capture_default_str();
}

void add_workload_options(CLI::App& app, Cli& c) {
  WorkloadSpec& w = c.config.workload;
  app.add_option("--dataset-name,--dataset", c.dataset, "random, random-ids, sharegpt or prompt-file")
      ->check(CLI::IsMember({"random", "random-ids", "sharegpt", "prompt-file"}))->capture_default_str();
  app.add_option("--dataset-path", w.path, "ShareGPT JSON file or prompt file (one prompt per line)");
  app.add_option("--num-prompts", w.num_prompts, "Requests per run")->capture_default_str();
  app.add_option("--random-input-len", w.input_len, "Random dataset: input length")->capture_default_str();
  app.add_option("--random-output-len", w.output_len, "Random dataset: output length")->capture_default_str();
  app.add_option("--random-range-ratio", w.range_ratio, "Random dataset: range ratio r")->capture_default_str();
  app.add_option("--range-semantics", c.semantics,
                 "sglang: uniform on [max(L*r,1), L]; vllm: uniform on [L(1-r), L(1+r)]")
      ->check(CLI::IsMember({"sglang", "vllm"}))->capture_default_str();
  app.add_option("--sharegpt-output-len", w.sharegpt_output_len, "ShareGPT: fixed output length");
  app.add_option("--output-len", c.output_len, "Prompt file: output length (default --random-output-len)");
  app.add_option("--seed", w.seed, "Seed of the workload and the arrivals")->capture_default_str();
  app.add_option("--tokenizer", c.config.tokenizer,
                 "tokenizer.json to build prompts with (default: a synthetic vocabulary)");
}

void add_run_options(CLI::App& app, Cli& c) {
  BenchConfig& b = c.config;
  app.add_option("--request-rate", c.request_rate, "Requests/s (Poisson or gamma arrivals), or inf")
      ->capture_default_str();
  app.add_option("--burstiness", b.arrivals.burstiness, "Gamma shape of the arrival gaps (1: Poisson)")
      ->capture_default_str();
  app.add_option("--max-concurrency", b.max_concurrency, "Cap on requests in flight (0: none)");
  app.add_option("--sweep-concurrency", b.sweep, "Run once per level, e.g. 1,8,16,32,64")->delimiter(',');
  app.add_option("--warmup-requests", b.warmup_requests, "Requests sent and discarded before measuring")
      ->capture_default_str();
  app.add_option("--slo", c.slo, "Goodput SLOs in ms, e.g. ttft:200,tpot:50 (also e2el)");
  app.add_option("--output-file", b.output_file, "Append sglang-style JSON lines to this file");
  app.add_flag("--output-details", b.output_details, "Include per-request lists in the JSON");
  app.add_option("--html", b.html_file, "Write a self-contained HTML report");
  app.add_flag("--no-progress", c.no_progress, "No progress bar");
  app.add_flag("--no-server-metrics", c.no_server_metrics,
               "Do not read GET /metrics around each run (speculative-decoding acceptance)");
  app.add_option("--report-from", c.report_from, "Only build the HTML report from JSON lines (with details)");
}

double parse_rate(const std::string& text) {
  if (text == "inf") return INFINITY;
  try {
    return std::stod(text);
  } catch (const std::exception&) {
    tern::fail("tern bench: --request-rate '", text, "' is neither a number nor inf");
  }
}

void finish_config(Cli& c) {
  BenchConfig& b = c.config;
  b.target.api = c.api == "chat" ? Api::chat : Api::completions;
  if (b.target.path.empty()) b.target.path = default_path(b.target.api);
  if (!b.base_url.empty()) parse_base_url(b.base_url, b.target);
  if (b.target.api_key.empty())
    if (const char* key = std::getenv("OPENAI_API_KEY")) b.target.api_key = key;
  static const std::map<std::string, DatasetKind> kinds = {{"random", DatasetKind::random},
      {"random-ids", DatasetKind::random_ids}, {"sharegpt", DatasetKind::sharegpt},
      {"prompt-file", DatasetKind::prompt_file}};
  b.workload.dataset = kinds.at(c.dataset);
  b.workload.semantics = c.semantics == "vllm" ? RangeSemantics::vllm : RangeSemantics::sglang;
  if (c.output_len > 0) b.workload.output_len = c.output_len;
  b.arrivals.request_rate = parse_rate(c.request_rate);
  b.arrivals.seed = b.workload.seed;
  if (!c.slo.empty()) b.slo = parse_slo(c.slo);
  if (!c.extra_body.empty()) {
    b.target.extra_body = nlohmann::json::parse(c.extra_body, nullptr, false);
    TERN_CHECK(b.target.extra_body.is_object(), "tern bench: --extra-request-body must be a JSON object");
  }
  b.progress = !c.no_progress;
  b.server_metrics = !c.no_server_metrics;
  for (int level : b.sweep) TERN_CHECK(level > 0, "tern bench: --sweep-concurrency levels must be positive");
}

int run(Cli c) {
  if (!c.report_from.empty()) {
    TERN_CHECK(!c.config.html_file.empty(), "tern bench: --report-from needs --html OUT");
    BenchOutcome outcome;
    outcome.runs = runs_from_json_lines(c.report_from, outcome.context);
    c.config.output_file.clear();
    write_reports(c.config, outcome);
    return 0;
  }
  finish_config(c);
  BenchOutcome outcome = run_benchmark(c.config, std::cout);
  for (const auto& r : outcome.runs)
    if (r.summary.completed == 0) return 1;  // nothing succeeded: the exit code says so
  return 0;
}

const bool registered = tern::tools::register_verb(
    {"bench", "Benchmark an OpenAI-compatible server", [](CLI::App& app) -> std::function<int()> {
       auto cli = std::make_shared<Cli>();
       cli->config.target.path.clear();
       add_target_options(app, *cli);
       add_workload_options(app, *cli);
       add_run_options(app, *cli);
       return [cli] { return run(*cli); };
     }});

}  // namespace
