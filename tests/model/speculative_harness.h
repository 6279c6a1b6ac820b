// The serving engine with MTP speculative decoding over a real V4 model, shared by the CPU tests
// (test_speculative_engine.cpp) and the GPU tests (tests/gpu): a runner that pushes the drafts towards plain greedy
// decoding's tokens, the engine run to the end, mixed requests, and the greedy-equality check.
#pragma once

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/v4_runner.h"

namespace tern::test {

using engine::EngineOptions;
using engine::FinishReason;
using engine::GenerationRequest;
using engine::RequestUpdate;

class DraftBias : public engine::ModelRunner {
 public:
  // outputs[i]: the plain greedy output of the i-th submitted request (sequence id i + 1 in a fresh engine);
  // each draft is pushed to it with probability `p` (by `boost` on its logit).
  DraftBias(std::shared_ptr<engine::ModelRunner> inner, std::vector<std::vector<int32_t>> outputs,
            std::vector<int64_t> prompt_lens, double p, float boost = 1e4f)
      : inner_(std::move(inner)), outputs_(std::move(outputs)), prompt_lens_(std::move(prompt_lens)), p_(p),
        boost_(boost) {}
  std::string name() const override { return inner_->name(); }
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  int64_t max_context() const override { return inner_->max_context(); }
  std::shared_ptr<const cache::StateLayout> state_layout(int64_t t) const override { return inner_->state_layout(t); }
  Device state_device() const override { return inner_->state_device(); }
  int64_t weight_bytes() const override { return inner_->weight_bytes(); }
  std::vector<std::string> kernel_paths() const override { return inner_->kernel_paths(); }
  void forward(const engine::StepBatch& batch, std::span<float> logits) override { inner_->forward(batch, logits); }
  bool samples_on_device() const override { return inner_->samples_on_device(); }
  void forward_sample(const engine::StepBatch& batch, std::span<const engine::SampleRequest> requests,
                      std::span<engine::SampleResult> results, std::span<float> host_logits) override {
    inner_->forward_sample(batch, requests, results, host_logits);
  }
  int speculative_tokens() const override { return inner_->speculative_tokens(); }
  int speculative_sequences() const override { return inner_->speculative_sequences(); }
  int64_t speculative_bytes_per_sequence() const override { return inner_->speculative_bytes_per_sequence(); }
  void settle(std::span<const int32_t> kept) override { inner_->settle(kept); }
  // Every draft through the chooser (a greedy request's too: its row is what gets pushed).
  std::vector<std::vector<int32_t>> draft(std::span<const engine::DraftRequest> requests,
                                          const engine::DraftChooser& choose) override {
    std::vector<engine::DraftRequest> chosen(requests.begin(), requests.end());
    for (auto& r : chosen) r.greedy = false;
    return inner_->draft(chosen, [&](size_t i, int j, std::span<const float> logits) {
      const auto r = static_cast<size_t>(requests[i].seq - 1);
      if (r >= outputs_.size()) return choose(i, j, logits);
      // d_{j+1} stands for the token at position m + 1 + j: output index m + 1 + j - prompt length.
      const int64_t at = requests[i].state->position() + 1 + j - prompt_lens_.at(r);
      row_.assign(logits.begin(), logits.end());
      if (at < static_cast<int64_t>(outputs_[r].size()) && coin_(rng_) < p_)
        row_[static_cast<size_t>(outputs_[r][static_cast<size_t>(at)])] += boost_;
      return choose(i, j, row_);
    });
  }

 private:
  std::shared_ptr<engine::ModelRunner> inner_;
  std::vector<std::vector<int32_t>> outputs_;
  std::vector<int64_t> prompt_lens_;
  double p_;
  float boost_;
  std::mt19937_64 rng_{7};
  std::uniform_real_distribution<double> coin_{0.0, 1.0};
  std::vector<float> row_;
};

struct SpecOutput {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<engine::TokenLogprob>> top;
  std::string text;
  FinishReason finish = FinishReason::none;
  int64_t completion_tokens = 0;
};

std::string token_text(int32_t t);
// A state memory of 256 MiB, `max_running` sequences, a budget of 512 tokens, prompts in chunks of 32.
EngineOptions spec_engine_options(int max_running = 64);
// The real runner over `m` (context 256), speculating with k drafts (0: off); with graphs, its decode (and verify)
// steps replay CUDA graphs (a GPU model; on the CPU they run eagerly, said so). in_runner: a CPU model samples in the
// runner (V4Runner::set_sampling_in_runner_on_cpu: the engine's device-sampling path); a GPU model always does.
std::shared_ptr<engine::V4Runner> spec_runner(std::shared_ptr<model::Model> m, int k, int max_sequences = 64,
                                              bool graphs = false, bool in_runner = false);
// Every request through a fresh engine, stepped on this thread to the end.
std::vector<SpecOutput> run_engine(std::shared_ptr<engine::ModelRunner> runner, const std::vector<GenerationRequest>& requests,
                                   EngineOptions o = spec_engine_options(), engine::EngineMetrics* metrics = nullptr);
// n greedy requests of mixed prompt lengths (1 to 70 tokens); every fourth with penalties, every fifth with logprobs.
std::vector<GenerationRequest> mixed_requests(int n, int64_t vocab, uint64_t seed);
// Tokens, text, finish, completion tokens equal; logprobs within logprob_tol and, at the CPU's 1e-4, the same
// alternatives (on the GPU a verify step's logits are not a decode step's bits: bf16 products tiled by token count).
void expect_same(const std::vector<SpecOutput>& got, const std::vector<SpecOutput>& want, const std::string& what,
                 double logprob_tol = 1e-4);
// Greedy output with MTP equals plain decoding's, over n mixed requests (every third with a stop string from its
// plain output) at k = 1, 2, 3, with the MTP layer's drafts and with drafts pushed right 70% and 100% of the time;
// the counters add up and partial acceptance happened. `label` names the model in the printed acceptance.
void check_speculative_greedy(std::shared_ptr<model::Model> m, int n, const std::string& label,
                              double logprob_tol = 1e-4, bool graphs = false, bool in_runner = false);

}  // namespace tern::test
