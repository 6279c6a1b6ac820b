// Argument checks shared by the op entry points: a bad call throws a tern::Error naming the op, the
// argument, and the expected and found shape/dtype/device.
#pragma once

#include <initializer_list>
#include <string_view>

#include "core/paged_rows.h"
#include "core/tensor.h"
#include "ops/act_quant.h"

namespace tern::ops::detail {

void expect_dtype(std::string_view op, std::string_view arg, const TensorView& t,
                  std::initializer_list<DType> allowed);
// dims: -1 matches anything.
void expect_shape(std::string_view op, std::string_view arg, const TensorView& t,
                  std::initializer_list<int64_t> dims);
void expect_rank(std::string_view op, std::string_view arg, const TensorView& t, int rank);
void expect_contiguous(std::string_view op, std::string_view arg, const TensorView& t);
// As expect_shape for an argument read as rows (TensorView::row_stride): each row contiguous, the rows any
// distance apart (a column range of a stacked product's output, model/stacked.h).
void expect_rows(std::string_view op, std::string_view arg, const TensorView& t, std::initializer_list<int64_t> dims);
void expect_rows(std::string_view op, std::string_view arg, const TensorView& t);
// Paged rows that hold at least `count` rows of `row_bytes`: a u8 pool [pages, page_bytes], an i32 block
// table on its device covering the rows, rows inside a page; with a host table, pages inside the pool.
void expect_paged(std::string_view op, std::string_view arg, const PagedRows& rows, int64_t count,
                  int64_t row_bytes);
// FP8 rows (act_quant.h) of `rows` rows and `cols` columns (a multiple of kActBlock): u8 values with contiguous rows,
// f32 token-major scales with contiguous rows, both holding at least `rows` rows, on one device.
void expect_fp8_rows(std::string_view op, std::string_view arg, const Fp8Rows& x, int64_t rows, int64_t cols);
// All non-empty views on one device; returns it.
Device common_device(std::string_view op, std::initializer_list<const TensorView*> views);

}  // namespace tern::ops::detail
