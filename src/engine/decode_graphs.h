// Decode steps as CUDA graphs (docs/cuda-backend.md, "CUDA graphs"): one recorded decode step per batch
// bucket, replayed for every decode-only step whose batch fits a bucket (padded with inert slots to the
// smallest bucket not below it). Everything else runs Model::forward eagerly, counted by reason.
//
//   DecodeGraphs graphs(model, {.max_tokens = 4096});
//   graphs.prepare();                       // dry run at the largest bucket, arena, capture every bucket
//   Tensor logits = graphs.forward(batch);  // as Model::forward: host logits, states advanced
//
// The runner's part of a step, beside the model's: it owns the step tables the recorded steps read (one device copy
// of model::StepTables' words, written from page-locked staging before each replay) and hands them to
// Model::decode_body / mtp_body, which compute the step; its eager steps' tables it builds from the model's plan
// (eager_step). Device-agnostic: the recording goes through ops::StepGraphs, installed by the device's backend.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/speculator.h"
#include "model/step_tables.h"
#include "model/v4_model.h"
#include "ops/recorded_steps.h"

namespace tern::engine {

// The runner's eager step: the model plans how the batch lies on the step tables (Model::plan_step), the tables are
// built here from that plan, and Model::forward reads them. As Model::forward(batch, logits_on_device).
Tensor eager_step(model::Model& model, std::span<const model::StepSequence> batch, bool logits_on_device);

// 1, 2, 4, 8, 16, 24, 32, then steps of 16 up to max_batch (max_batch itself always included).
std::vector<int64_t> default_decode_buckets(int64_t max_batch);
// The smallest bucket >= batch (buckets ascending), or -1 when the batch is above the largest.
int64_t pick_decode_bucket(std::span<const int64_t> buckets, int64_t batch);

struct DecodeGraphOptions {
  bool enabled = true;         // false: every step eager (--cuda-graphs off)
  int64_t max_batch = 32;      // the largest bucket (when buckets is empty)
  std::vector<int64_t> buckets;  // ascending; empty: default_decode_buckets(max_batch)
  int64_t max_tokens = 0;      // bound on any sequence's capacity (sizes the indexer and attention launches)
  int64_t tokens_per_page = 0;  // the states' page geometry (cache::StateLayout; 0: the cache's default)
  // Tokens a sequence a replayed step may bring: 1 records decode steps; up to model::Model::kMaxStepQueries also
  // records verify steps (every sequence the same q >= 2 tokens, LogitsFor::all), buckets over (sequences, q):
  // bucket b of q runs b * q slots, recorded on first use. The arena is sized for the largest bucket at this q.
  int64_t max_queries = 1;
};

struct DecodeGraphStats {
  uint64_t graph_steps = 0;
  // forward_mtp's calls (drafting rounds and catch-ups): replayed, and run eagerly by reason (not steps of the engine:
  // kept out of eager_steps, whose total with graph_steps is the steps run).
  uint64_t mtp_graph_steps = 0;
  std::map<std::string, uint64_t> mtp_eager;
  std::map<std::string, uint64_t> eager_steps;  // by reason
  uint64_t captures = 0;                        // graphs recorded (startup and re-recordings)
  size_t arena_bytes = 0, graph_bytes = 0;
  uint64_t eager_total() const;
};

class DecodeGraphs {
 public:
  DecodeGraphs(model::Model& model, DecodeGraphOptions options);
  // Sizes the activation arena by a dry run at the largest bucket (every slot inert, so no state is
  // touched) and records every bucket, logging the time and memory. Graphs off, a CPU model or a failure
  // leaves every step eager, with the reason logged and counted.
  void prepare();
  // As Model::forward (host logits, states advanced): a graph replay when the batch is decode-only (or a verify
  // step, with max_queries > 1) and fits a bucket, else the eager forward.
  Tensor forward(std::span<const model::StepSequence> batch);
  // The same with the logits left on the device: a view valid until the next step (the replayed step's
  // rows, or the eager step's logits, which `hold` keeps).
  TensorView forward_device(std::span<const model::StepSequence> batch, Tensor& hold);
  // As Model::forward(batch, every row's streams, streams, false, record): host logits, and views of the step's
  // trunk streams (every row, batch order) and, with want_record, its StepRecord, valid until the next step (a
  // replayed graph's arena, or the eager step's tensors kept here). What speculative decoding's steps run on
  // (model::Speculator::TrunkStep).
  Tensor forward_trunk(std::span<const model::StepSequence> batch, bool want_record, model::TrunkRows& out);
  // The same with the logits left on the device (as forward_device: a view valid until the next step, `hold` keeping
  // an eager step's).
  TensorView forward_trunk_device(std::span<const model::StepSequence> batch, bool want_record, model::TrunkRows& out,
                                  Tensor& hold);
  // With speculation (max_queries > 1) on a model with an MTP layer: MTP rows of one token a sequence, all
  // LogitsFor::last (a drafting round, as Speculator::draft runs them), or of 1 .. max_queries tokens a sequence,
  // all LogitsFor::none (a catch-up: a decode step's, a settle's), replay a recorded Model::mtp_body (with its head
  // for the drafting rounds only) per (batch bucket, most rows a sequence), recorded on first use; anything else, or
  // a graph whose capture failed, runs Model::mtp_forward (counted in stats().mtp_eager by reason). The result is
  // mtp_forward's (streams copied out of the graph's memory).
  model::Model::MtpResult forward_mtp(std::span<const model::Model::MtpStep> steps);

  const DecodeGraphStats& stats() const { return stats_; }
  const std::vector<int64_t>& buckets() const { return buckets_; }
  // Empty while graphs run; else why every step is eager.
  const std::string& disabled_reason() const { return disabled_; }

 private:
  // A step; with on_device the logits stay on the device and *view shows them.
  Tensor step(std::span<const model::StepSequence> batch, bool on_device, TensorView* view,
              model::TrunkRows* trunk = nullptr, bool want_record = false);
  Tensor eager(std::span<const model::StepSequence> batch, const std::string& reason, bool on_device, TensorView* view,
               model::TrunkRows* trunk = nullptr, bool want_record = false);
  // The step tables of `slots` slots, up to q tokens a sequence, viewing the device copy every recorded step reads.
  model::StepTables tables(int64_t slots, int64_t q) const;
  // Writes the host image of `batch` in tables of `slots` slots, up to q tokens a sequence, into the staging and
  // copies it to the device copy (one H2D copy), which the recorded step of those tables reads.
  void upload_tables(std::span<const model::StepSequence> batch, int64_t slots, int64_t q,
                     std::span<const int64_t> starts = {});
  // Whether the MTP layer's draft rows get graphs (speculation on a model with an MTP layer), and bucket i's.
  bool mtp_graphs() const { return options_.max_queries > 1 && model_.has_mtp(); }
  void record_mtp(size_t bucket, int64_t q, bool head);
  // MTP graph of bucket i, q rows a sequence, with the head (drafting rounds, q = 1) or without (catch-ups): the
  // headless ones at graph_index, the q = 1 ones with the head after them.
  size_t mtp_index(size_t i, int64_t q, bool head) const {
    return head ? handles_.size() + i : graph_index(i, q);
  }
  // Records body's device work with its tensors in the arena (the generation, graph memory and count kept up).
  int capture_in_arena(const std::function<void()>& body);
  // Drops every recorded graph (the backend's workspace or arena moved): each records again on its next use.
  void forget_graphs();
  model::Model::MtpResult eager_mtp(std::span<const model::Model::MtpStep> steps, const std::string& reason);
  // Graph g = (q - 1) * buckets + bucket index: bucket buckets_[i] of q tokens a sequence.
  size_t graph_index(size_t bucket, int64_t q) const { return static_cast<size_t>(q - 1) * buckets_.size() + bucket; }
  void record(size_t bucket, int64_t q);

  model::Model& model_;
  DecodeGraphOptions options_;
  std::shared_ptr<const cache::StateLayout> layout_;  // the states the graphs serve: bound and page geometry
  std::vector<int64_t> buckets_;
  ops::StepGraphs* graphs_ = nullptr;
  std::string disabled_;
  // The step tables' words (model::StepTables) of the largest step: host i64, page-locked
  // (ops::StepGraphs::pinned_host), and their device copy, which every recorded step reads.
  TensorView staging_;
  Tensor tables_;
  std::vector<int> handles_;     // per graph (graph_index); -1: not recorded, -2: a verify bucket that failed to record
  std::vector<Tensor> logits_;   // per graph: the recorded step's device logits (arena)
  std::vector<Tensor> streams_;  // per graph: its trunk streams of every slot (arena)
  std::vector<model::Model::StepRecord> records_;  // per verify graph (q > 1): its StepRecord (arena)
  // The MTP graphs (mtp_graphs()): per (bucket, q, head) (mtp_index) its handle, its device logits and output
  // streams (arena), and the hidden input they all read ([largest * max_queries, hc, D], outside the arena, filled
  // before each replay).
  std::vector<int> mtp_handles_;
  std::vector<Tensor> mtp_logits_, mtp_streams_;
  Tensor mtp_hidden_;
  Tensor eager_streams_;                     // forward_trunk's eager step's
  model::Model::StepRecord eager_record_;
  uint64_t generation_ = 0;
  bool prepared_ = false;
  DecodeGraphStats stats_;
};

}  // namespace tern::engine
