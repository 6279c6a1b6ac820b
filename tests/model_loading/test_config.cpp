// config.json parsing: the official keys, the transformers keys, round trips, and one test per
// validation error checking that the message names the file and the field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"

namespace tern::model {
namespace {

using json = nlohmann::json;

// The tiny fixture's config.json in the official key style (as tools/reference/make_fixtures.py writes it).
json official_tiny() {
  return json::parse(R"({
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "vocab_size": 512, "bos_token_id": 0, "eos_token_id": 1, "hidden_size": 256, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "qk_rope_head_dim": 64,
    "q_lora_rank": 128, "o_groups": 2, "o_lora_rank": 64, "n_routed_experts": 8, "n_shared_experts": 1,
    "num_experts_per_tok": 2, "moe_intermediate_size": 128, "hidden_act": "silu", "scoring_func": "sqrtsoftplus",
    "routed_scaling_factor": 1.5, "norm_topk_prob": true, "num_hash_layers": 2, "swiglu_limit": 10.0,
    "sliding_window": 16, "compress_ratios": [0, 4, 8, 4], "compress_rope_theta": 160000.0, "rope_theta": 10000.0,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32,
                     "beta_slow": 1},
    "max_position_embeddings": 1048576, "index_n_heads": 4, "index_head_dim": 128, "index_topk": 4, "hc_mult": 4,
    "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6, "num_nextn_predict_layers": 0,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
    "expert_dtype": "fp4", "some_future_key": {"anything": [1, 2]}
  })");
}

// The same model as transformers 5.17's DeepseekV4Config.to_json_string() writes it.
json transformers_tiny() {
  return json::parse(R"({
    "bos_token_id": 0, "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    "compress_rope_theta": 160000.0, "eos_token_id": 1, "hc_eps": 1e-06, "hc_mult": 4, "hc_sinkhorn_iters": 20,
    "head_dim": 256, "hidden_act": "silu", "hidden_size": 256, "index_head_dim": 128, "index_n_heads": 4,
    "index_topk": 4, "layer_types": ["sliding_attention", "compressed_sparse_attention",
                                     "heavily_compressed_attention", "compressed_sparse_attention"],
    "max_position_embeddings": 1048576, "mlp_layer_types": ["hash_moe", "hash_moe", "moe", "moe"],
    "model_type": "deepseek_v4", "moe_intermediate_size": 128, "n_routed_experts": 8, "n_shared_experts": 1,
    "norm_topk_prob": true, "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": 4,
    "num_key_value_heads": 1, "num_nextn_predict_layers": 0, "o_groups": 2, "o_lora_rank": 64,
    "partial_rotary_factor": 0.25, "q_lora_rank": 128, "rms_norm_eps": 1e-06,
    "rope_parameters": {"compress": {"attention_factor": 1.0, "beta_fast": 32, "beta_slow": 1, "factor": 16,
                                     "original_max_position_embeddings": 65536, "partial_rotary_factor": 0.25,
                                     "rope_theta": 160000.0, "rope_type": "yarn", "type": "yarn"},
                        "main": {"partial_rotary_factor": 0.25, "rope_theta": 10000.0, "rope_type": "default"}},
    "rope_theta": 10000.0, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus", "sliding_window": 16,
    "swiglu_limit": 10.0, "tie_word_embeddings": false, "vocab_size": 512
  })");
}

ModelConfig parse(const json& j) { return ModelConfig::from_json_text(j.dump(), "config.json"); }

void expect_same_model(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.num_heads, b.num_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.rope_dim, b.rope_dim);
  EXPECT_EQ(a.q_lora_rank, b.q_lora_rank);
  EXPECT_EQ(a.o_groups, b.o_groups);
  EXPECT_EQ(a.o_lora_rank, b.o_lora_rank);
  EXPECT_EQ(a.n_routed_experts, b.n_routed_experts);
  EXPECT_EQ(a.experts_per_token, b.experts_per_token);
  EXPECT_EQ(a.moe_intermediate_size, b.moe_intermediate_size);
  EXPECT_EQ(a.scoring_func, b.scoring_func);
  EXPECT_EQ(a.routed_scaling_factor, b.routed_scaling_factor);
  EXPECT_EQ(a.num_hash_layers, b.num_hash_layers);
  EXPECT_EQ(a.swiglu_limit, b.swiglu_limit);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.compress_ratios, b.compress_ratios);
  EXPECT_EQ(a.mtp_compress_ratios, b.mtp_compress_ratios);
  EXPECT_EQ(a.csa_ratio, b.csa_ratio);
  EXPECT_EQ(a.hca_ratio, b.hca_ratio);
  for (const auto* r : {&a.rope_main, &a.rope_compress}) {
    const RopeConfig& s = r == &a.rope_main ? b.rope_main : b.rope_compress;
    EXPECT_EQ(r->theta, s.theta);
    EXPECT_EQ(r->yarn, s.yarn);
    EXPECT_EQ(r->factor, s.factor);
    EXPECT_EQ(r->original_max_position, s.original_max_position);
    EXPECT_EQ(r->beta_fast, s.beta_fast);
    EXPECT_EQ(r->beta_slow, s.beta_slow);
  }
  EXPECT_EQ(a.index_n_heads, b.index_n_heads);
  EXPECT_EQ(a.index_head_dim, b.index_head_dim);
  EXPECT_EQ(a.index_topk, b.index_topk);
  EXPECT_EQ(a.hc_mult, b.hc_mult);
  EXPECT_EQ(a.hc_sinkhorn_iters, b.hc_sinkhorn_iters);
  EXPECT_EQ(a.hc_eps, b.hc_eps);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.num_mtp_layers, b.num_mtp_layers);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_id, b.eos_token_id);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
}

TEST(Config, OfficialKeys) {
  const ModelConfig c = parse(official_tiny());
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.num_layers, 4);
  EXPECT_EQ(c.rope_dim, 64);
  EXPECT_EQ(c.nope_dim(), 192);
  EXPECT_EQ(c.csa_ratio, 4);
  EXPECT_EQ(c.hca_ratio, 8);
  EXPECT_EQ(c.attn_kind(0), AttnKind::sliding);
  EXPECT_EQ(c.attn_kind(1), AttnKind::csa);
  EXPECT_EQ(c.attn_kind(2), AttnKind::hca);
  EXPECT_EQ(c.attn_kind(3), AttnKind::csa);
  EXPECT_TRUE(c.hash_routed(1));
  EXPECT_FALSE(c.hash_routed(2));
  EXPECT_EQ(c.rope_for(0).theta, 10000.0);
  EXPECT_FALSE(c.rope_for(0).yarn);
  EXPECT_EQ(c.rope_for(1).theta, 160000.0);
  EXPECT_TRUE(c.rope_for(1).yarn);
  EXPECT_EQ(c.rope_for(1).factor, 16.0);
  EXPECT_EQ(c.rope_for(1).original_max_position, 65536.0);
  EXPECT_TRUE(c.fp8_dense);
  EXPECT_EQ(c.expert_format, WeightFormat::mxfp4);
  EXPECT_FALSE(c.expert_format_explicit);
}

TEST(Config, TransformersKeysGiveTheSameModel) {
  const ModelConfig t = parse(transformers_tiny());
  expect_same_model(t, parse(official_tiny()));
  EXPECT_FALSE(t.fp8_dense);  // no quantization_config
  EXPECT_EQ(t.expert_format, WeightFormat::bf16);
}

TEST(Config, TransformersFlatRopeParametersAreTheCompressBranch) {
  json j = transformers_tiny();
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 16.0}, {"original_max_position_embeddings", 65536},
                          {"beta_fast", 32}, {"beta_slow", 1}};
  const ModelConfig c = parse(j);
  EXPECT_TRUE(c.rope_compress.yarn);
  EXPECT_EQ(c.rope_compress.theta, 160000.0);
  EXPECT_FALSE(c.rope_main.yarn);
  EXPECT_EQ(c.rope_main.theta, 10000.0);
}

TEST(Config, BothKeyStylesTogetherMustAgree) {
  json j = official_tiny();
  j["layer_types"] = transformers_tiny()["layer_types"];
  j["compress_rates"] = transformers_tiny()["compress_rates"];
  EXPECT_NO_THROW(parse(j));
  j["compress_ratios"] = {0, 4, 4, 8};
  try {
    parse(j);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("field \"compress_ratios\": expected ratios that agree with layer_types"),
              std::string::npos)
        << e.what();
  }
}

TEST(Config, MtpRatiosAndExpertFormatKey) {
  json j = official_tiny();
  j["compress_ratios"] = {0, 4, 8, 4, 0};
  j["num_nextn_predict_layers"] = 1;
  j["expert_format"] = "nvfp4";
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.compress_ratios, (std::vector<int>{0, 4, 8, 4}));
  EXPECT_EQ(c.mtp_compress_ratios, (std::vector<int>{0}));
  EXPECT_EQ(c.expert_format, WeightFormat::nvfp4);
  EXPECT_TRUE(c.expert_format_explicit);
}

TEST(Config, V4FlashShape) {
  const ModelConfig c = ModelConfig::v4_flash();
  EXPECT_NO_THROW(c.validate());
  ASSERT_EQ(c.num_layers, 43);
  int swa = 0, csa = 0, hca = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    const AttnKind k = c.attn_kind(l);
    (k == AttnKind::sliding ? swa : k == AttnKind::csa ? csa : hca)++;
    if (l >= 2) {
      EXPECT_EQ(k, l % 2 == 0 ? AttnKind::csa : AttnKind::hca) << l;
    }
  }
  EXPECT_EQ(swa, 2);
  EXPECT_EQ(csa, 21);
  EXPECT_EQ(hca, 20);
  EXPECT_EQ(c.mtp_compress_ratios, std::vector<int>{0});
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_heads * c.head_dim / c.o_groups, 4096);
  EXPECT_EQ(c.num_hash_layers, 3);
  EXPECT_EQ(c.index_topk, 512);
}

TEST(Config, RoundTripOfficialKeys) {
  for (const ModelConfig& c : {ModelConfig::v4_flash(), ModelConfig::tiny()}) {
    const std::string text = c.to_json_text();
    const ModelConfig back = ModelConfig::from_json_text(text, "roundtrip.json");
    expect_same_model(c, back);
    EXPECT_EQ(back.expert_format, c.expert_format);
    EXPECT_EQ(back.fp8_dense, c.fp8_dense);
    EXPECT_EQ(back.to_json_text(), text);
    // Official keys are there for the official loaders.
    const json j = json::parse(text);
    for (const char* key : {"compress_ratios", "qk_rope_head_dim", "num_hash_layers", "rope_scaling",
                            "compress_rope_theta", "quantization_config", "expert_dtype"})
      EXPECT_TRUE(j.contains(key)) << key;
  }
}

TEST(Config, TinyShape) {
  const ModelConfig c = ModelConfig::tiny();
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.compress_ratios, (std::vector<int>{0, 4, 8, 4}));
  EXPECT_EQ(c.hca_ratio, 8);
  EXPECT_EQ(c.rope_compress.factor, 16.0);
}

// --- every validation error names the file and the field --------------------------------------------

struct BadCase {
  const char* what;
  std::function<void(json&)> edit;
  const char* message;  // must appear in the error text
};

class ConfigErrors : public ::testing::TestWithParam<BadCase> {};

TEST_P(ConfigErrors, NameTheFieldAndTheExpectation) {
  json j = official_tiny();
  GetParam().edit(j);
  try {
    ModelConfig::from_json_text(j.dump(), "config.json");
    FAIL() << "accepted: " << GetParam().what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(GetParam().message), std::string::npos)
        << "message: " << e.what() << "\nwanted: " << GetParam().message;
    EXPECT_EQ(std::string(e.what()).rfind("config.json: ", 0), 0u) << e.what();
  }
}

const BadCase kBadCases[] = {
    {"heads not a number", [](json& j) { j["num_attention_heads"] = "abc"; },
     R"(config.json: field "num_attention_heads": expected a positive integer, found "abc")"},
    {"heads zero", [](json& j) { j["num_attention_heads"] = 0; },
     R"(field "num_attention_heads": expected a positive integer, found 0)"},
    {"hidden missing", [](json& j) { j.erase("hidden_size"); }, R"(field "hidden_size": expected a positive integer, found nothing)"},
    {"vocab negative", [](json& j) { j["vocab_size"] = -5; }, R"(field "vocab_size": expected a positive integer, found -5)"},
    {"head_dim fraction", [](json& j) { j["head_dim"] = 2.5; }, R"(field "head_dim": expected a positive integer, found 2.5)"},
    {"kv heads", [](json& j) { j["num_key_value_heads"] = 2; }, R"(field "num_key_value_heads": expected 1)"},
    {"o_groups divisor", [](json& j) { j["o_groups"] = 3; },
     R"(field "o_groups": expected a divisor of num_attention_heads (4), found 3)"},
    {"rope odd", [](json& j) { j["qk_rope_head_dim"] = 63; }, R"(field "qk_rope_head_dim": expected an even number)"},
    {"rope too wide", [](json& j) { j["qk_rope_head_dim"] = 256; },
     R"(field "qk_rope_head_dim": expected less than head_dim (256), found 256)"},
    {"top-k too many", [](json& j) { j["num_experts_per_tok"] = 9; },
     R"(field "num_experts_per_tok": expected at most n_routed_experts (8), found 9)"},
    {"shared experts", [](json& j) { j["n_shared_experts"] = 2; }, R"(field "n_shared_experts": expected 1)"},
    {"hash layers", [](json& j) { j["num_hash_layers"] = 5; },
     R"(field "num_hash_layers": expected between 0 and num_hidden_layers (4), found 5)"},
    {"scoring", [](json& j) { j["scoring_func"] = "relu"; }, R"(field "scoring_func": expected "sqrtsoftplus")"},
    {"scaling", [](json& j) { j["routed_scaling_factor"] = "big"; },
     R"(field "routed_scaling_factor": expected a positive number, found "big")"},
    {"norm_topk bool", [](json& j) { j["norm_topk_prob"] = 1; }, R"(field "norm_topk_prob": expected true or false, found 1)"},
    {"window", [](json& j) { j["sliding_window"] = -1; }, R"(field "sliding_window": expected a positive integer, found -1)"},
    {"ratios missing", [](json& j) { j.erase("compress_ratios"); }, R"(field "compress_ratios": expected a list)"},
    {"ratios short", [](json& j) { j["compress_ratios"] = {0, 4, 8}; },
     R"(field "compress_ratios": expected a list of num_hidden_layers (4) entries)"},
    {"ratios three kinds", [](json& j) { j["compress_ratios"] = {0, 4, 8, 16}; },
     R"(field "compress_ratios": expected at most two distinct non-zero ratios)"},
    {"ratios not ints", [](json& j) { j["compress_ratios"] = {0, "x", 8, 4}; },
     R"(field "compress_ratios": expected a list of non-negative integers)"},
    {"ratios not list", [](json& j) { j["compress_ratios"] = 4; }, R"(field "compress_ratios": expected a list, found 4)"},
    {"mtp ratio count", [](json& j) { j["compress_ratios"] = {0, 4, 8, 4, 0, 0}; j["num_nextn_predict_layers"] = 1; },
     R"(field "compress_ratios": expected num_hidden_layers + num_nextn_predict_layers (4 + 1) entries)"},
    {"mtp ratio value", [](json& j) { j["compress_ratios"] = {0, 4, 8, 4, 16}; j["num_nextn_predict_layers"] = 1; },
     R"(field "compress_ratios": expected only 0 (sliding), 4 (CSA) or 8 (HCA))"},
    {"layer type name", [](json& j) { j["layer_types"] = {"sliding_attention", "full", "sliding_attention", "sliding_attention"}; },
     R"(field "layer_types": expected a list of "sliding_attention")"},
    {"layer type count", [](json& j) { j["layer_types"] = {"sliding_attention"}; },
     R"(field "layer_types": expected a list of num_hidden_layers (4) entries)"},
    {"rates", [](json& j) { j["compress_rates"] = {{"compressed_sparse_attention", 0}}; },
     R"(field "compress_rates.compressed_sparse_attention": expected a positive integer, found 0)"},
    {"mlp types order", [](json& j) { j["mlp_layer_types"] = {"moe", "hash_moe", "moe", "moe"}; },
     R"(field "mlp_layer_types": expected a list of num_hidden_layers (4) entries: "hash_moe" for the first layers)"},
    {"mlp types vs hash", [](json& j) { j["mlp_layer_types"] = {"hash_moe", "moe", "moe", "moe"}; },
     R"(field "num_hash_layers": expected 1 (the number of "hash_moe" entries in mlp_layer_types), found 2)"},
    {"rope factor", [](json& j) { j["rope_scaling"]["factor"] = "x"; },
     R"(field "rope_scaling.factor": expected a positive number, found "x")"},
    {"rope type", [](json& j) { j["rope_scaling"]["type"] = "linear"; },
     R"(field "rope_scaling.type": expected "yarn" or "default", found "linear")"},
    {"rope orig", [](json& j) { j["rope_scaling"].erase("original_max_position_embeddings"); },
     R"(field "rope_scaling.original_max_position_embeddings": expected a positive number, found nothing)"},
    {"rope factor < 1", [](json& j) { j["rope_scaling"]["factor"] = 0.5; },
     R"(field "rope_scaling.factor": expected a number >= 1, found 0.5)"},
    {"rope theta", [](json& j) { j["rope_theta"] = 0; }, R"(field "rope_theta": expected a positive number, found 0)"},
    {"rope_parameters main", [](json& j) { j["rope_parameters"] = {{"main", 3}}; },
     R"(field "rope_parameters.main": expected a JSON object, found 3)"},
    {"index_topk", [](json& j) { j["index_topk"] = 0; }, R"(field "index_topk": expected a positive integer, found 0)"},
    {"index_head_dim", [](json& j) { j["index_head_dim"] = 64; },
     R"(field "index_head_dim": expected more than qk_rope_head_dim (64), found 64)"},
    {"hc_mult", [](json& j) { j["hc_mult"] = 0; }, R"(field "hc_mult": expected a positive integer, found 0)"},
    {"hc_eps", [](json& j) { j["hc_eps"] = 0; }, R"(field "hc_eps": expected a positive number, found 0)"},
    {"rms eps", [](json& j) { j["rms_norm_eps"] = -1e-6; }, R"(field "rms_norm_eps": expected a positive number)"},
    {"eos", [](json& j) { j["eos_token_id"] = 512; }, R"(field "eos_token_id": expected a token id below vocab_size (512), found 512)"},
    {"quant fmt", [](json& j) { j["quantization_config"]["fmt"] = "e5m2"; },
     R"(field "quantization_config.fmt": expected "e4m3", found "e5m2")"},
    {"quant block", [](json& j) { j["quantization_config"]["weight_block_size"] = {64, 64}; },
     R"(field "quantization_config.weight_block_size": expected [128, 128], found [64,64])"},
    {"quant scale", [](json& j) { j["quantization_config"]["scale_fmt"] = "fp32"; },
     R"(field "quantization_config.scale_fmt": expected "ue8m0")"},
    {"expert format", [](json& j) { j["expert_format"] = "int4"; },
     R"(field "expert_format": expected "mxfp4", "nvfp4", "bf16" or "f32", found "int4")"},
    {"expert dtype", [](json& j) { j["expert_dtype"] = "int4"; }, R"(field "expert_dtype": expected "fp4" or "bf16")"},
    {"mxfp4 block", [](json& j) { j["moe_intermediate_size"] = 100; },
     R"(field "moe_intermediate_size": expected a multiple of 32 (the mxfp4 expert block), found 100)"},
    {"partial rotary", [](json& j) { j.erase("qk_rope_head_dim"); j["partial_rotary_factor"] = 0.3; },
     R"(field "partial_rotary_factor": expected a fraction of head_dim (256) giving a whole number of dims)"},
    {"huge", [](json& j) { j["hidden_size"] = 1ll << 40; }, R"(field "hidden_size": expected a positive integer below 2^31)"},
};

INSTANTIATE_TEST_SUITE_P(All, ConfigErrors, ::testing::ValuesIn(kBadCases));

TEST(Config, NotJsonOrNotAnObject) {
  try {
    ModelConfig::from_json_text("{\"hidden_size\": ", "dir/config.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dir/config.json: not valid JSON"), std::string::npos) << e.what();
  }
  try {
    ModelConfig::from_json_text("[1, 2]", "dir/config.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dir/config.json: expected a JSON object at the top level, found array"),
              std::string::npos)
        << e.what();
  }
}

TEST(Config, MissingFileNamesThePath) {
  try {
    ModelConfig::from_file("/nonexistent/dir/config.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/config.json: cannot open"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tern::model
