#include "model/speculator.h"

#include <algorithm>

#include "ops/elementwise.h"

namespace tern::model {

namespace {

// A contiguous view's bytes as u8 [nbytes].
TensorView bytes_of(const TensorView& v) {
  return TensorView(v.data(), DType::u8, {static_cast<int64_t>(v.nbytes())}, v.device());
}

}  // namespace

Tensor eager_trunk(Model& model, std::span<const StepSequence> batch, const StepPlan& plan,
                   const std::optional<StepTables>& tables, bool want_record, bool on_device, Tensor& streams,
                   Model::StepRecord& record, TrunkRows& out) {
  const std::vector<LogitsFor> all(batch.size(), LogitsFor::all);
  Tensor logits = model.forward(batch, plan, tables, all, streams, on_device, want_record ? &record : nullptr);
  out.streams = streams.view();
  out.record = want_record && !record.layers.empty() ? &record : nullptr;
  return logits;
}

Speculator::Speculator(Model& model, const cache::StateLayout& layout, int max_sequences)
    : model_(model), max_sequences_(max_sequences) {
  TERN_CHECK(model.has_mtp(), "speculative decoding needs the MTP layer (the checkpoint has no mtp.0.* tensors)");
  TERN_CHECK(max_sequences >= 1, "speculator: max_sequences must be positive, found ", max_sequences);
  const int l = model.mtp_layer();
  TERN_CHECK(layout.num_layers() == l + 1 && layout.spec(l).carry_floats > 0,
             "speculator: the state layout has no MTP window and carry (not this model's layout)");
  snapshot_bytes_ = layout.fixed_pages() * layout.page_bytes();
  window_bytes_ = layout.spec(l).window * layout.spec(l).kv_row_bytes;
  snapshots_ = Tensor(DType::u8, {max_sequences, snapshot_bytes_}, model.device(), TensorInit::uninitialized);
  windows_ = Tensor(DType::u8, {max_sequences, window_bytes_}, model.device(), TensorInit::uninitialized);
}

TensorView Speculator::slot(Tensor& slots, size_t i, int64_t bytes) const {
  return slots.view().rows(static_cast<int64_t>(i), static_cast<int64_t>(i) + 1).reshape({bytes});
}

TensorView Speculator::trunk(std::span<const StepSequence> batch, bool want_record, bool on_device,
                             TrunkRows& out, Tensor& hold) {
  if (trunk_step_) return trunk_step_(batch, want_record, on_device, out, hold);
  const StepPlan plan = model_.plan_step(batch);  // this speculator runs the step: it builds the tables
  hold = eager_trunk(model_, batch, plan, StepTables::build(plan, model_.device()), want_record, on_device,
                     own_streams_, own_record_, out);
  return hold.view();
}

void Speculator::catch_up(std::span<const Model::MtpStep> rows) {
  if (rows.empty()) return;
  // Through the draft step (the serving runner's graphs take catch-ups of a few rows a sequence; longer ones, a
  // prompt chunk's, run mtp_forward there).
  if (draft_step_) (void)draft_step_(rows);
  else (void)model_.mtp_forward(rows);
}

Tensor Speculator::forward(std::span<const StepSequence> batch) {
  Tensor hold;
  (void)forward_impl(batch, false, hold);
  return hold;
}

TensorView Speculator::forward_device(std::span<const StepSequence> batch, Tensor& hold) {
  return forward_impl(batch, true, hold);
}

TensorView Speculator::forward_impl(std::span<const StepSequence> batch, bool on_device, Tensor& hold) {
  const ModelConfig& c = model_.config();
  const int64_t H = c.hc_mult, D = c.hidden_size;
  const int mtp = model_.mtp_layer();
  std::vector<int64_t> starts;
  int64_t rows = 0;
  for (const StepSequence& s : batch) {
    TERN_CHECK(s.state != nullptr && !s.tokens.empty(), "speculator: every sequence needs a state and a token");
    starts.push_back(s.state->position());
    rows += static_cast<int64_t>(s.tokens.size()) - 1 + (starts.back() > 0 ? 1 : 0);
  }
  TrunkRows step;
  const TensorView logits = trunk(batch, false, on_device, step, hold);
  const TensorView streams = step.streams;
  // The hidden of every MTP row: the carry (row start - 1), then the step's rows but the last.
  Tensor hidden(DType::f32, {rows, H, D}, model_.device(), TensorInit::uninitialized);
  std::vector<Model::MtpStep> steps;
  int64_t at = 0, from = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const StepSequence& s = batch[i];
    const auto n = static_cast<int64_t>(s.tokens.size());
    const bool carried = starts[i] > 0;
    const int64_t m = n - 1 + (carried ? 1 : 0);
    if (carried) ops::copy(s.state->carry(mtp), hidden.view().rows(at, at + 1));
    if (n > 1) ops::copy(streams.rows(from, from + n - 1), hidden.view().rows(at + (carried ? 1 : 0), at + m));
    if (m > 0)
      steps.push_back({s.state, carried ? starts[i] - 1 : starts[i], hidden.view().rows(at, at + m),
                       carried ? s.tokens : s.tokens.subspan(1), LogitsFor::none});
    ops::copy(streams.rows(from + n - 1, from + n), s.state->carry(mtp));
    at += m;
    from += n;
  }
  // A replayed trunk step's device logits live in the graphs' shared arena, which the catch-up's own graph replay
  // overwrites: they move out first (host logits, and an eager step's, are already held).
  if (on_device && hold.empty() && draft_step_ && !steps.empty()) {
    hold = Tensor(DType::f32, logits.shape(), logits.device(), TensorInit::uninitialized);
    copy_view(logits, hold.view());
  }
  catch_up(steps);
  return hold.empty() ? logits : hold.view();
}

void Speculator::draft(std::span<const DraftSequence> seqs, const Chooser& choose) {
  TERN_CHECK(static_cast<int>(seqs.size()) <= max_sequences_, "speculator: ", seqs.size(),
             " sequences draft at once; slots were reserved for ", max_sequences_);
  const ModelConfig& c = model_.config();
  const int64_t H = c.hc_mult, D = c.hidden_size, vocab = c.vocab_size;
  const int mtp = model_.mtp_layer();
  drafting_.assign(seqs.begin(), seqs.end());
  tokens_.assign(seqs.size(), {});
  verified_ = false;
  int rounds = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const DraftSequence& s = seqs[i];
    TERN_CHECK(s.state != nullptr && s.count >= 1 && s.count <= kMaxDrafts, "speculator: sequence ", i, " wants ",
               s.count, " drafts (1 to ", kMaxDrafts, ")");
    TERN_CHECK(s.state->position() >= 1, "speculator: sequence ", i, " has consumed no token (nothing to draft from)");
    tokens_[i].reserve(static_cast<size_t>(kMaxDrafts) + 1);  // spans into it stay valid
    tokens_[i].push_back(s.last);
    rounds = std::max(rounds, s.count);
  }
  Model::MtpResult r;
  std::vector<size_t> row_of(seqs.size());  // the sequence's row in r (the previous round)
  for (int j = 0; j < rounds; ++j) {
    std::vector<Model::MtpStep> steps;
    std::vector<size_t> who;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (seqs[i].count <= j) continue;
      const int64_t m = seqs[i].state->position();
      const TensorView hidden = j == 0 ? seqs[i].state->carry(mtp).reshape({1, H, D})
                                       : r.streams.view().rows(static_cast<int64_t>(row_of[i]),
                                                               static_cast<int64_t>(row_of[i]) + 1);
      steps.push_back({seqs[i].state, m - 1 + j, hidden, {&tokens_[i][static_cast<size_t>(j)], 1}, LogitsFor::last,
                       seqs[i].greedy});
      who.push_back(i);
    }
    Model::MtpResult next = draft_step_ ? draft_step_(steps) : model_.mtp_forward(steps);
    int64_t host_row = 0;  // the chooser's rows come back in order, the greedy ones stay where they are
    for (size_t w = 0; w < who.size(); ++w) {
      const size_t i = who[w];
      if (seqs[i].greedy) {
        tokens_[i].push_back(next.argmax.at(w));
      } else {
        tokens_[i].push_back(choose(i, j, {next.logits.data<float>() + host_row * vocab, static_cast<size_t>(vocab)}));
        ++host_row;
      }
      row_of[i] = w;
    }
    r = std::move(next);
    if (j == 0)  // row m - 1 is final; the chained rows after it are speculative
      for (size_t i = 0; i < seqs.size(); ++i)
        if (seqs[i].count > 1) ops::copy(bytes_of(seqs[i].state->ring(mtp)), slot(windows_, i, window_bytes_));
  }
}

Tensor Speculator::verify(std::span<const StepSequence> batch) {
  Tensor hold;
  (void)verify_impl(batch, false, hold);
  return hold;
}

TensorView Speculator::verify_device(std::span<const StepSequence> batch, Tensor& hold) {
  return verify_impl(batch, true, hold);
}

TensorView Speculator::verify_impl(std::span<const StepSequence> batch, bool on_device, Tensor& hold) {
  TERN_CHECK(batch.size() == drafting_.size() && !verified_,
             "speculator: verify() takes the sequences of the last draft(), once");
  before_.clear();
  for (size_t i = 0; i < batch.size(); ++i) {
    TERN_CHECK(batch[i].state == drafting_[i].state && std::ranges::equal(batch[i].tokens, tokens_[i]) &&
                   batch[i].logits == LogitsFor::all,
               "speculator: verify sequence ", i, " is not [y, drafts] of the last draft() with every row's logits");
    before_.push_back(batch[i].state->snapshot_into(slot(snapshots_, i, snapshot_bytes_)));
  }
  const TensorView logits = trunk(batch, true, on_device, verified_trunk_, hold);
  TERN_CHECK(batch.empty() || verified_trunk_.record != nullptr,
             "speculator: the verify step did not run on the step tables (nothing to roll back with)");
  verified_ = true;
  return logits;
}

void Speculator::settle(std::span<const int64_t> kept) {
  TERN_CHECK(verified_ && kept.size() == drafting_.size(), "speculator: settle() takes one count per sequence of the "
             "last verify()");
  const int mtp = model_.mtp_layer();
  // The sequences with rejected tokens roll back in one step on the tables (Model::rollback_steps).
  std::vector<Model::Rollback> rollbacks;
  for (size_t i = 0, first = 0; i < kept.size(); first += tokens_[i].size(), ++i) {
    const auto n = static_cast<int64_t>(tokens_[i].size());
    TERN_CHECK(kept[i] >= 1 && kept[i] <= n, "speculator: sequence ", i, " keeps ", kept[i], " of its ", n, " tokens");
    if (kept[i] < n) rollbacks.push_back({drafting_[i].state, &before_[i], static_cast<int64_t>(first), kept[i]});
  }
  if (!rollbacks.empty()) model_.rollback_steps(rollbacks, *verified_trunk_.record);
  std::vector<Model::MtpStep> steps;
  int64_t first = 0;
  for (size_t i = 0; i < kept.size(); ++i) {
    cache::SequenceState& state = *drafting_[i].state;
    const auto n = static_cast<int64_t>(tokens_[i].size());
    const int64_t a = kept[i], m = before_[i].position;
    if (drafting_[i].count > 1) ops::copy(slot(windows_, i, window_bytes_), bytes_of(state.ring(mtp)));
    if (a > 1)
      steps.push_back({&state, m, verified_trunk_.streams.rows(first, first + a - 1),
                       std::span<const int64_t>(tokens_[i]).subspan(1, static_cast<size_t>(a - 1)), LogitsFor::none});
    ops::copy(verified_trunk_.streams.rows(first + a - 1, first + a), state.carry(mtp));
    first += n;
  }
  catch_up(steps);
  verified_ = false;
  drafting_.clear();
}

}  // namespace tern::model
