// Decode steps replayed from CUDA graphs (engine/decode_graphs.h) against the eager forward: for both
// fixtures and both KV modes, sequences of different lengths join and leave between steps, so batches of
// 1..7 run padded to the buckets 1, 2, 4, 8 at positions that cross the window and every compression
// boundary (entries are emitted inside the graphs). Every logit row must be the eager row's bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "../model/fixture.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/device_memory.h"
#include "engine/decode_graphs.h"
#include "gpu_test_util.h"
#include "model/speculator.h"
#include "model/v4_model.h"
#include "ops/sample.h"

namespace tern::test {
namespace {

struct GpuModel {
  cuda::WeightStore store;
  model::Model model;
  GpuModel(const Fixture& f, model::KvMode mode) : model(f.weights(), mode, cpu::context()) {
    model.to_device(Device::cuda, [this](const TensorView& v) { return store.upload(v); });
    model.set_context(cuda::context());
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
  engine::DecodeGraphOptions o;
  o.buckets = {1, 2, 4, 8};
  o.max_tokens = capacity;
  engine::DecodeGraphs graphs(g.model, o);
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
    padded_steps += engine::pick_decode_bucket(graphs.buckets(), B) != B;
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
  const engine::DecodeGraphStats& st = graphs.stats();
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

// Graphs of batch buckets 1, 2 and 4 (batches of 3 run padded), verify steps of up to q tokens a sequence.
engine::DecodeGraphOptions small_buckets(int64_t max_tokens, int64_t q) {
  engine::DecodeGraphOptions o;
  o.buckets = {1, 2, 4};
  o.max_tokens = max_tokens;
  o.max_queries = q;
  return o;
}

class GpuGraphs_ : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuGraphs_, ReplayEqualsEager) {
  TERN_REQUIRE_GPU();
  const Fixture& f = Fixture::get(GetParam());
  graphs_match_eager(f, model::KvMode::exact);
  graphs_match_eager(f, model::KvMode::fp8);
  graphs_match_eager(f, model::KvMode::fp8, ops::Activations::fp8);  // what `tern serve` runs on a GPU by default
  // The lanes' stream priorities kept in the graphs' nodes (TERN_BRANCH_PRIORITY): a schedule, never other bits.
  {
    const gputest::KnobGuard lanes("TERN_BRANCH_PRIORITY", 0);  // (on by default: the other setting too)
    graphs_match_eager(f, model::KvMode::fp8, ops::Activations::fp8);
  }
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
    engine::DecodeGraphs graphs(g.model, small_buckets(max_tokens, q));
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

// Whether a recorded step reads an arena byte nobody wrote in that replay (a read before write, or a block reused
// within the step whose new owner reads what the old one left): decode and verify steps replayed from graphs
// recorded with the activations zero-filled, then recorded again with them filled with NaN bytes (a reused block that
// asks for a fill gets it where it is allocated), must give the same logits bit for bit, and finite ones.
TEST_P(GpuGraphs_, ReplayIgnoresActivationFill) {
  TERN_REQUIRE_GPU();
  const Fixture& f = Fixture::get(GetParam());
  GpuModel g(f, model::KvMode::fp8);
  const int64_t vocab = g.model.config().vocab_size, max_tokens = 128, q = 4;
  auto run = [&](bool poison) {
    cuda::CudaBackend::set_activation_fill(poison ? cuda::CudaBackend::ActivationFill::poison
                                                  : cuda::CudaBackend::ActivationFill::zero);
    engine::DecodeGraphs graphs(g.model, small_buckets(max_tokens, q));
    graphs.prepare();
    EXPECT_EQ(graphs.disabled_reason(), "");
    std::vector<cache::SequenceState> states;
    for (int k = 0; k < 3; ++k) states.push_back(g.model.new_state(max_tokens));
    std::vector<Tensor> out;
    for (int step = 0; step < 12; ++step) {
      const int64_t B = 1 + step % 3, n = step % 2 == 0 ? q : 1;
      std::vector<std::vector<int64_t>> ids(static_cast<size_t>(B));
      std::vector<model::StepSequence> batch;
      for (int64_t k = 0; k < B; ++k) {
        for (int64_t t = 0; t < n; ++t) ids[k].push_back((5 + 13 * step + 31 * k + 3 * t) % vocab);
        batch.push_back({&states[k], ids[k], n > 1 ? model::LogitsFor::all : model::LogitsFor::last});
      }
      out.push_back(graphs.forward(batch));
    }
    EXPECT_EQ(graphs.stats().eager_total(), 0u) << "a step ran eagerly";
    return out;
  };
  const std::vector<Tensor> zeroed = run(false), poisoned = run(true);
  cuda::CudaBackend::set_activation_fill(cuda::CudaBackend::ActivationFill::none);
  ASSERT_EQ(zeroed.size(), poisoned.size());
  for (size_t i = 0; i < zeroed.size(); ++i) {
    const float* z = zeroed[i].data<float>();
    EXPECT_TRUE(std::all_of(z, z + zeroed[i].numel(), [](float v) { return std::isfinite(v); })) << "step " << i;
    EXPECT_EQ(std::memcmp(z, poisoned[i].data<float>(), zeroed[i].nbytes()), 0)
        << "step " << i << ": a replay's logits depend on the activation fill";
  }
  cuda::register_backend().check_device_errors();
}

// Drafting rounds (the MTP rows, one a sequence) replayed from their own graphs (DecodeGraphs::forward_mtp as the
// Speculator's draft step; its trunk steps on the graphs too, as the server's) against eager Model::mtp_forward and
// Model::forward on twin states: batches of 1..3 padded to the buckets 1, 2, 4, k = 3 chained rounds, the first
// sequence greedy (its argmax taken on the device) and the others through the chooser (their rows on the host), then
// a verify and a settle keeping 1..4 tokens, and every other round a plain decode step with its logits left on the
// device (forward_device: its one-token catch-up replays an MTP graph over the arena the logits came from) before the
// next drafting. The chooser's rows and the decode logits are the same bits, the drafts the same tokens, the states
// the same, and the graphs ran the rounds.
TEST_P(GpuGraphs_, DraftRoundsReplayEqualsEager) {
  TERN_REQUIRE_GPU();
  const Fixture& f = Fixture::get(GetParam());
  GpuModel g(f, model::KvMode::fp8);
  if (!g.model.has_mtp()) GTEST_SKIP() << GetParam() << " has no MTP layer";
  const int64_t vocab = g.model.config().vocab_size, max_tokens = 128;
  engine::DecodeGraphs graphs(g.model, small_buckets(max_tokens, 4));
  graphs.prepare();
  ASSERT_EQ(graphs.disabled_reason(), "");
  const auto layout = g.model.state_layout(max_tokens);
  model::Speculator on_graphs(g.model, *layout, 4), eager(g.model, *layout, 4);
  on_graphs.set_draft_step([&](std::span<const model::Model::MtpStep> rows) { return graphs.forward_mtp(rows); });
  on_graphs.set_trunk_step([&](std::span<const model::StepSequence> steps, bool want_record, bool on_device,
                               model::TrunkRows& out, Tensor& hold) {
    if (on_device) return graphs.forward_trunk_device(steps, want_record, out, hold);
    hold = graphs.forward_trunk(steps, want_record, out);
    return hold.view();
  });
  std::vector<cache::SequenceState> ge, ee;
  for (int k = 0; k < 3; ++k) {
    ge.push_back(g.model.new_state(max_tokens));
    ee.push_back(g.model.new_state(max_tokens));
    std::vector<int64_t> prompt = f.ids(k);
    prompt.resize(std::min<size_t>(prompt.size(), 20));
    const model::StepSequence a{&ge[k], prompt, model::LogitsFor::last}, b{&ee[k], prompt, model::LogitsFor::last};
    (void)on_graphs.forward({&a, 1});
    (void)eager.forward({&b, 1});
  }
  for (int round = 0; round < 9; ++round) {
    const int64_t B = 1 + round % 3;
    std::vector<model::DraftSequence> dg, de;
    for (int64_t k = 0; k < B; ++k) {
      const int64_t last = (5 + 7 * round + 3 * k) % vocab;
      dg.push_back({&ge[k], last, 3, k == 0});
      de.push_back({&ee[k], last, 3, k == 0});
    }
    std::vector<std::vector<float>> rows_g, rows_e;
    const auto chooser = [](std::vector<std::vector<float>>& rows) {
      return [&rows](size_t, int, std::span<const float> row) {
        rows.emplace_back(row.begin(), row.end());
        return ops::argmax(row);
      };
    };
    const uint64_t replays = graphs.stats().mtp_graph_steps;
    on_graphs.draft(dg, chooser(rows_g));
    eager.draft(de, chooser(rows_e));
    EXPECT_EQ(graphs.stats().mtp_graph_steps, replays + 3) << "round " << round << ": a drafting row ran eagerly";
    ASSERT_EQ(rows_g.size(), rows_e.size());
    for (size_t r = 0; r < rows_g.size(); ++r)
      EXPECT_EQ(std::memcmp(rows_g[r].data(), rows_e[r].data(), rows_g[r].size() * sizeof(float)), 0)
          << "round " << round << ", chooser row " << r;
    std::vector<std::vector<int64_t>> tokens(static_cast<size_t>(B));
    std::vector<model::StepSequence> vg, ve;
    for (int64_t k = 0; k < B; ++k) {
      const std::span<const int64_t> d = on_graphs.drafts(static_cast<size_t>(k)), e = eager.drafts(static_cast<size_t>(k));
      ASSERT_TRUE(std::equal(d.begin(), d.end(), e.begin(), e.end())) << "round " << round << ", sequence " << k;
      tokens[k].push_back(dg[k].last);
      tokens[k].insert(tokens[k].end(), d.begin(), d.end());
    }
    for (int64_t k = 0; k < B; ++k) {
      vg.push_back({&ge[k], tokens[k], model::LogitsFor::all});
      ve.push_back({&ee[k], tokens[k], model::LogitsFor::all});
    }
    (void)on_graphs.verify(vg);
    (void)eager.verify(ve);
    std::vector<int64_t> kept;
    for (int64_t k = 0; k < B; ++k) kept.push_back(1 + (round + k) % 4);
    on_graphs.settle(kept);
    eager.settle(kept);
    for (int64_t k = 0; k < B; ++k)
      EXPECT_EQ(ge[k].serialize(), ee[k].serialize()) << "round " << round << ", sequence " << k;
    if (round % 2 == 1) {  // a plain decode step, its logits read only after the catch-up's replay
      std::vector<int64_t> next(static_cast<size_t>(B));
      std::vector<model::StepSequence> pg, pe;
      for (int64_t k = 0; k < B; ++k) {
        next[k] = (11 + 5 * round + k) % vocab;
        pg.push_back({&ge[k], {&next[k], 1}, model::LogitsFor::last});
        pe.push_back({&ee[k], {&next[k], 1}, model::LogitsFor::last});
      }
      Tensor hold;
      const TensorView on_device = on_graphs.forward_device(pg, hold);
      const Tensor got = cuda::to_host(on_device), want = eager.forward(pe);
      ASSERT_EQ(got.numel(), want.numel());
      EXPECT_EQ(std::memcmp(got.data<float>(), want.data<float>(), got.nbytes()), 0) << "round " << round << " decode";
      for (int64_t k = 0; k < B; ++k)
        EXPECT_EQ(ge[k].serialize(), ee[k].serialize()) << "round " << round << " decode, sequence " << k;
    }
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
  engine::DecodeGraphOptions o;
  o.buckets = {1, 8, 32};
  o.max_tokens = capacity;
  engine::DecodeGraphs graphs(g.model, o);
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
