// config.json: the official DeepSeek keys and the transformers ones, parsed into a ModelConfig and
// validated. Every error names the file and the field, with what was expected and what was found.
#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"

namespace tern::model {

using json = nlohmann::ordered_json;

namespace {

constexpr const char* kCsaName = "compressed_sparse_attention";
constexpr const char* kHcaName = "heavily_compressed_attention";
constexpr const char* kSwaName = "sliding_attention";

// Reads typed fields out of one JSON object; `prefix` names nested objects ("rope_scaling.").
class Fields {
 public:
  Fields(const json& obj, const std::string& source, std::string prefix = "")
      : obj_(obj), source_(source), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return obj_.contains(key) && !obj_[key].is_null(); }
  const json& at(const char* key) const { return obj_[key]; }

  [[noreturn]] void bad(const char* key, const std::string& expected, const json& found) const {
    fail(source_, ": field \"", prefix_, key, "\": expected ", expected, ", found ", found.dump());
  }
  [[noreturn]] void missing(const char* key, const std::string& expected) const {
    fail(source_, ": field \"", prefix_, key, "\": expected ", expected, ", found nothing (the field is missing)");
  }

  int64_t integer(const char* key, const json& v, const std::string& expected) const {
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
    }
    bad(key, expected, v);
  }
  // An integer >= `min` (min 1: "a positive integer").
  int64_t get_int(const char* key, int64_t min, const int64_t* fallback) const {
    const std::string expected = min == 1   ? "a positive integer"
                                 : min == 0 ? "a non-negative integer"
                                            : cat("an integer >= ", min);
    if (!has(key)) {
      if (fallback) return *fallback;
      missing(key, expected);
    }
    const int64_t v = integer(key, at(key), expected);
    if (v < min) bad(key, expected, at(key));
    if (v > INT32_MAX) bad(key, cat(expected, " below 2^31"), at(key));
    return v;
  }
  int64_t required_int(const char* key, int64_t min = 1) const { return get_int(key, min, nullptr); }
  int64_t optional_int(const char* key, int64_t fallback, int64_t min = 1) const {
    return get_int(key, min, &fallback);
  }
  double number(const char* key, double fallback, bool positive = true) const {
    if (!has(key)) return fallback;
    const json& v = at(key);
    const char* expected = positive ? "a positive number" : "a number";
    if (!v.is_number()) bad(key, expected, v);
    const double d = v.get<double>();
    if (!std::isfinite(d) || (positive && d <= 0)) bad(key, expected, v);
    return d;
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!at(key).is_boolean()) bad(key, "true or false", at(key));
    return at(key).get<bool>();
  }
  std::string string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!at(key).is_string()) bad(key, "a string", at(key));
    return at(key).get<std::string>();
  }
  const json& object(const char* key) const {
    if (!at(key).is_object()) bad(key, "a JSON object", at(key));
    return at(key);
  }
  const json& array(const char* key) const {
    if (!at(key).is_array()) bad(key, "a list", at(key));
    return at(key);
  }

  const std::string& source() const { return source_; }

 private:
  const json& obj_;
  const std::string& source_;
  std::string prefix_;
};

// One RoPE parameter set: {rope_theta | theta key, type/rope_type, factor, original_max..., beta_*}.
RopeConfig parse_rope(const Fields& f, double theta_fallback) {
  RopeConfig r;
  r.theta = f.number("rope_theta", theta_fallback);
  std::string type = f.string("rope_type", f.string("type", "default"));
  if (type == "yarn") {
    r.yarn = true;
  } else if (type != "default") {
    f.bad(f.has("rope_type") ? "rope_type" : "type", "\"yarn\" or \"default\"", json(type));
  }
  if (r.yarn) {
    r.factor = f.number("factor", 1.0);
    if (r.factor < 1) f.bad("factor", "a number >= 1", f.at("factor"));
    if (!f.has("original_max_position_embeddings")) f.missing("original_max_position_embeddings", "a positive number");
    r.original_max_position = f.number("original_max_position_embeddings", 0);
    r.beta_fast = f.number("beta_fast", 32.0);
    r.beta_slow = f.number("beta_slow", 1.0);
    if (r.beta_fast <= r.beta_slow) f.bad("beta_fast", cat("a number above beta_slow (", r.beta_slow, ")"), json(r.beta_fast));
  }
  return r;
}

void parse_rope_fields(const Fields& top, ModelConfig& c) {
  const double main_theta = top.number("rope_theta", 10000.0);
  const double compress_theta = top.number("compress_rope_theta", 160000.0);
  c.rope_main = RopeConfig{};
  c.rope_main.theta = main_theta;
  c.rope_compress = RopeConfig{};
  c.rope_compress.theta = compress_theta;
  // transformers: rope_parameters {main: {...}, compress: {...}}, or a flat dict that is the compress
  // branch's scaling (as the official rope_scaling is).
  if (top.has("rope_parameters")) {
    const json& rp = top.object("rope_parameters");
    if (rp.contains("main") || rp.contains("compress")) {
      for (const char* key : {"main", "compress"}) {
        if (!rp.contains(key)) continue;
        if (!rp[key].is_object()) Fields(rp, top.source(), "rope_parameters.").bad(key, "a JSON object", rp[key]);
        const Fields sub(rp[key], top.source(), cat("rope_parameters.", key, "."));
        if (std::string(key) == "main") {
          c.rope_main = parse_rope(sub, main_theta);
        } else {
          c.rope_compress = parse_rope(sub, compress_theta);
        }
      }
      return;
    }
    const Fields sub(rp, top.source(), "rope_parameters.");
    c.rope_compress = parse_rope(sub, compress_theta);
    c.rope_compress.theta = compress_theta;  // a flat dict's rope_theta is the main one
    return;
  }
  if (top.has("rope_scaling")) {
    const Fields sub(top.object("rope_scaling"), top.source(), "rope_scaling.");
    c.rope_compress = parse_rope(sub, compress_theta);
  }
}

std::string list_str(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// compress_ratios / layer_types / compress_rates -> c.compress_ratios, csa_ratio, hca_ratio.
void parse_schedule(const Fields& f, ModelConfig& c) {
  bool have_rates = false;
  if (f.has("compress_rates")) {
    const json& rates = f.object("compress_rates");
    const Fields rf(rates, f.source(), "compress_rates.");
    c.csa_ratio = static_cast<int>(rf.optional_int(kCsaName, 4));
    c.hca_ratio = static_cast<int>(rf.optional_int(kHcaName, 128));
    have_rates = true;
  }
  if (f.has("compress_rate_csa")) c.csa_ratio = static_cast<int>(f.required_int("compress_rate_csa")), have_rates = true;
  if (f.has("compress_rate_hca")) c.hca_ratio = static_cast<int>(f.required_int("compress_rate_hca")), have_rates = true;

  std::vector<int> official;
  const bool have_official = f.has("compress_ratios");
  if (have_official) {
    const json& arr = f.array("compress_ratios");
    for (const json& v : arr) {
      const int64_t r = f.integer("compress_ratios", v, "a list of non-negative integers");
      if (r < 0 || r > (1 << 20)) f.bad("compress_ratios", "a list of non-negative integers", arr);
      official.push_back(static_cast<int>(r));
    }
  }
  if (have_official && !have_rates) {
    // Official configs carry only the ratios: the smallest non-zero one is CSA, the other HCA; a single
    // distinct non-zero ratio is CSA when it is 4 (the official CSA ratio), HCA otherwise.
    std::set<int> distinct;
    for (size_t i = 0; i < official.size() && i < static_cast<size_t>(c.num_layers); ++i)
      if (official[i] != 0) distinct.insert(official[i]);
    if (distinct.size() > 2)
      f.bad("compress_ratios", "at most two distinct non-zero ratios (CSA and HCA)", json(official));
    if (distinct.size() == 2) {
      c.csa_ratio = *distinct.begin();
      c.hca_ratio = *distinct.rbegin();
    } else if (distinct.size() == 1 && *distinct.begin() != 4) {
      c.hca_ratio = *distinct.begin();
    }
  }
  std::vector<int> from_types;
  if (f.has("layer_types")) {
    const json& arr = f.array("layer_types");
    for (const json& v : arr) {
      const std::string t = v.is_string() ? v.get<std::string>() : "";
      if (t == kSwaName) from_types.push_back(0);
      else if (t == kCsaName) from_types.push_back(c.csa_ratio);
      else if (t == kHcaName) from_types.push_back(c.hca_ratio);
      else f.bad("layer_types", cat("a list of \"", kSwaName, "\", \"", kCsaName, "\" or \"", kHcaName, "\""), v);
    }
    if (static_cast<int64_t>(from_types.size()) != c.num_layers)
      f.bad("layer_types", cat("a list of num_hidden_layers (", c.num_layers, ") entries"), arr);
  }
  if (!have_official && from_types.empty())
    f.missing("compress_ratios", "a list of per-layer compression ratios (or transformers' \"layer_types\")");

  if (!from_types.empty()) {
    c.compress_ratios = from_types;
    if (have_official) {
      const std::vector<int> head(official.begin(), official.begin() + std::min<size_t>(official.size(), c.num_layers));
      if (head != from_types)
        f.bad("compress_ratios", cat("ratios that agree with layer_types ", list_str(from_types)), json(official));
    }
  } else {
    if (official.size() < static_cast<size_t>(c.num_layers))
      f.bad("compress_ratios",
            cat("a list of num_hidden_layers (", c.num_layers, ") entries, plus one per MTP layer"), json(official));
    c.compress_ratios.assign(official.begin(), official.begin() + c.num_layers);
  }
  c.mtp_compress_ratios.clear();
  if (official.size() > static_cast<size_t>(c.num_layers))
    c.mtp_compress_ratios.assign(official.begin() + c.num_layers, official.end());
}

void parse_hash_layers(const Fields& f, ModelConfig& c) {
  const int64_t dflt = std::min<int64_t>(3, c.num_layers);
  c.num_hash_layers = static_cast<int>(f.optional_int("num_hash_layers", dflt, 0));
  if (!f.has("mlp_layer_types")) return;
  const json& arr = f.array("mlp_layer_types");
  const std::string expected = cat("a list of num_hidden_layers (", c.num_layers,
                                   ") entries: \"hash_moe\" for the first layers, then \"moe\"");
  if (static_cast<int64_t>(arr.size()) != c.num_layers) f.bad("mlp_layer_types", expected, arr);
  int hash = 0;
  bool seen_moe = false;
  for (const json& v : arr) {
    const std::string t = v.is_string() ? v.get<std::string>() : "";
    if (t == "hash_moe" && !seen_moe) ++hash;
    else if (t == "moe") seen_moe = true;
    else f.bad("mlp_layer_types", expected, arr);
  }
  if (f.has("num_hash_layers") && hash != c.num_hash_layers)
    f.bad("num_hash_layers", cat(hash, " (the number of \"hash_moe\" entries in mlp_layer_types)"), f.at("num_hash_layers"));
  c.num_hash_layers = hash;
}

void parse_quantization(const Fields& f, ModelConfig& c) {
  c.fp8_dense = false;
  if (f.has("quantization_config")) {
    const Fields q(f.object("quantization_config"), f.source(), "quantization_config.");
    c.fp8_dense = true;
    const std::string fmt = q.string("fmt", "e4m3");
    if (fmt != "e4m3") q.bad("fmt", "\"e4m3\"", json(fmt));
    const std::string scale_fmt = q.string("scale_fmt", "ue8m0");
    if (scale_fmt != "ue8m0") q.bad("scale_fmt", "\"ue8m0\" (power-of-two block scales)", json(scale_fmt));
    if (q.has("weight_block_size")) {
      const json& b = q.at("weight_block_size");
      if (!(b.is_array() && b.size() == 2 && b[0] == 128 && b[1] == 128)) q.bad("weight_block_size", "[128, 128]", b);
    }
  }
  // expert_dtype "fp4" means MXFP4 unless the tensors say NVFP4 (load_model infers it); absent means
  // the experts are stored like the other weights (bf16 / f32), which load_model also checks.
  if (f.has("expert_dtype")) {
    const std::string e = f.string("expert_dtype", "");
    if (e == "fp4") c.expert_format = WeightFormat::mxfp4;
    else if (e == "bf16" || e == "bfloat16") c.expert_format = WeightFormat::bf16;
    else if (e == "fp8") f.bad("expert_dtype", "\"fp4\" or \"bf16\" (FP8 routed experts are not supported)", f.at("expert_dtype"));
    else f.bad("expert_dtype", "\"fp4\" or \"bf16\"", f.at("expert_dtype"));
  } else {
    c.expert_format = WeightFormat::bf16;
  }
  c.expert_format_explicit = false;
  if (f.has("expert_format")) {
    const std::string e = f.string("expert_format", "");
    if (!parse_expert_format(e, &c.expert_format))
      f.bad("expert_format", "\"mxfp4\", \"nvfp4\", \"bf16\" or \"f32\"", f.at("expert_format"));
    c.expert_format_explicit = true;
  }
}

}  // namespace

std::string_view attn_kind_name(AttnKind kind) {
  switch (kind) {
    case AttnKind::sliding: return "sliding";
    case AttnKind::csa: return "csa";
    case AttnKind::hca: return "hca";
  }
  return "?";
}

bool parse_expert_format(std::string_view s, WeightFormat* out) {
  for (WeightFormat f : {WeightFormat::mxfp4, WeightFormat::nvfp4, WeightFormat::bf16, WeightFormat::f32}) {
    if (s == weight_format_name(f)) {
      *out = f;
      return true;
    }
  }
  return false;
}

AttnKind ModelConfig::attn_kind(int layer) const {
  const int r = compress_ratios.at(layer);
  if (r == 0) return AttnKind::sliding;
  return r == csa_ratio ? AttnKind::csa : AttnKind::hca;
}

ModelConfig ModelConfig::from_json_text(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(source, ": not valid JSON (", e.what(), ")");
  }
  if (!j.is_object()) fail(source, ": expected a JSON object at the top level, found ", j.type_name());
  const Fields f(j, source);
  ModelConfig c;
  c.vocab_size = f.required_int("vocab_size");
  c.hidden_size = f.required_int("hidden_size");
  c.num_layers = static_cast<int>(f.required_int("num_hidden_layers"));
  c.num_heads = static_cast<int>(f.required_int("num_attention_heads"));
  if (f.has("num_key_value_heads") && f.required_int("num_key_value_heads") != 1)
    f.bad("num_key_value_heads", "1 (DeepSeek-V4 attention has one shared KV head)", f.at("num_key_value_heads"));
  c.head_dim = f.required_int("head_dim");
  if (f.has("qk_rope_head_dim")) {
    c.rope_dim = f.required_int("qk_rope_head_dim");
  } else if (f.has("partial_rotary_factor")) {
    const double p = f.number("partial_rotary_factor", 0.125);
    const double dims = p * static_cast<double>(c.head_dim);
    if (p > 1 || dims != std::floor(dims))
      f.bad("partial_rotary_factor", cat("a fraction of head_dim (", c.head_dim, ") giving a whole number of dims"), f.at("partial_rotary_factor"));
    c.rope_dim = static_cast<int64_t>(dims);
  } else {
    c.rope_dim = c.head_dim / 8;  // transformers' default partial_rotary_factor 64/512
  }
  c.q_lora_rank = f.required_int("q_lora_rank");
  c.o_groups = static_cast<int>(f.required_int("o_groups"));
  c.o_lora_rank = f.required_int("o_lora_rank");
  c.n_routed_experts = static_cast<int>(f.required_int("n_routed_experts"));
  c.n_shared_experts = static_cast<int>(f.optional_int("n_shared_experts", 1, 0));
  c.experts_per_token = static_cast<int>(f.required_int("num_experts_per_tok"));
  c.moe_intermediate_size = f.required_int("moe_intermediate_size");
  c.scoring_func = f.string("scoring_func", "sqrtsoftplus");
  c.routed_scaling_factor = f.number("routed_scaling_factor", 1.5);
  c.norm_topk_prob = f.boolean("norm_topk_prob", true);
  c.swiglu_limit = f.number("swiglu_limit", 10.0);
  c.sliding_window = f.required_int("sliding_window");
  c.num_mtp_layers = static_cast<int>(f.optional_int("num_nextn_predict_layers", 1, 0));
  parse_hash_layers(f, c);
  parse_schedule(f, c);
  parse_rope_fields(f, c);
  c.index_n_heads = static_cast<int>(f.required_int("index_n_heads"));
  c.index_head_dim = f.required_int("index_head_dim");
  c.index_topk = static_cast<int>(f.required_int("index_topk"));
  c.hc_mult = static_cast<int>(f.optional_int("hc_mult", 4));
  c.hc_sinkhorn_iters = static_cast<int>(f.optional_int("hc_sinkhorn_iters", 20));
  c.hc_eps = f.number("hc_eps", 1e-6);
  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  c.bos_token_id = f.optional_int("bos_token_id", 0, 0);
  if (f.has("eos_token_id") && f.at("eos_token_id").is_array()) {
    // transformers allows a list; the first entry is the end-of-sentence token.
    const json& arr = f.at("eos_token_id");
    if (arr.empty()) f.bad("eos_token_id", "a non-negative integer or a non-empty list of them", arr);
    c.eos_token_id = f.integer("eos_token_id", arr[0], "a non-negative integer");
  } else {
    c.eos_token_id = f.optional_int("eos_token_id", 1, 0);
  }
  c.max_position_embeddings = f.optional_int("max_position_embeddings", 1048576);
  parse_quantization(f, c);
  c.validate(source);
  return c;
}

ModelConfig ModelConfig::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TERN_CHECK(in, path, ": cannot open the model config (a checkpoint directory needs a config.json)");
  std::ostringstream text;
  text << in.rdbuf();
  TERN_CHECK(!in.bad(), path, ": read error");
  return from_json_text(text.str(), path);
}

// ---------------------------------------------------------------------------------------------
// Validation: every check names the field, what was expected and what was found.
// ---------------------------------------------------------------------------------------------
namespace {

class Checker {
 public:
  explicit Checker(const std::string& source) : source_(source) {}
  template <typename T>
  void require(bool ok, const char* field, const std::string& expected, const T& found) const {
    if (!ok) fail(source_, ": field \"", field, "\": expected ", expected, ", found ", found);
  }
  template <typename T>
  void positive(const char* field, T v) const {
    require(v > 0, field, "a positive integer", v);
  }
  void positive_real(const char* field, double v) const {
    require(std::isfinite(v) && v > 0, field, "a positive number", v);
  }
  void rope(const char* prefix, const RopeConfig& r) const {
    const std::string p = prefix;
    positive_real((p + "rope_theta").c_str(), r.theta);
    if (!r.yarn) return;
    require(std::isfinite(r.factor) && r.factor >= 1, (p + "factor").c_str(), "a number >= 1", r.factor);
    positive_real((p + "original_max_position_embeddings").c_str(), r.original_max_position);
    positive_real((p + "beta_fast").c_str(), r.beta_fast);
    positive_real((p + "beta_slow").c_str(), r.beta_slow);
    require(r.beta_fast > r.beta_slow, (p + "beta_fast").c_str(), cat("a number above beta_slow (", r.beta_slow, ")"),
            r.beta_fast);
  }

 private:
  const std::string& source_;
};

}  // namespace

void ModelConfig::validate(const std::string& source) const {
  const Checker k(source);
  k.positive("vocab_size", vocab_size);
  k.positive("hidden_size", hidden_size);
  k.positive("num_hidden_layers", num_layers);
  k.positive("num_attention_heads", num_heads);
  k.positive("head_dim", head_dim);
  k.positive("qk_rope_head_dim", rope_dim);
  k.require(rope_dim % 2 == 0, "qk_rope_head_dim", "an even number (RoPE rotates pairs)", rope_dim);
  k.require(rope_dim < head_dim, "qk_rope_head_dim", cat("less than head_dim (", head_dim, ")"), rope_dim);
  k.positive("q_lora_rank", q_lora_rank);
  k.positive("o_groups", o_groups);
  k.require(num_heads % o_groups == 0, "o_groups", cat("a divisor of num_attention_heads (", num_heads, ")"), o_groups);
  k.positive("o_lora_rank", o_lora_rank);
  k.positive("n_routed_experts", n_routed_experts);
  k.require(n_shared_experts == 1, "n_shared_experts", "1 (DeepSeek-V4 has one shared expert)", n_shared_experts);
  k.positive("num_experts_per_tok", experts_per_token);
  k.require(experts_per_token <= n_routed_experts, "num_experts_per_tok",
            cat("at most n_routed_experts (", n_routed_experts, ")"), experts_per_token);
  k.positive("moe_intermediate_size", moe_intermediate_size);
  k.require(scoring_func == "sqrtsoftplus" || scoring_func == "softmax" || scoring_func == "sigmoid", "scoring_func",
            "\"sqrtsoftplus\", \"softmax\" or \"sigmoid\"", cat("\"", scoring_func, "\""));
  k.positive_real("routed_scaling_factor", routed_scaling_factor);
  k.require(num_hash_layers >= 0 && num_hash_layers <= num_layers, "num_hash_layers",
            cat("between 0 and num_hidden_layers (", num_layers, ")"), num_hash_layers);
  k.positive_real("swiglu_limit", swiglu_limit);
  k.positive("sliding_window", sliding_window);

  k.positive("compress_rates.compressed_sparse_attention", csa_ratio);
  k.positive("compress_rates.heavily_compressed_attention", hca_ratio);
  k.require(csa_ratio != hca_ratio, "compress_rates.heavily_compressed_attention",
            cat("a ratio different from the CSA ratio (", csa_ratio, ")"), hca_ratio);
  k.require(static_cast<int>(compress_ratios.size()) == num_layers, "compress_ratios",
            cat("a list of num_hidden_layers (", num_layers, ") entries"), list_str(compress_ratios));
  const std::string allowed = cat("only 0 (sliding), ", csa_ratio, " (CSA) or ", hca_ratio, " (HCA)");
  for (int r : compress_ratios)
    k.require(r == 0 || r == csa_ratio || r == hca_ratio, "compress_ratios", allowed, list_str(compress_ratios));
  k.require(num_mtp_layers >= 0, "num_nextn_predict_layers", "a non-negative integer", num_mtp_layers);
  k.require(mtp_compress_ratios.empty() || static_cast<int>(mtp_compress_ratios.size()) == num_mtp_layers,
            "compress_ratios",
            cat("num_hidden_layers + num_nextn_predict_layers (", num_layers, " + ", num_mtp_layers, ") entries"),
            cat(compress_ratios.size() + mtp_compress_ratios.size(), " entries"));
  for (int r : mtp_compress_ratios)
    k.require(r == 0 || r == csa_ratio || r == hca_ratio, "compress_ratios", allowed, list_str(mtp_compress_ratios));

  k.rope("rope_parameters.main.", rope_main);
  k.rope("rope_parameters.compress.", rope_compress);
  k.positive("index_n_heads", index_n_heads);
  k.positive("index_head_dim", index_head_dim);
  k.require(index_head_dim > rope_dim, "index_head_dim", cat("more than qk_rope_head_dim (", rope_dim, ")"),
            index_head_dim);
  k.positive("index_topk", index_topk);
  k.positive("hc_mult", hc_mult);
  k.positive("hc_sinkhorn_iters", hc_sinkhorn_iters);
  k.positive_real("hc_eps", hc_eps);
  k.positive_real("rms_norm_eps", rms_norm_eps);
  k.require(bos_token_id >= 0 && bos_token_id < vocab_size, "bos_token_id", cat("a token id below vocab_size (", vocab_size, ")"),
            bos_token_id);
  k.require(eos_token_id >= 0 && eos_token_id < vocab_size, "eos_token_id", cat("a token id below vocab_size (", vocab_size, ")"),
            eos_token_id);
  k.positive("max_position_embeddings", max_position_embeddings);
  // Packed FP4 experts need whole scale blocks along each expert matrix's input dimension.
  const int block = expert_format == WeightFormat::mxfp4 ? 32 : expert_format == WeightFormat::nvfp4 ? 16 : 1;
  k.require(hidden_size % block == 0, "hidden_size",
            cat("a multiple of ", block, " (the ", weight_format_name(expert_format), " expert block)"), hidden_size);
  k.require(moe_intermediate_size % block == 0, "moe_intermediate_size",
            cat("a multiple of ", block, " (the ", weight_format_name(expert_format), " expert block)"),
            moe_intermediate_size);
}

ModelConfig ModelConfig::v4_flash() {
  ModelConfig c;  // the member defaults are V4-Flash's scalars
  c.compress_ratios = {0, 0};
  for (int i = 0; i < 20; ++i) {
    c.compress_ratios.push_back(4);
    c.compress_ratios.push_back(128);
  }
  c.compress_ratios.push_back(4);
  c.mtp_compress_ratios = {0};
  c.num_mtp_layers = 1;
  c.rope_main = RopeConfig{};
  c.rope_compress = RopeConfig{160000.0, true, 16.0, 65536.0, 32.0, 1.0};
  c.expert_format = WeightFormat::mxfp4;
  c.fp8_dense = true;
  return c;
}

ModelConfig ModelConfig::tiny() {
  ModelConfig c = v4_flash();
  c.vocab_size = 129280;
  c.hidden_size = 256;
  c.num_layers = 4;
  c.num_heads = 4;
  c.head_dim = 256;
  c.rope_dim = 64;
  c.q_lora_rank = 128;
  c.o_groups = 2;
  c.o_lora_rank = 64;
  c.n_routed_experts = 8;
  c.experts_per_token = 2;
  c.moe_intermediate_size = 128;
  c.num_hash_layers = 2;
  c.sliding_window = 16;
  c.compress_ratios = {0, 4, 8, 4};
  c.csa_ratio = 4;
  c.hca_ratio = 8;
  // V4-Flash's MTP layer (mtp_compress_ratios {0}, num_mtp_layers 1), as the fixtures have it.
  c.index_n_heads = 4;
  c.index_head_dim = 128;
  c.index_topk = 4;
  c.hc_mult = 4;
  return c;
}

namespace {

// Whole numbers as JSON integers (as the official config writes them).
json number(double v) {
  if (v == std::floor(v) && std::fabs(v) < 9.0e15) return static_cast<int64_t>(v);
  return v;
}

json rope_json(const RopeConfig& r) {
  json j;
  j["type"] = "yarn";
  j["factor"] = number(r.factor);
  j["original_max_position_embeddings"] = number(r.original_max_position);
  j["beta_fast"] = number(r.beta_fast);
  j["beta_slow"] = number(r.beta_slow);
  return j;
}

}  // namespace

std::string ModelConfig::to_json_text() const {
  json j;
  j["architectures"] = {"DeepseekV4ForCausalLM"};
  j["model_type"] = "deepseek_v4";
  j["vocab_size"] = vocab_size;
  j["bos_token_id"] = bos_token_id;
  j["eos_token_id"] = eos_token_id;
  j["hidden_size"] = hidden_size;
  j["num_hidden_layers"] = num_layers;
  j["num_attention_heads"] = num_heads;
  j["num_key_value_heads"] = 1;
  j["head_dim"] = head_dim;
  j["qk_rope_head_dim"] = rope_dim;
  j["q_lora_rank"] = q_lora_rank;
  j["o_groups"] = o_groups;
  j["o_lora_rank"] = o_lora_rank;
  j["n_routed_experts"] = n_routed_experts;
  j["n_shared_experts"] = n_shared_experts;
  j["num_experts_per_tok"] = experts_per_token;
  j["moe_intermediate_size"] = moe_intermediate_size;
  j["hidden_act"] = "silu";
  j["scoring_func"] = scoring_func;
  j["routed_scaling_factor"] = routed_scaling_factor;
  j["norm_topk_prob"] = norm_topk_prob;
  j["num_hash_layers"] = num_hash_layers;
  j["swiglu_limit"] = swiglu_limit;
  j["sliding_window"] = sliding_window;
  std::vector<int> ratios = compress_ratios;
  ratios.insert(ratios.end(), mtp_compress_ratios.begin(), mtp_compress_ratios.end());
  j["compress_ratios"] = ratios;
  // transformers' names too, so that its DeepseekV4Config reads ratios other than 4 / 128.
  json types = json::array();
  for (int l = 0; l < num_layers; ++l)
    types.push_back(compress_ratios[l] == 0 ? kSwaName : attn_kind(l) == AttnKind::csa ? kCsaName : kHcaName);
  j["layer_types"] = types;
  j["compress_rates"] = {{kCsaName, csa_ratio}, {kHcaName, hca_ratio}};
  j["rope_theta"] = rope_main.theta;
  j["compress_rope_theta"] = rope_compress.theta;
  if (rope_compress.yarn) j["rope_scaling"] = rope_json(rope_compress);
  if (rope_main.yarn) {  // not expressible in the official keys
    json main = rope_json(rope_main), compress = rope_compress.yarn ? rope_json(rope_compress) : json::object();
    main["rope_theta"] = rope_main.theta;
    compress["rope_theta"] = rope_compress.theta;
    if (!rope_compress.yarn) compress["rope_type"] = "default";
    j["rope_parameters"] = {{"main", main}, {"compress", compress}};
  }
  j["max_position_embeddings"] = max_position_embeddings;
  j["index_n_heads"] = index_n_heads;
  j["index_head_dim"] = index_head_dim;
  j["index_topk"] = index_topk;
  j["hc_mult"] = hc_mult;
  j["hc_sinkhorn_iters"] = hc_sinkhorn_iters;
  j["hc_eps"] = hc_eps;
  j["rms_norm_eps"] = rms_norm_eps;
  j["num_nextn_predict_layers"] = num_mtp_layers;
  j["tie_word_embeddings"] = false;
  j["torch_dtype"] = "bfloat16";
  if (fp8_dense) {
    j["quantization_config"] = {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"},
                                {"scale_fmt", "ue8m0"}, {"weight_block_size", {128, 128}}};
  }
  if (expert_format == WeightFormat::mxfp4 || expert_format == WeightFormat::nvfp4) j["expert_dtype"] = "fp4";
  j["expert_format"] = weight_format_name(expert_format);
  return j.dump(2) + "\n";
}

}  // namespace tern::model
