// Argument checks shared by the op entry points: a bad call throws a tern::Error naming the op, the
// argument, and the expected and found shape/dtype/device.
#pragma once

#include <initializer_list>
#include <string_view>

#include "core/tensor.h"

namespace tern::ops::detail {

void expect_dtype(std::string_view op, std::string_view arg, const TensorView& t,
                  std::initializer_list<DType> allowed);
// dims: -1 matches anything.
void expect_shape(std::string_view op, std::string_view arg, const TensorView& t,
                  std::initializer_list<int64_t> dims);
void expect_rank(std::string_view op, std::string_view arg, const TensorView& t, int rank);
void expect_contiguous(std::string_view op, std::string_view arg, const TensorView& t);
// All non-empty views on one device; returns it.
Device common_device(std::string_view op, std::initializer_list<const TensorView*> views);

}  // namespace tern::ops::detail
