#include "engine/v4_runner.h"

#include <cstring>

#include "core/error.h"
#include "ops/backend.h"

namespace tern::engine {

V4Runner::V4Runner(std::shared_ptr<model::Model> model, std::string name, int64_t weight_bytes, int64_t max_context)
    : model_(std::move(model)), name_(std::move(name)), weight_bytes_(weight_bytes), max_context_(max_context) {
  TERN_CHECK(max_context_ > 0, "V4 runner: max_context must be positive, found ", max_context_);
}

void V4Runner::enable_decode_graphs(model::DecodeGraphOptions options) {
  if (options.max_tokens <= 0) options.max_tokens = max_context_;
  graphs_ = std::make_unique<model::DecodeGraphs>(*model_, std::move(options));
  graphs_->prepare();
}

StepPaths V4Runner::step_paths() const {
  StepPaths p;
  if (!graphs_) {
    if (steps_without_graphs_ > 0) p.eager_steps["cuda graphs not enabled"] = steps_without_graphs_;
    return p;
  }
  p.graph_steps = graphs_->stats().graph_steps;
  p.eager_steps = graphs_->stats().eager_steps;
  return p;
}

std::vector<std::string> V4Runner::kernel_paths() const { return ops::backend_for(model_->device()).kernel_paths(); }

void V4Runner::forward(const StepBatch& batch, std::span<float> logits) {
  tokens_.assign(batch.tokens.begin(), batch.tokens.end());
  steps_.clear();
  for (const auto& c : batch.chunks) {
    TERN_CHECK(c.state != nullptr, "V4 runner: sequence ", c.seq, " has no state");
    TERN_CHECK(c.state->position() == c.start, "V4 runner: sequence ", c.seq, " is at position ",
               c.state->position(), ", the step starts at ", c.start);
    TERN_CHECK(c.num_logits == 0 || c.num_logits == 1 || c.num_logits == c.count,
               "V4 runner: logits for ", c.num_logits, " of ", c.count, " tokens are not supported");
    const model::LogitsFor want = c.num_logits == 0   ? model::LogitsFor::none
                                  : c.num_logits == 1 ? model::LogitsFor::last
                                                      : model::LogitsFor::all;
    steps_.push_back({c.state, std::span<const int64_t>(tokens_.data() + c.token_offset, c.count), want});
  }
  Tensor out;
  if (graphs_) {
    out = graphs_->forward(steps_);
  } else {
    out = model_->forward(steps_);
    ++steps_without_graphs_;
  }
  const size_t n = static_cast<size_t>(out.view().numel());
  TERN_CHECK(n == logits.size(), "V4 runner: the model returned ", n, " logits, expected ", logits.size());
  std::memcpy(logits.data(), out.view().data(), n * sizeof(float));
}

}  // namespace tern::engine
