#include "ops/check.h"

#include <string>

namespace tern::ops::detail {

void expect_dtype(std::string_view op, std::string_view arg, const TensorView& t,
                  std::initializer_list<DType> allowed) {
  for (DType d : allowed)
    if (t.dtype() == d) return;
  std::string names;
  for (DType d : allowed) names += (names.empty() ? "" : "|") + std::string(dtype_name(d));
  fail(op, ": ", arg, " must be ", names, ", found ", dtype_name(t.dtype()));
}

void expect_rank(std::string_view op, std::string_view arg, const TensorView& t, int rank) {
  TERN_CHECK(t.rank() == rank, op, ": ", arg, " must have rank ", rank, ", found shape ", t.shape().str());
}

namespace {

void expect_dims(std::string_view op, std::string_view arg, const TensorView& t, std::initializer_list<int64_t> dims) {
  bool ok = t.rank() == static_cast<int>(dims.size());
  int i = 0;
  std::string want = "[";
  for (int64_t d : dims) {
    want += (i ? ", " : "") + (d < 0 ? std::string("*") : std::to_string(d));
    if (ok && d >= 0 && t.dim(i) != d) ok = false;
    ++i;
  }
  want += "]";
  TERN_CHECK(ok, op, ": ", arg, " must have shape ", want, ", found ", t.shape().str());
}

}  // namespace

void expect_shape(std::string_view op, std::string_view arg, const TensorView& t,
                  std::initializer_list<int64_t> dims) {
  expect_dims(op, arg, t, dims);
  expect_contiguous(op, arg, t);
}

void expect_rows(std::string_view op, std::string_view arg, const TensorView& t, std::initializer_list<int64_t> dims) {
  expect_dims(op, arg, t, dims);
  expect_rows(op, arg, t);
}

void expect_rows(std::string_view op, std::string_view arg, const TensorView& t) {
  TERN_CHECK(t.row_stride() >= 0, op, ": ", arg, " must be rows (each contiguous, evenly spaced)");
}

void expect_fp8_rows(std::string_view op, std::string_view arg, const Fp8Rows& x, int64_t rows, int64_t cols) {
  TERN_CHECK(cols % kActBlock == 0, op, ": ", arg, ": FP8 rows of ", cols, " columns (not a multiple of ", kActBlock,
             ")");
  TERN_CHECK(x.rows == rows, op, ": ", arg, " holds ", x.rows, " rows, expected ", rows);
  expect_dtype(op, cat(arg, ".values"), x.values, {DType::u8});
  expect_rows(op, cat(arg, ".values"), x.values, {-1, cols});
  TERN_CHECK(x.values.row_stride() == cols, op, ": ", arg, ".values must be contiguous rows");
  expect_dtype(op, cat(arg, ".scales"), x.scales, {DType::f32});
  expect_rows(op, cat(arg, ".scales"), x.scales, {cols / kActBlock, -1});
  TERN_CHECK(x.values.dim(0) >= rows && x.scales.dim(1) >= rows, op, ": ", arg, " holds fewer than its ", rows, " rows");
  TERN_CHECK(x.values.device() == x.scales.device(), op, ": ", arg, "'s values and scales are on different devices");
}

void expect_contiguous(std::string_view op, std::string_view arg, const TensorView& t) {
  TERN_CHECK(t.is_contiguous(), op, ": ", arg, " must be contiguous");
}

void expect_paged(std::string_view op, std::string_view arg, const PagedRows& r, int64_t count, int64_t row_bytes) {
  if (count == 0) return;
  TERN_CHECK(!r.empty(), op, ": ", arg, " is empty but must hold ", count, " rows");
  expect_dtype(op, arg, r.pool, {DType::u8});
  expect_shape(op, arg, r.pool, {-1, -1});
  expect_dtype(op, arg, r.block_table, {DType::i32});
  expect_shape(op, arg, r.block_table, {-1});
  TERN_CHECK(r.block_table.device() == r.pool.device(), op, ": ", arg, "'s block table is not on its pool's device");
  TERN_CHECK(r.row_bytes == row_bytes, op, ": ", arg, " has rows of ", r.row_bytes, " bytes, expected ", row_bytes);
  TERN_CHECK(r.rows_per_page > 0 && r.offset_in_page >= 0 &&
                 r.offset_in_page + r.rows_per_page * r.row_bytes <= r.page_bytes(),
             op, ": ", arg, ": ", r.rows_per_page, " rows of ", r.row_bytes, " bytes at offset ", r.offset_in_page,
             " do not fit a page of ", r.page_bytes());
  TERN_CHECK(r.capacity() >= count, op, ": ", arg, "'s block table covers ", r.capacity(), " rows, ", count,
             " needed");
  if (r.block_table.device() != Device::cpu) return;
  const int64_t used = (count + r.rows_per_page - 1) / r.rows_per_page, pages = r.pool.dim(0);
  for (int64_t i = 0; i < used; ++i) {
    const int32_t page = r.block_table.data_as<const int32_t>()[i];
    TERN_CHECK(page >= 0 && page < pages, op, ": ", arg, "'s block table entry ", i, " is page ", page,
               " outside the pool's ", pages);
  }
}

Device common_device(std::string_view op, std::initializer_list<const TensorView*> views) {
  bool found = false;
  Device dev = Device::cpu;
  for (const TensorView* v : views) {
    if (v->empty()) continue;
    if (!found) {
      dev = v->device();
      found = true;
    }
    TERN_CHECK(v->device() == dev, op, ": tensors on different devices");
  }
  return dev;
}

}  // namespace tern::ops::detail
