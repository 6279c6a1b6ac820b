// The exact products on tensor cores (TERN_EXACT_PATH=tc: linear_exact_tc.cu) against an f64 reference and the
// CPU's f32 one at the V4-Flash and fixture shapes, for every batch size 1..64 and a few beyond; their batch
// invariance (a token's bits alone equal its bits among 64, and in every other batch); the router's top-k picks
// against the f32 paths; the switch and the path names. (CUDA graphs and PDL: GpuPdl.ExactTcChainSameBits...)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/kernels/linear.cuh"
#include "core/error.h"
#include "gpu_test_util.h"
#include "ops/linear.h"
#include "shapes.h"

namespace tern::gputest {
namespace {

using ops::WeightFormat;

// Sets the exact path (process-wide) for a scope: ExactPath::tensor_cores runs linear_exact_tc_kernel on every
// exact product it takes, cuda_cores the f32 CUDA-core kernels.
class ExactPathGuard {
 public:
  explicit ExactPathGuard(cuda::ExactPath p) : saved_(cuda::exact_path()) { cuda::set_exact_path(p); }
  ~ExactPathGuard() { cuda::set_exact_path(saved_); }
  ExactPathGuard(const ExactPathGuard&) = delete;
  ExactPathGuard& operator=(const ExactPathGuard&) = delete;

 private:
  cuda::ExactPath saved_;
};

struct ExactCase {
  const char* name;
  WeightFormat format;
  int64_t out, in;
};

// The exact products of a V4 layer (router gate, the indexer's weights_proj, wq_b and compressor wkv|wgate) and
// odd shapes: FP8 gate rows (GpuPdl's chain), rows not a multiple of 16 / 32 / 128.
std::vector<ExactCase> exact_cases(const Shapes& s) {
  return {
      {"gate", WeightFormat::bf16, s.experts, s.D},
      {"idx.weights_proj", WeightFormat::bf16, s.index_heads, s.D},
      {"idx.wq_b", WeightFormat::fp8_block, s.index_heads * s.index_dim, s.q_rank},
      {"idx.comp wkv|wgate", WeightFormat::bf16, 4 * s.index_dim, s.D},
      {"fp8 gate 8 rows", WeightFormat::fp8_block, 8, s.D},
      {"fp8 odd rows", WeightFormat::fp8_block, 200, s.D},
      {"bf16 odd rows", WeightFormat::bf16, 200, s.D},
  };
}

// LinearParams as the backend's run_linear fills them for x [T, in] (for the path names).
cuda::LinearParams params_of(const ops::Weight& dw, const float* x, int64_t T) {
  cuda::LinearParams p;
  p.w.kind = dw.format == WeightFormat::fp8_block ? cuda::WeightFormat::fp8_block
             : dw.format == WeightFormat::bf16    ? cuda::WeightFormat::bf16
                                                  : cuda::WeightFormat::f32;
  p.w.w = dw.weight.data();
  p.w.s = dw.scale.empty() ? nullptr : dw.scale.data();
  p.w.out = dw.out;
  p.w.in = dw.in;
  p.w.s_cols = dw.scale.empty() ? 0 : dw.scale.dim(1);
  p.w.scale_f32 = !dw.scale.empty() && dw.scale.dtype() == DType::f32;
  p.x = x;
  p.x_stride = dw.in;
  p.rows_per_group = dw.out;
  p.T = T;
  return p;
}

// x W^T in f64 and sum |x_k W_k| per output, from the exact f32 weights.
struct F64Ref {
  std::vector<double> y, mag;
};
F64Ref f64_reference(const Tensor& x, const HostWeight& hw) {
  const int64_t T = x.dim(0), out = hw.w.out, in = hw.w.in;
  Tensor w(DType::f32, {out, in});
  ops::dequantize(cpu::context(), hw.w, w);
  F64Ref r;
  r.y.assign(T * out, 0.0);
  r.mag.assign(T * out, 0.0);
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0.0, m = 0.0;
      for (int64_t k = 0; k < in; ++k) {
        const double p = static_cast<double>(xp[t * in + k]) * wp[o * in + k];
        s += p;
        m += std::fabs(p);
      }
      r.y[t * out + o] = s;
      r.mag[t * out + o] = m;
    }
  return r;
}

// Errors of y [T, out] (host) against the f64 reference rows off .. off + T - 1.
struct Err {
  double max_over_mag = 0.0;  // max |y - y64| / sum |x W|
  double rel = 0.0;           // ||y - y64|| / ||y64||
  int64_t bad = 0;            // not finite
};
Err errors(const float* y, int64_t T, int64_t out, const F64Ref& ref, int64_t off) {
  Err e;
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < T * out; ++i) {
    const double r = ref.y[off * out + i], m = ref.mag[off * out + i];
    if (!std::isfinite(y[i])) {
      ++e.bad;
      continue;
    }
    const double d = y[i] - r;
    diff += d * d;
    norm += r * r;
    if (m > 0) e.max_over_mag = std::max(e.max_over_mag, std::fabs(d) / m);
  }
  e.rel = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
  return e;
}

Tensor rows_of(const Tensor& x, int64_t off, int64_t T) {
  Tensor part(DType::f32, {T, x.dim(1)});
  std::memcpy(part.data<float>(), x.data<float>() + off * x.dim(1), static_cast<size_t>(T * x.dim(1)) * 4);
  return part;
}

int64_t differing_words(const float* a, const float* b, int64_t n) {
  int64_t d = 0;
  for (int64_t i = 0; i < n; ++i) d += std::memcmp(a + i, b + i, 4) != 0;
  return d;
}

// Bounds: the f64 error of an f32 product of these lengths is ~1e-7 of ||y||; a missing lo term (x's bits below
// 2^-16) shows as ~4e-6, a missing mid term as ~1e-3. Against sum |x W| the worst element stays far below 1e-6.
constexpr double kTcRelTol = 1e-6;
constexpr double kTcMagTol = 1e-6;

class GpuExactTc : public ::testing::TestWithParam<Shapes> {};

// Every batch size 1..64, 65, 77 and 100 at a random offset into 100 fresh tokens: within kTcRelTol of the f64
// product (the CPU's f32 product's own error printed beside it), within kTolF32 of the CPU reference, and the
// same bits as the 100-token run's rows.
TEST_P(GpuExactTc, MatchesF64AndCpuAtEveryBatchSize) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  ExactPathGuard tc(cuda::ExactPath::tensor_cores);
  Rand r(fresh_seed());
  cuda::WeightStore store;
  constexpr int64_t N = 100;
  for (const ExactCase& c : exact_cases(s)) {
    const HostWeight hw = random_weight(c.format, c.out, c.in, r, 1.0f / std::sqrt(static_cast<float>(c.in)), c.name);
    ops::Weight dw = store.upload(hw.w);
    dw.exact = true;
    const Tensor x = random_f32({N, c.in}, r);
    const F64Ref ref = f64_reference(x, hw);
    Tensor cpu(DType::f32, {N, c.out});
    ops::linear(cpu::context(), x, hw.w, cpu);
    const Err cpu_err = errors(cpu.data<float>(), N, c.out, ref, 0);
    auto dx = upload(x), dy = poisoned(DType::f32, {N, c.out});
    const std::string path = cuda::linear_exact_path_name(params_of(dw, dx.view().data_as<const float>(), N));
    EXPECT_NE(path.find("linear_exact_tc<"), std::string::npos) << c.name << ": " << path;
    ops::linear(cuda::context(), dx, dw, dy);
    expect_close(dy, cpu, kTolF32, cat("exact tc ", c.name, " T=", N, " vs the CPU"));
    const Tensor all = cuda::to_host(dy);
    Err worst = errors(all.data<float>(), N, c.out, ref, 0);
    int64_t differ = 0, runs = 0;
    std::vector<int64_t> Ts(64);
    std::iota(Ts.begin(), Ts.end(), 1);
    Ts.push_back(65);
    Ts.push_back(77);
    for (const int64_t T : Ts) {
      const int64_t off = r.index(N - T + 1);
      auto dxs = upload(rows_of(x, off, T)), dys = poisoned(DType::f32, {T, c.out});
      ops::linear(cuda::context(), dxs, dw, dys);
      const Tensor part = cuda::to_host(dys);
      const Err e = errors(part.data<float>(), T, c.out, ref, off);
      EXPECT_EQ(e.bad, 0) << c.name << " T=" << T << ": outputs unwritten or not finite";
      worst.max_over_mag = std::max(worst.max_over_mag, e.max_over_mag);
      worst.rel = std::max(worst.rel, e.rel);
      const int64_t d = differing_words(part.data<float>(), all.data<float>() + off * c.out, T * c.out);
      EXPECT_EQ(d, 0) << c.name << ": " << d << " outputs of tokens " << off << ".." << off + T - 1
                      << " differ between a batch of " << T << " and the batch of " << N;
      differ += d;
      ++runs;
    }
    EXPECT_LE(worst.rel, kTcRelTol) << c.name << ": ||y - y64|| / ||y64|| over the bound";
    EXPECT_LE(worst.max_over_mag, kTcMagTol) << c.name << ": max |y - y64| / sum |x W| over the bound";
    std::printf("  %-20s %5lldx%-5lld tc: rel %.2e, max/|xW| %.2e; cpu f32: rel %.2e, max/|xW| %.2e; %lld batches, "
                "%lld words differ from the %lld-token run\n  path: %s\n",
                c.name, static_cast<long long>(c.out), static_cast<long long>(c.in), worst.rel, worst.max_over_mag,
                cpu_err.rel, cpu_err.max_over_mag, static_cast<long long>(runs), static_cast<long long>(differ),
                static_cast<long long>(N), path.c_str());
    ::testing::Test::RecordProperty(cat(c.name, " tc rel").c_str(), cat(worst.rel));
    ::testing::Test::RecordProperty(cat(c.name, " cpu rel").c_str(), cat(cpu_err.rel));
  }
}

// A token's bits alone equal its bits among 64 (and the 64-token run equals itself run twice).
TEST_P(GpuExactTc, TokenAloneEqualsAmong64) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  ExactPathGuard tc(cuda::ExactPath::tensor_cores);
  Rand r(fresh_seed());
  cuda::WeightStore store;
  constexpr int64_t N = 64;
  for (const ExactCase& c : exact_cases(s)) {
    const HostWeight hw = random_weight(c.format, c.out, c.in, r, 1.0f / std::sqrt(static_cast<float>(c.in)), c.name);
    ops::Weight dw = store.upload(hw.w);
    dw.exact = true;
    const Tensor x = random_f32({N, c.in}, r);
    auto dx = upload(x), dy = poisoned(DType::f32, {N, c.out}), dy2 = poisoned(DType::f32, {N, c.out});
    ops::linear(cuda::context(), dx, dw, dy);
    ops::linear(cuda::context(), dx, dw, dy2);
    const Tensor all = cuda::to_host(dy), again = cuda::to_host(dy2);
    EXPECT_EQ(differing_words(all.data<float>(), again.data<float>(), N * c.out), 0) << c.name << ": run twice";
    int64_t differ = 0;
    for (int64_t t = 0; t < N; ++t) {
      auto dxt = upload(rows_of(x, t, 1)), dyt = poisoned(DType::f32, {1, c.out});
      ops::linear(cuda::context(), dxt, dw, dyt);
      const Tensor one = cuda::to_host(dyt);
      differ += differing_words(one.data<float>(), all.data<float>() + t * c.out, c.out);
    }
    EXPECT_EQ(differ, 0) << c.name << ": " << differ << " outputs differ between tokens alone and among " << N;
  }
}

// Indices of the k largest values of v (ties: the lower index), as a sorted set.
std::vector<int> top_k(const float* v, int n, int k) {
  std::vector<int> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int a, int b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

// The router's top-k of the gate logits on the tensor-core path against the f32 paths (CPU; the GPU's CUDA-core
// kernel) over 1 024 fresh tokens in batches of 64. A pick may differ only at a near-tie: where the f64 gap
// between the k-th and (k+1)-th logit is within the two paths' own errors at that token. The mismatches and
// their gaps are printed.
TEST_P(GpuExactTc, RouterTopKMatchesF32) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  cuda::WeightStore store;
  const int64_t E = s.experts, D = s.D, N = 1024, B = 64;
  const int k = static_cast<int>(s.experts_per_token);
  const HostWeight hw = random_weight(WeightFormat::bf16, E, D, r, 1.0f / std::sqrt(static_cast<float>(D)), "gate");
  ops::Weight dw = store.upload(hw.w);
  dw.exact = true;
  const Tensor x = random_f32({N, D}, r);
  const F64Ref ref = f64_reference(x, hw);
  Tensor cpu(DType::f32, {N, E});
  ops::linear(cpu::context(), x, hw.w, cpu);
  auto run = [&](cuda::ExactPath path) {
    ExactPathGuard guard(path);
    Tensor y(DType::f32, {N, E});
    for (int64_t b0 = 0; b0 < N; b0 += B) {
      auto dx = upload(rows_of(x, b0, B)), dy = poisoned(DType::f32, {B, E});
      ops::linear(cuda::context(), dx, dw, dy);
      cuda::copy_to_host(dy, y.view().rows(b0, b0 + B));
    }
    return y;
  };
  const Tensor tc = run(cuda::ExactPath::tensor_cores), cc = run(cuda::ExactPath::cuda_cores);
  struct Pair {
    const char* name;
    const float* a;
    const float* b;
  };
  const Pair pairs[] = {{"tc vs cpu f32", tc.data<float>(), cpu.data<float>()},
                        {"tc vs gpu cuda-cores", tc.data<float>(), cc.data<float>()},
                        {"cpu f32 vs gpu cuda-cores", cpu.data<float>(), cc.data<float>()}};
  for (const Pair& p : pairs) {
    int64_t mismatched = 0, not_near_tie = 0;
    double largest_gap = 0.0;
    for (int64_t t = 0; t < N; ++t) {
      const float* ya = p.a + t * E;
      const float* yb = p.b + t * E;
      if (top_k(ya, static_cast<int>(E), k) == top_k(yb, static_cast<int>(E), k)) continue;
      ++mismatched;
      std::vector<double> v(ref.y.begin() + t * E, ref.y.begin() + (t + 1) * E);
      std::sort(v.begin(), v.end(), std::greater<>());
      const double gap = v[k - 1] - v[k];
      double err = 0.0;
      for (int64_t e = 0; e < E; ++e)
        err = std::max({err, std::fabs(ya[e] - ref.y[t * E + e]), std::fabs(yb[e] - ref.y[t * E + e])});
      largest_gap = std::max(largest_gap, gap);
      const bool near_tie = gap <= 4.0 * err;
      not_near_tie += !near_tie;
      std::printf("  %s: token %lld picks differ: f64 gap between logit %d and %d = %.3e (paths' max error %.3e)%s\n",
                  p.name, static_cast<long long>(t), k, k + 1, gap, err, near_tie ? "" : "  NOT a near-tie");
    }
    std::printf("  %s: top-%d of %lld logits, %lld of %lld tokens pick differently (largest f64 gap %.3e)\n", p.name,
                k, static_cast<long long>(E), static_cast<long long>(mismatched), static_cast<long long>(N),
                largest_gap);
    EXPECT_EQ(not_near_tie, 0) << p.name << ": picks differ away from near-ties";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuExactTc, ::testing::Values(kFixture, kV4Flash), ShapeName());

}  // namespace
}  // namespace tern::gputest
