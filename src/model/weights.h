// The model's weights as views into mapped checkpoint files, bound by name and checked against the
// config (shapes, dtypes) at load. Nothing here computes: src/ops and the backends do.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "ops/moe.h"
#include "ops/weight.h"

namespace tern::model {

// One linear map y = W x with W of shape [out, in]: the ops' weight (ops/weight.h), bound here with its format,
// views and checkpoint name (for messages and kernel-path reports). The Model sets its `exact` and `act_fp8`.
using Linear = ops::Weight;

struct CompressorWeights {
  int ratio = 0;
  int64_t width = 0;  // output row width: head_dim for attention, index_head_dim for the indexer
  bool overlap = false;  // CSA: wkv/wgate/ape have 2*width channels (two overlapping series)
  Linear wkv, wgate;     // [width or 2*width, hidden]
  Linear wkv_wgate;      // wkv and wgate stacked (model/stacked.h; wkv and wgate view it); empty: apart
  TensorView ape;        // f32 [ratio, width or 2*width]
  TensorView norm;       // [width]
};

struct IndexerWeights {
  Linear wq_b;          // [index_n_heads * index_head_dim, q_lora_rank]
  Linear weights_proj;  // [index_n_heads, hidden]
  CompressorWeights compressor;
};

struct AttentionWeights {
  Linear wq_a, wq_b, wkv, wo_a, wo_b;  // wo_a: [o_groups * o_lora_rank, heads*head_dim/o_groups]
  Linear wq_a_wkv;  // wq_a and wkv stacked (model/stacked.h; wq_a and wkv view it); empty: apart
  TensorView q_norm, kv_norm;
  TensorView attn_sink;  // f32 [heads]
  std::optional<CompressorWeights> compressor;  // CSA and HCA layers
  std::optional<IndexerWeights> indexer;        // CSA layers
};

// gate w1 [inter, hidden], down w2 [hidden, inter], up w3 [inter, hidden]; w13: the shared expert's w1 and w3
// stacked (model/stacked.h; w1 and w3 view it), empty for the routed experts (ops/moe.h).
using ExpertWeights = ops::Expert;

struct MoEWeights {
  Linear gate;                // [n_routed_experts, hidden]
  TensorView gate_bias;       // f32 [n_routed_experts], score-routed layers only
  TensorView tid2eid;         // i64 (or i32) [vocab, experts_per_token], hash-routed layers only
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
};

struct HyperConnWeights {
  TensorView fn;     // f32 [(2 + hc) * hc, hc * hidden] (hc_head: [hc, hc * hidden])
  TensorView base;   // f32 [(2 + hc) * hc] (hc_head: [hc])
  TensorView scale;  // f32 [3] (hc_head: [1])
};

struct LayerWeights {
  int index = 0;
  AttnKind attn_kind = AttnKind::sliding;
  bool hash_routed = false;
  TensorView attn_norm, ffn_norm;
  HyperConnWeights hc_attn, hc_ffn;
  AttentionWeights attn;
  MoEWeights ffn;
};

// The multi-token-prediction layer mtp.0 (deepseek-v4.md section 2, v4-speculative.md section 1): the input
// projections, one V4 block with sliding-window attention only (compress ratio 0) and a score-routed MoE, its
// own hc_head and norm. The embedding and the head are the trunk's.
struct MtpWeights {
  TensorView enorm, hnorm;   // [hidden]
  Linear e_proj, h_proj;     // [hidden, hidden] (FP8 in the official checkpoint)
  LayerWeights block;        // index = config.num_layers: its layer in the sequence state's layout
  HyperConnWeights hc_head;  // fn [hc, hc * hidden], base [hc], scale [1]
  TensorView norm;           // [hidden]
};

struct ModelWeights {
  ModelConfig config;
  TensorView embed;  // [vocab, hidden]
  Linear head;       // [vocab, hidden]
  TensorView norm;   // [hidden]
  HyperConnWeights hc_head;
  std::vector<LayerWeights> layers;
  // Present when the checkpoint has the mtp.0.* tensors (and config.json num_nextn_predict_layers >= 1).
  std::optional<MtpWeights> mtp;
  // Keeps the mapped files (or synthesized buffers) alive for as long as the views are used.
  std::shared_ptr<const void> storage;
  // Where the weights came from (for `tern inspect` and logs).
  std::string naming;         // "official" or "transformers"
  int64_t num_tensors = 0;    // tensors in the checkpoint
  uint64_t num_bytes = 0;     // bytes of tensor data in the checkpoint
  int num_files = 0;          // safetensors files mapped
};

// Loads a checkpoint directory (config.json + model.safetensors or model.safetensors.index.json
// with its shards), official or transformers tensor names. Throws tern::Error naming the file and
// tensor on anything missing, mis-shaped, mis-typed, truncated or corrupt. The returned config's
// expert_format and fp8_dense describe the tensors actually found. The MTP layer is bound when the checkpoint
// has any mtp.0.* tensor: then all of them must be there (the error names the first one missing); without
// any, the model loads without MTP. docs/checkpoints.md lists the
// accepted dtypes per tensor (views keep the file's dtype, except that fields documented f32 above
// are always f32: bf16/f16 files are widened into owned buffers).
ModelWeights load_model(const std::string& dir);

// The transformers name of an official tensor name (transformers' conversion_mapping.py,
// "deepseek_v4"), e.g. "layers.0.attn.wq_a.weight" -> "model.layers.0.self_attn.q_a_proj.weight".
// Routed experts have no per-expert transformers name (they are stacked); not for "*.experts.*".
std::string transformers_name(const std::string& official);

}  // namespace tern::model
