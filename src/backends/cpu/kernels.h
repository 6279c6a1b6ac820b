// Helpers shared by the CPU kernels.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ops/weight.h"

namespace tern::cpu {

// fp32 dot product with 8 independent partial sums (lets the compiler vectorise without fast-math).
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

// bf16 -> f32 is exact: the bf16 bits are the top half of the f32 bits.
inline float bf16_bits_to_f32(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

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
