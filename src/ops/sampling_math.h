// Arithmetic the host sampler (engine/sampler.h) and the CUDA sampling kernels (backends/cuda/kernels/
// sampling.cu) share, so that both pick the same token from the same logits: the float exp of the
// weights, the penalties and the candidate order key. Header-only, compiled by the host compiler and by
// nvcc for the device. Every operation is a single IEEE-rounded float or double operation (the device
// side spells them as __fmul_rn / __dadd_rn ... so nvcc cannot contract them into FMAs; the host files
// that include this header are compiled with -ffp-contract=off), so host and device results are
// bit-identical.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__CUDACC__)
#define TERN_SAMPLE_HD __host__ __device__ __forceinline__
#else
#define TERN_SAMPLE_HD inline
#endif

namespace tern::sampling {

// The largest number of top logprobs a request may ask for (SamplingParams::top_logprobs).
inline constexpr int kMaxTopLogprobs = 20;

TERN_SAMPLE_HD double dmul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
TERN_SAMPLE_HD double dadd(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
TERN_SAMPLE_HD double dsub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
TERN_SAMPLE_HD double ddiv(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
// Fused multiply-add (one rounding): glibc's expf is built with FMA on x86-64 CPUs that have it, and
// the weights reproduce that build. On the host, call this from a function compiled for FMA
// (engine/sampler.cpp picks one at run time); elsewhere __builtin_fma is libm's (exact, slower).
TERN_SAMPLE_HD double dfma(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return __builtin_fma(a, b, c);
#endif
}
TERN_SAMPLE_HD float fmul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TERN_SAMPLE_HD float fadd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TERN_SAMPLE_HD float fsub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
TERN_SAMPLE_HD float fdiv(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

TERN_SAMPLE_HD uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
TERN_SAMPLE_HD uint64_t double_bits(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}
TERN_SAMPLE_HD double bits_double(uint64_t u) {
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
}

// 2^(i/32) as bits, minus i << 47 (so that adding k << 47 scales by 2^(k/32) with k's high bits).
#define TERN_EXP2_TABLE                                                                                    \
  0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,      \
      0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,  \
      0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,  \
      0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,  \
      0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,  \
      0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,  \
      0x3fefa4afa2a490da, 0x3fefd0765b6e4540
inline constexpr uint64_t kExp2Table[32] = {TERN_EXP2_TABLE};
#if defined(__CUDACC__)
static __device__ const uint64_t kExp2TableDevice[32] = {TERN_EXP2_TABLE};  // the same, in device memory
#endif
#undef TERN_EXP2_TABLE

// exp(x) for x <= 0 (the sampler's (l - max) / T), as float: glibc's expf (a 32-entry table of 2^(i/32)
// and a cubic in double; error < 0.51 ulp) operation by operation as GCC builds it for FMA CPUs (the
// multiply-adds fused), so the host and the device compute the same bits and, on an x86-64 host with
// FMA and glibc >= 2.28, the same bits as std::exp(float) (the host sampler's exp before this header;
// tests/engine checks it). NaN gives NaN, -inf and x < log(2^-150) give 0.
TERN_SAMPLE_HD float exp_weight(float x) {
  if (x != x) return x;
  if (x < -0x1.9fe368p6f) return 0.0f;  // below log(2^-150): rounds to 0 (also -inf)
  if (x > 0x1.62e42ep6f) return std::numeric_limits<float>::infinity();
  constexpr double kInvLn2N = 0x1.71547652b82fep+0 * 32;
  constexpr double kShift = 0x1.8p+52;
  constexpr double kC0 = 0x1.c6af84b912394p-5 / 32 / 32 / 32;
  constexpr double kC1 = 0x1.ebfce50fac4f3p-3 / 32 / 32;
  constexpr double kC2 = 0x1.62e42ff0c52d6p-1 / 32;
  const double xd = static_cast<double>(x);
  double kd = dfma(kInvLn2N, xd, kShift);
  const uint64_t ki = double_bits(kd);
  kd = dsub(kd, kShift);
  const double r = dfma(kInvLn2N, xd, -kd);
#if defined(__CUDA_ARCH__)
  uint64_t t = kExp2TableDevice[ki % 32];
#else
  uint64_t t = kExp2Table[ki % 32];
#endif
  t += ki << (52 - 5);
  const double s = bits_double(t);
  const double z = dfma(kC0, r, kC1);
  const double r2 = dmul(r, r);
  double y = dfma(kC2, r, 1.0);
  y = dfma(z, r2, y);
  y = dmul(y, s);
  return static_cast<float>(y);
}

// The penalised logit of a token: repetition (CTRL / HF) if the token was seen, then presence and
// frequency (OpenAI) by its output count (0: not an output token). As the host sampler applies them.
TERN_SAMPLE_HD float repetition_penalised(float l, float repetition) {
  return l > 0 ? fdiv(l, repetition) : fmul(l, repetition);
}
TERN_SAMPLE_HD float count_penalised(float l, float presence, float frequency, int32_t count) {
  return fsub(l, fadd(presence, fmul(frequency, static_cast<float>(count))));
}

// The order candidates are visited in: weight descending, index ascending on ties, as one integer
// (larger key = earlier). Weights are >= 0 (their bits order as unsigned integers); ids < 2^32.
TERN_SAMPLE_HD uint64_t candidate_key(float w, uint32_t index) {
  return (static_cast<uint64_t>(float_bits(w)) << 32) | static_cast<uint64_t>(0xffffffffu - index);
}
TERN_SAMPLE_HD uint32_t key_index(uint64_t key) { return 0xffffffffu - static_cast<uint32_t>(key); }
TERN_SAMPLE_HD float key_weight(uint64_t key) {
  const uint32_t b = static_cast<uint32_t>(key >> 32);
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
}

// A float's bits mapped to an unsigned integer in the float's order (for any sign), for ordering logits.
TERN_SAMPLE_HD uint32_t ordered_bits(float f) {
  const uint32_t u = float_bits(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
// Logit order (value descending, index ascending) as one integer, as the host's comparisons order them:
// -0 and +0 tie; NaN ranks below everything (the host's argmax never moves to a NaN).
TERN_SAMPLE_HD uint64_t logit_key(float l, uint32_t index) {
  const uint32_t b = l != l ? 0u : ordered_bits(l == 0.0f ? 0.0f : l);
  return (static_cast<uint64_t>(b) << 32) | static_cast<uint64_t>(0xffffffffu - index);
}

// One row's request in the packed buffer of ops::sample_rows (ops::pack_sample_rows): the sampling
// parameters, the uniform drawn on the host, and the row's penalty history as ranges of the int32 area
// that follows the rows' descriptors (seen: distinct token ids; counts: distinct (token, count) pairs).
struct SampleRowDesc {
  float temperature = 1.0f;  // <= 0: greedy
  float top_p = 1.0f;
  float min_p = 0.0f;
  float presence = 0.0f;
  float frequency = 0.0f;
  float repetition = 1.0f;
  int32_t top_k = 0;          // <= 0: off; 1: greedy
  int32_t top_logprobs = -1;  // -1: none; else 0..kMaxTopLogprobs
  double uniform = 0.0;       // in [0, 1); not read when greedy
  int32_t seen_offset = 0, seen_count = 0;      // int32 ids
  int32_t counts_offset = 0, counts_count = 0;  // pairs: 2 int32 each
};

// One row's result: the token, its logprob and the top logprobs (log-softmax of the unmodified logits;
// 0 and none when top_logprobs is -1).
struct SampledRow {
  int32_t token = 0;
  float logprob = 0.0f;
  int32_t num_top = 0;
  int32_t top_tokens[kMaxTopLogprobs] = {};
  float top_logprobs[kMaxTopLogprobs] = {};
};

TERN_SAMPLE_HD bool row_greedy(const SampleRowDesc& d) { return d.temperature <= 0.0f || d.top_k == 1; }
TERN_SAMPLE_HD bool row_penalised(const SampleRowDesc& d) {
  return d.repetition != 1.0f || d.presence != 0.0f || d.frequency != 0.0f;
}

}  // namespace tern::sampling
