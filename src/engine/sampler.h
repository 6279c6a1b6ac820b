// Turns one row of logits into the next token: penalties, temperature, top-k, top-p, min-p, a seeded
// draw, and the logprobs the client asked for. Deterministic for a given (logits, params, rng state):
// the result of a request never depends on what else is in the batch.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/request.h"

namespace tern::engine {

// Token counts a request's penalties look at.
struct TokenHistory {
  std::unordered_map<int32_t, int32_t> output_counts;  // presence / frequency
  std::vector<uint8_t> seen;                            // prompt or output, for repetition (by id)
  void add_prompt(std::span<const int32_t> tokens, int64_t vocab);
  void add_output(int32_t token, int64_t vocab);
};

// The uniform numbers a sample takes from the request's generator: none for greedy, else one
// (std::uniform_real_distribution<double>(0, 1)), drawn before anything else. The host sampler and a
// device sampler (ModelRunner::forward_sample) both take them from here, so a request's generator ends
// a step in the same state whichever samples it.
inline constexpr int kMaxUniformsPerSample = 1;
int uniforms_per_sample(const SamplingParams& params);
// Draws uniforms_per_sample(params) numbers into `out` (size >= kMaxUniformsPerSample); returns the count.
int draw_uniforms(const SamplingParams& params, std::mt19937_64& rng, std::span<double> out);

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;
};

class Sampler {
 public:
  // `logits` is one row of vocab floats; `scratch` is reused between calls (one per engine thread).
  SampleResult sample(std::span<const float> logits, const SamplingParams& params, const TokenHistory& history,
                      std::mt19937_64& rng);
  // The same with the uniforms already drawn (draw_uniforms): sample() is draw_uniforms + this.
  SampleResult sample_drawn(std::span<const float> logits, const SamplingParams& params,
                            const TokenHistory& history, std::span<const double> uniforms);
  // The distribution sample_drawn draws its token from (penalties, temperature, top-k, top-p, min-p): out[vocab],
  // zero outside the candidates, the candidates' weights over their sum; for greedy params one-hot on the token
  // sample_drawn picks. What speculative decoding's verdict takes as p and q (engine/speculative.h).
  void distribution(std::span<const float> logits, const SamplingParams& params, const TokenHistory& history,
                    std::span<float> out);
  // `token` as chosen from `logits` some other way (speculative decoding's kept drafts and verdicts): the logprob
  // and alternatives sample_drawn would report for it under `params`.
  SampleResult describe(std::span<const float> logits, int32_t token, const SamplingParams& params);

 private:
  void apply_penalties(const SamplingParams& p, const TokenHistory& h);
  int32_t draw(const SamplingParams& p, double uniform);
  int32_t draw_unsorted(const SamplingParams& p, double z, double uniform);
  double unsorted_total(const SamplingParams& p, double z) const;
  int64_t sorted_candidates(const SamplingParams& p, double z);
  void fill_logprobs(std::span<const float> logits, int top_n, SampleResult& out);

  std::vector<float> work_;
  std::vector<int32_t> order_;
};

// Index of the largest value (the lowest index among ties).
int32_t argmax(std::span<const float> v);

}  // namespace tern::engine
