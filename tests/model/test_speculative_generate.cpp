// MTP speculative decoding at the model level (generate with speculative_tokens; issue #18), on the CPU: greedy
// output with MTP equals plain greedy decoding token for token at k = 1, 2, 3, whether the drafts are the (random,
// mostly rejected) MTP layer's, an oracle's (all kept: the target's own continuation) or an oracle's kept with
// probability 1/2 (partial acceptance); and the rollback it uses (snapshot, restore, replay of the kept tokens)
// leaves a state bit-identical to plain decoding of the kept tokens.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"

#include "fixture.h"

namespace tern::test {
namespace {

using model::GenerateOptions;
using model::LogitsFor;
using model::Model;

class Speculative : public ::testing::TestWithParam<std::string> {};

model::GenerateResult run(Model& m, const std::vector<int64_t>& prompt, const GenerateOptions& o) {
  cache::SequenceState state = m.new_state(static_cast<int64_t>(prompt.size()) + o.max_new_tokens);
  return model::generate(m, state, prompt, o);
}

TEST_P(Speculative, GreedyOutputEqualsPlainDecoding) {
  const Fixture& f = Fixture::get(GetParam());
  Model m(f.weights(), model::KvMode::exact, cpu::context());
  ASSERT_TRUE(m.has_mtp());
  int64_t rounds = 0, drafts = 0, kept = 0;
  // Under ASan / UBSan (memory safety, not numerics: fixture.h) two prompts.
  const std::vector<int> prompts = sanitized_build() ? std::vector<int>{3, f.num_prompts() - 1}
                                                     : std::vector<int>{0, 3, 8, f.num_prompts() - 1};
  for (int p : prompts) {
    const std::vector<int64_t> prompt = f.ids(p);
    GenerateOptions plain;
    plain.max_new_tokens = 24;
    plain.prefill_chunk = 5;
    const std::vector<int64_t> want = run(m, prompt, plain).tokens;
    ASSERT_EQ(want.size(), 24u);
    for (int64_t k = 1; k <= 3; ++k) {
      for (int mode = 0; mode < 3; ++mode) {  // the MTP layer's drafts, an oracle's, an oracle's kept half the time
        GenerateOptions o = plain;
        o.speculative_tokens = k;
        o.seed = 100 + static_cast<uint64_t>(p);
        if (mode > 0) o.draft_oracle = want, o.oracle_accept = mode == 1 ? 1.0 : 0.5;
        const model::GenerateResult got = run(m, prompt, o);
        EXPECT_EQ(got.tokens, want) << "prompt " << p << " k " << k << " mode " << mode;
        if (mode == 1) {  // every draft kept: k + 1 tokens a round
          EXPECT_EQ(got.accepted, got.drafts) << "prompt " << p << " k " << k;
          EXPECT_LE(got.rounds, (23 + k) / (k + 1)) << "prompt " << p << " k " << k;
        }
        if (mode == 2) rounds += got.rounds, drafts += got.drafts, kept += got.accepted;
      }
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, drafts);
  std::printf("[%s] oracle kept with probability 0.5: %lld of %lld drafts kept over %lld rounds\n", GetParam().c_str(),
              static_cast<long long>(kept), static_cast<long long>(drafts), static_cast<long long>(rounds));
}

// The MTP layer's window through speculative rounds (chained drafts write speculative rows into it, which the round
// puts back): every round's first draft logits are a plain catch-up's over the same tokens, bit for bit, and at
// the end the window holds what that catch-up wrote.
TEST_P(Speculative, MtpWindowIsThePlainCatchUps) {
  const Fixture& f = Fixture::get(GetParam());
  Model m(f.weights(), model::KvMode::exact, cpu::context());
  const std::vector<int64_t> prompt = f.ids(3);
  GenerateOptions plain;
  plain.max_new_tokens = 20;
  const std::vector<int64_t> want = run(m, prompt, plain).tokens;
  for (double keep : {1.0, 0.5, 0.0}) {
    GenerateOptions o = plain;
    o.speculative_tokens = 3;
    o.draft_oracle = want, o.oracle_accept = keep;
    o.keep_first_draft_logits = true;
    cache::SequenceState spec = m.new_state(static_cast<int64_t>(prompt.size()) + o.max_new_tokens);
    const model::GenerateResult got = model::generate(m, spec, prompt, o);
    ASSERT_EQ(got.tokens, want);
    const int64_t P = spec.position();  // consumed: the prompt and the generated tokens before the last
    std::vector<int64_t> ids = prompt;
    ids.insert(ids.end(), want.begin(), want.end());
    cache::SequenceState ref = m.new_state(P);
    const model::StepSequence s{&ref, std::span<const int64_t>(ids).subspan(0, P), LogitsFor::none};
    const LogitsFor all = LogitsFor::all;
    Tensor streams;
    m.forward({&s, 1}, {&all, 1}, streams);
    const Model::MtpStep c{&ref, 0, streams.view().rows(0, P - 1), std::span<const int64_t>(ids).subspan(1, P - 1),
                           LogitsFor::all};
    const Tensor clean = m.mtp_forward({&c, 1}).logits;  // row p: the MTP layer at p on the true tokens
    const int64_t vocab = m.config().vocab_size;
    ASSERT_FALSE(got.first_draft_positions.empty());
    for (size_t i = 0; i < got.first_draft_positions.size(); ++i) {  // every round's first draft row
      const int64_t p = got.first_draft_positions[i];
      ASSERT_LT(p, P - 1);  // the last consumed position's row is the next round's (not in the clean run)
      EXPECT_EQ(std::memcmp(got.first_draft_logits[i].data(), clean.data<float>() + p * vocab, vocab * sizeof(float)), 0)
          << "oracle kept with probability " << keep << ": round " << i << "'s first draft (position " << p << ")";
    }
    const TensorView a = spec.ring(m.mtp_layer()), b = ref.ring(m.mtp_layer());
    ASSERT_EQ(a.nbytes(), b.nbytes());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << "oracle kept with probability " << keep;
  }
}

// The rollback: a verify step of [y, d_1, d_2, d_3] whose drafts are partly wrong, then Model::rollback_step (the
// snapshot from before it restored, the kept tokens' recorded rows stored and compressor inputs refolded), against
// plain decoding (one token a step) of the kept tokens: the states serialize to the same bytes and the next step's
// logits are the same bits. Both KV modes; positions from the prompt's end across windows and compression
// boundaries (several rounds in a row).
void expect_error(const std::function<void()>& fn, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no error (expected one naming \"" << part << "\")";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST_P(Speculative, RollbackEqualsPlainDecodingOfTheKeptTokens) {
  const Fixture& f = Fixture::get(GetParam());
  for (const model::KvMode mode : {model::KvMode::fp8, model::KvMode::exact}) {
    Model m(f.weights(), mode, cpu::context());
    const std::vector<int64_t> prompt = f.ids(f.num_prompts() - 1);
    const int64_t vocab = m.config().vocab_size, rounds = 12;
    cache::SequenceState a = m.new_state(static_cast<int64_t>(prompt.size()) + 4 * rounds + 2),
                         b = m.new_state(static_cast<int64_t>(prompt.size()) + 4 * rounds + 2);
    for (cache::SequenceState* s : {&a, &b}) {
      const model::StepSequence pre{s, prompt, LogitsFor::none};
      m.forward({&pre, 1});
    }
    const LogitsFor all = LogitsFor::all;
    for (int64_t r = 0; r < rounds; ++r) {
      const int64_t kept = 1 + r % 4;  // 4: every token kept (no rollback needed, but it must hold too)
      const std::vector<int64_t> v = {(7 + 5 * r) % vocab, (11 + 3 * r) % vocab, (13 + r) % vocab, (17 + 2 * r) % vocab};
      const cache::Snapshot before = a.snapshot();
      const model::StepSequence verify{&a, v, LogitsFor::all};
      Tensor streams;
      Model::StepRecord record;
      m.forward({&verify, 1}, {&all, 1}, streams, false, &record);
      m.rollback_step(a, before, record, 0, kept);
      for (int64_t i = 0; i < kept; ++i) {
        const model::StepSequence one{&b, std::span<const int64_t>(v).subspan(static_cast<size_t>(i), 1), LogitsFor::last};
        m.forward({&one, 1});
      }
      ASSERT_EQ(a.position(), b.position());
      ASSERT_EQ(a.serialize(), b.serialize()) << "kv mode " << static_cast<int>(mode) << " round " << r << " kept " << kept;
    }
    const int64_t t = 5;
    const model::StepSequence na{&a, {&t, 1}, LogitsFor::last}, nb{&b, {&t, 1}, LogitsFor::last};
    const Tensor la = m.forward({&na, 1}), lb = m.forward({&nb, 1});
    EXPECT_EQ(std::memcmp(la.data<float>(), lb.data<float>(), la.nbytes()), 0);
  }
}

// Model::rollback_steps: three sequences of one verify step (2, 4 and 3 tokens, prompts of different lengths) roll
// back at once, each keeping 1 .. all of its tokens (a sequence keeping all is rolled back too, in some rounds, and
// left out in others), against plain decoding of the kept tokens: every state serializes to the same bytes, round
// after round, and the next step's logits are the same bits. Bad batches are refused.
TEST_P(Speculative, BatchedRollbackEqualsPlainDecoding) {
  const Fixture& f = Fixture::get(GetParam());
  for (const model::KvMode mode : {model::KvMode::fp8, model::KvMode::exact}) {
    Model m(f.weights(), mode, cpu::context());
    const int64_t vocab = m.config().vocab_size, rounds = 10;
    const int prompts[3] = {0, 3, f.num_prompts() - 1};
    const int64_t counts[3] = {2, 4, 3};
    std::vector<cache::SequenceState> a, b;
    for (int p : prompts) {
      const std::vector<int64_t> prompt = f.ids(p);
      for (auto* v : {&a, &b}) {
        v->push_back(m.new_state(static_cast<int64_t>(prompt.size()) + 4 * rounds + 2));
        const model::StepSequence pre{&v->back(), prompt, LogitsFor::none};
        m.forward({&pre, 1});
      }
    }
    const LogitsFor all[3] = {LogitsFor::all, LogitsFor::all, LogitsFor::all};
    for (int64_t r = 0; r < rounds; ++r) {
      std::vector<std::vector<int64_t>> v(3);
      std::vector<cache::Snapshot> before;
      std::vector<model::StepSequence> step;
      for (size_t i = 0; i < 3; ++i) {
        for (int64_t t = 0; t < counts[i]; ++t) v[i].push_back((7 + 5 * r + 11 * t + 13 * static_cast<int64_t>(i)) % vocab);
        before.push_back(a[i].snapshot());
      }
      for (size_t i = 0; i < 3; ++i) step.push_back({&a[i], v[i], LogitsFor::all});
      Tensor streams;
      Model::StepRecord record;
      m.forward(step, all, streams, false, &record);
      ASSERT_FALSE(record.layers.empty());
      std::vector<Model::Rollback> back;
      int64_t first = 0;
      std::vector<int64_t> kept(3);
      for (size_t i = 0; i < 3; ++i) {
        kept[i] = 1 + (r + static_cast<int64_t>(i)) % counts[i];
        // A sequence keeping everything needs no rollback: left out in odd rounds, rolled back (to the same state)
        // in even ones.
        if (kept[i] < counts[i] || r % 2 == 0) back.push_back({&a[i], &before[i], first, kept[i]});
        first += counts[i];
      }
      m.rollback_steps(back, record);
      for (size_t i = 0; i < 3; ++i) {
        for (int64_t t = 0; t < kept[i]; ++t) {
          const model::StepSequence one{&b[i], std::span<const int64_t>(v[i]).subspan(static_cast<size_t>(t), 1),
                                        LogitsFor::last};
          m.forward({&one, 1});
        }
        ASSERT_EQ(a[i].position(), b[i].position());
        ASSERT_EQ(a[i].serialize(), b[i].serialize())
            << "kv mode " << static_cast<int>(mode) << " round " << r << " sequence " << i << " kept " << kept[i];
      }
    }
    for (size_t i = 0; i < 3; ++i) {
      const int64_t t = 5;
      const model::StepSequence na{&a[i], {&t, 1}, LogitsFor::last}, nb{&b[i], {&t, 1}, LogitsFor::last};
      const Tensor la = m.forward({&na, 1}), lb = m.forward({&nb, 1});
      EXPECT_EQ(std::memcmp(la.data<float>(), lb.data<float>(), la.nbytes()), 0) << "sequence " << i;
    }
    // Refusals: a state twice, overlapping rows, rows past the step, and nothing changes.
    const cache::Snapshot s0 = a[0].snapshot(), s1 = a[1].snapshot();
    const std::vector<int64_t> two = {3, 4};
    const model::StepSequence p0{&a[0], two, LogitsFor::all}, p1{&a[1], two, LogitsFor::all};
    const model::StepSequence pair[2] = {p0, p1};
    Tensor streams;
    Model::StepRecord record;
    m.forward(pair, std::span<const LogitsFor>(all, 2), streams, false, &record);
    const std::vector<std::byte> after0 = a[0].serialize();
    const Model::Rollback twice[2] = {{&a[0], &s0, 0, 1}, {&a[0], &s0, 2, 1}};
    expect_error([&] { m.rollback_steps(twice, record); }, "appears twice");
    const Model::Rollback overlap[2] = {{&a[0], &s0, 0, 2}, {&a[1], &s1, 1, 1}};
    expect_error([&] { m.rollback_steps(overlap, record); }, "overlap");
    const Model::Rollback past[1] = {{&a[1], &s1, 3, 2}};
    expect_error([&] { m.rollback_steps(past, record); }, "of a step of 4");
    EXPECT_EQ(a[0].serialize(), after0);
  }
}

// A step that ran per sequence (more tokens than the step tables take) keeps no record: rollback_step refuses it.
TEST(SpeculativeRollback, RefusesAStepThatWasNotRecorded) {
  const Fixture& f = Fixture::get("tiny-mxfp4");
  Model m(f.weights(), model::KvMode::exact, cpu::context());
  cache::SequenceState s = m.new_state(16);
  const cache::Snapshot before = s.snapshot();
  const std::vector<int64_t> five = {3, 4, 5, 6, 7};
  const model::StepSequence step{&s, five, LogitsFor::all};
  const LogitsFor all = LogitsFor::all;
  Tensor streams;
  Model::StepRecord record;
  m.forward({&step, 1}, {&all, 1}, streams, false, &record);
  EXPECT_TRUE(record.layers.empty());
  expect_error([&] { m.rollback_step(s, before, record, 0, 2); }, "not recorded");
}

TEST(SpeculativeOptions, RefusedWithClearMessages) {
  const Fixture& f = Fixture::get("tiny-mxfp4");
  Model m(f.weights(), model::KvMode::exact, cpu::context());
  const std::vector<int64_t> prompt = f.ids(0);
  GenerateOptions o;
  o.max_new_tokens = 4;
  o.speculative_tokens = 4;
  expect_error([&] { run(m, prompt, o); }, "1 to 3");
  o.speculative_tokens = 2;
  o.temperature = 0.7f;
  expect_error([&] { run(m, prompt, o); }, "greedy");
  const Fixture& odd = Fixture::get("odd-mxfp4");  // no MTP layer
  Model no_mtp(odd.weights(), model::KvMode::exact, cpu::context());
  o.temperature = 0.0f;
  expect_error([&] { run(no_mtp, odd.ids(0), o); }, "MTP layer");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Speculative, ::testing::ValuesIn(Fixture::names()));

}  // namespace
}  // namespace tern::test
