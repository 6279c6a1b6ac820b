#include "model/perf_model.h"

#include <algorithm>
#include <cmath>

namespace tern::model {

double expected_distinct_experts(int64_t experts, int64_t per_token, int64_t batch) {
  const double E = static_cast<double>(experts);
  return E * (1.0 - std::pow(1.0 - static_cast<double>(per_token) / E, static_cast<double>(batch)));
}

double decode_step_bytes(const SyntheticSizes& s, const ModelConfig& c, int64_t batch, double distinct_per_layer) {
  double bytes = static_cast<double>(s.global_bytes - s.embed_bytes);
  for (size_t l = 0; l < s.layer_dense_bytes.size(); ++l)
    bytes += static_cast<double>(s.layer_dense_bytes[l] - s.layer_table_bytes[l]);
  const double distinct =
      distinct_per_layer >= 0 ? distinct_per_layer : expected_distinct_experts(c.n_routed_experts, c.experts_per_token, batch);
  return bytes + static_cast<double>(s.layer_dense_bytes.size()) * distinct * static_cast<double>(s.expert_bytes);
}

double mtp_draft_step_bytes(const SyntheticSizes& s, const ModelConfig& c, int64_t batch) {
  if (s.mtp_layers == 0) return 0;
  const double distinct = expected_distinct_experts(c.n_routed_experts, c.experts_per_token, batch);
  return static_cast<double>(s.mtp_dense_bytes + s.head_bytes) + distinct * static_cast<double>(s.expert_bytes);
}

double active_params_per_token(const ModelConfig& c, bool head) {
  const double D = static_cast<double>(c.hidden_size), H = c.num_heads, hd = static_cast<double>(c.head_dim);
  const double ql = static_cast<double>(c.q_lora_rank), ol = static_cast<double>(c.o_lora_rank), g = c.o_groups;
  const double I = static_cast<double>(c.moe_intermediate_size), hc = c.hc_mult;
  const double ih = c.index_n_heads, ihd = static_cast<double>(c.index_head_dim);
  double p = head ? static_cast<double>(c.vocab_size) * D : 0.0;
  p += hc * hc * D;  // hc_head
  for (int l = 0; l < c.num_layers; ++l) {
    p += D * ql + ql * H * hd + D * hd + (H * hd / g) * (g * ol) + g * ol * D;  // attention
    const AttnKind kind = c.attn_kind(l);
    if (kind == AttnKind::csa) p += 2 * (2 * hd) * D + ql * ih * ihd + D * ih + 2 * (2 * ihd) * D;
    if (kind == AttnKind::hca) p += 2 * hd * D;
    p += static_cast<double>(c.n_routed_experts) * D;                  // router gate
    p += (1.0 + c.experts_per_token) * 3.0 * D * I;                    // shared + routed experts
    p += 2 * ((2 + hc) * hc) * (hc * D);                               // mHC mixes (attention and ffn)
  }
  return p;
}

double prefill_flops(const ModelConfig& c, int64_t tokens) {
  double flops = 2.0 * active_params_per_token(c, false) * static_cast<double>(tokens);
  flops += 2.0 * static_cast<double>(c.vocab_size) * static_cast<double>(c.hidden_size);  // the last token's head
  const double H = c.num_heads, hd = static_cast<double>(c.head_dim);
  const double ih = c.index_n_heads, ihd = static_cast<double>(c.index_head_dim);
  for (int l = 0; l < c.num_layers; ++l) {
    const int ratio = c.compress_ratio(l);
    const AttnKind kind = c.attn_kind(l);
    for (int64_t p = 0; p < tokens; ++p) {
      const double window = static_cast<double>(std::min<int64_t>(p + 1, c.sliding_window));
      const double compressed = ratio > 0 ? static_cast<double>((p + 1) / ratio) : 0.0;
      const double picked = kind == AttnKind::csa ? std::min(compressed, static_cast<double>(c.index_topk)) : compressed;
      flops += 4.0 * H * hd * (window + picked);
      if (kind == AttnKind::csa) flops += 2.0 * ih * ihd * compressed;
    }
  }
  return flops;
}

}  // namespace tern::model
