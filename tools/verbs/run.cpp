// `tern run`: generate from token ids on the CPU (or the GPU: --device cuda) and print the tokens and
// the prefill / decode speed.
// With no --model it runs the embedded tiny model (random weights, the real V4 vocabulary), written
// deterministically into the cache directory on first use. --profile (with --device cuda) prints the GPU
// profile of the decode steps (not the prefill): op categories and top kernels per decode step.

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "app/device.h"
#include "app/measure.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/decode_graphs.h"
#include "model/synth.h"
#include "model/v4_model.h"
#include "model/weights.h"
#include "app/embedded_model.h"
#include "tools/verb.h"

namespace {

using namespace tern;

struct RunArgs {
  std::string model, prompt_ids, kv_mode = "auto", device = "cpu", profile_json, cuda_graphs = "on";
  bool no_cuda_graphs = false;
  tern::app::TuneOptions tune;
  int64_t max_tokens = 32, prefill_chunk = 0;
  float temperature = 0.0f;
  uint64_t seed = 0;
  int threads = 0;
  bool profile = false;
  std::string speculative = "off";
  int64_t num_speculative_tokens = 3;
  bool draft_oracle = false;
  double oracle_accept = 1.0;
};

std::vector<int64_t> parse_ids(const std::string& text, int64_t vocab) {
  std::vector<int64_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int64_t id = -1;
    try {
      id = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TERN_CHECK(used == item.size() && !item.empty(), "--prompt-ids: \"", item, "\" is not a token id");
    TERN_CHECK(id >= 0 && id < vocab, "--prompt-ids: token ", id, " is outside the vocabulary [0, ", vocab,
               ")");
    ids.push_back(id);
  }
  TERN_CHECK(!ids.empty(), "--prompt-ids: no token ids");
  return ids;
}

// Without --prompt-ids: BOS and 31 ids spread over the vocabulary.
std::vector<int64_t> default_prompt(const model::ModelConfig& c) {
  std::vector<int64_t> ids = {c.bos_token_id};
  for (int64_t i = 1; i < 32; ++i) ids.push_back((i * 7919) % c.vocab_size);
  return ids;
}

// The decode steps' GPU profile: the table on stdout, the JSON form to `json_path` when given.
void print_profile(const app::StepProfiler& profiler, int64_t steps, const std::string& json_path) {
  if (steps == 0) {
    std::printf("profile: no decode step ran (--max-tokens 1 decodes nothing); nothing to report\n");
    return;
  }
  std::printf("\nprofile of the %ld decode steps (the prefill is not profiled):\n", static_cast<long>(steps));
  std::fputs(profiler.report(steps, "decode step", 0, 15).c_str(), stdout);
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << profiler.json(steps, 50) << "\n";
    TERN_CHECK(out.good(), "--profile-json: cannot write ", json_path);
    std::printf("profile JSON written to %s\n", json_path.c_str());
  }
}

int run(const RunArgs& a) {
  std::string kv_note;
  const model::KvMode kv = app::parse_kv_mode(a.kv_mode, a.device, &kv_note);
  TERN_CHECK(a.max_tokens >= 1, "--max-tokens: expected at least 1, found ", a.max_tokens);
  const bool profile = a.profile || !a.profile_json.empty();
  TERN_CHECK(!profile || a.device == "cuda", "--profile measures GPU kernels: use it with --device cuda");
  if (a.threads > 0) set_thread_count(a.threads);
  app::prepare_device(a.device);
  std::unique_ptr<app::StepProfiler> profiler;
  if (profile) profiler = std::make_unique<app::StepProfiler>(a.device);  // CUPTI refusing is an error before the load
  const std::string dir = a.model.empty() ? app::embedded_model_dir() : a.model;
  const auto t0 = std::chrono::steady_clock::now();
  model::ModelWeights weights = model::load_model(dir);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const model::ModelConfig config = weights.config;
  model::Model m(std::move(weights), kv, app::device_context("cpu"));
  const app::Placement placed = app::place_model(m, a.device);
  for (const auto& line : app::configure_kernels(m, a.device, a.tune)) std::printf("%s\n", line.c_str());
  const std::string& where = placed.description;
  const std::vector<int64_t> prompt =
      a.prompt_ids.empty() ? default_prompt(config) : parse_ids(a.prompt_ids, config.vocab_size);
  std::printf("model: %s (%d layers, hidden %ld, vocab %ld), loaded in %.3f s; %s; %s\n", dir.c_str(),
              config.num_layers, static_cast<long>(config.hidden_size), static_cast<long>(config.vocab_size),
              load_s, kv_note.c_str(), where.c_str());
  cache::SequenceState state = m.new_state(static_cast<int64_t>(prompt.size()) + a.max_tokens);
  model::GenerateOptions o;
  o.max_new_tokens = a.max_tokens;
  o.temperature = a.temperature;
  o.seed = a.seed;
  o.prefill_chunk = a.prefill_chunk;
  TERN_CHECK(a.cuda_graphs == "on" || a.cuda_graphs == "off", "--cuda-graphs: expected on or off, found \"",
             a.cuda_graphs, "\"");
  engine::DecodeGraphOptions go;
  go.enabled = a.cuda_graphs == "on" && !a.no_cuda_graphs;
  go.buckets = {1};
  go.max_tokens = state.layout().max_tokens();
  go.tokens_per_page = state.layout().tokens_per_page();
  engine::DecodeGraphs graphs(m, go);
  graphs.prepare();  // startup: records the one-sequence decode step (or logs why every step is eager)
  o.decode_forward = [&](std::span<const model::StepSequence> b) { return graphs.forward(b); };
  if (profiler) {
    o.before_decode = [&] { profiler->start(); };
    o.after_decode = [&] { profiler->pause(); };
  }
  TERN_CHECK(a.speculative == "off" || a.speculative == "mtp", "--speculative: expected off or mtp, found \"",
             a.speculative, "\"");
  if (a.speculative == "mtp") {
    o.speculative_tokens = a.num_speculative_tokens;
    if (a.draft_oracle) {  // the target's own greedy continuation, from a plain run first (benchmarking only)
      cache::SequenceState plain = m.new_state(static_cast<int64_t>(prompt.size()) + a.max_tokens);
      model::GenerateOptions p = o;
      p.speculative_tokens = 0;
      p.before_decode = p.after_decode = nullptr;
      o.draft_oracle = model::generate(m, plain, prompt, p).tokens;
      o.oracle_accept = a.oracle_accept;
    }
  } else {
    TERN_CHECK(!a.draft_oracle, "--draft-oracle needs --speculative mtp");
  }
  const model::GenerateResult r = model::generate(m, state, prompt, o);
  std::printf("prompt: %zu tokens%s\ntokens:", prompt.size(), a.prompt_ids.empty() ? " (default)" : "");
  for (int64_t t : r.tokens) std::printf(" %ld", static_cast<long>(t));
  const auto decoded = static_cast<double>(r.tokens.size() - 1);  // the first token comes from the prefill
  std::printf("\nprefill: %zu tokens in %.3f s (%.1f tokens/s)\n", prompt.size(), r.prefill_seconds,
              prompt.size() / r.prefill_seconds);
  if (decoded > 0)
    std::printf("decode: %.0f tokens in %.3f s (%.1f tokens/s%s)\n", decoded, r.decode_seconds,
                decoded / r.decode_seconds, profile ? ", with the profiler's overhead" : "");
  const engine::DecodeGraphStats& gs = graphs.stats();
  std::string why;
  for (const auto& [reason, n] : gs.eager_steps) why += (why.empty() ? "" : "; ") + reason + ": " + std::to_string(n);
  std::printf("decode steps: %llu replayed from a CUDA graph, %llu eager%s%s%s\n",
              static_cast<unsigned long long>(gs.graph_steps), static_cast<unsigned long long>(gs.eager_total()),
              why.empty() ? "" : " (", why.c_str(), why.empty() ? "" : ")");
  if (r.rounds > 0)
    std::printf("speculative (MTP, %ld drafts a step%s): %lld verify steps, %lld of %lld drafts kept, acceptance "
                "length %.2f tokens a step; verify steps run eagerly on the step tables, rollbacks replay the kept "
                "tokens\n",
                static_cast<long>(o.speculative_tokens),
                a.draft_oracle ? cat(", ORACLE drafts (benchmarking: the target's own tokens, each kept with probability ",
                                     a.oracle_accept, ")").c_str()
                               : "",
                static_cast<long long>(r.rounds), static_cast<long long>(r.accepted), static_cast<long long>(r.drafts),
                static_cast<double>(r.accepted + r.rounds) / static_cast<double>(r.rounds));
  if (profiler) print_profile(*profiler, static_cast<int64_t>(decoded), a.profile_json);
  return 0;
}

const bool registered = tern::tools::register_verb(
    {"run", "Generate from token ids on the CPU or GPU (default: the embedded tiny model)",
     [](CLI::App& app) -> std::function<int()> {
       auto a = std::make_shared<RunArgs>();
       app.add_option("--model", a->model, "checkpoint directory (default: the embedded tiny model)");
       app.add_option("--prompt-ids", a->prompt_ids, "comma-separated token ids (default: 32 fixed ids)");
       app.add_option("--max-tokens", a->max_tokens, "tokens to generate")->capture_default_str();
       app.add_option("--temperature", a->temperature, "0 = greedy")->capture_default_str();
       app.add_option("--seed", a->seed, "sampling seed")->capture_default_str();
       app.add_option("--kv-mode", a->kv_mode, "auto (fp8 on a GPU, exact on the CPU), exact (f32) or fp8 (DeepSeek's FP8 KV rows)")
           ->capture_default_str();
       app.add_option("--prefill-chunk", a->prefill_chunk, "prefill in chunks of this many tokens (0 = all)");
       app.add_option("--device", a->device, "cpu or cuda (Hopper GPU, build with -DTERN_CUDA=ON)")
           ->capture_default_str();
       app.add_option("--threads", a->threads, "CPU threads (default: TERN_THREADS or all cores)");
       app.add_option("--cuda-graphs", a->cuda_graphs, "on or off: decode steps replayed as a CUDA graph (--device cuda)")
           ->capture_default_str();
       app.add_flag("--no-cuda-graphs", a->no_cuda_graphs, "same as --cuda-graphs off");
       tern::tools::add_tune_options(app, a->tune);
       app.add_flag("--profile", a->profile,
                    "with --device cuda: GPU profile (CUPTI) of the decode steps, per step: op categories, top "
                    "kernels, GPU busy / wall");
       app.add_option("--profile-json", a->profile_json, "also write the profile as JSON to this file (implies --profile)");
       app.add_option("--speculative", a->speculative,
                      "off or mtp: speculative decoding with the checkpoint's MTP layer (greedy; docs/mtp.md)")
           ->capture_default_str();
       app.add_option("--num-speculative-tokens", a->num_speculative_tokens, "drafts a verify step checks (1 to 3)")
           ->capture_default_str();
       app.add_flag("--draft-oracle", a->draft_oracle,
                    "benchmarking only: drafts forced to the target's own greedy tokens (a plain run first), so the "
                    "verify machinery is measured without a trained draft");
       app.add_option("--oracle-accept", a->oracle_accept,
                      "with --draft-oracle: the probability each forced draft is kept as it is (else it is rejected)")
           ->capture_default_str();
       return [a] { return run(*a); };
     }});

}  // namespace
