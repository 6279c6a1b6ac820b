// The CPU model against the PyTorch reference: full-forward logits, 32 greedy tokens, FP8 KV mode.
#include <gtest/gtest.h>

#include <cstdio>

#include "backends/cpu/cpu_backend.h"
#include "fixture.h"
#include "fixture_checks.h"
#include "ops/sample.h"

namespace tern::test {
namespace {

constexpr float kTolerance = 1e-4f;  // max|d| <= 1e-4 * max|ref|
// FP8 KV mode against PyTorch: rounding to e4m3 is discontinuous. A kv element within about one f32 ulp
// of a rounding midpoint rounds one way here and the other way in PyTorch, whose pre-rounding values differ
// from ours in the last bits (summation order). Seen: mxfp4 prompt 15, layer 1, row 7, dim 139: PyTorch
// 1.18749976, here 1.18750024, midpoint 1.1875. One flip moves later logits by ~1e-3 of max|ref| (the
// fixtures' README measured 0.037 absolute with an independent implementation). Such flips are sporadic
// and get likelier with length; a wrong rounding rule would move every prompt (and FP8 vs fp32 differs by
// ~0.3 of max|ref|). So: every prompt within kFp8FlipTolerance, and at least half of them within 1e-4.
// The FP8 incremental paths are held to 1e-4 against our own full forward (test_incremental.cpp).
constexpr float kFp8FlipTolerance = 5e-3f;

// Logits of every prompt position, prefilling in chunks of `chunk` tokens (0: all at once).
Tensor prompt_logits(model::Model& m, const std::vector<int64_t>& ids, int64_t chunk) {
  cache::SequenceState state = m.new_state(static_cast<int64_t>(ids.size()) + 1);
  const auto T = static_cast<int64_t>(ids.size()), step = chunk > 0 ? chunk : T;
  const int64_t vocab = m.config().vocab_size;
  Tensor all(DType::f32, {T, vocab});
  for (int64_t begin = 0; begin < T; begin += step) {
    const int64_t n = std::min(step, T - begin);
    const model::StepSequence s{&state, std::span<const int64_t>(ids).subspan(begin, n),
                                model::LogitsFor::all};
    const Tensor logits = m.forward({&s, 1});
    std::copy_n(logits.data<float>(), n * vocab, all.data<float>() + begin * vocab);
  }
  return all;
}

class Parity : public ::testing::TestWithParam<std::string> {};

TEST_P(Parity, FullForwardLogits) {
  const Fixture& f = Fixture::get(GetParam());
  model::Model m(f.weights(), model::KvMode::exact, cpu::context());
  float worst = 0;
  for (int p = 0; p < f.num_prompts(); ++p) {
    const std::vector<int64_t> ids = f.ids(p);
    const Tensor got = prompt_logits(m, ids, 0);
    const TensorView want = f.tensor("prompt." + std::to_string(p) + ".logits");
    ASSERT_EQ(want.numel(), got.numel());
    const Diff d = diff(got.data<float>(), want.data_as<const float>(), got.numel());
    worst = std::max(worst, d.rel());
    EXPECT_LE(d.max_abs, kTolerance * d.ref_max) << "prompt " << p << " (length " << ids.size() << ")";
  }
  std::printf("[%s] full forward: max|d|/max|ref| = %.3g over %d prompts\n", GetParam().c_str(), worst,
              f.num_prompts());
}

// --activations fp8 against the independent PyTorch reference with the official reference's activation
// quantisation (check_semantics.py --act-fp8-out). Every FP8 / FP4 product's input is rounded to e4m3, a
// discontinuous rule: as for the FP8 KV rows, an element within an f32 ulp of a rounding midpoint may round the
// other way here (summation order). Here there are ~15K rounded elements a token and layer, so such flips are
// common in the longer prompts, and the tiny random model carries one far (a router or indexer pick moves: up to
// 0.24 of max|ref| measured, as its native GPU and CPU runs part by ~0.19 from bf16 rounding alone). A wrong rule
// (a product left unquantised, another block size or scale rule) moves every prompt by ~1e-2 or more: the
// quantisation itself moves the logits by 0.3-0.5. So: at least a quarter of the prompts within kTolerance (8
// and 9 of 16 measured, the short ones among them), and the reference must not be the f32 one.
TEST_P(Parity, ActivationsFp8Logits) {
  const Fixture& f = Fixture::get(GetParam());
  ASSERT_FALSE(f.act_fp8_tensor("prompt.0.logits").empty())
      << f.dir() << "/act_fp8_reference.safetensors is missing (tools/reference/check_semantics.py --act-fp8-out)";
  model::Model m(f.weights(), model::KvMode::exact, cpu::context());
  m.set_activations(ops::Activations::fp8);
  float worst = 0, moved = 0;
  int close = 0;
  for (int p = 0; p < f.num_prompts(); ++p) {
    const std::vector<int64_t> ids = f.ids(p);
    const Tensor got = prompt_logits(m, ids, 0);
    const TensorView want = f.act_fp8_tensor("prompt." + std::to_string(p) + ".logits");
    ASSERT_EQ(want.numel(), got.numel()) << "prompt " << p;
    const Diff d = diff(got.data<float>(), want.data_as<const float>(), got.numel());
    worst = std::max(worst, d.rel());
    close += d.max_abs <= kTolerance * d.ref_max;
    const TensorView f32 = f.tensor("prompt." + std::to_string(p) + ".logits");
    moved = std::max(moved, diff(want.data_as<const float>(), f32.data_as<const float>(), want.numel()).rel());
  }
  EXPECT_GE(4 * close, f.num_prompts()) << close << " of " << f.num_prompts() << " prompts within " << kTolerance;
  EXPECT_GT(moved, 1e-3f) << "the fp8 reference equals the f32 one: the quantisation is not in it";
  std::printf("[%s] --activations fp8: max|d|/max|ref| = %.3g, %d of %d prompts within %.0e; the quantisation moves "
              "the reference's logits by up to %.3g\n",
              GetParam().c_str(), worst, close, f.num_prompts(), kTolerance, moved);
}

TEST_P(Parity, Greedy32Tokens) {
  // Prefill, then token-by-token decode of 32 greedy tokens; where the fixture stores them, also the
  // logits of every step.
  const Fixture& f = Fixture::get(GetParam());
  model::Model m(f.weights(), model::KvMode::exact, cpu::context());
  float worst = 0;
  for (int p : prompts_to_run(f)) worst = std::max(worst, check_greedy_exact(m, f, p, kTolerance));
  std::printf("[%s] greedy decode-step logits: max|d|/max|ref| = %.3g\n", GetParam().c_str(), worst);
}

TEST_P(Parity, Fp8KvLogits) {
  const Fixture& f = Fixture::get(GetParam());
  model::Model m(f.weights(), model::KvMode::fp8, cpu::context());
  float worst = 0;
  int tight = 0;
  for (int p = 0; p < f.num_prompts(); ++p) {
    const Tensor got = prompt_logits(m, f.ids(p), 0);
    const TensorView want = f.tensor("prompt." + std::to_string(p) + ".logits_fp8kv");
    ASSERT_EQ(want.numel(), got.numel());
    const Diff d = diff(got.data<float>(), want.data_as<const float>(), got.numel());
    worst = std::max(worst, d.rel());
    tight += d.max_abs <= kTolerance * d.ref_max;
    EXPECT_LE(d.max_abs, kFp8FlipTolerance * d.ref_max) << "prompt " << p;
  }
  EXPECT_GE(2 * tight, f.num_prompts()) << "most prompts must match FP8 rounding exactly (within 1e-4)";
  std::printf("[%s] fp8 kv: max|d|/max|ref| = %.3g; %d of %d prompts within 1e-4\n", GetParam().c_str(),
              worst, tight, f.num_prompts());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Parity, ::testing::ValuesIn(Fixture::names()),
                         [](const auto& info) { return info.param == "tiny-mxfp4" ? "mxfp4" : "nvfp4"; });

}  // namespace
}  // namespace tern::test
