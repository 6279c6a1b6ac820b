#include "ops/weight.h"

#include "ops/check.h"

namespace tern::ops {

namespace {

void check_packed_fp4(const Weight& w, const std::string& what) {
  const TensorView& t = w.weight;
  if (t.dtype() == DType::e2m1) {
    detail::expect_shape(what, "weight", t, {w.out, w.in});
  } else {
    detail::expect_dtype(what, "weight", t, {DType::u8, DType::i8, DType::e2m1});
    detail::expect_shape(what, "weight (packed, two e2m1 per byte)", t, {w.out, w.in / 2});
  }
}

}  // namespace

void check_weight(const Weight& w) {
  const std::string what =
      cat("weight ", w.name.empty() ? "?" : w.name, " (", weight_format_name(w.format), ")");
  TERN_CHECK(w.out > 0 && w.in > 0, what, ": empty shape [", w.out, ", ", w.in, "]");
  switch (w.format) {
    case WeightFormat::f32:
      detail::expect_dtype(what, "weight", w.weight, {DType::f32});
      detail::expect_shape(what, "weight", w.weight, {w.out, w.in});
      return;
    case WeightFormat::bf16:
      detail::expect_dtype(what, "weight", w.weight, {DType::bf16});
      detail::expect_shape(what, "weight", w.weight, {w.out, w.in});
      return;
    case WeightFormat::fp8_block:
      detail::expect_dtype(what, "weight", w.weight, {DType::e4m3});
      detail::expect_shape(what, "weight", w.weight, {w.out, w.in});
      detail::expect_dtype(what, "scale", w.scale, {DType::e8m0, DType::f32});
      detail::expect_shape(what, "scale", w.scale, {(w.out + 127) / 128, (w.in + 127) / 128});
      return;
    case WeightFormat::mxfp4:
      TERN_CHECK(w.in % 32 == 0, what, ": in = ", w.in, " is not a multiple of 32");
      check_packed_fp4(w, what);
      detail::expect_dtype(what, "scale", w.scale, {DType::e8m0});
      detail::expect_shape(what, "scale", w.scale, {w.out, w.in / 32});
      return;
    case WeightFormat::nvfp4:
      TERN_CHECK(w.in % 16 == 0, what, ": in = ", w.in, " is not a multiple of 16");
      check_packed_fp4(w, what);
      detail::expect_dtype(what, "scale", w.scale, {DType::ue4m3, DType::e4m3});
      detail::expect_shape(what, "scale", w.scale, {w.out, w.in / 16});
      return;
  }
  fail(what, ": unknown weight format");
}

}  // namespace tern::ops
