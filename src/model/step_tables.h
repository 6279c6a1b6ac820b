// A step's tables (docs/cuda-backend.md "Steps on the step tables"): what the batched step ops (ops/step.h) read per
// slot, kept on the device, as vLLM's attention metadata and FlashMLA's scheduling metadata are: token ids,
// positions, the first slot of each slot's sequence, and the addresses of each slot's state (rings, accumulators,
// page pool and row block table). The model says how a step lies on them (a StepPlan: Model::plan_step,
// plan_mtp_step, plan_rollback); whoever runs the step builds them once for it and hands them to the forward
// (Model::forward and mtp_forward with a plan, rollback_steps, decode_body, mtp_body), which reads them and owns
// nothing of them: the runner's recorded steps (engine/decode_graphs.h: one device copy the graphs read, rewritten
// before each replay), the runner's eager steps (build()), and the model's own forward(batch) for tests and tools.
//
// A step on the tables lays its sequences out in `slots` slots, one token each: each sequence's q <= max_queries
// tokens in consecutive slots, then inert padding at position -1 (it reads and writes no state). The tables are
// i64 [words()]: array k of `slots` words at k * slots;
//   0 token ids, 1 positions, 2 the state's page pool and 3 its row block table on the device (addresses: every
//   layer's compressed rows and indexer keys are rows of those pages), 4 the slot of the first token of the slot's
//   sequence (ops/step.h "firsts"), then per layer l at 5 + 4 l: ring, compressor accumulators, indexer
//   accumulators (addresses; 0 where the layer has none), and the position of the compressed entry the token would
//   close ((p / ratio) * ratio).
//
//   StepTables t(layout, device, slots, max_queries);  // the description: what lies where
//   t.fill(host_image, batch);                         // a step's host image (addresses of its states)
//   copy host_image to device_words; t.view(device_words);   // what the forward reads
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "cache/state_layout.h"
#include "core/tensor.h"
#include "model/step_sequence.h"
#include "ops/step.h"

namespace tern::model {

// A device (or host) address as the tables and the step ops' table words hold it (ops/step.h: i64 addresses).
int64_t table_address(const TensorView& v);

// How a step lies on the step tables, as the model plans it (a plain value: the forward that runs the step reads the
// same plan, so the caller can build the tables in between). Its sequences, each in its slots (consecutive from its
// first), and the layout bounding the launches.
struct StepPlan {
  std::vector<StepSequence> sequences;  // on the tables, in slot order
  std::vector<int64_t> starts;          // each one's first position; empty: its state's
  std::vector<int64_t> first_slots;     // each one's first slot; empty: consecutive from slot 0
  int64_t slots = 0;
  const cache::StateLayout* bound = nullptr;  // the largest state's layout; nullptr: no sequence on the tables
  bool empty() const { return bound == nullptr; }
  // The most tokens a sequence brings (at least 1): the tables' max_queries.
  int64_t max_queries() const;
};

class StepTables {
 public:
  // The most tokens a sequence brings to a step on the tables (Model::kMaxStepQueries; a compressor chunk of the
  // step kernels spans at most three windows).
  static constexpr int64_t kMaxQueries = 4;

  // Tables of `slots` slots, up to max_queries tokens a sequence, for states with `bound`'s layers and page geometry
  // and at most its max_tokens positions (which sizes the attention and indexer launches), on `device`. `bound`
  // must outlive the tables.
  StepTables(const cache::StateLayout& bound, Device device, int64_t slots, int64_t max_queries = 1);

  // The i64 words of the tables of `slots` slots for states of `layout`: (5 + 4 layers) * slots.
  static int64_t words(const cache::StateLayout& layout, int64_t slots);
  int64_t words() const { return words(*layout_, slots_); }

  // Writes the host image (the first words() words of `image`) of `batch`: its tokens, one a slot, padded to the
  // slots with inert ones. Each state must have the tables' layers, be on their device and hold pages for its tokens.
  // starts: each sequence's first position (the MTP layer's rows trail the state by one); empty: its state's position.
  // first_slots: the slot of each sequence's first token (the slots between stay inert); empty: consecutive from 0.
  void fill(std::span<int64_t> image, std::span<const StepSequence> batch, std::span<const int64_t> starts = {},
            std::span<const int64_t> first_slots = {}) const;
  // Points the arrays at `words`: the image's copy on the tables' device, at least words() i64, kept alive by the
  // caller (a recorded step captures these addresses; each replay rewrites the words behind them).
  void view(const TensorView& words);
  // An eager step's tables: the image of `plan` copied to `device`, held here; none for an empty plan (no sequence
  // on the tables).
  static std::optional<StepTables> build(const StepPlan& plan, Device device);

  int64_t slots() const { return slots_; }
  int64_t max_queries() const { return max_queries_; }
  const cache::StateLayout& layout() const { return *layout_; }

  // The arrays (after view() or build()): i64 [slots] each.
  struct Layer {
    TensorView ring, compressor_acc, indexer_acc, entry_positions;
  };
  const TensorView& ids() const { return ids_; }
  const TensorView& positions() const { return positions_; }
  const TensorView& firsts() const { return firsts_; }
  const Layer& layer(int l) const { return layers_.at(static_cast<size_t>(l)); }
  // Each slot's rows of layer l in its pages (compressed rows, or with keys its indexer keys).
  ops::StepPagedRows paged_rows(int l, bool keys) const;

 private:
  const cache::StateLayout* layout_;
  Device device_;
  int64_t slots_, max_queries_;
  TensorView ids_, positions_, pools_, row_tables_, firsts_;
  std::vector<Layer> layers_;
  Tensor held_;  // build()'s words
};

}  // namespace tern::model
