// `tern inspect --model DIR`: loads a checkpoint (mapping it, checking every tensor against the
// config) and prints what it holds and how long loading took.
#include <chrono>
#include <cstdio>
#include <map>

#include "core/error.h"
#include "model/weights.h"
#include "tools/verb.h"

namespace {

void count(std::map<std::string, int>& formats, const tern::model::Linear& l) {
  formats[std::string(tern::model::weight_format_name(l.format))]++;
}

int run_inspect(const std::string& dir) {
  using namespace tern::model;
  const auto t0 = std::chrono::steady_clock::now();
  const ModelWeights w = load_model(dir);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const ModelConfig& c = w.config;
  std::map<std::string, int> formats;
  count(formats, w.head);
  int csa = 0, hca = 0, swa = 0;
  for (const LayerWeights& L : w.layers) {
    (L.attn_kind == AttnKind::csa ? csa : L.attn_kind == AttnKind::hca ? hca : swa)++;
    for (const Linear* l : {&L.attn.wq_a, &L.attn.wq_b, &L.attn.wkv, &L.attn.wo_a, &L.attn.wo_b, &L.ffn.gate,
                            &L.ffn.shared.w1, &L.ffn.shared.w2, &L.ffn.shared.w3})
      count(formats, *l);
    for (const ExpertWeights& e : L.ffn.experts)
      for (const Linear* l : {&e.w1, &e.w2, &e.w3}) count(formats, *l);
  }
  std::printf("model:      %s\n", dir.c_str());
  std::printf("naming:     %s\n", w.naming.c_str());
  std::printf("files:      %d\n", w.num_files);
  std::printf("tensors:    %lld\n", static_cast<long long>(w.num_tensors));
  std::printf("bytes:      %llu (%.3f GB)\n", static_cast<unsigned long long>(w.num_bytes), w.num_bytes / 1e9);
  std::printf("shape:      %d layers (%d sliding, %d CSA, %d HCA), hidden %lld, %d heads x %lld, vocab %lld\n",
              c.num_layers, swa, csa, hca, static_cast<long long>(c.hidden_size), c.num_heads,
              static_cast<long long>(c.head_dim), static_cast<long long>(c.vocab_size));
  std::printf("experts:    %d routed (%s), top-%d, width %lld, %d hash-routed layers\n", c.n_routed_experts,
              std::string(weight_format_name(c.expert_format)).c_str(), c.experts_per_token,
              static_cast<long long>(c.moe_intermediate_size), c.num_hash_layers);
  std::printf("linears:   ");
  for (const auto& [f, n] : formats) std::printf(" %s=%d", f.c_str(), n);
  std::printf("\n");
  std::printf("load time:  %.3f s (%.2f GB/s of checkpoint)\n", s, s > 0 ? w.num_bytes / 1e9 / s : 0.0);
  return 0;
}

const bool registered = tern::tools::register_verb(
    {"inspect", "Load a checkpoint, check it, and print its tensors, formats and load time", [](CLI::App& app) {
       auto dir = std::make_shared<std::string>();
       app.add_option("--model", *dir, "Checkpoint directory (config.json + safetensors)")->required();
       return std::function<int()>([dir] { return run_inspect(*dir); });
     }});

}  // namespace
