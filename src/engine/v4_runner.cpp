#include "engine/v4_runner.h"

#include <cstring>

#include "core/error.h"
#include "ops/backend.h"

namespace tern::engine {

V4Runner::V4Runner(std::shared_ptr<model::Model> model, std::string name, int64_t weight_bytes, int64_t max_context)
    : model_(std::move(model)), name_(std::move(name)), weight_bytes_(weight_bytes), max_context_(max_context) {
  TERN_CHECK(max_context_ > 0, "V4 runner: max_context must be positive, found ", max_context_);
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
  const Tensor out = model_->forward(steps_);
  const size_t n = static_cast<size_t>(out.view().numel());
  TERN_CHECK(n == logits.size(), "V4 runner: the model returned ", n, " logits, expected ", logits.size());
  std::memcpy(logits.data(), out.view().data(), n * sizeof(float));
}

}  // namespace tern::engine
