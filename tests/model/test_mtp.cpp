// The MTP layer (model/v4_mtp.cpp) against its PyTorch reference (tools/reference/mtp_reference.py, stored in
// tests/fixtures/tiny-*/mtp_reference.safetensors): teacher-forced draft logits, chained drafts, prompt catch-up
// in any chunking, the trunk's pre-hc_head streams, and loading (all of mtp.0.* or none).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <cstring>
#include <filesystem>

#include "backends/cpu/cpu_backend.h"
#include "fixture.h"
#include "model/checkpoint.h"
#include "model/safetensors_writer.h"

namespace tern::test {
namespace {

constexpr float kTolerance = 1e-5f;  // max|d| <= 1e-5 max|ref| (issue #18)

using model::LogitsFor;
using model::Model;

// The trunk's pre-hc_head streams f32 [n, hc, D] of every token of `ids` fed at the state's position.
Tensor trunk_streams(Model& m, cache::SequenceState& state, std::span<const int64_t> ids) {
  const model::StepSequence s{&state, ids, LogitsFor::none};
  const LogitsFor all = LogitsFor::all;
  Tensor streams;
  m.forward({&s, 1}, {&all, 1}, streams);
  return streams;
}

// Row p of the teacher-forced MTP input: the token at p + 1 (the prompt's; the first greedy token last).
std::vector<int64_t> next_tokens(const Fixture& f, int p) {
  std::vector<int64_t> ids = f.ids(p);
  std::vector<int64_t> next(ids.begin() + 1, ids.end());
  next.push_back(f.greedy(p).at(0));
  return next;
}

Tensor concat_rows(const std::vector<TensorView>& parts) {
  int64_t n = 0;
  for (const TensorView& v : parts) n += v.dim(0);
  Shape shape = parts.at(0).shape();
  Tensor out(DType::f32, {n, shape[1], shape[2]});
  int64_t at = 0;
  for (const TensorView& v : parts) {
    std::memcpy(out.data<float>() + at * shape[1] * shape[2], v.data(), v.nbytes());
    at += v.dim(0);
  }
  return out;
}

class Mtp : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const Fixture& f = Fixture::get(GetParam());
    if (f.mtp_tensor("mtp.prompt.0.logits").empty()) GTEST_SKIP() << GetParam() << " has no MTP reference";
  }
};

TEST_P(Mtp, TrunkStreamsAreThePreHcHeadHidden) {
  const Fixture& f = Fixture::get(GetParam());
  Model m(f.weights(), model::KvMode::exact, cpu::context());
  const int p = 12;  // the debug prompt: debug.layer3.streams is the last layer's output
  const std::vector<int64_t> ids = f.ids(p);
  cache::SequenceState a = m.new_state(static_cast<int64_t>(ids.size()));
  cache::SequenceState b = m.new_state(static_cast<int64_t>(ids.size()));
  const model::StepSequence sa{&a, ids, LogitsFor::all}, sb{&b, ids, LogitsFor::all};
  const LogitsFor which = LogitsFor::all;
  Tensor streams;
  const Tensor with = m.forward({&sa, 1}, {&which, 1}, streams);
  const Tensor without = m.forward({&sb, 1});
  EXPECT_EQ(std::memcmp(with.data<float>(), without.data<float>(), with.nbytes()), 0) << "the logits changed";
  const TensorView want = f.tensor("debug.layer" + std::to_string(f.weights().config.num_layers - 1) + ".streams");
  ASSERT_EQ(streams.shape(), want.shape());
  const Diff d = diff(streams.data<float>(), want.data_as<const float>(), want.numel());
  std::printf("[%s] trunk streams vs reference: max|d|/max|ref| = %.3g\n", GetParam().c_str(), d.rel());
  EXPECT_LE(d.max_abs, kTolerance * d.ref_max);
  // last: one row per sequence
  cache::SequenceState c = m.new_state(static_cast<int64_t>(ids.size()));
  const model::StepSequence sc{&c, ids, LogitsFor::none};
  const LogitsFor last = LogitsFor::last;
  Tensor one;
  m.forward({&sc, 1}, {&last, 1}, one);
  ASSERT_EQ(one.dim(0), 1);
  const int64_t row = one.numel();
  EXPECT_EQ(std::memcmp(one.data<float>(), streams.data<float>() + (want.dim(0) - 1) * row, one.nbytes()), 0);
}

// Teacher-forced draft logits of every prompt, then the chained drafts k = 2, 3 from its last position.
TEST_P(Mtp, TeacherForcedAndChained) {
  const Fixture& f = Fixture::get(GetParam());
  Model m(f.weights(), model::KvMode::exact, cpu::context());
  ASSERT_TRUE(m.has_mtp());
  float worst = 0, worst_chain = 0;
  int argmax_checked = 0;
  for (int p : prompts_to_run(f)) {
    const std::vector<int64_t> ids = f.ids(p), next = next_tokens(f, p);
    const auto T = static_cast<int64_t>(ids.size());
    cache::SequenceState state = m.new_state(T + 4);
    const Tensor h = trunk_streams(m, state, ids);
    const Model::MtpStep step{&state, 0, h.view(), next, LogitsFor::all};
    Model::MtpResult r = m.mtp_forward({&step, 1});
    const TensorView want = f.mtp_tensor("mtp.prompt." + std::to_string(p) + ".logits");
    ASSERT_EQ(r.logits.shape(), want.shape()) << "prompt " << p;
    const Diff d = diff(r.logits.data<float>(), want.data_as<const float>(), want.numel());
    worst = std::max(worst, d.rel());
    EXPECT_LE(d.max_abs, kTolerance * d.ref_max) << "teacher-forced, prompt " << p;

    // Chained: step k at position T + k - 2 reads step k-1's output streams and the reference's draft token.
    const TensorView tokens = f.mtp_tensor("mtp.prompt." + std::to_string(p) + ".chain_tokens");
    const TensorView chain = f.mtp_tensor("mtp.prompt." + std::to_string(p) + ".chain_logits");
    const int64_t V = chain.dim(1);
    Tensor prev = std::move(r.streams);
    int64_t prev_row = T - 1;
    std::vector<float> own_prev(r.logits.data<float>() + (T - 1) * V, r.logits.data<float>() + T * V);
    for (int64_t k = 1; k < chain.dim(0); ++k) {
      const int64_t tok = tokens.data_as<const int64_t>()[k];
      // the token fed here is the previous step's greedy draft: ours agrees where the reference's choice is clear
      const float* ref_prev = chain.data_as<const float>() + (k - 1) * V;
      std::vector<float> top(ref_prev, ref_prev + V);
      std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<>());
      if (top[0] - top[1] > 1e-3f * std::fabs(top[0])) {
        EXPECT_EQ(std::max_element(own_prev.begin(), own_prev.end()) - own_prev.begin(), tok) << "prompt " << p;
        ++argmax_checked;
      }
      const TensorView hidden = prev.view().rows(prev_row, prev_row + 1);
      const Model::MtpStep s{&state, T + k - 1, hidden, {&tok, 1}, LogitsFor::all};
      Model::MtpResult rk = m.mtp_forward({&s, 1});
      const float* want_row = chain.data_as<const float>() + k * V;
      const Diff dk = diff(rk.logits.data<float>(), want_row, V);
      worst_chain = std::max(worst_chain, dk.rel());
      EXPECT_LE(dk.max_abs, kTolerance * dk.ref_max) << "chained step " << k + 1 << ", prompt " << p;
      own_prev.assign(rk.logits.data<float>(), rk.logits.data<float>() + V);
      prev = std::move(rk.streams);
      prev_row = 0;
    }
  }
  std::printf("[%s] MTP teacher-forced: max|d|/max|ref| = %.3g; chained k = 2, 3: %.3g (%d draft argmaxes checked)\n",
              GetParam().c_str(), worst, worst_chain, argmax_checked);
}

// Prompt catch-up: the trunk's prefill in chunks, and after each chunk the MTP layer over every position whose
// next token is known (the chunk's last position waits for the next chunk, the prompt's last for the first
// sampled token). One chunk, chunks of 3 and token by token give the same MTP logits.
std::vector<float> catch_up(Model& m, const Fixture& f, int p, int64_t chunk) {
  const std::vector<int64_t> ids = f.ids(p), next = next_tokens(f, p);
  const auto T = static_cast<int64_t>(ids.size());
  const int64_t V = m.config().vocab_size;
  cache::SequenceState state = m.new_state(T);
  std::vector<float> out(static_cast<size_t>(T * V));
  Tensor pending;  // the last position's streams, waiting for its next token
  auto run = [&](int64_t start, const Tensor& h) {
    const int64_t n = h.dim(0);
    const Model::MtpStep s{&state, start, h.view(), std::span<const int64_t>(next).subspan(start, n), LogitsFor::all};
    const Model::MtpResult r = m.mtp_forward({&s, 1});
    std::memcpy(out.data() + start * V, r.logits.data<float>(), r.logits.nbytes());
  };
  for (int64_t begin = 0; begin < T; begin += chunk) {
    const int64_t n = std::min(chunk, T - begin);
    const Tensor h = trunk_streams(m, state, std::span<const int64_t>(ids).subspan(begin, n));
    std::vector<TensorView> parts;
    if (!pending.empty()) parts.push_back(pending.view());
    if (n > 1) parts.push_back(h.view().rows(0, n - 1));
    if (!parts.empty()) run(pending.empty() ? begin : begin - 1, concat_rows(parts));
    pending = concat_rows({h.view().rows(n - 1, n)});
  }
  run(T - 1, pending);  // the first sampled token arrived
  return out;
}

TEST_P(Mtp, PromptCatchUpInAnyChunking) {
  const Fixture& f = Fixture::get(GetParam());
  Model m(f.weights(), model::KvMode::exact, cpu::context());
  float worst_ref = 0, worst_modes = 0;
  for (int p : prompts_to_run(f)) {
    const std::vector<float> one = catch_up(m, f, p, 1 << 20);
    const TensorView want = f.mtp_tensor("mtp.prompt." + std::to_string(p) + ".logits");
    for (int64_t chunk : {3, 1}) {
      const std::vector<float> got = catch_up(m, f, p, chunk);
      const Diff d = diff(got.data(), want.data_as<const float>(), want.numel());
      const Diff same = diff(got.data(), one.data(), want.numel());
      worst_ref = std::max(worst_ref, d.rel());
      worst_modes = std::max(worst_modes, same.max_abs / d.ref_max);
      EXPECT_LE(d.max_abs, kTolerance * d.ref_max) << "chunks of " << chunk << ", prompt " << p;
      EXPECT_LE(same.max_abs, 1e-6f * d.ref_max) << "chunks of " << chunk << " vs one chunk, prompt " << p;
    }
  }
  std::printf("[%s] MTP catch-up in chunks of 3 and 1: vs reference %.3g, vs one chunk %.3g (of max|ref|)\n",
              GetParam().c_str(), worst_ref, worst_modes);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Mtp, ::testing::ValuesIn(Fixture::names()));

// --- loading ---------------------------------------------------------------------------------------------

class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("tern-mtp-" + tag + "-" + std::to_string(::getpid()) + "-" + info->name());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// The nvfp4 fixture (one file) copied without the tensors `drop` rejects.
void copy_without(const std::string& src, const std::string& dst, const std::function<bool(const std::string&)>& drop) {
  const model::Checkpoint ck = model::Checkpoint::open(src);
  model::SafetensorsWriter w;
  for (const std::string& n : ck.names()) {
    if (drop(n)) continue;
    const TensorView v = ck.get(n);
    std::vector<std::byte> b(v.nbytes());
    std::memcpy(b.data(), v.data(), b.size());
    w.add_bytes(n, v.dtype(), v.shape(), std::move(b));
  }
  w.write(dst + "/model.safetensors");
  std::filesystem::copy_file(src + "/config.json", dst + "/config.json");
}

std::string load_error(const std::string& dir) {
  try {
    model::load_model(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MtpLoading, FixturesBindTheMtpLayer) {
  for (const std::string& name : Fixture::names()) {
    const Fixture& f = Fixture::get(name);
    if (f.mtp_tensor("mtp.prompt.0.logits").empty()) GTEST_SKIP() << name << " has no MTP layer";
    const model::ModelWeights& w = f.weights();
    ASSERT_TRUE(w.mtp.has_value()) << name;
    const model::MtpWeights& mtp = *w.mtp;
    EXPECT_EQ(mtp.block.index, w.config.num_layers);
    EXPECT_EQ(mtp.block.attn_kind, model::AttnKind::sliding);
    EXPECT_FALSE(mtp.block.attn.compressor.has_value());
    EXPECT_FALSE(mtp.block.hash_routed);
    EXPECT_FALSE(mtp.block.ffn.gate_bias.empty());
    EXPECT_EQ(mtp.e_proj.format, model::WeightFormat::fp8_block);
    EXPECT_EQ(mtp.h_proj.format, model::WeightFormat::fp8_block);
    EXPECT_EQ(mtp.hc_head.fn.shape(), (Shape{w.config.hc_mult, w.config.hc_mult * w.config.hidden_size}));
    const Model m(w, model::KvMode::exact, cpu::context());
    const auto layout = m.state_layout(64);
    ASSERT_EQ(layout->num_layers(), w.config.num_layers + 1);
    EXPECT_EQ(layout->spec(m.mtp_layer()).ratio, 0);
    EXPECT_EQ(layout->spec(m.mtp_layer()).window, w.config.sliding_window);
  }
}

TEST(MtpLoading, WithoutMtpTensorsTheModelLoadsWithoutMtp) {
  const Fixture& f = Fixture::get("tiny-nvfp4");
  if (!f.weights().mtp) GTEST_SKIP() << "the fixture has no MTP layer";
  TempDir dir("none");
  copy_without(f.dir(), dir.str(), [](const std::string& n) { return n.rfind("mtp.", 0) == 0; });
  model::ModelWeights w = model::load_model(dir.str());
  EXPECT_FALSE(w.mtp.has_value());
  Model m(std::move(w), model::KvMode::exact, cpu::context());
  EXPECT_FALSE(m.has_mtp());
  EXPECT_EQ(m.state_layout(64)->num_layers(), m.config().num_layers);
  cache::SequenceState state = m.new_state(4);
  Tensor h(DType::f32, {1, m.config().hc_mult, m.config().hidden_size});
  const int64_t tok = 5;
  const Model::MtpStep s{&state, 0, h.view(), {&tok, 1}, LogitsFor::all};
  EXPECT_THROW(m.mtp_forward({&s, 1}), Error);
}

TEST(MtpLoading, APartialMtpSetNamesWhatIsMissing) {
  const Fixture& f = Fixture::get("tiny-nvfp4");
  if (!f.weights().mtp) GTEST_SKIP() << "the fixture has no MTP layer";
  for (const std::string missing : {"mtp.0.e_proj.weight", "mtp.0.h_proj.scale", "mtp.0.hnorm.weight",
                                    "mtp.0.attn.wkv.weight", "mtp.0.ffn.experts.3.w2.weight", "mtp.0.hc_head_base",
                                    "mtp.0.norm.weight", "mtp.0.ffn.gate.bias"}) {
    TempDir dir("partial");
    copy_without(f.dir(), dir.str(), [&](const std::string& n) { return n == missing; });
    const std::string e = load_error(dir.str());
    EXPECT_NE(e.find("the MTP layer mtp.0 is incomplete"), std::string::npos) << e;
    EXPECT_NE(e.find("tensor \"" + missing + "\" is missing"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace tern::test
