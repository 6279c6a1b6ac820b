// Helpers shared by the CPU kernels.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ops/weight.h"

namespace tern::cpu {

// fp32 dot product with 8 independent partial sums (lane k sums the elements i = k mod 8), written with
// 4-wide GCC/Clang vector types so it is SIMD (SSE) at -O2 and under the sanitizers; the order is fixed.
inline float dot(const float* a, const float* b, int64_t n) {
  typedef float v4 __attribute__((vector_size(16)));
  v4 lo = {}, hi = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v4 a0, a1, b0, b1;
    std::memcpy(&a0, a + i, sizeof a0);
    std::memcpy(&a1, a + i + 4, sizeof a1);
    std::memcpy(&b0, b + i, sizeof b0);
    std::memcpy(&b1, b + i + 4, sizeof b1);
    lo += a0 * b0;
    hi += a1 * b1;
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((lo[0] + lo[1]) + (lo[2] + lo[3])) + ((hi[0] + hi[1]) + (hi[2] + hi[3])) + tail;
}

// bf16 -> f32 is exact: the bf16 bits are the top half of the f32 bits.
inline float bf16_bits_to_f32(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// n bf16 values to f32, 4 at a time.
inline void bf16_row_to_f32(const uint16_t* src, int64_t n, float* out) {
  typedef uint32_t u4 __attribute__((vector_size(16)));
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const u4 bits = {src[i], src[i + 1], src[i + 2], src[i + 3]};
    const u4 wide = bits << 16;
    std::memcpy(out + i, &wide, sizeof wide);
  }
  for (; i < n; ++i) out[i] = bf16_bits_to_f32(src[i]);
}

inline float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}
inline float silu(float x) {
  return x / (1.0f + std::exp(-x));
}

// Reads rows of a weight matrix as exact f32 values, whatever its storage format.
class RowDequantizer {
 public:
  explicit RowDequantizer(const ops::Weight& w);
  // out[0:in] = W[row, 0:in]
  void row(int64_t r, float* out) const;

 private:
  const ops::Weight& w_;
  const uint8_t* bytes_;
};

// y[t, r] = sum_i x[t * x_stride + (r / rows_per_group) * in + i] * W[r, i] for t < T, r < out, y row stride
// out. Threaded over r.
void matmul_rows(const float* x, int64_t T, int64_t x_stride, int64_t rows_per_group, const ops::Weight& w,
                 float* y);

}  // namespace tern::cpu
