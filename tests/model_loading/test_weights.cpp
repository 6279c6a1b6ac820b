// Weight binding: synthetic checkpoints in every format and both namings load with the right
// shapes and formats; a missing tensor, a wrong shape or dtype is an error naming file and tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "model/checkpoint.h"
#include "model/safetensors_writer.h"
#include "model/synth.h"
#include "model/weights.h"
#include "test_helpers.h"

namespace tern::model {
namespace {

using testing::expect_error;
using testing::read_file;
using testing::ScratchDir;
using testing::write_file;

ModelConfig small_config() {
  ModelConfig c = ModelConfig::tiny();
  c.vocab_size = 512;
  return c;
}

// Copies a single-file checkpoint, letting `edit` change (or drop, by returning false) each tensor.
using Edit = std::function<bool(std::string& name, DType& dtype, Shape& shape, std::vector<std::byte>& bytes)>;
void rewrite(const std::string& src, const std::string& dst, const Edit& edit) {
  const Checkpoint ck = Checkpoint::open(src);
  SafetensorsWriter w;
  for (std::string n : ck.names()) {
    const TensorView v = ck.get(n);
    DType t = v.dtype();
    Shape s = v.shape();
    std::vector<std::byte> b(v.nbytes());
    std::memcpy(b.data(), v.data(), b.size());
    if (!edit(n, t, s, b)) continue;
    w.add_bytes(n, t, s, std::move(b));
  }
  std::filesystem::create_directories(dst);
  w.write(dst + "/model.safetensors");
  write_file(dst + "/config.json", read_file(src + "/config.json"));
}

void check_common(const ModelWeights& w, const ModelConfig& c) {
  EXPECT_EQ(w.config.num_layers, c.num_layers);
  EXPECT_EQ(w.embed.shape(), (Shape{c.vocab_size, c.hidden_size}));
  EXPECT_EQ(w.head.out, c.vocab_size);
  EXPECT_EQ(w.hc_head.fn.shape(), (Shape{c.hc_mult, c.hc_mult * c.hidden_size}));
  EXPECT_EQ(w.hc_head.scale.shape(), (Shape{1}));
  ASSERT_EQ(static_cast<int>(w.layers.size()), c.num_layers);
  for (const LayerWeights& L : w.layers) {
    SCOPED_TRACE(L.index);
    EXPECT_EQ(L.attn_kind, c.attn_kind(L.index));
    EXPECT_EQ(L.hc_attn.fn.dtype(), DType::f32);
    EXPECT_EQ(L.hc_attn.fn.shape(), (Shape{(2 + c.hc_mult) * c.hc_mult, c.hc_mult * c.hidden_size}));
    EXPECT_EQ(L.attn.attn_sink.dtype(), DType::f32);
    EXPECT_EQ(L.attn.wo_a.out, c.o_groups * c.o_lora_rank);
    EXPECT_EQ(L.attn.wo_a.in, c.num_heads * c.head_dim / c.o_groups);
    EXPECT_EQ(L.attn.compressor.has_value(), L.attn_kind != AttnKind::sliding);
    EXPECT_EQ(L.attn.indexer.has_value(), L.attn_kind == AttnKind::csa);
    if (L.attn.compressor) {
      const CompressorWeights& cw = *L.attn.compressor;
      const int64_t ch = L.attn_kind == AttnKind::csa ? 2 * c.head_dim : c.head_dim;
      EXPECT_EQ(cw.ratio, c.compress_ratio(L.index));
      EXPECT_EQ(cw.overlap, L.attn_kind == AttnKind::csa);
      EXPECT_EQ(cw.wkv.out, ch);
      EXPECT_EQ(cw.ape.shape(), (Shape{cw.ratio, ch}));
      EXPECT_EQ(cw.ape.dtype(), DType::f32);
    }
    if (L.attn.indexer) {
      EXPECT_EQ(L.attn.indexer->compressor.width, c.index_head_dim);
      EXPECT_EQ(L.attn.indexer->compressor.ape.shape(), (Shape{c.csa_ratio, 2 * c.index_head_dim}));
      EXPECT_EQ(L.attn.indexer->weights_proj.out, c.index_n_heads);
    }
    EXPECT_EQ(L.hash_routed, L.index < c.num_hash_layers);
    EXPECT_EQ(L.ffn.tid2eid.empty(), !L.hash_routed);
    EXPECT_EQ(L.ffn.gate_bias.empty(), L.hash_routed);
    ASSERT_EQ(static_cast<int>(L.ffn.experts.size()), c.n_routed_experts);
    EXPECT_EQ(L.ffn.experts[3].w2.out, c.hidden_size);
    EXPECT_EQ(L.ffn.experts[3].w2.in, c.moe_intermediate_size);
  }
}

TEST(LoadModel, OfficialMxfp4Sharded) {
  ScratchDir dir("w");
  const ModelConfig c = small_config();
  write_synthetic_checkpoint(c, dir.str(), 3, WeightFormat::mxfp4, 3);
  const ModelWeights w = load_model(dir.str());
  check_common(w, c);
  EXPECT_EQ(w.naming, "official");
  EXPECT_EQ(w.num_files, 3);
  EXPECT_EQ(w.config.expert_format, WeightFormat::mxfp4);
  EXPECT_TRUE(w.config.fp8_dense);
  const Linear& wq = w.layers[1].attn.wq_b;
  EXPECT_EQ(wq.format, WeightFormat::fp8_block);
  EXPECT_EQ(wq.weight.dtype(), DType::e4m3);
  EXPECT_EQ(wq.scale.shape(), (Shape{8, 1}));  // [ceil(1024/128), ceil(128/128)]
  EXPECT_EQ(wq.scale.dtype(), DType::e8m0);
  const Linear& e = w.layers[2].ffn.experts[5].w1;
  EXPECT_EQ(e.format, WeightFormat::mxfp4);
  EXPECT_EQ(e.in, c.hidden_size);  // logical width
  EXPECT_EQ(e.weight.shape(), (Shape{c.moe_intermediate_size, c.hidden_size / 2}));
  EXPECT_EQ(e.scale.shape(), (Shape{c.moe_intermediate_size, c.hidden_size / 32}));
  EXPECT_EQ(e.name, "layers.2.ffn.experts.5.w1.weight");
  EXPECT_EQ(w.layers[0].ffn.tid2eid.shape(), (Shape{c.vocab_size, c.experts_per_token}));
  EXPECT_EQ(w.layers[0].attn_norm.dtype(), DType::bf16);
  EXPECT_EQ(w.head.format, WeightFormat::bf16);
}

TEST(LoadModel, OfficialNvfp4) {
  ScratchDir dir("w");
  const ModelConfig c = small_config();
  write_synthetic_checkpoint(c, dir.str(), 4, WeightFormat::nvfp4, 1);
  const ModelWeights w = load_model(dir.str());
  check_common(w, c);
  const Linear& e = w.layers[3].ffn.experts[0].w3;
  EXPECT_EQ(e.format, WeightFormat::nvfp4);
  EXPECT_EQ(e.weight.dtype(), DType::u8);
  EXPECT_EQ(e.scale.dtype(), DType::ue4m3);
  EXPECT_EQ(e.scale.shape(), (Shape{c.moe_intermediate_size, c.hidden_size / 16}));
  EXPECT_GT(e.global_scale, 0.0f);
  EXPECT_EQ(w.config.expert_format, WeightFormat::nvfp4);
}

TEST(LoadModel, ExpertFormatInferredWhenConfigDoesNotSayIt) {
  ScratchDir dir("w");
  write_synthetic_checkpoint(small_config(), dir.str(), 4, WeightFormat::nvfp4, 1);
  auto j = nlohmann::json::parse(read_file(dir.file("config.json")));
  j.erase("expert_format");  // expert_dtype "fp4" alone would mean MXFP4
  write_file(dir.file("config.json"), j.dump());
  EXPECT_EQ(load_model(dir.str()).config.expert_format, WeightFormat::nvfp4);
  j["expert_format"] = "mxfp4";
  write_file(dir.file("config.json"), j.dump());
  expect_error([&] { load_model(dir.str()); },
               {"model.safetensors", "tensor \"layers.0.ffn.experts.0.w1.weight\"",
                "expected mxfp4 (config.json \"expert_format\"), found nvfp4"});
}

TEST(LoadModel, Bf16Experts) {
  ScratchDir dir("w");
  const ModelConfig c = small_config();
  write_synthetic_checkpoint(c, dir.str(), 5, WeightFormat::bf16, 1);
  const ModelWeights w = load_model(dir.str());
  check_common(w, c);
  EXPECT_EQ(w.layers[0].ffn.experts[7].w2.format, WeightFormat::bf16);
}

TEST(LoadModel, TransformersNamesStackedExperts) {
  ScratchDir dir("w");
  const ModelConfig c = small_config();
  SynthOptions o;
  o.seed = 6;
  o.experts = WeightFormat::bf16;
  o.num_shards = 2;
  o.transformers_names = true;
  write_synthetic_checkpoint(c, dir.str(), o);
  const Checkpoint ck = Checkpoint::open(dir.str());
  EXPECT_TRUE(ck.has("model.layers.1.self_attn.compressor.indexer.scorer.weights_proj.weight"));
  EXPECT_TRUE(ck.has("lm_head.weight"));
  const ModelWeights w = load_model(dir.str());
  check_common(w, c);
  EXPECT_EQ(w.naming, "transformers");
  EXPECT_FALSE(w.config.fp8_dense);
  EXPECT_EQ(w.layers[1].attn.wq_a.format, WeightFormat::bf16);
  // Expert e's w1 / w3 are rows [0, I) / [I, 2I) of gate_up_proj[e]; w2 is down_proj[e].
  const TensorView gu = ck.get("model.layers.2.mlp.experts.gate_up_proj");
  const TensorView dn = ck.get("model.layers.2.mlp.experts.down_proj");
  const int64_t I = c.moe_intermediate_size, D = c.hidden_size;
  const auto* g = gu.data_as<const uint16_t>();
  const ExpertWeights& e3 = w.layers[2].ffn.experts[3];
  const size_t bytes = static_cast<size_t>(I * D * 2);
  EXPECT_EQ(std::memcmp(e3.w1.weight.data(), g + 3 * 2 * I * D, bytes), 0);
  EXPECT_EQ(std::memcmp(e3.w3.weight.data(), g + (3 * 2 * I + I) * D, bytes), 0);
  EXPECT_EQ(std::memcmp(e3.w2.weight.data(), dn.data_as<const uint16_t>() + 3 * D * I, bytes), 0);
  EXPECT_NE(std::memcmp(e3.w1.weight.data(), e3.w3.weight.data(), bytes), 0);
  EXPECT_EQ(e3.w1.weight.shape(), (Shape{I, D}));
  EXPECT_EQ(e3.w2.weight.shape(), (Shape{D, I}));
}

TEST(TransformersName, FollowsTheConversionMapping) {
  const std::pair<const char*, const char*> cases[] = {
      {"embed.weight", "model.embed_tokens.weight"},
      {"head.weight", "lm_head.weight"},
      {"norm.weight", "model.norm.weight"},
      {"hc_head_fn", "model.hc_head.hc_fn"},
      {"layers.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"},
      {"layers.0.ffn_norm.weight", "model.layers.0.post_attention_layernorm.weight"},
      {"layers.0.hc_attn_fn", "model.layers.0.attn_hc.fn"},
      {"layers.0.hc_ffn_scale", "model.layers.0.ffn_hc.scale"},
      {"layers.0.attn.attn_sink", "model.layers.0.self_attn.sinks"},
      {"layers.0.attn.wq_a.weight", "model.layers.0.self_attn.q_a_proj.weight"},
      {"layers.0.attn.q_norm.weight", "model.layers.0.self_attn.q_a_norm.weight"},
      {"layers.0.attn.wq_b.weight", "model.layers.0.self_attn.q_b_proj.weight"},
      {"layers.0.attn.wkv.weight", "model.layers.0.self_attn.kv_proj.weight"},
      {"layers.0.attn.kv_norm.weight", "model.layers.0.self_attn.kv_norm.weight"},
      {"layers.0.attn.wo_a.weight", "model.layers.0.self_attn.o_a_proj.weight"},
      {"layers.0.attn.wo_b.weight", "model.layers.0.self_attn.o_b_proj.weight"},
      {"layers.1.attn.compressor.ape", "model.layers.1.self_attn.compressor.position_bias"},
      {"layers.1.attn.compressor.wkv.weight", "model.layers.1.self_attn.compressor.kv_proj.weight"},
      {"layers.1.attn.compressor.wgate.weight", "model.layers.1.self_attn.compressor.gate_proj.weight"},
      {"layers.1.attn.compressor.norm.weight", "model.layers.1.self_attn.compressor.kv_norm.weight"},
      {"layers.1.attn.indexer.wq_b.weight", "model.layers.1.self_attn.compressor.indexer.q_b_proj.weight"},
      {"layers.1.attn.indexer.weights_proj.weight",
       "model.layers.1.self_attn.compressor.indexer.scorer.weights_proj.weight"},
      {"layers.1.attn.indexer.compressor.ape", "model.layers.1.self_attn.compressor.indexer.position_bias"},
      {"layers.1.attn.indexer.compressor.norm.weight", "model.layers.1.self_attn.compressor.indexer.kv_norm.weight"},
      {"layers.2.ffn.gate.weight", "model.layers.2.mlp.gate.weight"},
      {"layers.2.ffn.gate.bias", "model.layers.2.mlp.gate.e_score_correction_bias"},
      {"layers.0.ffn.gate.tid2eid", "model.layers.0.mlp.gate.tid2eid"},
      {"layers.0.ffn.shared_experts.w1.weight", "model.layers.0.mlp.shared_experts.gate_proj.weight"},
      {"layers.0.ffn.shared_experts.w2.weight", "model.layers.0.mlp.shared_experts.down_proj.weight"},
      {"layers.0.ffn.shared_experts.w3.weight", "model.layers.0.mlp.shared_experts.up_proj.weight"},
  };
  for (const auto& [official, hf] : cases) EXPECT_EQ(transformers_name(official), hf) << official;
}

// --- binding errors: one tensor rewritten in a synthetic checkpoint ----------------------------------

class BindErrors : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    src_ = new ScratchDir("bind-src");
    write_synthetic_checkpoint(small_config(), src_->str(), 9, WeightFormat::mxfp4, 1);
  }
  static void TearDownTestSuite() {
    delete src_;
    src_ = nullptr;
  }
  void expect_load_error(const Edit& edit, const std::vector<std::string>& parts) {
    ScratchDir dst("bind");
    rewrite(src_->str(), dst.str(), edit);
    std::vector<std::string> all = parts;
    all.push_back(dst.file("model.safetensors"));
    expect_error([&] { load_model(dst.str()); }, all);
  }
  static ScratchDir* src_;
};
ScratchDir* BindErrors::src_ = nullptr;

TEST_F(BindErrors, UnchangedCopyLoads) {
  ScratchDir dst("bind");
  rewrite(src_->str(), dst.str(), [](auto&&...) { return true; });
  EXPECT_NO_THROW(load_model(dst.str()));
}

TEST_F(BindErrors, MissingTensor) {
  expect_load_error([](const std::string& n, auto&, auto&, auto&) { return n != "layers.1.attn.indexer.weights_proj.weight"; },
                    {"tensor \"layers.1.attn.indexer.weights_proj.weight\" is missing"});
}

TEST_F(BindErrors, MissingScale) {
  expect_load_error([](const std::string& n, auto&, auto&, auto&) { return n != "layers.3.attn.wo_b.scale"; },
                    {"tensor \"layers.3.attn.wo_b.scale\" is missing", "expected F8_E8M0, U8 or F32 [2, 1]"});
}

TEST_F(BindErrors, WrongShape) {
  expect_load_error(
      [](const std::string& n, DType&, Shape& s, std::vector<std::byte>& b) {
        if (n == "layers.0.attn_norm.weight") {
          s = Shape{128};
          b.resize(256);
        }
        return true;
      },
      {"tensor \"layers.0.attn_norm.weight\": expected shape [256], found [128]"});
}

TEST_F(BindErrors, WrongShapeOfAPackedExpert) {
  expect_load_error(
      [](const std::string& n, DType&, Shape& s, std::vector<std::byte>&) {
        if (n == "layers.2.ffn.experts.1.w2.weight") s = Shape{64, 256};  // transposed; [D, I/2] expected
        return true;
      },
      {"tensor \"layers.2.ffn.experts.1.w2.weight\": expected shape [256, 64], found [64, 256]"});
}

TEST_F(BindErrors, WrongDtype) {
  expect_load_error(
      [](const std::string& n, DType& t, Shape&, std::vector<std::byte>&) {
        if (n == "layers.0.attn.attn_sink") t = DType::i32;
        return true;
      },
      {"tensor \"layers.0.attn.attn_sink\": expected dtype F32, BF16 or F16, found I32"});
}

TEST_F(BindErrors, WrongLinearDtype) {
  expect_load_error(
      [](const std::string& n, DType& t, Shape&, std::vector<std::byte>&) {
        if (n == "layers.1.attn.wkv.weight") t = DType::i8;
        return true;
      },
      {"tensor \"layers.1.attn.wkv.weight\": packed FP4 (I8) is only supported for routed experts"});
}

TEST_F(BindErrors, Tid2eidOutOfRange) {
  expect_load_error(
      [](const std::string& n, DType&, Shape&, std::vector<std::byte>& b) {
        if (n == "layers.1.ffn.gate.tid2eid") {
          const int64_t bad = 8;
          std::memcpy(b.data() + 8 * 5, &bad, 8);  // row 2, second pick
        }
        return true;
      },
      {"tensor \"layers.1.ffn.gate.tid2eid\": row 2 names expert 8, expected 0..7"});
}

TEST_F(BindErrors, Bf16AttnSinkIsWidenedToF32) {
  ScratchDir dst("bind");
  rewrite(src_->str(), dst.str(), [](const std::string& n, DType& t, Shape&, std::vector<std::byte>& b) {
    if (n == "layers.0.attn.attn_sink") {
      const uint16_t v[4] = {f32_to_bf16(1.5f), f32_to_bf16(-2.0f), f32_to_bf16(0.25f), f32_to_bf16(3.0f)};
      t = DType::bf16;
      b.resize(8);
      std::memcpy(b.data(), v, 8);
    }
    return true;
  });
  const ModelWeights w = load_model(dst.str());
  const TensorView s = w.layers[0].attn.attn_sink;
  ASSERT_EQ(s.dtype(), DType::f32);
  EXPECT_EQ(s.data_as<const float>()[1], -2.0f);
  EXPECT_EQ(s.data_as<const float>()[3], 3.0f);
}

// transformers-style FP8 scales: f32 `weight_scale_inv` holding powers of two, converted to e8m0.
Edit scale_inv_edit(float factor) {
  return [factor](std::string& n, DType& t, Shape&, std::vector<std::byte>& b) {
    if (n != "layers.0.attn.wq_a.scale") return true;
    n = "layers.0.attn.wq_a.weight_scale_inv";
    std::vector<std::byte> f(b.size() * 4);
    for (size_t i = 0; i < b.size(); ++i) {
      const float v = e8m0_to_f32(static_cast<uint8_t>(b[i])) * factor;
      std::memcpy(f.data() + 4 * i, &v, 4);
    }
    t = DType::f32;
    b = std::move(f);
    return true;
  };
}

TEST_F(BindErrors, F32PowerOfTwoScalesBecomeE8m0) {
  ScratchDir dst("bind");
  rewrite(src_->str(), dst.str(), scale_inv_edit(1.0f));
  const ModelWeights w = load_model(dst.str());
  const Checkpoint ck = Checkpoint::open(src_->str());
  const Linear& l = w.layers[0].attn.wq_a;
  ASSERT_EQ(l.scale.dtype(), DType::e8m0);
  ASSERT_EQ(l.scale.nbytes(), ck.get("layers.0.attn.wq_a.scale").nbytes());
  EXPECT_EQ(std::memcmp(l.scale.data(), ck.get("layers.0.attn.wq_a.scale").data(), l.scale.nbytes()), 0);
}

TEST_F(BindErrors, F32ScalesThatAreNotPowersOfTwo) {
  expect_load_error(scale_inv_edit(1.5f), {"tensor \"layers.0.attn.wq_a.weight_scale_inv\": element 0 is",
                                           "not a power of two"});
}

TEST_F(BindErrors, U8ScalesAreTheSameBits) {
  ScratchDir dst("bind");
  rewrite(src_->str(), dst.str(), [](std::string& n, DType& t, Shape&, std::vector<std::byte>&) {
    if (n == "layers.2.ffn.experts.0.w1.scale" || n == "layers.2.attn.wkv.scale") t = DType::u8;
    return true;
  });
  const ModelWeights w = load_model(dst.str());
  EXPECT_EQ(w.layers[2].ffn.experts[0].w1.scale.dtype(), DType::e8m0);
  EXPECT_EQ(w.layers[2].attn.wkv.scale.dtype(), DType::e8m0);
}

TEST_F(BindErrors, ConfigDisagreesWithTheTensors) {
  ScratchDir dst("bind");
  rewrite(src_->str(), dst.str(), [](auto&&...) { return true; });
  auto j = nlohmann::json::parse(read_file(dst.file("config.json")));
  j["o_lora_rank"] = 32;
  write_file(dst.file("config.json"), j.dump());
  expect_error([&] { load_model(dst.str()); },
               {dst.file("model.safetensors"), "tensor \"layers.0.attn.wo_a.weight\": expected shape [64, 512], found [128, 512]"});
}

TEST(LoadModel, NotAV4Checkpoint) {
  ScratchDir dir("w");
  write_file(dir.file("config.json"), ModelConfig::tiny().to_json_text());
  SafetensorsWriter w;
  w.add("transformer.wte.weight", DType::bf16, Shape{4}, nullptr);
  w.write(dir.file("model.safetensors"));
  expect_error([&] { load_model(dir.str()); }, {"model.safetensors", "tensor \"embed.weight\" is missing"});
}

TEST(LoadModel, MissingConfig) {
  ScratchDir dir("w");
  expect_error([&] { load_model(dir.str()); }, {"config.json: cannot open"});
}

// --- the committed fixtures of the PyTorch reference (skipped until they exist) ----------------------

class Fixtures : public ::testing::TestWithParam<const char*> {};

TEST_P(Fixtures, Load) {
  const std::string dir = std::string(TERN_FIXTURES_DIR) + "/" + GetParam();
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << dir << " not present";
  const ModelWeights w = load_model(dir);
  check_common(w, w.config);
  const WeightFormat want = std::string(GetParam()).find("nvfp4") != std::string::npos ? WeightFormat::nvfp4 : WeightFormat::mxfp4;
  EXPECT_EQ(w.config.expert_format, want);
  EXPECT_EQ(w.naming, "official");
}

INSTANTIATE_TEST_SUITE_P(Tiny, Fixtures, ::testing::Values("tiny-mxfp4", "tiny-nvfp4"));

}  // namespace
}  // namespace tern::model
