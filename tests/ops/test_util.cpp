#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace tern::test {

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

PagedCopy paged_copy(const TensorView& rows, int64_t rows_per_page, Random& rng, int64_t offset, int64_t spare) {
  const int64_t n = rows.dim(0), row_bytes = static_cast<int64_t>(rows.nbytes()) / std::max<int64_t>(1, n);
  const int64_t used = (n + rows_per_page - 1) / rows_per_page, pages = used + spare;
  const int64_t page_bytes = (offset + rows_per_page * row_bytes + 40 + 63) / 64 * 64;
  PagedCopy c;
  c.pool = Tensor(DType::u8, {pages, page_bytes});
  for (int64_t i = 0; i < c.pool.numel(); ++i) c.pool.data<uint8_t>()[i] = static_cast<uint8_t>(rng.integer(0, 255));
  std::vector<int32_t> order(static_cast<size_t>(pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng.gen());
  c.table = Tensor(DType::i32, {std::max<int64_t>(used, 1)});
  std::copy_n(order.begin(), used, c.table.data<int32_t>());
  c.view = {c.pool, c.table.view().rows(0, used), offset, rows_per_page, row_bytes};
  for (int64_t r = 0; r < n; ++r)
    std::memcpy(c.view.row(r), rows.data_as<const std::byte>() + r * row_bytes, static_cast<size_t>(row_bytes));
  return c;
}

PagedCopy one_page(const TensorView& rows) {
  const int64_t n = std::max<int64_t>(1, rows.dim(0)), row_bytes = static_cast<int64_t>(rows.nbytes()) / n;
  PagedCopy c;
  c.pool = Tensor(DType::u8, {1, n * row_bytes});
  std::memcpy(c.pool.data<std::byte>(), rows.data(), rows.nbytes());
  c.table = Tensor(DType::i32, {1});
  c.view = {c.pool, c.table, 0, n, row_bytes};
  return c;
}

}  // namespace tern::test
