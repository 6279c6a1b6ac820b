// Steps on the step tables (v4_model.h, "Steps on the step tables"): the forward with the per-sequence ops
// (compressors, indexer, attention, window-ring store) replaced by one launch for all slots, which reads each
// slot's position, sequence and state addresses from device tables.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <unordered_set>

#include "model/v4_batch.h"
#include "ops/branch.h"
#include "ops/step.h"
#include "ops/elementwise.h"
#include "ops/kv_row.h"
#include "ops/linear.h"
#include "ops/mhc.h"
#include "ops/norm.h"
#include "ops/rope.h"

namespace tern::model {

void Model::check_state(const cache::SequenceState& state) const {
  const cache::StateLayout& layout = state.layout();
  bool ours = layout.num_layers() == static_cast<int>(layer_specs_.size());
  for (int l = 0; ours && l < layout.num_layers(); ++l) ours = layout.spec(l) == layer_specs_[l];
  TERN_CHECK(ours, "forward: the state's layout does not belong to this model and KV mode");
  TERN_CHECK(state.device() == device_, "forward: the state is not on the model's device (make it with new_state())");
}

std::string Model::sequence_refusal(const StepSequence& s, int64_t max_queries, int64_t start) const {
  // A compressor chunk of the step kernels spans at most three windows: 2 ratio + 1 tokens of the smallest ratio.
  int64_t chunk_bound = INT64_MAX;
  for (int l = 0; l < w_.config.num_layers; ++l)
    if (const int r = w_.config.compress_ratio(l); r > 0) chunk_bound = std::min<int64_t>(chunk_bound, 2 * r + 1);
  const auto n = static_cast<int64_t>(s.tokens.size());
  if (n < 1 || n > max_queries) return "prefill in the step";
  if (n > w_.config.sliding_window) return "more tokens of a sequence than its window";
  if (n > chunk_bound) return "more tokens of a sequence than a compressor chunk of the step kernels (2 ratio + 1)";
  if (max_queries == 1 && s.logits != LogitsFor::last) return "a decode token without logits";
  if (s.state == nullptr) return "a missing state";
  if (s.state->capacity() < (start >= 0 ? start : s.state->position()) + n)
    return "a state without pages for its next tokens";
  return {};
}

std::string Model::geometry_refusal(const cache::StateLayout& state, const cache::StateLayout& layout) {
  if (state.max_tokens() > layout.max_tokens()) return "a sequence longer than the graphs' bound";
  if (!same_page_geometry(state, layout)) return "a state in pages of another geometry";
  return {};
}

std::string Model::decode_refusal(std::span<const StepSequence> batch, const cache::StateLayout& layout,
                                  int64_t max_queries, std::span<const int64_t> starts) const {
  TERN_CHECK(starts.empty() || starts.size() == batch.size(), "decode_refusal: ", starts.size(), " starts for ",
             batch.size(), " sequences");
  if (observer_) return "an observer is set";
  if (batch.empty()) return "an empty batch";
  std::unordered_set<const cache::SequenceState*> seen;
  for (size_t i = 0; i < batch.size(); ++i) {
    const StepSequence& s = batch[i];
    if (std::string why = sequence_refusal(s, max_queries, starts.empty() ? -1 : starts[i]); !why.empty()) return why;
    if (!seen.insert(s.state).second) return "a missing or repeated state";
    if (std::string why = geometry_refusal(s.state->layout(), layout); !why.empty()) return why;
  }
  return {};
}

StepPlan Model::plan_mtp_step(std::span<const MtpStep> batch) const {
  check_mtp_steps(batch);  // (a malformed batch is refused before any tables are built for it)
  StepPlan plan;
  for (const MtpStep& s : batch) {
    plan.sequences.push_back({s.state, s.next, s.logits});
    plan.starts.push_back(s.start);
    plan.slots += static_cast<int64_t>(s.next.size());
    const cache::StateLayout& layout = s.state->layout();  // the largest state's max_tokens bounds the launches
    if (plan.bound == nullptr || layout.max_tokens() > plan.bound->max_tokens()) plan.bound = &layout;
  }
  if (!step_tables_ || plan.bound == nullptr ||
      !decode_refusal(plan.sequences, *plan.bound, kMaxStepQueries, plan.starts).empty())
    return {};
  return plan;
}

void Model::use_tables(Batch& b, const StepTables& t) {
  TERN_CHECK(t.ids().numel() == t.slots(), "forward: step tables without their words (StepTables::view)");
  b.tokens = t.slots();
  b.table_tokens = b.tokens;
  b.ids = t.ids();
  b.positions = t.positions();
  b.tables = &t;
}

void Model::decode_done(std::span<const StepSequence> batch) {
  for (const StepSequence& s : batch) s.state->advance(static_cast<int64_t>(s.tokens.size()));
}

Tensor Model::decode_body(const StepTables& t, Tensor* streams_out, StepRecord* record) {
  const ModelConfig& c = w_.config;
  Batch b;
  use_tables(b, t);
  if (record != nullptr) {
    record->layers.assign(static_cast<size_t>(c.num_layers), {});
    b.record = record;
  }
  const Tensor streams = run_layers(b);
  if (streams_out != nullptr) *streams_out = streams;
  return head_of_every_row(streams, w_.hc_head, w_.norm);  // every slot's (forward() gathers the wanted rows first)
}

// compress() for every slot: the entry a slot's token closes is normed, RoPE'd at its position and stored
// by the device (which decides whether the token closes a window).
void Model::compress_step(int l, const Batch& b, const TensorView& h, bool indexer) {
  const CompressorInputs in = compressor_inputs(l, h, indexer);
  if (b.record != nullptr) {  // kept for rollback_step: the projections and what they view
    StepRecord::Compressor& r = indexer ? b.record->layers[static_cast<size_t>(l)].indexer
                                        : b.record->layers[static_cast<size_t>(l)].compressor;
    r.storage[0] = in.kv_gate.stacked_out, r.storage[1] = in.kv_gate.a_out, r.storage[2] = in.kv_gate.b_out;
    r.kv = in.kv_gate.a, r.gate = in.kv_gate.b;
  }
  emit_entries(l, b, in.kv_gate.a, in.kv_gate.b, indexer);  // rows strided when stacked
}

void Model::emit_entries(int l, const Batch& b, const TensorView& kv, const TensorView& gate, bool indexer) {
  const ModelConfig& c = w_.config;
  const AttentionWeights& A = layer(l).attn;
  const CompressorWeights& cw = indexer ? A.indexer->compressor : *A.compressor;
  const ops::KvRowFormat format = entry_format(cw, indexer);
  const StepTables& tables = *b.tables;
  const StepTables::Layer& t = tables.layer(l);
  const int ratio = c.compress_ratio(l);
  const int64_t N = kv.dim(0), width = cw.width;  // the tables' slots
  const float eps = static_cast<float>(c.rms_norm_eps);
  ops::StepCompressorArgs update;
  update.accs = indexer ? t.indexer_acc : t.compressor_acc;
  update.kv = kv, update.gate = gate, update.ape = cw.ape, update.positions = tables.positions();
  if (tables.max_queries() > 1) update.firsts = tables.firsts(), update.max_queries = tables.max_queries();
  update.ratio = ratio, update.overlap = cw.overlap, update.width = width;
  const ops::StepPagedRows dest = tables.paged_rows(l, indexer);
  if (paths_.fused_compress && ops::step_compress_emit_supported(ctx_, kv.device(), width)) {
    ops::step_compress_emit(ctx_, {update, cw.norm, eps, inv_freq_compress_, format, dest});
    return;
  }
  Tensor emitted = tensor(DType::f32, {N, width});
  ops::StepCompressorArgs unfused = update;
  unfused.emitted = emitted;
  ops::step_compressor(ctx_, unfused);
  ops::rms_norm(ctx_, emitted, cw.norm, eps, emitted);
  ops::rope(ctx_, emitted, t.entry_positions, inv_freq_compress_);
  Tensor rows = tensor(DType::u8, {N, format.row_bytes()});
  ops::kv_pack(ctx_, emitted, format, rows);
  ops::store_paged_rows(ctx_, rows, dest, tables.positions(), ratio);
}

void Model::rollback_step(cache::SequenceState& state, const cache::Snapshot& before, const StepRecord& record,
                          int64_t first_row, int64_t kept) {
  const Rollback r{&state, &before, first_row, kept};
  rollback_steps({&r, 1}, record);
}

namespace {
// A rollback step's token ids: the tables' ids are not read there (only positions and addresses).
constexpr int64_t kUnreadIds[Model::kMaxStepQueries] = {};
}  // namespace

StepPlan Model::plan_rollback(std::span<const Rollback> seqs, const StepRecord& record) const {
  const ModelConfig& c = w_.config;
  TERN_CHECK(static_cast<int>(record.layers.size()) == c.num_layers,
             "rollback_step: the step was not recorded (it did not run on the step tables)");
  StepPlan plan;
  if (seqs.empty()) return plan;
  const int64_t rows = record.layers.front().rows.dim(0);
  // The kept tokens as one step of their own on the tables, each in its recorded slots at its snapshot's positions
  // (the state's once restored); the rejected tokens' slots and the sequences' gaps stay inert.
  std::unordered_set<const cache::SequenceState*> seen;
  for (const Rollback& r : seqs) {
    TERN_CHECK(r.state != nullptr && r.before != nullptr, "rollback_step: a sequence without its state or snapshot");
    TERN_CHECK(r.kept >= 1 && r.kept <= kMaxStepQueries && r.first_row >= 0 && r.first_row + r.kept <= rows,
               "rollback_step: tokens ", r.first_row, " .. ", r.first_row + r.kept, " of a step of ", rows);
    TERN_CHECK(seen.insert(r.state).second, "rollback_step: a state appears twice");
    check_state(*r.state);
    const cache::StateLayout& layout = r.state->layout();
    TERN_CHECK(plan.bound == nullptr || same_page_geometry(*plan.bound, layout),
               "rollback_step: the states are in pages of different geometries");
    // the largest state: its max_tokens bounds the launches
    if (plan.bound == nullptr || layout.max_tokens() > plan.bound->max_tokens()) plan.bound = &layout;
    plan.sequences.push_back(
        {r.state, std::span<const int64_t>(kUnreadIds).first(static_cast<size_t>(r.kept)), LogitsFor::none});
    plan.starts.push_back(r.before->position);
    plan.first_slots.push_back(r.first_row);
    plan.slots = std::max(plan.slots, r.first_row + r.kept);
  }
  std::vector<std::pair<int64_t, int64_t>> ranges;  // [first_row, first_row + kept) of each, checked before any restore
  for (const Rollback& r : seqs) ranges.push_back({r.first_row, r.first_row + r.kept});
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    TERN_CHECK(ranges[i].first >= ranges[i - 1].second, "rollback_step: rows ", ranges[i - 1].first, " .. ",
               ranges[i - 1].second - 1, " and ", ranges[i].first, " .. ", ranges[i].second - 1, " overlap");
  return plan;
}

void Model::rollback_steps(std::span<const Rollback> seqs, const StepRecord& record) {
  const StepPlan plan = plan_rollback(seqs, record);
  if (plan.empty()) return;
  rollback_steps(seqs, record, *StepTables::build(plan, device_));
}

void Model::rollback_steps(std::span<const Rollback> seqs, const StepRecord& record, const StepTables& t) {
  const ModelConfig& c = w_.config;
  const int64_t slots = t.slots();
  for (const Rollback& r : seqs) r.state->restore(*r.before);
  Batch b;
  use_tables(b, t);
  const TensorView firsts = t.max_queries() > 1 ? t.firsts() : TensorView();
  for (int l = 0; l < c.num_layers; ++l) {
    const StepRecord::Layer& r = record.layers[static_cast<size_t>(l)];
    ops::store_ring_rows(ctx_, r.rows.view().rows(0, slots), t.layer(l).ring, t.positions(), firsts,
                         c.sliding_window);
    for (const bool indexer : {false, true}) {
      const StepRecord::Compressor& cr = indexer ? r.indexer : r.compressor;
      if (cr.kv.empty()) continue;  // the layer has no such compressor
      emit_entries(l, b, cr.kv.rows(0, slots), cr.gate.rows(0, slots), indexer);
    }
  }
  for (const Rollback& r : seqs) r.state->advance(r.kept);
}

// indexer_select() for every slot: qI, the weights, and each slot's top-k of its visible keys.
Tensor Model::indexer_weights(int l, const TensorView& h) {
  Tensor weights = tensor(DType::f32, {h.dim(0), w_.config.index_n_heads});
  ops::linear(ctx_, h, layer(l).attn.indexer->weights_proj, weights);
  return weights;
}

Tensor Model::indexer_step(int l, const Batch& b, const TensorView& h, const TensorView& cq, const TensorView& weights) {
  const ModelConfig& c = w_.config;
  const IndexerWeights& x = *layer(l).attn.indexer;
  const int64_t N = h.dim(0), Hi = c.index_n_heads, di = c.index_head_dim;  // the tables' slots
  Tensor qi = tensor(DType::f32, {N, Hi, di});
  ops::linear(ctx_, cq, x.wq_b, qi.view().reshape({N, Hi * di}));
  ops::rope(ctx_, qi, b.tables->positions(), inv_freq_compress_);
  ops::StepIndexerArgs args;
  args.q = qi;
  args.weights = weights;
  args.keys = b.tables->paged_rows(l, /*keys=*/true);
  args.positions = b.tables->positions();
  args.ratio = c.compress_ratio(l);
  args.max_keys = b.tables->layout().max_tokens() / args.ratio;
  Tensor selected = tensor(DType::i32, {N, c.index_topk});
  ops::step_indexer_topk(ctx_, args, c.index_topk, selected);
  return selected;
}

// attend() for every slot, then each slot's row enters its ring.
void Model::attend_step(int l, const Batch& b, const TensorView& q, const TensorView& kv_rows,
                        const Tensor& selected, const TensorView& heads, const TensorView& inv_freq) {
  const ModelConfig& c = w_.config;
  const StepTables& tables = *b.tables;
  const StepTables::Layer& t = tables.layer(l);
  const TensorView positions = tables.positions();
  const bool several = tables.max_queries() > 1;  // tokens a sequence
  ops::StepAttentionArgs args;
  args.q = q;
  args.positions = positions;
  if (several) args.firsts = tables.firsts();
  args.format = kv_format();
  args.rows = kv_rows;
  args.rings = t.ring;
  args.window = c.sliding_window;
  args.ratio = layer_specs_[static_cast<size_t>(l)].ratio;  // the MTP layer's (l = num_layers) too: 0
  if (args.ratio > 0) {
    args.compressed = tables.paged_rows(l, /*keys=*/false);
    args.max_compressed = tables.layout().max_tokens() / args.ratio;
  }
  args.selected = selected.empty() ? TensorView() : selected.view();
  args.sinks = layer(l).attn.attn_sink;
  args.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  args.inv_freq = inv_freq;
  // One token a sequence: the slots' rows enter their rings on a side branch beside the attention (joined at the
  // end of the attention sub-layer): a query reads its ring's other window - 1 slots and this step's row from
  // kv_rows, never the slot p % window the store writes, and no two slots share a ring. Several: a later token's
  // ring slot holds a row an earlier token of the sequence reads, so the rows enter after the attention.
  if (several) {
    ops::step_attention(ctx_, args, heads);
    ops::store_ring_rows(ctx_, kv_rows, t.ring, positions, tables.firsts(), c.sliding_window);
    return;
  }
  ops::run_side(ctx_, kv_rows.device(),
                [&] { ops::store_ring_rows(ctx_, kv_rows, t.ring, positions, {}, c.sliding_window); });
  ops::step_attention(ctx_, args, heads);
}

}  // namespace tern::model
