// Official DeepSeek tensor names -> transformers names: the rules of transformers'
// conversion_mapping.py (key "deepseek_v4"), applied in the same order, then the "model." prefix.
#include <string>
#include <string_view>

#include "model/weights.h"

namespace tern::model {

namespace {

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
    s.replace(pos, from.size(), to);
}

void replace_suffix(std::string& s, std::string_view from, std::string_view to) {
  if (s.size() >= from.size() && std::string_view(s).substr(s.size() - from.size()) == from)
    s.replace(s.size() - from.size(), from.size(), to);
}

void replace_exact(std::string& s, std::string_view from, std::string_view to) {
  if (s == from) s = to;
}

}  // namespace

std::string transformers_name(const std::string& official) {
  std::string s = official;
  replace_all(s, ".attn.", ".self_attn.");
  replace_all(s, ".ffn.", ".mlp.");
  replace_all(s, ".indexer.compressor.", ".compressor.indexer.");
  replace_exact(s, "embed.weight", "embed_tokens.weight");
  replace_exact(s, "head.weight", "lm_head.weight");
  replace_exact(s, "hc_head_fn", "hc_head.hc_fn");
  replace_exact(s, "hc_head_base", "hc_head.hc_base");
  replace_exact(s, "hc_head_scale", "hc_head.hc_scale");
  replace_all(s, ".attn_norm.", ".input_layernorm.");
  replace_all(s, ".ffn_norm.", ".post_attention_layernorm.");
  replace_suffix(s, ".hc_attn_fn", ".attn_hc.fn");
  replace_suffix(s, ".hc_attn_base", ".attn_hc.base");
  replace_suffix(s, ".hc_attn_scale", ".attn_hc.scale");
  replace_suffix(s, ".hc_ffn_fn", ".ffn_hc.fn");
  replace_suffix(s, ".hc_ffn_base", ".ffn_hc.base");
  replace_suffix(s, ".hc_ffn_scale", ".ffn_hc.scale");
  replace_suffix(s, ".attn_sink", ".sinks");
  replace_all(s, ".indexer.weights_proj.", ".compressor.indexer.scorer.weights_proj.");
  replace_all(s, ".indexer.wq_b.", ".compressor.indexer.q_b_proj.");
  replace_all(s, ".norm.", ".kv_norm.");
  replace_suffix(s, ".ape", ".position_bias");
  replace_all(s, ".wq_a.", ".q_a_proj.");
  replace_all(s, ".self_attn.wq_b.", ".self_attn.q_b_proj.");
  replace_all(s, ".wkv.", ".kv_proj.");
  replace_all(s, ".wgate.", ".gate_proj.");
  replace_all(s, ".wo_a.", ".o_a_proj.");
  replace_all(s, ".wo_b.", ".o_b_proj.");
  replace_all(s, ".q_norm.", ".q_a_norm.");
  replace_suffix(s, ".gate.bias", ".gate.e_score_correction_bias");
  replace_all(s, ".shared_experts.w1.", ".shared_experts.gate_proj.");
  replace_all(s, ".shared_experts.w2.", ".shared_experts.down_proj.");
  replace_all(s, ".shared_experts.w3.", ".shared_experts.up_proj.");
  return s == "lm_head.weight" ? s : "model." + s;
}

}  // namespace tern::model
