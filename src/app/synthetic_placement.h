// A synthetic model built in place on the device a verb runs on (`tern bench-step`, `tern serve --synthetic`):
// model/synthetic_model.h's weights, within the memory left after `reserve_bytes`, wrapped in a Model there.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/synthetic_model.h"
#include "model/v4_model.h"

namespace tern::app {

// "full" (V4-Flash, 43 layers) or "tiny" (the embedded test shape); throws naming the choices otherwise.
model::ModelConfig synthetic_config(const std::string& name);

struct SyntheticPlacement {
  std::shared_ptr<model::Model> model;  // owns the weights (ModelWeights::storage)
  model::ExpertSharing sharing;
  model::SyntheticSizes sizes;
  double build_seconds = 0;
  std::string description;  // the sharing line, the device and its memory
};

// Builds the model on `device` (prepared with prepare_device), leaving `reserve_bytes` of the memory free
// now (GPU memory, or the host's available memory) for states, activations, workspace and graphs.
SyntheticPlacement place_synthetic_model(const model::ModelConfig& config, model::WeightFormat experts,
                                         model::KvMode kv_mode, const std::string& device, int64_t reserve_bytes,
                                         uint64_t seed);

// Bytes of one sequence's state of at most max_tokens tokens for `config` (its pages, whole).
int64_t state_bytes_per_sequence(const model::ModelConfig& config, model::KvMode kv_mode, int64_t max_tokens);

}  // namespace tern::app
