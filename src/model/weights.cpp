// load_model: binds a checkpoint's tensors (official or transformers names) to ModelWeights and
// checks each one's dtype and shape against the config. Nothing is copied except what must be: a
// tensor whose mapped address is misaligned for its dtype, small f32-contract tensors stored in
// bf16/f16 (widened exactly), and the pairs of linears that read one input, stacked into one matrix each
// (model/stacked.h).
#include <cmath>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <unordered_set>

#include "core/error.h"
#include "core/log.h"
#include "model/checkpoint.h"
#include "model/stacked.h"
#include "model/weights.h"

namespace tern::model {

namespace {

enum class Naming { official, transformers };

struct Storage {
  std::shared_ptr<const void> checkpoint;
  std::vector<Tensor> owned;
};

std::string dtypes_str(std::initializer_list<DType> ts) {
  std::string s;
  size_t i = 0;
  for (DType t : ts) {
    s += (i == 0 ? "" : i + 1 == ts.size() ? " or " : ", ");
    s += dtype_to_safetensors(t);
    ++i;
  }
  return s;
}

bool one_of(DType t, std::initializer_list<DType> ts) {
  for (DType u : ts)
    if (t == u) return true;
  return false;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Scale bytes are bound with the dtype their format defines: U8 (from writers without float8 dtypes), and
// e4m3 for NVFP4's unsigned scales, are the same bits.
TensorView as_dtype(const TensorView& v, DType t) {
  return v.dtype() == DType::f32 ? v : TensorView(v.data(), t, v.shape());
}

class Binder {
 public:
  Binder(const Checkpoint& ck, ModelConfig& cfg, Naming naming, Storage& storage)
      : ck_(ck), cfg_(cfg), naming_(naming), storage_(storage) {}

  std::string name(const std::string& official) const {
    return naming_ == Naming::official ? official : transformers_name(official);
  }
  const std::unordered_set<std::string>& used() const { return used_; }
  void add_used(const std::unordered_set<std::string>& names) { used_.insert(names.begin(), names.end()); }

  // A tensor by its checkpoint name, checked against the allowed dtypes and the expected shape.
  TensorView raw(const std::string& n, std::initializer_list<DType> dtypes, const Shape& shape) {
    TERN_CHECK(ck_.has(n), ck_.source(), ": tensor \"", n, "\" is missing (expected ", dtypes_str(dtypes), " ",
               shape.str(), ")");
    const SafetensorsEntry& e = ck_.entry(n);
    const std::string& file = ck_.file_of(n);
    TERN_CHECK(one_of(e.dtype, dtypes), file, ": tensor \"", n, "\": expected dtype ", dtypes_str(dtypes), ", found ",
               dtype_to_safetensors(e.dtype));
    TERN_CHECK(e.shape == shape, file, ": tensor \"", n, "\": expected shape ", shape.str(), ", found ", e.shape.str());
    used_.insert(n);
    return aligned(ck_.get(n), n);
  }
  TensorView tensor(const std::string& official, std::initializer_list<DType> dtypes, const Shape& shape) {
    return raw(name(official), dtypes, shape);
  }
  // Norm weights and embeddings: bf16 or f32 as stored.
  TensorView dense(const std::string& official, const Shape& shape) {
    return tensor(official, {DType::bf16, DType::f32}, shape);
  }
  // Tensors that weights.h promises in f32: bf16/f16 files are widened into an owned buffer.
  TensorView f32(const std::string& official, const Shape& shape) {
    const TensorView v = tensor(official, {DType::f32, DType::bf16, DType::f16}, shape);
    if (v.dtype() == DType::f32) return v;
    Tensor t(DType::f32, shape);
    const auto* src = v.data_as<const uint16_t>();
    float* dst = t.data<float>();
    for (int64_t i = 0; i < v.numel(); ++i)
      dst[i] = v.dtype() == DType::bf16 ? bf16_to_f32(src[i]) : f16_to_f32(src[i]);
    storage_.owned.push_back(t);
    return t.view();
  }

  // a and b stacked into owned memory (model/stacked.h), or, when they cannot be, nothing: they then run
  // as two products.
  Linear stack(Linear& a, Linear& b) {
    const std::string refusal = stack_refusal(a, b);
    if (!refusal.empty()) {
      log::info(refusal, ": not stacked, two products");
      return {};
    }
    return stack_linears(a, b, [&](DType t, const Shape& s) {
      storage_.owned.emplace_back(t, s);
      return storage_.owned.back().view();
    });
  }

  // y = W x with W [out, in]: the format follows from the tensors present (docs/checkpoints.md).
  Linear linear(const std::string& official_prefix, int64_t out, int64_t in, bool expert = false) {
    Linear l;
    l.out = out;
    l.in = in;
    l.name = name(official_prefix + ".weight");
    const std::string base = l.name.substr(0, l.name.size() - std::string("weight").size());
    TERN_CHECK(ck_.has(l.name), ck_.source(), ": tensor \"", l.name, "\" is missing (expected a [", out, ", ", in,
               "] weight)");
    const SafetensorsEntry& w = ck_.entry(l.name);
    const std::string& file = ck_.file_of(l.name);
    switch (w.dtype) {
      case DType::f32:
      case DType::bf16:
        l.format = w.dtype == DType::f32 ? WeightFormat::f32 : WeightFormat::bf16;
        l.weight = raw(l.name, {w.dtype}, Shape{out, in});
        return l;
      case DType::e4m3: {
        l.format = WeightFormat::fp8_block;
        l.weight = raw(l.name, {DType::e4m3}, Shape{out, in});
        const Shape s{ceil_div(out, 128), ceil_div(in, 128)};
        // Official: .scale (e8m0); transformers' FP8: .weight_scale_inv (f32 powers of two).
        std::string sn = naming_ == Naming::official ? base + "scale" : base + "weight_scale_inv";
        if (!ck_.has(sn) && ck_.has(base + "scale")) sn = base + "scale";
        if (!ck_.has(sn) && ck_.has(base + "weight_scale_inv")) sn = base + "weight_scale_inv";
        if (ck_.has(sn) && ck_.entry(sn).dtype == DType::f32) {
          l.scale = pow2_scales_to_e8m0(raw(sn, {DType::f32}, s), sn);
        } else {
          l.scale = as_dtype(raw(sn, {DType::e8m0, DType::u8, DType::f32}, s), DType::e8m0);
        }
        return l;
      }
      case DType::i8:
      case DType::u8:
      case DType::e2m1: {
        TERN_CHECK(expert, file, ": tensor \"", l.name, "\": packed FP4 (", dtype_to_safetensors(w.dtype),
                   ") is only supported for routed experts; expected BF16, F32 or F8_E4M3");
        const bool nv = ck_.has(base + "weight_scale");
        const int64_t block = nv ? 16 : 32;
        TERN_CHECK(in % block == 0, file, ": tensor \"", l.name, "\": the input width ", in, " is not a multiple of the ",
                   nv ? "NVFP4" : "MXFP4", " block (", block, ")");
        if (w.dtype == DType::e2m1) {  // F4 with the logical shape: the same bytes as u8 [out, in/2]
          l.weight = TensorView(raw(l.name, {DType::e2m1}, Shape{out, in}).data(), DType::u8, Shape{out, in / 2});
        } else {
          l.weight = raw(l.name, {DType::i8, DType::u8}, Shape{out, in / 2});
        }
        if (nv) {
          l.format = WeightFormat::nvfp4;
          l.scale = as_dtype(raw(base + "weight_scale", {DType::e4m3, DType::ue4m3, DType::u8}, Shape{out, in / 16}),
                             DType::ue4m3);
          l.global_scale = global_scale(base + "weight_scale_2");
          if (ck_.has(base + "input_scale")) used_.insert(base + "input_scale");  // activations stay unscaled
        } else {
          l.format = WeightFormat::mxfp4;
          l.scale = as_dtype(raw(base + "scale", {DType::e8m0, DType::u8}, Shape{out, in / 32}), DType::e8m0);
        }
        return l;
      }
      default:
        fail(file, ": tensor \"", l.name, "\": expected dtype BF16, F32, F8_E4M3",
             expert ? ", or I8/U8 packed FP4" : "", ", found ", dtype_to_safetensors(w.dtype));
    }
  }

  // transformers' stacked routed experts: gate_up_proj [E, 2I, D] (gate rows, then up rows) and
  // down_proj [E, D, I], bf16 or f32; per-expert views, no copies.
  std::vector<ExpertWeights> stacked_experts(const std::string& official_ffn_prefix) {
    const int64_t E = cfg_.n_routed_experts, I = cfg_.moe_intermediate_size, D = cfg_.hidden_size;
    std::string p = name(official_ffn_prefix + "experts.X");
    p.pop_back();  // "model.layers.N.mlp.experts."
    const TensorView gu = raw(p + "gate_up_proj", {DType::bf16, DType::f32}, Shape{E, 2 * I, D});
    const TensorView dn = raw(p + "down_proj", {gu.dtype()}, Shape{E, D, I});
    const WeightFormat fmt = gu.dtype() == DType::f32 ? WeightFormat::f32 : WeightFormat::bf16;
    std::vector<ExpertWeights> out(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      const TensorView g = gu.rows(e, e + 1).reshape(Shape{2 * I, D});
      auto make = [&](TensorView v, int64_t o, int64_t i, const std::string& n) {
        Linear l;
        l.format = fmt;
        l.out = o;
        l.in = i;
        l.weight = v;
        l.name = cat(n, "[", e, "]");
        return l;
      };
      out[e].w1 = make(g.rows(0, I), I, D, p + "gate_up_proj");
      out[e].w3 = make(g.rows(I, 2 * I), I, D, p + "gate_up_proj");
      out[e].w2 = make(dn.rows(e, e + 1).reshape(Shape{D, I}), D, I, p + "down_proj");
    }
    return out;
  }

 private:
  TensorView aligned(const TensorView& v, const std::string& n) {
    const size_t align = std::min<size_t>(8, std::max(1, dtype_bits(v.dtype()) / 8));
    if (reinterpret_cast<uintptr_t>(v.data()) % align == 0) return v;
    log::warn(ck_.file_of(n), ": tensor \"", n, "\" is misaligned for ", dtype_to_safetensors(v.dtype()),
              "; copying it (", v.nbytes(), " bytes)");
    Tensor t(v.dtype(), v.shape());
    std::memcpy(t.data<std::byte>(), v.data(), v.nbytes());
    storage_.owned.push_back(t);
    return t.view();
  }

  // transformers' FP8 weight_scale_inv is f32; tern keeps power-of-two block scales as e8m0.
  TensorView pow2_scales_to_e8m0(const TensorView& s, const std::string& n) {
    Tensor t(DType::e8m0, s.shape());
    const float* src = s.data_as<const float>();
    uint8_t* dst = t.data<uint8_t>();
    for (int64_t i = 0; i < s.numel(); ++i) {
      dst[i] = f32_to_e8m0(src[i]);
      TERN_CHECK(dst[i] != 0xff, ck_.file_of(n), ": tensor \"", n, "\": element ", i, " is ", src[i],
                 ", not a power of two: tern supports only power-of-two (ue8m0) FP8 block scales");
    }
    storage_.owned.push_back(t);
    return t.view();
  }

  float global_scale(const std::string& n) {
    TERN_CHECK(ck_.has(n), ck_.source(), ": tensor \"", n, "\" is missing (expected the F32 NVFP4 global scale, shape [])");
    const SafetensorsEntry& e = ck_.entry(n);
    const Shape shape = e.shape.rank() == 1 ? Shape{1} : Shape{};
    const TensorView v = raw(n, {DType::f32}, shape);
    float g;
    std::memcpy(&g, v.data(), 4);
    TERN_CHECK(std::isfinite(g) && g > 0, ck_.file_of(n), ": tensor \"", n, "\": expected a positive finite scale, found ", g);
    return g;
  }

  const Checkpoint& ck_;
  ModelConfig& cfg_;
  Naming naming_;
  Storage& storage_;
  std::unordered_set<std::string> used_;
};

CompressorWeights bind_compressor(Binder& b, const ModelConfig& c, const std::string& p, int ratio, int64_t width,
                                  bool overlap) {
  CompressorWeights w;
  w.ratio = ratio;
  w.width = width;
  w.overlap = overlap;
  const int64_t channels = overlap ? 2 * width : width;
  w.wkv = b.linear(p + "wkv", channels, c.hidden_size);
  w.wgate = b.linear(p + "wgate", channels, c.hidden_size);
  w.wkv_wgate = b.stack(w.wkv, w.wgate);
  w.ape = b.f32(p + "ape", Shape{ratio, channels});
  w.norm = b.dense(p + "norm.weight", Shape{width});
  return w;
}

HyperConnWeights bind_hc(Binder& b, const std::string& fn, const std::string& base, const std::string& scale,
                         int64_t mixes, int64_t width, int64_t scales) {
  return HyperConnWeights{b.f32(fn, Shape{mixes, width}), b.f32(base, Shape{mixes}), b.f32(scale, Shape{scales})};
}

// Every routed expert must have the same format, the config's when config.json names it.
void check_expert_format(ModelConfig& c, const Linear& l, bool first, const std::string& file) {
  const bool ok = l.format != WeightFormat::fp8_block;
  TERN_CHECK(ok, file, ": tensor \"", l.name, "\": FP8 routed experts are not supported (expected MXFP4, NVFP4, BF16 or F32)");
  const WeightFormat f = l.format;
  if (first && !c.expert_format_explicit) c.expert_format = f;
  TERN_CHECK(f == c.expert_format, file, ": tensor \"", l.name, "\": expected ", weight_format_name(c.expert_format),
             c.expert_format_explicit ? " (config.json \"expert_format\")" : " (the format of the first expert)",
             ", found ", weight_format_name(f));
}

void check_tid2eid(const TensorView& t, int experts, const std::string& file, const std::string& n) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int64_t v = t.dtype() == DType::i64 ? t.data_as<const int64_t>()[i] : t.data_as<const int32_t>()[i];
    TERN_CHECK(v >= 0 && v < experts, file, ": tensor \"", n, "\": row ", i / t.dim(1), " names expert ", v,
               ", expected 0..", experts - 1);
  }
}

// One V4 block under official prefix p ("layers.N." or "mtp.0."): index is its layer in the state layout.
LayerWeights bind_block(Binder& b, ModelConfig& c, const std::string& p, int index, int ratio, bool hash_routed,
                        bool first_experts, Naming naming, const Checkpoint& ck) {
  const int64_t D = c.hidden_size, H = c.num_heads, hd = c.head_dim, hc = c.hc_mult;
  LayerWeights L;
  L.index = index;
  L.attn_kind = ratio == 0 ? AttnKind::sliding : ratio == c.csa_ratio ? AttnKind::csa : AttnKind::hca;
  L.hash_routed = hash_routed;
  L.attn_norm = b.dense(p + "attn_norm.weight", Shape{D});
  L.ffn_norm = b.dense(p + "ffn_norm.weight", Shape{D});
  L.hc_attn = bind_hc(b, p + "hc_attn_fn", p + "hc_attn_base", p + "hc_attn_scale", (2 + hc) * hc, hc * D, 3);
  L.hc_ffn = bind_hc(b, p + "hc_ffn_fn", p + "hc_ffn_base", p + "hc_ffn_scale", (2 + hc) * hc, hc * D, 3);

  const std::string a = p + "attn.";
  AttentionWeights& at = L.attn;
  at.wq_a = b.linear(a + "wq_a", c.q_lora_rank, D);
  at.wq_b = b.linear(a + "wq_b", H * hd, c.q_lora_rank);
  at.wkv = b.linear(a + "wkv", hd, D);
  at.wq_a_wkv = b.stack(at.wq_a, at.wkv);
  at.wo_a = b.linear(a + "wo_a", c.o_groups * c.o_lora_rank, H * hd / c.o_groups);
  at.wo_b = b.linear(a + "wo_b", D, c.o_groups * c.o_lora_rank);
  at.q_norm = b.dense(a + "q_norm.weight", Shape{c.q_lora_rank});
  at.kv_norm = b.dense(a + "kv_norm.weight", Shape{hd});
  at.attn_sink = b.f32(a + "attn_sink", Shape{H});
  if (ratio > 0)
    at.compressor = bind_compressor(b, c, a + "compressor.", ratio, hd, L.attn_kind == AttnKind::csa);
  if (L.attn_kind == AttnKind::csa) {
    IndexerWeights ix;
    ix.wq_b = b.linear(a + "indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
    ix.weights_proj = b.linear(a + "indexer.weights_proj", c.index_n_heads, D);
    ix.compressor = bind_compressor(b, c, a + "indexer.compressor.", ratio, c.index_head_dim, true);
    at.indexer = std::move(ix);
  }

  const std::string f = p + "ffn.";
  MoEWeights& m = L.ffn;
  const int E = c.n_routed_experts;
  const int64_t I = c.moe_intermediate_size;
  m.gate = b.linear(f + "gate", E, D);
  if (L.hash_routed) {
    const std::string n = b.name(f + "gate.tid2eid");
    m.tid2eid = b.raw(n, {DType::i64, DType::i32}, Shape{c.vocab_size, c.experts_per_token});
    check_tid2eid(m.tid2eid, E, ck.file_of(n), n);
  } else {
    m.gate_bias = b.f32(f + "gate.bias", Shape{E});
  }
  if (naming == Naming::transformers) {
    m.experts = b.stacked_experts(f);
    check_expert_format(c, m.experts[0].w1, first_experts, ck.source());
  } else {
    m.experts.resize(E);
    for (int e = 0; e < E; ++e) {
      const std::string x = cat(f, "experts.", e, ".");
      m.experts[e].w1 = b.linear(x + "w1", I, D, true);
      m.experts[e].w2 = b.linear(x + "w2", D, I, true);
      m.experts[e].w3 = b.linear(x + "w3", I, D, true);
      for (const Linear* lin : {&m.experts[e].w1, &m.experts[e].w2, &m.experts[e].w3})
        check_expert_format(c, *lin, first_experts && e == 0 && lin == &m.experts[e].w1, ck.file_of(lin->name));
    }
  }
  m.shared.w1 = b.linear(f + "shared_experts.w1", I * c.n_shared_experts, D);
  m.shared.w2 = b.linear(f + "shared_experts.w2", D, I * c.n_shared_experts);
  m.shared.w3 = b.linear(f + "shared_experts.w3", I * c.n_shared_experts, D);
  m.shared.w13 = b.stack(m.shared.w1, m.shared.w3);
  return L;
}

LayerWeights bind_layer(Binder& b, ModelConfig& c, int l, Naming naming, const Checkpoint& ck) {
  return bind_block(b, c, cat("layers.", l, "."), l, c.compress_ratio(l), c.hash_routed(l), l == 0, naming, ck);
}

// mtp.0: e_proj, h_proj, enorm, hnorm, the block (SWA only, score-routed: its layer id is past the hash layers),
// hc_head, norm. Every missing tensor is an error naming it.
MtpWeights bind_mtp(Binder& b, ModelConfig& c, Naming naming, const Checkpoint& ck) {
  const int64_t D = c.hidden_size, hc = c.hc_mult;
  const std::string p = "mtp.0.";
  MtpWeights m;
  m.enorm = b.dense(p + "enorm.weight", Shape{D});
  m.hnorm = b.dense(p + "hnorm.weight", Shape{D});
  m.e_proj = b.linear(p + "e_proj", D, D);
  m.h_proj = b.linear(p + "h_proj", D, D);
  m.block = bind_block(b, c, p, c.num_layers, /*ratio=*/0, /*hash_routed=*/false, false, naming, ck);
  m.hc_head = bind_hc(b, p + "hc_head_fn", p + "hc_head_base", p + "hc_head_scale", hc, hc * D, 1);
  m.norm = b.dense(p + "norm.weight", Shape{D});
  return m;
}

}  // namespace

ModelWeights load_model(const std::string& dir) {
  namespace fs = std::filesystem;
  ModelWeights w;
  w.config = ModelConfig::from_file((fs::path(dir) / "config.json").string());
  ModelConfig& c = w.config;
  const Checkpoint ck = Checkpoint::open(dir);
  auto storage = std::make_shared<Storage>();
  storage->checkpoint = ck.keep_alive();

  Naming naming;
  if (ck.has("embed.weight")) {
    naming = Naming::official;
  } else if (ck.has("model.embed_tokens.weight")) {
    naming = Naming::transformers;
  } else {
    fail(ck.source(), ": tensor \"embed.weight\" is missing (neither the official \"embed.weight\" nor transformers' ",
         "\"model.embed_tokens.weight\" is present: not a DeepSeek-V4 checkpoint?)");
  }
  Binder b(ck, c, naming, *storage);
  w.embed = b.dense("embed.weight", Shape{c.vocab_size, c.hidden_size});
  w.head = b.linear("head", c.vocab_size, c.hidden_size);
  w.norm = b.dense("norm.weight", Shape{c.hidden_size});
  const int64_t hc = c.hc_mult;
  w.hc_head = bind_hc(b, "hc_head_fn", "hc_head_base", "hc_head_scale", hc, hc * c.hidden_size, 1);
  w.layers.reserve(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) w.layers.push_back(bind_layer(b, c, l, naming, ck));
  c.fp8_dense = w.layers.empty() ? false : w.layers[0].attn.wq_a.format == WeightFormat::fp8_block;
  c.validate(dir + "/config.json (with the formats found in the tensors)");

  // The MTP layer: bound when any mtp.0.* tensor is there (then all must be). transformers has no names for
  // it (it drops mtp.* on load): a transformers-named checkpoint has them under the official names, or under
  // "model.mtp.0.*" with transformers' renaming rules applied to the block's tensors.
  auto mtp_tensors = [&](const std::string& prefix) {
    for (const std::string& n : ck.names())
      if (n.rfind(prefix, 0) == 0) return true;
    return false;
  };
  const bool official_mtp = mtp_tensors("mtp.0."), renamed_mtp = naming == Naming::transformers && mtp_tensors("model.mtp.0.");
  if ((official_mtp || renamed_mtp) && c.num_mtp_layers == 0) {
    log::warn(ck.source(), ": mtp.0.* tensors are present but config.json \"num_nextn_predict_layers\" is 0: "
              "the MTP layer is not loaded");
  } else if (official_mtp || renamed_mtp) {
    const std::string where = dir + "/config.json \"compress_ratios\"";
    TERN_CHECK(c.mtp_compress_ratios.empty() || c.mtp_compress_ratios[0] == 0, where, ": the MTP layer's ratio is ",
               c.mtp_compress_ratios.empty() ? 0 : c.mtp_compress_ratios[0],
               "; tern implements the sliding-window-only MTP layer (ratio 0) of DeepSeek-V4");
    Binder mb(ck, c, official_mtp ? Naming::official : Naming::transformers, *storage);
    try {
      w.mtp = bind_mtp(mb, c, official_mtp ? Naming::official : Naming::transformers, ck);
    } catch (const Error& e) {
      fail("the MTP layer mtp.0 is incomplete (a checkpoint has all of its tensors or none): ", e.what());
    }
    b.add_used(mb.used());
  }

  // Tensors tern does not bind: MTP layers past mtp.0 silently, anything else with a warning.
  int64_t unused = 0;
  std::string first;
  for (const std::string& n : ck.names()) {
    if (b.used().count(n) || n.rfind("mtp.", 0) == 0 || n.rfind("model.mtp.", 0) == 0) continue;
    if (unused++ == 0) first = n;
  }
  if (unused) log::warn(ck.source(), ": ", unused, " tensors are not used by tern (first: \"", first, "\")");

  w.naming = naming == Naming::official ? "official" : "transformers";
  w.num_tensors = static_cast<int64_t>(ck.size());
  w.num_bytes = ck.total_bytes();
  w.num_files = static_cast<int>(ck.files().size());
  w.storage = storage;
  return w;
}

}  // namespace tern::model
