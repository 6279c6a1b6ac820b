#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "ops/sampling_math.h"

namespace tern::engine {

void TokenHistory::add_prompt(std::span<const int32_t> tokens, int64_t vocab) {
  seen.resize(static_cast<size_t>(vocab), 0);
  for (int32_t t : tokens)
    if (t >= 0 && t < vocab) seen[t] = 1;
}

void TokenHistory::add_output(int32_t token, int64_t vocab) {
  seen.resize(static_cast<size_t>(vocab), 0);
  ++output_counts[token];
  if (token >= 0 && token < vocab) seen[token] = 1;
}

int uniforms_per_sample(const SamplingParams& params) { return params.greedy() ? 0 : 1; }

int draw_uniforms(const SamplingParams& params, std::mt19937_64& rng, std::span<double> out) {
  const int n = uniforms_per_sample(params);
  TERN_CHECK(out.size() >= static_cast<size_t>(n), "draw_uniforms: room for ", out.size(), " of ", n, " numbers");
  for (int i = 0; i < n; ++i) out[i] = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  return n;
}

namespace {

// work[i] = exp((work[i] - max_l) * inv_t), summed in index order (double). The exp is
// sampling::exp_weight (glibc's expf as built for FMA CPUs, shared with the CUDA kernel); compiled for
// FMA where the CPU has it, else through libm's fma (same bits, slower).
double exp_weights_body(std::span<float> work, float max_l, float inv_t) {
  double z = 0;
  for (float& l : work) {
    l = sampling::exp_weight(sampling::fmul(sampling::fsub(l, max_l), inv_t));  // unnormalised, max is 1
    z += l;
  }
  return z;
}
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("fma"))) double exp_weights_fma(std::span<float> work, float max_l, float inv_t) {
  double z = 0;
  for (float& l : work) {
    l = sampling::exp_weight(sampling::fmul(sampling::fsub(l, max_l), inv_t));
    z += l;
  }
  return z;
}
#endif
double exp_weights(std::span<float> work, float max_l, float inv_t) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has_fma = __builtin_cpu_supports("fma");
  if (has_fma) return exp_weights_fma(work, max_l, inv_t);
#endif
  return exp_weights_body(work, max_l, inv_t);
}

}  // namespace

int32_t argmax(std::span<const float> v) {
  int32_t best = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[best]) best = static_cast<int32_t>(i);
  return best;
}

void Sampler::apply_penalties(const SamplingParams& p, const TokenHistory& h) {
  if (p.repetition_penalty != 1.0f) {
    for (size_t t = 0; t < h.seen.size() && t < work_.size(); ++t) {
      if (!h.seen[t]) continue;
      work_[t] = sampling::repetition_penalised(work_[t], p.repetition_penalty);
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    for (const auto& [t, n] : h.output_counts) {
      if (t < 0 || static_cast<size_t>(t) >= work_.size()) continue;
      work_[t] = sampling::count_penalised(work_[t], p.presence_penalty, p.frequency_penalty, n);
    }
  }
}

// Draws from softmax(work_ / T) restricted by top-k, min-p and top-p. Candidates are visited in a
// fixed order (index order without top-k/top-p; else probability descending, index ascending on ties),
// so the draw is reproducible.
// The arithmetic is shared with the CUDA kernel (ops/sampling_math.h, kernels/sampling.cu): keep them in
// step.
int32_t Sampler::draw(const SamplingParams& p, double uniform) {
  const float inv_t = 1.0f / p.temperature;
  const float max_l = *std::max_element(work_.begin(), work_.end());
  const double z = exp_weights(work_, max_l, inv_t);
  if (p.top_k <= 0 && p.top_p >= 1.0f) return draw_unsorted(p, z, uniform);
  const int64_t n = sorted_candidates(p, z);
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += work_[order_[i]];
  const double u = uniform * total;
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    acc += work_[order_[i]];
    if (u < acc) return order_[i];
  }
  return order_[n - 1];
}

// The weight of draw_unsorted's candidates, the tokens with p >= min_p * p_max (p_max is 1 here): z, or their sum.
double Sampler::unsorted_total(const SamplingParams& p, double z) const {
  if (p.min_p <= 0.0f) return z;
  double total = 0;
  for (float w : work_)
    if (w >= p.min_p) total += w;
  return total;
}

// Without top-k / top-p no order is needed: an inverse-CDF scan in index order over the tokens with
// p >= min_p * p_max (p_max is 1 here).
int32_t Sampler::draw_unsorted(const SamplingParams& p, double z, double uniform) {
  const double u = uniform * unsorted_total(p, z);
  double acc = 0;
  int32_t last = 0;
  for (size_t i = 0; i < work_.size(); ++i) {
    if (work_[i] < p.min_p) continue;
    acc += work_[i];
    last = static_cast<int32_t>(i);
    if (u < acc) return last;
  }
  return last;
}

// Sorts only as far as the filters reach: the top-k, else a growing prefix until the top-p mass is
// covered; then min-p cuts the sorted prefix (the best token always stays).
int64_t Sampler::sorted_candidates(const SamplingParams& p, double z) {
  const auto vocab = static_cast<int64_t>(work_.size());
  auto by_prob = [&](int32_t a, int32_t b) { return work_[a] > work_[b] || (work_[a] == work_[b] && a < b); };
  order_.resize(static_cast<size_t>(vocab));
  std::iota(order_.begin(), order_.end(), 0);
  int64_t n = vocab;
  int64_t k = std::min<int64_t>(n, 256);
  if (p.top_k > 0) {  // top-p then applies to the renormalised top-k (as vLLM and HF do)
    n = k = std::min<int64_t>(p.top_k, vocab);
    std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), by_prob);
    z = 0;
    for (int64_t i = 0; i < k; ++i) z += work_[order_[i]];
  }
  for (;; k = std::min<int64_t>(n, k * 4)) {
    if (p.top_k <= 0) std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), by_prob);
    double mass = 0;
    int64_t cut = k;
    for (int64_t i = 0; i < k && p.top_p < 1.0f; ++i) {
      mass += work_[order_[i]] / z;
      if (mass >= p.top_p) { cut = i + 1; break; }
    }
    if (cut < k || k == n) { n = cut; break; }
  }
  int64_t keep = 1;
  while (keep < n && work_[order_[keep]] >= p.min_p) ++keep;
  return keep;
}

SampleResult Sampler::describe(std::span<const float> logits, int32_t token, const SamplingParams& params) {
  SampleResult out;
  out.token = token;
  if (params.top_logprobs >= 0) fill_logprobs(logits, params.top_logprobs, out);
  return out;
}

void Sampler::fill_logprobs(std::span<const float> logits, int top_n, SampleResult& out) {
  const float max_l = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (float l : logits) z += std::exp(l - max_l);  // float exp, double sum
  const auto log_z = static_cast<float>(max_l + std::log(z));
  out.logprob = logits[out.token] - log_z;
  if (top_n <= 0) return;
  order_.resize(logits.size());
  std::iota(order_.begin(), order_.end(), 0);
  const auto k = std::min<size_t>(static_cast<size_t>(top_n), logits.size());
  std::partial_sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(k), order_.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  out.top.clear();
  for (size_t i = 0; i < k; ++i) out.top.push_back({order_[i], logits[order_[i]] - log_z});
}

SampleResult Sampler::sample(std::span<const float> logits, const SamplingParams& params, const TokenHistory& history,
                             std::mt19937_64& rng) {
  double u[kMaxUniformsPerSample];
  const int n = draw_uniforms(params, rng, u);
  return sample_drawn(logits, params, history, std::span<const double>(u, static_cast<size_t>(n)));
}

SampleResult Sampler::sample_drawn(std::span<const float> logits, const SamplingParams& params,
                                   const TokenHistory& history, std::span<const double> uniforms) {
  TERN_CHECK(uniforms.size() == static_cast<size_t>(uniforms_per_sample(params)), "sampler: ", uniforms.size(),
             " uniforms given, the request takes ", uniforms_per_sample(params));
  SampleResult out;
  if (params.greedy() && !params.penalised()) {
    out.token = argmax(logits);
  } else {
    work_.assign(logits.begin(), logits.end());
    apply_penalties(params, history);
    out.token = params.greedy() ? argmax(work_) : draw(params, uniforms[0]);
  }
  if (params.top_logprobs >= 0) fill_logprobs(logits, params.top_logprobs, out);
  return out;
}

void Sampler::distribution(std::span<const float> logits, const SamplingParams& params, const TokenHistory& history,
                           std::span<float> out) {
  TERN_CHECK(out.size() == logits.size() && !logits.empty(), "sampler: a distribution of ", logits.size(),
             " logits into ", out.size(), " values");
  std::fill(out.begin(), out.end(), 0.0f);
  work_.assign(logits.begin(), logits.end());
  apply_penalties(params, history);
  if (params.greedy()) {  // (unpenalised, sample_drawn's argmax of the logits: the same token)
    out[static_cast<size_t>(argmax(work_))] = 1.0f;
    return;
  }
  // draw()'s weights and candidates, in the same arithmetic
  const float inv_t = 1.0f / params.temperature;
  const float max_l = *std::max_element(work_.begin(), work_.end());
  const double z = exp_weights(work_, max_l, inv_t);
  if (params.top_k <= 0 && params.top_p >= 1.0f) {
    const double total = unsorted_total(params, z);
    for (size_t i = 0; i < work_.size(); ++i)
      if (work_[i] >= params.min_p) out[i] = static_cast<float>(work_[i] / total);
    return;
  }
  const int64_t n = sorted_candidates(params, z);
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += work_[order_[i]];
  for (int64_t i = 0; i < n; ++i) out[order_[i]] = static_cast<float>(work_[order_[i]] / total);
}

}  // namespace tern::engine
