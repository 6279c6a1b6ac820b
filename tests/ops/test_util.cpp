#include "test_util.h"

#include <algorithm>
#include <cmath>

#include "backends/cpu/cpu_backend.h"

namespace tern::test {

// Every test in this executable runs on the CPU backend.
static const bool registered = (cpu::register_backend(), true);

Tensor Random::tensor(Shape shape, float stddev) {
  Tensor t(DType::f32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(stddev);
  return t;
}

float max_abs(const float* a, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i]));
  return m;
}

float max_abs_diff(const float* a, const float* b, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

Tensor positions_tensor(const std::vector<int64_t>& p) {
  Tensor t(DType::i64, {static_cast<int64_t>(p.size())});
  std::copy(p.begin(), p.end(), t.data<int64_t>());
  return t;
}

}  // namespace tern::test
