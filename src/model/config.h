// The model's hyper-parameters, read from a checkpoint's config.json (official DeepSeek keys or the
// transformers ones) and validated. ModelConfig::v4_flash() is the full DeepSeek-V4-Flash shape.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ops/weight_format.h"

namespace tern::model {

enum class AttnKind : uint8_t {
  sliding,  // SWA only (compress ratio 0)
  csa,      // compressed sparse attention: overlapping compressor (ratio 4) + lightning indexer
  hca,      // heavily compressed attention: non-overlapping compressor (ratio 128)
};

// The checkpoint formats are the ops' (ops/weight_format.h: one enum and one name for each, issue #17).
using ops::WeightFormat;
using ops::weight_format_name;  // "f32", "bf16", "fp8_block", "mxfp4", "nvfp4"

std::string_view attn_kind_name(AttnKind kind);  // "sliding", "csa", "hca"
// The routed experts' format by name: "mxfp4", "nvfp4", "bf16" or "f32" (false for any other; FP8 experts are
// not supported).
bool parse_expert_format(std::string_view s, WeightFormat* out);

struct RopeConfig {
  double theta = 10000.0;
  bool yarn = false;
  double factor = 1.0;
  double original_max_position = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  // DeepSeek-V4 does not scale cos/sin by YaRN's magnitude correction (attention_factor = 1).
};

struct ModelConfig {
  int64_t vocab_size = 129280;
  int64_t hidden_size = 4096;
  int num_layers = 43;
  int num_heads = 64;
  int64_t head_dim = 512;
  int64_t rope_dim = 64;  // qk_rope_head_dim: the LAST rope_dim dims of each head get RoPE
  int64_t q_lora_rank = 1024;
  int o_groups = 8;
  int64_t o_lora_rank = 1024;
  int n_routed_experts = 256;
  int n_shared_experts = 1;
  int experts_per_token = 6;
  int64_t moe_intermediate_size = 2048;
  std::string scoring_func = "sqrtsoftplus";
  double routed_scaling_factor = 1.5;
  bool norm_topk_prob = true;
  int num_hash_layers = 3;
  double swiglu_limit = 10.0;
  int64_t sliding_window = 128;
  std::vector<int> compress_ratios;  // per layer: 0 (SWA), the CSA ratio, or the HCA ratio
  int csa_ratio = 4;                 // which non-zero ratio means CSA (overlapping + indexer)
  int hca_ratio = 128;               // the other non-zero ratio (non-overlapping compressor)
  std::vector<int> mtp_compress_ratios;  // compress_ratios entries past num_layers: the MTP layers'
  RopeConfig rope_main;              // SWA layers
  RopeConfig rope_compress;          // CSA/HCA layers: queries, window keys, compressed keys, indexer
  int index_n_heads = 64;
  int64_t index_head_dim = 128;
  int index_topk = 512;
  int hc_mult = 4;
  int hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double rms_norm_eps = 1e-6;
  int num_mtp_layers = 1;
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;
  int64_t max_position_embeddings = 1048576;
  WeightFormat expert_format = WeightFormat::mxfp4;
  // True when config.json names the format (tern key "expert_format"); otherwise load_model infers
  // it from the expert tensors and overwrites expert_format.
  bool expert_format_explicit = false;
  bool fp8_dense = true;  // attention / shared-expert linears stored FP8 with 128x128 e8m0 scales

  AttnKind attn_kind(int layer) const;
  bool hash_routed(int layer) const { return layer < num_hash_layers; }
  int compress_ratio(int layer) const { return compress_ratios.at(layer); }
  const RopeConfig& rope_for(int layer) const {
    return attn_kind(layer) == AttnKind::sliding ? rope_main : rope_compress;
  }
  int64_t nope_dim() const { return head_dim - rope_dim; }

  // Throws tern::Error naming the file and the bad field with what was expected, e.g.
  // `config.json: field "o_groups": expected a divisor of num_attention_heads (64), found 7`.
  void validate(const std::string& source = "config.json") const;

  // Parses config.json text; `source` names the file in error messages.
  static ModelConfig from_json_text(const std::string& text, const std::string& source);
  static ModelConfig from_file(const std::string& path);
  // The full DeepSeek-V4-Flash shape (43 layers, official formats), for tools that synthesize.
  static ModelConfig v4_flash();
  // The embedded default model's shape: the test fixtures' tiny configuration with the real vocab.
  static ModelConfig tiny();
  // Serialises in the official key style (what from_json_text reads back).
  std::string to_json_text() const;
};

}  // namespace tern::model
