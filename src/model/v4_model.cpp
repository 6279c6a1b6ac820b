// The V4 forward: embedding, the layers (each an attention and a MoE sub-layer wrapped in mHC), hc_head,
// final norm and head. deepseek-v4.md section 2, as op calls.
#include <algorithm>
#include <string>
#include <unordered_set>

#include "core/env.h"
#include "model/stacked.h"
#include "model/v4_batch.h"
#include "ops/branch.h"
#include "ops/elementwise.h"
#include "ops/mhc.h"
#include "ops/norm.h"
#include "ops/rope.h"

namespace tern::model {

namespace {

// The products whose top-k must pick the reference's choices compute in f32 on every backend: the router gate
// and the indexer's projections (its inputs stay f32).
void mark_exact(LayerWeights& L) {
  L.ffn.gate.exact = true;
  if (IndexerWeights* x = L.attn.indexer ? &*L.attn.indexer : nullptr)
    for (Linear* w : {&x->wq_b, &x->weights_proj, &x->compressor.wkv, &x->compressor.wgate, &x->compressor.wkv_wgate})
      w->exact = true;
}

ops::RopeParams rope_params(const RopeConfig& r, int64_t rope_dim) {
  return {r.theta, rope_dim, r.yarn, r.factor, r.original_max_position, r.beta_fast, r.beta_slow};
}

}  // namespace

Model::Model(ModelWeights weights, KvMode mode, const ops::Context& ctx)
    : w_(std::move(weights)), mode_(mode), ctx_(ctx) {
  TERN_CHECK(ctx.device() == Device::cpu, "model: constructed in a context of another device than the host "
             "(its weights' place until to_device)");
  const ModelConfig& c = w_.config;
  TERN_CHECK(static_cast<int>(w_.layers.size()) == c.num_layers, "model: ", w_.layers.size(),
             " layers bound, config ", "says ", c.num_layers);
  TERN_CHECK(c.n_shared_experts == 1, "model: n_shared_experts = ", c.n_shared_experts,
             " (only 1 is supported)");
  TERN_CHECK(c.scoring_func == "sqrtsoftplus" && c.norm_topk_prob, "model: routing \"", c.scoring_func,
             "\" with norm_topk_prob = ", c.norm_topk_prob,
             " is not implemented (only sqrtsoftplus with normalised weights)");
  kv_format().check();
  apply_activations();
  inv_freq_main_ = ops::rope_inv_freq(rope_params(c.rope_main, c.rope_dim));
  inv_freq_compress_ = ops::rope_inv_freq(rope_params(c.rope_compress, c.rope_dim));
  layer_specs_ = make_layer_specs();
}

namespace {

void upload_linear(Linear& l, const Model::Upload& up) {
  l.weight = up(l.weight);
  l.scale = up(l.scale);
}
// Only the stack goes to the device; its parts then view it there (one copy of the bytes).
void upload_pair(Linear& stacked, Linear& a, Linear& b, const Model::Upload& up) {
  if (stacked.weight.empty()) {
    upload_linear(a, up), upload_linear(b, up);
    return;
  }
  upload_linear(stacked, up);
  view_parts(stacked, a, b);
}
void upload_compressor(CompressorWeights& c, const Model::Upload& up) {
  upload_pair(c.wkv_wgate, c.wkv, c.wgate, up);
  c.ape = up(c.ape), c.norm = up(c.norm);
}
void upload_hc(HyperConnWeights& h, const Model::Upload& up) {
  h.fn = up(h.fn), h.base = up(h.base), h.scale = up(h.scale);
}
void upload_layer(LayerWeights& L, const Model::Upload& up) {
  L.attn_norm = up(L.attn_norm), L.ffn_norm = up(L.ffn_norm);
  upload_hc(L.hc_attn, up), upload_hc(L.hc_ffn, up);
  AttentionWeights& a = L.attn;
  upload_pair(a.wq_a_wkv, a.wq_a, a.wkv, up);
  for (Linear* l : {&a.wq_b, &a.wo_a, &a.wo_b}) upload_linear(*l, up);
  a.q_norm = up(a.q_norm), a.kv_norm = up(a.kv_norm), a.attn_sink = up(a.attn_sink);
  if (a.compressor) upload_compressor(*a.compressor, up);
  if (a.indexer) {
    upload_linear(a.indexer->wq_b, up), upload_linear(a.indexer->weights_proj, up);
    upload_compressor(a.indexer->compressor, up);
  }
  MoEWeights& f = L.ffn;
  upload_linear(f.gate, up);
  f.gate_bias = up(f.gate_bias), f.tid2eid = up(f.tid2eid);
  for (ExpertWeights& e : f.experts)
    upload_linear(e.w1, up), upload_linear(e.w2, up), upload_linear(e.w3, up);
  upload_pair(f.shared.w13, f.shared.w1, f.shared.w3, up);
  upload_linear(f.shared.w2, up);
}

}  // namespace

void Model::to_device(Device device, const Upload& upload) {
  TERN_CHECK(device_ == Device::cpu && device != Device::cpu,
             "Model::to_device: the model is already on a device");
  const Upload up = [&](const TensorView& v) { return v.empty() ? TensorView() : upload(v); };
  w_.embed = up(w_.embed), w_.norm = up(w_.norm);
  upload_linear(w_.head, up);
  upload_hc(w_.hc_head, up);
  for (LayerWeights& L : w_.layers) upload_layer(L, up);
  if (w_.mtp) {
    MtpWeights& m = *w_.mtp;
    m.enorm = up(m.enorm), m.hnorm = up(m.hnorm), m.norm = up(m.norm);
    upload_linear(m.e_proj, up), upload_linear(m.h_proj, up);
    upload_layer(m.block, up);
    upload_hc(m.hc_head, up);
  }
  device_ = device;
  inv_freq_main_ = Tensor::copy_of(inv_freq_main_, device_);
  inv_freq_compress_ = Tensor::copy_of(inv_freq_compress_, device_);
}

void Model::set_context(const ops::Context& ctx) {
  TERN_CHECK(ctx.device() == device_,
             "Model::set_context: the context's device is not the model's (move the model first: to_device)");
  ctx_ = ctx;
}

void Model::set_activations(ops::Activations a) {
  act_ = a;
  apply_activations();
}

void Model::apply_activations() {
  const bool fp8 = act_ == ops::Activations::fp8, f32 = act_ == ops::Activations::f32;
  // The official reference quantises x before every FP8 linear (the indexer's wq_b too: it stays an exact
  // product of the quantised x) and the routed experts' inputs (FP4 weight x FP8 activation); bf16 weights (the
  // router gate, the compressors, the indexer's weights_proj, the head) take x as it is.
  const auto quantised = [](ops::WeightFormat f) {
    return f == ops::WeightFormat::fp8_block || f == ops::WeightFormat::mxfp4 || f == ops::WeightFormat::nvfp4;
  };
  const auto mark_fp8 = [&](Linear& w) { w.act_fp8 = fp8 && quantised(w.format); };
  // f32 (the exact mode): every product exact; otherwise only those mark_exact names.
  const auto mark_f32 = [&](Linear& w) { w.exact = f32; };
  for (LayerWeights* L : all_layers()) {
    AttentionWeights& a = L->attn;
    ExpertWeights& s = L->ffn.shared;
    for (Linear* w : {&a.wq_a, &a.wq_b, &a.wkv, &a.wo_a, &a.wo_b, &a.wq_a_wkv, &s.w1, &s.w2, &s.w3, &s.w13})
      mark_fp8(*w), mark_f32(*w);
    for (ExpertWeights& e : L->ffn.experts)
      for (Linear* w : {&e.w1, &e.w2, &e.w3}) mark_fp8(*w), mark_f32(*w);
    if (a.indexer) mark_fp8(a.indexer->wq_b);
    for (CompressorWeights* c : {a.compressor ? &*a.compressor : nullptr, a.indexer ? &a.indexer->compressor : nullptr})
      if (c != nullptr) mark_f32(c->wkv), mark_f32(c->wgate), mark_f32(c->wkv_wgate);
    mark_f32(L->ffn.gate);
    mark_exact(*L);  // after: the gate and the indexer stay exact in every mode
  }
  if (w_.mtp) {
    for (Linear* w : {&w_.mtp->e_proj, &w_.mtp->h_proj}) mark_fp8(*w), mark_f32(*w);
  }
  mark_f32(w_.head);
}

std::vector<LayerWeights*> Model::all_layers() {
  std::vector<LayerWeights*> out;
  for (LayerWeights& L : w_.layers) out.push_back(&L);
  if (w_.mtp) out.push_back(&w_.mtp->block);
  return out;
}

std::vector<ops::LinearUse> Model::linears() const {
  std::vector<ops::LinearUse> out;
  // A stacked pair runs as its stack alone.
  const auto pair = [&](const ops::Weight& stacked, const ops::Weight& a, const ops::Weight& b) {
    for (const ops::Weight* w : {&stacked, &a, &b}) {
      if (!w->weight.empty()) out.push_back({w, 1});
      if (w == &stacked && !w->weight.empty()) return;
    }
  };
  const int layers = w_.config.num_layers + (has_mtp() ? 1 : 0);
  for (int l = 0; l < layers; ++l) {
    const AttentionWeights& a = layer(l).attn;
    const MoEWeights& f = layer(l).ffn;
    pair(a.wq_a_wkv, a.wq_a, a.wkv);
    if (a.compressor) pair(a.compressor->wkv_wgate, a.compressor->wkv, a.compressor->wgate);
    if (a.indexer) {
      const CompressorWeights& x = a.indexer->compressor;
      pair(x.wkv_wgate, x.wkv, x.wgate);
      for (const Linear* w : {&a.indexer->wq_b, &a.indexer->weights_proj})
        if (!w->weight.empty()) out.push_back({w, 1});
    }
    pair(f.shared.w13, f.shared.w1, f.shared.w3);
    for (const Linear* w : {&a.wq_b, &a.wo_b, &f.gate, &f.shared.w2})
      if (!w->weight.empty()) out.push_back({w, 1});
    if (!a.wo_a.weight.empty()) out.push_back({&a.wo_a, config().o_groups});
  }
  if (w_.mtp)
    for (const Linear* w : {&w_.mtp->e_proj, &w_.mtp->h_proj})
      if (!w->weight.empty()) out.push_back({w, 1});
  if (!w_.head.weight.empty()) out.push_back({&w_.head, 1});
  return out;
}

Model::Projections Model::project(const TensorView& x, const ops::Weight& stacked, const ops::Weight& a,
                                  const ops::Weight& b) const {
  const int64_t N = x.dim(0);
  Projections p;
  if (!stacked.weight.empty()) {
    p.stacked_out = tensor(DType::f32, {N, stacked.out});
    ops::linear(ctx_, x, stacked, p.stacked_out);
    p.a = p.stacked_out.view().cols(0, a.out);
    p.b = p.stacked_out.view().cols(a.out, stacked.out);
    return p;
  }
  p.a_out = tensor(DType::f32, {N, a.out});
  p.b_out = tensor(DType::f32, {N, b.out});
  ops::linear(ctx_, x, a, p.a_out);
  ops::linear(ctx_, x, b, p.b_out);
  p.a = p.a_out.view(), p.b = p.b_out.view();
  return p;
}

ops::KvRowFormat Model::kv_format() const {
  const ModelConfig& c = w_.config;
  return {mode_ == KvMode::fp8 ? ops::KvFormat::fp8_ds : ops::KvFormat::f32, c.head_dim, c.rope_dim};
}

std::vector<cache::LayerSpec> Model::make_layer_specs() const {
  const ModelConfig& c = w_.config;
  std::vector<cache::LayerSpec> specs;
  for (int l = 0; l < c.num_layers; ++l) {
    cache::LayerSpec s;
    s.window = c.sliding_window;
    s.kv_row_bytes = kv_format().row_bytes();
    s.ratio = c.compress_ratio(l);
    const AttnKind kind = c.attn_kind(l);
    if (kind != AttnKind::sliding) s.compressor_acc_floats = (kind == AttnKind::csa ? 2 : 1) * 3 * c.head_dim;
    if (kind == AttnKind::csa) {
      s.index_row_bytes = c.index_head_dim * static_cast<int64_t>(sizeof(float));
      s.indexer_acc_floats = 2 * 3 * c.index_head_dim;
    }
    specs.push_back(s);
  }
  if (w_.mtp) {  // the MTP layer: its own sliding window and the trunk hidden it carries (compress ratio 0)
    cache::LayerSpec s;
    s.window = c.sliding_window;
    s.kv_row_bytes = kv_format().row_bytes();
    s.carry_floats = c.hc_mult * c.hidden_size;
    specs.push_back(s);
  }
  return specs;
}

std::shared_ptr<const cache::StateLayout> Model::state_layout(int64_t max_tokens, int64_t tokens_per_page) const {
  return std::make_shared<const cache::StateLayout>(layer_specs_, max_tokens, tokens_per_page);
}

cache::SequenceState Model::new_state(int64_t max_tokens) const {
  return cache::SequenceState(state_layout(max_tokens), device_);
}

// One sub-layer with its hyper-connection: a = sublayer(norm(sum_i pre_i X_i)); X'_k = post_k a + sum_j C_jk
// X_j. With `pending`, a pending hc_post is run inside this hc_pre, and this sub-layer's is left pending.
template <typename Sublayer>
void Model::residual(const HyperConnWeights& hc, const TensorView& norm, const Batch& b, Tensor& streams,
                     PendingPost* pending, const char* site, int layer, Sublayer&& sublayer) {
  const ModelConfig& c = w_.config;
  const int64_t N = b.tokens, H = c.hc_mult, D = c.hidden_size;
  Tensor post = tensor(DType::f32, {N, H}), comb = tensor(DType::f32, {N, H, H}),
         h = tensor(DType::f32, {N, D});
  const ops::HcParams params{c.hc_sinkhorn_iters, static_cast<float>(c.hc_eps),
                             static_cast<float>(c.rms_norm_eps)};
  // The collapsed streams through attn_norm / ffn_norm, in the same op (and the pending hc_post before it).
  ops::HcPreArgs pre;
  // Up to Paths::hc_comb_apart tokens, post and comb from the logits apart (ops::hc_comb): they are read only by
  // this sub-layer's hc_post, so the Sinkhorn's serial chain runs on a side branch (ops/branch.h), off the step's
  // path, placed by the sub-layer (side_task_).
  const bool apart = N <= paths_.hc_comb_apart;
  Tensor logits = apart ? tensor(DType::f32, {N, (2 + H) * H}) : Tensor();
  pre.streams = streams, pre.fn = hc.fn, pre.base = hc.base, pre.scale = hc.scale, pre.params = params;
  pre.collapsed = h;
  if (apart) pre.logits = logits;
  else pre.post = post, pre.comb = comb;
  pre.normed = true, pre.norm = norm, pre.rms_eps = static_cast<float>(c.rms_norm_eps);
  if (pending != nullptr && pending->set()) {
    streams = tensor(DType::f32, {N, H, D});
    pre.streams = streams;
    pre.prev_streams = pending->streams, pre.prev_a = pending->a, pre.prev_post = pending->post;
    pre.prev_comb = pending->comb;
    ops::hc_pre(ctx_, pre);
    *pending = PendingPost{};
  } else {
    ops::hc_pre(ctx_, pre);
  }
  side_task_ = nullptr;
  if (apart) side_task_ = [&] { ops::hc_comb(ctx_, {logits, hc.base, hc.scale, params, post, comb}); };
  struct DropTask {  // the task refers to this frame: never left behind (a sub-layer that throws)
    std::function<void()>& task;
    ~DropTask() { task = nullptr; }
  } drop{side_task_};
  if (observer_) observe(std::string(site) + "_in", layer, h);
  Tensor a = tensor(DType::f32, {N, D});
  sublayer(h.view(), a.view());
  if (auto task = take_side_task()) ops::run_side(ctx_, h.device(), task);  // the sub-layer placed none
  ops::join_side(ctx_, h.device());  // post and comb, where the sub-layer joined no branch after their fork
  if (observer_) observe(std::string(site) + "_out", layer, a);
  if (pending != nullptr) {
    *pending = PendingPost{std::move(streams), std::move(a), std::move(post), std::move(comb), true};
    streams = Tensor();
    return;
  }
  Tensor next = tensor(DType::f32, {N, H, D});
  ops::hc_post(ctx_, streams, a, post, comb, next);
  streams = std::move(next);
}

bool Model::fold_hc_post() const {
  return paths_.hc_fold && !observer_;
}

Model::Paths Model::default_paths() {
  static const Paths p{env_flag("TERN_HC_FOLD", true), env_flag("TERN_FUSED_COMPRESS", true),
                       static_cast<int>(env_int("TERN_L2_PREFETCH", 0, 0, kPrefetchAll)),
                       env_flag("TERN_FUSED_ROPE", true),
                       static_cast<int>(env_int("TERN_HC_COMB_APART", 8, 0, kHcCombApartLimit))};
  return p;
}

void Model::flush(PendingPost& pending, Tensor& streams) {
  if (!pending.set()) return;
  Tensor next = tensor(DType::f32, pending.streams.shape());
  ops::hc_post(ctx_, pending.streams, pending.a, pending.post, pending.comb, next);
  streams = std::move(next);
  pending = PendingPost{};
}

// Lays the batch's tokens out one after another (those on the step tables first): ids, positions, and the rows
// whose logits are wanted.
Model::Batch Model::make_batch(std::span<const StepSequence> batch, std::span<const char> on_tables) const {
  Batch b;
  std::unordered_set<const cache::SequenceState*> seen;
  for (const StepSequence& s : batch) {
    TERN_CHECK(s.state != nullptr && !s.tokens.empty(),
               "forward: every sequence needs a state and >= 1 token");
    TERN_CHECK(seen.insert(s.state).second, "forward: a state appears twice in one batch");
    const cache::StateLayout& layout = s.state->layout();
    bool ours = layout.num_layers() == static_cast<int>(layer_specs_.size());
    for (int l = 0; ours && l < layout.num_layers(); ++l) ours = layout.spec(l) == layer_specs_[l];
    TERN_CHECK(ours, "forward: the state's layout does not belong to this model and KV mode");
    TERN_CHECK(s.state->device() == device_,
               "forward: the state is not on the model's device (make it with new_state())");
    const auto n = static_cast<int64_t>(s.tokens.size());
    TERN_CHECK(s.state->position() + n <= s.state->capacity(), "forward: ", s.state->position() + n,
               " tokens exceed the state's capacity of ", s.state->capacity(), " (reserve its pages first)");
    b.seqs.push_back({s.state, 0, n, s.state->position(), s.logits, !on_tables.empty() && on_tables[b.seqs.size()]});
    b.tokens += n;
  }
  int64_t row = 0;
  for (const bool tables : {true, false})
    for (Batch::Seq& s : b.seqs)
      if (s.on_tables == tables) s.begin = row, row += s.n;
  lay_out_tokens(b, [&](size_t i) { return batch[i].tokens; });
  return b;
}

StepPlan Model::plan_step(std::span<const StepSequence> batch) const {
  StepPlan plan;
  if (!step_tables_ || observer_) return plan;
  for (const StepSequence& s : batch) {
    if (!sequence_refusal(s, kMaxStepQueries).empty()) continue;
    const cache::StateLayout& layout = s.state->layout();
    // the first such state's geometry (the others run per sequence); the largest max_tokens
    if (plan.bound != nullptr && !same_page_geometry(layout, *plan.bound)) continue;
    plan.sequences.push_back(s);
    plan.slots += static_cast<int64_t>(s.tokens.size());
    if (plan.bound == nullptr || layout.max_tokens() > plan.bound->max_tokens()) plan.bound = &layout;
  }
  return plan;
}

std::vector<char> Model::on_tables(std::span<const StepSequence> batch, const StepPlan& plan) {
  std::vector<char> on(batch.size(), 0);
  size_t k = 0;  // the plan's next sequence
  for (size_t i = 0; i < batch.size() && k < plan.sequences.size(); ++i)
    if (batch[i].state == plan.sequences[k].state) on[i] = 1, ++k;
  TERN_CHECK(k == plan.sequences.size() && plan.starts.empty() && plan.first_slots.empty(),
             "forward: the step's plan is not one of its batch (plan_step)");
  return on;
}

void Model::lay_out_tokens(Batch& b, const std::function<std::span<const int64_t>(size_t)>& ids_of) const {
  Tensor ids(DType::i64, {b.tokens}), positions(DType::i64, {b.tokens});
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    const Batch::Seq& s = b.seqs[i];
    const std::span<const int64_t> tokens = ids_of(i);
    for (int64_t t = 0; t < s.n; ++t) {
      ids.data<int64_t>()[s.begin + t] = tokens[static_cast<size_t>(t)];
      positions.data<int64_t>()[s.begin + t] = s.start + t;
      if (s.logits == LogitsFor::all || (s.logits == LogitsFor::last && t == s.n - 1))
        b.wanted.push_back(s.begin + t);
    }
  }
  b.ids_storage = on_device(std::move(ids));
  b.positions_storage = on_device(std::move(positions));
  b.ids = b.ids_storage.view();
  b.positions = b.positions_storage.view();
}

Tensor Model::forward(std::span<const StepSequence> batch, const StepPlan& plan,
                      const std::optional<StepTables>& tables, bool logits_on_device) {
  return forward_impl(batch, plan, tables, {}, nullptr, logits_on_device, nullptr);
}

Tensor Model::forward(std::span<const StepSequence> batch, const StepPlan& plan,
                      const std::optional<StepTables>& tables, std::span<const LogitsFor> streams_for, Tensor& streams,
                      bool logits_on_device, StepRecord* record) {
  TERN_CHECK(streams_for.size() == batch.size(), "forward: ", streams_for.size(), " stream choices for ",
             batch.size(), " sequences");
  return forward_impl(batch, plan, tables, streams_for, &streams, logits_on_device, record);
}

Tensor Model::forward(std::span<const StepSequence> batch, bool logits_on_device) {
  const StepPlan plan = plan_step(batch);
  return forward(batch, plan, StepTables::build(plan, device_), logits_on_device);
}

Tensor Model::forward(std::span<const StepSequence> batch, std::span<const LogitsFor> streams_for, Tensor& streams,
                      bool logits_on_device, StepRecord* record) {
  const StepPlan plan = plan_step(batch);
  return forward(batch, plan, StepTables::build(plan, device_), streams_for, streams, logits_on_device, record);
}

Tensor Model::forward_impl(std::span<const StepSequence> batch, const StepPlan& plan,
                           const std::optional<StepTables>& tables, std::span<const LogitsFor> streams_for,
                           Tensor* streams_out, bool logits_on_device, StepRecord* record) {
  const ModelConfig& c = w_.config;
  // The sequences the plan puts on the step tables run on them, the code the recorded steps run, laid out first;
  // the others (prefill chunks) run per sequence in the same step.
  TERN_CHECK(tables.has_value() != plan.empty() && (plan.empty() || tables->slots() == plan.slots),
             "forward: step tables not built from the step's plan (StepTables::build)");
  Batch b = make_batch(batch, on_tables(batch, plan));
  const int64_t N = b.tokens;
  Tensor logits(DType::f32, {static_cast<int64_t>(b.wanted.size()), c.vocab_size});  // on the host
  if (N == 0) return logits;
  if (tables) {
    const int64_t slots = plan.slots;
    if (slots == N) {  // wholly on the tables
      use_tables(b, *tables);
      if (record != nullptr) record->layers.assign(static_cast<size_t>(w_.config.num_layers), {}), b.record = record;
    } else {  // a mixed step: ids and positions stay the step's (the tables' are its first rows)
      b.tables = &*tables;
      b.table_tokens = slots;
      ++step_paths_.mixed_steps;
    }
  }
  step_paths_.table_tokens += b.table_tokens;
  step_paths_.chunk_tokens += N - b.table_tokens;
  if (record != nullptr && b.record == nullptr) record->layers.clear();  // not wholly on the tables: keeps nothing
  const Tensor streams = run_layers(b);
  if (streams_out != nullptr) {  // the pre-hc_head streams of the chosen rows
    std::vector<int64_t> rows;
    for (size_t i = 0; i < b.seqs.size(); ++i) {
      const Batch::Seq& s = b.seqs[i];
      for (int64_t t = 0; t < s.n; ++t)
        if (streams_for[i] == LogitsFor::all || (streams_for[i] == LogitsFor::last && t == s.n - 1))
          rows.push_back(s.begin + t);
    }
    const int64_t R = static_cast<int64_t>(rows.size()), H = c.hc_mult, D = c.hidden_size;
    *streams_out = tensor(DType::f32, {R, H, D});
    if (R > 0) {
      Tensor index(DType::i64, {R});
      std::copy(rows.begin(), rows.end(), index.data<int64_t>());
      index = on_device(std::move(index));
      ops::gather_rows(ctx_, streams.view().reshape({N, H * D}), index,
                       streams_out->view().reshape({R, H * D}));
    }
  }
  if (!b.wanted.empty()) {
    if (device_ == Device::cpu) {
      head(b, streams, logits, w_.hc_head, w_.norm);
    } else {
      Tensor device_logits = tensor(DType::f32, logits.shape());
      head(b, streams, device_logits, w_.hc_head, w_.norm);
      if (logits_on_device) logits = std::move(device_logits);
      else ops::copy(device_logits, logits);
    }
  }
  for (const Batch::Seq& s : b.seqs) s.state->advance(s.n);
  return logits;
}

// The embedding and every layer: the streams [N, hc, D] the head reads.
Tensor Model::run_layers(const Batch& b) {
  const ModelConfig& c = w_.config;
  const int64_t N = b.tokens, D = c.hidden_size, H = c.hc_mult;
  Tensor x = tensor(DType::f32, {N, D});  // X = hc copies of embed(token)
  ops::embedding(ctx_, w_.embed, b.ids, x);
  Tensor streams = tensor(DType::f32, {N, H, D});
  ops::hc_expand(ctx_, x, streams);
  PendingPost pending;  // each sub-layer's hc_post runs inside the next one's hc_pre
  for (int l = 0; l < c.num_layers; ++l) block(l, b, streams, fold_hc_post() ? &pending : nullptr);
  flush(pending, streams);
  return streams;
}

// Layer l (a trunk layer or the MTP block): attention, then the MoE, each inside its mHC.
void Model::block(int l, const Batch& b, Tensor& streams, PendingPost* pending) {
  const LayerWeights& L = layer(l);
  residual(L.hc_attn, L.attn_norm, b, streams, pending, "attn", l,
           [&](const TensorView& h, const TensorView& out) { attention_block(l, b, h, out); });
  residual(L.hc_ffn, L.ffn_norm, b, streams, pending, "ffn", l,
           [&](const TensorView& h, const TensorView& out) { moe_block(l, b, h, out); });
  if (pending == nullptr) observe("streams", l, streams);
}

// logits = head(norm(hc_head(X))) for the wanted rows only.
void Model::head(const Batch& b, const Tensor& streams, const TensorView& logits, const HyperConnWeights& hc,
                 const TensorView& norm) {
  const ModelConfig& c = w_.config;
  const int64_t N = b.tokens, D = c.hidden_size, H = c.hc_mult, R = logits.dim(0);
  Tensor rows(DType::i64, {R});
  std::copy(b.wanted.begin(), b.wanted.end(), rows.data<int64_t>());
  rows = on_device(std::move(rows));
  Tensor picked = tensor(DType::f32, {R, H, D});
  ops::gather_rows(ctx_, streams.view().reshape({N, H * D}), rows, picked.view().reshape({R, H * D}));
  Tensor y = tensor(DType::f32, {R, D});
  const ops::HcParams params{c.hc_sinkhorn_iters, static_cast<float>(c.hc_eps),
                             static_cast<float>(c.rms_norm_eps)};
  ops::hc_head(ctx_, {picked, hc.fn, hc.base, hc.scale, params, y});
  ops::rms_norm(ctx_, y, norm, static_cast<float>(c.rms_norm_eps), y);
  observe("final_hidden", &hc == &w_.hc_head ? -1 : mtp_layer(), y);
  ops::linear(ctx_, y, w_.head, logits);
}

Tensor Model::head_of_every_row(const Tensor& streams, const HyperConnWeights& hc, const TensorView& norm) {
  const ModelConfig& c = w_.config;
  const int64_t N = streams.dim(0), D = c.hidden_size;
  Tensor y = tensor(DType::f32, {N, D});
  const ops::HcParams params{c.hc_sinkhorn_iters, static_cast<float>(c.hc_eps), static_cast<float>(c.rms_norm_eps)};
  ops::hc_head(ctx_, {streams, hc.fn, hc.base, hc.scale, params, y});
  ops::rms_norm(ctx_, y, norm, static_cast<float>(c.rms_norm_eps), y);
  Tensor logits = tensor(DType::f32, {N, c.vocab_size});
  ops::linear(ctx_, y, w_.head, logits);
  return logits;
}

}  // namespace tern::model
