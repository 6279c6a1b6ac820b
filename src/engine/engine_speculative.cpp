// Speculative decoding in the engine (issue #18, docs/mtp.md): which sequences draft in a step, their drafts from
// each request's own sampling, and the verdict of a verify step (engine/speculative.h) with its tokens, logprobs
// and counters. The runner drafts, verifies and rolls back (ModelRunner::draft / forward / settle).
#include <algorithm>
#include <random>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/engine_sequence.h"
#include "engine/speculative.h"

namespace tern::engine {

namespace {

// The params of a choice that needs no logprobs (a draft, a greedy row of the verdict).
SamplingParams without_logprobs(SamplingParams p) {
  p.top_logprobs = -1;
  return p;
}

}  // namespace

bool Engine::speculate_now() const {
  if (speculative_tokens_ == 0) return false;
  if (options_.speculative_max_batch <= 0) return true;
  int64_t n = 0;
  for (uint64_t id : running_) n += seqs_.at(id)->decoding() ? 1 : 0;
  return n <= options_.speculative_max_batch;
}

int64_t Engine::lookahead(const Sequence& s, bool speculate) const {
  if (!speculate || s.request.handover || !s.decoding()) return 0;
  // A verify step emits up to drafts + 1 tokens: within max_tokens and the context.
  const int64_t by_length = s.request.stop.max_tokens - s.generated - 1;
  const int64_t by_context = max_context_ - static_cast<int64_t>(s.tokens.size()) - 1;
  return std::clamp<int64_t>(std::min(by_length, by_context), 0, speculative_tokens_);
}

std::string Engine::speculative_plan() const {
  if (speculative_tokens_ == 0) return "";
  const int64_t per = runner_->speculative_bytes_per_sequence(), n = runner_->speculative_sequences();
  return cat("; speculative decoding: ", speculative_tokens_, " drafts a round, rollback memory ", per >> 10,
             " KiB a sequence reserved up front for ", n, " sequences (", (per * n) >> 20, " MiB), state pages for ",
             speculative_tokens_, " more positions a decoding sequence; drafting ",
             options_.speculative_max_batch > 0 ? cat("while at most ", options_.speculative_max_batch,
                                                      " sequences decode")
                                                : std::string("at every batch size"),
             options_.oracle_accept >= 0
                 ? cat("; ORACLE acceptance ", options_.oracle_accept, " (benchmarks only: the output is not the model's)")
                 : std::string());
}

void Engine::draft(const BatchPlan& plan) {
  drafts_.clear();
  draft_dists_.clear();
  std::vector<DraftRequest> requests;
  std::vector<Sequence*> seqs;
  for (const auto& c : plan.chunks) {
    if (c.drafts == 0) continue;
    Sequence& s = *seqs_.at(c.id);
    const SamplingParams& p = s.request.sampling;
    requests.push_back({c.id, &pool_.state(c.id), s.tokens.back(), static_cast<int32_t>(c.drafts),
                        p.greedy() && !p.penalised()});
    seqs.push_back(&s);
  }
  if (requests.empty()) return;
  std::unique_ptr<Sampler> sampler = take_sampler();
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  // Each draft from the request's own sampling of the draft model's row: q_j is what the verdict divides by.
  std::vector<std::vector<int32_t>> drafted = runner_->draft(requests, [&](size_t i, int j, std::span<const float> logits) -> int32_t {
    Sequence& s = *seqs[i];
    const SamplingParams& p = s.request.sampling;
    int32_t token = 0;
    if (p.greedy()) {
      token = sampler->sample_drawn(logits, without_logprobs(p), s.history, {}).token;
    } else {
      std::vector<float>& q = draft_dists_[s.id];
      q.resize(static_cast<size_t>((j + 1) * vocab_));
      const std::span<float> row(q.data() + j * vocab_, static_cast<size_t>(vocab_));
      sampler->distribution(logits, p, s.history, row);
      token = draw_from(row, uniform(s.rng));
    }
    return token;
  });
  give_sampler(std::move(sampler));
  TERN_CHECK(drafted.size() == requests.size(), "engine: the runner drafted for ", drafted.size(), " of ",
             requests.size(), " sequences");
  for (size_t i = 0; i < requests.size(); ++i) drafts_[requests[i].seq] = std::move(drafted[i]);
}

int32_t Engine::verdict(Sequence& s, const PlannedChunk& c, const float* logits, Sampler& sampler,
                        std::vector<SampleResult>& out) {
  const auto k = static_cast<int64_t>(c.drafts);
  const std::vector<int32_t>& d = drafts_.at(s.id);
  TERN_CHECK(static_cast<int64_t>(d.size()) == k, "engine: sequence ", s.id, " has ", d.size(), " drafts, the plan ", k);
  const SamplingParams& p = s.request.sampling;
  // The target's row j sees the request's history plus d_1 .. d_j (penalties read it).
  const bool pen = p.penalised();
  TokenHistory extended = pen ? s.history : TokenHistory{};
  const TokenHistory& history = pen ? extended : s.history;
  const auto row = [&](int64_t j) { return std::span<const float>(logits + j * vocab_, static_cast<size_t>(vocab_)); };
  int64_t a = 0;
  int32_t next = 0;
  if (options_.oracle_accept >= 0) {  // benchmarks only: acceptance by fiat
    a = oracle_accepts(s, k);
    for (int64_t j = 0; pen && j < a; ++j) extended.add_output(d[static_cast<size_t>(j)], vocab_);
    next = sampler.sample(row(a), without_logprobs(p), history, s.rng).token;
  } else if (p.greedy()) {  // the drafts the target's own choices agree with (accept_greedy, row by row)
    for (;; ++a) {
      const int32_t g = sampler.sample_drawn(row(a), without_logprobs(p), history, {}).token;
      if (a == k || g != d[static_cast<size_t>(a)]) {
        next = g;
        break;
      }
      if (pen) extended.add_output(g, vocab_);
    }
  } else {  // rejection sampling against the drafts' distributions: the target's distribution exactly
    std::vector<float> target(static_cast<size_t>((k + 1) * vocab_));
    for (int64_t j = 0; j <= k; ++j) {
      sampler.distribution(row(j), p, history, std::span<float>(target.data() + j * vocab_, static_cast<size_t>(vocab_)));
      if (pen && j < k) extended.add_output(d[static_cast<size_t>(j)], vocab_);
    }
    const SpecVerdict v = accept_sampled(target, draft_dists_.at(s.id), vocab_, d, s.rng);
    a = v.accepted;
    next = v.next;
  }
  for (int64_t j = 0; j < a; ++j) out.push_back(sampler.describe(row(j), d[static_cast<size_t>(j)], p));
  out.push_back(sampler.describe(row(a), next, p));
  count_verdict(k, a);
  return static_cast<int32_t>(a + 1);
}

int64_t Engine::oracle_accepts(Sequence& s, int64_t drafts) const {
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  int64_t a = 0;
  while (a < drafts && uniform(s.rng) < options_.oracle_accept) ++a;
  return a;
}

void Engine::count_verdict(int64_t drafts, int64_t accepted) {
  std::lock_guard lock(metrics_mutex_);
  ++metrics_.spec_drafts_total;
  metrics_.spec_draft_tokens_total += static_cast<uint64_t>(drafts);
  metrics_.spec_accepted_tokens_total += static_cast<uint64_t>(accepted);
  for (int64_t j = 0; j < accepted; ++j) ++metrics_.spec_accepted_per_position[static_cast<size_t>(j)];
}

bool Engine::verdict_on_device(const Sequence& s) const {
  // Greedy: the kept drafts are the rows' own choices, the next token the first row's that differs, and the logprobs
  // of each emitted token are its row's (a kept draft is its row's choice). The oracle keeps drafts by fiat, which
  // need not be the rows' choices: on the device only without logprobs.
  const SamplingParams& p = s.request.sampling;
  return p.greedy() && (options_.oracle_accept < 0 || p.top_logprobs < 0);
}

void Engine::verify_requests(Sequence& s, const PlannedChunk& c, std::span<SampleRequest> rows) {
  const std::vector<int32_t>& d = drafts_.at(s.id);
  TERN_CHECK(rows.size() == d.size() + 1 && static_cast<int64_t>(d.size()) == c.drafts, "engine: sequence ", s.id,
             " has ", d.size(), " drafts, the plan ", c.drafts);
  const SamplingParams& p = s.request.sampling;
  // Row j sees the request's history plus d_1 .. d_j (what the host verdict's row j sees whenever it is read: only
  // while every earlier draft was the row's own choice). Greedy rows draw no uniforms.
  const TokenHistory* history = &s.history;
  for (size_t j = 0; j < rows.size(); ++j) {
    if (j > 0 && p.penalised()) {
      verify_histories_.push_back(*history);
      verify_histories_.back().add_output(d[j - 1], vocab_);
      history = &verify_histories_.back();
    }
    rows[j] = {&p, history, {}};
  }
}

int32_t Engine::verdict_of_rows(Sequence& s, const PlannedChunk& c, std::span<SampleResult> rows,
                                std::vector<SampleResult>& out) {
  const auto k = static_cast<int64_t>(c.drafts);
  const std::vector<int32_t>& d = drafts_.at(s.id);
  TERN_CHECK(static_cast<int64_t>(rows.size()) == k + 1 && static_cast<int64_t>(d.size()) == k, "engine: sequence ",
             s.id, " brings ", rows.size(), " sampled rows for ", d.size(), " drafts");
  int64_t a = 0;
  if (options_.oracle_accept >= 0) {  // benchmarks only: acceptance by fiat (no logprobs: verdict_on_device)
    a = oracle_accepts(s, k);
    for (int64_t j = 0; j < a; ++j) out.push_back(SampleResult{d[static_cast<size_t>(j)], 0.0f, {}});
  } else {  // the drafts the target's own choices agree with (accept_greedy)
    while (a < k && rows[static_cast<size_t>(a)].token == d[static_cast<size_t>(a)]) ++a;
    for (int64_t j = 0; j < a; ++j) out.push_back(std::move(rows[static_cast<size_t>(j)]));
  }
  out.push_back(std::move(rows[static_cast<size_t>(a)]));
  count_verdict(k, a);
  return static_cast<int32_t>(a + 1);
}

}  // namespace tern::engine
