// Decode steps replayed from CUDA graphs (model/decode_graphs.h) against the eager forward: for both
// fixtures and both KV modes, sequences of different lengths join and leave between steps, so batches of
// 1..7 run padded to the buckets 1, 2, 4, 8 at positions that cross the window and every compression
// boundary (entries are emitted inside the graphs). Every logit row must be the eager row's bits.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "../model/fixture.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/device_memory.h"
#include "gpu_test_util.h"
#include "model/decode_graphs.h"
#include "model/v4_model.h"
#include "ops/sample.h"

namespace tern::test {
namespace {

struct GpuModel {
  cuda::WeightStore store;
  model::Model model;
  GpuModel(const Fixture& f, model::KvMode mode) : model(f.weights(), mode) {
    model.to_device(Device::cuda, [this](const TensorView& v) { return store.upload(v); });
  }
};

int64_t argmax_row(const float* row, int64_t n) { return ops::argmax({row, static_cast<size_t>(n)}); }

void graphs_match_eager(const Fixture& f, model::KvMode mode,
                        ops::Activations act = ops::Activations::native) {
  GpuModel g(f, mode);
  g.model.set_activations(act);
  const model::ModelConfig& c = g.model.config();
  const int64_t vocab = c.vocab_size;
  const int S = std::min(7, f.num_prompts());
  ASSERT_GE(S, 5) << "the fixture needs prompts enough for batches that need padding";
  constexpr int kSteps = 40;  // decode steps per sequence: crosses the window (16) and every ratio
  std::vector<std::vector<int64_t>> tokens(S);
  std::vector<cache::SequenceState> eager_states, graph_states;
  int64_t capacity = 0;
  for (int k = 0; k < S; ++k) capacity = std::max<int64_t>(capacity, f.ids(k).size() + kSteps + 1);
  for (int k = 0; k < S; ++k) {
    eager_states.push_back(g.model.new_state(capacity));
    graph_states.push_back(g.model.new_state(capacity));
  }
  model::DecodeGraphOptions o;
  o.buckets = {1, 2, 4, 8};
  o.max_tokens = capacity;
  model::DecodeGraphs graphs(g.model, o);
  graphs.prepare();
  ASSERT_EQ(graphs.disabled_reason(), "");
  ASSERT_EQ(graphs.stats().captures, 4u);

  // Sequence k joins at step 3k (its prefill, alone: eager on both sides) and leaves after kSteps - 4k
  // decode steps, so the batch grows to 7 and shrinks again.
  std::vector<int> decoded(S, -1);  // -1: not joined; else decode steps done
  int rows = 0, equal = 0, padded_steps = 0, emits = 0;
  for (int step = 0;; ++step) {
    std::vector<model::StepSequence> eb, gb;
    std::vector<int> who;
    bool any_left = false;
    for (int k = 0; k < S; ++k) {
      const int budget = kSteps - 4 * k;
      if (decoded[k] >= budget) continue;
      any_left = true;
      if (decoded[k] < 0) {
        if (step < 3 * k) continue;
        tokens[k] = f.ids(k);
        const model::StepSequence e{&eager_states[k], tokens[k], model::LogitsFor::last};
        const model::StepSequence gs{&graph_states[k], tokens[k], model::LogitsFor::last};
        const Tensor le = g.model.forward({&e, 1});
        const Tensor lg = graphs.forward({&gs, 1});  // a prefill: eager, counted
        ASSERT_EQ(std::memcmp(le.data<float>(), lg.data<float>(), vocab * sizeof(float)), 0);
        tokens[k].push_back(argmax_row(le.data<float>(), vocab));
        decoded[k] = 0;
        continue;
      }
      const int64_t pos = eager_states[k].position();
      for (int l = 0; l < c.num_layers; ++l) emits += c.compress_ratio(l) > 0 && (pos + 1) % c.compress_ratio(l) == 0;
      eb.push_back({&eager_states[k], std::span<const int64_t>(&tokens[k].back(), 1), model::LogitsFor::last});
      gb.push_back({&graph_states[k], std::span<const int64_t>(&tokens[k].back(), 1), model::LogitsFor::last});
      who.push_back(k);
    }
    if (!any_left) break;
    if (eb.empty()) continue;
    const int64_t B = static_cast<int64_t>(eb.size());
    padded_steps += model::pick_decode_bucket(graphs.buckets(), B) != B;
    const uint64_t before = graphs.stats().graph_steps;
    const Tensor le = g.model.forward(eb);
    const Tensor lg = graphs.forward(gb);
    ASSERT_EQ(graphs.stats().graph_steps, before + 1) << "a decode step of " << B << " did not replay a graph";
    for (int64_t r = 0; r < B; ++r, ++rows) {
      const bool same = std::memcmp(le.data<float>() + r * vocab, lg.data<float>() + r * vocab,
                                    vocab * sizeof(float)) == 0;
      equal += same;
      EXPECT_TRUE(same) << "step " << step << ", batch " << B << ", sequence " << who[r] << " at position "
                        << eager_states[who[r]].position() - 1 << ": max|d| "
                        << diff(lg.data<float>() + r * vocab, le.data<float>() + r * vocab, vocab).max_abs;
    }
    for (int64_t r = 0; r < B; ++r) {
      const int k = who[r];
      ASSERT_EQ(eager_states[k].position(), graph_states[k].position());
      tokens[k].push_back(argmax_row(le.data<float>() + r * vocab, vocab));
      ++decoded[k];
    }
  }
  cuda::register_backend().check_device_errors();
  const model::DecodeGraphStats& st = graphs.stats();
  // A one-token prompt is a decode step (it replays a graph); longer ones are prefills, run eagerly.
  uint64_t prefills = 0;
  for (int k = 0; k < S; ++k) prefills += f.ids(k).size() > 1;
  EXPECT_EQ(st.eager_steps.at("prefill in the step"), prefills);
  EXPECT_EQ(st.eager_total(), prefills);
  EXPECT_GT(padded_steps, 0);
  EXPECT_GT(emits, 0);
  EXPECT_EQ(equal, rows);
  std::printf("[gpu %s, kv %s, activations %s] cuda graphs: %d of %d decode logit rows bit-identical to eager (%llu "
              "graph steps, %d padded, %d compressed entries emitted inside graphs; arena %zu KiB, graphs %zu KiB)\n",
              f.name().c_str(), mode == model::KvMode::fp8 ? "fp8" : "exact",
              std::string(ops::activations_name(act)).c_str(), equal, rows,
              static_cast<unsigned long long>(st.graph_steps), padded_steps, emits, st.arena_bytes >> 10,
              st.graph_bytes >> 10);
}

class GpuGraphs_ : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuGraphs_, ReplayEqualsEager) {
  TERN_REQUIRE_GPU();
  const Fixture& f = Fixture::get(GetParam());
  graphs_match_eager(f, model::KvMode::exact);
  graphs_match_eager(f, model::KvMode::fp8);
  graphs_match_eager(f, model::KvMode::fp8, ops::Activations::fp8);  // what `tern serve` runs on a GPU by default
}

// Decode steps per second, eager forward vs graph replay, at a few batch sizes (printed, not asserted).
// Verify steps (MTP: every sequence k + 1 = 4 tokens, every row's logits) replayed from their own graphs (buckets
// over (sequences, q): DecodeGraphOptions::max_queries) against the eager forward on twin states: batches of 1..3
// padded to the buckets 1, 2, 4, decode steps between them, positions crossing the window and the compression
// boundaries. The same bits, and the graphs (not the eager path) ran the verify steps.
TEST_P(GpuGraphs_, VerifyStepsReplayEqualsEager) {
  TERN_REQUIRE_GPU();
  const Fixture& f = Fixture::get(GetParam());
  for (const model::KvMode mode : {model::KvMode::fp8, model::KvMode::exact}) {
    GpuModel g(f, mode);
    const int64_t vocab = g.model.config().vocab_size, max_tokens = 128, q = 4;
    model::DecodeGraphOptions o;
    o.buckets = {1, 2, 4};
    o.max_tokens = max_tokens;
    o.max_queries = q;
    model::DecodeGraphs graphs(g.model, o);
    graphs.prepare();
    ASSERT_EQ(graphs.disabled_reason(), "");
    std::vector<cache::SequenceState> ge, ee;
    for (int k = 0; k < 3; ++k) ge.push_back(g.model.new_state(max_tokens)), ee.push_back(g.model.new_state(max_tokens));
    for (int step = 0; step < 24; ++step) {
      const int64_t B = 1 + step % 3, n = step % 2 == 0 ? q : 1;  // verify and decode steps in turn
      std::vector<std::vector<int64_t>> ids(static_cast<size_t>(B));
      std::vector<model::StepSequence> a, b;
      for (int64_t k = 0; k < B; ++k)
        for (int64_t t = 0; t < n; ++t) ids[k].push_back((3 + 17 * step + 29 * k + 7 * t) % vocab);
      for (int64_t k = 0; k < B; ++k) {
        const model::LogitsFor want = n > 1 ? model::LogitsFor::all : model::LogitsFor::last;
        a.push_back({&ge[k], ids[k], want});
        b.push_back({&ee[k], ids[k], want});
      }
      const uint64_t graph_steps = graphs.stats().graph_steps;
      const Tensor got = graphs.forward(a), eager = g.model.forward(b);
      EXPECT_EQ(graphs.stats().graph_steps, graph_steps + 1) << "step " << step << " (" << n << " tokens) ran eagerly";
      ASSERT_EQ(got.numel(), eager.numel());
      ASSERT_EQ(std::memcmp(got.data<float>(), eager.data<float>(), got.nbytes()), 0)
          << "kv mode " << static_cast<int>(mode) << " step " << step << " (" << n << " tokens a sequence x " << B << ")";
    }
    // Sequences that took only some steps sit at other positions; the states must still match their twins.
    for (int k = 0; k < 3; ++k) EXPECT_EQ(ge[k].serialize(), ee[k].serialize()) << "sequence " << k;
  }
  cuda::register_backend().check_device_errors();
}

TEST_P(GpuGraphs_, Speed) {
  TERN_REQUIRE_GPU();
  const Fixture& f = Fixture::get(GetParam());
  GpuModel g(f, model::KvMode::fp8);
  constexpr int kSteps = 60;
  const std::vector<int64_t> prompt = f.ids(0);
  const int64_t capacity = static_cast<int64_t>(prompt.size()) + kSteps + 8;
  model::DecodeGraphOptions o;
  o.buckets = {1, 8, 32};
  o.max_tokens = capacity;
  model::DecodeGraphs graphs(g.model, o);
  graphs.prepare();
  ASSERT_EQ(graphs.disabled_reason(), "");
  std::string line;
  for (int64_t B : {1, 8, 32}) {
    double rate[2] = {0, 0};
    for (int use_graphs = 0; use_graphs < 2; ++use_graphs) {
      std::vector<cache::SequenceState> states;
      for (int64_t k = 0; k < B; ++k) states.push_back(g.model.new_state(capacity));
      std::vector<model::StepSequence> batch;
      for (auto& s : states) batch.push_back({&s, prompt, model::LogitsFor::last});
      g.model.forward(batch);
      const int64_t tok = 1;
      for (auto& b : batch) b.tokens = std::span<const int64_t>(&tok, 1);
      g.model.forward(batch);  // warm
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kSteps; ++i) {
        if (use_graphs) graphs.forward(batch);
        else g.model.forward(batch);
      }
      rate[use_graphs] = kSteps / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    line += cat(" batch ", B, ": eager ", static_cast<int>(rate[0]), " steps/s, graph ", static_cast<int>(rate[1]),
                " steps/s;");
  }
  std::printf("[gpu %s, kv fp8] decode speed:%s\n", f.name().c_str(), line.c_str());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuGraphs_, ::testing::ValuesIn(Fixture::names()),
                         [](const auto& info) { return info.param == "tiny-mxfp4" ? "mxfp4" : "nvfp4"; });

}  // namespace
}  // namespace tern::test
