#include "bench/runner.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fmt/format.h>
#include <fstream>

#include "bench/client.h"
#include "bench/codec.h"
#include "bench/discover.h"
#include "core/error.h"

namespace tern::bench {
namespace {

// A /metrics page is small and served from memory; a server slow to give it is not waited on long.
constexpr double kScrapeTimeoutS = 10;

// One line, redrawn in place on a terminal; on a pipe, a line every ~5 s so logs stay readable.
class ProgressBar {
 public:
  ProgressBar(std::string label, bool enabled) : label_(std::move(label)), enabled_(enabled), tty_(isatty(2)) {}
  void operator()(const Progress& p) {
    if (!enabled_) return;
    bool last = p.done == p.total;
    if (!tty_ && !last && p.elapsed_s - last_print_s_ < 5) return;
    last_print_s_ = p.elapsed_s;
    constexpr int kWidth = 30;
    int filled = p.total ? kWidth * p.done / p.total : kWidth;
    std::string bar = std::string(static_cast<std::size_t>(filled), '#') + std::string(static_cast<std::size_t>(kWidth - filled), '.');
    std::string text = fmt::format("{} [{}] {}/{} done, {} failed, {} in flight, {:.0f} chunks/s, {:.1f} s", label_,
                                   bar, p.done, p.total, p.failed, p.in_flight,
                                   p.elapsed_s > 0 ? p.content_chunks / p.elapsed_s : 0.0, p.elapsed_s);
    std::fprintf(stderr, tty_ ? "\r%s\033[K%s" : "%s%s", text.c_str(), last || !tty_ ? "\n" : "");
    std::fflush(stderr);
  }

 private:
  std::string label_;
  bool enabled_, tty_;
  double last_print_s_ = -1e9;
};

ClientOverhead overhead_of(const RunOutput& out) {
  ClientOverhead o;
  o.chunk_ms = distribution(std::vector<double>(out.overhead_ms.begin(), out.overhead_ms.end()));
  o.kernel_timestamps = out.kernel_timestamps;
  return o;
}

RunContext context_of(const BenchConfig& c, const TokenCodec& codec) {
  RunContext ctx;
  ctx.backend = c.target.api == Api::chat ? "tern-bench openai-chat" : "tern-bench openai";
  ctx.base_url = c.base_url.empty() ? fmt::format("http://{}:{}", c.target.host, c.target.port) : c.base_url;
  ctx.base_url += c.target.path;
  ctx.model = c.target.model;
  const WorkloadSpec& w = c.workload;
  ctx.dataset = w.dataset == DatasetKind::random_ids ? "random-ids" : to_string(w.dataset);
  ctx.workload = describe(w);
  ctx.tokenizer = codec.describe();
  ctx.random_semantics = to_string(w.semantics);
  ctx.random_input_len = w.input_len, ctx.random_output_len = w.output_len;
  ctx.sharegpt_output_len = w.sharegpt_output_len, ctx.random_range_ratio = w.range_ratio;
  ctx.request_rate = c.arrivals.request_rate, ctx.burstiness = c.arrivals.burstiness;
  ctx.num_prompts = w.num_prompts, ctx.warmup_requests = c.warmup_requests, ctx.seed = w.seed;
  return ctx;
}

// Warm-up requests (the first prompts, all at once) are sent and discarded; a warm-up that fails
// entirely means the server is not usable, which is said before the real run starts.
void warm_up(const BenchConfig& config, const std::vector<RequestSpec>& requests, std::ostream& out) {
  if (config.warmup_requests <= 0) return;
  std::vector<RequestSpec> warm;
  for (int i = 0; i < config.warmup_requests; ++i)
    warm.push_back(requests[static_cast<std::size_t>(i) % requests.size()]);
  RunOptions options;
  RunOutput result = run_requests(config.target, warm, options);
  int ok = 0;
  for (const auto& r : result.results) ok += r.success ? 1 : 0;
  out << fmt::format("Warm-up: {}/{} requests succeeded\n", ok, warm.size());
  if (ok == 0) out << "Warm-up failed: " << result.results.front().error << "\n";
}

}  // namespace

RunReport run_once(const BenchConfig& config, const std::vector<RequestSpec>& requests, int max_concurrency,
                   const std::string& label) {
  ProgressBar bar(label, config.progress);
  RunOptions options;
  ArrivalSpec arrivals = config.arrivals;
  options.offsets = arrival_offsets(arrivals, static_cast<int>(requests.size()));
  options.max_concurrency = max_concurrency;
  options.on_progress = [&bar](const Progress& p) { bar(p); };
  options.tag_requests = config.tag_requests;
  // Scraped outside run_requests, so the two GETs add nothing to the run's clock.
  double scrape_timeout_s = std::min(config.target.timeout_s, kScrapeTimeoutS);
  MetricsScrape before;
  if (config.server_metrics) before = scrape_metrics(config.target, scrape_timeout_s);
  RunOutput output = run_requests(config.target, requests, options);
  RunReport report;
  if (config.server_metrics)
    report.speculative = speculative_outcome(before, scrape_metrics(config.target, scrape_timeout_s));
  else
    report.speculative.note = "GET /metrics not read: --no-server-metrics";
  report.label = label;
  report.max_concurrency = max_concurrency;
  report.summary = summarize(output.results, config.slo);
  report.overhead = overhead_of(output);
  report.results = std::move(output.results);
  return report;
}

BenchOutcome run_benchmark(const BenchConfig& given, std::ostream& out) {
  BenchConfig config = given;
  if (config.target.model.empty()) {
    constexpr double kDiscoveryTimeoutS = 30;
    config.target.model = discover_model(config.target, std::min(config.target.timeout_s, kDiscoveryTimeoutS));
    out << "Model: " << config.target.model << " (the first of GET /v1/models)\n";
  }
  auto codec = make_codec(config.tokenizer);
  BenchOutcome outcome{context_of(config, *codec), {}};
  std::vector<RequestSpec> requests = build_workload(config.workload, *codec);
  out << "Workload: " << outcome.context.workload << " (" << requests.size() << " requests)\n";
  warm_up(config, requests, out);
  std::vector<int> levels = config.sweep.empty() ? std::vector<int>{config.max_concurrency} : config.sweep;
  for (int level : levels) {
    std::string label = level > 0 ? fmt::format("C={}", level) : "unlimited";
    outcome.runs.push_back(run_once(config, requests, level, label));
    print_summary(out, outcome.context, outcome.runs.back());
  }
  if (!config.sweep.empty()) print_sweep_table(out, outcome.runs);
  write_reports(config, outcome);
  return outcome;
}

void write_reports(const BenchConfig& config, const BenchOutcome& outcome) {
  if (!config.output_file.empty())
    append_json_lines(config.output_file, outcome.context, outcome.runs, config.output_details);
  if (!config.html_file.empty()) {
    std::ofstream html(config.html_file);
    TERN_CHECK(html, "tern bench: cannot write ", config.html_file);
    html << html_report(outcome.context, outcome.runs);
  }
}

}  // namespace tern::bench
