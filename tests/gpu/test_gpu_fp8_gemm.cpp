// GPU: LibraryGemm::fp8_block, cuBLASLt's FP8 product with DeepSeek's block scales (1x128 activations, 128x128
// weights; sm_90 only), against a host reference in double on fresh random operands: e4m3 weights with random
// e8m0 block scales (converted to f32 on the device by launch_block_scales_f32, as a load would), f32 activations
// quantised on the host by the reference's rule. Tolerance: relative to each output's magnitude
// sum_k |xq sx| |wq sw|. Products of e4m3 are exact, but Hopper's FP8 tensor cores keep only about 14 bits of
// the sum inside a 128-column block before cuBLASLt promotes it to f32 with the scales (DeepSeek-V3 report,
// "Increasing accumulation precision"): measured on an H200 (2026-12-04, 3 fresh-seed runs of every case) the
// worst output was 7.5e-5 .. 1.9e-4 of its magnitude (~2^-13 .. 2^-12); with log-uniform random e4m3 bytes as
// weights (a few products dominating each block) up to 4.8e-4. 1e-3 bounds that with margin and still catches
// a wrong scale (a factor of 2 at least) or layout.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/device_memory.h"
#include "backends/cuda/kernels/gemm_prep.cuh"
#include "backends/cuda/library_gemm.h"
#include "core/dtype.h"
#include "core/error.h"
#include "gpu_test_util.h"

namespace tern::gputest {
namespace {

constexpr int64_t kBlock = 128;
constexpr double kTolMagnitude = 1e-3;

// One product's host operands, in the layouts fp8_block reads (per-group out / in; groups > 1: block-diagonal).
struct Problem {
  int64_t T = 0, out = 0, in = 0, groups = 1;
  std::vector<uint8_t> xq;  // e4m3 [T, groups * in]
  std::vector<float> sx;    // token-major [groups * in / 128][T]
  std::vector<uint8_t> wq;  // e4m3 [groups * out, in]
  std::vector<uint8_t> sw;  // e8m0 [groups * out / 128, in / 128], the checkpoint's layout
  int64_t x_cols() const { return groups * in; }
  int64_t y_cols() const { return groups * out; }
};

// DeepSeek's activation quantisation of one 128-column block (the rule of encode_kv_row, src/ops/kv_row.cpp):
// scale = 2^ceil(log2(max(amax, 1e-4) / 448)) evaluated in double, q = e4m3(x / scale). Returns the scale.
float quantise_block(const float* x, uint8_t* q) {
  float amax = 0.0f;
  for (int64_t i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(x[i]));
  const double exponent = std::ceil(std::log2(std::max<double>(amax, 1e-4f) / 448.0));
  const float scale = static_cast<float>(std::ldexp(1.0, static_cast<int>(exponent)));
  for (int64_t i = 0; i < kBlock; ++i) q[i] = f32_to_e4m3(x[i] / scale);
  return scale;
}

// An FP8 weight as a checkpoint holds it: w / s with the block scale s chosen so that the block's largest |w|
// lands near 448, i.e. about normal with a standard deviation of ~100 (subnormals and saturated values included).
uint8_t random_e4m3(Rand& r) { return f32_to_e4m3(r.normal(100.0f)); }

Problem make_problem(int64_t T, int64_t out, int64_t in, int64_t groups, Rand& r) {
  Problem p;
  p.T = T, p.out = out, p.in = in, p.groups = groups;
  const int64_t xb = p.x_cols() / kBlock;
  // Activations whose 128-column blocks differ in size by up to 2^+-6, so the scales differ block to block.
  std::vector<float> row(p.x_cols());
  p.xq.resize(T * p.x_cols());
  p.sx.resize(xb * T);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < xb; ++b) {
      const float size = std::ldexp(1.0f, static_cast<int>(r.index(13)) - 6);
      for (int64_t i = 0; i < kBlock; ++i) row[b * kBlock + i] = r.fast(size);
    }
    for (int64_t b = 0; b < xb; ++b) p.sx[b * T + t] = quantise_block(&row[b * kBlock], &p.xq[t * p.x_cols() + b * kBlock]);
  }
  p.wq.resize(groups * out * in);
  for (uint8_t& w : p.wq) w = random_e4m3(r);
  // e8m0 scales 2^-14 .. 2^-7 (the checkpoint's are of this order for weights of |w| < 1).
  p.sw.resize(groups * out / kBlock * (in / kBlock));
  for (uint8_t& s : p.sw) s = static_cast<uint8_t>(113 + r.index(8));
  return p;
}

// Reference y[t, c] and its magnitude sum_k |xq sx| |wq sw|, in double, for the listed tokens.
struct Reference {
  std::vector<double> y, magnitude;  // [tokens.size(), y_cols]
};
Reference reference(const Problem& p, const std::vector<int64_t>& tokens) {
  const int64_t kb = p.in / kBlock, Y = p.y_cols();
  std::vector<double> w(p.wq.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = e4m3_to_f32(p.wq[i]);
  Reference ref{std::vector<double>(tokens.size() * Y), std::vector<double>(tokens.size() * Y)};
  std::vector<double> x(p.x_cols());
  for (size_t j = 0; j < tokens.size(); ++j) {
    const int64_t t = tokens[j];
    for (int64_t c = 0; c < p.x_cols(); ++c) x[c] = e4m3_to_f32(p.xq[t * p.x_cols() + c]);
    for (int64_t c = 0; c < Y; ++c) {
      const int64_t g = c / p.out, r = c - g * p.out;  // weight row g * out + r, x columns g * in ..
      const double* wr = &w[(g * p.out + r) * p.in];
      const double* xg = &x[g * p.in];
      double sum = 0, mag = 0;
      for (int64_t b = 0; b < kb; ++b) {
        const double sx = p.sx[(g * kb + b) * p.T + t];
        const double sw = e8m0_to_f32(p.sw[((g * p.out + r) / kBlock) * kb + b]);
        double part = 0, part_mag = 0;
        for (int64_t k = b * kBlock; k < (b + 1) * kBlock; ++k) {
          part += xg[k] * wr[k];
          part_mag += std::fabs(xg[k] * wr[k]);
        }
        sum += sx * sw * part;
        mag += sx * sw * part_mag;
      }
      ref.y[j * Y + c] = sum;
      ref.magnitude[j * Y + c] = mag;
    }
  }
  return ref;
}

// The tokens checked against the host (every token's output is checked for being written): the first and last
// eight (T = 1000 ends inside a 128-token tile) and 48 random ones.
std::vector<int64_t> checked_tokens(int64_t T, Rand& r) {
  std::vector<int64_t> t;
  for (int64_t i = 0; i < 8; ++i) t.push_back(i), t.push_back(T - 1 - i);
  for (int i = 0; i < 48; ++i) t.push_back(r.index(T));
  return t;
}

cuda::DeviceBuffer upload_bytes(const void* data, size_t bytes) {
  cuda::DeviceBuffer d(bytes);
  EXPECT_EQ(cudaMemcpy(d.data(), data, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

// Runs fp8_block on the device and returns y [T, y_cols] on the host.
std::vector<float> run_on_device(cuda::LibraryGemm& lib, const Problem& p) {
  const cudaStream_t s = static_cast<cudaStream_t>(cuda::register_backend().stream());
  cuda::DeviceBuffer xq = upload_bytes(p.xq.data(), p.xq.size()), sx = upload_bytes(p.sx.data(), p.sx.size() * 4),
               wq = upload_bytes(p.wq.data(), p.wq.size()), sw_e8m0 = upload_bytes(p.sw.data(), p.sw.size());
  const int64_t ld = cuda::LibraryGemm::fp8_weight_scale_ld(p.in), scale_rows = p.groups * p.out / kBlock;
  cuda::DeviceBuffer sw(static_cast<size_t>(scale_rows * ld) * 4), y(static_cast<size_t>(p.T * p.y_cols()) * 4);
  cuda::launch_block_scales_f32(sw_e8m0.data(), false, scale_rows, p.in / kBlock, ld, static_cast<float*>(sw.data()), s);
  EXPECT_EQ(cudaMemsetAsync(y.data(), 0xff, y.size(), s), cudaSuccess);  // NaN until written
  lib.fp8_block(s, p.T, p.out, p.in, static_cast<const uint8_t*>(xq.data()), p.x_cols(),
                static_cast<const float*>(sx.data()), static_cast<const uint8_t*>(wq.data()),
                static_cast<const float*>(sw.data()), static_cast<float*>(y.data()), p.y_cols(),
                static_cast<int>(p.groups));
  std::vector<float> host(p.T * p.y_cols());
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(host.data(), y.data(), y.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

void check_case(cuda::LibraryGemm& lib, int64_t T, int64_t out, int64_t in, int64_t groups, Rand& r) {
  const std::string what = cat("fp8_block T=", T, " out=", out, " in=", in, " groups=", groups);
  const Problem p = make_problem(T, out, in, groups, r);
  const std::vector<float> y = run_on_device(lib, p);
  const int64_t unwritten = std::count_if(y.begin(), y.end(), [](float v) { return !std::isfinite(v); });
  EXPECT_EQ(unwritten, 0) << what << ": outputs not written (or not finite)";
  const std::vector<int64_t> tokens = checked_tokens(T, r);
  const Reference ref = reference(p, tokens);
  double worst = 0;
  int64_t worst_t = 0, worst_c = 0;
  for (size_t j = 0; j < tokens.size(); ++j)
    for (int64_t c = 0; c < p.y_cols(); ++c) {
      const double err = std::fabs(y[tokens[j] * p.y_cols() + c] - ref.y[j * p.y_cols() + c]) /
                         std::max(ref.magnitude[j * p.y_cols() + c], 1e-300);
      if (!(err <= worst)) worst = err, worst_t = tokens[j], worst_c = c;
    }
  ::testing::Test::RecordProperty(cat("fp8_err_T", T, "_", out, "x", in, "_g", groups), cat(worst));
  EXPECT_LE(worst, kTolMagnitude) << what << ": worst |y - ref| / magnitude " << worst << " at token " << worst_t
                                  << ", column " << worst_c;
  std::printf("  %s: worst error %.3g of the magnitude\n", what.c_str(), worst);
}

class GpuFp8Gemm : public ::testing::Test {
 protected:
  void SetUp() override {
    TERN_REQUIRE_GPU();
    lib_ = std::make_unique<cuda::LibraryGemm>();
    if (!lib_->fp8_block_supported()) GTEST_SKIP() << "block-scaled FP8 products need an sm_90 card and cuBLASLt >= 12.9";
  }
  std::unique_ptr<cuda::LibraryGemm> lib_;
};

// V4-Flash's wq_a (1024 x 4096) and wkv (512 x 4096) shapes, shared.w2's (4096 x 2048), K blocks not a multiple
// of 4 (640 columns: the padded weight-scale rows), at 512 tokens and at 1000 (not a multiple of 128).
TEST_F(GpuFp8Gemm, AgainstHostReference) {
  Rand r(fresh_seed());
  struct Shape2 {
    int64_t out, in;
  };
  for (const int64_t T : {int64_t{512}, int64_t{1000}})
    for (const Shape2 sh : {Shape2{1024, 4096}, Shape2{512, 4096}, Shape2{4096, 2048}, Shape2{256, 640}})
      check_case(*lib_, T, sh.out, sh.in, 1, r);
}

// A block-diagonal weight (wo_a's form): 2 groups of 256 x 512, group g maps x's columns g * 512.. to y's g * 256...
// Then wo_a itself: 8 groups of 1024 x 4096, more groups than side streams (each stream takes two in turn; y is read
// on the caller's stream only, so a missing join would leave the NaN fill in y).
TEST_F(GpuFp8Gemm, GroupedAgainstHostReference) {
  Rand r(fresh_seed());
  for (const int64_t T : {int64_t{512}, int64_t{1000}}) check_case(*lib_, T, 256, 512, 2, r);
  check_case(*lib_, 512, 1024, 4096, 8, r);
}

// Shapes it cannot take are refused with tern::Error before anything runs.
TEST_F(GpuFp8Gemm, RefusesUnsupportedShapes) {
  cuda::DeviceBuffer x(4096 * 512), w(512 * 512), sx(4096 * 4 * 4), sw(4 * 4 * 4), y(4096 * 512 * 4);
  const auto* xq = static_cast<const uint8_t*>(x.data());
  const auto* wq = static_cast<const uint8_t*>(w.data());
  const auto* sxp = static_cast<const float*>(sx.data());
  const auto* swp = static_cast<const float*>(sw.data());
  auto* yp = static_cast<float*>(y.data());
  const cudaStream_t s = static_cast<cudaStream_t>(cuda::register_backend().stream());
  EXPECT_THROW(lib_->fp8_block(s, 1001, 512, 512, xq, 512, sxp, wq, swp, yp, 512), Error);  // T % 4
  EXPECT_THROW(lib_->fp8_block(s, 512, 500, 512, xq, 512, sxp, wq, swp, yp, 512), Error);   // out % 128
  EXPECT_THROW(lib_->fp8_block(s, 512, 512, 500, xq, 512, sxp, wq, swp, yp, 512), Error);   // in % 128
  EXPECT_THROW(lib_->fp8_block(s, 512, 512, 512, xq + 8, 512, sxp, wq, swp, yp, 512), Error);  // x alignment
}

}  // namespace
}  // namespace tern::gputest
