// ModelRunner over the DeepSeek-V4 forward pass (model/v4_model.h): one cache::SequenceState per
// sequence, created with the capacity the engine asks for and dropped on close.
#pragma once

#include <memory>
#include <unordered_map>

#include "cache/sequence_state.h"
#include "engine/model_runner.h"
#include "model/v4_model.h"

namespace tern::engine {

class V4Runner : public ModelRunner {
 public:
  // `weight_bytes`: the checkpoint's size, for the memory plan.
  V4Runner(std::shared_ptr<model::Model> model, std::string name, int64_t weight_bytes, int64_t max_context);
  std::string name() const override { return name_; }
  int64_t vocab_size() const override { return model_->config().vocab_size; }
  StateLayout state_layout() const override { return layout_; }
  int64_t weight_bytes() const override { return weight_bytes_; }
  std::vector<std::string> kernel_paths() const override;
  void open_sequence(uint64_t seq, int64_t max_tokens) override;
  void close_sequence(uint64_t seq) override;
  void forward(const StepBatch& batch, std::span<float> logits) override;
  std::vector<std::byte> export_state(uint64_t seq) const override;
  void import_state(uint64_t seq, std::span<const std::byte> state, int64_t position) override;

 private:
  std::shared_ptr<model::Model> model_;
  std::string name_;
  int64_t weight_bytes_;
  StateLayout layout_;
  std::unordered_map<uint64_t, cache::SequenceState> states_;
  std::vector<int64_t> tokens_;  // the batch's tokens widened to the model's id type
  std::vector<model::StepSequence> steps_;
};

}  // namespace tern::engine
