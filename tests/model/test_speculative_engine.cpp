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

#include "backends/cpu/cpu_backend.h"
#include "engine/sampler.h"

#include "fixture.h"
#include "speculative_harness.h"

namespace tern::test {
namespace {

using engine::Engine;

class SpeculativeEngine : public ::testing::TestWithParam<std::string> {
 protected:
  std::shared_ptr<model::Model> model() {
    const Fixture& f = Fixture::get(GetParam());
    auto m = std::make_shared<model::Model>(f.weights(), model::KvMode::exact, cpu::context());
    EXPECT_TRUE(m->has_mtp());
    return m;
  }
};

TEST_P(SpeculativeEngine, GreedyOutputEqualsPlainDecoding) {
  check_speculative_greedy(model(), sanitized_build() ? 12 : 64, GetParam());
}

// The same through the engine's device-sampling path (what a GPU runner takes: the verify rows of greedy requests
// sampled where the logits are and judged from their choices, the oracle's too; the rest copied out for the host's
// verdict), with the host sampler standing in for the device's (V4Runner::set_sampling_in_runner_on_cpu).
TEST_P(SpeculativeEngine, GreedyOutputEqualsPlainDecodingSamplingInTheRunner) {
  check_speculative_greedy(model(), sanitized_build() ? 12 : 32, GetParam() + ", sampled in the runner", 1e-4,
                           /*graphs=*/false, /*in_runner=*/true);
}

TEST_P(SpeculativeEngine, AloneEqualsPlainDecoding) {
  auto m = model();
  std::vector<GenerationRequest> requests = mixed_requests(1, m->config().vocab_size, 12);
  requests[0].stop.max_tokens = 30;
  const std::vector<SpecOutput> want = run_engine(spec_runner(m, 0), requests);
  for (int k = 1; k <= 3; ++k) {
    auto runner = std::make_shared<DraftBias>(spec_runner(m, k), std::vector<std::vector<int32_t>>{want[0].tokens},
                                              std::vector<int64_t>{static_cast<int64_t>(requests[0].prompt.size())}, 0.6);
    expect_same(run_engine(runner, requests), want, "alone, k " + std::to_string(k));
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
  const std::vector<SpecOutput> a = run_engine(spec_runner(m, 3), requests, spec_engine_options(), &metrics);
  const std::vector<SpecOutput> b = run_engine(spec_runner(m, 3), requests);
  // Sampled in the runner (the device path: the plain rows there with the same uniforms, the verify rows to the host)
  const std::vector<SpecOutput> c = run_engine(spec_runner(m, 3, 64, false, /*in_runner=*/true), requests);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << "request " << i;
    EXPECT_EQ(a[i].tokens, c[i].tokens) << "request " << i << ", sampled in the runner";
    EXPECT_EQ(static_cast<int64_t>(a[i].tokens.size()), requests[i].stop.max_tokens);
  }
  EXPECT_GT(metrics.spec_drafts_total, 0u);
}

// Sixteen sequences with MTP on fit a state memory sized for sixteen: all run at once, none is preempted, and the
// memory plan says what speculation costs.
TEST_P(SpeculativeEngine, FullBatchKeepsRunning) {
  auto m = model();
  std::vector<GenerationRequest> requests = mixed_requests(16, m->config().vocab_size, 14);
  EngineOptions o = spec_engine_options(16);
  auto runner = spec_runner(m, 3, 16);
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

// Preemption under speculation: a state memory for a few sequences preempts the youngest and recomputes them from
// their tokens (the MTP window and the carry rebuilt by the recompute's catch-up); the output stays plain decoding's.
TEST_P(SpeculativeEngine, PreemptedSequencesRecomputeExactly) {
  auto m = model();
  std::vector<GenerationRequest> requests = mixed_requests(12, m->config().vocab_size, 17);
  for (auto& r : requests) r.stop.max_tokens = 40;
  EngineOptions o = spec_engine_options(12);
  const auto layout = spec_runner(m, 0)->state_layout(0);
  o.state_memory_bytes = 3 * layout->pages_for(100) * layout->page_bytes();
  const std::vector<SpecOutput> want = run_engine(spec_runner(m, 0), requests, o);
  std::vector<std::vector<int32_t>> outputs;
  std::vector<int64_t> lens;
  for (size_t i = 0; i < requests.size(); ++i) {
    outputs.push_back(want[i].tokens);
    lens.push_back(static_cast<int64_t>(requests[i].prompt.size()));
  }
  engine::EngineMetrics metrics;
  auto runner = std::make_shared<DraftBias>(spec_runner(m, 3, 12), outputs, lens, 0.7);
  expect_same(run_engine(runner, requests, o, &metrics), want, "preempted");
  EXPECT_GT(metrics.preemptions_total, 0u);
  EXPECT_GT(metrics.spec_accepted_tokens_total, 0u);
}

// The oracle (benchmarks only) keeps every draft at acceptance 1: k + 1 tokens a round.
TEST_P(SpeculativeEngine, OracleAcceptanceKeepsEveryDraft) {
  auto m = model();
  std::vector<GenerationRequest> requests = mixed_requests(4, m->config().vocab_size, 15);
  EngineOptions o = spec_engine_options();
  o.oracle_accept = 1.0;
  for (const bool in_runner : {false, true}) {  // the host's verdict; the device path's (logprob requests on the host)
    engine::EngineMetrics metrics;
    const std::vector<SpecOutput> got = run_engine(spec_runner(m, 3, 64, false, in_runner), requests, o, &metrics);
    EXPECT_EQ(metrics.spec_accepted_tokens_total, metrics.spec_draft_tokens_total);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(static_cast<int64_t>(got[i].tokens.size()), requests[i].stop.max_tokens);
  }
  // At acceptance 1/2 both paths take the same acceptances from each request's (seeded) generator and the same next
  // tokens.
  o.oracle_accept = 0.5;
  for (size_t i = 0; i < requests.size(); ++i) requests[i].sampling.seed = 100 + i;
  const std::vector<SpecOutput> host = run_engine(spec_runner(m, 3), requests, o);
  expect_same(run_engine(spec_runner(m, 3, 64, false, /*in_runner=*/true), requests, o), host, "oracle 0.5 in the runner");
  EngineOptions bad = spec_engine_options();
  bad.oracle_accept = 0.5;
  EXPECT_THROW(Engine(spec_runner(m, 0), bad), Error);  // an oracle without speculation is refused
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
  std::vector<std::vector<int32_t>> draft(std::span<const engine::DraftRequest> requests,
                                          const engine::DraftChooser& choose) override {
    return DraftBias::draft(requests, [&](size_t i, int j, std::span<const float> logits) {
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
  // Every other seed samples in the runner (the device path: x_1 there, the verify rows to the host's verdict).
  EngineOptions o = spec_engine_options(256);
  o.limits.token_budget = 2048;
  engine::EngineMetrics metrics, metrics_in_runner;
  std::vector<GenerationRequest> host_half, runner_half;
  for (int i = 0; i < n; ++i) (i % 2 == 0 ? host_half : runner_half).push_back(requests[static_cast<size_t>(i)]);
  std::vector<SpecOutput> got = run_engine(std::make_shared<TiltedDrafts>(spec_runner(m, 1, 256), rows, tilt), host_half,
                                           o, &metrics);
  const std::vector<SpecOutput> other =
      run_engine(std::make_shared<TiltedDrafts>(spec_runner(m, 1, 256, false, /*in_runner=*/true), rows, tilt),
                 runner_half, o, &metrics_in_runner);
  got.insert(got.end(), other.begin(), other.end());
  metrics.spec_accepted_tokens_total += metrics_in_runner.spec_accepted_tokens_total;
  metrics.spec_draft_tokens_total += metrics_in_runner.spec_draft_tokens_total;
  std::map<std::pair<int32_t, int32_t>, int64_t> counts;
  for (const SpecOutput& g : got) {
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

// A checkpoint without the MTP layer (the odd-shape fixture has none) cannot speculate: refused naming why; k out of
// range too.
TEST(SpeculativeRunner, RefusesWithoutTheMtpLayerOrBeyondThreeDrafts) {
  auto odd = std::make_shared<model::Model>(Fixture::get("odd-mxfp4").weights(), model::KvMode::exact, cpu::context());
  ASSERT_FALSE(odd->has_mtp());
  try {
    spec_runner(odd, 2);
    FAIL() << "speculation without an MTP layer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no MTP layer"), std::string::npos) << e.what();
  }
  auto tiny = std::make_shared<model::Model>(Fixture::get("tiny-mxfp4").weights(), model::KvMode::exact, cpu::context());
  EXPECT_THROW(spec_runner(tiny, 4), Error);
  EXPECT_THROW(spec_runner(tiny, 0)->draft({}, {}), Error);  // a runner that does not speculate says so
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SpeculativeEngine, ::testing::Values("tiny-mxfp4", "tiny-nvfp4"),
                         [](const auto& info) { return info.param.substr(5); });

}  // namespace
}  // namespace tern::test
