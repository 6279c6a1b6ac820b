// Prefill then decode, for tests and `tern run`: plainly, or with MTP speculative decoding (greedy).
#include <chrono>

#include "model/v4_model.h"
#include "ops/elementwise.h"
#include "ops/sample.h"

namespace tern::model {

namespace {

using clock = std::chrono::steady_clock;

int64_t argmax_row(const Tensor& logits, int64_t row, int64_t vocab) {
  return ops::argmax({logits.data<float>() + row * vocab, static_cast<size_t>(vocab)});
}

// The MTP layer's rows of the positions whose next token is known: rows [0, n) of `streams` (the trunk's, from
// position `start`), next tokens `next`. Returns the logits of the last row (LogitsFor::last) and its out streams.
Model::MtpResult mtp_rows(Model& model, cache::SequenceState& state, int64_t start, const TensorView& streams,
                          std::span<const int64_t> next) {
  const Model::MtpStep step{&state, start, streams, next, LogitsFor::last};
  return model.mtp_forward({&step, 1});
}

// Speculative decoding with the MTP layer, greedy (GenerateOptions::speculative_tokens). Per round, with the state
// at position m (the token y = x_m sampled, not consumed) and the trunk's streams h_{m-1} (`carry`):
//   draft:  the MTP row of m - 1 (h_{m-1}, y) gives d_1; chained rows m .. m + k - 2 give d_2 .. d_k (their window
//           rows are speculative: the window is saved first and put back after the verify);
//   verify: one step of [y, d_1 .. d_k] at m .. m + k (the step tables: kMaxStepQueries), logits and streams of all;
//   accept: a = the drafts the target's greedy choices g_0 .. agree with; the round emits d_1 .. d_a, g_a;
//   roll back (a < k): the state's snapshot from before the verify is restored and [y, d_1 .. d_a]'s window rows and
//           compressor inputs, kept from the verify step, stored and refolded (Model::rollback_step);
//   catch up: the MTP rows of m .. m + a - 1 (next tokens d_1 .. d_a); m + a is the next round's first draft row.
GenerateResult generate_speculative(Model& model, cache::SequenceState& state, std::span<const int64_t> prompt,
                                    const GenerateOptions& o) {
  TERN_CHECK(model.has_mtp(), "generate: speculative decoding needs the MTP layer (the checkpoint has no mtp.0.*)");
  TERN_CHECK(o.temperature <= 0.0f, "generate: speculative decoding here is greedy (temperature 0); sampling with MTP "
             "is the serving engine's (engine/speculative.h)");
  const int64_t k = o.speculative_tokens, vocab = model.config().vocab_size;
  TERN_CHECK(k >= 1 && k + 1 <= Model::kMaxStepQueries, "generate: ", k, " speculative tokens (1 to ",
             Model::kMaxStepQueries - 1, ": a verify step brings k + 1 tokens a sequence)");
  GenerateResult result;
  const auto t0 = clock::now();
  const LogitsFor all = LogitsFor::all;
  // Prefill in chunks, the MTP layer catching up on every position whose next token is known.
  const auto chunk = static_cast<size_t>(o.prefill_chunk > 0 ? o.prefill_chunk : prompt.size());
  Tensor logits, carry;  // carry: the trunk streams [1, hc, D] of the last consumed position
  for (size_t begin = 0; begin < prompt.size(); begin += chunk) {
    const size_t n = std::min(chunk, prompt.size() - begin);
    const bool last = begin + n == prompt.size();
    const StepSequence step{&state, prompt.subspan(begin, n), last ? LogitsFor::last : LogitsFor::none};
    Tensor streams;
    logits = model.forward({&step, 1}, {&all, 1}, streams);
    if (!carry.empty()) mtp_rows(model, state, static_cast<int64_t>(begin) - 1, carry, prompt.subspan(begin, 1));
    if (n > 1) mtp_rows(model, state, static_cast<int64_t>(begin), streams.view().rows(0, n - 1), prompt.subspan(begin + 1, n - 1));
    carry = Tensor::copy_of(streams.view().rows(n - 1, n), streams.device());
  }
  const auto t1 = clock::now();
  if (o.before_decode) o.before_decode();
  const auto t2 = clock::now();
  const int mtp = model.mtp_layer();
  ops::Rng oracle_rng(o.seed ^ 0x5eedULL);
  int64_t y = argmax_row(logits, 0, vocab);
  result.tokens.push_back(y);
  int64_t m = static_cast<int64_t>(prompt.size());  // position of y
  while (y != o.stop_token && static_cast<int64_t>(result.tokens.size()) < o.max_new_tokens) {
    const int64_t kr = std::min(k, o.max_new_tokens - static_cast<int64_t>(result.tokens.size()));
    // Draft.
    std::vector<int64_t> d;
    Model::MtpResult r = mtp_rows(model, state, m - 1, carry, {&y, 1});
    if (o.keep_first_draft_logits) {
      result.first_draft_positions.push_back(m - 1);
      result.first_draft_logits.emplace_back(r.logits.data<float>(), r.logits.data<float>() + vocab);
    }
    Tensor saved_window;
    if (kr > 1) saved_window = Tensor::copy_of(state.ring(mtp), state.device());
    for (int64_t j = 1; j <= kr; ++j) {
      int64_t draft = argmax_row(r.logits, 0, vocab);
      const size_t at = result.tokens.size() + static_cast<size_t>(j) - 1;  // index of the token d_j stands for
      if (at < o.draft_oracle.size()) {
        draft = o.draft_oracle[at];
        if (oracle_rng.uniform() >= o.oracle_accept) draft = (draft + 1) % vocab;  // a token the target rejects
      }
      d.push_back(draft);
      if (j < kr) r = mtp_rows(model, state, m + j - 1, r.streams, {&d.back(), 1});
    }
    // Verify.
    std::vector<int64_t> v = {y};
    v.insert(v.end(), d.begin(), d.end());
    const cache::Snapshot before = state.snapshot();
    const StepSequence verify{&state, v, LogitsFor::all};
    Tensor streams;
    Model::StepRecord record;
    const Tensor target = model.forward({&verify, 1}, {&all, 1}, streams, false, &record);
    int64_t a = 0;
    while (a < kr && d[static_cast<size_t>(a)] == argmax_row(target, a, vocab)) ++a;
    const int64_t next = argmax_row(target, a, vocab);
    ++result.rounds, result.drafts += kr, result.accepted += a;
    // Roll back what the rejected drafts left: the kept tokens' rows and compressor inputs from the verify step
    // (their streams too: a token's activations do not depend on the tokens after it).
    if (a < kr) model.rollback_step(state, before, record, 0, a + 1);
    if (!saved_window.empty()) ops::copy(saved_window, state.ring(mtp));
    // Emit, catch the MTP layer up on the kept positions, and carry the last one.
    const size_t emitted_from = result.tokens.size();
    for (int64_t j = 0; j < a && static_cast<int64_t>(result.tokens.size()) < o.max_new_tokens; ++j)
      result.tokens.push_back(d[static_cast<size_t>(j)]);
    if (static_cast<int64_t>(result.tokens.size()) < o.max_new_tokens) result.tokens.push_back(next);
    if (a > 0) mtp_rows(model, state, m, streams.view().rows(0, a), std::span<const int64_t>(d).subspan(0, static_cast<size_t>(a)));
    carry = Tensor::copy_of(streams.view().rows(a, a + 1), streams.device());
    m += a + 1;
    y = next;
    // A stop token among this round's tokens ends the output there.
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
