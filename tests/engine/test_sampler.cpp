#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <map>

#include "engine/sampler.h"
#include "engine/text_stream.h"

namespace tern::engine {
namespace {

std::vector<float> logits_of(std::vector<float> v) { return v; }

SampleResult run(const std::vector<float>& logits, SamplingParams p, uint64_t seed = 1) {
  Sampler s;
  TokenHistory h;
  std::mt19937_64 rng(seed);
  return s.sample(logits, p, h, rng);
}

TEST(Sampler, GreedyPicksTheLargestLowestIndexOnTies) {
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(run({0.1f, 3.0f, 3.0f, -1.0f}, p).token, 1);
  p.temperature = 1;
  p.top_k = 1;
  EXPECT_EQ(run({0.1f, 3.0f, 3.5f, -1.0f}, p).token, 2);
}

TEST(Sampler, SameSeedSameTokens) {
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i)) * 3;
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.top_k = 50;
  Sampler s;
  TokenHistory h;
  std::mt19937_64 a(42), b(42), c(43);
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 50; ++i) {
    ta.push_back(s.sample(logits, p, h, a).token);
    tb.push_back(s.sample(logits, p, h, b).token);
    tc.push_back(s.sample(logits, p, h, c).token);
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(Sampler, TemperatureOneFollowsTheSoftmax) {
  const std::vector<float> logits{std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  SamplingParams p;
  Sampler s;
  TokenHistory h;
  std::mt19937_64 rng(7);
  std::map<int32_t, int> hist;
  const int n = 20000;
  for (int i = 0; i < n; ++i) hist[s.sample(logits, p, h, rng).token]++;
  EXPECT_NEAR(hist[0] / double(n), 0.5, 0.02);
  EXPECT_NEAR(hist[1] / double(n), 0.3, 0.02);
  EXPECT_NEAR(hist[2] / double(n), 0.2, 0.02);
}

TEST(Sampler, TopKTopPAndMinPRestrictTheCandidates) {
  const std::vector<float> logits{std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.1f)};
  for (uint64_t seed = 0; seed < 200; ++seed) {
    SamplingParams p;
    p.top_k = 2;
    EXPECT_LT(run(logits, p, seed).token, 2);
    p = {};
    p.top_p = 0.65f;  // 0.4 + 0.3 covers it
    EXPECT_LT(run(logits, p, seed).token, 2);
    p = {};
    p.min_p = 0.6f;  // keeps p >= 0.24
    EXPECT_LT(run(logits, p, seed).token, 2);
    p = {};
    p.top_p = 0.01f;  // the best token always stays
    EXPECT_EQ(run(logits, p, seed).token, 0);
  }
}

TEST(Sampler, PenaltiesPushRepeatedTokensDown) {
  const std::vector<float> logits{2.0f, 1.9f, 0.0f};
  SamplingParams p;
  p.temperature = 0;
  Sampler s;
  TokenHistory h;
  std::mt19937_64 rng(1);
  h.add_output(0, 3);
  p.presence_penalty = 0.5f;
  EXPECT_EQ(s.sample(logits, p, h, rng).token, 1);
  p.presence_penalty = 0;
  p.frequency_penalty = 0.05f;
  EXPECT_EQ(s.sample(logits, p, h, rng).token, 0);  // 2.0 - 0.05 > 1.9
  h.add_output(0, 3);
  h.add_output(0, 3);
  EXPECT_EQ(s.sample(logits, p, h, rng).token, 1);  // 2.0 - 0.15 < 1.9
  p.frequency_penalty = 0;
  p.repetition_penalty = 1.2f;
  EXPECT_EQ(s.sample(logits, p, h, rng).token, 1);  // 2.0 / 1.2 < 1.9
}

TEST(Sampler, LogprobsAreTheRawLogSoftmax) {
  const std::vector<float> logits{1.0f, 2.0f, 3.0f};
  SamplingParams p;
  p.temperature = 0;
  p.top_logprobs = 2;
  const auto r = run(logits, p);
  const double z = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  EXPECT_EQ(r.token, 2);
  EXPECT_NEAR(r.logprob, 3.0 - z, 1e-5);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].token, 2);
  EXPECT_EQ(r.top[1].token, 1);
  EXPECT_NEAR(r.top[1].logprob, 2.0 - z, 1e-5);
}

std::string push_all(TextStream& ts, const std::vector<std::string>& pieces, bool* stopped) {
  std::string out;
  for (const auto& p : pieces) {
    out += ts.push(p, stopped);
    if (*stopped) return out;
  }
  return out + ts.finish();
}

TEST(TextStream, StopStringAcrossTokensIsRemoved) {
  TextStream ts({"STOP"});
  bool stopped = false;
  EXPECT_EQ(ts.push("abc S", &stopped), "abc ");  // "S" held back
  EXPECT_EQ(ts.push("T", &stopped), "");
  EXPECT_EQ(ts.push("OPxyz", &stopped), "");
  EXPECT_TRUE(stopped);
}

TEST(TextStream, HeldBytesAreReleasedWhenTheStopDoesNotMatch) {
  TextStream ts({"STOP", "\n\n"});
  bool stopped = false;
  EXPECT_EQ(push_all(ts, {"a ST", "Ox", "\n", "b"}, &stopped), "a STOx\nb");
  EXPECT_FALSE(stopped);
  TextStream ts2({"ab"});
  EXPECT_EQ(push_all(ts2, {"xa"}, &stopped), "xa");  // released at the end
}

TEST(TextStream, EarliestStopWins) {
  TextStream ts({"world", "lo w"});
  bool stopped = false;
  EXPECT_EQ(push_all(ts, {"hello world"}, &stopped), "hel");
  EXPECT_TRUE(stopped);
}

TEST(TextStream, Utf8SplitAcrossTokensIsHeldThenReleasedWhole) {
  TextStream ts;
  bool stopped = false;
  const std::string euro = "\xE2\x82\xAC";
  EXPECT_EQ(ts.push(euro.substr(0, 1), &stopped), "");
  EXPECT_EQ(ts.push(euro.substr(1, 1), &stopped), "");
  EXPECT_EQ(ts.push(euro.substr(2) + "x", &stopped), euro + "x");
}

TEST(TextStream, InvalidBytesBecomeReplacementCharacters) {
  TextStream ts;
  bool stopped = false;
  EXPECT_EQ(ts.push("a\x80" "b\xC0\xAF", &stopped), "a\xEF\xBF\xBD" "b\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(ts.push("\xE2\x82", &stopped), "");
  EXPECT_EQ(ts.finish(), "\xEF\xBF\xBD");
  EXPECT_EQ(sanitize_utf8("\xED\xA0\x80", true), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
}

}  // namespace
}  // namespace tern::engine

// ---- the host side of device sampling ----

#include "ops/sampling.h"
#include "ops/sampling_math.h"

namespace tern::engine {
namespace {

TEST(SamplerUniforms, GreedyDrawsNoneOthersOneAndSampleEqualsDrawPlusSampleDrawn) {
  SamplingParams greedy;
  greedy.temperature = 0;
  SamplingParams topk1;
  topk1.top_k = 1;
  SamplingParams hot;
  hot.temperature = 0.9f;
  hot.top_p = 0.8f;
  EXPECT_EQ(uniforms_per_sample(greedy), 0);
  EXPECT_EQ(uniforms_per_sample(topk1), 0);
  EXPECT_EQ(uniforms_per_sample(hot), 1);
  std::vector<float> logits(3000);
  std::mt19937_64 g(3);
  for (auto& l : logits) l = std::normal_distribution<float>(0.0f, 2.0f)(g);
  TokenHistory h;
  Sampler a, b;
  for (const SamplingParams& p : {greedy, topk1, hot}) {
    for (int i = 0; i < 20; ++i) {
      std::mt19937_64 r1(100 + i), r2(100 + i);
      const SampleResult x = a.sample(logits, p, h, r1);
      double u[kMaxUniformsPerSample];
      const int n = draw_uniforms(p, r2, u);
      const SampleResult y = b.sample_drawn(logits, p, h, std::span<const double>(u, static_cast<size_t>(n)));
      EXPECT_EQ(x.token, y.token);
      EXPECT_TRUE(r1 == r2);
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("fma"))) float exp_fma(float x) { return sampling::exp_weight(x); }
#endif

// The shared exp is glibc's expf bit for bit where glibc uses its FMA build (x86-64 with FMA), so the
// host sampler's weights did not change when it moved to the shared function. (An exhaustive run over
// every float in [-110, 0] found no difference; here a sample.)
TEST(SamplingMath, ExpWeightIsGlibcExpf) {
#if defined(__x86_64__) && defined(__GNUC__) && defined(__GLIBC__)
  if (!__builtin_cpu_supports("fma")) GTEST_SKIP() << "glibc's non-FMA expf build";
  std::mt19937_64 g(11);
  for (int i = 0; i < 2000000; ++i) {
    const uint32_t bits = 0x80000000u | static_cast<uint32_t>(g() % 0x42E00000u);  // [-112, -0]
    float x;
    std::memcpy(&x, &bits, 4);
    const float a = exp_fma(x), b = std::exp(x);
    ASSERT_EQ(std::memcmp(&a, &b, 4), 0) << x;
    ASSERT_EQ(sampling::exp_weight(x), a) << x;  // the libm-fma path of a non-FMA build agrees
  }
  EXPECT_EQ(sampling::exp_weight(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(sampling::exp_weight(0.0f), 1.0f);
#else
  GTEST_SKIP() << "not x86-64 glibc";
#endif
}

TEST(SamplingMath, KeysOrderLikeTheHostSampler) {
  using sampling::candidate_key;
  using sampling::logit_key;
  EXPECT_GT(candidate_key(0.5f, 7), candidate_key(0.25f, 1));
  EXPECT_GT(candidate_key(0.5f, 3), candidate_key(0.5f, 7));  // ties: the lower index first
  EXPECT_GT(candidate_key(0.0f, 3), candidate_key(0.0f, 4));
  EXPECT_EQ(sampling::key_index(candidate_key(0.5f, 123456)), 123456u);
  EXPECT_EQ(sampling::key_weight(candidate_key(0.5f, 123456)), 0.5f);
  EXPECT_GT(logit_key(-1.0f, 9), logit_key(-2.0f, 1));
  EXPECT_GT(logit_key(1.0f, 9), logit_key(-1.0f, 1));
  EXPECT_GT(logit_key(-0.0f, 1), logit_key(0.0f, 2));  // -0 == +0: the lower index first
  EXPECT_GT(logit_key(-1e30f, 5), logit_key(std::nanf(""), 0));
}

TEST(SampleRowsPacking, LayoutHistoriesAndChecks) {
  const int32_t seen0[] = {9, 2, 5, -1, 200};  // out of range ids are dropped
  const std::pair<int32_t, int32_t> counts0[] = {{7, 3}, {2, 1}, {500, 2}};
  std::vector<ops::SampleRowSpec> specs(3);
  specs[0].params.repetition = 1.2f;
  specs[0].params.presence = 0.5f;
  specs[0].params.uniform = 0.25;
  specs[0].seen = seen0;
  specs[0].output_counts = counts0;
  specs[1].params.temperature = 0;  // greedy, no penalties: nothing packed even with a history
  specs[1].seen = seen0;
  specs[1].output_counts = counts0;
  specs[2].params.frequency = 1.0f;
  specs[2].output_counts = counts0;
  std::vector<uint8_t> buf;
  ops::pack_sample_rows(specs, 100, buf);
  ASSERT_EQ(buf.size(), 3 * sizeof(ops::SampleRowDesc) + (3 + 4 + 4) * sizeof(int32_t));
  std::vector<ops::SampleRowDesc> d(3);
  std::memcpy(d.data(), buf.data(), 3 * sizeof(ops::SampleRowDesc));
  std::vector<int32_t> ids((buf.size() - 3 * sizeof(ops::SampleRowDesc)) / 4);
  std::memcpy(ids.data(), buf.data() + 3 * sizeof(ops::SampleRowDesc), ids.size() * 4);
  EXPECT_EQ(d[0].uniform, 0.25);
  EXPECT_EQ(d[0].seen_offset, 0);
  EXPECT_EQ(d[0].seen_count, 3);
  EXPECT_EQ(d[0].counts_offset, 3);
  EXPECT_EQ(d[0].counts_count, 2);
  EXPECT_EQ(d[1].seen_count, 0);
  EXPECT_EQ(d[1].counts_count, 0);
  EXPECT_EQ(d[2].seen_count, 0);
  EXPECT_EQ(d[2].counts_offset, 7);
  EXPECT_EQ(d[2].counts_count, 2);
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 5, 9, 2, 1, 7, 3, 2, 1, 7, 3}));
  // Checks: repeated ids, too many top logprobs, a uniform outside [0, 1).
  const int32_t twice[] = {4, 4};
  std::vector<ops::SampleRowSpec> bad(1);
  bad[0].params.repetition = 1.1f;
  bad[0].seen = twice;
  EXPECT_THROW(ops::pack_sample_rows(bad, 100, buf), std::exception);
  bad[0].seen = {};
  bad[0].params.top_logprobs = 21;
  EXPECT_THROW(ops::pack_sample_rows(bad, 100, buf), std::exception);
  bad[0].params.top_logprobs = 0;
  bad[0].params.uniform = 1.0;
  EXPECT_THROW(ops::pack_sample_rows(bad, 100, buf), std::exception);
}

}  // namespace
}  // namespace tern::engine
