// The step tables (model/step_tables.h) and the forward on them, on the CPU with host address tables: the tables'
// words, the recorded step's body (Model::decode_body, Model::mtp_body) against the eager forward, and steps of
// several tokens a sequence and mixed steps against the per-sequence chunk path.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "engine/decode_graphs.h"
#include "fixture.h"
#include "fixture_checks.h"
#include "model/speculator.h"
#include "model/step_tables.h"

namespace tern::test {
namespace {

// The tables of `batch` in `slots` slots (up to q tokens a sequence) for states of `layout`, written into the host
// words `words` (which the tables then view: host addresses, the CPU backend's step ops read them there).
model::StepTables host_tables(const cache::StateLayout& layout, int64_t slots, int64_t q, Tensor& words,
                              std::span<const model::StepSequence> batch, std::span<const int64_t> starts = {}) {
  model::StepTables t(layout, Device::cpu, slots, q);
  words = Tensor(DType::i64, {t.words()});
  t.fill({words.data<int64_t>(), static_cast<size_t>(words.numel())}, batch, starts);
  t.view(words);
  return t;
}

TEST(DecodeTables, PaddingSlotsAreInert) {
  const Fixture& f = Fixture::get(Fixture::names().front());
  model::Model m(f.weights(), model::KvMode::exact, cpu::context());
  const model::ModelConfig& c = m.config();
  std::vector<cache::SequenceState> states;
  for (int k = 0; k < 3; ++k) states.push_back(m.new_state(64));
  for (int k = 0; k < 3; ++k) states[k].advance(5 + 4 * k);  // positions 5, 9, 13
  const std::vector<int64_t> ids = {11, 22, 33};
  std::vector<model::StepSequence> batch;
  for (int k = 0; k < 3; ++k) batch.push_back({&states[k], std::span<const int64_t>(&ids[k], 1)});
  const int64_t S = engine::pick_decode_bucket(engine::default_decode_buckets(8), 3);
  ASSERT_EQ(S, 4);
  const model::StepTables t(states[0].layout(), Device::cpu, S);
  std::vector<int64_t> w(t.words(), 7);
  t.fill(w, batch);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(w[k], ids[k]);
    EXPECT_EQ(w[S + k], 5 + 4 * k);
  }
  EXPECT_EQ(w[3], 0);       // padding: token 0
  EXPECT_EQ(w[S + 3], -1);  // padding: inert
  for (int k = 0; k < 4; ++k) EXPECT_EQ(w[4 * S + k], k);  // one token a sequence (padding too): its own first
  for (int k = 0; k < 3; ++k) {  // each state's own pool and row block table (standalone states: own pools)
    const PagedRows rows = states[k].compressed_rows(1);
    EXPECT_EQ(w[2 * S + k], reinterpret_cast<intptr_t>(rows.pool.data()));
    EXPECT_EQ(w[3 * S + k], reinterpret_cast<intptr_t>(rows.block_table.data()));
    EXPECT_EQ(rows.block_table.data(), states[k].index_keys(1).block_table.data());
  }
  EXPECT_EQ(w[2 * S + 3], 0);
  EXPECT_EQ(w[3 * S + 3], 0);
  for (int l = 0; l < c.num_layers; ++l) {
    const int64_t* L = w.data() + (5 + 4 * l) * S;
    const int r = c.compress_ratio(l);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(L[k], reinterpret_cast<intptr_t>(states[k].ring(l).data()));
      EXPECT_EQ(L[S + k], r > 0 ? reinterpret_cast<intptr_t>(states[k].compressor_acc(l).data()) : 0);
      EXPECT_EQ(L[3 * S + k], r > 0 ? (5 + 4 * k) / r * r : 0);
    }
    for (int a = 0; a < 4; ++a) EXPECT_EQ(L[a * S + 3], 0) << "layer " << l << " array " << a;
  }
}

// The recorded decode step (Model::decode_body: the step tables and the batched step ops) on the CPU backend,
// with host address tables: over enough steps that CSA and HCA windows close, every sequence's logits are the
// per-sequence chunk path's bits on a twin state, with inert padding slots.
TEST(DecodeBody, OnTheCpuMatchesForward) {
  for (const std::string& name : Fixture::names()) {
    const Fixture& f = Fixture::get(name);
    for (const model::KvMode mode : {model::KvMode::exact, model::KvMode::fp8}) {
      model::Model m(f.weights(), mode, cpu::context());
      m.set_step_tables(false);  // forward(): the chunk path, what decode_body is held to
      const int64_t max_tokens = 96, S = 4, B = 3;
      std::vector<cache::SequenceState> eager, dec;
      for (int64_t k = 0; k < B; ++k) eager.push_back(m.new_state(max_tokens)), dec.push_back(m.new_state(max_tokens));
      // Prefill: prompts of 1, 6 and 11 tokens (then decode positions differ per slot).
      for (int64_t k = 0; k < B; ++k) {
        std::vector<int64_t> prompt(static_cast<size_t>(1 + 5 * k));
        for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int64_t>(3 + 7 * i + 11 * k) % 100;
        const model::StepSequence a{&eager[k], prompt, model::LogitsFor::last}, b{&dec[k], prompt, model::LogitsFor::last};
        m.forward({&a, 1});
        m.forward({&b, 1});
      }
      const cache::StateLayout& layout = dec[0].layout();
      for (int step = 0; step < 20; ++step) {
        std::vector<int64_t> ids(B);
        for (int64_t k = 0; k < B; ++k) ids[k] = (5 + 13 * step + 29 * k) % 100;
        std::vector<model::StepSequence> ea, da;
        for (int64_t k = 0; k < B; ++k) {
          ea.push_back({&eager[k], std::span<const int64_t>(&ids[k], 1), model::LogitsFor::last});
          da.push_back({&dec[k], std::span<const int64_t>(&ids[k], 1), model::LogitsFor::last});
        }
        ASSERT_EQ(m.decode_refusal(da, layout), "");
        const Tensor want = m.forward(ea);
        Tensor words;
        const Tensor got = m.decode_body(host_tables(layout, S, 1, words, da));
        model::Model::decode_done(da);
        ASSERT_EQ(got.dim(0), S);
        ASSERT_EQ(want.numel(), B * got.dim(1));
        EXPECT_EQ(std::memcmp(want.data<float>(), got.data<float>(), want.nbytes()), 0)
            << name << " kv mode " << static_cast<int>(mode) << " step " << step << ": decode_body's logits differ";
        for (int64_t k = 0; k < B; ++k) ASSERT_EQ(dec[k].position(), eager[k].position());
      }
    }
  }
}

// The recorded MTP rows (Model::mtp_body: the MTP layer's rows on the step tables, what engine::DecodeGraphs::forward_mtp
// replays) on the CPU with host address tables: three sequences caught up on their prompts, then chained drafting
// rounds (k = 3, each round's hidden the previous round's output streams, positions m - 1 + j) and a catch-up of
// 1..3 rows a sequence, twice with a plain step between: every slot's logits and output streams are mtp_forward's
// bits on a twin state (padding slots inert), and the twins' states (the MTP windows the rows write) end the same.
TEST(MtpBody, OnTheCpuMatchesMtpForward) {
  for (const std::string& name : Fixture::names()) {
    const Fixture& f = Fixture::get(name);
    model::Model m(f.weights(), model::KvMode::exact, cpu::context());
    if (!m.has_mtp()) continue;
    const model::ModelConfig& c = m.config();
    const int64_t max_tokens = 96, S = 4, B = 3, H = c.hc_mult, D = c.hidden_size;
    const auto layout = m.state_layout(max_tokens);
    model::Speculator spec(m, *layout, static_cast<int>(B));
    std::vector<cache::SequenceState> a, b;
    for (int64_t k = 0; k < B; ++k) a.push_back(m.new_state(max_tokens)), b.push_back(m.new_state(max_tokens));
    std::vector<std::vector<int64_t>> prompts(B);
    for (int64_t k = 0; k < B; ++k)
      for (int64_t i = 0; i < 2 + 5 * k; ++i) prompts[k].push_back((3 + 7 * i + 11 * k) % c.vocab_size);
    const auto plain_step = [&](std::vector<cache::SequenceState>& states, const std::vector<std::vector<int64_t>>& ids) {
      std::vector<model::StepSequence> steps;
      for (int64_t k = 0; k < B; ++k) steps.push_back({&states[k], ids[k], model::LogitsFor::last});
      (void)spec.forward(steps);  // the trunk step and the MTP catch-up (window and carry)
    };
    plain_step(a, prompts);
    plain_step(b, prompts);
    for (int round = 0; round < 2; ++round) {
      std::vector<TensorView> ha, hb;  // each sequence's hidden: its carry, then the last round's output
      for (int64_t k = 0; k < B; ++k)
        ha.push_back(a[k].carry(m.mtp_layer()).reshape({1, H, D})), hb.push_back(b[k].carry(m.mtp_layer()).reshape({1, H, D}));
      model::Model::MtpResult ra;
      Tensor body_streams;
      for (int64_t j = 0; j < 3; ++j) {
        std::vector<int64_t> ids(B), starts(B);
        std::vector<model::Model::MtpStep> steps;
        std::vector<model::StepSequence> seqs;
        for (int64_t k = 0; k < B; ++k) {
          ids[k] = (5 + 13 * j + 29 * k + 31 * round) % c.vocab_size;
          starts[k] = a[k].position() - 1 + j;
        }
        for (int64_t k = 0; k < B; ++k) {
          steps.push_back({&a[k], starts[k], ha[k], {&ids[k], 1}, model::LogitsFor::last, false});
          seqs.push_back({&b[k], {&ids[k], 1}, model::LogitsFor::last});
        }
        model::Model::MtpResult next = m.mtp_forward(steps);
        Tensor hidden(DType::f32, {S, H, D});
        for (int64_t k = 0; k < B; ++k) copy_view(hb[k], hidden.view().rows(k, k + 1));
        Tensor words, streams;
        const Tensor got = m.mtp_body(host_tables(b[0].layout(), S, 1, words, seqs, starts), hidden, &streams);
        ASSERT_EQ(got.dim(0), S);
        ASSERT_EQ(next.logits.numel(), B * got.dim(1));
        EXPECT_EQ(std::memcmp(next.logits.data<float>(), got.data<float>(), next.logits.nbytes()), 0)
            << name << " round " << round << " draft " << j << ": mtp_body's logits differ";
        EXPECT_EQ(std::memcmp(next.streams.data<float>(), streams.data<float>(), next.streams.nbytes()), 0)
            << name << " round " << round << " draft " << j << ": mtp_body's streams differ";
        ra = std::move(next);
        body_streams = std::move(streams);
        for (int64_t k = 0; k < B; ++k) ha[k] = ra.streams.view().rows(k, k + 1), hb[k] = body_streams.view().rows(k, k + 1);
      }
      for (int64_t k = 0; k < B; ++k)
        EXPECT_EQ(a[k].serialize(), b[k].serialize()) << name << " round " << round << " sequence " << k;
      // A catch-up of 1..3 rows a sequence (no logits; a settle's), on tables of B x 3 slots with max_queries 3.
      {
        const int64_t Q = 3, S2 = B * Q;
        std::vector<std::vector<int64_t>> next(B);
        std::vector<Tensor> hidden_k;
        std::vector<int64_t> starts;
        std::vector<model::Model::MtpStep> steps;
        std::vector<model::StepSequence> seqs;
        int64_t rows = 0;
        for (int64_t k = 0; k < B; ++k) {
          const int64_t n = 1 + (k + round) % Q;
          for (int64_t t = 0; t < n; ++t) next[k].push_back((17 + 3 * t + 7 * k + round) % c.vocab_size);
          hidden_k.push_back(Tensor(DType::f32, {n, H, D}));
          for (int64_t t = 0; t < n; ++t) copy_view(ra.streams.view().rows(k, k + 1), hidden_k.back().view().rows(t, t + 1));
          starts.push_back(a[k].position() - 1);
          rows += n;
        }
        for (int64_t k = 0; k < B; ++k) {
          steps.push_back({&a[k], starts[k], hidden_k[k], next[k], model::LogitsFor::none, false});
          seqs.push_back({&b[k], next[k], model::LogitsFor::none});
        }
        const model::Model::MtpResult want = m.mtp_forward(steps);
        Tensor hidden(DType::f32, {S2, H, D});
        for (int64_t k = 0, at = 0; k < B; at += hidden_k[k].dim(0), ++k)
          copy_view(hidden_k[k], hidden.view().rows(at, at + hidden_k[k].dim(0)));
        Tensor words, streams;
        const model::StepTables t = host_tables(b[0].layout(), S2, Q, words, seqs, starts);
        EXPECT_TRUE(m.mtp_body(t, hidden, &streams, /*logits=*/false).empty());
        ASSERT_EQ(want.streams.dim(0), rows);
        EXPECT_EQ(std::memcmp(want.streams.data<float>(), streams.data<float>(), want.streams.nbytes()), 0)
            << name << " round " << round << ": the catch-up's streams differ";
        for (int64_t k = 0; k < B; ++k)
          EXPECT_EQ(a[k].serialize(), b[k].serialize()) << name << " round " << round << " catch-up, sequence " << k;
      }
      std::vector<std::vector<int64_t>> one(B);
      for (int64_t k = 0; k < B; ++k) one[k] = {(7 + 3 * k + round) % c.vocab_size};
      plain_step(a, one);
      plain_step(b, one);
    }
  }
}

// check(tables, chunks, what) on the tiny and odd fixtures, exact and FP8 KV (the odd one's no-RoPE dims do not fit
// FP8 rows), with `chunks` sending every step per sequence.
void for_fixtures_and_kv_modes(void (*check)(model::Model&, model::Model&, const std::string&)) {
  for (const std::string& name : {std::string("tiny-mxfp4"), std::string("odd-mxfp4")}) {
    const Fixture& f = Fixture::get(name);
    for (const model::KvMode mode : {model::KvMode::exact, model::KvMode::fp8}) {
      if (name == "odd-mxfp4" && mode == model::KvMode::fp8) continue;
      model::Model tables(f.weights(), mode, cpu::context()), chunks(f.weights(), mode, cpu::context());
      chunks.set_step_tables(false);
      check(tables, chunks, cat(name, " kv mode ", static_cast<int>(mode)));
    }
  }
}

// Steps of several tokens a sequence (verify-shaped: 1..kMaxStepQueries, mixed in one batch) on the step tables
// against the per-sequence chunk path, on the CPU: three sequences walk their prompts and then generated tokens
// in chunks of varying sizes, long enough that CSA and HCA windows close inside chunks; every step's logits of
// every token (LogitsFor::all) must be the same bits, and so must the states (serialized) at the end.
TEST(StepTables, SeveralTokensASequenceMatchTheChunkPath) {
  for_fixtures_and_kv_modes(check_step_tables_match_chunks);
}

// Prefill chunks beside decode and verify-sized rows in one step: the chunks per sequence, the rest on the tables.
TEST(StepTables, MixedStepsMatchTheChunkPath) { for_fixtures_and_kv_modes(check_mixed_steps_match_chunks); }

// A chunk past kMaxStepQueries runs per sequence; so does a step whose states are in pages of another geometry.
TEST(StepTables, RefusalsOfForward) {
  const Fixture& f = Fixture::get("tiny-mxfp4");
  model::Model m(f.weights(), model::KvMode::exact, cpu::context());
  cache::SequenceState a = m.new_state(32);
  const auto layout = m.state_layout(32);
  std::vector<int64_t> five(5, 3), four(4, 3);
  const model::StepSequence s5{&a, five, model::LogitsFor::all}, s4{&a, four, model::LogitsFor::all};
  EXPECT_EQ(m.decode_refusal({&s5, 1}, *layout, model::Model::kMaxStepQueries), "prefill in the step");
  EXPECT_EQ(m.decode_refusal({&s4, 1}, *layout, model::Model::kMaxStepQueries), "");
  EXPECT_EQ(m.decode_refusal({&s4, 1}, *layout), "prefill in the step");  // a recorded step: one token each
}

}  // namespace
}  // namespace tern::test
