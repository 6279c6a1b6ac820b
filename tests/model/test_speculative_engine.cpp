// MTP speculative decoding through the serving engine (issue #18), on the CPU with the real V4 runner over the
// fixture checkpoints: greedy output with MTP equals output without it, token for token (and text, finish reason
// and logprobs), at k = 1, 2, 3, alone and in a batch of 64 mixed requests (prompt lengths, penalties, stop strings,
// logprobs); seeded sampling repeats; the counters add up; a full batch keeps every sequence running; and the
// emitted tokens of sampled requests follow the target's distribution (a chi-square over many seeds).
//
// The fixture's MTP layer has random weights, so its drafts are almost never accepted. To exercise acceptance and
// the rollback of partial acceptance, DraftBias wraps the runner and, with a set probability, raises the logit of
// the token plain greedy decoding produced there in the draft model's row before the engine chooses from it. Only
// the drafts change: the verify step, the verdict and the rollback are the real ones.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/v4_runner.h"

#include "fixture.h"

namespace tern::test {
namespace {

using engine::Engine;
using engine::EngineOptions;
using engine::FinishReason;
using engine::GenerationRequest;
using engine::RequestUpdate;

class DraftBias : public engine::ModelRunner {
 public:
  // outputs[i]: the plain greedy output of the i-th submitted request (sequence id i + 1 in a fresh engine);
  // each draft is pushed to it with probability `p` (by `boost` on its logit).
  DraftBias(std::shared_ptr<engine::ModelRunner> inner, std::vector<std::vector<int32_t>> outputs,
            std::vector<int64_t> prompt_lens, double p, float boost = 1e4f)
      : inner_(std::move(inner)), outputs_(std::move(outputs)), prompt_lens_(std::move(prompt_lens)), p_(p),
        boost_(boost) {}
  std::string name() const override { return inner_->name(); }
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  int64_t max_context() const override { return inner_->max_context(); }
  std::shared_ptr<const cache::StateLayout> state_layout(int64_t t) const override { return inner_->state_layout(t); }
  Device state_device() const override { return inner_->state_device(); }
  int64_t weight_bytes() const override { return inner_->weight_bytes(); }
  std::vector<std::string> kernel_paths() const override { return inner_->kernel_paths(); }
  void forward(const engine::StepBatch& batch, std::span<float> logits) override { inner_->forward(batch, logits); }
  int speculative_tokens() const override { return inner_->speculative_tokens(); }
  int speculative_sequences() const override { return inner_->speculative_sequences(); }
  int64_t speculative_bytes_per_sequence() const override { return inner_->speculative_bytes_per_sequence(); }
  void settle(std::span<const int32_t> kept) override { inner_->settle(kept); }
  void draft(std::span<const engine::DraftRequest> requests, const engine::DraftChooser& choose) override {
    inner_->draft(requests, [&](size_t i, int j, std::span<const float> logits) {
      const auto r = static_cast<size_t>(requests[i].seq - 1);
      if (r >= outputs_.size()) return choose(i, j, logits);
      // d_{j+1} stands for the token at position m + 1 + j: output index m + 1 + j - prompt length.
      const int64_t at = requests[i].state->position() + 1 + j - prompt_lens_.at(r);
      row_.assign(logits.begin(), logits.end());
      if (at < static_cast<int64_t>(outputs_[r].size()) && coin_(rng_) < p_)
        row_[static_cast<size_t>(outputs_[r][static_cast<size_t>(at)])] += boost_;
      return choose(i, j, row_);
    });
  }

 private:
  std::shared_ptr<engine::ModelRunner> inner_;
  std::vector<std::vector<int32_t>> outputs_;
  std::vector<int64_t> prompt_lens_;
  double p_;
  float boost_;
  std::mt19937_64 rng_{7};
  std::uniform_real_distribution<double> coin_{0.0, 1.0};
  std::vector<float> row_;
};

struct Output {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<engine::TokenLogprob>> top;
  std::string text;
  FinishReason finish = FinishReason::none;
  int64_t completion_tokens = 0;
};

std::string token_text(int32_t t) { return "<" + std::to_string(t) + ">"; }

EngineOptions engine_options(int max_running = 64) {
  EngineOptions o;
  o.state_memory_bytes = int64_t{256} << 20;
  o.limits.max_running = max_running;
  o.limits.token_budget = 512;
  o.limits.max_chunk = 32;  // prompts arrive in several chunks, mixed with decode and verify steps
  o.token_bytes = token_text;
  return o;
}

std::shared_ptr<engine::V4Runner> make_runner(std::shared_ptr<model::Model> m, int k, int max_sequences = 64) {
  auto r = std::make_shared<engine::V4Runner>(m, "fixture", 0, 256);
  if (k > 0) r->enable_speculative(k, max_sequences);
  return r;
}

std::vector<Output> run(std::shared_ptr<engine::ModelRunner> runner, const std::vector<GenerationRequest>& requests,
                        EngineOptions o = engine_options(), engine::EngineMetrics* metrics = nullptr) {
  Engine e(std::move(runner), std::move(o));
  std::vector<Output> out(requests.size());
  for (size_t i = 0; i < requests.size(); ++i)
    e.submit(requests[i], [&out, i](RequestUpdate&& u) {
      for (const auto& t : u.tokens) {
        out[i].tokens.push_back(t.token);
        out[i].logprobs.push_back(t.logprob);
        out[i].top.push_back(t.top);
      }
      out[i].text += u.text;
      out[i].completion_tokens = u.completion_tokens;
      if (u.finish != FinishReason::none) out[i].finish = u.finish;
    });
  while (!e.idle()) e.step();
  if (metrics) *metrics = e.metrics();
  return out;
}

// 64 greedy requests of mixed prompt lengths; every fourth with penalties, every fifth with logprobs; stop strings
// are added by the caller from the plain output.
std::vector<GenerationRequest> mixed_requests(int n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<GenerationRequest> out;
  for (int i = 0; i < n; ++i) {
    GenerationRequest r;
    const int len = 1 + static_cast<int>(rng() % 70);
    for (int t = 0; t < len; ++t) r.prompt.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)));
    r.sampling.temperature = 0;
    if (i % 4 == 1) r.sampling.repetition_penalty = 1.3f, r.sampling.presence_penalty = 0.5f;
    if (i % 5 == 2) r.sampling.top_logprobs = 3;
    r.stop.max_tokens = 6 + i % 9;
    r.stop.ignore_eos = true;
    out.push_back(std::move(r));
  }
  return out;
}

void expect_same(const std::vector<Output>& got, const std::vector<Output>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << what << ", request " << i;
    EXPECT_EQ(got[i].text, want[i].text) << what << ", request " << i;
    EXPECT_EQ(got[i].finish, want[i].finish) << what << ", request " << i;
    EXPECT_EQ(got[i].completion_tokens, want[i].completion_tokens) << what << ", request " << i;
    if (got[i].tokens != want[i].tokens) continue;
    for (size_t t = 0; t < got[i].logprobs.size(); ++t) {
      EXPECT_NEAR(got[i].logprobs[t], want[i].logprobs[t], 1e-4) << what << ", request " << i << " token " << t;
      ASSERT_EQ(got[i].top[t].size(), want[i].top[t].size());
      for (size_t a = 0; a < got[i].top[t].size(); ++a) EXPECT_EQ(got[i].top[t][a].token, want[i].top[t][a].token);
    }
  }
}

class SpeculativeEngine : public ::testing::TestWithParam<std::string> {
 protected:
  std::shared_ptr<model::Model> model() {
    const Fixture& f = Fixture::get(GetParam());
    auto m = std::make_shared<model::Model>(f.weights(), model::KvMode::exact);
    EXPECT_TRUE(m->has_mtp());
    return m;
  }
};

TEST_P(SpeculativeEngine, GreedyOutputEqualsPlainDecoding) {
  auto m = model();
  const int64_t vocab = m->config().vocab_size;
  const int n = sanitized_build() ? 12 : 64;
  std::vector<GenerationRequest> requests = mixed_requests(n, vocab, 11);
  // Stop strings from the plain output: every third request stops at the text of its fourth token.
  std::vector<Output> want = run(make_runner(m, 0), requests);
  for (int i = 0; i < n; i += 3)
    if (want[static_cast<size_t>(i)].tokens.size() > 4)
      requests[static_cast<size_t>(i)].stop.stop = {token_text(want[static_cast<size_t>(i)].tokens[3])};
  want = run(make_runner(m, 0), requests);
  std::vector<std::vector<int32_t>> outputs;
  std::vector<int64_t> lens;
  for (size_t i = 0; i < requests.size(); ++i) {
    outputs.push_back(want[i].tokens);
    lens.push_back(static_cast<int64_t>(requests[i].prompt.size()));
  }
  uint64_t drafts = 0, accepted = 0;
  for (int k = 1; k <= 3; ++k)
    for (double p : {0.0, 0.7, 1.0}) {  // the MTP layer's own drafts; pushed to the right token 70% / always
      auto runner = make_runner(m, k);
      std::shared_ptr<engine::ModelRunner> r = runner;
      if (p > 0) r = std::make_shared<DraftBias>(runner, outputs, lens, p);
      engine::EngineMetrics metrics;
      const std::vector<Output> got = run(r, requests, engine_options(), &metrics);
      const std::string what = "k " + std::to_string(k) + ", drafts right with p " + std::to_string(p);
      expect_same(got, want, what);
      EXPECT_GT(metrics.spec_drafts_total, 0u) << what;
      EXPECT_LE(metrics.spec_accepted_tokens_total, metrics.spec_draft_tokens_total) << what;
      uint64_t by_position = 0;
      for (size_t j = 0; j < metrics.spec_accepted_per_position.size(); ++j) {
        by_position += metrics.spec_accepted_per_position[j];
        if (j > 0) EXPECT_LE(metrics.spec_accepted_per_position[j], metrics.spec_accepted_per_position[j - 1]);
      }
      EXPECT_EQ(by_position, metrics.spec_accepted_tokens_total) << what;
      if (p == 1.0) EXPECT_GT(metrics.spec_accepted_tokens_total * 10, metrics.spec_draft_tokens_total * 8) << what;
      if (p == 0.7) drafts += metrics.spec_draft_tokens_total, accepted += metrics.spec_accepted_tokens_total;
    }
  // Partial acceptance happened (so did rollback of the rest): neither none nor all kept.
  EXPECT_GT(accepted, drafts / 5);
  EXPECT_LT(accepted, drafts);
  std::printf("[%s] 64 requests, drafts right 70%% of the time: %llu of %llu drafts kept over k = 1, 2, 3\n",
              GetParam().c_str(), static_cast<unsigned long long>(accepted), static_cast<unsigned long long>(drafts));
}

TEST_P(SpeculativeEngine, AloneEqualsPlainDecoding) {
  auto m = model();
  std::vector<GenerationRequest> requests = mixed_requests(1, m->config().vocab_size, 12);
  requests[0].stop.max_tokens = 30;
  const std::vector<Output> want = run(make_runner(m, 0), requests);
  for (int k = 1; k <= 3; ++k) {
    auto runner = std::make_shared<DraftBias>(make_runner(m, k), std::vector<std::vector<int32_t>>{want[0].tokens},
                                              std::vector<int64_t>{static_cast<int64_t>(requests[0].prompt.size())}, 0.6);
    expect_same(run(runner, requests), want, "alone, k " + std::to_string(k));
  }
}

TEST_P(SpeculativeEngine, SeededSamplingRepeats) {
  auto m = model();
  std::vector<GenerationRequest> requests = mixed_requests(8, m->config().vocab_size, 13);
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].sampling.temperature = 0.9f;
    requests[i].sampling.top_p = 0.95f;
    requests[i].sampling.seed = 40 + i;
    requests[i].stop.max_tokens = 12;
  }
  engine::EngineMetrics metrics;
  const std::vector<Output> a = run(make_runner(m, 3), requests, engine_options(), &metrics);
  const std::vector<Output> b = run(make_runner(m, 3), requests);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << "request " << i;
    EXPECT_EQ(static_cast<int64_t>(a[i].tokens.size()), requests[i].stop.max_tokens);
  }
  EXPECT_GT(metrics.spec_drafts_total, 0u);
}

// Sixteen sequences with MTP on fit a state memory sized for sixteen: all run at once, none is preempted, and the
// memory plan says what speculation costs.
TEST_P(SpeculativeEngine, FullBatchKeepsRunning) {
  auto m = model();
  std::vector<GenerationRequest> requests = mixed_requests(16, m->config().vocab_size, 14);
  EngineOptions o = engine_options(16);
  auto runner = make_runner(m, 3, 16);
  const auto layout = runner->state_layout(0);
  int64_t pages = 0;
  for (const auto& r : requests) pages += layout->pages_for(static_cast<int64_t>(r.prompt.size()) + r.stop.max_tokens);
  o.state_memory_bytes = (pages + 2) * layout->page_bytes();  // room for the 16, the admission reserve's 2 pages
  o.limits.token_budget = 16 * 80;
  o.limits.max_chunk = 80;  // every prompt in one chunk
  Engine e(runner, o);
  EXPECT_NE(e.memory_plan().find("speculative decoding: 3 drafts a round"), std::string::npos) << e.memory_plan();
  int finished = 0;
  for (const auto& r : requests)
    e.submit(r, [&](RequestUpdate&& u) { finished += u.finish != FinishReason::none; });
  e.step();
  EXPECT_EQ(e.metrics().num_running, 16);
  while (!e.idle()) e.step();
  EXPECT_EQ(finished, 16);
  EXPECT_EQ(e.metrics().preemptions_total, 0u);
  EXPECT_GT(e.metrics().spec_drafts_total, 0u);
}

// The oracle (benchmarks only) keeps every draft at acceptance 1: k + 1 tokens a round.
TEST_P(SpeculativeEngine, OracleAcceptanceKeepsEveryDraft) {
  auto m = model();
  std::vector<GenerationRequest> requests = mixed_requests(4, m->config().vocab_size, 15);
  EngineOptions o = engine_options();
  o.oracle_accept = 1.0;
  engine::EngineMetrics metrics;
  const std::vector<Output> got = run(make_runner(m, 3), requests, o, &metrics);
  EXPECT_EQ(metrics.spec_accepted_tokens_total, metrics.spec_draft_tokens_total);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(static_cast<int64_t>(got[i].tokens.size()), requests[i].stop.max_tokens);
  EngineOptions bad = engine_options();
  bad.oracle_accept = 0.5;
  EXPECT_THROW(Engine(make_runner(m, 0), bad), Error);  // an oracle without speculation is refused
}

// Draft rows that resemble the target's but differ from it: for the draft after the first output token a, the target's
// own row at that position (precomputed) tilted (+1 on its least likely candidate, -1 on its most likely), so that the
// verdict both keeps and rejects drafts. Other drafts pass through.
class TiltedDrafts : public DraftBias {
 public:
  // rows[a]: the target's logits after a; tilt[a]: {least, most likely candidate} there.
  TiltedDrafts(std::shared_ptr<engine::ModelRunner> inner, std::map<int32_t, std::vector<float>> rows,
               std::map<int32_t, std::pair<int32_t, int32_t>> tilt)
      : DraftBias(std::move(inner), {}, {}, 0.0), rows_(std::move(rows)), tilt_(std::move(tilt)) {}
  void draft(std::span<const engine::DraftRequest> requests, const engine::DraftChooser& choose) override {
    DraftBias::draft(requests, [&](size_t i, int j, std::span<const float> logits) {
      auto it = rows_.find(requests[i].last);
      if (j > 0 || it == rows_.end()) return choose(i, j, logits);
      row_ = it->second;
      row_[static_cast<size_t>(tilt_.at(it->first).first)] += 1.0f;
      row_[static_cast<size_t>(tilt_.at(it->first).second)] -= 1.0f;
      return choose(i, j, row_);
    });
  }

 private:
  std::map<int32_t, std::vector<float>> rows_;
  std::map<int32_t, std::pair<int32_t, int32_t>> tilt_;
  std::vector<float> row_;
};

// Sampling with MTP keeps the target's distribution, through the engine: 2 000 seeded requests (temperature 1, top-k 3)
// of one prompt sample x_1 in the prefill step and x_2 in a verify step whose draft comes from a row tilted away from
// the target's; the joint (x_1, x_2) counts against p(x_1) p(x_2 | x_1) from plain forwards, by Pearson's chi-square.
// Cells expected below 5 are pooled. The test fails above the chi-square's 1 - 1e-6 quantile (Wilson-Hilferty), so a
// correct engine fails it with probability about 1e-6.
TEST_P(SpeculativeEngine, SampledOutputKeepsTheTargetDistribution) {
  if (sanitized_build()) GTEST_SKIP() << "statistics, not memory safety: the normal build runs it";
  auto m = model();
  const int64_t vocab = m->config().vocab_size;
  GenerationRequest base = mixed_requests(1, vocab, 16)[0];
  base.prompt.resize(std::min<size_t>(base.prompt.size(), 6));
  base.sampling.temperature = 1.0f;
  base.sampling.top_k = 3;
  base.sampling.top_p = 1.0f;
  base.stop.max_tokens = 3;  // x_1 plainly, then a verify step of [x_1, d]: room for one draft
  engine::Sampler sampler;
  const engine::TokenHistory none;
  // Plain forwards: p(x_1) and, for each candidate a, p(x_2 | a) and the target's row there.
  auto logits_after = [&](const std::vector<int32_t>& tokens) {
    cache::SequenceState st = m->new_state(static_cast<int64_t>(tokens.size()) + 1);
    const std::vector<int64_t> ids(tokens.begin(), tokens.end());
    const model::StepSequence seq{&st, ids, model::LogitsFor::last};
    const Tensor out = m->forward({&seq, 1});
    return std::vector<float>(out.data<float>(), out.data<float>() + vocab);
  };
  auto dist = [&](const std::vector<float>& logits) {
    std::vector<float> d(static_cast<size_t>(vocab));
    sampler.distribution(logits, base.sampling, none, d);
    return d;
  };
  const std::vector<float> p1 = dist(logits_after(base.prompt));
  std::map<int32_t, std::vector<float>> rows, p2;
  std::map<int32_t, std::pair<int32_t, int32_t>> tilt;
  std::vector<int32_t> candidates;
  for (int32_t a = 0; a < vocab; ++a) {
    if (p1[static_cast<size_t>(a)] == 0.0f) continue;
    candidates.push_back(a);
    std::vector<int32_t> t = base.prompt;
    t.push_back(a);
    rows[a] = logits_after(t);
    p2[a] = dist(rows[a]);
    int32_t least = -1, most = -1;
    for (int32_t b = 0; b < vocab; ++b) {
      const float q = p2[a][static_cast<size_t>(b)];
      if (q == 0.0f) continue;
      if (least < 0 || q < p2[a][static_cast<size_t>(least)]) least = b;
      if (most < 0 || q > p2[a][static_cast<size_t>(most)]) most = b;
    }
    tilt[a] = {least, most};
  }
  ASSERT_EQ(candidates.size(), 3u);
  const int n = 2000;
  std::vector<GenerationRequest> requests(n, base);
  for (int i = 0; i < n; ++i) requests[static_cast<size_t>(i)].sampling.seed = 1000 + static_cast<uint64_t>(i);
  auto runner = std::make_shared<TiltedDrafts>(make_runner(m, 1, 256), rows, tilt);
  EngineOptions o = engine_options(256);
  o.limits.token_budget = 2048;
  engine::EngineMetrics metrics;
  const std::vector<Output> got = run(runner, requests, o, &metrics);
  std::map<std::pair<int32_t, int32_t>, int64_t> counts;
  for (const Output& g : got) {
    ASSERT_GE(g.tokens.size(), 2u);
    ++counts[{g.tokens[0], g.tokens[1]}];
  }
  // Pearson's statistic over the cells of probability > 0 (those expected below 5 pooled into one).
  double x = 0, pooled_e = 0, pooled_o = 0;
  int cells = 0;
  int64_t seen = 0;
  for (int32_t a : candidates)
    for (int32_t b = 0; b < vocab; ++b) {
      const double prob = static_cast<double>(p1[static_cast<size_t>(a)]) * p2[a][static_cast<size_t>(b)];
      const auto it = counts.find({a, b});
      const double o_ab = it == counts.end() ? 0.0 : static_cast<double>(it->second);
      if (prob == 0.0) {
        EXPECT_EQ(o_ab, 0.0) << "(" << a << ", " << b << ") has probability 0";
        continue;
      }
      seen += static_cast<int64_t>(o_ab);
      const double e = n * prob;
      if (e < 5) {
        pooled_e += e, pooled_o += o_ab;
        continue;
      }
      x += (o_ab - e) * (o_ab - e) / e;
      ++cells;
    }
  if (pooled_e > 0) x += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e, ++cells;
  EXPECT_EQ(seen, n);
  const double dof = cells - 1, z = 4.753;  // the standard normal's 1 - 1e-6 quantile
  const double h = 2.0 / (9.0 * dof), critical = dof * std::pow(1.0 - h + z * std::sqrt(h), 3.0);
  EXPECT_LE(x, critical) << cells << " cells";
  // Both verdicts happened: some drafts kept, some rejected.
  EXPECT_GT(metrics.spec_accepted_tokens_total, metrics.spec_draft_tokens_total / 10);
  EXPECT_LT(metrics.spec_accepted_tokens_total, metrics.spec_draft_tokens_total);
  std::printf("[%s] joint (x1, x2) of %d seeds: chi-square %.1f over %d cells (limit %.1f); %llu of %llu drafts kept\n",
              GetParam().c_str(), n, x, cells, critical, static_cast<unsigned long long>(metrics.spec_accepted_tokens_total),
              static_cast<unsigned long long>(metrics.spec_draft_tokens_total));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SpeculativeEngine, ::testing::Values("tiny-mxfp4", "tiny-nvfp4"),
                         [](const auto& info) { return info.param.substr(5); });

}  // namespace
}  // namespace tern::test
