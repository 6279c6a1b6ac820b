#include "model/synthetic_model.h"

#include <cmath>
#include <memory>

#include "core/error.h"
#include "model/stacked.h"
#include "model/synth.h"
#include "ops/context.h"
#include "ops/synth.h"
#include "ops/synth_values.h"

namespace tern::model {

namespace {

constexpr uint64_t kAlign = 256;
uint64_t aligned(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// One allocation carved into tensors, filled in `ctx` (on its device); with no base it only counts (the
// measuring walk).
struct Region {
  std::byte* base = nullptr;
  uint64_t used = 0;
  const ops::Context* ctx = nullptr;
  bool measuring() const { return base == nullptr; }
  TensorView take(DType t, const Shape& s) {
    TensorView v = measuring() ? TensorView() : TensorView(base + used, t, s, ctx->device());
    used += aligned(dtype_bytes(t, s.numel()));
    return v;
  }
};

// Walks the model's tensors in the official names and formats (as model/synth.cpp writes them and
// model/weights.cpp binds them), taking each from a region and filling it unless the region only counts.
class Walker {
 public:
  Walker(const ModelConfig& c, const SyntheticModelOptions& o) : c_(c), o_(o) {}
  int64_t tensors() const { return tensors_; }

  void globals(Region& r, ModelWeights& w) {
    const int64_t D = c_.hidden_size, hc = c_.hc_mult;
    w.embed = values(r, "embed.weight", DType::bf16, {c_.vocab_size, D}, ops::SynthKind::normal, 0.0f, 1.0f);
    w.head = linear(r, "head", c_.vocab_size, D, WeightFormat::bf16);
    w.norm = norm(r, "norm.weight", D);
    w.hc_head = hyper(r, "hc_head_fn", "hc_head_base", "hc_head_scale", hc, hc * D, 1);
  }

  // The layer's dense part from `dense`, its routed experts from `experts` (or, with none, `shared_from`'s).
  LayerWeights layer(int l, Region& dense, Region* experts, const LayerWeights* shared_from, uint64_t* table_bytes) {
    return block(cat("layers.", l, "."), l, c_.attn_kind(l), c_.compress_ratio(l), c_.hash_routed(l), dense, experts,
                 shared_from, table_bytes);
  }

  // mtp.0 as model/weights.cpp binds it: the projections and norms around one SWA-only (ratio 0), score-routed
  // block whose index is its layer in the state layout (config.num_layers); the dense part from `dense`, the
  // routed experts as for a layer.
  MtpWeights mtp(Region& dense, Region* experts, const LayerWeights* shared_from) {
    const int64_t D = c_.hidden_size, hc = c_.hc_mult;
    const std::string p = "mtp.0.";
    MtpWeights m;
    m.enorm = norm(dense, p + "enorm.weight", D);
    m.hnorm = norm(dense, p + "hnorm.weight", D);
    m.e_proj = linear(dense, p + "e_proj", D, D, dense_format());  // FP8 in the official checkpoint
    m.h_proj = linear(dense, p + "h_proj", D, D, dense_format());
    uint64_t no_table = 0;
    m.block = block(p, c_.num_layers, AttnKind::sliding, 0, false, dense, experts, shared_from, &no_table);
    m.hc_head = hyper(dense, p + "hc_head_fn", p + "hc_head_base", p + "hc_head_scale", hc, hc * D, 1);
    m.norm = norm(dense, p + "norm.weight", D);
    return m;
  }

  ExpertWeights expert(Region& r, const std::string& x) {
    const int64_t D = c_.hidden_size, I = c_.moe_intermediate_size;
    const WeightFormat ef = o_.experts;
    ExpertWeights e;
    e.w1 = linear(r, x + "w1", I, D, ef);
    e.w2 = linear(r, x + "w2", D, I, ef);
    e.w3 = linear(r, x + "w3", I, D, ef);
    return e;
  }

 private:
  WeightFormat dense_format() const { return c_.fp8_dense ? WeightFormat::fp8_block : WeightFormat::bf16; }

  // One V4 block under prefix p ("layers.N." or "mtp.0."), as model/weights.cpp's bind_block binds it.
  LayerWeights block(const std::string& p, int index, AttnKind kind, int ratio, bool hash_routed, Region& dense,
                     Region* experts, const LayerWeights* shared_from, uint64_t* table_bytes) {
    const int64_t D = c_.hidden_size, H = c_.num_heads, hd = c_.head_dim, hc = c_.hc_mult;
    const int64_t I = c_.moe_intermediate_size, E = c_.n_routed_experts;
    LayerWeights L;
    L.index = index;
    L.attn_kind = kind;
    L.hash_routed = hash_routed;
    L.attn_norm = norm(dense, p + "attn_norm.weight", D);
    L.ffn_norm = norm(dense, p + "ffn_norm.weight", D);
    L.hc_attn = hyper(dense, p + "hc_attn_fn", p + "hc_attn_base", p + "hc_attn_scale", (2 + hc) * hc, hc * D, 3);
    L.hc_ffn = hyper(dense, p + "hc_ffn_fn", p + "hc_ffn_base", p + "hc_ffn_scale", (2 + hc) * hc, hc * D, 3);
    const std::string a = p + "attn.";
    AttentionWeights& at = L.attn;
    const WeightFormat df = dense_format();
    at.wq_a = describe(a + "wq_a", c_.q_lora_rank, D, df);
    at.wkv = describe(a + "wkv", hd, D, df);
    at.wq_a_wkv = stacked(dense, at.wq_a, at.wkv);
    at.wq_b = linear(dense, a + "wq_b", H * hd, c_.q_lora_rank, df);
    at.wo_a = linear(dense, a + "wo_a", c_.o_groups * c_.o_lora_rank, H * hd / c_.o_groups, df);
    at.wo_b = linear(dense, a + "wo_b", D, c_.o_groups * c_.o_lora_rank, df);
    at.q_norm = norm(dense, a + "q_norm.weight", c_.q_lora_rank);
    at.kv_norm = norm(dense, a + "kv_norm.weight", hd);
    at.attn_sink = values(dense, a + "attn_sink", DType::f32, {H}, ops::SynthKind::normal, 0.0f, 1.0f);
    if (ratio > 0) at.compressor = compressor(dense, a + "compressor.", ratio, hd, L.attn_kind == AttnKind::csa);
    if (L.attn_kind == AttnKind::csa) {
      IndexerWeights ix;
      ix.wq_b = linear(dense, a + "indexer.wq_b", c_.index_n_heads * c_.index_head_dim, c_.q_lora_rank, df);
      ix.weights_proj = linear(dense, a + "indexer.weights_proj", c_.index_n_heads, D, WeightFormat::bf16);
      ix.compressor = compressor(dense, a + "indexer.compressor.", ratio, c_.index_head_dim, true);
      at.indexer = std::move(ix);
    }
    const std::string f = p + "ffn.";
    MoEWeights& m = L.ffn;
    m.gate = linear(dense, f + "gate", E, D, WeightFormat::bf16);
    if (L.hash_routed) {
      const uint64_t before = dense.used;
      m.tid2eid = dense.take(DType::i64, {c_.vocab_size, c_.experts_per_token});
      *table_bytes += dense.used - before;
      ops::SynthFillArgs fa;
      fa.kind = ops::SynthKind::distinct_rows;
      fa.choices = E;
      fill(dense, f + "gate.tid2eid", m.tid2eid, fa);
    } else {
      m.gate_bias = values(dense, f + "gate.bias", DType::f32, {E}, ops::SynthKind::normal, 0.0f, 0.1f);
    }
    if (experts != nullptr) {
      m.experts.resize(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) m.experts[static_cast<size_t>(e)] = expert(*experts, cat(f, "experts.", e, "."));
    } else {
      TERN_CHECK(shared_from != nullptr, "synthetic model: ", p, " has neither experts nor a layer to share");
      m.experts = shared_from->ffn.experts;
    }
    m.shared.w1 = describe(f + "shared_experts.w1", I, D, df);
    m.shared.w3 = describe(f + "shared_experts.w3", I, D, df);
    m.shared.w13 = stacked(dense, m.shared.w1, m.shared.w3);
    m.shared.w2 = linear(dense, f + "shared_experts.w2", D, I, df);
    return L;
  }

  void fill(Region& r, const std::string& name, const TensorView& out, ops::SynthFillArgs a) {
    ++tensors_;
    if (r.measuring()) return;
    a.seed = synth::tensor_seed(o_.seed, name);
    a.out = out;
    ops::synth_fill(*r.ctx, a);
  }

  TensorView values(Region& r, const std::string& name, DType t, const Shape& s, ops::SynthKind kind, float a, float b) {
    const TensorView v = r.take(t, s);
    ops::SynthFillArgs fa;
    fa.kind = kind;
    fa.a = a;
    fa.b = b;
    fill(r, name, v, fa);
    return v;
  }
  TensorView norm(Region& r, const std::string& name, int64_t dim) {
    return values(r, name, DType::bf16, {dim}, ops::SynthKind::normal, 1.0f, 0.1f);
  }
  HyperConnWeights hyper(Region& r, const std::string& fn, const std::string& base, const std::string& scale,
                         int64_t mixes, int64_t width, int64_t scales) {
    HyperConnWeights h;
    h.fn = values(r, fn, DType::f32, {mixes, width}, ops::SynthKind::normal, 0.0f,
                  static_cast<float>(1.0 / std::sqrt(static_cast<double>(width))));
    h.base = values(r, base, DType::f32, {mixes}, ops::SynthKind::normal, 0.0f, 0.5f);
    h.scale = values(r, scale, DType::f32, {scales}, ops::SynthKind::uniform, 0.5f, 1.0f);
    return h;
  }
  CompressorWeights compressor(Region& r, const std::string& p, int ratio, int64_t width, bool overlap) {
    CompressorWeights w;
    const int64_t ch = overlap ? 2 * width : width;
    w.ratio = ratio;
    w.width = width;
    w.overlap = overlap;
    w.wkv = describe(p + "wkv", ch, c_.hidden_size, WeightFormat::bf16);
    w.wgate = describe(p + "wgate", ch, c_.hidden_size, WeightFormat::bf16);
    w.wkv_wgate = stacked(r, w.wkv, w.wgate);
    w.ape = values(r, p + "ape", DType::f32, {ratio, ch}, ops::SynthKind::normal, 0.0f, 0.5f);
    w.norm = norm(r, p + "norm.weight", width);
    return w;
  }

  // y = W x, W [out, in] of std 1/sqrt(in) after dequantization.
  Linear linear(Region& r, const std::string& prefix, int64_t out, int64_t in, WeightFormat fmt) {
    Linear l = describe(prefix, out, in, fmt);
    take(r, l);
    fill_linear(r, l);
    return l;
  }

  // a and b (described, no tensors yet) stacked in one allocation (model/stacked.h), each part filled under
  // its own name, so with the values it has apart and in model/synth.cpp's files; or, when they cannot be
  // stacked, apart and an empty stack.
  Linear stacked(Region& r, Linear& a, Linear& b) {
    if (!stack_refusal(a, b).empty()) {
      for (Linear* l : {&a, &b}) take(r, *l), fill_linear(r, *l);
      return {};
    }
    Linear s = stacked_linear(a, b);
    take(r, s);
    view_parts(s, a, b);
    fill_linear(r, a);
    fill_linear(r, b);
    return s;
  }

  Linear describe(const std::string& prefix, int64_t out, int64_t in, WeightFormat fmt) const {
    Linear l;
    l.format = fmt;
    l.out = out;
    l.in = in;
    l.name = prefix + ".weight";
    if (fmt == WeightFormat::nvfp4) l.global_scale = synth::nvfp4_global_scale(sigma(in));
    return l;
  }

  static float sigma(int64_t in) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(in))); }

  // The linear's tensors from the region, in its format's shapes.
  static void take(Region& r, Linear& l) {
    const int64_t out = l.out, in = l.in;
    switch (l.format) {
      case WeightFormat::f32:
      case WeightFormat::bf16:
        l.weight = r.take(l.format == WeightFormat::f32 ? DType::f32 : DType::bf16, {out, in});
        return;
      case WeightFormat::fp8_block:
        l.weight = r.take(DType::e4m3, {out, in});
        l.scale = r.take(DType::e8m0, {(out + 127) / 128, (in + 127) / 128});
        return;
      case WeightFormat::mxfp4:
        l.weight = r.take(DType::i8, {out, in / 2});
        l.scale = r.take(DType::e8m0, {out, in / 32});
        return;
      case WeightFormat::nvfp4:
        l.weight = r.take(DType::u8, {out, in / 2});
        l.scale = r.take(DType::ue4m3, {out, in / 16});
        return;
    }
  }

  // W's values (and scales) under the linear's name: std sigma(in) after dequantization.
  void fill_linear(Region& r, const Linear& l) {
    ops::SynthFillArgs fa;
    fa.b = sigma(l.in);
    switch (l.format) {
      case WeightFormat::f32:
      case WeightFormat::bf16:
        fa.kind = ops::SynthKind::normal;
        fill(r, l.name, l.weight, fa);
        return;  // no scale
      case WeightFormat::fp8_block:
        fa.kind = ops::SynthKind::fp8_block;
        break;
      case WeightFormat::mxfp4:
        fa.kind = ops::SynthKind::mxfp4;
        break;
      case WeightFormat::nvfp4:
        fa.kind = ops::SynthKind::nvfp4;
        fa.global_scale = l.global_scale;
        break;
    }
    fa.rows = l.out;
    fa.cols = l.in;
    fa.scale = l.scale;
    fill(r, l.name, l.weight, fa);
    ++tensors_;  // the scale
  }

  const ModelConfig& c_;
  const SyntheticModelOptions& o_;
  int64_t tensors_ = 0;
};

std::string gb(uint64_t bytes) { return cat(std::round(static_cast<double>(bytes) / 1e8) / 10, " GB"); }

// "layer 3", "layers 2-5".
std::string layers_named(int first, int last) {
  return first == last ? cat("layer ", first) : cat("layers ", first, "-", last);
}

// Who reads another layer's experts: "layers 40-42 and the MTP layer (as layer 43)", "the MTP layer (as layer 43)".
std::string readers_named(const ExpertSharing& p) {
  const int mtp = p.mtp ? p.num_layers - 1 : -1, trunk_last = p.num_layers - 1 - (p.mtp ? 1 : 0);
  std::string s = p.own_layers <= trunk_last ? layers_named(p.own_layers, trunk_last) : "";
  if (mtp >= 0) s += cat(s.empty() ? "" : " and ", "the MTP layer (as layer ", mtp, ")");
  return s;
}

}  // namespace

uint64_t SyntheticSizes::dense_bytes() const {
  uint64_t n = global_bytes + mtp_dense_bytes;
  for (uint64_t b : layer_dense_bytes) n += b;
  return n;
}

uint64_t SyntheticSizes::total_bytes() const {
  return dense_bytes() + layer_expert_bytes() * static_cast<uint64_t>(expert_layers());
}

SyntheticSizes synthetic_sizes(const ModelConfig& config, WeightFormat experts) {
  SyntheticModelOptions o;
  o.experts = experts;
  Walker w(config, o);
  SyntheticSizes s;
  ModelWeights scratch;
  Region g;
  w.globals(g, scratch);
  s.global_bytes = g.used;
  s.embed_bytes = aligned(dtype_bytes(DType::bf16, config.vocab_size * config.hidden_size));
  s.head_bytes = s.embed_bytes;  // both bf16 [vocab, hidden]
  const LayerWeights empty;
  for (int l = 0; l < config.num_layers; ++l) {
    Region d;
    uint64_t table = 0;
    (void)w.layer(l, d, nullptr, &empty, &table);
    s.layer_dense_bytes.push_back(d.used);
    s.layer_table_bytes.push_back(table);
  }
  if (synthesizes_mtp(config)) {
    Region d;
    (void)w.mtp(d, nullptr, &empty);
    s.mtp_layers = 1;
    s.mtp_dense_bytes = d.used;
  }
  Region one;
  (void)w.expert(one, "layers.0.ffn.experts.0.");
  s.expert_bytes = one.used;
  s.experts_per_layer = config.n_routed_experts;
  return s;
}

ExpertSharing plan_expert_sharing(const SyntheticSizes& s, int64_t budget_bytes) {
  ExpertSharing p;
  p.num_layers = s.expert_layers();
  p.mtp = s.mtp_layers > 0;
  p.model_bytes = s.total_bytes();
  const uint64_t per_layer = s.layer_expert_bytes();
  if (budget_bytes < 0 || p.model_bytes <= static_cast<uint64_t>(budget_bytes) || per_layer == 0) {
    p.own_layers = p.num_layers;
  } else {
    const auto budget = static_cast<uint64_t>(budget_bytes);
    TERN_CHECK(s.dense_bytes() + per_layer <= budget, "synthetic model: ", gb(budget),
               " for the weights holds not even the dense part (", gb(s.dense_bytes()),
               ") and one layer's routed experts (", gb(per_layer), ")");
    p.own_layers = static_cast<int>((budget - s.dense_bytes()) / per_layer);
  }
  p.stored_bytes = s.dense_bytes() + per_layer * static_cast<uint64_t>(p.own_layers);
  if (!p.shared()) {
    p.description = cat("every layer has its own routed experts", p.mtp ? " (the MTP layer's too)" : "", ": ",
                        gb(p.model_bytes), " model");
  } else {
    const int readers = p.num_layers - p.own_layers, reused = std::min(p.own_layers, readers);
    p.description = cat(readers_named(p), readers == 1 ? " reuses" : " reuse", " the routed experts of ",
                        layers_named(0, reused - 1),
                        readers > p.own_layers ? cat(" (layer l reads layer l mod ", p.own_layers, "'s)") : "",
                        ": ", gb(p.model_bytes), " model, ", gb(p.stored_bytes), " stored");
  }
  return p;
}

SyntheticModel build_synthetic_model(const ModelConfig& config, const ops::Context& ctx,
                                     const SyntheticModelOptions& options) {
  const Device device = ctx.device();
  ModelConfig c = config;
  c.expert_format = options.experts;
  c.expert_format_explicit = true;
  c.validate("synthetic model config");
  SyntheticModel out;
  out.sizes = synthetic_sizes(c, options.experts);
  out.sharing = plan_expert_sharing(out.sizes, options.weight_budget_bytes);

  auto storage = std::make_shared<std::vector<Tensor>>();
  auto region = [&](uint64_t bytes) {
    storage->emplace_back(DType::u8, Shape{static_cast<int64_t>(bytes)}, device);
    Region r;
    r.base = storage->back().data<std::byte>();
    r.ctx = &ctx;
    return r;
  };
  Walker w(c, options);
  ModelWeights& mw = out.weights;
  mw.config = c;
  mw.layers.reserve(static_cast<size_t>(c.num_layers));
  Region g = region(out.sizes.global_bytes);
  w.globals(g, mw);
  for (int l = 0; l < c.num_layers; ++l) {
    Region d = region(out.sizes.layer_dense_bytes[static_cast<size_t>(l)]);
    uint64_t table = 0;
    if (l < out.sharing.own_layers) {
      Region e = region(out.sizes.layer_expert_bytes());
      mw.layers.push_back(w.layer(l, d, &e, nullptr, &table));
    } else {
      const LayerWeights& src = mw.layers[static_cast<size_t>(out.sharing.source_layer(l))];
      mw.layers.push_back(w.layer(l, d, nullptr, &src, &table));
    }
  }
  if (out.sizes.mtp_layers > 0) {  // last in the sharing order: its experts are layer num_layers's
    Region d = region(out.sizes.mtp_dense_bytes);
    if (c.num_layers < out.sharing.own_layers) {
      Region e = region(out.sizes.layer_expert_bytes());
      mw.mtp = w.mtp(d, &e, nullptr);
    } else {
      mw.mtp = w.mtp(d, nullptr, &mw.layers[static_cast<size_t>(out.sharing.source_layer(c.num_layers))]);
    }
  }
  // The fills run on the device's stream: a copy back waits for them.
  std::byte last{};
  copy_view(TensorView(storage->back().data<std::byte>(), DType::u8, {1}, device),
            TensorView(&last, DType::u8, {1}));
  mw.storage = storage;
  mw.naming = "synthetic";
  mw.num_tensors = w.tensors();
  mw.num_bytes = out.sharing.stored_bytes;
  mw.num_files = 0;
  return out;
}

}  // namespace tern::model
