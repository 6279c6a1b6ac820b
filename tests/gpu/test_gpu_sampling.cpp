// Device sampling (ops::sample_rows on the CUDA backend) against the host sampler (engine::Sampler):
// for fresh random rows of vocab 129 280 (never zeros; rows with exact ties, heavy tails, one peak) and a
// grid of parameters, the device must pick the same token for every row, with logprobs within 1e-5
// relative, the same top logprobs, and leave the request's generator in the same state.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "core/tensor.h"
#include "engine/sampler.h"
#include "gpu_test_util.h"
#include "ops/sampling.h"

namespace tern {
namespace {

constexpr int64_t kVocab = 129280;

// Rows of several shapes: 0 normal, 1 heavy tails (normal / uniform), 2 exact ties (values on a coarse
// grid, the maximum tied), 3 one peak over noise, 4 wide normal (low temperature-like, many weights
// underflow to 0).
std::vector<float> make_rows(int rows, uint64_t seed) {
  gputest::Rand rnd(seed);
  std::vector<float> v(static_cast<size_t>(rows) * kVocab);
  for (int r = 0; r < rows; ++r) {
    float* row = v.data() + static_cast<size_t>(r) * kVocab;
    const int kind = r % 5;
    for (int64_t i = 0; i < kVocab; ++i) {
      float x = 0;
      switch (kind) {
        case 0: x = rnd.normal(2.0f); break;
        case 1: x = rnd.normal(1.0f) / std::max(0.02f, rnd.uniform(0.0f, 1.0f)); break;
        case 2: x = std::round(rnd.normal(3.0f) * 4.0f) / 4.0f + 0.125f; break;  // multiples of 1/4 + 1/8: never 0
        case 3: x = rnd.normal(1.0f); break;
        default: x = rnd.normal(20.0f); break;
      }
      if (x == 0.0f) x = 1e-3f;
      row[i] = x;
    }
    if (kind == 2) {  // a tied maximum at three places
      float m = row[0];
      for (int64_t i = 1; i < kVocab; ++i) m = std::max(m, row[i]);
      row[rnd.index(kVocab)] = m;
      row[rnd.index(kVocab)] = m;
    }
    if (kind == 3) row[rnd.index(kVocab)] = 25.0f;
  }
  return v;
}

struct Case {
  std::string name;
  engine::SamplingParams p;
  bool history = false;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  auto add = [&](std::string name, auto edit, bool history = false) {
    engine::SamplingParams p;
    edit(p);
    out.push_back({std::move(name), p, history});
  };
  add("greedy", [](auto& p) { p.temperature = 0; });
  add("greedy_lp20", [](auto& p) { p.temperature = 0; p.top_logprobs = 20; });
  add("t0.7", [](auto& p) { p.temperature = 0.7f; });
  add("t1.3_lp5", [](auto& p) { p.temperature = 1.3f; p.top_logprobs = 5; });
  add("t1_lp0", [](auto& p) { p.top_logprobs = 0; });
  add("topk1", [](auto& p) { p.top_k = 1; });
  add("topk5", [](auto& p) { p.top_k = 5; p.temperature = 0.7f; });
  add("topk50_lp20", [](auto& p) { p.top_k = 50; p.temperature = 1.3f; p.top_logprobs = 20; });
  add("topk5000", [](auto& p) { p.top_k = 5000; });  // more than one tier of candidates
  add("topp0.1", [](auto& p) { p.top_p = 0.1f; });
  add("topp0.9", [](auto& p) { p.top_p = 0.9f; p.temperature = 0.7f; });
  add("topp0.9_t1.3", [](auto& p) { p.top_p = 0.9f; p.temperature = 1.3f; });
  add("minp0.05", [](auto& p) { p.min_p = 0.05f; });
  add("minp0.05_topk50_topp0.9", [](auto& p) { p.min_p = 0.05f; p.top_k = 50; p.top_p = 0.9f; });
  add("topk50_topp0.1", [](auto& p) { p.top_k = 50; p.top_p = 0.1f; p.temperature = 1.3f; });
  add("penalties", [](auto& p) { p.presence_penalty = 0.5f; p.frequency_penalty = 0.3f; p.repetition_penalty = 1.3f; }, true);
  add("penalties_greedy_lp5", [](auto& p) { p.temperature = 0; p.repetition_penalty = 1.5f; p.top_logprobs = 5; }, true);
  add("penalties_topk50_topp0.9", [](auto& p) {
    p.presence_penalty = -0.4f; p.frequency_penalty = 0.7f; p.repetition_penalty = 0.8f; p.top_k = 50; p.top_p = 0.9f;
  }, true);
  add("penalties_minp", [](auto& p) { p.frequency_penalty = 1.0f; p.min_p = 0.05f; p.temperature = 0.7f; }, true);
  return out;
}

bool close(float a, float b) { return std::fabs(a - b) <= 1e-5 * std::max(std::fabs(b), 1e-2f); }

TEST(GpuSampling, SameTokensAsTheHostSampler) {
  TERN_REQUIRE_GPU();
  constexpr int kRows = 20;
  const std::vector<float> host_logits = make_rows(kRows, 20240601);
  Tensor dev(DType::f32, {kRows, kVocab}, Device::cuda);
  copy_view(TensorView(const_cast<float*>(host_logits.data()), DType::f32, {kRows, kVocab}), dev.view());
  engine::Sampler sampler;
  int checked = 0;
  for (const Case& c : cases()) {
    std::mt19937_64 hist_rng(99);
    std::vector<engine::TokenHistory> histories(kRows);
    std::vector<std::vector<int32_t>> seen(kRows);
    std::vector<std::vector<std::pair<int32_t, int32_t>>> counts(kRows);
    std::vector<ops::SampleRowSpec> specs(kRows);
    std::vector<std::mt19937_64> host_rngs, dev_rngs;
    for (int r = 0; r < kRows; ++r) {
      auto& h = histories[r];
      if (c.history) {
        std::vector<int32_t> prompt(64);
        for (auto& t : prompt) t = static_cast<int32_t>(hist_rng() % kVocab);
        h.add_prompt(prompt, kVocab);
        for (int k = 0; k < 40; ++k) h.add_output(static_cast<int32_t>(hist_rng() % 200), kVocab);  // repeats
        // the row's best tokens among them, so the penalties change the outcome
        const float* row = host_logits.data() + static_cast<size_t>(r) * kVocab;
        h.add_output(engine::argmax(std::span<const float>(row, kVocab)), kVocab);
      }
      for (size_t t = 0; t < h.seen.size(); ++t)
        if (h.seen[t]) seen[r].push_back(static_cast<int32_t>(t));
      counts[r].assign(h.output_counts.begin(), h.output_counts.end());
      host_rngs.emplace_back(1000 + r * 7919 + checked);
      dev_rngs.push_back(host_rngs.back());
      double u[engine::kMaxUniformsPerSample] = {};
      const int n = engine::draw_uniforms(c.p, dev_rngs.back(), u);
      ops::SampleRowDesc d;
      d.temperature = c.p.temperature;
      d.top_k = c.p.top_k;
      d.top_p = c.p.top_p;
      d.min_p = c.p.min_p;
      d.presence = c.p.presence_penalty;
      d.frequency = c.p.frequency_penalty;
      d.repetition = c.p.repetition_penalty;
      d.top_logprobs = c.p.top_logprobs;
      d.uniform = n > 0 ? u[0] : 0.0;
      specs[r] = {d, seen[r], counts[r]};
    }
    std::vector<ops::SampledRow> got(kRows);
    ops::sample_rows(cuda::context(), dev.view(), specs, got);
    for (int r = 0; r < kRows; ++r) {
      SCOPED_TRACE(c.name + " row " + std::to_string(r) + " (kind " + std::to_string(r % 5) + ")");
      std::span<const float> row(host_logits.data() + static_cast<size_t>(r) * kVocab, kVocab);
      const engine::SampleResult want = sampler.sample(row, c.p, histories[r], host_rngs[r]);
      EXPECT_EQ(got[r].token, want.token);
      EXPECT_TRUE(host_rngs[r] == dev_rngs[r]) << "the generators differ after the step";
      if (c.p.top_logprobs >= 0) {
        EXPECT_TRUE(close(got[r].logprob, want.logprob)) << got[r].logprob << " vs " << want.logprob;
        ASSERT_EQ(got[r].num_top, static_cast<int>(want.top.size()));
        for (int i = 0; i < got[r].num_top; ++i) {
          EXPECT_EQ(got[r].top_tokens[i], want.top[i].token) << "top " << i;
          EXPECT_TRUE(close(got[r].top_logprobs[i], want.top[i].logprob)) << "top " << i;
        }
      } else {
        EXPECT_EQ(got[r].num_top, 0);
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(cases().size()));
}

// The same request drawn many times (fresh uniforms each time) over one row: the device follows the
// host through many draws, including the candidates far down the order.
TEST(GpuSampling, ManyDrawsFollowTheHost) {
  TERN_REQUIRE_GPU();
  constexpr int kRows = 64;
  std::vector<float> one = make_rows(1, 7);
  std::vector<float> host_logits;
  for (int r = 0; r < kRows; ++r) host_logits.insert(host_logits.end(), one.begin(), one.end());
  Tensor dev(DType::f32, {kRows, kVocab}, Device::cuda);
  copy_view(TensorView(host_logits.data(), DType::f32, {kRows, kVocab}), dev.view());
  engine::Sampler sampler;
  engine::TokenHistory none;
  for (float top_p : {1.0f, 0.9f}) {
    engine::SamplingParams p;
    p.top_p = top_p;
    p.temperature = 1.3f;
    std::mt19937_64 host_rng(5), dev_rng(5);
    std::vector<ops::SampleRowSpec> specs(kRows);
    for (auto& s : specs) {
      double u[1];
      engine::draw_uniforms(p, dev_rng, u);
      s.params.temperature = p.temperature;
      s.params.top_p = p.top_p;
      s.params.uniform = u[0];
    }
    std::vector<ops::SampledRow> got(kRows);
    ops::sample_rows(cuda::context(), dev.view(), specs, got);
    for (int r = 0; r < kRows; ++r) {
      const auto want = sampler.sample(std::span<const float>(one.data(), kVocab), p, none, host_rng);
      EXPECT_EQ(got[r].token, want.token) << "top_p " << top_p << " draw " << r;
    }
    EXPECT_TRUE(host_rng == dev_rng);
  }
}

}  // namespace
}  // namespace tern
