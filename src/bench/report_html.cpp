#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "bench/report.h"
#include "bench/svg_plot.h"

namespace tern::bench {
namespace {

// The x value of a run in the "against concurrency" plots: its cap, or the measured average.
double concurrency_of(const RunReport& r) {
  return r.max_concurrency > 0 ? r.max_concurrency : std::max(r.summary.concurrency, 1e-3);
}

Series metric_series(const std::vector<RunReport>& runs, const std::string& name, double (*get)(const Summary&)) {
  Series s{name, {}, {}, true};
  for (const auto& r : runs) s.x.push_back(concurrency_of(r)), s.y.push_back(get(r.summary));
  return s;
}

std::string against_concurrency(const std::vector<RunReport>& runs) {
  PlotSpec p{"", "concurrency", "", true};
  std::string out;
  p.title = "Output throughput", p.y_label = "tokens/s";
  out += line_plot(p, {metric_series(runs, "output", [](const Summary& s) { return s.output_throughput; }),
                       metric_series(runs, "peak 1 s", [](const Summary& s) { return s.max_output_tokens_per_s; })});
  p.title = "Time to first token", p.y_label = "ms";
  out += line_plot(p, {metric_series(runs, "mean", [](const Summary& s) { return s.ttft_ms.mean; }),
                       metric_series(runs, "median", [](const Summary& s) { return s.ttft_ms.median; }),
                       metric_series(runs, "p99", [](const Summary& s) { return s.ttft_ms.p99; })});
  p.title = "Time per output token", p.y_label = "ms";
  out += line_plot(p, {metric_series(runs, "mean", [](const Summary& s) { return s.tpot_ms.mean; }),
                       metric_series(runs, "median", [](const Summary& s) { return s.tpot_ms.median; }),
                       metric_series(runs, "p99", [](const Summary& s) { return s.tpot_ms.p99; })});
  p.title = "End-to-end latency", p.y_label = "ms";
  out += line_plot(p, {metric_series(runs, "mean", [](const Summary& s) { return s.e2e_ms.mean; }),
                       metric_series(runs, "p99", [](const Summary& s) { return s.e2e_ms.p99; })});
  return out;
}

std::string distributions(const std::vector<RunReport>& runs) {
  std::vector<std::pair<std::string, std::vector<double>>> ttft, tpot, itl, e2e;
  for (const auto& r : runs) {
    std::vector<double> a, b, c, d;
    for (const auto& q : r.results) {
      if (!q.success) continue;
      a.push_back(q.ttft_s * 1e3);
      if (q.output_len > 1) b.push_back((q.latency_s - q.ttft_s) / (q.output_len - 1) * 1e3);
      for (double g : q.itl_s) c.push_back(g * 1e3);
      d.push_back(q.latency_s * 1e3);
    }
    ttft.emplace_back(r.label, a), tpot.emplace_back(r.label, b), itl.emplace_back(r.label, c);
    e2e.emplace_back(r.label, d);
  }
  PlotSpec p{"", "ms", "fraction of requests"};
  std::string out;
  p.title = "TTFT distribution (CDF)", out += cdf_plot(p, ttft);
  p.title = "TPOT distribution (CDF)", out += cdf_plot(p, tpot);
  p.title = "ITL distribution (CDF)", p.y_label = "fraction of gaps", out += cdf_plot(p, itl);
  p.title = "E2E latency distribution (CDF)", p.y_label = "fraction of requests", out += cdf_plot(p, e2e);
  return out;
}

std::string table(const std::vector<RunReport>& runs) {
  std::string out =
      "<table><tr><th>Configuration</th><th>Throughput (tok/s)</th><th>TPOT (ms)</th><th>TTFT (ms)</th>"
      "<th>ITL p99 (ms)</th><th>E2E mean (ms)</th><th>Requests ok / failed</th><th>Duration (s)</th>"
      "<th>Client overhead p99 (ms)</th></tr>";
  for (const auto& r : runs) {
    const Summary& s = r.summary;
    out += fmt::format("<tr><td>{}</td><td>{:.1f}</td><td>{:.2f}</td><td>{:.2f}</td><td>{:.2f}</td><td>{:.1f}</td>"
                       "<td>{} / {}</td><td>{:.2f}</td><td>{:.3f}</td></tr>",
                       xml_escape(r.label), s.output_throughput, s.tpot_ms.mean, s.ttft_ms.mean, s.itl_ms.p99,
                       s.e2e_ms.mean, s.completed, s.failed, s.duration_s, r.overhead.chunk_ms.p99);
  }
  return out + "</table>";
}

std::string cell(const std::optional<double>& v, const char* format) {
  return v ? "<td>" + fmt::format(fmt::runtime(format), *v) + "</td>" : "<td>&ndash;</td>";
}

// The server's acceptance figures, one row per run (a table of its own: the results table is full),
// or one line saying the server reported none.
std::string speculative_section(const std::vector<RunReport>& runs) {
  const RunReport* any = nullptr;
  std::size_t positions = 0;
  for (const auto& r : runs) {
    if (!r.speculative.stats) continue;
    if (!any) any = &r;
    positions = std::max(positions, r.speculative.stats->per_position.size());
  }
  if (!any) {
    const std::string& why = runs.empty() ? "" : runs.front().speculative.note;
    std::string reason = why.empty() ? "" : " (" + xml_escape(why) + ")";
    return "<p>Speculative decoding: not reported by the server" + reason + ".</p>";
  }
  std::string out = "<h2>Speculative decoding</h2><table><tr><th>Configuration</th><th>Acceptance rate (%)</th>"
                    "<th>Acceptance length</th><th>Drafts</th><th>Draft tokens</th><th>Accepted tokens</th>";
  for (std::size_t i = 0; i < positions; ++i) out += fmt::format("<th>Position {} (%)</th>", i);
  out += "</tr>";
  for (const auto& r : runs) {
    out += "<tr><td>" + xml_escape(r.label) + "</td>";
    if (!r.speculative.stats) {
      out += fmt::format("<td colspan='{}'>not reported ({})</td></tr>", 5 + positions,
                         xml_escape(r.speculative.note));
      continue;
    }
    const SpeculativeStats& s = *r.speculative.stats;
    auto percent = [](const std::optional<double>& v) { return v ? std::optional<double>(*v * 100) : std::nullopt; };
    out += cell(percent(s.acceptance_rate), "{:.2f}") + cell(s.acceptance_length, "{:.2f}") +
           cell(s.drafts, "{:.0f}") + cell(s.draft_tokens, "{:.0f}") + cell(s.accepted_tokens, "{:.0f}");
    for (std::size_t i = 0; i < positions; ++i)
      out += cell(i < s.per_position.size() ? std::optional<double>(s.per_position[i] * 100) : std::nullopt, "{:.1f}");
    out += "</tr>";
  }
  const SpeculativeStats& s = *any->speculative.stats;
  out += "</table>";
  out += s.run_delta ? "<p>From the server's " + xml_escape(s.source) +
                           ": counters at GET /metrics, differences over each run. Acceptance rate: accepted / "
                           "draft tokens; length: 1 + accepted / drafts; position i: accepted at i / drafts.</p>"
                     : "<p>SGLang's gauges at GET /metrics after each run (its recent window, not the run's "
                       "totals).</p>";
  return out;
}

std::string failures(const std::vector<RunReport>& runs) {
  std::string out;
  for (const auto& r : runs)
    for (const auto& [reason, count] : r.summary.failures)
      out += fmt::format("<li>{}: {} &times; <b>{}</b> &mdash; e.g. <code>{}</code></li>", xml_escape(r.label), count,
                         xml_escape(reason), xml_escape(r.summary.failure_example.at(reason).substr(0, 300)));
  return out.empty() ? "" : "<h2>Failures</h2><ul>" + out + "</ul>";
}

constexpr const char* kStyle =
    "body{font-family:sans-serif;margin:24px;color:#222;max-width:1200px}"
    "table{border-collapse:collapse;margin:12px 0}td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}"
    "th{background:#f3f3f3}td:first-child{text-align:left}.plots svg{margin:6px;border:1px solid #eee}"
    "dl{display:grid;grid-template-columns:max-content auto;gap:2px 16px}dt{font-weight:bold}";

}  // namespace

std::string html_report(const RunContext& ctx, const std::vector<RunReport>& runs) {
  std::string rate = std::isinf(ctx.request_rate) ? "inf" : fmt::format("{:g}", ctx.request_rate);
  std::string out = fmt::format("<!DOCTYPE html><html><head><meta charset='utf-8'><title>tern bench report</title>"
                                "<style>{}</style></head><body><h1>tern bench report</h1><dl>",
                                kStyle);
  out += fmt::format("<dt>Server</dt><dd>{} ({})</dd><dt>Model</dt><dd>{}</dd>", xml_escape(ctx.base_url),
                     xml_escape(ctx.backend), xml_escape(ctx.model));
  out += fmt::format("<dt>Workload</dt><dd>{}</dd><dt>Prompts built with</dt><dd>{}</dd>", xml_escape(ctx.workload),
                     xml_escape(ctx.tokenizer));
  out += fmt::format("<dt>Requests</dt><dd>{} per run, request rate {}, burstiness {:g}, seed {}</dd></dl>",
                     ctx.num_prompts, rate, ctx.burstiness, ctx.seed);
  out += "<h2>Results</h2>" + table(runs) + failures(runs) + speculative_section(runs);
  out += "<h2>Against concurrency</h2><div class='plots'>" + against_concurrency(runs) + "</div>";
  out += "<h2>Latency distributions</h2><div class='plots'>" + distributions(runs) + "</div>";
  out += "<p>TTFT: first content chunk minus send time. TPOT: (latency &minus; TTFT) / (output tokens &minus; 1). "
         "ITL: gaps between content chunks. Output tokens from the server's usage. Percentiles interpolate "
         "linearly (numpy's default).</p></body></html>\n";
  return out;
}

}  // namespace tern::bench
