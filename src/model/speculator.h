// Speculative decoding's model side (issue #18, docs/mtp.md), for a batch of sequences: the MTP layer kept caught
// up on every consumed position, drafting with it, and settling a verify step (the rejected tokens rolled back
// exactly, the kept ones caught up). Both the serving engine (engine/v4_runner.h) and `generate` drive it.
//
// A sequence's round, with its state at position m (the token y = x_m sampled, not consumed yet):
//   draft:   the MTP row of m - 1 (the carry h_{m-1}, y) gives d_1; chained rows m .. m + k - 2 (their hidden the
//            previous row's MTP output) give d_2 .. d_k. Row m - 1 is final; the chained rows are speculative, so
//            the MTP window is copied before them and put back by settle();
//   verify:  one step of [y, d_1 .. d_k] at m .. m + k on the step tables, recorded, after a snapshot of the state;
//   settle:  a tokens kept of k + 1: the snapshot restored and the kept tokens' window rows and compressor inputs
//            re-stored from the record (Model::rollback_step) when a < k + 1; the MTP rows of m .. m + a - 2
//            (next tokens d_1 .. d_{a-1}) run on the verify step's streams; the carry := the streams of m + a - 1.
// The carry is each state's (cache LayerSpec::carry_floats of the MTP layer), so snapshots, preemption and
// prefill-decode transfers keep it. Every plain step goes through forward(), which keeps the window and the
// carry up to date: its sequences' rows start - 1 .. start + n - 2 (next tokens known), carry := row start + n - 1.
//
// The snapshot slots and window copies are reserved up front for max_sequences sequences on the model's
// device (bytes_per_sequence()), so a batch never shrinks for lack of them.
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "model/v4_model.h"

namespace tern::model {

// A trunk step's hidden streams before hc_head (every row, batch order) and, when asked, its StepRecord (a verify
// step's rollback): views valid until the next step of whoever ran it (a replayed graph's arena, or the eager step's
// tensors). What the MTP layer reads after a trunk step.
struct TrunkRows {
  TensorView streams;
  const Model::StepRecord* record = nullptr;
};
// An eager trunk step: Model::forward on `tables` (built from plan = model.plan_step(batch) by whoever runs the step)
// with every row's streams into `streams` (and, with want_record, the record into `record`), `out` viewing them. The
// speculator's own trunk step, and the runner's graphs' eager one.
Tensor eager_trunk(Model& model, std::span<const StepSequence> batch, const StepPlan& plan,
                   const std::optional<StepTables>& tables, bool want_record, bool on_device, Tensor& streams,
                   Model::StepRecord& record, TrunkRows& out);

struct DraftSequence {
  cache::SequenceState* state = nullptr;  // at position m, caught up (its carry is h_{m-1})
  int64_t last = 0;                       // y = x_m, sampled, not consumed
  int count = 0;                          // drafts wanted: 1 .. Model::kMaxStepQueries - 1
  // Each draft the MTP row's argmax, taken where the logits are (no row crosses to the host; the chooser is not
  // called): a greedy request without penalties.
  bool greedy = false;
};

class Speculator {
 public:
  // `layout`: the states' layout (snapshot size); max_sequences: the most sequences of one verify step.
  Speculator(Model& model, const cache::StateLayout& layout, int max_sequences);
  int max_sequences() const { return max_sequences_; }
  static constexpr int kMaxDrafts = static_cast<int>(Model::kMaxStepQueries) - 1;
  // Reserved per sequence: its snapshot slot (the state's fixed pages) and its MTP window copy.
  int64_t bytes_per_sequence() const { return snapshot_bytes_ + window_bytes_; }

  // A plain step with the MTP layer kept up: the trunk step (below) with every row's streams, then the MTP rows of
  // the positions whose next token the step knows, and the carries. Returns the host logits.
  Tensor forward(std::span<const StepSequence> batch);
  // The same with the logits on the model's device: a view valid until the next trunk step (`hold` keeps an eager
  // step's), for sampling where they are.
  TensorView forward_device(std::span<const StepSequence> batch, Tensor& hold);

  // Round j runs the MTP rows of every sequence that wants more than j drafts; choose(i, j, logits) gives draft
  // j + 1 of sequence i from its row's logits (the draft distribution q_{j+1}), unless the sequence is greedy.
  using Chooser = std::function<int64_t(size_t seq, int j, std::span<const float> logits)>;
  void draft(std::span<const DraftSequence> seqs, const Chooser& choose);
  // Sequence i's drafts of the last draft().
  std::span<const int64_t> drafts(size_t i) const { return std::span<const int64_t>(tokens_.at(i)).subspan(1); }

  // The verify step of the last draft(): batch[i] brings [y, d_1 .. d_k] of seqs[i] (LogitsFor::all). Returns the
  // logits of every row, f32 [sum (k_i + 1), vocab] on the host.
  Tensor verify(std::span<const StepSequence> batch);
  // The same with the logits on the model's device (as forward_device).
  TensorView verify_device(std::span<const StepSequence> batch, Tensor& hold);

  // Sequence i of the last verify() keeps its first kept[i] tokens (1 .. k_i + 1).
  void settle(std::span<const int64_t> kept);

  // How the trunk's steps run (forward's and verify's): by default Model::forward with every row's streams (and the
  // record); the serving runner gives its CUDA graphs (engine::DecodeGraphs::forward_trunk), whose views live until
  // its next step. Returns the logits: on the host in `hold` (on_device false), or where the model is (a view, `hold` owning
  // them where the step does not); fills the streams (every row, batch order) and, when asked, the record.
  using TrunkStep = std::function<TensorView(std::span<const StepSequence>, bool want_record, bool on_device,
                                             TrunkRows&, Tensor& hold)>;
  void set_trunk_step(TrunkStep step) { trunk_step_ = std::move(step); }
  // How MTP rows run (drafting rounds and catch-ups): by default Model::mtp_forward; the serving runner gives its
  // CUDA graphs (engine::DecodeGraphs::forward_mtp: drafting rounds and catch-ups of a few rows a sequence replay
  // graphs, longer catch-ups run mtp_forward).
  using DraftStep = std::function<Model::MtpResult(std::span<const Model::MtpStep>)>;
  void set_draft_step(DraftStep step) { draft_step_ = std::move(step); }

 private:
  Model& model_;
  int max_sequences_;
  int64_t snapshot_bytes_ = 0, window_bytes_ = 0;
  Tensor snapshots_, windows_;  // u8 [max_sequences, bytes] on the model's device
  // The round in flight (draft -> verify -> settle).
  std::vector<DraftSequence> drafting_;
  std::vector<std::vector<int64_t>> tokens_;  // per sequence: y, d_1 .. d_k
  std::vector<cache::Snapshot> before_;
  TrunkRows verified_trunk_;  // the verify step's streams (every row) and record
  bool verified_ = false;
  TrunkStep trunk_step_;
  DraftStep draft_step_;
  Tensor own_streams_;  // the default trunk step's
  Model::StepRecord own_record_;

  TensorView trunk(std::span<const StepSequence> batch, bool want_record, bool on_device, TrunkRows& out,
                   Tensor& hold);
  TensorView forward_impl(std::span<const StepSequence> batch, bool on_device, Tensor& hold);
  TensorView verify_impl(std::span<const StepSequence> batch, bool on_device, Tensor& hold);

  TensorView slot(Tensor& slots, size_t i, int64_t bytes) const;
  // The MTP rows of `rows` (per sequence: state, first position, hidden rows, next tokens); no logits.
  void catch_up(std::span<const Model::MtpStep> rows);
};

}  // namespace tern::model
