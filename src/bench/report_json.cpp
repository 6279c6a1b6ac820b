#include <cmath>
#include <fstream>
#include <sstream>

#include "bench/report.h"
#include "core/error.h"

namespace tern::bench {
namespace {

using nlohmann::json;

void put_distribution(json& j, const std::string& name, const Distribution& d) {
  j["mean_" + name + "_ms"] = d.mean;
  j["median_" + name + "_ms"] = d.median;
  j["std_" + name + "_ms"] = d.std;
  j["p90_" + name + "_ms"] = d.p90;
  j["p95_" + name + "_ms"] = d.p95;
  j["p99_" + name + "_ms"] = d.p99;
  j["max_" + name + "_ms"] = d.max;
}

json distribution_json(const Distribution& d) {
  return {{"mean", d.mean}, {"median", d.median}, {"std", d.std}, {"p90", d.p90},
          {"p95", d.p95},   {"p99", d.p99},       {"max", d.max}, {"count", d.count}};
}

Distribution distribution_from(const json& j) {
  Distribution d;
  d.mean = j.value("mean", 0.0), d.median = j.value("median", 0.0), d.std = j.value("std", 0.0);
  d.p90 = j.value("p90", 0.0), d.p95 = j.value("p95", 0.0), d.p99 = j.value("p99", 0.0);
  d.max = j.value("max", 0.0), d.count = j.value("count", std::size_t{0});
  return d;
}

// JSON has no infinity: sglang writes Python's float('inf'), which json.dumps spells Infinity
// (invalid JSON); tern writes the string "inf" instead.
json rate_json(double rate) { return std::isinf(rate) ? json("inf") : json(rate); }

json optional_json(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }
// Counter deltas are whole numbers; written as integers, as vllm bench serve writes them.
json count_json(const std::optional<double>& v) {
  if (v && std::isfinite(*v) && *v == std::floor(*v)) return json(static_cast<long long>(*v));
  return optional_json(v);
}
std::optional<double> optional_from(const json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_number()) return std::nullopt;
  return j[key].get<double>();
}

// null when the server reported nothing (tern.speculative_note says why). Rates are fractions (vLLM's
// JSON has acceptance_rate in percent; per-position rates are fractions in both).
json speculative_json(const SpeculativeOutcome& spec) {
  if (!spec.stats) return nullptr;
  const SpeculativeStats& s = *spec.stats;
  return {{"source", s.source},
          {"run_delta", s.run_delta},
          {"drafts", count_json(s.drafts)},
          {"draft_tokens", count_json(s.draft_tokens)},
          {"accepted_tokens", count_json(s.accepted_tokens)},
          {"acceptance_rate", optional_json(s.acceptance_rate)},
          {"acceptance_length", optional_json(s.acceptance_length)},
          {"per_position_acceptance_rate", s.per_position}};
}

SpeculativeOutcome speculative_from(const json& result) {
  SpeculativeOutcome spec;
  if (result.contains("tern")) spec.note = result["tern"].value("speculative_note", "");
  const json& j = result.contains("speculative") ? result["speculative"] : json(nullptr);
  if (!j.is_object()) return spec;
  SpeculativeStats s;
  s.source = j.value("source", ""), s.run_delta = j.value("run_delta", true);
  s.drafts = optional_from(j, "drafts"), s.draft_tokens = optional_from(j, "draft_tokens");
  s.accepted_tokens = optional_from(j, "accepted_tokens");
  s.acceptance_rate = optional_from(j, "acceptance_rate"), s.acceptance_length = optional_from(j, "acceptance_length");
  s.per_position = j.value("per_position_acceptance_rate", std::vector<double>{});
  spec.stats = s;
  return spec;
}

json tern_extras(const RunContext& ctx, const RunReport& run) {
  const Summary& s = run.summary;
  json failures = json::object();
  for (const auto& [reason, count] : s.failures)
    failures[reason] = {{"count", count}, {"example", s.failure_example.at(reason)}};
  json extras = {{"label", run.label},
                 {"failed", s.failed},
                 {"failures", failures},
                 {"workload", ctx.workload},
                 {"random_semantics", ctx.random_semantics},
                 {"tokenizer", ctx.tokenizer},
                 {"burstiness", ctx.burstiness},
                 {"seed", ctx.seed},
                 {"warmup_requests", ctx.warmup_requests},
                 {"usage_missing", s.usage_missing},
                 {"client_overhead_ms", distribution_json(run.overhead.chunk_ms)},
                 {"kernel_timestamps", run.overhead.kernel_timestamps},
                 {"speculative_note", run.speculative.note}};
  if (s.goodput) extras["request_goodput"] = *s.goodput;
  return extras;
}

void put_details(json& j, const RunReport& run) {
  json input_lens = json::array(), output_lens = json::array(), ttfts = json::array(), itls = json::array(),
       errors = json::array(), starts = json::array(), latencies = json::array();
  for (const auto& r : run.results) {
    input_lens.push_back(r.input_len);
    output_lens.push_back(r.success ? r.output_len : 0);
    ttfts.push_back(r.ttft_s);
    itls.push_back(r.itl_s);
    errors.push_back(r.success ? "" : r.reason + ": " + r.error);
    starts.push_back(r.start_s);
    latencies.push_back(r.latency_s);
  }
  j["input_lens"] = input_lens, j["output_lens"] = output_lens, j["ttfts"] = ttfts, j["itls"] = itls;
  j["errors"] = errors;
  j["tern"]["start_times"] = starts, j["tern"]["latencies"] = latencies;
}

}  // namespace

json result_json(const RunContext& ctx, const RunReport& run, bool details) {
  const Summary& s = run.summary;
  json j = {{"backend", ctx.backend},
            {"dataset_name", ctx.dataset},
            {"request_rate", rate_json(ctx.request_rate)},
            {"max_concurrency", run.max_concurrency > 0 ? json(run.max_concurrency) : json(nullptr)},
            {"sharegpt_output_len", ctx.sharegpt_output_len > 0 ? json(ctx.sharegpt_output_len) : json(nullptr)},
            {"random_input_len", ctx.random_input_len},
            {"random_output_len", ctx.random_output_len},
            {"random_range_ratio", ctx.random_range_ratio},
            {"duration", s.duration_s},
            {"completed", s.completed},
            {"total_input_tokens", s.total_input},
            {"total_output_tokens", s.total_output},
            {"request_throughput", s.request_throughput},
            {"input_throughput", s.input_throughput},
            {"output_throughput", s.output_throughput},
            {"total_throughput", s.total_throughput},
            {"concurrency", s.concurrency},
            {"max_output_tokens_per_s", s.max_output_tokens_per_s},
            {"max_concurrent_requests", s.max_concurrent_requests}};
  put_distribution(j, "e2e_latency", s.e2e_ms);
  put_distribution(j, "ttft", s.ttft_ms);
  put_distribution(j, "tpot", s.tpot_ms);
  put_distribution(j, "itl", s.itl_ms);
  j["speculative"] = speculative_json(run.speculative);
  j["tern"] = tern_extras(ctx, run);
  if (details) put_details(j, run);
  return j;
}

void append_json_lines(const std::string& path, const RunContext& ctx, const std::vector<RunReport>& runs,
                       bool details) {
  std::ofstream out(path, std::ios::app);
  TERN_CHECK(out, "tern bench: cannot write ", path);
  for (const auto& run : runs) out << result_json(ctx, run, details).dump() << "\n";
}

namespace {

std::vector<RequestResult> results_from(const json& j) {
  std::vector<RequestResult> results;
  const json& t = j.at("tern");
  for (std::size_t i = 0; i < j.at("ttfts").size(); ++i) {
    RequestResult r;
    std::string error = j["errors"][i].get<std::string>();
    r.success = error.empty();
    r.reason = error.substr(0, error.find(':'));
    r.error = error;
    r.input_len = j["input_lens"][i], r.output_len = j["output_lens"][i];
    r.usage_reported = !t.value("usage_missing", false);
    r.ttft_s = j["ttfts"][i], r.itl_s = j["itls"][i].get<std::vector<double>>();
    r.start_s = t.at("start_times")[i], r.latency_s = t.at("latencies")[i];
    results.push_back(std::move(r));
  }
  return results;
}

}  // namespace

std::vector<RunReport> runs_from_json_lines(const std::string& path, RunContext& ctx) {
  std::ifstream in(path);
  TERN_CHECK(in, "tern bench: cannot open ", path);
  std::vector<RunReport> runs;
  for (std::string text; std::getline(in, text);) {
    if (text.empty()) continue;
    json j = json::parse(text, nullptr, false);
    TERN_CHECK(!j.is_discarded() && j.contains("tern") && j.contains("ttfts"), "tern bench: ", path,
               ": each line must be a tern bench result written with --output-details");
    ctx.backend = j.value("backend", ""), ctx.dataset = j.value("dataset_name", "");
    ctx.workload = j["tern"].value("workload", ""), ctx.tokenizer = j["tern"].value("tokenizer", "");
    ctx.random_semantics = j["tern"].value("random_semantics", "");
    const json& rate = j["request_rate"];
    ctx.request_rate = rate.is_number() ? rate.get<double>() : INFINITY;
    RunReport run;
    run.label = j["tern"].value("label", "");
    run.max_concurrency = j["max_concurrency"].is_number() ? j["max_concurrency"].get<int>() : 0;
    run.results = results_from(j);
    run.summary = summarize(run.results, Slo{});
    if (j["tern"].contains("request_goodput")) run.summary.goodput = j["tern"]["request_goodput"].get<double>();
    run.overhead.chunk_ms = distribution_from(j["tern"]["client_overhead_ms"]);
    run.overhead.kernel_timestamps = j["tern"].value("kernel_timestamps", false);
    run.speculative = speculative_from(j);
    runs.push_back(std::move(run));
  }
  TERN_CHECK(!runs.empty(), "tern bench: ", path, " holds no result");
  return runs;
}

}  // namespace tern::bench
