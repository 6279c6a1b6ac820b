// `tern bench-step`: the full-depth model's decode step time inside CUDA graphs per batch and context, and
// its prefill throughput, on a synthetic model built in place (docs/bench-step.md). Every figure is set
// against what the same run measured: the copy bandwidth (decode streams weights) and a big GEMM through
// tern's own linear op (prefill is matrix work). Rows are printed as they are measured; the tables again last.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "app/device.h"
#include "app/knobs.h"
#include "app/measure.h"
#include "app/speculative_threshold.h"
#include "app/synthetic_placement.h"
#include "bench/stats.h"
#include "cache/page_pool.h"
#include "cache/sequence_state.h"
#include "core/env.h"
#include "core/error.h"
#include "engine/decode_graphs.h"
#include "model/perf_model.h"
#include "model/speculator.h"
#include "ops/recorded_steps.h"
#include "ops/sample.h"
#include "ops/sampling.h"
#include "ops/synth_values.h"
#include "tools/verb.h"

namespace {

using namespace tern;

struct Args {
  std::string device = "cpu", config = "full", experts = "mxfp4", kv_mode = "fp8", json;
  std::string batches = "1,16,32,64,128,256", contexts = "1024,8192", prefill = "1024,8192";
  int steps = 10, warmup = 3;
  bool profile = false;
  std::vector<int64_t> profile_batches{16, 64};
  int profile_top = 12;
  double headroom_gib = 12;
  uint64_t seed = 1;
  // --mixed P:B: a step as the server runs it while a prompt arrives: one new prompt of P tokens together with
  // B decode tokens at each decode context, eager (no graph: a prefill chunk is in the step).
  std::string mixed;
  // --fill-check: the longest prompt's logits with the activations poisoned (NaN bytes) and zero-filled must be
  // the same bits (so no op of the full-size model reads an activation element it did not write).
  bool fill_check = false;
  // --speculative k: beside each decode row, the verify step of MTP speculative decoding (k + 1 tokens a sequence,
  // replayed from its own CUDA graph) and the tokens/s it gives at acceptance lengths 1.8, 2.5 and 3.0.
  int64_t speculative = 0;
  // With --speculative and a model with an MTP layer: the whole round as the engine runs it, and the auto threshold
  // at this acceptance length (0: the rule of thumb for k, kDefaultAcceptance), saved for `tern serve --speculative
  // auto` with --save-speculative-threshold (app/speculative_threshold.h).
  double speculative_acceptance = 0;
  double speculative_min_gain = app::kSpeculativeMinGain;
  bool save_speculative_threshold = false;
  // --prefill-chunk N: a prompt longer than N is prefilled in chunks of N tokens, one forward each, as a server's
  // --max-chunk does (issue #14 item 7: decode rows at 64K-1M contexts, whose one-shot prefill would need tens
  // of GB of activations). Prompts of at most N tokens are one forward, as before.
  int64_t prefill_chunk = 8192;
  tern::app::TuneOptions tune;
  // --ab NAME=V[,NAME=V] (repeatable: one B arm each): after each context's decode rows (and each warm
  // prefill), the same again with those switches (app/knobs.h) as arm B against the start-up values as arm A,
  // every B arm then A per round for --ab-rounds rounds, graphs recorded again for every arm: A/Bs in one
  // process, on one build of the model.
  std::vector<std::string> ab;
  int ab_rounds = 2;
};

// One batch's decode step time per round in a B arm and in arm A (--ab), or (batch 0) the warm prefill of
// `context` tokens.
struct AbRow {
  std::string arm;  // the B arm's switches
  int64_t batch = 0, context = 0;
  std::vector<double> a_ms, b_ms;  // per round: the arm's median step, or its prefill
  std::string note;                // an arm that ran its steps eagerly (a graph that failed to record)
};

// Expected acceptance lengths by k (v4-speculative.md section 4: position 1 kept about 85% of the time, position 2
// about 50%, position 3 about 15%; published V4 lengths at k = 3 are 2.5 to 2.8).
constexpr double kDefaultAcceptance[] = {1.0, 1.8, 2.3, 2.5};

// An MTP round at batch B, as the engine runs it (model/speculator.h): drafting k tokens (k MTP rows a sequence, one
// batch per position), the verify step (eager, recorded, after the snapshots) and the settle (sequence i keeps
// i % (k + 1) + 1 tokens: rollbacks and catch-ups of every length), against the plain decode step.
struct RoundRow {
  int64_t batch = 0, context = 0, k = 0;
  double round_ms = 0, decode_ms = 0;
  double draft_ms = 0;  // the drafting alone (its rows leave the state's position as it is: timed by itself)
  double ratio() const { return round_ms / decode_ms; }
};
std::string round_line(const RoundRow& r) {
  std::string s = tern::cat("| ", r.batch, " | ", r.context, " | ", r.k, " | ");
  char buf[256];
  std::snprintf(buf, sizeof buf, "%.3f | %.3f | %.3f | %.2f |", r.round_ms, r.draft_ms, r.decode_ms, r.ratio());
  s += buf;
  for (double L : {1.8, 2.5, 3.0}) {
    std::snprintf(buf, sizeof buf, " %.0f |", static_cast<double>(r.batch) * std::min(L, r.k + 1.0) / (r.round_ms / 1e3));
    s += buf;
  }
  return s;
}
const char* kRoundHeader =
    "MTP rounds (draft + verify + settle, as the engine runs them; pays while round / decode < the acceptance "
    "length):\n"
    "| batch | context | k | round ms | of which drafting | decode ms | ratio | tokens/s at 1.8 | at 2.5 | at 3.0 |\n"
    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|";

// A verify step at batch B: B sequences of k + 1 tokens, against the decode step of the same batch and context.
struct VerifyRow {
  int64_t batch = 0, context = 0, tokens = 0;  // tokens: k + 1 a sequence
  double step_ms = 0, decode_ms = 0;
  std::string note;
};
constexpr double kAcceptanceLengths[] = {1.8, 2.5, 3.0};
std::string verify_line(const VerifyRow& r) {
  std::string s = tern::cat("| ", r.batch, " | ", r.context, " | ", r.tokens, " | ");
  char buf[256];
  std::snprintf(buf, sizeof buf, "%.3f | %.3f | %.2f |", r.step_ms, r.decode_ms, r.step_ms / r.decode_ms);
  s += buf;
  for (double L : kAcceptanceLengths) {
    std::snprintf(buf, sizeof buf, " %.0f |", static_cast<double>(r.batch) * L / (r.step_ms / 1e3));
    s += buf;
  }
  return s + (r.note.empty() ? "" : " " + r.note);
}
const char* kVerifyHeader =
    "verify steps (MTP: k + 1 tokens a sequence; tokens/s = batch x acceptance length / verify step, before the "
    "drafts' own cost: the MTP rounds rows time the whole round):\n"
    "| batch | context | tokens a sequence | verify ms | decode ms | ratio | tokens/s at 1.8 | at 2.5 | at 3.0 |\n"
    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|";

std::vector<int64_t> parse_list(const std::string& text, const char* option) {
  std::vector<int64_t> v;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int64_t x = 0;
    try {
      x = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TERN_CHECK(used == item.size() && !item.empty() && x >= 1, option, ": \"", item, "\" is not a positive integer");
    v.push_back(x);
  }
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

std::string run_and_read(const char* command) {
  std::string out;
  if (FILE* p = popen(command, "r")) {
    char buf[256];
    while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out.empty() ? "?" : out;
}

void say(const std::string& line) {
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

struct DecodeRow {
  int64_t batch = 0, context = 0;
  double step_ms = 0, min_ms = 0, max_ms = 0, tokens_s = 0, bytes = 0, gbs = 0, of_copy = 0;
  std::string note;
};
struct MixedRow {
  int64_t prompt = 0, decodes = 0, context = 0;
  double seconds = 0, cold_seconds = 0, prefill_alone = 0;  // prefill_alone: the same prompt without the decodes
};
struct PrefillRow {
  int64_t tokens = 0;
  double seconds = 0, tokens_s = 0, flops = 0, tflops = 0, of_gemm = 0;
  double cold_seconds = 0;  // the first prefill of this length (allocator growth, library heuristics, scratch)
  int64_t chunks = 1;       // forwards it took (--prefill-chunk); a chunked prefill has no cold run
};

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return bench::percentile(v, 50);
}

std::string ab_line(const AbRow& r) {
  std::string rounds;
  for (size_t i = 0; i < r.a_ms.size(); ++i)
    rounds += cat(i ? "; " : "", fixed(r.b_ms[i], 3), " / ", fixed(r.a_ms[i], 3));
  const double a = median_of(r.a_ms), b = median_of(r.b_ms);
  return cat("| ", r.arm, " | ", r.batch == 0 ? std::string("prefill") : std::to_string(r.batch), " | ",
             r.context, " | ", fixed(b, 3), " | ", fixed(a, 3), " | ", fixed(100.0 * (b - a) / a, 2), "% | ",
             rounds, r.note.empty() ? "" : " " + r.note, " |");
}

std::string decode_line(const DecodeRow& r) {
  if (!r.note.empty() && r.step_ms == 0) return cat("| ", r.batch, " | ", r.context, " | ", r.note, " | | | | |");
  char buf[256];
  std::snprintf(buf, sizeof buf, "| %ld | %ld | %.3f (%.3f-%.3f) | %.0f | %.2f | %.0f | %.1f%% |%s", static_cast<long>(r.batch),
                static_cast<long>(r.context), r.step_ms, r.min_ms, r.max_ms, r.tokens_s, r.bytes / 1e9, r.gbs,
                100 * r.of_copy, r.note.empty() ? "" : (" " + r.note).c_str());
  return buf;
}
std::string prefill_line(const PrefillRow& r) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "| %ld | %.3f | %.0f | %.1f | %.1f | %.1f%% | %.3f |", static_cast<long>(r.tokens),
                r.seconds, r.tokens_s, r.flops / 1e12, r.tflops, 100 * r.of_gemm, r.cold_seconds);
  if (r.chunks > 1) return cat(buf, " (", r.chunks, " chunks, no first run)");
  return buf;
}
const char* kAbHeader =
    "| B arm | batch (or prefill) | context (prompt) | B ms | A ms | B vs A | per round, B / A ms |\n"
    "|---|---:|---:|---:|---:|---:|---|";
const char* kDecodeHeader =
    "| batch | context | step ms (min-max) | tokens/s | GB/step (model) | GB/s | of copy |\n|---:|---:|---:|---:|---:|---:|---:|";
const char* kPrefillHeader =
    "| prompt | s (warm) | tokens/s | TFLOP (model) | TFLOP/s | of GEMM | s (first run) |\n|---:|---:|---:|---:|---:|---:|---:|";

// Deterministic token ids in [1, vocab).
int64_t token(uint64_t stream, uint64_t i, int64_t vocab) {
  return 1 + static_cast<int64_t>(synth::element_hash(stream, i) % static_cast<uint64_t>(vocab - 1));
}

std::string mixed_line(const MixedRow& r) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "| %ld | %ld | %ld | %.3f | %.3f | %.3f | %.2f |", static_cast<long>(r.prompt),
                static_cast<long>(r.decodes), static_cast<long>(r.context), r.seconds, r.cold_seconds, r.prefill_alone,
                r.prefill_alone > 0 ? r.seconds / r.prefill_alone : 0.0);
  return buf;
}
const char* kMixedHeader =
    "| prompt | + decodes | at context | s (warm) | s (first run) | prompt alone s | ratio |\n|---:|---:|---:|---:|---:|---:|---:|";

int run(const Args& a) {
  const std::vector<int64_t> batches = parse_list(a.batches, "--batches");
  int64_t mixed_prompt = 0, mixed_decodes = 0;
  if (!a.mixed.empty()) {
    const size_t colon = a.mixed.find(':');
    TERN_CHECK(colon != std::string::npos, "--mixed: expected PROMPT:DECODES, found \"", a.mixed, "\"");
    const std::vector<int64_t> prompt = parse_list(a.mixed.substr(0, colon), "--mixed"),
                               decodes = parse_list(a.mixed.substr(colon + 1), "--mixed");
    TERN_CHECK(prompt.size() == 1 && decodes.size() == 1, "--mixed: expected one PROMPT:DECODES pair, found \"",
               a.mixed, "\"");
    mixed_prompt = prompt[0];
    mixed_decodes = decodes[0];
  }
  const std::vector<int64_t> contexts = parse_list(a.contexts, "--contexts");
  const std::vector<int64_t> prefills = parse_list(a.prefill, "--prefill");
  TERN_CHECK(a.steps >= 1 && a.warmup >= 0, "--steps must be >= 1 and --warmup >= 0");
  TERN_CHECK(a.kv_mode == "exact" || a.kv_mode == "fp8", "--kv-mode: expected exact or fp8, found \"", a.kv_mode, "\"");
  model::WeightFormat experts{};
  TERN_CHECK(model::parse_expert_format(a.experts, &experts) && experts != model::WeightFormat::f32,
             "--experts: expected mxfp4, nvfp4 or bf16, found \"", a.experts, "\"");
  const model::KvMode kv = a.kv_mode == "fp8" ? model::KvMode::fp8 : model::KvMode::exact;
  const std::string activations(ops::activations_name(app::resolve_activations(a.tune.activations, a.device)));
  const model::ModelConfig config = app::synthetic_config(a.config);
  app::prepare_device(a.device);
  std::unique_ptr<app::StepProfiler> profiler;
  if (a.profile) profiler = std::make_unique<app::StepProfiler>(a.device);  // refuses before the long build

  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  // $TERN_COMMIT: what the binaries were built from (scripts/gpu-pack -> gpu-check); else this tree's HEAD.
  const std::optional<std::string> built = env_string("TERN_COMMIT");
  const std::string commit = built ? *built : run_and_read("git rev-parse --short HEAD 2>/dev/null");
  say(cat("== tern bench-step: ", a.config, " config (", config.num_layers, " layers), ", a.experts, " experts, kv ",
          a.kv_mode, ", activations ", activations, ", device ", a.device, "; commit ", commit, ", ", date));

  // The ceilings, measured first (the model takes the memory afterwards).
  const bool full = a.config == "full";
  const double copy_gbs = app::copy_bandwidth_gbs(a.device, full ? int64_t{1} << 30 : int64_t{64} << 20);
  const int64_t gemm_n = full ? 8192 : 256;
  const double gemm_bf16 = app::linear_tflops(a.device, gemm_n, false);
  const double gemm_fp8 = app::linear_tflops(a.device, gemm_n, true);
  say(cat("copy bandwidth (read+write): ", static_cast<int64_t>(copy_gbs), " GB/s; tern linear ", gemm_n, "^3: bf16 ",
          gemm_bf16, " TFLOP/s, fp8 ", gemm_fp8, " TFLOP/s (prefill is set against the larger)"));
  const double gemm_ref = std::max(gemm_bf16, gemm_fp8);

  // Memory: the states of the largest configuration, plus headroom for activations, workspace and graphs.
  TERN_CHECK(a.speculative >= 0 && a.speculative + 1 <= model::Model::kMaxStepQueries, "--speculative: 0 (off) to ",
             model::Model::kMaxStepQueries - 1, " drafts, found ", a.speculative);
  // Positions the timed steps consume: one a decode step, k + 1 a verify step and up to k + 1 an MTP round
  // (--speculative k).
  using Knobs = std::vector<std::pair<std::string, int64_t>>;
  std::vector<Knobs> ab_arms;  // the B arms
  for (const std::string& arm : a.ab) ab_arms.push_back(app::parse_knobs(arm));
  const bool ab = !ab_arms.empty();
  TERN_CHECK(a.ab_rounds >= 1, "--ab-rounds must be >= 1");
  // Decode rows run again per round: every B arm, then A.
  const int64_t ab_steps = ab ? static_cast<int64_t>(ab_arms.size() + 1) * a.ab_rounds : 0;
  const int64_t margin =
      64 +
      static_cast<int64_t>(batches.size()) * (a.warmup + a.steps) *
          ((a.profile ? 2 : 1) * (1 + (a.speculative > 0 ? 2 * (a.speculative + 1) : 0)) + ab_steps) +
      4;
  const int64_t max_context = std::max({contexts.back(), prefills.back(), mixed_prompt});
  const int64_t seq_bytes = app::state_bytes_per_sequence(config, kv, max_context + margin);
  const auto headroom = static_cast<int64_t>(a.headroom_gib * (1 << 30));
  const int64_t reserve = (batches.back() + 1) * seq_bytes + headroom;
  app::SyntheticPlacement placed =
      app::place_synthetic_model(config, experts, kv, a.device, a.device == "cuda" ? reserve : 0, a.seed);
  model::Model& m = *placed.model;
  say(placed.description);
  for (const auto& line : app::configure_kernels(m, a.device, a.tune)) say(line);
  // --ab: the B arms' switches and arm A's (the values in force now of every switch an arm names), checked
  // before anything is timed. An arm is set on top of A (set_arm), so a switch another arm names keeps its A
  // value.
  Knobs ab_base;
  for (const Knobs& arm : ab_arms)
    for (const auto& [name, value] : arm)
      if (std::none_of(ab_base.begin(), ab_base.end(), [&](const auto& b) { return b.first == name; }))
        ab_base.emplace_back(name, app::knob_value(m, name));
  auto set_arm = [&](const Knobs* arm) {
    for (const auto& [name, value] : ab_base) app::set_knob(m, name, value);
    if (arm != nullptr)
      for (const auto& [name, value] : *arm) app::set_knob(m, name, value);
  };
  if (ab) {
    std::string arms;
    for (size_t i = 0; i < ab_arms.size(); ++i) {
      set_arm(&ab_arms[i]);  // refuses a value out of range here
      arms += cat(i ? "; " : "", "B", i + 1, ": ", a.ab[i]);
    }
    set_arm(nullptr);
    std::string base;
    for (const auto& [name, value] : ab_base) base += cat(base.empty() ? "" : ", ", name, "=", value);
    say(cat("A/B in this process (--ab): ", arms, "; A: ", base, "; ", a.ab_rounds,
            " rounds of every B arm then A after each context's decode rows and each prefill"));
  }
  std::vector<AbRow> ab_rows;
  say(cat("state per sequence at ", max_context, " tokens: ", static_cast<double>(seq_bytes) / (1 << 20),
          " MiB; bytes per step: dense weights once (", static_cast<double>(model::decode_step_bytes(placed.sizes, config, 1, 0)) / 1e9,
          " GB with the head) + E(B) = E(1-(1-k/E)^B) distinct experts per layer x ", placed.sizes.expert_bytes / 1e6,
          " MB (uniform routing; KV reads not counted)"));

  // Warm-up forward (workspace, per-weight tables) before anything is timed.
  {
    cache::SequenceState s = m.new_state(64);
    std::vector<int64_t> ids(32);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = token(7, i, config.vocab_size);
    const model::StepSequence seq{&s, ids, model::LogitsFor::last};
    (void)m.forward({&seq, 1});
  }

  std::vector<DecodeRow> decode_rows;
  std::vector<VerifyRow> verify_rows;
  std::vector<RoundRow> round_rows;
  std::unique_ptr<model::Speculator> speculator;
  std::vector<PrefillRow> prefill_rows;
  std::vector<MixedRow> mixed_rows;
  std::set<int64_t> lengths(contexts.begin(), contexts.end());
  lengths.insert(prefills.begin(), prefills.end());
  for (const int64_t L : lengths) {
    const bool decode = std::binary_search(contexts.begin(), contexts.end(), L);
    const auto layout = m.state_layout(L + margin);
    const int64_t pages_per_seq = layout->pages_for(L + margin);
    // As many sequences as the batches want and the memory holds (2 GiB kept for the graphs' arena).
    const int64_t avail = std::max<int64_t>(0, app::free_state_memory(a.device) - (int64_t{2} << 30));
    const int64_t fit = avail / (pages_per_seq * layout->page_bytes()) - 1;
    const int64_t want = decode ? std::max(batches.back(), mixed_decodes) : 0;
    const int64_t seqs = std::min(want, fit);
    TERN_CHECK(fit >= 0, "bench-step: not even one state of ", L + margin, " tokens fits (",
               static_cast<double>(avail) / (1 << 30), " GiB free)");
    // The prefilled state plus the clones; a profiled prefill (and --ab's prefills) needs a second state
    // before any clone exists. A mixed step's prompt takes one more.
    const int64_t pool_seqs = std::max<int64_t>(seqs, profiler || a.fill_check || ab ? 1 : 0) + 1 +
                              (decode && mixed_prompt > 0 ? 1 : 0);
    TERN_CHECK(fit + 1 >= pool_seqs, "bench-step: a profiled prefill of ", L, " tokens needs two states of ",
               L + margin, " tokens; ", static_cast<double>(avail) / (1 << 30), " GiB free holds one");
    auto pool = std::make_shared<cache::PagePool>(layout, pool_seqs * pages_per_seq, m.device());

    std::vector<int64_t> prompt(static_cast<size_t>(L));
    for (int64_t i = 0; i < L; ++i) prompt[static_cast<size_t>(i)] = token(static_cast<uint64_t>(L), static_cast<uint64_t>(i), config.vocab_size);
    // The first prefill of a length pays one-time costs (the stream allocator grows, the library picks its
    // kernels, scratch is allocated); a server pays them once at startup (its warm-up step), so the row is the
    // second, warm run, and the first is reported beside it.
    // Longer than --prefill-chunk: chunks of that many tokens, one forward each (the last one's logits only).
    auto prefill = [&](cache::SequenceState& state) {
      for (int64_t at = 0; at < L; at += a.prefill_chunk) {
        const int64_t n = std::min(a.prefill_chunk, L - at);
        const model::StepSequence seq{&state, std::span<const int64_t>(prompt).subspan(at, n), model::LogitsFor::last};
        (void)m.forward({&seq, 1});  // host logits: returns when the device is done
      }
    };
    auto timed_prefill = [&](cache::SequenceState& state) {
      const auto t0 = std::chrono::steady_clock::now();
      prefill(state);
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    PrefillRow pr;
    pr.tokens = L;
    pr.chunks = (L + a.prefill_chunk - 1) / a.prefill_chunk;
    if (pr.chunks == 1) {  // (a chunked prefill's first chunks warm what the cold run would)
      cache::SequenceState cold(pool, L + margin);
      pr.cold_seconds = timed_prefill(cold);
    }
    // One real prefill of L tokens (timed), into the state the decode batches clone.
    cache::SequenceState first(pool, L + margin);
    pr.seconds = timed_prefill(first);
    pr.tokens_s = static_cast<double>(L) / pr.seconds;
    pr.flops = model::prefill_flops(config, L);
    pr.tflops = pr.flops / pr.seconds / 1e12;
    pr.of_gemm = pr.tflops / gemm_ref;
    if (a.fill_check && L == prefills.back()) {
      std::string was;  // the fill the run had (TERN_ACTIVATION_FILL), restored after the check
      auto logits_with = [&](const char* fill) {
        const std::string before = app::set_activation_fill(a.device, fill);
        TERN_CHECK(!before.empty(), "--fill-check needs --device cuda");
        if (was.empty()) was = before;
        cache::SequenceState s(pool, L + margin);
        const model::StepSequence seq{&s, prompt, model::LogitsFor::last};
        return m.forward({&seq, 1});
      };
      const Tensor zeroed = logits_with("zero"), poisoned = logits_with("poison");
      (void)app::set_activation_fill(a.device, was);
      int64_t differ = 0, nonfinite = 0;
      for (int64_t i = 0; i < zeroed.numel(); ++i) {
        const float z = zeroed.data<float>()[i], p = poisoned.data<float>()[i];
        differ += std::memcmp(&z, &p, sizeof z) != 0;
        nonfinite += !std::isfinite(p);
      }
      say(cat("activation fill check at ", L, " tokens: ", differ == 0 ? "poisoned == zeroed bit for bit"
                                                                     : cat("DIFFERENT: ", differ, " of ", zeroed.numel(),
                                                                           " logits differ, ", nonfinite, " not finite")));
    }
    if (std::binary_search(prefills.begin(), prefills.end(), L)) {
      prefill_rows.push_back(pr);
      say(cat("prefill ", prefill_line(pr)));
      if (ab) {  // the same prompt again per arm and round, into a fresh state (warm, as the row above)
        std::vector<AbRow> rows(ab_arms.size());
        for (size_t i = 0; i < rows.size(); ++i) rows[i].arm = a.ab[i], rows[i].context = L;
        for (int round = 0; round < a.ab_rounds; ++round)
          for (size_t arm = 0; arm <= ab_arms.size(); ++arm) {  // the B arms, then A (arm == size)
            set_arm(arm < ab_arms.size() ? &ab_arms[arm] : nullptr);
            cache::SequenceState s(pool, L + margin);
            const double ms = 1e3 * timed_prefill(s);
            if (arm < ab_arms.size()) {
              rows[arm].b_ms.push_back(ms);
            } else {
              for (AbRow& r : rows) r.a_ms.push_back(ms);
            }
          }
        set_arm(nullptr);
        for (const AbRow& r : rows) {
          say(cat("ab ", ab_line(r)));
          ab_rows.push_back(r);
        }
      }
      if (profiler) {  // the same prompt again into a fresh state, profiled (the timed run above was not)
        cache::SequenceState again(pool, L + margin);
        profiler->start();
        prefill(again);  // (in chunks, as timed)
        say(cat("profile of the prefill of ", L, " tokens:\n", profiler->stop(1, cat("prefill (", L, " tokens)"), 0, a.profile_top)));
      }
    }
    if (!decode) continue;

    // Clone the prefilled state page by page into every sequence of the largest batch that fits.
    std::vector<cache::SequenceState> states;
    states.reserve(static_cast<size_t>(seqs));
    const std::vector<std::byte> header = first.export_header();
    for (int64_t i = 0; i < seqs; ++i) {
      states.emplace_back(pool, L + margin);
      for (int64_t p = 0; p < first.pages_used(); ++p) copy_view(first.page(p), states.back().page(p));
      states.back().import_header(header);
    }
    // The server's step while a prompt arrives: the prompt's chunk and B decode tokens in one eager forward.
    if (mixed_prompt > 0 && mixed_prompt <= L && mixed_decodes <= seqs) {
      MixedRow mr;
      mr.prompt = mixed_prompt;
      mr.decodes = mixed_decodes;
      mr.context = L;
      const std::span<const int64_t> chunk(prompt.data(), static_cast<size_t>(mixed_prompt));
      std::vector<int64_t> next(static_cast<size_t>(mixed_decodes));
      auto mixed_step = [&](bool with_decodes) {
        cache::SequenceState fresh(pool, L + margin);
        std::vector<model::StepSequence> batch{{&fresh, chunk, model::LogitsFor::last}};
        for (int64_t i = 0; with_decodes && i < mixed_decodes; ++i) {
          next[static_cast<size_t>(i)] = token(2000 + static_cast<uint64_t>(L), static_cast<uint64_t>(i), config.vocab_size);
          batch.push_back({&states[static_cast<size_t>(i)], std::span<const int64_t>(&next[static_cast<size_t>(i)], 1),
                           model::LogitsFor::last});
        }
        const auto t0 = std::chrono::steady_clock::now();
        (void)m.forward(batch);  // host logits: returns when the device is done
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      };
      mr.cold_seconds = mixed_step(true);
      mr.seconds = mixed_step(true);
      mr.prefill_alone = mixed_step(false);
      say(cat("mixed ", mixed_line(mr)));
      if (profiler) {
        profiler->start();
        (void)mixed_step(true);
        say(cat("profile of the mixed step (prompt ", mixed_prompt, " + ", mixed_decodes, " decodes at context ", L,
                "):\n", profiler->stop(1, cat("mixed step (", mixed_prompt, " + ", mixed_decodes, ")"), config.num_layers, a.profile_top)));
      }
      mixed_rows.push_back(mr);
    }
    std::vector<int64_t> fitting;
    for (int64_t b : batches) {
      if (b <= seqs) {
        fitting.push_back(b);
      } else {
        DecodeRow r;
        r.batch = b;
        r.context = L;
        r.note = cat("refused: ", b, " states of ", L + margin, " tokens need ",
                     static_cast<double>(b * pages_per_seq * layout->page_bytes()) / (1 << 30), " GiB, ",
                     static_cast<double>(avail) / (1 << 30), " GiB free");
        decode_rows.push_back(r);
        say(cat("decode ", decode_line(r)));
      }
    }
    if (fitting.empty()) continue;
    engine::DecodeGraphOptions go;
    go.buckets = fitting;
    go.max_tokens = layout->max_tokens();
    go.tokens_per_page = layout->tokens_per_page();
    go.max_queries = a.speculative + 1;
    // (Held so that --ab can drop it first: its tensors live in the arena the arms' graphs reallocate.)
    std::optional<engine::DecodeGraphs> graphs_held;
    engine::DecodeGraphs& graphs = graphs_held.emplace(m, go);
    graphs.prepare();
    std::vector<int64_t> ids(static_cast<size_t>(seqs));
    uint64_t step_no = 0;
    // The decode step of the first B sequences on `g`'s graphs (the rows below, and --ab's arms).
    auto decode_step = [&](engine::DecodeGraphs& g, int64_t B, Tensor& hold) {
      std::vector<model::StepSequence> batch;
      for (int64_t i = 0; i < B; ++i)
        batch.push_back({&states[static_cast<size_t>(i)], std::span<const int64_t>(&ids[static_cast<size_t>(i)], 1),
                         model::LogitsFor::last});
      return [&g, &hold, &ids, &step_no, batch = std::move(batch), B, L, vocab = config.vocab_size] {
        // A fresh random token per sequence and step: the sequences route differently although their
        // states are copies.
        for (int64_t i = 0; i < B; ++i)
          ids[static_cast<size_t>(i)] =
              token(1000 + static_cast<uint64_t>(L), step_no * 4096 + static_cast<uint64_t>(i), vocab);
        ++step_no;
        (void)g.forward_device(batch, hold);
      };
    };
    for (int64_t B : fitting) {
      Tensor hold;
      const auto step = decode_step(graphs, B, hold);
      const uint64_t eager_before = graphs.stats().eager_total();
      const app::StepTiming t = app::time_steps(a.device, step, a.warmup, a.steps);
      DecodeRow r;
      r.batch = B;
      r.context = L;
      r.step_ms = t.median_us / 1e3;
      r.min_ms = t.min_us / 1e3;
      r.max_ms = t.max_us / 1e3;
      r.tokens_s = static_cast<double>(B) / (r.step_ms / 1e3);
      r.bytes = model::decode_step_bytes(placed.sizes, config, B);
      r.gbs = r.bytes / (r.step_ms / 1e3) / 1e9;
      r.of_copy = r.gbs / copy_gbs;
      if (graphs.stats().eager_total() != eager_before)
        r.note = m.device() == Device::cpu ? "(eager: CPU)" : "(EAGER: " + graphs.disabled_reason() + ")";
      decode_rows.push_back(r);
      say(cat("decode ", decode_line(r)));
      if (a.speculative > 0) {  // the verify step of the same batch: k + 1 fresh tokens a sequence
        const int64_t q = a.speculative + 1;
        std::vector<std::vector<int64_t>> vids(static_cast<size_t>(B), std::vector<int64_t>(static_cast<size_t>(q)));
        std::vector<model::StepSequence> vb;
        for (int64_t i = 0; i < B; ++i)
          vb.push_back({&states[static_cast<size_t>(i)], vids[static_cast<size_t>(i)], model::LogitsFor::all});
        auto verify = [&] {
          for (int64_t i = 0; i < B; ++i)
            for (int64_t t = 0; t < q; ++t)
              vids[static_cast<size_t>(i)][static_cast<size_t>(t)] =
                  token(2000 + static_cast<uint64_t>(L), step_no * 4096 + static_cast<uint64_t>(i * q + t), config.vocab_size);
          ++step_no;
          (void)graphs.forward_device(vb, hold);
        };
        const uint64_t verify_eager_before = graphs.stats().eager_total();
        const app::StepTiming vt = app::time_steps(a.device, verify, a.warmup, a.steps);
        VerifyRow v;
        v.batch = B, v.context = L, v.tokens = q, v.step_ms = vt.median_us / 1e3, v.decode_ms = r.step_ms;
        if (graphs.stats().eager_total() != verify_eager_before)
          v.note = m.device() == Device::cpu ? "(eager: CPU)" : "(EAGER: " + graphs.disabled_reason() + ")";
        verify_rows.push_back(v);
        say(cat("verify ", verify_line(v)));
        if (m.has_mtp()) {
          if (!speculator || speculator->max_sequences() < B)
            speculator = std::make_unique<model::Speculator>(m, *layout, static_cast<int>(fitting.back()));
          // The trunk's verify steps replay this context's graphs (returning streams and record), as the server's do.
          speculator->set_trunk_step([&](std::span<const model::StepSequence> steps, bool want_record, bool on_device,
                                         model::TrunkRows& out, Tensor& hold) {
            if (on_device) return graphs.forward_trunk_device(steps, want_record, out, hold);
            hold = graphs.forward_trunk(steps, want_record, out);
            return hold.view();
          });
          speculator->set_draft_step([&](std::span<const model::Model::MtpStep> rows) { return graphs.forward_mtp(rows); });
          std::vector<model::DraftSequence> drafts;
          for (int64_t i = 0; i < B; ++i)  // greedy drafts: the argmax where the logits are, as the server's greedy requests
            drafts.push_back({&states[static_cast<size_t>(i)], ids[static_cast<size_t>(i)], static_cast<int>(a.speculative),
                              true});
          std::vector<int64_t> kept(static_cast<size_t>(B));
          for (int64_t i = 0; i < B; ++i) kept[static_cast<size_t>(i)] = i % q + 1;
          std::vector<ops::SampleRowSpec> verdict_specs;
          std::vector<ops::SampledRow> verdict_rows;
          auto round = [&] {
            speculator->draft(drafts, [&](size_t, int, std::span<const float> row) { return ops::argmax(row); });
            for (int64_t i = 0; i < B; ++i) {
              vids[static_cast<size_t>(i)][0] = drafts[static_cast<size_t>(i)].last;
              const std::span<const int64_t> d = speculator->drafts(static_cast<size_t>(i));
              std::copy(d.begin(), d.end(), vids[static_cast<size_t>(i)].begin() + 1);
            }
            // As the engine verifies greedy requests: the logits stay on the device, each row's choice is taken there
            // (ops::sample_rows); a host model's come back (it samples on the host).
            if (m.device() == Device::cpu) {
              (void)speculator->verify(vb);
            } else {
              Tensor hold;
              const TensorView logits = speculator->verify_device(vb, hold);
              verdict_specs.assign(static_cast<size_t>(logits.dim(0)), {});
              for (auto& spec : verdict_specs) spec.params.temperature = 0.0f;
              verdict_rows.resize(verdict_specs.size());
              ops::sample_rows(m.context(), logits, verdict_specs, verdict_rows);
            }
            speculator->settle(kept);
            for (int64_t i = 0; i < B; ++i)
              drafts[static_cast<size_t>(i)].last = token(3000 + static_cast<uint64_t>(L), step_no * 4096 + static_cast<uint64_t>(i), config.vocab_size);
            ++step_no;
          };
          const app::StepTiming rt = app::time_steps(a.device, round, a.warmup, a.steps);
          auto draft_only = [&] {
            speculator->draft(drafts, [&](size_t, int, std::span<const float> row) { return ops::argmax(row); });
          };
          const app::StepTiming dt = app::time_steps(a.device, draft_only, a.warmup, a.steps);
          RoundRow rr;
          rr.batch = B, rr.context = L, rr.k = a.speculative, rr.round_ms = rt.median_us / 1e3, rr.decode_ms = r.step_ms;
          rr.draft_ms = dt.median_us / 1e3;
          round_rows.push_back(rr);
          say(cat("round ", round_line(rr)));
          // The round's kernels and the GPU's busy share (what is launch-bound in drafting, rollback, catch-up).
          if (profiler && std::find(a.profile_batches.begin(), a.profile_batches.end(), B) != a.profile_batches.end()) {
            profiler->start();
            for (int i = 0; i < a.steps; ++i) round();
            say(cat("profile of the MTP round at batch ", B, ", context ", L, ":\n",
                    profiler->stop(a.steps, cat("MTP round (batch ", B, ", context ", L, ", k ", a.speculative, ")"),
                                   config.num_layers, a.profile_top)));
          }
        }
      }
      if (profiler && std::find(a.profile_batches.begin(), a.profile_batches.end(), B) != a.profile_batches.end()) {
        profiler->start();
        for (int i = 0; i < a.steps; ++i) step();
        say(cat("profile at batch ", B, ", context ", L, ":\n",
                profiler->stop(a.steps, cat("decode step (batch ", B, ", context ", L, ")"), config.num_layers, a.profile_top)));
      }
    }
    if (auto* g = m.context().step_graphs()) g->drop_all();
    // --ab: the decode rows again, every B arm then arm A per round, each on graphs recorded for it.
    if (ab) {
      graphs_held.reset();  // before an arm's graphs reallocate the arena its tensors live in
      // rows[arm * fitting.size() + bi]: B arm `arm`, batch fitting[bi]
      std::vector<AbRow> rows(ab_arms.size() * fitting.size());
      for (size_t arm = 0; arm < ab_arms.size(); ++arm)
        for (size_t bi = 0; bi < fitting.size(); ++bi) {
          AbRow& r = rows[arm * fitting.size() + bi];
          r.arm = a.ab[arm], r.batch = fitting[bi], r.context = L;
        }
      for (int round = 0; round < a.ab_rounds; ++round)
        for (size_t arm = 0; arm <= ab_arms.size(); ++arm) {  // the B arms, then A (arm == size)
          const bool is_a = arm == ab_arms.size();
          set_arm(is_a ? nullptr : &ab_arms[arm]);
          engine::DecodeGraphs ab_graphs(m, go);
          ab_graphs.prepare();
          for (size_t bi = 0; bi < fitting.size(); ++bi) {
            Tensor hold;
            const auto step = decode_step(ab_graphs, fitting[bi], hold);
            const uint64_t eager_before = ab_graphs.stats().eager_total();
            const app::StepTiming t = app::time_steps(a.device, step, a.warmup, a.steps);
            const bool eager = ab_graphs.stats().eager_total() != eager_before && m.device() != Device::cpu;
            for (size_t b = 0; b < ab_arms.size(); ++b) {
              if (!is_a && b != arm) continue;
              AbRow& r = rows[b * fitting.size() + bi];
              (is_a ? r.a_ms : r.b_ms).push_back(t.median_us / 1e3);
              if (eager)
                r.note = cat("(EAGER in arm ", is_a ? "A" : "B", ": ", ab_graphs.disabled_reason(), ")");
            }
          }
          if (auto* g = m.context().step_graphs()) g->drop_all();
        }
      set_arm(nullptr);
      for (const AbRow& r : rows) {
        say(cat("ab ", ab_line(r)));
        ab_rows.push_back(r);
      }
    }
  }

  // Each prefill GEMM at the longest prompt, against the library's rate on its shape (same run).
  const int64_t gemm_tokens = prefills.back();
  const std::vector<app::GemmRate> gemms = app::prefill_gemm_rates(m, a.device, gemm_tokens);
  auto gemm_line = [](const app::GemmRate& g) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "| %s | %.1f | %.0f | %.1f | %.0f | %.0f%% |", g.what.c_str(), g.op_us,
                  g.flops / (g.op_us * 1e6), g.library_us, g.flops / (g.library_us * 1e6), 100.0 * g.library_us / g.op_us);
    return std::string(buf);
  };
  const char* kGemmHeader = "| product | op us | op TFLOP/s | library us | library TFLOP/s | of library |\n|---|---:|---:|---:|---:|---:|";
  if (!gemms.empty()) {
    say(cat("prefill GEMMs at ", gemm_tokens, " tokens (op as the model runs it vs the library's own product on the "
            "same shape: cuBLAS bf16, f32 for exact weights, grouped bf16 on expanded experts):"));
    say(kGemmHeader);
    for (const app::GemmRate& g : gemms) say(gemm_line(g));
  }

  say(cat("\n== bench-step results (", a.config, ", ", a.experts, " experts, kv ", a.kv_mode, ", activations ",
          activations, ", ", a.device, "; commit ",
          commit, ", ", date, ")"));
  say(placed.sharing.shared() ? cat("SHARED EXPERT STORAGE: ", placed.sharing.description)
                              : cat("no shared storage: ", placed.sharing.description));
  say(cat("copy ", static_cast<int64_t>(copy_gbs), " GB/s; GEMM ", gemm_n, "^3 (tern linear): bf16 ", gemm_bf16,
          " / fp8 ", gemm_fp8, " TFLOP/s"));
  say(kDecodeHeader);
  for (const DecodeRow& r : decode_rows) say(decode_line(r));
  if (!verify_rows.empty()) {
    say(kVerifyHeader);
    for (const VerifyRow& v : verify_rows) say(verify_line(v));
  }
  if (a.speculative > 0 && !m.has_mtp()) say("MTP rounds: not measured (the model has no MTP layer)");
  if (!round_rows.empty()) {
    say(kRoundHeader);
    for (const RoundRow& r : round_rows) say(round_line(r));
    // The auto threshold from the first context's rows.
    const double L = a.speculative_acceptance > 0 ? a.speculative_acceptance : kDefaultAcceptance[a.speculative];
    app::SpeculativeThreshold t;
    t.device = app::speculative_device_key(a.device);
    t.model = app::speculative_model_key(m);
    t.k = static_cast<int>(a.speculative);
    t.acceptance_length = L;
    t.min_gain = a.speculative_min_gain;
    for (const RoundRow& r : round_rows)
      if (r.context == round_rows.front().context) t.ratios.emplace_back(r.batch, r.ratio());
    t.max_batch = app::threshold_from_ratios(t.ratios, L, t.min_gain);
    t.measured = cat(date, ", commit ", commit, ", context ", round_rows.front().context);
    say(cat("speculative auto threshold at acceptance length ", L, " and a least gain of ", t.min_gain, "x: ",
            t.max_batch > 0 ? cat("draft while at most ", t.max_batch, " sequences decode") : std::string("never pays"),
            " (context ", round_rows.front().context, "; the largest batch before the round costs more than L / ",
            t.min_gain, " decode steps)"));
    if (a.save_speculative_threshold) {
      app::save_speculative_threshold(t);
      say(cat("saved to ", app::speculative_threshold_path(), " for ", t.device, ", ", t.model));
    }
  }
  TERN_CHECK(!a.save_speculative_threshold || !round_rows.empty(),
             "--save-speculative-threshold: no MTP round was measured (needs --speculative k and a model with an MTP "
             "layer)");
  if (!ab_rows.empty()) {
    say(cat("A/B (--ab: each B arm's switches against A, the start-up values; median over ", a.ab_rounds,
            " rounds of each arm's median decode step, or of its warm prefill; negative: B faster):"));
    say(kAbHeader);
    for (const AbRow& r : ab_rows) say(ab_line(r));
  }
  say(kPrefillHeader);
  for (const PrefillRow& r : prefill_rows) say(prefill_line(r));
  if (!mixed_rows.empty()) {
    say(kMixedHeader);
    for (const MixedRow& r : mixed_rows) say(mixed_line(r));
  }
  if (!gemms.empty()) {
    say(cat("prefill GEMMs at ", gemm_tokens, " tokens:"));
    say(kGemmHeader);
    for (const app::GemmRate& g : gemms) say(gemm_line(g));
  }

  if (!a.json.empty()) {
    nlohmann::json j;
    j["commit"] = commit;
    j["date"] = date;
    j["config"] = a.config;
    j["experts"] = a.experts;
    j["kv_mode"] = a.kv_mode;
    j["activations"] = activations;
    j["device"] = a.device;
    j["shared_expert_storage"] = placed.sharing.shared();
    j["sharing"] = placed.sharing.description;
    j["copy_gbs"] = copy_gbs;
    j["gemm_tflops"] = {{"n", gemm_n}, {"bf16", gemm_bf16}, {"fp8", gemm_fp8}};
    for (const DecodeRow& r : decode_rows)
      j["decode"].push_back({{"batch", r.batch}, {"context", r.context}, {"step_ms", r.step_ms}, {"min_ms", r.min_ms},
                             {"max_ms", r.max_ms}, {"tokens_per_s", r.tokens_s}, {"bytes_per_step", r.bytes},
                             {"gbs", r.gbs}, {"of_copy", r.of_copy}, {"note", r.note}});
    for (const VerifyRow& v : verify_rows)
      j["verify"].push_back({{"batch", v.batch}, {"context", v.context}, {"tokens_per_sequence", v.tokens},
                             {"step_ms", v.step_ms}, {"decode_step_ms", v.decode_ms}, {"note", v.note}});
    for (const RoundRow& r : round_rows)
      j["rounds"].push_back({{"batch", r.batch}, {"context", r.context}, {"k", r.k}, {"round_ms", r.round_ms},
                             {"draft_ms", r.draft_ms}, {"decode_step_ms", r.decode_ms}});
    for (const PrefillRow& r : prefill_rows)
      j["prefill"].push_back({{"tokens", r.tokens}, {"seconds", r.seconds}, {"tokens_per_s", r.tokens_s},
                              {"flops", r.flops}, {"tflops", r.tflops}, {"of_gemm", r.of_gemm},
                              {"first_run_seconds", r.cold_seconds}, {"chunks", r.chunks}});
    for (const MixedRow& r : mixed_rows)
      j["mixed"].push_back({{"prompt", r.prompt}, {"decodes", r.decodes}, {"context", r.context},
                            {"seconds", r.seconds}, {"first_run_seconds", r.cold_seconds},
                            {"prompt_alone_seconds", r.prefill_alone}});
    for (const AbRow& r : ab_rows)
      j["ab"].push_back({{"switches", r.arm},
                         {"batch", r.batch},
                         {"context", r.context},
                         {"a_ms", r.a_ms},
                         {"b_ms", r.b_ms}});
    for (const app::GemmRate& g : gemms)
      j["prefill_gemms"].push_back({{"tokens", gemm_tokens}, {"what", g.what}, {"flops", g.flops}, {"op_us", g.op_us},
                                    {"library_us", g.library_us}});
    std::ofstream out(a.json);
    out << j.dump(2) << "\n";
    TERN_CHECK(out.good(), "--json: cannot write ", a.json);
  }
  return 0;
}

const bool registered = tern::tools::register_verb(
    {"bench-step", "Time the full-depth decode step (CUDA graphs) and prefill on a synthetic model",
     [](CLI::App& app) -> std::function<int()> {
       auto a = std::make_shared<Args>();
       app.add_option("--device", a->device, "cpu or cuda")->capture_default_str();
       app.add_option("--config", a->config, "full (V4-Flash) or tiny")->capture_default_str();
       app.add_option("--experts", a->experts, "routed expert format: mxfp4, nvfp4 or bf16")->capture_default_str();
       app.add_option("--kv-mode", a->kv_mode, "state rows: fp8 (DeepSeek's) or exact (f32)")->capture_default_str();
       app.add_option("--batches", a->batches, "decode batch sizes")->capture_default_str();
       app.add_option("--contexts", a->contexts, "context lengths of the decode rows (one real prefill each)")
           ->capture_default_str();
       app.add_option("--prefill", a->prefill, "prompt lengths of the prefill rows")->capture_default_str();
       app.add_option(
           "--ab", a->ab,
           "NAME=V[,NAME=V] (repeatable: one B arm each): after each context's decode rows, the batches "
           "again "
           "with these switches (the forward's, and on cuda the backend's: app::knob_names, listed in "
           "docs/bench-step.md and in the refusal of an unknown name) as arm B against the start-up values, "
           "alternating B and A; the warm prefill of each --prefill length too");
       app.add_option("--ab-rounds", a->ab_rounds, "rounds of every B arm then arm A (--ab)")
           ->check(CLI::Range(1, 100))
           ->capture_default_str();
       app.add_option("--prefill-chunk", a->prefill_chunk,
                      "prompts longer than this are prefilled in chunks of this many tokens (one forward each)")
           ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
           ->capture_default_str();
       app.add_option("--steps", a->steps, "timed decode steps per row (median reported)")->capture_default_str();
       app.add_option("--warmup", a->warmup, "untimed decode steps before each row")->capture_default_str();
       app.add_flag("--profile", a->profile, "GPU profile (CUPTI) of the prefills and of the decode steps at the --profile-batches");
       app.add_option("--profile-batches", a->profile_batches, "batches profiled with --profile")
           ->delimiter(',')
           ->capture_default_str();
       app.add_option("--profile-top", a->profile_top, "kernels listed by each --profile report")
           ->check(CLI::Range(1, 1000))
           ->capture_default_str();
       app.add_option("--mixed", a->mixed,
                      "PROMPT:DECODES: also time a server-like step, a new prompt with DECODES decode tokens at each "
                      "decode context (eager; profiled with --profile)");
       app.add_option("--speculative", a->speculative,
                      "k (1 to 3): also time the MTP verify step (k + 1 tokens a sequence, its own CUDA graph) at each "
                      "decode batch, against the decode step, with the tokens/s it gives at acceptance lengths 1.8, 2.5 "
                      "and 3.0 (0: off)")
           ->capture_default_str();
       app.add_option("--speculative-acceptance", a->speculative_acceptance,
                      "acceptance length the auto threshold is taken at (default by k: 1.8, 2.3, 2.5)");
       app.add_option("--speculative-min-gain", a->speculative_min_gain,
                      "least predicted gain (acceptance length / round-to-decode ratio) at which the auto threshold "
                      "counts a batch as paying: the server adds costs the measured round leaves out (docs/mtp.md)")
           ->capture_default_str()
           ->check(CLI::Range(1.0, 10.0));
       app.add_flag("--save-speculative-threshold", a->save_speculative_threshold,
                    "save the measured auto threshold for `tern serve --speculative auto` on this device and model "
                    "shape (needs --speculative k and an MTP layer)");
       app.add_flag("--fill-check", a->fill_check,
                    "Check that the longest prompt's logits are the same bits with the activations NaN-filled and "
                    "zero-filled (no op reads an element it did not write)");
       app.add_option("--json", a->json, "also write the results as JSON to this file");
       app.add_option("--headroom-gib", a->headroom_gib,
                      "GPU memory kept free beyond the largest batch's states (activations, workspace, graphs)")
           ->capture_default_str();
       app.add_option("--seed", a->seed, "weights' seed")->capture_default_str();
       tern::tools::add_tune_options(app, a->tune);
       return [a] { return run(*a); };
     }});

}  // namespace
