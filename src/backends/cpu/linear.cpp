// Linear layers in every weight format. Each output row of W is dequantized exactly once per call into a
// small f32 buffer, then dotted with every token.
#include <array>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "ops/act_quant.h"

namespace tern::cpu {
namespace {

// Decoding tables built from the exact core conversions.
struct Tables {
  std::array<float, 256> e4m3{}, e8m0{}, ue4m3{};
  std::array<float, 16> e2m1{};
  Tables() {
    for (int b = 0; b < 256; ++b) {
      e4m3[b] = e4m3_to_f32(static_cast<uint8_t>(b));
      e8m0[b] = e8m0_to_f32(static_cast<uint8_t>(b));
      ue4m3[b] = ue4m3_to_f32(static_cast<uint8_t>(b));
    }
    for (int b = 0; b < 16; ++b) e2m1[b] = e2m1_to_f32(static_cast<uint8_t>(b));
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

float fp8_block_scale(const ops::Weight& w, int64_t r, int64_t col_block) {
  const int64_t cols = w.scale.dim(1);
  if (w.scale.dtype() == DType::f32) return w.scale.data_as<const float>()[(r / 128) * cols + col_block];
  return tables().e8m0[w.scale.data_as<const uint8_t>()[(r / 128) * cols + col_block]];
}

}  // namespace

RowDequantizer::RowDequantizer(const ops::Weight& w)
    : w_(w), bytes_(static_cast<const uint8_t*>(w.weight.data())) {}

void RowDequantizer::row(int64_t r, float* out) const {
  const int64_t in = w_.in;
  const Tables& t = tables();
  switch (w_.format) {
    case ops::WeightFormat::f32: {
      const float* src = w_.weight.data_as<const float>() + r * in;
      for (int64_t i = 0; i < in; ++i) out[i] = src[i];
      return;
    }
    case ops::WeightFormat::bf16:
      bf16_row_to_f32(w_.weight.data_as<const uint16_t>() + r * in, in, out);
      return;
    case ops::WeightFormat::fp8_block: {
      const uint8_t* src = bytes_ + r * in;
      for (int64_t b = 0; b * 128 < in; ++b) {
        const float scale = fp8_block_scale(w_, r, b);
        for (int64_t i = b * 128; i < std::min(in, (b + 1) * 128); ++i) out[i] = t.e4m3[src[i]] * scale;
      }
      return;
    }
    case ops::WeightFormat::mxfp4:
    case ops::WeightFormat::nvfp4: {
      const uint8_t* src = bytes_ + r * (in / 2);
      const bool mx = w_.format == ops::WeightFormat::mxfp4;
      const int64_t block = mx ? 32 : 16;
      const uint8_t* scales = w_.scale.data_as<const uint8_t>() + r * (in / block);
      for (int64_t b = 0; b < in / block; ++b) {
        // nvfp4: e2m1 * ue4m3 is exact in fp32, so the one rounding is the product with the global scale.
        const float scale = mx ? t.e8m0[scales[b]] : t.ue4m3[scales[b]];
        for (int64_t i = b * block; i < (b + 1) * block; i += 2) {
          const uint8_t byte = src[i / 2];
          out[i] = t.e2m1[byte & 0xf] * scale;
          out[i + 1] = t.e2m1[byte >> 4] * scale;
          if (!mx) {
            out[i] *= w_.global_scale;
            out[i + 1] *= w_.global_scale;
          }
        }
      }
      return;
    }
  }
}

void matmul_rows(const float* x, int64_t T, int64_t x_stride, int64_t rows_per_group, const ops::Weight& w,
                 float* y) {
  std::vector<float> xq;
  if (w.act_fp8) {  // the reference's activations: every row of x fake-quantised in 128-column blocks
    TERN_CHECK(x_stride % ops::kActBlock == 0, "linear ", w.name, ": --activations fp8 needs rows of a multiple of ",
               ops::kActBlock, " columns, got ", x_stride);
    xq.resize(static_cast<size_t>(T * x_stride));
    for (int64_t t = 0; t < T; ++t) ops::act_fake_quant_fp8(x + t * x_stride, x_stride, xq.data() + t * x_stride);
    x = xq.data();
  }
  const RowDequantizer dq(w);
  const int64_t in = w.in, out = w.out;
  // At least ~16k multiply-adds per thread, so tiny products stay on one thread.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, T * in));
  parallel_for(
      0, out,
      [&](int64_t lo, int64_t hi) {
        std::vector<float> row(in);
        for (int64_t r = lo; r < hi; ++r) {
          dq.row(r, row.data());
          const float* xg = x + (r / rows_per_group) * in;
          for (int64_t t = 0; t < T; ++t) y[t * out + r] = dot(xg + t * x_stride, row.data(), in);
        }
      },
      grain);
}

void CpuBackend::linear(const TensorView& x, const ops::Weight& w, const TensorView& y) {
  require_f32("linear", {&x, &y});
  matmul_rows(x.data_as<const float>(), x.dim(0), w.in, w.out, w, y.data_as<float>());
}

void CpuBackend::grouped_linear(const TensorView& x, const ops::Weight& w, const TensorView& y) {
  require_f32("grouped_linear", {&x, &y});
  const int64_t groups = x.dim(1);
  matmul_rows(x.data_as<const float>(), x.dim(0), groups * w.in, w.out / groups, w, y.data_as<float>());
}

void CpuBackend::act_quant_rows(const TensorView& x, const ops::Fp8Rows& out) {
  require_f32("act_quant", {&x});
  const int64_t cols = x.dim(1), blocks = cols / ops::kActBlock, ld = out.scales.row_stride(), xs = x.row_stride();
  parallel_for(0, out.rows, [&](int64_t lo, int64_t hi) {
    std::vector<float> scales(static_cast<size_t>(blocks));
    for (int64_t t = lo; t < hi; ++t) {
      ops::act_quant_fp8(x.data_as<const float>() + t * xs, cols, out.values.data_as<uint8_t>() + t * cols,
                         scales.data());
      for (int64_t b = 0; b < blocks; ++b) out.scales.data_as<float>()[b * ld + t] = scales[static_cast<size_t>(b)];
    }
  });
}

// The dequantised rows (e4m3 * scale, exact in f32) through grouped_linear, whose quantisation of x gives them back.
void CpuBackend::grouped_linear_fp8(const ops::Fp8Rows& x, int64_t groups, const ops::Weight& w, const TensorView& y) {
  const int64_t T = x.rows, cols = x.cols(), ld = x.scales.row_stride();
  Tensor xf(DType::f32, {T, cols});
  parallel_for(0, T, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t)
      for (int64_t c = 0; c < cols; ++c)
        xf.data<float>()[t * cols + c] = e4m3_to_f32(x.values.data_as<const uint8_t>()[t * cols + c]) *
                                         x.scales.data_as<const float>()[(c / ops::kActBlock) * ld + t];
  });
  grouped_linear(xf.view().reshape({T, groups, cols / groups}), w, y);
}

void CpuBackend::dequantize(const ops::Weight& w, const TensorView& out) {
  const RowDequantizer dq(w);
  float* o = out.data_as<float>();
  parallel_for(0, w.out, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) dq.row(r, o + r * w.in);
  });
}

}  // namespace tern::cpu
