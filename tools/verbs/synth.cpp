// `tern synth`: writes a random-weight checkpoint of the tiny or the full V4-Flash shape (official
// names and formats; both shapes have V4-Flash's MTP layer mtp.0), for tests and load-time benchmarks.
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "model/synth.h"
#include "tools/verb.h"

namespace {

struct SynthArgs {
  std::string out;
  std::string shape = "tiny";
  int layers = 0;
  int routed_experts = 0;
  int64_t vocab = 0;
  std::string experts = "mxfp4";
  uint64_t seed = 1;
  int shards = 1;
  bool transformers_names = false;
};

int run_synth(const SynthArgs& a) {
  using namespace tern::model;
  ModelConfig c;
  if (a.shape == "tiny") {
    c = ModelConfig::tiny();
  } else if (a.shape == "v4-flash") {
    c = ModelConfig::v4_flash();
  } else {
    tern::fail("--shape: expected tiny or v4-flash, found \"", a.shape, "\"");
  }
  if (a.layers > 0) {
    TERN_CHECK(a.layers <= c.num_layers, "--layers: expected at most ", c.num_layers, " for ", a.shape, ", found ", a.layers);
    c.num_layers = a.layers;
    c.compress_ratios.resize(a.layers);
    c.num_hash_layers = std::min(c.num_hash_layers, a.layers);
  }
  if (a.routed_experts > 0) {
    c.n_routed_experts = a.routed_experts;
    TERN_CHECK(c.experts_per_token <= a.routed_experts, "--routed-experts: expected at least num_experts_per_tok (",
               c.experts_per_token, "), found ", a.routed_experts);
  }
  if (a.vocab > 0) c.vocab_size = a.vocab;
  SynthOptions o;
  TERN_CHECK(parse_expert_format(a.experts, &o.experts), "--experts: expected mxfp4, nvfp4, bf16 or f32, found \"",
             a.experts, "\"");
  o.seed = a.seed;
  o.num_shards = a.shards;
  o.transformers_names = a.transformers_names;
  const auto t0 = std::chrono::steady_clock::now();
  write_synthetic_checkpoint(c, a.out, o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  uint64_t bytes = 0;
  for (const auto& de : std::filesystem::directory_iterator(a.out))
    if (de.is_regular_file()) bytes += de.file_size();
  std::printf("wrote %s: %s shape, %d layers%s, %d routed experts (%s), %.3f GB in %.1f s\n", a.out.c_str(),
              a.shape.c_str(), c.num_layers, synthesizes_mtp(c) ? " and the MTP layer" : "", c.n_routed_experts,
              a.experts.c_str(), bytes / 1e9, s);
  return 0;
}

const bool registered = tern::tools::register_verb(
    {"synth", "Write a random-weight checkpoint (official names and formats)", [](CLI::App& app) {
       auto a = std::make_shared<SynthArgs>();
       app.add_option("--out", a->out, "Output directory")->required();
       app.add_option("--shape", a->shape, "tiny or v4-flash")->capture_default_str();
       app.add_option("--layers", a->layers, "Keep only the first N layers (0: all)");
       app.add_option("--routed-experts", a->routed_experts, "Override the number of routed experts (0: the shape's)");
       app.add_option("--vocab", a->vocab, "Override the vocabulary size (0: the shape's)");
       app.add_option("--experts", a->experts, "Routed expert format: mxfp4, nvfp4, bf16 or f32")->capture_default_str();
       app.add_option("--seed", a->seed, "Random seed")->capture_default_str();
       app.add_option("--shards", a->shards, "Number of safetensors shards")->capture_default_str();
       app.add_flag("--transformers-names", a->transformers_names,
                    "Use transformers' tensor names (everything bf16, experts stacked; needs --experts bf16)");
       return std::function<int()>([a] { return run_synth(*a); });
     }});

}  // namespace
