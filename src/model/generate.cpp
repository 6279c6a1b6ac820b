// Prefill then decode, for tests and `tern run`: plainly, or with MTP speculative decoding (greedy).
#include <chrono>
#include <functional>

#include "model/speculator.h"
#include "model/v4_model.h"
#include "ops/elementwise.h"
#include "ops/sample.h"

namespace tern::model {

namespace {

using clock = std::chrono::steady_clock;

int64_t argmax_row(const Tensor& logits, int64_t row, int64_t vocab) {
  return ops::argmax({logits.data<float>() + row * vocab, static_cast<size_t>(vocab)});
}

// The prompt in chunks of `chunk` tokens (0: one chunk), each a step `run` takes; the last chunk's logits (its last
// row).
Tensor prefill(cache::SequenceState& state, std::span<const int64_t> prompt, int64_t chunk_tokens,
               const std::function<Tensor(const StepSequence&)>& run) {
  const auto chunk = static_cast<size_t>(chunk_tokens > 0 ? chunk_tokens : static_cast<int64_t>(prompt.size()));
  Tensor logits;
  for (size_t begin = 0; begin < prompt.size(); begin += chunk) {
    const size_t n = std::min(chunk, prompt.size() - begin);
    const bool last = begin + n == prompt.size();
    logits = run({&state, prompt.subspan(begin, n), last ? LogitsFor::last : LogitsFor::none});
  }
  return logits;
}

// Speculative decoding with the MTP layer, greedy (GenerateOptions::speculative_tokens), one sequence through
// model/speculator.h: prefill chunks keep the MTP layer caught up; each round drafts k tokens, verifies [y, drafts] in
// one step, keeps the drafts the target's greedy choices agree with and the target's next token, and settles (the
// rejected tokens rolled back exactly, the kept ones caught up).
GenerateResult generate_speculative(Model& model, cache::SequenceState& state, std::span<const int64_t> prompt,
                                    const GenerateOptions& o) {
  TERN_CHECK(model.has_mtp(), "generate: speculative decoding needs the MTP layer (the checkpoint has no mtp.0.*)");
  TERN_CHECK(o.temperature <= 0.0f, "generate: speculative decoding here is greedy (temperature 0); sampling with MTP "
             "is the serving engine's (engine/speculative.h)");
  const int64_t k = o.speculative_tokens, vocab = model.config().vocab_size;
  TERN_CHECK(k >= 1 && k <= Speculator::kMaxDrafts, "generate: ", k, " speculative tokens (1 to ",
             Speculator::kMaxDrafts, ": a verify step brings k + 1 tokens a sequence)");
  Speculator spec(model, state.layout(), 1);
  GenerateResult result;
  const auto t0 = clock::now();
  const Tensor logits =
      prefill(state, prompt, o.prefill_chunk, [&](const StepSequence& s) { return spec.forward({&s, 1}); });
  const auto t1 = clock::now();
  if (o.before_decode) o.before_decode();
  const auto t2 = clock::now();
  ops::Rng oracle_rng(o.seed ^ 0x5eedULL);
  int64_t y = argmax_row(logits, 0, vocab);
  result.tokens.push_back(y);
  while (y != o.stop_token && static_cast<int64_t>(result.tokens.size()) < o.max_new_tokens) {
    const int64_t kr = std::min(k, o.max_new_tokens - static_cast<int64_t>(result.tokens.size()));
    // Draft (the oracle, when given, replaces the MTP layer's choices: benchmarks only).
    const DraftSequence draft{&state, y, static_cast<int>(kr)};
    std::vector<int64_t> d;
    spec.draft({&draft, 1}, [&](size_t, int j, std::span<const float> row) {
      if (j == 0 && o.keep_first_draft_logits) {
        result.first_draft_positions.push_back(state.position() - 1);
        result.first_draft_logits.emplace_back(row.begin(), row.end());
      }
      int64_t token = ops::argmax(row);
      const size_t at = result.tokens.size() + static_cast<size_t>(j);  // index of the token d_{j+1} stands for
      if (at < o.draft_oracle.size()) {
        token = o.draft_oracle[at];
        if (oracle_rng.uniform() >= o.oracle_accept) token = (token + 1) % vocab;  // a token the target rejects
      }
      d.push_back(token);
      return token;
    });
    // Verify, accept, settle.
    std::vector<int64_t> v = {y};
    v.insert(v.end(), d.begin(), d.end());
    const StepSequence verify{&state, v, LogitsFor::all};
    const Tensor target = spec.verify({&verify, 1});
    int64_t a = 0;
    while (a < kr && d[static_cast<size_t>(a)] == argmax_row(target, a, vocab)) ++a;
    const int64_t next = argmax_row(target, a, vocab);
    ++result.rounds, result.drafts += kr, result.accepted += a;
    const int64_t kept = a + 1;
    spec.settle({&kept, 1});
    // Emit; a stop token among this round's tokens ends the output there.
    const size_t emitted_from = result.tokens.size();
    for (int64_t j = 0; j < a && static_cast<int64_t>(result.tokens.size()) < o.max_new_tokens; ++j)
      result.tokens.push_back(d[static_cast<size_t>(j)]);
    if (static_cast<int64_t>(result.tokens.size()) < o.max_new_tokens) result.tokens.push_back(next);
    y = next;
    for (size_t i = emitted_from; i < result.tokens.size(); ++i)
      if (result.tokens[i] == o.stop_token) {
        result.tokens.resize(i + 1);
        y = o.stop_token;
        break;
      }
  }
  const auto t3 = clock::now();
  if (o.after_decode) o.after_decode();
  result.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  result.decode_seconds = std::chrono::duration<double>(t3 - t2).count();
  return result;
}

}  // namespace

GenerateResult generate(Model& model, cache::SequenceState& state, std::span<const int64_t> prompt,
                        const GenerateOptions& options) {
  TERN_CHECK(!prompt.empty(), "generate: empty prompt");
  if (options.speculative_tokens > 0) return generate_speculative(model, state, prompt, options);
  GenerateResult result;
  ops::Rng rng(options.seed);
  const auto t0 = clock::now();
  Tensor logits =
      prefill(state, prompt, options.prefill_chunk, [&](const StepSequence& s) { return model.forward({&s, 1}); });
  const auto t1_prefill = clock::now();
  if (options.before_decode) options.before_decode();
  const auto t1 = clock::now();
  const int64_t vocab = model.config().vocab_size;
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    const int64_t token =
        ops::sample({logits.data<float>(), static_cast<size_t>(vocab)}, options.temperature, rng);
    result.tokens.push_back(token);
    if (token == options.stop_token || i + 1 == options.max_new_tokens) break;
    const StepSequence step{&state, {&result.tokens.back(), 1}, LogitsFor::last};
    logits = options.decode_forward ? options.decode_forward({&step, 1}) : model.forward({&step, 1});
  }
  const auto t2 = clock::now();
  if (options.after_decode) options.after_decode();
  result.prefill_seconds = std::chrono::duration<double>(t1_prefill - t0).count();
  result.decode_seconds = std::chrono::duration<double>(t2 - t1).count();
  return result;
}

std::vector<int64_t> greedy_generate(Model& model, std::span<const int64_t> prompt, int64_t max_new_tokens) {
  cache::SequenceState state = model.new_state(static_cast<int64_t>(prompt.size()) + max_new_tokens);
  GenerateOptions options;
  options.max_new_tokens = max_new_tokens;
  return generate(model, state, prompt, options).tokens;
}

}  // namespace tern::model
