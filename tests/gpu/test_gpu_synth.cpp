// synth_fill on the GPU writes the CPU backend's bytes, kind for kind (ops/synth_values.h is shared and every
// rounding is the same IEEE operation on both sides), and a full-shape expert and FP8 projection build.
#include <cmath>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "gpu_test_util.h"
#include "ops/synth.h"
#include "ops/synth_values.h"

namespace tern {
namespace {

struct Case {
  const char* name;
  ops::SynthKind kind;
  DType out, scale;
  Shape out_shape, scale_shape;
  int64_t rows, cols;
};

void fill(const Case& c, const ops::Context& ctx, Tensor& out, Tensor& scale) {
  out = Tensor(c.out, c.out_shape, ctx.device());
  if (c.scale_shape.rank() > 0) scale = Tensor(c.scale, c.scale_shape, ctx.device());
  ops::SynthFillArgs a;
  a.kind = c.kind;
  a.seed = synth::tensor_seed(9, c.name);
  a.a = c.kind == ops::SynthKind::uniform ? 0.5f : 0.25f;
  a.b = c.kind == ops::SynthKind::uniform ? 1.0f : 1.0f / std::sqrt(static_cast<float>(c.cols > 0 ? c.cols : 64));
  a.rows = c.rows;
  a.cols = c.cols;
  a.out = out;
  a.scale = scale;
  a.choices = 256;
  if (c.kind == ops::SynthKind::nvfp4) a.global_scale = synth::nvfp4_global_scale(a.b);
  ops::synth_fill(ctx, a);
}

int64_t mismatches(const TensorView& host, const Tensor& dev) {
  const Tensor back = cuda::to_host(dev);
  const auto* x = static_cast<const unsigned char*>(host.data());
  const auto* y = static_cast<const unsigned char*>(back.view().data());
  int64_t n = 0;
  for (size_t i = 0; i < host.nbytes(); ++i) n += x[i] != y[i];
  return n;
}

TEST(GpuSynth, BytesEqualTheCpuBackends) {
  TERN_REQUIRE_GPU();
  const std::vector<Case> cases = {
      {"normal f32", ops::SynthKind::normal, DType::f32, DType::f32, {1000, 77}, {}, 0, 0},
      {"normal bf16", ops::SynthKind::normal, DType::bf16, DType::f32, {4097}, {}, 0, 0},
      {"uniform f32", ops::SynthKind::uniform, DType::f32, DType::f32, {3, 5}, {}, 0, 0},
      {"fp8", ops::SynthKind::fp8_block, DType::e4m3, DType::e8m0, {300, 520}, {3, 5}, 300, 520},
      {"mxfp4", ops::SynthKind::mxfp4, DType::i8, DType::e8m0, {96, 256}, {96, 16}, 96, 512},
      {"nvfp4", ops::SynthKind::nvfp4, DType::u8, DType::ue4m3, {96, 256}, {96, 32}, 96, 512},
      {"tid2eid", ops::SynthKind::distinct_rows, DType::i64, DType::f32, {5000, 6}, {}, 0, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor ho, hs, dout, dscale;
    fill(c, cpu::context(), ho, hs);
    fill(c, cuda::context(), dout, dscale);
    EXPECT_EQ(mismatches(ho, dout), 0) << "of " << ho.nbytes() << " bytes";
    if (!hs.empty()) EXPECT_EQ(mismatches(hs, dscale), 0) << "of " << hs.nbytes() << " scale bytes";
    bool nonzero = false;
    for (size_t i = 0; i < ho.nbytes() && !nonzero; ++i) nonzero = static_cast<const unsigned char*>(ho.view().data())[i] != 0;
    EXPECT_TRUE(nonzero);
    std::printf("[gpu synth] %s: %zu bytes equal to the CPU backend's\n", c.name, ho.nbytes());
  }
}

}  // namespace
}  // namespace tern
