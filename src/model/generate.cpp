// Prefill then decode, for tests and `tern run`.
#include <chrono>

#include "model/v4_model.h"
#include "ops/sample.h"

namespace tern::model {

GenerateResult generate(Model& model, cache::SequenceState& state, std::span<const int64_t> prompt,
                        const GenerateOptions& options) {
  TERN_CHECK(!prompt.empty(), "generate: empty prompt");
  using clock = std::chrono::steady_clock;
  GenerateResult result;
  ops::Rng rng(options.seed);
  const auto t0 = clock::now();
  const auto chunk = static_cast<size_t>(options.prefill_chunk > 0 ? options.prefill_chunk : prompt.size());
  Tensor logits;
  for (size_t begin = 0; begin < prompt.size(); begin += chunk) {
    const size_t n = std::min(chunk, prompt.size() - begin);
    const bool last = begin + n == prompt.size();
    const StepSequence step{&state, prompt.subspan(begin, n), last ? LogitsFor::last : LogitsFor::none};
    logits = model.forward({&step, 1});
  }
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
