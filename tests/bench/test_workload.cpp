#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "bench/arrivals.h"
#include "bench/codec.h"
#include "bench/workload.h"
#include "core/error.h"

namespace tern::bench {
namespace {

TEST(Workload, RangeSemanticsOfSglangAndVllm) {
  EXPECT_EQ(length_range(1000, 0.0, RangeSemantics::sglang), std::make_pair(1, 1000));
  EXPECT_EQ(length_range(1000, 0.5, RangeSemantics::sglang), std::make_pair(500, 1000));
  EXPECT_EQ(length_range(1000, 1.0, RangeSemantics::sglang), std::make_pair(1000, 1000));
  EXPECT_EQ(length_range(1000, 0.0, RangeSemantics::vllm), std::make_pair(1000, 1000));
  EXPECT_EQ(length_range(1000, 0.5, RangeSemantics::vllm), std::make_pair(500, 1500));
}

TEST(Workload, RandomPromptsHaveExactLengthsAndRespectTheRange) {
  auto codec = make_synthetic_codec(5000);
  WorkloadSpec s;
  s.num_prompts = 200, s.input_len = 64, s.output_len = 32, s.range_ratio = 0.25;
  s.semantics = RangeSemantics::vllm;
  auto reqs = build_workload(s, *codec);
  ASSERT_EQ(reqs.size(), 200u);
  int min_in = 1 << 30, max_in = 0;
  for (const auto& r : reqs) {
    EXPECT_EQ(static_cast<int>(codec->encode(r.prompt).size()), r.input_len);
    min_in = std::min(min_in, r.input_len), max_in = std::max(max_in, r.input_len);
    EXPECT_GE(r.output_len, 24);
    EXPECT_LE(r.output_len, 40);
  }
  EXPECT_GE(min_in, 48);
  EXPECT_LE(max_in, 80);
  EXPECT_LT(min_in, 56);  // the range is actually used
  EXPECT_GT(max_in, 72);
  EXPECT_NE(describe(s).find("vllm range semantics"), std::string::npos);
}

TEST(Workload, SameSeedSameWorkloadOtherSeedOther) {
  auto codec = make_synthetic_codec();
  WorkloadSpec s;
  s.num_prompts = 5, s.input_len = 16, s.output_len = 8;
  auto a = build_workload(s, *codec), b = build_workload(s, *codec);
  s.seed = 2;
  auto c = build_workload(s, *codec);
  EXPECT_EQ(a[3].prompt, b[3].prompt);
  EXPECT_NE(a[3].prompt, c[3].prompt);
}

TEST(Workload, RandomIdsAreSentAsIds) {
  auto codec = make_synthetic_codec(100);
  WorkloadSpec s;
  s.dataset = DatasetKind::random_ids, s.num_prompts = 3, s.input_len = 10, s.range_ratio = 1.0;
  for (const auto& r : build_workload(s, *codec)) {
    EXPECT_EQ(r.prompt_ids.size(), 10u);
    EXPECT_EQ(r.input_len, 10);
    for (TokenId id : r.prompt_ids) EXPECT_LT(id, 100);
  }
}

std::string write_temp(const std::string& name, const std::string& text) {
  auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path) << text;
  return path.string();
}

TEST(Workload, ShareGptTakesFirstTurnAndSecondTurnLength) {
  std::string path = write_temp("tern_bench_sharegpt.json", R"([
    {"conversations": [{"from": "human", "value": "ba ca da"}, {"from": "gpt", "value": "x y z w"}]},
    {"conversations": [{"from": "human", "value": "only one turn"}]},
    {"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "too short prompt"}]},
    {"id": "no conversations"}])");
  auto codec = make_synthetic_codec();
  WorkloadSpec s;
  s.dataset = DatasetKind::sharegpt, s.path = path, s.num_prompts = 10;
  auto reqs = build_workload(s, *codec);
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0].prompt, "ba ca da");
  EXPECT_EQ(reqs[0].input_len, 3);
  EXPECT_EQ(reqs[0].output_len, 4);
  s.sharegpt_output_len = 50;
  EXPECT_EQ(build_workload(s, *codec)[0].output_len, 50);
  s.path = write_temp("tern_bench_bad.json", "{oops");
  EXPECT_THROW(build_workload(s, *codec), Error);
}

TEST(Workload, PromptFileCyclesLinesAndReadsJsonLines) {
  std::string path = write_temp("tern_bench_prompts.txt", "first prompt\n{\"prompt\": \"second one here\"}\n\n");
  auto codec = make_synthetic_codec();
  WorkloadSpec s;
  s.dataset = DatasetKind::prompt_file, s.path = path, s.num_prompts = 5, s.output_len = 12;
  auto reqs = build_workload(s, *codec);
  ASSERT_EQ(reqs.size(), 5u);
  EXPECT_EQ(reqs[1].prompt, "second one here");
  EXPECT_EQ(reqs[2].prompt, "first prompt");
  EXPECT_EQ(reqs[1].input_len, 3);
  EXPECT_EQ(reqs[4].output_len, 12);
}

TEST(Codec, SyntheticRoundTrips) {
  auto codec = make_synthetic_codec(1000);
  std::vector<TokenId> ids = {0, 1, 13, 14, 999, 500};
  EXPECT_EQ(codec->encode(codec->decode(ids)), ids);
}

TEST(Arrivals, InfiniteRateSendsAllAtOnce) {
  auto offsets = arrival_offsets({}, 4);
  EXPECT_EQ(offsets, std::vector<double>(4, 0.0));
}

TEST(Arrivals, PoissonAndGammaHaveTheRequestedMeanRate) {
  for (double burstiness : {1.0, 0.5, 4.0}) {
    ArrivalSpec spec{20.0, burstiness, 7};
    auto t = arrival_offsets(spec, 20001);
    EXPECT_EQ(t[0], 0);
    double mean_gap = t.back() / 20000;
    EXPECT_NEAR(mean_gap, 0.05, 0.05 * 0.05) << "burstiness " << burstiness;
    // Coefficient of variation of gamma gaps is 1/sqrt(shape).
    double sq = 0;
    for (std::size_t i = 1; i < t.size(); ++i) sq += std::pow(t[i] - t[i - 1] - mean_gap, 2);
    double cv = std::sqrt(sq / 20000) / mean_gap;
    EXPECT_NEAR(cv, 1 / std::sqrt(burstiness), 0.1) << "burstiness " << burstiness;
  }
  EXPECT_THROW(arrival_offsets({0.0, 1.0, 1}, 3), Error);
}

}  // namespace
}  // namespace tern::bench
