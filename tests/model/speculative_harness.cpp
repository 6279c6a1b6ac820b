#include "speculative_harness.h"

#include <gtest/gtest.h>

#include <cstdio>

namespace tern::test {

std::string token_text(int32_t t) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "<%d>", t);
  return buf;
}

EngineOptions spec_engine_options(int max_running) {
  EngineOptions o;
  o.state_memory_bytes = int64_t{256} << 20;
  o.limits.max_running = max_running;
  o.limits.token_budget = 512;
  o.limits.max_chunk = 32;  // prompts arrive in several chunks, mixed with decode and verify steps
  o.token_bytes = token_text;
  return o;
}

std::shared_ptr<engine::V4Runner> spec_runner(std::shared_ptr<model::Model> m, int k, int max_sequences, bool graphs,
                                              bool in_runner) {
  auto r = std::make_shared<engine::V4Runner>(m, "fixture", 0, 256);
  r->set_sampling_in_runner_on_cpu(in_runner);
  if (graphs) {
    engine::DecodeGraphOptions g;
    g.max_batch = max_sequences;
    g.max_queries = k + 1;
    r->enable_decode_graphs(g);
  }
  if (k > 0) r->enable_speculative(k, max_sequences);
  return r;
}

std::vector<SpecOutput> run_engine(std::shared_ptr<engine::ModelRunner> runner, const std::vector<GenerationRequest>& requests,
                                   EngineOptions o, engine::EngineMetrics* metrics) {
  engine::Engine e(std::move(runner), std::move(o));
  std::vector<SpecOutput> out(requests.size());
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

void expect_same(const std::vector<SpecOutput>& got, const std::vector<SpecOutput>& want, const std::string& what,
                 double logprob_tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << what << ", request " << i;
    EXPECT_EQ(got[i].text, want[i].text) << what << ", request " << i;
    EXPECT_EQ(got[i].finish, want[i].finish) << what << ", request " << i;
    EXPECT_EQ(got[i].completion_tokens, want[i].completion_tokens) << what << ", request " << i;
    if (got[i].tokens != want[i].tokens) continue;
    for (size_t t = 0; t < got[i].logprobs.size(); ++t) {
      EXPECT_NEAR(got[i].logprobs[t], want[i].logprobs[t], logprob_tol) << what << ", request " << i << " token " << t;
      ASSERT_EQ(got[i].top[t].size(), want[i].top[t].size());
      if (logprob_tol > 1e-3) continue;  // near ties may order differently
      for (size_t a = 0; a < got[i].top[t].size(); ++a) EXPECT_EQ(got[i].top[t][a].token, want[i].top[t][a].token);
    }
  }
}

void check_speculative_greedy(std::shared_ptr<model::Model> m, int n, const std::string& label, double logprob_tol,
                              bool graphs, bool in_runner) {
  const int64_t vocab = m->config().vocab_size;
  std::vector<GenerationRequest> requests = mixed_requests(n, vocab, 11);
  // Stop strings from the plain output: every third request stops at the text of its fourth token.
  std::vector<SpecOutput> want = run_engine(spec_runner(m, 0, 64, graphs), requests);
  for (int i = 0; i < n; i += 3)
    if (want[static_cast<size_t>(i)].tokens.size() > 4)
      requests[static_cast<size_t>(i)].stop.stop = {token_text(want[static_cast<size_t>(i)].tokens[3])};
  want = run_engine(spec_runner(m, 0, 64, graphs), requests);
  std::vector<std::vector<int32_t>> outputs;
  std::vector<int64_t> lens;
  for (size_t i = 0; i < requests.size(); ++i) {
    outputs.push_back(want[i].tokens);
    lens.push_back(static_cast<int64_t>(requests[i].prompt.size()));
  }
  uint64_t drafts = 0, accepted = 0;
  for (int k = 1; k <= 3; ++k)
    for (double p : {0.0, 0.7, 1.0}) {  // the MTP layer's own drafts; pushed to the right token 70% / always
      auto runner = spec_runner(m, k, 64, graphs, in_runner);
      std::shared_ptr<engine::ModelRunner> r = runner;
      if (p > 0) r = std::make_shared<DraftBias>(runner, outputs, lens, p);
      engine::EngineMetrics metrics;
      const std::vector<SpecOutput> got = run_engine(r, requests, spec_engine_options(), &metrics);
      const std::string what = "k " + std::to_string(k) + ", drafts right with p " + std::to_string(p);
      expect_same(got, want, what, logprob_tol);
      EXPECT_GT(metrics.spec_drafts_total, 0u) << what;
      EXPECT_LE(metrics.spec_accepted_tokens_total, metrics.spec_draft_tokens_total) << what;
      uint64_t by_position = 0;
      for (size_t j = 0; j < metrics.spec_accepted_per_position.size(); ++j) {
        by_position += metrics.spec_accepted_per_position[j];
        if (j > 0) {
          EXPECT_LE(metrics.spec_accepted_per_position[j], metrics.spec_accepted_per_position[j - 1]);
        }
      }
      EXPECT_EQ(by_position, metrics.spec_accepted_tokens_total) << what;
      if (p == 1.0) {
        EXPECT_GT(metrics.spec_accepted_tokens_total * 10, metrics.spec_draft_tokens_total * 8) << what;
      }
      if (p == 0.7) drafts += metrics.spec_draft_tokens_total, accepted += metrics.spec_accepted_tokens_total;
    }
  // Partial acceptance happened (so did rollback of the rest): neither none nor all kept.
  EXPECT_GT(accepted, drafts / 5);
  EXPECT_LT(accepted, drafts);
  std::printf("[%s] %d requests, drafts right 70%% of the time: %llu of %llu drafts kept over k = 1, 2, 3\n",
              label.c_str(), n, static_cast<unsigned long long>(accepted), static_cast<unsigned long long>(drafts));
}

}  // namespace tern::test
