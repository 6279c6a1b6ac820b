#include <gtest/gtest.h>

#include <cmath>
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
