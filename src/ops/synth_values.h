// The random values of synthetic weights (ops/synth.h), shared by the CPU backend and the CUDA kernels so
// that both write the same bytes for the same (seed, index): a counter-based hash, no sequential state, so
// any thread computes any element. Header-only, compiled by the host compiler and by nvcc for the device.
//
// A unit value is the sum of four 16-bit uniforms from one hash, centred and scaled to variance 1 (an
// Irwin-Hall approximation of N(0, 1) with support +-2 sqrt(3)): every step but the last multiply is exact
// in float, and the last is one IEEE-rounded operation on both sides, so host and device agree bit for bit.
// The bounded support also bounds every block's amax, which sizes NVFP4's global scale (kUnitBound).
#pragma once

#include <cstdint>
#include <string_view>

#if defined(__CUDACC__)
#define TERN_SYNTH_HD __host__ __device__ __forceinline__
#else
#define TERN_SYNTH_HD inline
#endif

namespace tern::synth {

// |unit_value| never exceeds this (2 sqrt(3), rounded up).
inline constexpr float kUnitBound = 3.4641018f;

TERN_SYNTH_HD uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The 64-bit FNV-1a hash of a tensor's name: with the seed, the tensor's stream (host only).
inline uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// The stream of the tensor `name` for the run's seed.
inline uint64_t tensor_seed(uint64_t seed, std::string_view name) { return splitmix(seed) ^ fnv1a(name); }

TERN_SYNTH_HD uint64_t element_hash(uint64_t seed, uint64_t i) { return splitmix(seed ^ splitmix(i)); }

TERN_SYNTH_HD float fused_multiply_add(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}

// Mean 0, variance 1, |value| <= kUnitBound.
TERN_SYNTH_HD float unit_value(uint64_t seed, uint64_t i) {
  const uint64_t h = element_hash(seed, i);
  const int64_t s = static_cast<int64_t>(h & 0xffff) + static_cast<int64_t>((h >> 16) & 0xffff) +
                    static_cast<int64_t>((h >> 32) & 0xffff) + static_cast<int64_t>(h >> 48);
  // sum of (x_k + 1/2) / 65536 minus 2, exact (18 significant bits), then one rounding.
  const float centred = static_cast<float>(2 * s - 262140) * (1.0f / 131072.0f);
  return centred * 1.7320508f;
}

// mean + sigma * unit_value: one fused (correctly rounded) operation.
TERN_SYNTH_HD float normal_value(uint64_t seed, uint64_t i, float mean, float sigma) {
  return fused_multiply_add(unit_value(seed, i), sigma, mean);
}

// Uniform in [lo, hi): 24 random bits.
TERN_SYNTH_HD float uniform_value(uint64_t seed, uint64_t i, float lo, float hi) {
  const float u = static_cast<float>(element_hash(seed, i) >> 40) * (1.0f / 16777216.0f);
  return fused_multiply_add(u, hi - lo, lo);
}

// Row `row` of a table of distinct choices: k distinct values in [0, choices) (k <= choices), drawn by
// rejection (k is small next to choices for tid2eid: 6 of 256).
TERN_SYNTH_HD void distinct_row(uint64_t seed, int64_t row, int k, int64_t choices, int64_t* out) {
  uint64_t h = element_hash(seed, static_cast<uint64_t>(row));
  for (int j = 0; j < k;) {
    h = splitmix(h);
    const auto v = static_cast<int64_t>(h % static_cast<uint64_t>(choices));
    bool seen = false;
    for (int q = 0; q < j; ++q) seen = seen || out[q] == v;
    if (!seen) out[j++] = v;
  }
}

// NVFP4's fp32 global scale for values of std sigma: no value exceeds kUnitBound sigma, so every per-16
// block scale amax / (6 global) stays at or below 448 (ue4m3's largest).
TERN_SYNTH_HD float nvfp4_global_scale(float sigma) { return kUnitBound * sigma / (448.0f * 6.0f); }

}  // namespace tern::synth
