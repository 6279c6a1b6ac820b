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

 private:
  void apply_penalties(const SamplingParams& p, const TokenHistory& h);
  int32_t draw(const SamplingParams& p, std::mt19937_64& rng);
  int32_t draw_unsorted(const SamplingParams& p, double z, std::mt19937_64& rng);
  int64_t sorted_candidates(const SamplingParams& p, double z);
  void fill_logprobs(std::span<const float> logits, int top_n, SampleResult& out);

  std::vector<float> work_;
  std::vector<int32_t> order_;
};

// Index of the largest value (the lowest index among ties).
int32_t argmax(std::span<const float> v);

}  // namespace tern::engine
