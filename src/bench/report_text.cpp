#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "bench/report.h"

namespace tern::bench {
namespace {

void line(std::ostream& out, const std::string& name, const std::string& value) {
  out << fmt::format("{:<40} {:>12}\n", name, value);
}
void num(std::ostream& out, const std::string& name, double v, int digits = 2) {
  line(out, name, fmt::format("{:.{}f}", v, digits));
}
void title(std::ostream& out, const std::string& t) { out << fmt::format("{:-^53}\n", t); }

void distribution_block(std::ostream& out, const std::string& name, const std::string& what,
                        const Distribution& d) {
  title(out, what);
  num(out, "Mean " + name + " (ms):", d.mean);
  num(out, "Median " + name + " (ms):", d.median);
  num(out, "P90 " + name + " (ms):", d.p90);
  num(out, "P99 " + name + " (ms):", d.p99);
  num(out, "Max " + name + " (ms):", d.max);
}

std::string rate_text(double rate) { return std::isinf(rate) ? "inf" : fmt::format("{:g}", rate); }

void failure_block(std::ostream& out, const Summary& s) {
  if (s.failed == 0) return;
  title(out, "Failures");
  for (const auto& [reason, count] : s.failures) {
    out << fmt::format("  {:>6} x {}\n", count, reason);
    out << "         e.g. " << s.failure_example.at(reason).substr(0, 200) << "\n";
  }
}

// vllm bench serve's "Speculative Decoding" block (its labels, rates in percent), plus where the
// figures come from, since SGLang's gauges are not run totals.
void speculative_block(std::ostream& out, const SpeculativeOutcome& spec) {
  if (!spec.stats) return;
  const SpeculativeStats& s = *spec.stats;
  title(out, "Speculative Decoding");
  if (s.acceptance_rate) num(out, "Acceptance rate (%):", *s.acceptance_rate * 100);
  if (s.acceptance_length) num(out, "Acceptance length:", *s.acceptance_length);
  if (s.drafts) num(out, "Drafts:", *s.drafts, 0);
  if (s.draft_tokens) num(out, "Draft tokens:", *s.draft_tokens, 0);
  if (s.accepted_tokens) num(out, "Accepted tokens:", *s.accepted_tokens, 0);
  if (!s.per_position.empty()) out << "Per-position acceptance (%):\n";
  for (std::size_t i = 0; i < s.per_position.size(); ++i)
    num(out, fmt::format("  Position {}:", i), s.per_position[i] * 100);
  line(out, "Source:", s.run_delta ? s.source + ": counters, run delta" : s.source + ": gauges after the run");
  if (!spec.note.empty()) out << "Note: " << spec.note << "\n";
}

}  // namespace

void print_summary(std::ostream& out, const RunContext& ctx, const RunReport& run) {
  const Summary& s = run.summary;
  out << fmt::format("{:=^53}\n", " Serving Benchmark Result ");
  line(out, "Backend:", ctx.backend);
  line(out, "Traffic request rate:", rate_text(ctx.request_rate));
  line(out, "Max request concurrency:", run.max_concurrency > 0 ? std::to_string(run.max_concurrency) : "not set");
  line(out, "Successful requests:", std::to_string(s.completed));
  line(out, "Failed requests:", std::to_string(s.failed));
  num(out, "Benchmark duration (s):", s.duration_s);
  line(out, "Total input tokens:", std::to_string(s.total_input));
  line(out, "Total generated tokens:", std::to_string(s.total_output));
  num(out, "Request throughput (req/s):", s.request_throughput);
  if (s.goodput) num(out, "Request goodput (req/s):", *s.goodput);
  num(out, "Input token throughput (tok/s):", s.input_throughput);
  num(out, "Output token throughput (tok/s):", s.output_throughput);
  num(out, "Peak output token throughput (tok/s):", s.max_output_tokens_per_s);
  num(out, "Total token throughput (tok/s):", s.total_throughput);
  num(out, "Concurrency:", s.concurrency);
  distribution_block(out, "E2E Latency", "End-to-End Latency", s.e2e_ms);
  distribution_block(out, "TTFT", "Time to First Token", s.ttft_ms);
  distribution_block(out, "TPOT", "Time per Output Token (excl. 1st token)", s.tpot_ms);
  distribution_block(out, "ITL", "Inter-token Latency", s.itl_ms);
  title(out, "Client overhead (chunk arrival to recorded)");
  num(out, "Mean overhead (ms):", run.overhead.chunk_ms.mean, 3);
  num(out, "P99 overhead (ms):", run.overhead.chunk_ms.p99, 3);
  num(out, "Max overhead (ms):", run.overhead.chunk_ms.max, 3);
  line(out, "Arrival clock:", run.overhead.kernel_timestamps ? "kernel SO_TIMESTAMPNS" : "read completion");
  failure_block(out, s);
  speculative_block(out, run.speculative);
  out << fmt::format("{:=^53}\n", "");
  out << "Workload: " << ctx.workload << "\nPrompts built with: " << ctx.tokenizer << "\n";
  if (s.usage_missing) out << "Note: some responses had no usage; their output length is max_tokens.\n";
  if (!run.speculative.stats) {
    const std::string& why = run.speculative.note;
    out << "Server metrics: speculative decoding: not reported by the server" << (why.empty() ? "" : " (" + why + ")")
        << "\n";
  }
}

void print_sweep_table(std::ostream& out, const std::vector<RunReport>& runs) {
  // The acceptance length column only when the server reported one: TPOT depends on it.
  bool spec = std::any_of(runs.begin(), runs.end(), [](const RunReport& r) {
    return r.speculative.stats && r.speculative.stats->acceptance_length;
  });
  out << "| Configuration | Throughput (tok/s) | TPOT (ms) | TTFT (ms) |" << (spec ? " Acceptance length |" : "")
      << "\n";
  out << "|---|---|---|---|" << (spec ? "---|" : "") << "\n";
  for (const auto& r : runs) {
    std::string failed = r.summary.failed ? fmt::format(" ({} failed)", r.summary.failed) : "";
    out << fmt::format("| {}{} | {:.1f} | {:.2f} | {:.2f} |", r.label, failed, r.summary.output_throughput,
                       r.summary.tpot_ms.mean, r.summary.ttft_ms.mean);
    if (spec) {
      const auto& s = r.speculative.stats;
      out << (s && s->acceptance_length ? fmt::format(" {:.2f} |", *s->acceptance_length) : " - |");
    }
    out << "\n";
  }
}

}  // namespace tern::bench
