// The MTP layer mtp.0 (v4-speculative.md section 1, deepseek-v4.md section 2), as op calls. Row i of a
// sequence sits at position p = start + i, with the hidden h_p [hc, D] and the token x_{p+1}:
//   e      = e_proj(enorm(embed(x_{p+1})))                       [D]      one vector, every stream gets it
//   X_k    = e + h_proj(hnorm(h_p[k]))                           [hc, D]  per stream k: summed, not concatenated
//   X'     = the V4 block on X: hc_pre -> attn_norm -> SWA attention (the MTP layer's own window) -> hc_post,
//            then hc_pre -> ffn_norm -> MoE (score-routed) -> hc_post
//   logits = head(norm(hc_head_mtp(X')))                         [vocab]  predicts x_{p+2}
// X' (before hc_head) is also returned: chained drafting feeds it back as the hidden of position p + 1.
#include <algorithm>
#include <unordered_set>

#include "model/v4_batch.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/mhc.h"
#include "ops/norm.h"
#include "ops/sample.h"
#include "ops/sampling.h"

namespace tern::model {

void Model::check_mtp_steps(std::span<const MtpStep> batch) const {
  TERN_CHECK(has_mtp(), "mtp_forward: the model has no MTP layer (the checkpoint has no mtp.0.* tensors)");
  const ModelConfig& c = w_.config;
  const int l = mtp_layer();
  const int64_t H = c.hc_mult, D = c.hidden_size;
  std::unordered_set<const cache::SequenceState*> seen;
  for (const MtpStep& s : batch) {
    const auto n = static_cast<int64_t>(s.next.size());
    TERN_CHECK(s.state != nullptr && n > 0, "mtp_forward: every sequence needs a state and >= 1 token");
    TERN_CHECK(seen.insert(s.state).second, "mtp_forward: a state appears twice in one batch");
    TERN_CHECK(s.state->layout().num_layers() == static_cast<int>(layer_specs_.size()) &&
                   s.state->layout().spec(l) == layer_specs_[static_cast<size_t>(l)],
               "mtp_forward: the state's layout does not belong to this model (no MTP window)");
    TERN_CHECK(s.state->device() == device_, "mtp_forward: the state is not on the model's device");
    TERN_CHECK(s.start >= 0, "mtp_forward: negative start position ", s.start);
    TERN_CHECK(s.streams.dtype() == DType::f32 && s.streams.shape() == Shape({n, H, D}),
               "mtp_forward: streams must be f32 [", n, ", ", H, ", ", D, "], found ", s.streams.shape().str());
  }
}

Model::MtpResult Model::mtp_forward(std::span<const MtpStep> batch) {
  const StepPlan plan = plan_mtp_step(batch);
  return mtp_forward(batch, plan, StepTables::build(plan, device_));
}

Model::MtpResult Model::mtp_forward(std::span<const MtpStep> batch, const StepPlan& plan,
                                    const std::optional<StepTables>& tables) {
  check_mtp_steps(batch);
  const ModelConfig& c = w_.config;
  const MtpWeights& M = *w_.mtp;
  const int64_t H = c.hc_mult, D = c.hidden_size;
  TERN_CHECK(tables.has_value() != plan.empty() &&
                 (plan.empty() || (plan.sequences.size() == batch.size() && tables->slots() == plan.slots)),
             "mtp_forward: step tables not built from the rows' plan (plan_mtp_step, StepTables::build)");

  // The token layout: the rows of each sequence at positions start .. start + n - 1, ids = the next tokens.
  Batch b;
  for (const MtpStep& s : batch) {
    const auto n = static_cast<int64_t>(s.next.size());
    b.seqs.push_back({s.state, b.tokens, n, s.start, s.logits});
    b.tokens += n;
  }
  const int64_t N = b.tokens;
  MtpResult r;
  r.logits = Tensor(DType::f32, {0, c.vocab_size});
  if (N == 0) return r;
  lay_out_tokens(b, [&](size_t i) { return batch[i].next; });
  // Rows of 1..kMaxStepQueries a sequence (drafting, a verify's catch-up) run on the step tables, as the trunk's
  // steps do: one launch per op for the whole batch instead of a pass per sequence. Longer catch-ups (a prompt
  // chunk's) run per sequence.
  if (tables) use_tables(b, *tables);

  Tensor h = tensor(DType::f32, {N, H, D});
  for (size_t i = 0; i < batch.size(); ++i) ops::copy(batch[i].streams, b.rows(h, b.seqs[i]));
  Tensor streams = mtp_block(b, h);

  // logits = head(norm(hc_head_mtp(X'))) of the wanted rows; argmax steps keep only their rows' argmax.
  const auto W = static_cast<int64_t>(b.wanted.size());
  bool any_argmax = false;
  for (const MtpStep& s : batch) any_argmax = any_argmax || (s.argmax && s.logits != LogitsFor::none);
  if (W > 0 && !any_argmax && device_ == Device::cpu) {  // every row wanted on the host, where it is
    r.logits = Tensor(DType::f32, {W, c.vocab_size});
    head(b, streams, r.logits, M.hc_head, M.norm);
  } else if (W > 0) {
    Tensor all = device_ == Device::cpu ? Tensor(DType::f32, {W, c.vocab_size}) : tensor(DType::f32, {W, c.vocab_size});
    head(b, streams, all, M.hc_head, M.norm);
    mtp_pick(batch, all, r);
  }
  r.streams = std::move(streams);
  return r;
}

Tensor Model::mtp_block(const Batch& b, const TensorView& hidden) {
  const ModelConfig& c = w_.config;
  const MtpWeights& M = *w_.mtp;
  const int l = mtp_layer();
  const int64_t N = b.tokens, H = c.hc_mult, D = c.hidden_size;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  // e = e_proj(enorm(embed(next)))                                    [N, D]
  Tensor x = tensor(DType::f32, {N, D});
  ops::embedding(ctx_, w_.embed, b.ids, x);
  ops::rms_norm(ctx_, x, M.enorm, eps, x);
  Tensor e = tensor(DType::f32, {N, D});
  ops::linear(ctx_, x, M.e_proj, e);
  // h_proj(hnorm(h)) per stream: the N * hc stream rows as one batch    [N * hc, D]
  Tensor h = tensor(DType::f32, {N, H, D});
  const TensorView h_rows = h.view().reshape({N * H, D});
  ops::rms_norm(ctx_, hidden.reshape({N * H, D}), M.hnorm, eps, h_rows);
  Tensor streams = tensor(DType::f32, {N, H, D});
  ops::linear(ctx_, h_rows, M.h_proj, streams.view().reshape({N * H, D}));
  // X_k = e + h_proj(hnorm(h_k))                                      [N, hc, D]
  Tensor e_streams = tensor(DType::f32, {N, H, D});
  ops::hc_expand(ctx_, e, e_streams);
  ops::add(ctx_, e_streams, streams);
  observe("mtp_in", l, streams);
  // The block: attention over the MTP layer's window, then the MoE, each inside its mHC.
  PendingPost pending;  // the attention sub-layer's hc_post inside the MoE sub-layer's hc_pre
  block(l, b, streams, fold_hc_post() ? &pending : nullptr);
  flush(pending, streams);
  return streams;
}

void Model::mtp_pick(std::span<const MtpStep> batch, const TensorView& all, MtpResult& r) const {
  const int64_t vocab = w_.config.vocab_size;
  std::vector<char> by_argmax;  // per wanted row
  for (const MtpStep& s : batch) {
    const auto n = static_cast<int64_t>(s.next.size());
    const int64_t rows = s.logits == LogitsFor::all ? n : s.logits == LogitsFor::last ? 1 : 0;
    by_argmax.insert(by_argmax.end(), static_cast<size_t>(rows), s.argmax ? 1 : 0);
  }
  const auto W = static_cast<int64_t>(by_argmax.size());
  TERN_CHECK(all.rank() == 2 && all.dim(0) == W && all.dim(1) == vocab, "mtp_pick: ", all.shape().str(),
             " logits for ", W, " wanted rows");
  const auto host_rows = static_cast<int64_t>(std::count(by_argmax.begin(), by_argmax.end(), 0));
  r.logits = Tensor(DType::f32, {host_rows, vocab});
  r.argmax.assign(static_cast<size_t>(W), -1);
  if (host_rows < W) {  // the argmax rows' tokens, where the logits are
    if (all.device() == Device::cpu) {
      for (int64_t w = 0; w < W; ++w)
        if (by_argmax[static_cast<size_t>(w)])
          r.argmax[static_cast<size_t>(w)] = ops::argmax({all.data_as<const float>() + w * vocab, static_cast<size_t>(vocab)});
    } else {
      std::vector<ops::SampleRowSpec> specs(static_cast<size_t>(W));
      for (auto& s : specs) s.params.temperature = 0.0f;  // greedy, no penalties, no logprobs
      std::vector<ops::SampledRow> picked(static_cast<size_t>(W));
      ops::sample_rows(ctx_, all, specs, picked);
      for (int64_t w = 0; w < W; ++w)
        if (by_argmax[static_cast<size_t>(w)]) r.argmax[static_cast<size_t>(w)] = picked[static_cast<size_t>(w)].token;
    }
  }
  // The other rows to the host, in runs.
  for (int64_t w = 0, h = 0; w < W;) {
    if (by_argmax[static_cast<size_t>(w)]) {
      ++w;
      continue;
    }
    int64_t e = w;
    while (e < W && !by_argmax[static_cast<size_t>(e)]) ++e;
    ops::copy(all.rows(w, e), r.logits.view().rows(h, h + e - w));
    h += e - w;
    w = e;
  }
}

Tensor Model::mtp_body(const StepTables& t, const TensorView& hidden, Tensor* streams_out, bool logits_wanted) {
  TERN_CHECK(has_mtp(), "mtp_body: the model has no MTP layer");
  const ModelConfig& c = w_.config;
  const MtpWeights& M = *w_.mtp;
  Batch b;
  use_tables(b, t);
  const int64_t N = b.tokens, H = c.hc_mult, D = c.hidden_size;
  TERN_CHECK(hidden.dtype() == DType::f32 && hidden.shape() == Shape({N, H, D}), "mtp_body: hidden must be f32 [",
             N, ", ", H, ", ", D, "], found ", hidden.shape().str());
  Tensor streams = mtp_block(b, hidden);
  if (!logits_wanted) {
    if (streams_out != nullptr) *streams_out = std::move(streams);
    return Tensor();
  }
  Tensor logits = head_of_every_row(streams, M.hc_head, M.norm);  // (mtp_forward gathers the wanted rows first)
  if (streams_out != nullptr) *streams_out = std::move(streams);
  return logits;
}

}  // namespace tern::model
