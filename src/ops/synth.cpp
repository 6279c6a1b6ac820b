// synth_fill's argument checks, then the context's backend.
#include "ops/synth.h"

#include "ops/backend.h"
#include "ops/check.h"
#include "ops/context.h"

namespace tern::ops {

using detail::expect_dtype;
using detail::expect_shape;

void synth_fill(const Context& ctx, const SynthFillArgs& a) {
  detail::expect_contiguous("synth_fill", "out", a.out);
  TERN_CHECK(!a.out.empty(), "synth_fill: no output");
  const int64_t R = a.rows, C = a.cols;
  switch (a.kind) {
    case SynthKind::normal:
    case SynthKind::uniform:
      expect_dtype("synth_fill", "out", a.out, {DType::f32, DType::bf16});
      TERN_CHECK(a.scale.empty(), "synth_fill: values take no scale");
      break;
    case SynthKind::fp8_block:
      expect_dtype("synth_fill", "out", a.out, {DType::e4m3});
      expect_shape("synth_fill", "out", a.out, {R, C});
      expect_dtype("synth_fill", "scale", a.scale, {DType::e8m0});
      expect_shape("synth_fill", "scale", a.scale, {(R + 127) / 128, (C + 127) / 128});
      break;
    case SynthKind::mxfp4:
    case SynthKind::nvfp4: {
      const bool nv = a.kind == SynthKind::nvfp4;
      const int64_t block = nv ? 16 : 32;
      TERN_CHECK(C % block == 0, "synth_fill: ", nv ? "NVFP4" : "MXFP4", " needs the input width (", C,
                 ") to be a multiple of ", block);
      expect_dtype("synth_fill", "out", a.out, {DType::i8, DType::u8});
      expect_shape("synth_fill", "out", a.out, {R, C / 2});
      expect_dtype("synth_fill", "scale", a.scale, {nv ? DType::ue4m3 : DType::e8m0});
      expect_shape("synth_fill", "scale", a.scale, {R, C / block});
      TERN_CHECK(!nv || a.global_scale > 0, "synth_fill: NVFP4 needs a positive global scale, found ", a.global_scale);
      break;
    }
    case SynthKind::distinct_rows:
      expect_dtype("synth_fill", "out", a.out, {DType::i64});
      expect_shape("synth_fill", "out", a.out, {-1, -1});
      TERN_CHECK(a.out.dim(1) >= 1 && a.out.dim(1) <= 64 && a.out.dim(1) <= a.choices,
                 "synth_fill: rows of ", a.out.dim(1), " distinct values in [0, ", a.choices,
                 ") (at most 64 per row)");
      break;
  }
  if (!a.scale.empty()) detail::expect_contiguous("synth_fill", "scale", a.scale);
  ctx.backend_for(detail::common_device("synth_fill", {&a.out, &a.scale})).synth_fill(a);
}

}  // namespace tern::ops
