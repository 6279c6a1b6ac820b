// The CPU model against the PyTorch reference on the odd-shape fixture (tests/fixtures/odd-mxfp4,
// tools/reference/make_odd_fixture.py; issue #17 item 3): hidden 320, 6 heads in 3 groups, head_dim 104 with 24
// RoPE dims, q_lora_rank 96, o_lora_rank 48, 6 experts top-3, intermediate 96, indexer head_dim 56, window 12,
// YaRN factor 4 over 4 096. Every size the tiny fixtures keep at a power of two is something else here.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "fixture.h"
#include "fixture_checks.h"
#include "ops/rope.h"
#include "ops/sample.h"

namespace tern::test {
namespace {

constexpr float kTolerance = 1e-4f;  // max|d| <= 1e-4 * max|ref|, as the tiny fixtures' parity
const char* const kOdd = "odd-mxfp4";

TEST(OddShapes, TheFixtureHasTheOddSizes) {
  const model::ModelConfig& c = Fixture::get(kOdd).weights().config;
  EXPECT_EQ(c.hidden_size, 320);
  EXPECT_EQ(c.num_heads, 6);
  EXPECT_EQ(c.o_groups, 3);
  EXPECT_EQ(c.head_dim, 104);
  EXPECT_EQ(c.rope_dim, 24);
  EXPECT_EQ(c.n_routed_experts, 6);
  EXPECT_EQ(c.experts_per_token, 3);
  EXPECT_EQ(c.index_head_dim, 56);
  EXPECT_EQ(c.sliding_window, 12);
  EXPECT_EQ(c.expert_format, model::WeightFormat::mxfp4);
  // Another YaRN than the tiny fixtures' (factor 16 over 65 536), on the compressed layers' RoPE (the official
  // rope_scaling is that branch's), and one that changes frequencies: over 4 096 positions its ramp (dims 3..7
  // at theta 160 000) lies inside the 12 rotated pairs, so part of them are interpolated.
  const model::RopeConfig& r = c.rope_compress;
  EXPECT_TRUE(r.yarn);
  EXPECT_EQ(r.factor, 4.0);
  EXPECT_EQ(r.original_max_position, 4096.0);
  ops::RopeParams p{r.theta, c.rope_dim, true, r.factor, r.original_max_position, r.beta_fast, r.beta_slow};
  const Tensor yarn = ops::rope_inv_freq(p);
  p.yarn = false;
  const Tensor plain = ops::rope_inv_freq(p);
  int interpolated = 0;
  for (int64_t i = 0; i < yarn.numel(); ++i) interpolated += yarn.data<float>()[i] != plain.data<float>()[i];
  EXPECT_GT(interpolated, 0);
  EXPECT_LT(interpolated, yarn.numel());  // the highest frequencies stay extrapolated
}

// Every prompt at once (one forward over all sequences), then each in chunks of 5: every position's logits.
TEST(OddShapes, PromptLogitsInOneBatchAndInChunks) {
  const Fixture& f = Fixture::get(kOdd);
  model::Model m(f.weights(), model::KvMode::exact, cpu::context());
  const int P = f.num_prompts();
  ASSERT_GE(P, 9);
  const int64_t vocab = m.config().vocab_size;
  std::vector<std::vector<int64_t>> ids(P);
  std::vector<cache::SequenceState> states;
  std::vector<model::StepSequence> batch;
  for (int p = 0; p < P; ++p) {
    ids[p] = f.ids(p);
    states.push_back(m.new_state(static_cast<int64_t>(ids[p].size())));
  }
  for (int p = 0; p < P; ++p) batch.push_back({&states[p], ids[p], model::LogitsFor::all});
  const Tensor all = m.forward(batch);
  float worst = 0;
  int64_t row = 0;
  for (int p = 0; p < P; ++p) {
    const TensorView want = f.tensor("prompt." + std::to_string(p) + ".logits");
    const auto T = static_cast<int64_t>(ids[p].size());
    ASSERT_EQ(want.numel(), T * vocab);
    const Diff d = diff(all.data<float>() + row * vocab, want.data_as<const float>(), T * vocab);
    worst = std::max(worst, d.rel());
    EXPECT_LE(d.max_abs, kTolerance * d.ref_max) << "prompt " << p << " (length " << T << "), one batch";
    row += T;

    cache::SequenceState state = m.new_state(T);
    for (int64_t begin = 0; begin < T; begin += 5) {
      const int64_t n = std::min<int64_t>(5, T - begin);
      const model::StepSequence s{&state, std::span<const int64_t>(ids[p]).subspan(begin, n), model::LogitsFor::all};
      const Tensor logits = m.forward({&s, 1});
      const Diff dc = diff(logits.data<float>(), want.data_as<const float>() + begin * vocab, n * vocab);
      worst = std::max(worst, dc.rel());
      EXPECT_LE(dc.max_abs, kTolerance * dc.ref_max) << "prompt " << p << " chunk at " << begin;
    }
  }
  std::printf("[%s] prompt logits (one batch, chunks of 5): max|d|/max|ref| = %.3g over %d prompts\n", kOdd, worst, P);
}

// Prefill, then token-by-token greedy decode: the reference's tokens, and its logits at every step.
TEST(OddShapes, GreedyContinuations) {
  const Fixture& f = Fixture::get(kOdd);
  model::Model m(f.weights(), model::KvMode::exact, cpu::context());
  float worst = 0;
  for (int p : prompts_to_run(f)) {
    ASSERT_EQ(f.tensor("prompt." + std::to_string(p) + ".greedy_logits").numel(),
              static_cast<int64_t>(f.greedy(p).size()) * f.weights().config.vocab_size)
        << "prompt " << p;
    worst = std::max(worst, check_greedy_exact(m, f, p, kTolerance));
  }
  std::printf("[%s] greedy steps: max|d|/max|ref| = %.3g\n", kOdd, worst);
}

// The exact mode (--activations f32) marks every weight exact: the CPU computes in f32 anyway, so its logits are
// the native mode's bits; and the marks are the whole mode (back to native, only the gate and indexer stay exact).
TEST(OddShapes, ExactModeIsTheCpusOwnArithmetic) {
  const Fixture& f = Fixture::get(kOdd);
  model::Model native(f.weights(), model::KvMode::exact, cpu::context()), exact(f.weights(), model::KvMode::exact, cpu::context());
  exact.set_activations(ops::Activations::f32);
  const model::LayerWeights& L = exact.weights().layers[2];
  EXPECT_TRUE(L.attn.wq_b.exact && L.ffn.experts[0].w2.exact && L.ffn.shared.w1.exact && exact.weights().head.exact);
  EXPECT_FALSE(L.attn.wq_b.act_fp8);
  const std::vector<int64_t> ids = f.ids(f.num_prompts() - 1);
  cache::SequenceState a = native.new_state(static_cast<int64_t>(ids.size())),
                       b = exact.new_state(static_cast<int64_t>(ids.size()));
  const model::StepSequence sa{&a, ids, model::LogitsFor::all}, sb{&b, ids, model::LogitsFor::all};
  const Tensor la = native.forward({&sa, 1}), lb = exact.forward({&sb, 1});
  ASSERT_EQ(la.numel(), lb.numel());
  EXPECT_EQ(std::memcmp(la.data<float>(), lb.data<float>(), la.numel() * sizeof(float)), 0);
  exact.set_activations(ops::Activations::native);
  const model::LayerWeights& N = exact.weights().layers[3];
  EXPECT_FALSE(N.attn.wq_b.exact || N.ffn.experts[0].w1.exact || exact.weights().head.exact);
  EXPECT_TRUE(N.ffn.gate.exact && N.attn.indexer->wq_b.exact && N.attn.indexer->compressor.wkv.exact);
}

// DeepSeek's FP8 KV rows hold the no-RoPE dims in blocks of 64: 80 cannot be held, and the model says so.
TEST(OddShapes, Fp8KvRowsAreRefusedWithAClearMessage) {
  const Fixture& f = Fixture::get(kOdd);
  try {
    model::Model m(f.weights(), model::KvMode::fp8, cpu::context());
    FAIL() << "an FP8 KV model was built for 80 no-RoPE dims";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no-RoPE dims (80) must be a multiple of 64"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tern::test
