// ModelRunner over the DeepSeek-V4 forward pass (model/v4_model.h); the sequences' states are the
// engine's (pages of its StatePool, in the model's layout, on the model's device).
#pragma once

#include <memory>

#include "engine/model_runner.h"
#include "engine/decode_graphs.h"
#include "model/speculator.h"
#include "model/v4_model.h"
#include "ops/sampling.h"

namespace tern::engine {

class V4Runner : public ModelRunner {
 public:
  // `weight_bytes`: the checkpoint's size, for the memory plan.
  V4Runner(std::shared_ptr<model::Model> model, std::string name, int64_t weight_bytes, int64_t max_context);
  std::string name() const override { return name_; }
  int64_t vocab_size() const override { return model_->config().vocab_size; }
  int64_t max_context() const override { return max_context_; }
  std::shared_ptr<const cache::StateLayout> state_layout(int64_t tokens_per_page) const override {
    return model_->state_layout(max_context_, tokens_per_page);
  }
  Device state_device() const override { return model_->device(); }
  int64_t weight_bytes() const override { return weight_bytes_; }
  std::vector<std::string> kernel_paths() const override;
  void forward(const StepBatch& batch, std::span<float> logits) override;
  // On a CUDA model (unless set_device_sampling(false)): the logits stay on the device and
  // ops::sample_rows samples them there, with speculative decoding too (the verify rows of greedy requests; the
  // rows of a sampled request's verdict are copied to the host).
  bool samples_on_device() const override;
  void forward_sample(const StepBatch& batch, std::span<const SampleRequest> requests,
                      std::span<SampleResult> results, std::span<float> host_logits) override;
  void set_device_sampling(bool on) { device_sampling_ = on; }
  // Tests: a CPU model takes the device-sampling path too (forward_sample, the engine's device path), the host
  // sampler standing in for ops::sample_rows, so that path's row split and verdicts run on the CPU.
  void set_sampling_in_runner_on_cpu(bool on) { sample_on_cpu_ = on; }
  StepPaths step_paths() const override;
  // Decode-only steps replay CUDA graphs (engine/decode_graphs.h), recorded now (startup); without this
  // call every step runs eagerly, counted as "cuda graphs not enabled".
  void enable_decode_graphs(DecodeGraphOptions options);
  // Runs one throwaway prefill of `tokens` tokens (the largest step the scheduler may build) on a one-sequence
  // state pool: the device's stream allocator keeps its peak (activations, library scratch) reserved, so a
  // state budget taken from the free memory after this call cannot starve a large step (vLLM's profile run
  // before it sizes the KV cache). Nothing runs for a host model.
  void reserve_step_memory(int64_t tokens);
  // Speculative decoding with the model's MTP layer (model/speculator.h): k drafts a round (1 ..
  // Speculator::kMaxDrafts), the rollback memory of max_sequences sequences of state_layout(tokens_per_page)
  // reserved now on the model's device. With decode graphs (enable_decode_graphs with max_queries k + 1) the trunk's
  // decode and verify steps replay them, returning their streams and record; the drafting, rollback and MTP catch-up
  // run eagerly. Call before
  // reserve_step_memory, which then reserves the MTP catch-up of a full step too.
  void enable_speculative(int k, int max_sequences, int64_t tokens_per_page = 0);
  int speculative_tokens() const override { return spec_ ? spec_k_ : 0; }
  int speculative_sequences() const override { return spec_ ? spec_->max_sequences() : 0; }
  int64_t speculative_bytes_per_sequence() const override { return spec_ ? spec_->bytes_per_sequence() : 0; }
  std::vector<std::vector<int32_t>> draft(std::span<const DraftRequest> requests, const DraftChooser& choose) override;
  void settle(std::span<const int32_t> kept) override;

 private:
  std::shared_ptr<model::Model> model_;
  std::string name_;
  int64_t weight_bytes_;
  int64_t max_context_;
  std::vector<int64_t> tokens_;  // the batch's tokens widened to the model's id type
  std::vector<model::StepSequence> steps_;
  std::unique_ptr<DecodeGraphs> graphs_;
  uint64_t steps_without_graphs_ = 0;
  std::unique_ptr<model::Speculator> spec_;
  int spec_k_ = 0;
  std::vector<model::StepSequence> rest_, verify_;  // a speculative step's plain and verify sequences
  bool device_sampling_ = true, sample_on_cpu_ = false;
  // forward_sample's per-step buffers: the request of each row of the plain / verify step, each to_host row's place.
  std::vector<size_t> rows_, rest_rows_, verify_rows_;
  std::vector<int64_t> host_slot_;
  Sampler cpu_sampler_;
  std::vector<std::vector<int32_t>> seen_;
  std::vector<std::vector<std::pair<int32_t, int32_t>>> counts_;
  std::vector<ops::SampleRowSpec> specs_;
  std::vector<ops::SampledRow> sampled_;

  void prepare_steps(const StepBatch& batch);
  // Samples `logits` (row i: request rows[i]) where they are, and copies the to_host rows into host_logits.
  void sample_logits(const TensorView& logits, std::span<const size_t> rows, std::span<const SampleRequest> requests,
                     std::span<SampleResult> results, std::span<float> host_logits);
  // With both speculation and graphs: the Speculator's trunk steps replay the graphs (DecodeGraphs::forward_trunk).
  void use_graphs_for_speculation();
  // forward() with speculative decoding on: the plain chunks through Speculator::forward, the verify chunks through
  // Speculator::verify; host logits in chunk order.
  void speculative_forward(const StepBatch& batch, std::span<float> logits);
};

}  // namespace tern::engine
