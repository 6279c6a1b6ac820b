// The A/B switches of the forward's same-bits paths and of the CUDA backend's kernel choices, by the name of
// the TERN_* variable that sets each at start-up: what `tern bench-step --ab` flips in one process, so an A/B
// pays the full-depth model's build, prefill and state clones once (and its arms alternate on the same warm
// card).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "model/v4_model.h"

namespace tern::app {

// The model's (TERN_HC_FOLD, TERN_FUSED_COMPRESS, TERN_FUSED_ROPE, TERN_L2_PREFETCH, TERN_HC_COMB_APART:
// Model::Paths), then, on a CUDA model, the backend's
// (cuda::CudaBackend::knob_names).
std::vector<std::string> knob_names(const model::Model& m);
// The value in force (0 / 1 for a switch); throws naming the known switches for another name.
int64_t knob_value(const model::Model& m, const std::string& name);
// Sets it; throws for an unknown name or a value out of its range. Recorded steps keep what they were
// recorded with: record them again after a change.
void set_knob(model::Model& m, const std::string& name, int64_t value);
// "NAME=VALUE[,NAME=VALUE...]" -> the pairs, in order; throws naming a malformed item.
std::vector<std::pair<std::string, int64_t>> parse_knobs(const std::string& text);

}  // namespace tern::app
