// Synthetic checkpoints: random weights of any ModelConfig shape in the official names and formats
// (FP8 block-scaled dense linears, MXFP4 / NVFP4 / bf16 routed experts), or in transformers' names
// (everything bf16, experts stacked). Deterministic: the same options give byte-identical files.
// With the MTP layer when the config has one (synthesizes_mtp), so that speculative decoding runs on them.
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"

namespace tern::model {

struct SynthOptions {
  uint64_t seed = 1;
  WeightFormat experts = WeightFormat::mxfp4;
  int num_shards = 1;  // > 1: model-0000i-of-0000N.safetensors + model.safetensors.index.json
  // transformers' names and layout (experts stacked as gate_up_proj / down_proj); every weight bf16
  // except the f32 ones; `experts` must be bf16 or f32.
  bool transformers_names = false;
};

// Writes config.json and the safetensors file(s) into `dir` (created if needed; an earlier
// model.safetensors / model-*-of-*.safetensors / index there is replaced). Dense linears are FP8
// when config.fp8_dense (official names only). Values: per tensor, normal with std 1/sqrt(fan_in)
// after dequantization (embeddings std 1, norms 1 +- 0.1, hc and ape and sinks as in the fixtures),
// quantized with power-of-two e8m0 scales (FP8: amax/scale <= 448 per 128x128 block; MXFP4: <= 6 per
// 32), NVFP4 with ue4m3 per-16 scales and an fp32 global scale; tid2eid rows are distinct experts.
void write_synthetic_checkpoint(const ModelConfig& config, const std::string& dir, const SynthOptions& options);

// Whether the synthetic checkpoint and the synthetic model (model/synthetic_model.h) of `config` have the MTP layer
// mtp.0 (config.num_mtp_layers >= 1; mtp.1 and later are never made: tern uses mtp.0 only). Throws when its
// compress ratio is not 0: tern implements DeepSeek-V4's sliding-window-only MTP layer.
bool synthesizes_mtp(const ModelConfig& config);
void write_synthetic_checkpoint(const ModelConfig& config, const std::string& dir, uint64_t seed,
                                WeightFormat experts, int num_shards);

}  // namespace tern::model
