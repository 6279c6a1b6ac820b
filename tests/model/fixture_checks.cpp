#include "fixture_checks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <span>
#include <vector>

#include "ops/sample.h"

namespace tern::test {
namespace {

int64_t argmax_row(const float* row, int64_t n) {
  return ops::argmax({row, static_cast<size_t>(n)});
}

// top-1 minus top-2 of a row.
float margin(const float* row, int64_t n) {
  float a = -INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (row[i] > a) {
      b = a;
      a = row[i];
    } else if (row[i] > b) {
      b = row[i];
    }
  }
  return a - b;
}

const char* judged(bool judge) {
  return judge ? "" : " (reported, not judged)";
}

}  // namespace

void check_teacher_forced(model::Model& m, Device device, const Fixture& f, const std::string& set, bool judge,
                          const std::string& who) {
  const int64_t vocab = m.config().vocab_size;
  float worst = 0;
  int64_t positions = 0, agree = 0;
  const int n = f.num_prompts(set);
  for (int p = 0; p < n; ++p) {
    const std::vector<int64_t> ids = f.ids(p, set);
    cache::SequenceState state = m.new_state(static_cast<int64_t>(ids.size()) + 1);
    ASSERT_EQ(state.device(), device);
    const model::StepSequence s{&state, ids, model::LogitsFor::all};
    const Tensor got = m.forward({&s, 1});
    const TensorView want = f.tensor(set + "." + std::to_string(p) + ".logits");
    ASSERT_EQ(want.numel(), got.numel());
    const Diff d = diff(got.data<float>(), want.data_as<const float>(), got.numel());
    worst = std::max(worst, d.rel());
    if (judge) {
      EXPECT_LE(d.max_abs, kBf16Tolerance * d.ref_max) << who << " " << set << " " << p << " (length " << ids.size()
                                                       << ")";
    }
    for (int64_t t = 0; t < static_cast<int64_t>(ids.size()); ++t, ++positions)
      agree += argmax_row(got.data<float>() + t * vocab, vocab) ==
               argmax_row(want.data_as<const float>() + t * vocab, vocab);
  }
  const double top1 = static_cast<double>(agree) / static_cast<double>(positions);
  if (judge) {
    EXPECT_GE(top1, kBf16Top1) << who << " " << set;
  }
  std::printf("[%s %s] teacher-forced logits, %s set%s: max|d|/max|ref| = %.3g over %d prompts; top-1 "
              "%lld/%lld = %.4f\n",
              who.c_str(), f.name().c_str(), set.c_str(), judged(judge), worst, n, static_cast<long long>(agree),
              static_cast<long long>(positions), top1);
}

void check_greedy(model::Model& m, Device device, const Fixture& f, const std::string& set, bool judge,
                  const std::string& who) {
  const int64_t vocab = m.config().vocab_size;
  float worst = 0;
  int equal = 0, parted = 0;
  int64_t steps = 0, steps_within = 0;
  const int n = f.num_prompts(set);
  for (int p = 0; p < n; ++p) {
    const std::vector<int64_t> ids = f.ids(p, set), want = f.greedy(p, set);
    const TensorView step_logits = f.tensor(set + "." + std::to_string(p) + ".greedy_logits");
    cache::SequenceState state = m.new_state(static_cast<int64_t>(ids.size() + want.size()));
    ASSERT_EQ(state.device(), device);
    std::vector<int64_t> got;
    bool parts = false;
    for (size_t step = 0; step < want.size(); ++step) {
      const std::span<const int64_t> tokens =
          step == 0 ? std::span<const int64_t>(ids) : std::span<const int64_t>(&got.back(), 1);
      const model::StepSequence s{&state, tokens, model::LogitsFor::last};
      const Tensor logits = m.forward({&s, 1});
      got.push_back(argmax_row(logits.data<float>(), vocab));
      // The same tokens so far (the loop stops at the first difference), so the reference's step logits
      // are those of this very sequence: judged like one teacher-forced row, against that row's max|ref|.
      const float* ref = step_logits.empty() ? nullptr : step_logits.data_as<const float>() + step * vocab;
      const Diff d = ref ? diff(logits.data<float>(), ref, vocab) : Diff{};
      worst = std::max(worst, d.rel());
      if (ref) {
        ++steps;
        if (d.max_abs <= kBf16Tolerance * d.ref_max) ++steps_within;
        else
          std::printf("[%s %s] %s %d step %zu: logits max|d|/max|ref| = %.3g (same token)\n", who.c_str(),
                      f.name().c_str(), set.c_str(), p, step, d.rel());
      }
      if (got.back() != want[step]) {
        const float mg = ref ? margin(ref, vocab) : -1.0f;
        if (judge)
          ADD_FAILURE() << who << " " << set << " " << p << " step " << step << ": picked " << got.back()
                        << ", reference " << want[step] << " (reference margin " << mg << ", max|d| " << d.max_abs
                        << ")";
        std::printf("[%s %s] %s %d parts at step %zu: reference margin %.3g, max|d| %.3g\n", who.c_str(),
                    f.name().c_str(), set.c_str(), p, step, mg, d.max_abs);
        parts = true;
        break;  // the continuations differ from here on
      }
    }
    equal += !parts;
    parted += parts;
  }
  // Like the teacher-forced top-1 rule: a rare routing or indexer near-tie that flips without changing the
  // token moves one step's logits past the bound (the reference's own two bf16 runs differ by that much);
  // the steps within the bound must be at least kBf16Top1 of all.
  const double within = steps > 0 ? static_cast<double>(steps_within) / static_cast<double>(steps) : 1.0;
  if (judge) {
    EXPECT_GE(within, kBf16Top1) << who << " " << set << ": greedy steps with logits within the bound";
  }
  std::printf("[%s %s] greedy %zu-token continuations, %s set%s: %d of %d equal, %d part; step logits within "
              "%.0e*max|ref|: %lld/%lld steps, worst max|d|/max|ref| = %.3g\n",
              who.c_str(), f.name().c_str(), f.greedy(0, set).size(), set.c_str(), judged(judge), equal, n, parted,
              static_cast<double>(kBf16Tolerance), static_cast<long long>(steps_within), static_cast<long long>(steps),
              worst);
}

void print_bf16_set_gaps(const Fixture& f, const std::string& who) {
  const TensorView router = f.tensor("bf16.min_router_gap"), indexer = f.tensor("bf16.min_indexer_rel_gap");
  ASSERT_FALSE(router.empty() || indexer.empty()) << f.name() << ": no bf16.min_*_gap (regenerate the fixtures)";
  std::printf("[%s %s] bf16 set: the reference's bf16-x runs' smallest router top-k gap %.3g, indexer top-k gap "
              "%.3g of max|score|\n",
              who.c_str(), f.name().c_str(), router.data_as<const float>()[0], indexer.data_as<const float>()[0]);
}

namespace {
// `steps` steps of B sequences on both models, sequence k bringing q_of(step, k) tokens: every token's logits the same
// bits (LogitsFor::all), then the final states (serialized). `what` names the run in failures.
void compare_twin_steps(model::Model& tables, model::Model& chunks, int64_t B, int64_t max_tokens, int steps,
                        const std::function<int64_t(int, int64_t)>& q_of, const std::string& what) {
  const int64_t vocab = tables.config().vocab_size;
  std::vector<cache::SequenceState> st, sc;
  for (int64_t k = 0; k < B; ++k) st.push_back(tables.new_state(max_tokens)), sc.push_back(chunks.new_state(max_tokens));
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<int64_t>> ids(static_cast<size_t>(B));
    std::vector<model::StepSequence> a, b;
    for (int64_t k = 0; k < B; ++k)
      for (int64_t t = 0; t < q_of(step, k); ++t) ids[k].push_back((7 + 31 * step + 13 * k + 5 * t) % vocab);
    for (int64_t k = 0; k < B; ++k) {
      a.push_back({&st[k], ids[k], model::LogitsFor::all});
      b.push_back({&sc[k], ids[k], model::LogitsFor::all});
    }
    const Tensor got = tables.forward(a), want = chunks.forward(b);
    ASSERT_EQ(got.numel(), want.numel());
    ASSERT_EQ(std::memcmp(got.data<float>(), want.data<float>(), got.nbytes()), 0)
        << what << " step " << step << ": the step tables' logits differ from the chunk path's";
  }
  for (int64_t k = 0; k < B; ++k) {
    EXPECT_EQ(st[k].position(), sc[k].position());
    EXPECT_EQ(st[k].serialize(), sc[k].serialize()) << what << " sequence " << k << ": states differ";
  }
}
}  // namespace

void check_step_tables_match_chunks(model::Model& tables, model::Model& chunks, const std::string& what) {
  // 1..4 tokens, each sequence on its own cycle
  compare_twin_steps(tables, chunks, 3, 96, 24, [](int step, int64_t k) {
    return 1 + (step + k * 2 + step / 3) % model::Model::kMaxStepQueries;
  }, what);
}

void check_mixed_steps_match_chunks(model::Model& tables, model::Model& chunks, const std::string& what) {
  const model::Model::StepPaths before = tables.step_paths();
  // Sequence 0 (first in the batch, so the tables' rows come after it in its order) brings prefill-sized chunks in
  // most steps; the others 1..4 tokens, and now and then 5..7 (past the tables' bound: per sequence too).
  compare_twin_steps(tables, chunks, 4, 160, 16, [](int step, int64_t k) -> int64_t {
    static constexpr int64_t kLong[] = {9, 1, 17, 3, 6, 12, 2, 5};
    if (k == 0) return kLong[step % 8];
    if (k == 2 && step % 5 == 4) return 5 + step % 3;
    return 1 + (step + k * 2 + step / 3) % model::Model::kMaxStepQueries;
  }, what);
  // The steps did mix: some tokens ran on the tables and some per sequence in one step (12 of the 16 steps).
  const model::Model::StepPaths& after = tables.step_paths();
  EXPECT_EQ(after.mixed_steps - before.mixed_steps, 12) << what;
  EXPECT_GT(after.table_tokens, before.table_tokens) << what;
  EXPECT_GT(after.chunk_tokens, before.chunk_tokens) << what;
  EXPECT_EQ(chunks.step_paths().table_tokens, 0) << what << ": the chunk model ran tokens on the tables";
}

float check_greedy_exact(model::Model& m, const Fixture& f, int p, float tolerance) {
  const std::vector<int64_t> ids = f.ids(p), want = f.greedy(p);
  const TensorView step_logits = f.tensor("prompt." + std::to_string(p) + ".greedy_logits");
  const int64_t vocab = m.config().vocab_size;
  cache::SequenceState state = m.new_state(static_cast<int64_t>(ids.size() + want.size()));
  std::vector<int64_t> got;
  float worst = 0;
  for (size_t step = 0; step < want.size(); ++step) {
    const std::span<const int64_t> tokens =
        step == 0 ? std::span<const int64_t>(ids) : std::span<const int64_t>(&got.back(), 1);
    const model::StepSequence s{&state, tokens, model::LogitsFor::last};
    const Tensor logits = m.forward({&s, 1});
    got.push_back(ops::argmax({logits.data<float>(), static_cast<size_t>(vocab)}));
    if (step_logits.empty()) continue;
    const Diff d = diff(logits.data<float>(), step_logits.data_as<const float>() + step * vocab, vocab);
    worst = std::max(worst, d.rel());
    EXPECT_LE(d.max_abs, tolerance * d.ref_max) << f.name() << " prompt " << p << " step " << step;
  }
  EXPECT_EQ(got, want) << f.name() << " prompt " << p;
  return worst;
}

}  // namespace tern::test
