#include "engine/v4_runner.h"

#include <cstring>

#include "core/error.h"
#include "ops/backend.h"

namespace tern::engine {

V4Runner::V4Runner(std::shared_ptr<model::Model> model, std::string name, int64_t weight_bytes, int64_t max_context)
    : model_(std::move(model)), name_(std::move(name)), weight_bytes_(weight_bytes) {
  // Per-token growth measured from the layout of a long sequence: the fixed part (window rings,
  // accumulators) plus the compressed rows and indexer keys, spread over the tokens.
  constexpr int64_t probe = 1 << 16;
  const auto l = model_->state_layout(probe);
  layout_.fixed_bytes = static_cast<int64_t>(l->fixed_bytes());
  layout_.bytes_per_token = (static_cast<int64_t>(l->total_bytes()) - layout_.fixed_bytes + probe - 1) / probe;
  layout_.max_context = max_context;
}

std::vector<std::string> V4Runner::kernel_paths() const {
  const std::string backend(ops::backend_for(Device::cpu).name());
  std::vector<std::string> out;
  for (const char* op : {"embedding", "rms_norm", "rope", "linear (fp8 block / bf16)", "grouped_linear", "hc_pre / hc_post",
                         "compressor_update", "indexer_scores / indexer_topk", "sparse_attention", "moe route",
                         "moe_experts (mxfp4 / nvfp4)"})
    out.push_back(cat(op, ": ", backend, " reference (fp32 accumulation, threaded loops)"));
  return out;
}

void V4Runner::open_sequence(uint64_t seq, int64_t max_tokens) {
  states_.erase(seq);
  states_.emplace(seq, model_->new_state(max_tokens));
}

void V4Runner::close_sequence(uint64_t seq) { states_.erase(seq); }

std::vector<std::byte> V4Runner::export_state(uint64_t seq) const {
  auto it = states_.find(seq);
  TERN_CHECK(it != states_.end(), "V4 runner: sequence ", seq, " has no state to export");
  return it->second.serialize();
}

void V4Runner::import_state(uint64_t seq, std::span<const std::byte> state, int64_t position) {
  auto it = states_.find(seq);
  TERN_CHECK(it != states_.end(), "V4 runner: sequence ", seq, " has no state to import into");
  it->second.deserialize(state);
  TERN_CHECK(it->second.position() == position, "V4 runner: the imported state is at position ",
             it->second.position(), ", the request's prompt has ", position, " tokens");
}

void V4Runner::forward(const StepBatch& batch, std::span<float> logits) {
  tokens_.assign(batch.tokens.begin(), batch.tokens.end());
  steps_.clear();
  for (const auto& c : batch.chunks) {
    auto it = states_.find(c.seq);
    TERN_CHECK(it != states_.end(), "V4 runner: sequence ", c.seq, " has no state");
    TERN_CHECK(it->second.position() == c.start, "V4 runner: sequence ", c.seq, " is at position ",
               it->second.position(), ", the step starts at ", c.start);
    TERN_CHECK(c.num_logits == 0 || c.num_logits == 1 || c.num_logits == c.count,
               "V4 runner: logits for ", c.num_logits, " of ", c.count, " tokens are not supported");
    const model::LogitsFor want = c.num_logits == 0   ? model::LogitsFor::none
                                  : c.num_logits == 1 ? model::LogitsFor::last
                                                      : model::LogitsFor::all;
    steps_.push_back({&it->second, std::span<const int64_t>(tokens_.data() + c.token_offset, c.count), want});
  }
  const Tensor out = model_->forward(steps_);
  const size_t n = static_cast<size_t>(out.view().numel());
  TERN_CHECK(n == logits.size(), "V4 runner: the model returned ", n, " logits, expected ", logits.size());
  std::memcpy(logits.data(), out.view().data(), n * sizeof(float));
}

}  // namespace tern::engine
