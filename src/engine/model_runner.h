// The narrow interface the engine drives a model through: the layout of a sequence's state (the engine
// keeps every state in pages of its StatePool) and one forward step over a batch of chunks (prefill chunks
// and decode tokens mixed). The CPU and CUDA V4 models implement it (v4_runner.h); the step description is
// flat so a GPU runner uploads it once, with no host sync inside.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cache/sequence_state.h"
#include "cache/state_layout.h"
#include "engine/sampler.h"

namespace tern::engine {

// One sequence's part of a step: `count` new tokens at positions [start, start + count) appended to
// the state of `seq`; logits wanted for the last `num_logits` of them (1 for a decode or a prompt's
// last chunk, 0 for a middle prefill chunk, k + 1 when verifying k draft tokens).
struct StepChunk {
  uint64_t seq = 0;
  cache::SequenceState* state = nullptr;  // the engine's state of seq, with pages for start + count tokens
  int64_t start = 0;
  int32_t count = 0;
  int32_t num_logits = 0;
  int64_t token_offset = 0;  // into StepBatch::tokens
  // Speculative decoding's verify chunk: its last `drafts` tokens are the drafts of the last draft() (then
  // num_logits == count); the runner keeps what settle() needs to roll back the rejected ones.
  int32_t drafts = 0;
};

// One sequence's drafting (speculative decoding): its state at position m, the token x_m sampled and not yet
// consumed, and how many drafts to propose after it.
struct DraftRequest {
  uint64_t seq = 0;
  cache::SequenceState* state = nullptr;
  int32_t last = 0;
  int32_t count = 0;
  // Greedy without penalties: each draft is the draft row's argmax, taken where the logits are (the chooser is
  // not called for it).
  bool greedy = false;
};
// Picks draft j + 1 of request i from the draft model's logits row (its distribution q_{j+1}).
using DraftChooser = std::function<int32_t(size_t i, int j, std::span<const float> logits)>;

// Which path the runner's steps took: replayed CUDA graphs, and eager steps by reason; within the eager steps, the
// tokens whose attention, compressor and indexer ran on the step tables (one launch per op for all of them) or per
// sequence (prefill chunks), and the steps that held both (model::Model::step_paths).
struct StepPaths {
  uint64_t graph_steps = 0;
  std::map<std::string, uint64_t> eager_steps;
  uint64_t table_tokens = 0, per_sequence_tokens = 0, mixed_steps = 0;
  // Speculative decoding's MTP rows (drafting rounds, catch-ups; not engine steps): replayed, and eager by reason.
  uint64_t mtp_graph_steps = 0;
  std::map<std::string, uint64_t> mtp_eager_steps;
};

// One sampled row's request for ModelRunner::forward_sample: what the host sampler takes, with the
// uniforms already drawn from the request's generator (draw_uniforms).
struct SampleRequest {
  const SamplingParams* params = nullptr;
  const TokenHistory* history = nullptr;
  std::span<const double> uniforms;
  // Not sampled: the row's logits are copied to forward_sample's host_logits instead (such rows in order), for a
  // verdict that reads whole distributions (speculative decoding's sampled requests). params / history unread.
  bool to_host = false;
};

struct StepBatch {
  std::vector<int32_t> tokens;  // all chunks' new tokens, concatenated
  std::vector<StepChunk> chunks;
  int64_t num_logits() const;
  void clear() { tokens.clear(); chunks.clear(); }
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual std::string name() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_context() const = 0;  // positions the model supports
  // The layout of one sequence's state (at most max_context() positions) in pages of tokens_per_page tokens
  // (0: the cache's default), and the device its pages must be on.
  virtual std::shared_ptr<const cache::StateLayout> state_layout(int64_t tokens_per_page) const = 0;
  virtual Device state_device() const = 0;
  virtual int64_t weight_bytes() const = 0;
  // "op: kernel path" lines for the startup log.
  virtual std::vector<std::string> kernel_paths() const = 0;
  // Runs the batch (advancing each chunk's state); writes batch.num_logits() rows of vocab_size() floats
  // to `logits`, in chunk order.
  virtual void forward(const StepBatch& batch, std::span<float> logits) = 0;
  // Whether the runner samples where its logits are (forward_sample); the engine samples on the host
  // (Sampler over forward's logits) otherwise.
  virtual bool samples_on_device() const { return false; }
  // forward, then samples the batch.num_logits() rows where the logits are: one request and one result
  // per row, in chunk order. The results equal Sampler::sample_drawn's on the same logits. Rows whose request is
  // to_host are not sampled: their logits go to host_logits (vocab_size() floats each, in row order; its size
  // must be exactly that), and their results are left as they are.
  virtual void forward_sample(const StepBatch& batch, std::span<const SampleRequest> requests,
                              std::span<SampleResult> results, std::span<float> host_logits);
  // Counts of the steps run so far by path (the default counts nothing: a runner that tracks no paths).
  virtual StepPaths step_paths() const { return {}; }

  // Speculative decoding (engine/speculative.h, docs/mtp.md). speculative_tokens(): the drafts a verify step may
  // bring per sequence (0: the runner does not speculate); speculative_sequences(): the most sequences one round
  // may hold (their rollback memory is reserved up front, speculative_bytes_per_sequence() each).
  virtual int speculative_tokens() const { return 0; }
  virtual int speculative_sequences() const { return 0; }
  virtual int64_t speculative_bytes_per_sequence() const { return 0; }
  // A round: draft() proposes the drafts (returned in request order: count tokens each), the next forward()
  // verifies them (chunks with `drafts`, in the same order), settle() keeps the first kept[i] tokens (1 .. drafts +
  // 1) of verify chunk i and rolls the rest back exactly.
  virtual std::vector<std::vector<int32_t>> draft(std::span<const DraftRequest> requests, const DraftChooser& choose);
  virtual void settle(std::span<const int32_t> kept);
};

}  // namespace tern::engine
