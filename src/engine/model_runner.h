// The narrow interface the engine drives a model through: per-sequence state slots and one forward step
// over a batch of chunks (prefill chunks and decode tokens mixed). The CPU model implements it now; a
// CUDA runner later takes the same flat step description with one upload and no host sync inside.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tern::engine {

// How a sequence's state grows, for the memory plan and admission: fixed bytes (window rings,
// compressor accumulators) plus bytes per token of context (compressed rows, indexer keys).
struct StateLayout {
  int64_t fixed_bytes = 0;
  int64_t bytes_per_token = 0;
  int64_t max_context = 0;  // positions the model supports
};

// One sequence's part of a step: `count` new tokens at positions [start, start + count) appended to
// the state of `seq`; logits wanted for the last `num_logits` of them (1 for a decode or a prompt's
// last chunk, 0 for a middle prefill chunk, k + 1 when verifying k draft tokens).
struct StepChunk {
  uint64_t seq = 0;
  int64_t start = 0;
  int32_t count = 0;
  int32_t num_logits = 0;
  int64_t token_offset = 0;  // into StepBatch::tokens
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
  virtual StateLayout state_layout() const = 0;
  virtual int64_t weight_bytes() const = 0;
  // "op: kernel path" lines for the startup log.
  virtual std::vector<std::string> kernel_paths() const = 0;
  // A fresh, fully reset state for `seq` (never a previous sequence's leftovers) that will hold at
  // most `max_tokens` positions.
  virtual void open_sequence(uint64_t seq, int64_t max_tokens) = 0;
  virtual void close_sequence(uint64_t seq) = 0;
  // Runs the batch; writes batch.num_logits() rows of vocab_size() floats to `logits`, in chunk order.
  virtual void forward(const StepBatch& batch, std::span<float> logits) = 0;
  // Prefill-decode disaggregation: a self-contained copy of an open sequence's state, and its import
  // into a sequence opened with the same capacity on another runner of the same model. import_state
  // throws (naming what does not match) unless the state is at `position`; the sequence is then unusable
  // until closed. A runner that cannot move states throws from both.
  virtual std::vector<std::byte> export_state(uint64_t seq) const;
  virtual void import_state(uint64_t seq, std::span<const std::byte> state, int64_t position);
};

}  // namespace tern::engine
