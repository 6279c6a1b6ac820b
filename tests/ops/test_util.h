// Helpers of the op tests: seeded random tensors (never all zeros) and error measures.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/paged_rows.h"
#include "core/tensor.h"

namespace tern::test {

class Random {
 public:
  explicit Random(uint32_t seed) : gen_(seed) {}
  float normal(float stddev = 1.0f) { return std::normal_distribution<float>(0.0f, stddev)(gen_); }
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen_); }
  int64_t integer(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen_); }
  // f32 tensor of normal values
  Tensor tensor(Shape shape, float stddev = 1.0f);
  std::mt19937& gen() { return gen_; }

 private:
  std::mt19937 gen_;
};

float max_abs(const float* a, int64_t n);
float max_abs_diff(const float* a, const float* b, int64_t n);
inline float max_abs_diff(const Tensor& a, const Tensor& b) {
  return max_abs_diff(a.data<float>(), b.data<float>(), a.numel());
}
Tensor positions_tensor(const std::vector<int64_t>& p);

// Rows (host, [n, ...], row_bytes = bytes of one row) in pages of their own pool: rows_per_page per page at
// byte `offset`, the pages in shuffled order among `spare` unused ones whose bytes are random (a
// non-contiguous block table), or all in one page at offset 0 (the contiguous case).
struct PagedCopy {
  Tensor pool, table;
  PagedRows view;
};
PagedCopy paged_copy(const TensorView& rows, int64_t rows_per_page, Random& rng, int64_t offset = 24,
                     int64_t spare = 3);
PagedCopy one_page(const TensorView& rows);

}  // namespace tern::test
