#include "model/synth.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/thread_pool.h"
#include "model/safetensors_writer.h"
#include "model/weights.h"
#include "ops/synth_values.h"

namespace tern::model {

namespace fs = std::filesystem;

namespace {

// ---- random numbers: splitmix64 streams, Box-Muller normals (no std:: distributions: their output
// is implementation-defined) ------------------------------------------------------------------

using synth::fnv1a;
using synth::splitmix;

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(splitmix(seed)) {}
  uint64_t next() { return splitmix(state_ += 0x9e3779b97f4a7c15ull); }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = (static_cast<double>(next() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2.0 * M_PI * u2);
    has_spare_ = true;
    return r * std::cos(2.0 * M_PI * u2);
  }

 private:
  uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0;
};

constexpr int64_t kChunk = 4096;  // values per random stream: fixed, so threads do not change the output

// Calls store(i, value) for i in [0, n) with value = mean + std * N(0, 1) (or uniform in [lo, hi) when
// `uniform`), stream c = hash(seed, c) for the c-th chunk of kChunk values.
template <typename Store>
void generate(int64_t n, uint64_t seed, double a, double b, bool uniform, Store store) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  parallel_for(
      0, chunks,
      [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          Rng rng(seed ^ splitmix(static_cast<uint64_t>(c) + 0x51ed2701ull));
          const int64_t end = std::min(n, (c + 1) * kChunk);
          for (int64_t i = c * kChunk; i < end; ++i)
            store(i, static_cast<float>(uniform ? a + (b - a) * rng.uniform() : a + b * rng.normal()));
        }
      },
      16);
}

std::vector<float> normal_matrix(int64_t n, uint64_t seed, double sigma) {
  std::vector<float> x(static_cast<size_t>(n));
  generate(n, seed, 0.0, sigma, false, [&](int64_t i, float v) { x[i] = v; });
  return x;
}

// ---- quantizers (the formats of docs/checkpoints.md) ----------------------------------------------

using Bytes = std::vector<std::byte>;

// FP8 e4m3 with one power-of-two e8m0 scale per 128x128 block: amax / scale <= 448.
std::vector<Bytes> quantize_fp8(const std::vector<float>& x, int64_t out, int64_t in) {
  const int64_t bo = (out + 127) / 128, bi = (in + 127) / 128;
  Bytes q(out * in), s(bo * bi);
  parallel_for(0, bo, [&](int64_t b0, int64_t b1) {
    for (int64_t r = b0; r < b1; ++r)
      for (int64_t c = 0; c < bi; ++c) {
        const int64_t r1 = std::min(out, (r + 1) * 128), c1 = std::min(in, (c + 1) * 128);
        float amax = 0;
        for (int64_t i = r * 128; i < r1; ++i)
          for (int64_t j = c * 128; j < c1; ++j) amax = std::max(amax, std::fabs(x[i * in + j]));
        const uint8_t bits = e8m0_ceil_pow2(std::max(amax, 1e-30f) / 448.0f);
        const float scale = e8m0_to_f32(bits);
        s[r * bi + c] = std::byte{bits};
        for (int64_t i = r * 128; i < r1; ++i)
          for (int64_t j = c * 128; j < c1; ++j) q[i * in + j] = std::byte{f32_to_e4m3(x[i * in + j] / scale)};
      }
  });
  return {std::move(q), std::move(s)};
}

// e2m1 pairs, low nibble first, with a per-`block` scale given by scale_of(amax) -> (stored byte, value).
template <typename ScaleOf>
std::vector<Bytes> quantize_fp4(const std::vector<float>& x, int64_t out, int64_t in, int64_t block, ScaleOf scale_of) {
  Bytes q(out * in / 2), s(out * in / block);
  parallel_for(0, out, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t b = 0; b < in / block; ++b) {
        const float* v = &x[r * in + b * block];
        float amax = 0;
        for (int64_t j = 0; j < block; ++j) amax = std::max(amax, std::fabs(v[j]));
        const auto [bits, scale] = scale_of(amax);
        s[r * (in / block) + b] = std::byte{bits};
        for (int64_t j = 0; j < block; j += 2) {
          const uint8_t lo = f32_to_e2m1(v[j] / scale), hi = f32_to_e2m1(v[j + 1] / scale);
          q[(r * in + b * block + j) / 2] = std::byte{static_cast<uint8_t>((lo & 15) | (hi << 4))};
        }
      }
  });
  return {std::move(q), std::move(s)};
}

// NVFP4's fp32 global scale from the distribution, not the data (so that it can be written before the
// weight is generated): no N(0, std) sample exceeds 9 std, so per-16 block scales stay below 448.
float nvfp4_global_scale(double sigma) { return static_cast<float>(9.0 * sigma / (448.0 * 6.0)); }

// Several tensors made from one random matrix (a weight and its scales): made on first use, each
// part released once written.
class Group {
 public:
  using Make = std::function<std::vector<Bytes>()>;
  Group(Make make, int parts) : make_(std::move(make)), remaining_(parts) {}
  void fill(size_t part, std::byte* dst) {
    if (!made_) {
      parts_ = make_();
      made_ = true;
    }
    std::memcpy(dst, parts_.at(part).data(), parts_[part].size());
    Bytes().swap(parts_[part]);
    if (--remaining_ == 0) parts_.clear();
  }

 private:
  Make make_;
  std::vector<Bytes> parts_;
  bool made_ = false;
  int remaining_;
};

struct Item {
  std::string name;
  DType dtype;
  Shape shape;
  SafetensorsWriter::Fill fill;
  uint64_t bytes() const { return dtype_bytes(dtype, shape.numel()); }
};

class Planner {
 public:
  Planner(const ModelConfig& c, const SynthOptions& o) : c_(c), o_(o) {}

  std::vector<Item> plan() {
    const int64_t D = c_.hidden_size, hc = c_.hc_mult;
    dense("embed.weight", {c_.vocab_size, D}, 0.0, 1.0);
    linear("head", c_.vocab_size, D, WeightFormat::bf16);
    norm("norm.weight", D);
    hyper("hc_head_fn", "hc_head_base", "hc_head_scale", hc, hc * D, 1);
    for (int l = 0; l < c_.num_layers; ++l)
      block(cat("layers.", l, "."), c_.attn_kind(l), c_.compress_ratio(l), c_.hash_routed(l));
    if (synthesizes_mtp(c_)) mtp();
    return std::move(items_);
  }

 private:
  std::string name(const std::string& official) const {
    return o_.transformers_names ? transformers_name(official) : official;
  }
  uint64_t seed(const std::string& n) const { return splitmix(o_.seed) ^ fnv1a(n); }
  void add(const std::string& n, DType t, Shape s, SafetensorsWriter::Fill f) {
    items_.push_back(Item{n, t, s, std::move(f)});
  }

  void values(const std::string& official, DType t, Shape s, double a, double b, bool uniform = false) {
    const std::string n = name(official);
    const uint64_t sd = seed(n);
    add(n, t, s, [=](std::byte* dst) {
      const int64_t count = s.numel();
      if (t == DType::f32) {
        auto* p = reinterpret_cast<float*>(dst);
        generate(count, sd, a, b, uniform, [p](int64_t i, float v) { p[i] = v; });
      } else {
        auto* p = reinterpret_cast<uint16_t*>(dst);
        generate(count, sd, a, b, uniform, [p](int64_t i, float v) { p[i] = f32_to_bf16(v); });
      }
    });
  }
  void dense(const std::string& n, Shape s, double mean, double sigma) { values(n, DType::bf16, s, mean, sigma); }
  void f32(const std::string& n, Shape s, double mean, double sigma) { values(n, DType::f32, s, mean, sigma); }
  void norm(const std::string& n, int64_t dim) { dense(n, {dim}, 1.0, 0.1); }
  void hyper(const std::string& fn, const std::string& base, const std::string& scale, int64_t mixes, int64_t width,
             int64_t scales) {
    f32(fn, {mixes, width}, 0.0, 1.0 / std::sqrt(static_cast<double>(width)));
    f32(base, {mixes}, 0.0, 0.5);
    values(scale, DType::f32, {scales}, 0.5, 1.0, true);
  }

  // y = W x, W [out, in] with std 1/sqrt(in) after dequantization.
  void linear(const std::string& official_prefix, int64_t out, int64_t in, WeightFormat fmt) {
    if (o_.transformers_names && fmt != WeightFormat::f32) fmt = WeightFormat::bf16;
    const std::string w = name(official_prefix + ".weight");
    const std::string base = w.substr(0, w.size() - 6);
    const double sigma = 1.0 / std::sqrt(static_cast<double>(in));
    const uint64_t sd = seed(w);
    std::shared_ptr<Group> g;
    switch (fmt) {
      case WeightFormat::f32:
      case WeightFormat::bf16:
        values(official_prefix + ".weight", fmt == WeightFormat::f32 ? DType::f32 : DType::bf16, {out, in}, 0.0, sigma);
        return;
      case WeightFormat::fp8_block:
        g = std::make_shared<Group>([=] { return quantize_fp8(normal_matrix(out * in, sd, sigma), out, in); }, 2);
        add(w, DType::e4m3, {out, in}, [g](std::byte* d) { g->fill(0, d); });
        add(base + "scale", DType::e8m0, {(out + 127) / 128, (in + 127) / 128}, [g](std::byte* d) { g->fill(1, d); });
        return;
      case WeightFormat::mxfp4:
        g = std::make_shared<Group>(
            [=] {
              return quantize_fp4(normal_matrix(out * in, sd, sigma), out, in, 32, [](float amax) {
                const uint8_t bits = e8m0_ceil_pow2(std::max(amax, 1e-30f) / 6.0f);
                return std::pair<uint8_t, float>(bits, e8m0_to_f32(bits));
              });
            },
            2);
        add(w, DType::i8, {out, in / 2}, [g](std::byte* d) { g->fill(0, d); });
        add(base + "scale", DType::e8m0, {out, in / 32}, [g](std::byte* d) { g->fill(1, d); });
        return;
      case WeightFormat::nvfp4: {
        const float s2 = nvfp4_global_scale(sigma);
        g = std::make_shared<Group>(
            [=] {
              return quantize_fp4(normal_matrix(out * in, sd, sigma), out, in, 16, [s2](float amax) {
                uint8_t bits = f32_to_ue4m3(amax / (6.0f * s2));
                if (bits == 0) bits = 1;  // smallest positive scale for an all-tiny block
                return std::pair<uint8_t, float>(bits, ue4m3_to_f32(bits) * s2);
              });
            },
            2);
        add(w, DType::u8, {out, in / 2}, [g](std::byte* d) { g->fill(0, d); });
        add(base + "weight_scale", DType::e4m3, {out, in / 16}, [g](std::byte* d) { g->fill(1, d); });
        add(base + "weight_scale_2", DType::f32, Shape{}, [s2](std::byte* d) { std::memcpy(d, &s2, 4); });
        return;
      }
    }
  }

  WeightFormat dense_format() const { return c_.fp8_dense ? WeightFormat::fp8_block : WeightFormat::bf16; }
  WeightFormat expert_format() const { return o_.experts; }

  void compressor(const std::string& p, int ratio, int64_t width, bool overlap) {
    const int64_t ch = overlap ? 2 * width : width;
    linear(p + "wkv", ch, c_.hidden_size, WeightFormat::bf16);
    linear(p + "wgate", ch, c_.hidden_size, WeightFormat::bf16);
    f32(p + "ape", {ratio, ch}, 0.0, 0.5);
    norm(p + "norm.weight", width);
  }

  void tid2eid(const std::string& official) {
    const std::string n = name(official);
    const uint64_t sd = seed(n);
    const int64_t rows = c_.vocab_size, k = c_.experts_per_token, E = c_.n_routed_experts;
    add(n, DType::i64, {rows, k}, [=](std::byte* dst) {
      auto* p = reinterpret_cast<int64_t*>(dst);
      parallel_for(0, (rows + kChunk - 1) / kChunk, [&](int64_t c0, int64_t c1) {
        std::vector<int64_t> perm(E);
        for (int64_t c = c0; c < c1; ++c) {
          Rng rng(sd ^ splitmix(static_cast<uint64_t>(c)));
          for (int64_t r = c * kChunk; r < std::min(rows, (c + 1) * kChunk); ++r) {
            for (int64_t e = 0; e < E; ++e) perm[e] = e;
            for (int64_t j = 0; j < k; ++j) {  // partial Fisher-Yates: k distinct experts
              const int64_t pick = j + static_cast<int64_t>(rng.next() % static_cast<uint64_t>(E - j));
              std::swap(perm[j], perm[pick]);
              p[r * k + j] = perm[j];
            }
          }
        }
      });
    });
  }

  // mtp.0 as model/weights.cpp binds it: e_proj / h_proj (FP8 in the official checkpoint, as the trunk's dense
  // linears), enorm / hnorm, one SWA-only (ratio 0) score-routed block, its own hc_head and norm.
  void mtp() {
    const int64_t D = c_.hidden_size, hc = c_.hc_mult;
    const std::string p = "mtp.0.";
    norm(p + "enorm.weight", D);
    norm(p + "hnorm.weight", D);
    linear(p + "e_proj", D, D, dense_format());
    linear(p + "h_proj", D, D, dense_format());
    block(p, AttnKind::sliding, 0, false);
    hyper(p + "hc_head_fn", p + "hc_head_base", p + "hc_head_scale", hc, hc * D, 1);
    norm(p + "norm.weight", D);
  }

  // One V4 block under prefix p ("layers.N." or "mtp.0.").
  void block(const std::string& p, AttnKind kind, int ratio, bool hash_routed) {
    const int64_t D = c_.hidden_size, H = c_.num_heads, hd = c_.head_dim, hc = c_.hc_mult;
    const int64_t I = c_.moe_intermediate_size, E = c_.n_routed_experts;
    norm(p + "attn_norm.weight", D);
    norm(p + "ffn_norm.weight", D);
    hyper(p + "hc_attn_fn", p + "hc_attn_base", p + "hc_attn_scale", (2 + hc) * hc, hc * D, 3);
    hyper(p + "hc_ffn_fn", p + "hc_ffn_base", p + "hc_ffn_scale", (2 + hc) * hc, hc * D, 3);
    const std::string a = p + "attn.";
    linear(a + "wq_a", c_.q_lora_rank, D, dense_format());
    linear(a + "wq_b", H * hd, c_.q_lora_rank, dense_format());
    linear(a + "wkv", hd, D, dense_format());
    linear(a + "wo_a", c_.o_groups * c_.o_lora_rank, H * hd / c_.o_groups, dense_format());
    linear(a + "wo_b", D, c_.o_groups * c_.o_lora_rank, dense_format());
    norm(a + "q_norm.weight", c_.q_lora_rank);
    norm(a + "kv_norm.weight", hd);
    f32(a + "attn_sink", {H}, 0.0, 1.0);
    if (kind != AttnKind::sliding) compressor(a + "compressor.", ratio, hd, kind == AttnKind::csa);
    if (kind == AttnKind::csa) {
      linear(a + "indexer.wq_b", c_.index_n_heads * c_.index_head_dim, c_.q_lora_rank, dense_format());
      linear(a + "indexer.weights_proj", c_.index_n_heads, D, WeightFormat::bf16);
      compressor(a + "indexer.compressor.", ratio, c_.index_head_dim, true);
    }
    const std::string f = p + "ffn.";
    linear(f + "gate", E, D, WeightFormat::bf16);
    if (hash_routed) {
      tid2eid(f + "gate.tid2eid");
    } else {
      f32(f + "gate.bias", {E}, 0.0, 0.1);
    }
    if (o_.transformers_names) {
      const std::string x = name(f + "experts.X");
      const std::string base = x.substr(0, x.size() - 1);
      const DType t = o_.experts == WeightFormat::f32 ? DType::f32 : DType::bf16;
      values_named(base + "gate_up_proj", t, {E, 2 * I, D}, 1.0 / std::sqrt(static_cast<double>(D)));
      values_named(base + "down_proj", t, {E, D, I}, 1.0 / std::sqrt(static_cast<double>(I)));
    } else {
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = cat(f, "experts.", e, ".");
        linear(x + "w1", I, D, expert_format());
        linear(x + "w2", D, I, expert_format());
        linear(x + "w3", I, D, expert_format());
      }
    }
    linear(f + "shared_experts.w1", I, D, dense_format());
    linear(f + "shared_experts.w2", D, I, dense_format());
    linear(f + "shared_experts.w3", I, D, dense_format());
  }

  // A tensor already named in the output naming (transformers' stacked experts).
  void values_named(const std::string& n, DType t, Shape s, double sigma) {
    const uint64_t sd = seed(n);
    add(n, t, s, [=](std::byte* dst) {
      if (t == DType::f32) {
        auto* p = reinterpret_cast<float*>(dst);
        generate(s.numel(), sd, 0.0, sigma, false, [p](int64_t i, float v) { p[i] = v; });
      } else {
        auto* p = reinterpret_cast<uint16_t*>(dst);
        generate(s.numel(), sd, 0.0, sigma, false, [p](int64_t i, float v) { p[i] = f32_to_bf16(v); });
      }
    });
  }

  const ModelConfig& c_;
  const SynthOptions& o_;
  std::vector<Item> items_;
};

// model-<digits>-of-<digits>.safetensors[.tmp], as the sharded writers name shards.
bool is_shard_name(const std::string& n) {
  std::string rest = n;
  for (const char* suffix : {".tmp", ".safetensors"}) {
    const std::string sfx = suffix;
    if (rest.size() > sfx.size() && rest.compare(rest.size() - sfx.size(), sfx.size(), sfx) == 0)
      rest.resize(rest.size() - sfx.size());
    else if (sfx == ".safetensors")
      return false;
  }
  const size_t of = rest.find("-of-");
  if (rest.rfind("model-", 0) != 0 || of == std::string::npos || of <= 6 || of + 4 >= rest.size()) return false;
  for (size_t i = 6; i < rest.size(); ++i)
    if (i < of || i >= of + 4)
      if (rest[i] < '0' || rest[i] > '9') return false;
  return true;
}

void remove_old_checkpoint(const std::string& dir) {
  for (const auto& de : fs::directory_iterator(dir)) {
    const std::string n = de.path().filename().string();
    if (n == "model.safetensors" || n == "model.safetensors.index.json" || n == "model.safetensors.tmp" ||
        is_shard_name(n))
      fs::remove(de.path());
  }
}

std::string shard_name(int i, int n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", i, n);
  return buf;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  TERN_CHECK(out, path, ": cannot create");
  out << text;
  out.close();
  TERN_CHECK(out, path, ": write failed");
}

}  // namespace

void write_synthetic_checkpoint(const ModelConfig& config, const std::string& dir, const SynthOptions& options) {
  TERN_CHECK(options.num_shards >= 1, "synth: the number of shards must be at least 1, found ", options.num_shards);
  TERN_CHECK(!options.transformers_names || options.experts == WeightFormat::bf16 || options.experts == WeightFormat::f32,
             "synth: transformers' names hold bf16 or f32 experts only, not ", weight_format_name(options.experts));
  ModelConfig c = config;
  c.expert_format = options.experts;
  c.expert_format_explicit = true;
  if (options.transformers_names) c.fp8_dense = false;
  c.validate("synth config");

  std::vector<Item> items = Planner(c, options).plan();
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.name < b.name; });
  uint64_t total = 0;
  for (const Item& it : items) total += it.bytes();
  const int shards = std::min<int>(options.num_shards, static_cast<int>(items.size()));

  fs::create_directories(dir);
  remove_old_checkpoint(dir);
  write_text((fs::path(dir) / "config.json").string(), c.to_json_text());

  // Contiguous runs of names, cut where the running size passes k/shards of the total.
  nlohmann::json weight_map = nlohmann::json::object();
  size_t next = 0;
  uint64_t acc = 0;
  for (int s = 0; s < shards; ++s) {
    SafetensorsWriter w;
    w.set_metadata("format", "pt");
    const std::string file = shards == 1 ? "model.safetensors" : shard_name(s + 1, shards);
    const size_t remaining_shards = static_cast<size_t>(shards - s - 1);
    while (next < items.size() && (w.size() == 0 || s == shards - 1 ||
                                   (acc < total / shards * (s + 1) && items.size() - next > remaining_shards))) {
      Item& it = items[next++];
      acc += it.bytes();
      weight_map[it.name] = file;
      w.add(it.name, it.dtype, it.shape, std::move(it.fill));
    }
    w.write((fs::path(dir) / file).string());
  }
  if (shards > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_text((fs::path(dir) / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  }
}

bool synthesizes_mtp(const ModelConfig& config) {
  if (config.num_mtp_layers < 1) return false;
  const int ratio = config.mtp_compress_ratios.empty() ? 0 : config.mtp_compress_ratios[0];
  TERN_CHECK(ratio == 0, "synthetic MTP layer: its compress ratio is ", ratio,
             "; tern implements the sliding-window-only MTP layer (ratio 0) of DeepSeek-V4");
  return true;
}

void write_synthetic_checkpoint(const ModelConfig& config, const std::string& dir, uint64_t seed,
                                WeightFormat experts, int num_shards) {
  SynthOptions o;
  o.seed = seed;
  o.experts = experts;
  o.num_shards = num_shards;
  write_synthetic_checkpoint(config, dir, o);
}

}  // namespace tern::model
