// Incremental decoding: chunked prefill, token-by-token decode, mixed batches, state roll back and
// transfer all give the full forward's logits.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <map>

#include "backends/cpu/cpu_backend.h"
#include "fixture.h"

namespace tern::test {
namespace {

constexpr float kTolerance = 1e-4f;

// Full-forward logits of a prompt in our own model (the FP8 mode's reference for incremental runs: the
// FP8 rounding is discontinuous, so our full forward, not the PyTorch run, is what chunking must match
// exactly; test_parity.cpp compares the full forward with PyTorch).
Tensor own_full_forward(model::Model& m, const std::vector<int64_t>& ids) {
  cache::SequenceState state = m.new_state(static_cast<int64_t>(ids.size()));
  const model::StepSequence s{&state, ids, model::LogitsFor::all};
  return m.forward({&s, 1});
}

struct Checker {
  const Fixture& f;
  model::Model* own = nullptr;  // set: compare with this model's full forward instead of the fixture
  float worst = 0;
  std::map<int, Tensor> own_logits = {};

  TensorView reference(int p) {
    if (!own) return f.tensor("prompt." + std::to_string(p) + ".logits");
    auto it = own_logits.find(p);
    if (it == own_logits.end()) it = own_logits.emplace(p, own_full_forward(*own, f.ids(p))).first;
    return it->second.view();
  }
  // got: logits of positions [begin, begin + rows) of prompt p
  void check(int p, int64_t begin, const float* got, int64_t rows, const char* what) {
    const TensorView want = reference(p);
    const int64_t vocab = want.dim(1);
    const Diff d = diff(got, want.data_as<const float>() + begin * vocab, rows * vocab);
    worst = std::max(worst, d.rel());
    EXPECT_LE(d.max_abs, kTolerance * d.ref_max)
        << what << ": prompt " << p << " rows " << begin << "+" << rows;
  }
};

// Feeds prompt p in chunks of `chunk` tokens, checking every row's logits.
void run_chunked(model::Model& m, Checker& c, int p, int64_t chunk) {
  const std::vector<int64_t> ids = c.f.ids(p);
  cache::SequenceState state = m.new_state(static_cast<int64_t>(ids.size()));
  for (int64_t begin = 0; begin < static_cast<int64_t>(ids.size()); begin += chunk) {
    const int64_t n = std::min<int64_t>(chunk, static_cast<int64_t>(ids.size()) - begin);
    const model::StepSequence s{&state, std::span<const int64_t>(ids).subspan(begin, n),
                                model::LogitsFor::all};
    const Tensor logits = m.forward({&s, 1});
    c.check(p, begin, logits.data<float>(), n, "chunked");
  }
}

class Incremental : public ::testing::TestWithParam<std::string> {};

TEST_P(Incremental, ChunkedPrefillAndTokenByTokenDecode) {
  const Fixture& f = Fixture::get(GetParam());
  model::Model m(f.weights(), model::KvMode::exact, cpu::context());
  for (int64_t chunk : {1, 3, 7}) {
    Checker c{f};
    for (int p : prompts_to_run(f)) run_chunked(m, c, p, chunk);
    std::printf("[%s] chunks of %ld: max|d|/max|ref| = %.3g\n", GetParam().c_str(), long(chunk), c.worst);
  }
}

// post and comb apart from hc_pre (Model::Paths::hc_comb_apart: ops::hc_comb, on a side branch on the GPU) give the
// one op's bits: a prompt fed whole, then in chunks of 1 and 5 tokens, with every step apart, with none, and with
// the 1-token steps only.
TEST_P(Incremental, HcCombApartChangesNoBits) {
  const Fixture& f = Fixture::get(GetParam());
  model::Model m(f.weights(), model::KvMode::exact, cpu::context());
  const std::vector<int64_t> ids = f.ids(f.num_prompts() - 1);
  const auto logits_of = [&](int apart) {
    model::Model::Paths p = m.paths();
    p.hc_comb_apart = apart;
    m.set_paths(p);
    std::vector<float> out;
    for (const int64_t chunk : {static_cast<int64_t>(ids.size()), int64_t{1}, int64_t{5}}) {
      cache::SequenceState state = m.new_state(static_cast<int64_t>(ids.size()));
      for (int64_t begin = 0; begin < static_cast<int64_t>(ids.size()); begin += chunk) {
        const int64_t n = std::min<int64_t>(chunk, static_cast<int64_t>(ids.size()) - begin);
        const model::StepSequence s{&state, std::span<const int64_t>(ids).subspan(begin, n), model::LogitsFor::all};
        const Tensor l = m.forward({&s, 1});
        out.insert(out.end(), l.data<float>(), l.data<float>() + l.numel());
      }
    }
    return out;
  };
  const std::vector<float> none = logits_of(0), all = logits_of(model::Model::kHcCombApartLimit), ones = logits_of(1);
  ASSERT_EQ(none.size(), all.size());
  EXPECT_EQ(std::memcmp(none.data(), all.data(), none.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(none.data(), ones.data(), none.size() * sizeof(float)), 0);
}

TEST_P(Incremental, Fp8KvTokenByToken) {
  const Fixture& f = Fixture::get(GetParam());
  model::Model m(f.weights(), model::KvMode::fp8, cpu::context());
  Checker c{f, &m};
  for (int p : prompts_to_run(f)) run_chunked(m, c, p, p % 2 ? 1 : 5);
  std::printf("[%s] fp8 kv, chunks of 1 and 5 vs full forward: max|d|/max|ref| = %.3g\n", GetParam().c_str(),
              c.worst);
}

TEST_P(Incremental, MixedBatchOfSequences) {
  // Several sequences in one forward() call, each with its own chunk size per step (prefill chunks and
  // single tokens mixed), against each prompt's reference.
  const Fixture& f = Fixture::get(GetParam());
  model::Model m(f.weights(), model::KvMode::exact, cpu::context());
  Checker c{f};
  const std::vector<int> prompts = {f.num_prompts() - 1, f.num_prompts() - 2, 3, f.num_prompts() / 2};
  std::vector<std::vector<int64_t>> ids;
  std::vector<cache::SequenceState> states;
  std::vector<int64_t> done(prompts.size(), 0);
  for (int p : prompts) {
    ids.push_back(f.ids(p));
    states.push_back(m.new_state(static_cast<int64_t>(ids.back().size())));
  }
  for (int step = 0;; ++step) {
    std::vector<model::StepSequence> batch;
    std::vector<size_t> who;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int64_t left = static_cast<int64_t>(ids[i].size()) - done[i];
      if (left == 0) continue;
      const int64_t n = std::min<int64_t>(left, (step + static_cast<int64_t>(i)) % 3 == 0 ? 9 : 1);
      batch.push_back(
          {&states[i], std::span<const int64_t>(ids[i]).subspan(done[i], n), model::LogitsFor::all});
      who.push_back(i);
    }
    if (batch.empty()) break;
    const Tensor logits = m.forward(batch);
    int64_t row = 0;
    for (size_t j = 0; j < batch.size(); ++j) {
      const auto n = static_cast<int64_t>(batch[j].tokens.size());
      c.check(prompts[who[j]], done[who[j]], logits.data<float>() + row * logits.dim(1), n, "batched");
      done[who[j]] += n;
      row += n;
    }
  }
  std::printf("[%s] mixed batch: max|d|/max|ref| = %.3g\n", GetParam().c_str(), c.worst);
}

TEST_P(Incremental, SnapshotRestoreAndTransfer) {
  const Fixture& f = Fixture::get(GetParam());
  model::Model m(f.weights(), model::KvMode::fp8, cpu::context());
  const int p = f.num_prompts() - 1;
  const std::vector<int64_t> ids = f.ids(p);
  const auto T = static_cast<int64_t>(ids.size()), split = T / 2 + 1;
  Checker c{f, &m};
  auto feed = [&](cache::SequenceState& s, int64_t begin, int64_t n, bool check) {
    const model::StepSequence step{&s, std::span<const int64_t>(ids).subspan(begin, n),
                                   model::LogitsFor::all};
    const Tensor logits = m.forward({&step, 1});
    if (check) c.check(p, begin, logits.data<float>(), n, "after restore");
  };
  cache::SequenceState state = m.new_state(T);
  feed(state, 0, split, false);
  const cache::Snapshot snap = state.snapshot();
  const std::vector<std::byte> wire = state.serialize();
  // speculative tokens that get rejected: other tokens, crossing compression windows
  const std::vector<int64_t> junk = {7, 8, 9, 10, 11, 12, 13, 14, 15};
  const model::StepSequence wrong{&state, junk, model::LogitsFor::none};
  m.forward({&wrong, 1});
  state.restore(snap);
  for (int64_t b = split; b < T; ++b) feed(state, b, 1, true);
  // the serialized state continues identically in a fresh state
  cache::SequenceState moved = m.new_state(T);
  moved.deserialize(wire);
  feed(moved, split, T - split, true);
  // and a reset state is as good as new (no stale ring rows)
  state.reset();
  for (int64_t b = 0; b < T; b += 16) feed(state, b, std::min<int64_t>(16, T - b), true);
  std::printf("[%s] snapshot/restore/transfer/reset: max|d|/max|ref| = %.3g\n", GetParam().c_str(), c.worst);
}

// States in a shared pool with small pages (8 tokens), growing together one token at a time so their pages
// interleave, give the logits of a standalone state bit for bit; a page-wise copy into another pool's
// reserved pages continues identically.
TEST_P(Incremental, PooledStatesInScatteredPagesEqualStandalone) {
  const Fixture& f = Fixture::get(GetParam());
  model::Model m(f.weights(), model::KvMode::fp8, cpu::context());
  const std::vector<int64_t> a = f.ids(0), b = f.ids(f.num_prompts() - 1);
  const auto T = static_cast<int64_t>(std::min(a.size(), b.size()));
  auto pool = std::make_shared<cache::PagePool>(m.state_layout(256, 8), 64);
  cache::SequenceState pa(pool), pb(pool);
  cache::SequenceState sa = m.new_state(T), sb = m.new_state(T);
  for (int64_t t = 0; t < T; ++t) {
    ASSERT_TRUE(pa.reserve(t + 1) && pb.reserve(t + 1));
    const model::StepSequence pooled[2] = {{&pa, {&a[t], 1}, model::LogitsFor::last},
                                           {&pb, {&b[t], 1}, model::LogitsFor::last}};
    const model::StepSequence alone[2] = {{&sa, {&a[t], 1}, model::LogitsFor::last},
                                          {&sb, {&b[t], 1}, model::LogitsFor::last}};
    const Tensor got = m.forward(pooled), want = m.forward(alone);
    ASSERT_EQ(std::memcmp(got.data<float>(), want.data<float>(), want.nbytes()), 0) << "position " << t;
  }
  bool scattered = false;
  for (size_t i = 1; i < pa.block_table().size(); ++i) scattered |= pa.block_table()[i] != pa.block_table()[i - 1] + 1;
  EXPECT_TRUE(scattered);
  EXPECT_EQ(pa.serialize(), sa.serialize());
  // Transfer page by page into states that reserved room for two more tokens, and continue.
  auto other = std::make_shared<cache::PagePool>(m.state_layout(256, 8), 64);
  cache::SequenceState filler(other, 20), moved(other, T + 2);
  for (int64_t i = 0; i < pa.pages_used(); ++i) copy_view(pa.page(i), moved.page(i));
  moved.import_header(pa.export_header());
  const int64_t next[2] = {5, 6};
  ASSERT_TRUE(pa.reserve(T + 2));
  const model::StepSequence x{&moved, next, model::LogitsFor::all}, y{&pa, next, model::LogitsFor::all};
  const Tensor got = m.forward({&x, 1}), want = m.forward({&y, 1});
  EXPECT_EQ(std::memcmp(got.data<float>(), want.data<float>(), want.nbytes()), 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Incremental, ::testing::ValuesIn(Fixture::names()),
                         [](const auto& info) { return info.param == "tiny-mxfp4" ? "mxfp4" : "nvfp4"; });

}  // namespace
}  // namespace tern::test
