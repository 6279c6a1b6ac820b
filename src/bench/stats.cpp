#include "bench/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "core/error.h"

namespace tern::bench {

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  auto lo = static_cast<std::size_t>(std::floor(rank));
  auto hi = static_cast<std::size_t>(std::ceil(rank));
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - static_cast<double>(lo));
}

Distribution distribution(std::vector<double> v) {
  Distribution d;
  d.count = v.size();
  if (v.empty()) return d;  // the reference tools report 0 for an empty list
  std::sort(v.begin(), v.end());
  double n = static_cast<double>(v.size());
  d.mean = std::accumulate(v.begin(), v.end(), 0.0) / n;
  double sq = 0;
  for (double x : v) sq += (x - d.mean) * (x - d.mean);
  d.std = std::sqrt(sq / n);
  d.median = percentile(v, 50);
  d.p90 = percentile(v, 90);
  d.p95 = percentile(v, 95);
  d.p99 = percentile(v, 99);
  d.max = v.back();
  return d;
}

Slo parse_slo(const std::string& text) {
  Slo slo;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    auto colon = item.find(':');
    TERN_CHECK(colon != std::string::npos, "tern bench: --slo item '", item, "' is not NAME:MS");
    std::string name = item.substr(0, colon);
    double ms = 0;
    try {
      ms = std::stod(item.substr(colon + 1));
    } catch (const std::exception&) {
      fail("tern bench: --slo ", name, ": '", item.substr(colon + 1), "' is not a number of milliseconds");
    }
    TERN_CHECK(ms > 0, "tern bench: --slo ", name, " must be positive");
    if (name == "ttft") slo.ttft_ms = ms;
    else if (name == "tpot") slo.tpot_ms = ms;
    else if (name == "e2el") slo.e2el_ms = ms;
    else fail("tern bench: --slo knows ttft, tpot and e2el, not '", name, "'");
  }
  return slo;
}

double run_duration(const std::vector<RequestResult>& results) {
  if (results.empty()) return 0;
  double first = results.front().start_s, last = 0;
  for (const auto& r : results) {
    first = std::min(first, r.start_s);
    last = std::max(last, r.start_s + r.latency_s);
  }
  return last - first;
}

namespace {

double tpot_s(const RequestResult& r) { return (r.latency_s - r.ttft_s) / (r.output_len - 1); }

bool meets(const RequestResult& r, const Slo& slo) {
  if (slo.ttft_ms && r.ttft_s * 1e3 > *slo.ttft_ms) return false;
  if (slo.tpot_ms && r.output_len > 1 && tpot_s(r) * 1e3 > *slo.tpot_ms) return false;
  if (slo.e2el_ms && r.latency_s * 1e3 > *slo.e2el_ms) return false;
  return true;
}

// Peak output tokens/s and peak concurrency over whole-second buckets from the first send, the way
// sglang counts them (one token per content chunk).
void peaks(const std::vector<RequestResult>& results, Summary& s) {
  double t0 = 1e300, t1 = 0;
  for (const auto& r : results)
    if (r.success) t0 = std::min(t0, r.start_s), t1 = std::max(t1, r.start_s + r.latency_s);
  if (t0 > 1e299) return;  // no request succeeded
  auto buckets = static_cast<std::size_t>(std::ceil(t1 - t0)) + 1;
  std::vector<double> tokens(buckets, 0), running(buckets, 0);
  for (const auto& r : results) {
    if (!r.success) continue;
    double t = r.start_s + r.ttft_s;
    auto add = [&](double when) {
      auto b = static_cast<std::size_t>(when - t0);
      if (b < buckets) tokens[b] += 1;
    };
    add(t);
    for (double gap : r.itl_s) add(t += gap);
    auto first = static_cast<std::size_t>(r.start_s - t0);
    auto last = std::min(static_cast<std::size_t>(r.start_s + r.latency_s - t0) + 1, buckets);
    for (std::size_t b = first; b < last; ++b) running[b] += 1;
  }
  s.max_output_tokens_per_s = *std::max_element(tokens.begin(), tokens.end());
  s.max_concurrent_requests = static_cast<int>(*std::max_element(running.begin(), running.end()));
}

}  // namespace

Summary summarize(const std::vector<RequestResult>& results, const Slo& slo) {
  Summary s;
  s.duration_s = run_duration(results);
  std::vector<double> ttft, tpot, itl, e2e;
  int good = 0;
  for (const auto& r : results) {
    if (!r.success) {
      ++s.failed;
      if (s.failures[r.reason]++ == 0) s.failure_example[r.reason] = r.error;
      continue;
    }
    ++s.completed;
    s.total_input += r.input_len;
    s.total_output += r.output_len;
    s.usage_missing |= !r.usage_reported;
    ttft.push_back(r.ttft_s * 1e3);
    if (r.output_len > 1) tpot.push_back(tpot_s(r) * 1e3);
    for (double g : r.itl_s) itl.push_back(g * 1e3);
    e2e.push_back(r.latency_s * 1e3);
    good += meets(r, slo) ? 1 : 0;
  }
  double dur = s.duration_s > 0 ? s.duration_s : 1.0;
  s.request_throughput = s.completed / dur;
  s.input_throughput = static_cast<double>(s.total_input) / dur;
  s.output_throughput = static_cast<double>(s.total_output) / dur;
  s.total_throughput = static_cast<double>(s.total_input + s.total_output) / dur;
  s.concurrency = std::accumulate(e2e.begin(), e2e.end(), 0.0) / 1e3 / dur;
  s.ttft_ms = distribution(std::move(ttft));
  s.tpot_ms = distribution(std::move(tpot));
  s.itl_ms = distribution(std::move(itl));
  s.e2e_ms = distribution(std::move(e2e));
  if (slo.any()) s.goodput = good / dur;
  peaks(results, s);
  return s;
}

}  // namespace tern::bench
