// The synthetic model's MTP layer (model/synthetic_model.h): built as the official checkpoint has it (FP8
// e_proj / h_proj, an SWA-only score-routed block in the trunk's formats, its own hc_head and norms), counted
// in the sizes and the expert-sharing plan, and run: mtp_forward after a trunk forward gives finite logits,
// and speculative greedy generation equals plain greedy generation token for token.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "model/perf_model.h"
#include "model/synthetic_model.h"
#include "model/v4_model.h"

namespace tern::model {
namespace {

// The tiny shape (V4-Flash's MTP layer included) with a small vocabulary: the head is most of a CPU step.
ModelConfig small_config() {
  ModelConfig c = ModelConfig::tiny();
  c.vocab_size = 512;
  return c;
}

SyntheticModel build(uint64_t seed, int64_t budget = -1) {
  SyntheticModelOptions o;
  o.seed = seed;
  o.weight_budget_bytes = budget;
  return build_synthetic_model(small_config(), cpu::context(), o);
}

uint64_t aligned(uint64_t n) {
  return (n + 255) / 256 * 256;
}

TEST(SyntheticMtp, BuiltAsTheOfficialCheckpointHasIt) {
  const SyntheticModel s = build(7);
  const ModelConfig& c = s.weights.config;
  ASSERT_TRUE(s.weights.mtp.has_value());
  const MtpWeights& m = *s.weights.mtp;
  EXPECT_EQ(m.block.index, c.num_layers);
  EXPECT_EQ(m.block.attn_kind, AttnKind::sliding);
  EXPECT_FALSE(m.block.attn.compressor.has_value());
  EXPECT_FALSE(m.block.attn.indexer.has_value());
  EXPECT_FALSE(m.block.hash_routed);
  EXPECT_EQ(m.block.ffn.gate_bias.shape(), (Shape{c.n_routed_experts}));
  EXPECT_TRUE(m.block.ffn.tid2eid.empty());
  for (const Linear* l :
       {&m.e_proj, &m.h_proj, &m.block.attn.wq_a, &m.block.attn.wo_b, &m.block.ffn.shared.w2}) {
    EXPECT_EQ(l->format, WeightFormat::fp8_block) << l->name;
  }
  EXPECT_EQ(m.e_proj.name, "mtp.0.e_proj.weight");
  EXPECT_EQ(m.e_proj.weight.shape(), (Shape{c.hidden_size, c.hidden_size}));
  EXPECT_EQ(m.block.ffn.experts.size(), static_cast<size_t>(c.n_routed_experts));
  EXPECT_EQ(m.block.ffn.experts[0].w1.format, WeightFormat::mxfp4);
  EXPECT_EQ(m.hc_head.fn.shape(), (Shape{c.hc_mult, c.hc_mult * c.hidden_size}));
  EXPECT_EQ(m.hc_head.fn.dtype(), DType::f32);
  EXPECT_EQ(m.norm.dtype(), s.weights.norm.dtype());
  EXPECT_EQ(m.enorm.shape(), (Shape{c.hidden_size}));
  // Its own experts, not a trunk layer's, when everything fits.
  EXPECT_NE(m.block.ffn.experts[0].w1.weight.data(), s.weights.layers[0].ffn.experts[0].w1.weight.data());
  // Counted: the sizes have it, and the storage is what the plan says.
  EXPECT_EQ(s.sizes.mtp_layers, 1);
  EXPECT_EQ(s.sizes.expert_layers(), c.num_layers + 1);
  EXPECT_EQ(s.sharing.num_layers, c.num_layers + 1);
  EXPECT_EQ(s.sharing.stored_bytes, s.sizes.total_bytes());
  EXPECT_EQ(s.weights.num_bytes, s.sizes.total_bytes());
  EXPECT_NE(s.sharing.description.find("every layer has its own routed experts (the MTP layer's too): "),
            std::string::npos)
      << s.sharing.description;

  // Without num_nextn_predict_layers: no MTP layer, nothing counted for it.
  ModelConfig none = small_config();
  none.num_mtp_layers = 0;
  none.mtp_compress_ratios.clear();
  SyntheticModelOptions o;
  const SyntheticModel n = build_synthetic_model(none, cpu::context(), o);
  EXPECT_FALSE(n.weights.mtp.has_value());
  EXPECT_EQ(n.sizes.mtp_dense_bytes, 0u);
  EXPECT_EQ(s.sizes.total_bytes() - n.sizes.total_bytes(),
            s.sizes.mtp_dense_bytes + s.sizes.layer_expert_bytes());
  // tern implements the SWA-only MTP layer: another ratio is refused.
  ModelConfig csa = small_config();
  csa.mtp_compress_ratios = {4};
  EXPECT_THROW(build_synthetic_model(csa, cpu::context(), o), Error);
}

// The MTP layer's dense part is a sliding, score-routed trunk layer's plus its own tensors, byte for byte.
TEST(SyntheticMtpSizes, FullModelMtpLayer) {
  const ModelConfig c = ModelConfig::v4_flash();
  ASSERT_EQ(c.num_mtp_layers, 1);
  const SyntheticSizes s = synthetic_sizes(c, WeightFormat::mxfp4);
  ASSERT_EQ(s.mtp_layers, 1);
  ASSERT_EQ(c.attn_kind(1), AttnKind::sliding);
  ASSERT_TRUE(c.hash_routed(1));  // layer 1: sliding, hash-routed (tid2eid instead of the gate bias)
  const auto D = static_cast<uint64_t>(c.hidden_size), hc = static_cast<uint64_t>(c.hc_mult);
  const uint64_t fp8_dd =
      D * D + aligned(((D + 127) / 128) * ((D + 127) / 128));  // e_proj or h_proj, with scales
  const uint64_t own = 3 * aligned(2 * D)                      // enorm, hnorm, norm (bf16)
                       + 2 * fp8_dd + aligned(4 * hc * hc * D) + aligned(4 * hc) +
                       aligned(4);  // hc_head (f32)
  EXPECT_EQ(s.mtp_dense_bytes, s.layer_dense_bytes[1] - s.layer_table_bytes[1] +
                                   aligned(4 * static_cast<uint64_t>(c.n_routed_experts)) + own);
  const double mtp_layer = static_cast<double>(s.mtp_dense_bytes + s.layer_expert_bytes());
  std::printf("V4-Flash MTP layer: %.1f MB dense + %.1f MB routed experts (mxfp4) = %.2f GB; model %.1f GB\n",
              static_cast<double>(s.mtp_dense_bytes) / 1e6, static_cast<double>(s.layer_expert_bytes()) / 1e6,
              mtp_layer / 1e9, static_cast<double>(s.total_bytes()) / 1e9);
  // One draft step reads the MTP layer's dense part, the head and the experts its batch touches.
  EXPECT_DOUBLE_EQ(mtp_draft_step_bytes(s, c, 1), static_cast<double>(s.mtp_dense_bytes + s.head_bytes) +
                                                      6.0 * static_cast<double>(s.expert_bytes));
  // A decode step does not run it: the trunk's bytes alone.
  const SyntheticSizes trunk = [&] {
    ModelConfig t = c;
    t.num_mtp_layers = 0;
    t.mtp_compress_ratios.clear();
    return synthetic_sizes(t, WeightFormat::mxfp4);
  }();
  EXPECT_DOUBLE_EQ(decode_step_bytes(s, c, 64), decode_step_bytes(trunk, c, 64));
  EXPECT_EQ(s.total_bytes() - trunk.total_bytes(), s.mtp_dense_bytes + s.layer_expert_bytes());
}

// Too little memory for every layer's experts: the MTP layer, last in the order, reads a trunk layer's.
TEST(SyntheticMtp, SharesExpertsLastAndRuns) {
  const SyntheticSizes s = synthetic_sizes(small_config(), WeightFormat::mxfp4);
  // Every trunk layer's experts fit, the MTP layer's do not.
  const auto budget =
      static_cast<int64_t>(s.dense_bytes() + 4 * s.layer_expert_bytes() + s.layer_expert_bytes() / 2);
  SyntheticModel m = build(8, budget);
  ASSERT_EQ(m.sharing.own_layers, 4);
  EXPECT_EQ(
      m.sharing.description.rfind("the MTP layer (as layer 4) reuses the routed experts of layer 0: ", 0), 0u)
      << m.sharing.description;
  EXPECT_EQ(m.weights.mtp->block.ffn.experts[3].w2.weight.data(),
            m.weights.layers[0].ffn.experts[3].w2.weight.data());
  EXPECT_LE(m.sharing.stored_bytes, static_cast<uint64_t>(budget));
  Model model(std::move(m.weights), KvMode::exact, cpu::context());
  ASSERT_TRUE(model.has_mtp());
  GenerateOptions o;
  o.max_new_tokens = 6;
  o.speculative_tokens = 2;
  cache::SequenceState state = model.new_state(16);
  const std::vector<int64_t> prompt = {0, 17, 203, 45};
  EXPECT_EQ(generate(model, state, prompt, o).tokens.size(), 6u);
}

TEST(SyntheticMtp, ForwardGivesFiniteLogits) {
  Model m(std::move(build(9).weights), KvMode::exact, cpu::context());
  ASSERT_TRUE(m.has_mtp());
  const int64_t V = m.config().vocab_size;
  const std::vector<int64_t> ids = {0, 17, 203, 45, 311, 8, 99};
  const auto T = static_cast<int64_t>(ids.size());
  cache::SequenceState state = m.new_state(T + 2);
  // The trunk's pre-hc_head streams of every prompt token, then the MTP layer over rows 0..T-2 (the next
  // token of each is known) and the last row with a sampled token.
  const StepSequence seq{&state, ids, LogitsFor::none};
  const LogitsFor all = LogitsFor::all;
  Tensor streams;
  m.forward({&seq, 1}, {&all, 1}, streams);
  ASSERT_EQ(streams.shape(), (Shape{T, m.config().hc_mult, m.config().hidden_size}));
  std::vector<int64_t> next(ids.begin() + 1, ids.end());
  next.push_back(5);
  const Model::MtpStep step{&state, 0, streams.view(), next, LogitsFor::all};
  const Model::MtpResult r = m.mtp_forward({&step, 1});
  ASSERT_EQ(r.logits.shape(), (Shape{T, V}));
  ASSERT_EQ(r.streams.shape(), streams.shape());
  double spread = 0;
  for (int64_t i = 0; i < r.logits.numel(); ++i) {
    const float x = r.logits.data<float>()[i];
    ASSERT_TRUE(std::isfinite(x)) << i;
    spread = std::max(spread, std::fabs(static_cast<double>(x - r.logits.data<float>()[0])));
  }
  EXPECT_GT(spread, 0.0);  // not a constant row: the weights are not zeros
}

TEST(SyntheticMtp, SpeculativeGreedyEqualsPlain) {
  Model m(std::move(build(10).weights), KvMode::exact, cpu::context());
  const std::vector<int64_t> prompt = {0, 17, 203, 45, 311, 8, 99, 421, 3};
  auto run = [&](const GenerateOptions& o) {
    cache::SequenceState state = m.new_state(static_cast<int64_t>(prompt.size()) + o.max_new_tokens);
    return generate(m, state, prompt, o);
  };
  GenerateOptions plain;
  plain.max_new_tokens = 20;
  plain.prefill_chunk = 4;
  const std::vector<int64_t> want = run(plain).tokens;
  ASSERT_EQ(want.size(), 20u);
  for (int mode = 0; mode < 2; ++mode) {  // the MTP layer's own drafts; an oracle's kept with probability 1/2
    GenerateOptions o = plain;
    o.speculative_tokens = 2;
    o.seed = 3;
    if (mode == 1) o.draft_oracle = want, o.oracle_accept = 0.5;
    const GenerateResult got = run(o);
    EXPECT_EQ(got.tokens, want) << "mode " << mode;
    EXPECT_GT(got.rounds, 0) << "mode " << mode;
    EXPECT_GT(got.drafts, got.rounds) << "mode " << mode;  // 2 a round (the last may draft fewer)
    if (mode == 1) {
      EXPECT_GT(got.accepted, 0);
    }
  }
}

}  // namespace
}  // namespace tern::model
