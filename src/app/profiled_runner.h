// `tern serve --profile-steps N`: a runner that wraps the model's and, for the first N steps that carry a prompt
// chunk (more than one new token for some sequence), logs the step's shape, its wall time and the GPU profiler's
// per-category table (CUPTI, as bench-step prints it); the next N such steps are timed without the profiler. Why: a server step can differ from bench-step's in ways
// no micro-benchmark shows (its batch mix, its memory, its tokens); this measures the step the server runs.
#pragma once

#include <memory>

#include "engine/model_runner.h"

namespace tern::app {

class StepProfiler;

class ProfiledRunner : public engine::ModelRunner {
 public:
  // `device`: the model's ("cuda"); throws where the GPU profiler is unavailable (CPU builds, no CUPTI).
  ProfiledRunner(std::shared_ptr<engine::ModelRunner> inner, const std::string& device, int steps, int layers);
  ~ProfiledRunner() override;

  std::string name() const override { return inner_->name(); }
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  int64_t max_context() const override { return inner_->max_context(); }
  std::shared_ptr<const cache::StateLayout> state_layout(int64_t tokens_per_page) const override {
    return inner_->state_layout(tokens_per_page);
  }
  Device state_device() const override { return inner_->state_device(); }
  int64_t weight_bytes() const override { return inner_->weight_bytes(); }
  std::vector<std::string> kernel_paths() const override { return inner_->kernel_paths(); }
  bool samples_on_device() const override { return inner_->samples_on_device(); }
  engine::StepPaths step_paths() const override { return inner_->step_paths(); }
  int speculative_tokens() const override { return inner_->speculative_tokens(); }
  int speculative_sequences() const override { return inner_->speculative_sequences(); }
  int64_t speculative_bytes_per_sequence() const override { return inner_->speculative_bytes_per_sequence(); }
  std::vector<std::vector<int32_t>> draft(std::span<const engine::DraftRequest> requests,
                                          const engine::DraftChooser& choose) override {
    return inner_->draft(requests, choose);
  }
  void settle(std::span<const int32_t> kept) override { inner_->settle(kept); }
  void forward(const engine::StepBatch& batch, std::span<float> logits) override;
  void forward_sample(const engine::StepBatch& batch, std::span<const engine::SampleRequest> requests,
                      std::span<engine::SampleResult> results, std::span<float> host_logits) override;

 private:
  template <class Fn>
  void run(const engine::StepBatch& batch, Fn&& fn);

  std::shared_ptr<engine::ModelRunner> inner_;
  std::unique_ptr<StepProfiler> profiler_;
  int left_ = 0, timed_ = 0, layers_ = 0, seen_ = 0;
};

}  // namespace tern::app
