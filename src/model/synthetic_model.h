// A synthetic model built directly where it runs (host memory or the GPU), without files: every weight of a
// ModelConfig shape in the official formats (FP8 block-scaled dense linears when config.fp8_dense, MXFP4 /
// NVFP4 / bf16 routed experts), random values drawn per tensor by ops::synth_fill (never zeros; std
// 1/sqrt(fan_in) after dequantization, embeddings std 1, norms 1 +- 0.1, hc / ape / sinks as the file writer
// model/synth.h draws them). `tern bench-step` and `tern serve --synthetic` run it in-process.
//
// With config.num_mtp_layers >= 1 (V4-Flash ships one) it has the MTP layer mtp.0 as the official checkpoint does
// (model/weights.h MtpWeights: FP8 e_proj / h_proj, an SWA-only score-routed block in the trunk's formats, its own
// hc_head and norms), so speculative decoding can be measured; further MTP layers are not built (tern, like the
// loader, uses mtp.0 only).
//
// When the whole model does not fit in the memory it may use (V4-Flash's 160 GB with its MTP layer on a
// 139 GiB card), the first `own_layers` layers get routed-expert storage of their own and layer l >= own_layers
// reads the experts of layer l % own_layers: every layer still streams its experts from memory (one layer's
// touched experts are far larger than the L2), so step times stay honest, and ExpertSharing::description says
// so. The MTP layer counts as layer num_layers here (its index in the state layout): last to get experts of its
// own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "model/weights.h"
#include "ops/context.h"

namespace tern::model {

// Bytes of the model's tensors in their formats (each tensor's storage rounded up to 256 bytes).
struct SyntheticSizes {
  uint64_t global_bytes = 0;  // embedding, head, final norm, hc_head
  uint64_t embed_bytes = 0;   // of which the embedding (a step reads only its tokens' rows)
  uint64_t head_bytes = 0;    // of which the head
  std::vector<uint64_t> layer_dense_bytes;  // per layer: everything but the routed experts
  std::vector<uint64_t> layer_table_bytes;  // of which tid2eid (a step reads only its tokens' rows)
  uint64_t expert_bytes = 0;                // one routed expert (w1, w2, w3 with scales)
  int64_t experts_per_layer = 0;
  // The MTP layer (0 or 1 of them): everything of mtp.0 but its routed experts (e_proj, h_proj, the norms,
  // hc_head and the block's dense part; the embedding and the head are the trunk's). Its routed experts are one
  // more layer's worth.
  int mtp_layers = 0;
  uint64_t mtp_dense_bytes = 0;
  uint64_t layer_expert_bytes() const { return expert_bytes * static_cast<uint64_t>(experts_per_layer); }
  int expert_layers() const { return static_cast<int>(layer_dense_bytes.size()) + mtp_layers; }  // with experts
  uint64_t dense_bytes() const;  // globals, every layer's dense part and the MTP layer's
  uint64_t total_bytes() const;  // the whole model, unshared
};
SyntheticSizes synthetic_sizes(const ModelConfig& config, WeightFormat experts);

struct ExpertSharing {
  int num_layers = 0;         // layers with routed experts: the trunk's, then the MTP layer (index num_layers - 1)
  bool mtp = false;           // the last of them is the MTP layer
  int own_layers = 0;         // layers [0, own_layers) have their own routed experts
  uint64_t model_bytes = 0;   // the whole model unshared
  uint64_t stored_bytes = 0;  // what is allocated
  std::string description;    // one line: which layers reuse which, and the sizes
  bool shared() const { return own_layers < num_layers; }
  int source_layer(int layer) const { return layer < own_layers ? layer : layer % own_layers; }
};
// How many layers get their own routed experts within `budget_bytes` for the weights (< 0: no limit):
// all of them when the model fits, else as many as fit after the dense part; throws when not even one
// layer's experts fit, naming the sizes.
ExpertSharing plan_expert_sharing(const SyntheticSizes& sizes, int64_t budget_bytes);

struct SyntheticModelOptions {
  uint64_t seed = 1;
  WeightFormat experts = WeightFormat::mxfp4;
  int64_t weight_budget_bytes = -1;  // memory the weights may take (< 0: no limit): plan_expert_sharing
};

struct SyntheticModel {
  ModelWeights weights;  // views on `device`; weights.storage owns the memory
  ExpertSharing sharing;
  SyntheticSizes sizes;
};

// Allocates and fills the model on the device of `ctx`, whose backend runs the fills (issued on the device's
// stream); the function returns once they are done.
SyntheticModel build_synthetic_model(const ModelConfig& config, const ops::Context& ctx,
                                     const SyntheticModelOptions& options);

}  // namespace tern::model
