// The synthetic model built in place (model/synthetic_model.h) on the CPU backend, its expert-sharing planner,
// and the performance model of `tern bench-step` (model/perf_model.h). Its MTP layer: test_synthetic_mtp.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "model/perf_model.h"
#include "model/synthetic_model.h"
#include "model/v4_model.h"
#include "model/v4_batch.h"
#include "ops/linear.h"

namespace tern::model {
namespace {

SyntheticModel build(uint64_t seed, WeightFormat experts = WeightFormat::mxfp4, int64_t budget = -1) {
  SyntheticModelOptions o;
  o.seed = seed;
  o.experts = experts;
  o.weight_budget_bytes = budget;
  return build_synthetic_model(ModelConfig::tiny(), cpu::context(), o);
}

bool same_bytes(const TensorView& a, const TensorView& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}
bool all_zero(const TensorView& v) {
  const auto* p = static_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.nbytes(); ++i)
    if (p[i] != 0) return false;
  return true;
}

// Every tensor of a layer with its name, for the all-tensor checks.
std::vector<std::pair<std::string, TensorView>> layer_tensors(const LayerWeights& L) {
  std::vector<std::pair<std::string, TensorView>> v;
  auto lin = [&](const Linear& l) {
    v.emplace_back(l.name, l.weight);
    if (!l.scale.empty()) v.emplace_back(l.name + " scale", l.scale);
  };
  v.emplace_back("attn_norm", L.attn_norm);
  v.emplace_back("hc_attn.fn", L.hc_attn.fn);
  v.emplace_back("hc_ffn.scale", L.hc_ffn.scale);
  for (const Linear* l : {&L.attn.wq_a, &L.attn.wq_b, &L.attn.wkv, &L.attn.wo_a, &L.attn.wo_b}) lin(*l);
  v.emplace_back("attn_sink", L.attn.attn_sink);
  if (L.attn.compressor) lin(L.attn.compressor->wkv), v.emplace_back("ape", L.attn.compressor->ape);
  if (L.attn.indexer) lin(L.attn.indexer->wq_b), lin(L.attn.indexer->weights_proj);
  lin(L.ffn.gate);
  v.emplace_back("routing table", L.hash_routed ? L.ffn.tid2eid : L.ffn.gate_bias);
  for (const ExpertWeights& e : L.ffn.experts) lin(e.w1), lin(e.w2), lin(e.w3);
  lin(L.ffn.shared.w1), lin(L.ffn.shared.w2);
  return v;
}

// The std of W after dequantization, and whether every value is finite.
double dequantized_std(const Linear& l, bool* finite) {
  Tensor w(DType::f32, {l.out, l.in});
  ops::dequantize(cpu::context(), l, w);
  double sum = 0, sq = 0;
  *finite = true;
  for (int64_t i = 0; i < w.numel(); ++i) {
    const double x = w.data<float>()[i];
    *finite = *finite && std::isfinite(x);
    sum += x;
    sq += x * x;
  }
  const double n = static_cast<double>(w.numel());
  return std::sqrt(sq / n - (sum / n) * (sum / n));
}

TEST(SyntheticModelTest, DeterministicPerSeedAndNeverAllZero) {
  const SyntheticModel a = build(1), b = build(1), c = build(2);
  EXPECT_EQ(a.weights.naming, "synthetic");
  EXPECT_FALSE(a.sharing.shared());
  EXPECT_TRUE(same_bytes(a.weights.embed, b.weights.embed));
  EXPECT_FALSE(same_bytes(a.weights.embed, c.weights.embed));
  ASSERT_TRUE(a.weights.mtp.has_value());
  // Block l: a trunk layer, or (l == layers) the MTP layer with its own tensors.
  const auto block_tensors = [](const ModelWeights& w, size_t l) {
    if (l < w.layers.size()) return layer_tensors(w.layers[l]);
    const MtpWeights& m = *w.mtp;
    auto v = layer_tensors(m.block);
    for (const Linear* p : {&m.e_proj, &m.h_proj})
      v.emplace_back(p->name, p->weight), v.emplace_back(p->name + " scale", p->scale);
    v.emplace_back("mtp enorm", m.enorm), v.emplace_back("mtp hnorm", m.hnorm), v.emplace_back("mtp norm", m.norm);
    v.emplace_back("mtp hc_head fn", m.hc_head.fn), v.emplace_back("mtp hc_head base", m.hc_head.base);
    return v;
  };
  for (size_t l = 0; l <= a.weights.layers.size(); ++l) {
    const auto ta = block_tensors(a.weights, l), tb = block_tensors(b.weights, l), tc = block_tensors(c.weights, l);
    ASSERT_EQ(ta.size(), tb.size());
    for (size_t i = 0; i < ta.size(); ++i) {
      SCOPED_TRACE(ta[i].first);
      EXPECT_FALSE(all_zero(ta[i].second));
      EXPECT_TRUE(same_bytes(ta[i].second, tb[i].second));
      // Tiny scale tables of a different seed may agree; the values themselves may not.
      if (ta[i].second.nbytes() > 64 && ta[i].first.find("scale") == std::string::npos) {
        EXPECT_FALSE(same_bytes(ta[i].second, tc[i].second));
      }
    }
  }
}

TEST(SyntheticModelTest, ValuesFollowTheFileWritersRules) {
  for (WeightFormat f : {WeightFormat::mxfp4, WeightFormat::nvfp4}) {
    const SyntheticModel m = build(3, f);
    const LayerWeights& L = m.weights.layers[0];
    for (const Linear* l : {&L.attn.wq_a, &L.ffn.shared.w2, &L.ffn.experts[0].w1, &L.ffn.experts[1].w2,
                            &m.weights.mtp->e_proj, &m.weights.mtp->block.ffn.experts[2].w3}) {
      SCOPED_TRACE(l->name + " " + std::string(weight_format_name(l->format)));
      bool finite = false;
      const double sd = dequantized_std(*l, &finite);
      EXPECT_TRUE(finite);
      EXPECT_NEAR(sd * std::sqrt(static_cast<double>(l->in)), 1.0, 0.15);
    }
    EXPECT_EQ(L.ffn.experts[0].w1.format, f == WeightFormat::mxfp4 ? WeightFormat::mxfp4 : WeightFormat::nvfp4);
    EXPECT_EQ(L.attn.wq_a.format, WeightFormat::fp8_block);
  }
  // Norms 1 +- 0.1; tid2eid rows are distinct experts in range.
  const SyntheticModel m = build(4);
  const LayerWeights& L = m.weights.layers[0];
  ASSERT_TRUE(L.hash_routed);
  double sum = 0;
  for (int64_t i = 0; i < L.attn_norm.numel(); ++i) sum += bf16_to_f32(L.attn_norm.data_as<uint16_t>()[i]);
  EXPECT_NEAR(sum / static_cast<double>(L.attn_norm.numel()), 1.0, 0.03);
  const int64_t k = L.ffn.tid2eid.dim(1), E = m.weights.config.n_routed_experts;
  for (int64_t r = 0; r < L.ffn.tid2eid.dim(0); r += 97) {
    const int64_t* row = L.ffn.tid2eid.data_as<int64_t>() + r * k;
    for (int64_t j = 0; j < k; ++j) {
      ASSERT_GE(row[j], 0);
      ASSERT_LT(row[j], E);
      for (int64_t q = 0; q < j; ++q) ASSERT_NE(row[j], row[q]) << "row " << r;
    }
  }
}

TEST(SyntheticModelTest, SharedExpertStorageRunsAndSaysSo) {
  const SyntheticSizes s = synthetic_sizes(ModelConfig::tiny(), WeightFormat::mxfp4);
  // Room for the dense part and two layers' experts of four.
  const auto budget = static_cast<int64_t>(s.dense_bytes() + 2 * s.layer_expert_bytes() + s.layer_expert_bytes() / 2);
  SyntheticModel m = build(5, WeightFormat::mxfp4, budget);
  ASSERT_EQ(m.sharing.own_layers, 2);
  // The MTP layer counts as layer 4 (its index in the state layout): 4 mod 2 = 0.
  EXPECT_EQ(m.sharing.description.rfind("layers 2-3 and the MTP layer (as layer 4) reuse the routed experts of layers "
                                        "0-1 (layer l reads layer l mod 2's): ", 0), 0u)
      << m.sharing.description;
  EXPECT_EQ(m.weights.mtp->block.ffn.experts[5].w1.weight.data(),
            m.weights.layers[0].ffn.experts[5].w1.weight.data());
  EXPECT_EQ(m.weights.layers[2].ffn.experts[0].w1.weight.data(), m.weights.layers[0].ffn.experts[0].w1.weight.data());
  EXPECT_EQ(m.weights.layers[3].ffn.experts[7].w2.scale.data(), m.weights.layers[1].ffn.experts[7].w2.scale.data());
  EXPECT_NE(m.weights.layers[1].ffn.experts[0].w1.weight.data(), m.weights.layers[0].ffn.experts[0].w1.weight.data());
  EXPECT_LE(m.sharing.stored_bytes, static_cast<uint64_t>(budget));
  // The model runs: finite logits.
  Model model(std::move(m.weights), KvMode::fp8, cpu::context());
  cache::SequenceState state = model.new_state(32);
  const std::vector<int64_t> ids = {0, 17, 923, 4051, 77};
  const StepSequence seq{&state, ids, LogitsFor::last};
  const Tensor logits = model.forward({&seq, 1});
  for (int64_t i = 0; i < logits.numel(); ++i) ASSERT_TRUE(std::isfinite(logits.data<float>()[i])) << i;
}

TEST(ExpertSharingPlan, FullModelOnOneCard) {
  const SyntheticSizes s = synthetic_sizes(ModelConfig::v4_flash(), WeightFormat::mxfp4);
  // One expert: three [2048, 4096] MXFP4 matrices, 4.25 bits per weight (13.37 MB; performance.md's 12.98 MB
  // undercounts it by 3%); about 160 GB in all.
  const ModelConfig c = ModelConfig::v4_flash();
  EXPECT_EQ(s.expert_bytes, 3u * static_cast<uint64_t>(c.moe_intermediate_size * c.hidden_size / 2 +
                                                       c.moe_intermediate_size * c.hidden_size / 32));
  EXPECT_NEAR(static_cast<double>(s.total_bytes()) / 1e9, 160.0, 4.0);  // the MTP layer's 3.6 GB included
  EXPECT_FALSE(plan_expert_sharing(s, -1).shared());
  EXPECT_FALSE(plan_expert_sharing(s, static_cast<int64_t>(s.total_bytes())).shared());
  // Room for 40 layers' experts and a half: layers 40-42 and the MTP layer (layer 43 here) reuse 0-3.
  const auto budget40 = static_cast<int64_t>(s.dense_bytes() + 40 * s.layer_expert_bytes() + s.layer_expert_bytes() / 2);
  const ExpertSharing p = plan_expert_sharing(s, budget40);
  EXPECT_EQ(p.num_layers, 44);
  EXPECT_TRUE(p.mtp);
  EXPECT_EQ(p.own_layers, 40);
  EXPECT_EQ(p.source_layer(39), 39);
  EXPECT_EQ(p.source_layer(42), 2);
  EXPECT_EQ(p.source_layer(43), 3);
  EXPECT_EQ(p.description.rfind(
                "layers 40-42 and the MTP layer (as layer 43) reuse the routed experts of layers 0-3: ", 0),
            0u)
      << p.description;
  // Fewer own layers than shared ones: layer l reads l mod own.
  const ExpertSharing q =
      plan_expert_sharing(s, static_cast<int64_t>(s.dense_bytes() + 20 * s.layer_expert_bytes()));
  EXPECT_EQ(q.own_layers, 20);
  EXPECT_EQ(q.source_layer(42), 2);
  EXPECT_NE(q.description.find("layer l reads layer l mod 20's"), std::string::npos) << q.description;
  // Not even one layer's experts beside the dense part: refused.
  EXPECT_THROW(plan_expert_sharing(s, static_cast<int64_t>(s.dense_bytes())), Error);
}

TEST(PerfModel, MatchesThePerformanceDesign) {
  EXPECT_NEAR(expected_distinct_experts(256, 6, 1), 6.0, 1e-9);
  EXPECT_NEAR(expected_distinct_experts(256, 6, 64), 200.0, 2.0);
  const ModelConfig c = ModelConfig::v4_flash();
  const SyntheticSizes s = synthetic_sizes(c, WeightFormat::mxfp4);
  // performance.md's table (11.1 GB at batch 1, 119 GB at 64, 150 GB at 256), within its 3% expert undercount.
  EXPECT_NEAR(decode_step_bytes(s, c, 1) / 1e9, 11.1, 1.0);
  EXPECT_NEAR(decode_step_bytes(s, c, 64) / 1e9, 119.0, 6.0);
  EXPECT_NEAR(decode_step_bytes(s, c, 256) / 1e9, 150.0, 7.5);
  EXPECT_DOUBLE_EQ(decode_step_bytes(s, c, 7, 10.0) - decode_step_bytes(s, c, 7, 9.0),
                   static_cast<double>(c.num_layers) * static_cast<double>(s.expert_bytes));
  // About 13 B active parameters; an 8K prompt is about 0.25 PFLOP.
  EXPECT_NEAR(active_params_per_token(c, false) / 1e9, 13.2, 1.5);
  EXPECT_NEAR(prefill_flops(c, 8192) / 1e15, 0.25, 0.08);
}

}  // namespace
}  // namespace tern::model
