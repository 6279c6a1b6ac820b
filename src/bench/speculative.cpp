#include "bench/speculative.h"

#include <charconv>

#include "bench/http_get.h"
#include "core/error.h"

namespace tern::bench {
namespace {

// Namespaces whose servers export vLLM's counter family, looked for in this order.
constexpr const char* kCounterSources[] = {"tern", "vllm", "llamacpp"};

std::optional<int> position_of(const std::string& label) {
  int pos = 0;
  auto [end, ec] = std::from_chars(label.data(), label.data() + label.size(), pos);
  if (ec != std::errc() || end != label.data() + label.size() || pos < 0) return std::nullopt;
  return pos;
}

// SGLang exports no counters, only gauges over its recent window; 0 means it does not speculate.
SpeculativeOutcome from_sglang_gauges(const PromText& after) {
  std::optional<double> length = after.mean("sglang:spec_accept_length");
  if (!length) return {std::nullopt, ""};
  if (*length <= 0)
    return {std::nullopt, "the server's sglang:spec_accept_length gauge is 0 (no speculative decoding)"};
  SpeculativeStats s;
  s.source = "sglang", s.run_delta = false;
  s.acceptance_length = length;
  s.acceptance_rate = after.mean("sglang:spec_accept_rate");
  return {s, "SGLang's gauges after the run: its recent window, not this run's totals"};
}

}  // namespace

MetricsScrape scrape_metrics(const Target& target, double timeout_s) {
  MetricsScrape scrape;
  HttpGetResult res = http_get(target, "/metrics", "text/plain", timeout_s);
  if (!res.ok()) {
    scrape.error = res.error;
  } else if (res.status != 200) {
    scrape.error = cat("answered HTTP ", res.status);
  } else {
    scrape.ok = true;
    scrape.text = parse_prometheus_text(res.body);
  }
  return scrape;
}

std::optional<SpecCounters> read_spec_counters(const PromText& text, const std::string& source) {
  std::string prefix = source + ":spec_decode_num_";
  std::optional<double> drafts = text.sum(prefix + "drafts_total");
  if (!drafts) return std::nullopt;
  SpecCounters c;
  c.source = source;
  c.drafts = *drafts;
  c.draft_tokens = text.sum(prefix + "draft_tokens_total").value_or(0);
  c.accepted_tokens = text.sum(prefix + "accepted_tokens_total").value_or(0);
  for (const auto& [label, value] : text.sum_by(prefix + "accepted_tokens_per_pos_total", "position"))
    if (auto pos = position_of(label)) c.accepted_per_position[*pos] += value;
  return c;
}

SpeculativeStats stats_from_deltas(const SpecCounters& before, const SpecCounters& after) {
  SpeculativeStats s;
  s.source = after.source;
  double drafts = after.drafts - before.drafts;
  double draft_tokens = after.draft_tokens - before.draft_tokens;
  double accepted = after.accepted_tokens - before.accepted_tokens;
  s.drafts = drafts, s.draft_tokens = draft_tokens, s.accepted_tokens = accepted;
  if (drafts <= 0) return s;
  if (draft_tokens > 0) s.acceptance_rate = accepted / draft_tokens;
  s.acceptance_length = 1 + accepted / drafts;  // vLLM's definition: the verify round's own token counts
  int positions = after.accepted_per_position.empty() ? 0 : after.accepted_per_position.rbegin()->first + 1;
  for (int i = 0; i < positions; ++i) {
    auto a = after.accepted_per_position.find(i);
    auto b = before.accepted_per_position.find(i);
    double delta = (a == after.accepted_per_position.end() ? 0 : a->second) -
                   (b == before.accepted_per_position.end() ? 0 : b->second);
    s.per_position.push_back(delta / drafts);
  }
  return s;
}

SpeculativeOutcome speculative_outcome(const MetricsScrape& before, const MetricsScrape& after) {
  if (!before.ok) return {std::nullopt, "GET /metrics before the run: " + before.error};
  if (!after.ok) return {std::nullopt, "GET /metrics after the run: " + after.error};
  for (const char* source : kCounterSources) {
    std::optional<SpecCounters> end = read_spec_counters(after.text, source);
    if (!end) continue;
    // A counter that appears only once there is something to count started at 0.
    SpecCounters start = read_spec_counters(before.text, source).value_or(SpecCounters{source, 0, 0, 0, {}});
    if (end->drafts < start.drafts || end->draft_tokens < start.draft_tokens ||
        end->accepted_tokens < start.accepted_tokens)
      return {std::nullopt, cat(source, ": counters went down during the run (the server restarted?)")};
    SpeculativeStats stats = stats_from_deltas(start, *end);
    std::string note =
        *stats.drafts > 0 ? "" : cat("the server's ", source, ": counters show no drafts in this run");
    return {stats, note};
  }
  SpeculativeOutcome sglang = from_sglang_gauges(after.text);
  if (sglang.stats || !sglang.note.empty()) return sglang;
  return {std::nullopt,
          "GET /metrics has no spec_decode_num_drafts_total counter (tern:, vllm:, llamacpp:) nor "
          "sglang:spec_accept_length gauge"};
}

}  // namespace tern::bench
