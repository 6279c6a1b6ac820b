// GPU vs CPU: --activations fp8 (ops/act_quant.h). The quantiser gives the CPU's bytes and scales bit for bit;
// FP8 products with quantised x (linear_x8_kernel below 512 tokens, cuBLASLt's block-scaled FP8 product for
// prefill chunks, the dequantised x through linear_stream for other shapes) equal the CPU's f32 sums of the same
// exact products within the FP8 tensor cores' sums; and a token's bits do not depend on its batch.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <string_view>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/device_memory.h"
#include "backends/cuda/kernels/act_quant.cuh"
#include "backends/cuda/kernels/linear_x8.cuh"
#include "backends/cuda/kernels/moe.cuh"
#include "backends/cuda/kernels/moe_grouped_e4m3.cuh"
#include "core/dtype.h"
#include "gpu_test_util.h"
#include "ops/act_quant.h"
#include "ops/linear.h"
#include "ops/moe.h"
#include "shapes.h"

namespace tern::gputest {
namespace {

using ops::WeightFormat;

// Rows with the spread real activations have: a few large outliers, tiny blocks (amax under the 1e-4 floor)
// and values that round to e4m3's subnormals.
Tensor spread_rows(int64_t T, int64_t cols, Rand& r) {
  Tensor x = random_f32({T, cols}, r);
  float* v = x.data<float>();
  for (int64_t i = 0; i < T * cols; ++i) {
    const int64_t block = i / 128;
    if (block % 7 == 3) v[i] *= 1e-6f;      // amax below the floor
    else if (block % 5 == 1) v[i] *= 300.0f;  // large
    if (r.index(97) == 0) v[i] *= 64.0f;     // outliers
  }
  return x;
}

// The e4m3 grouped kernels' precondition (moe_e4m3_fold_ok): every row's four MXFP4 scales of a 128-column group
// within 2^8 of their largest. RandomExperts' scales (base +- 1) pass; one scale byte moved 9 below its group's
// others fails, 8 below passes.
TEST(GpuActFp8, E4m3FoldCheckFindsTheSpread) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  constexpr int64_t E = 4, D = 256, inter = 256;
  RandomExperts experts(ops::WeightFormat::mxfp4, E, D, inter, r);
  std::vector<cuda::ExpertDesc> host(E);
  for (int64_t e = 0; e < E; ++e) {
    const ops::Weight* ws[3] = {&experts.on_device[e].w1, &experts.on_device[e].w2, &experts.on_device[e].w3};
    for (int i = 0; i < 3; ++i) host[e].w[i] = ws[i]->weight.data(), host[e].s[i] = ws[i]->scale.data();
  }
  cuda::DeviceBuffer table(E * sizeof(cuda::ExpertDesc));
  ASSERT_EQ(cudaMemcpy(table.data(), host.data(), table.size(), cudaMemcpyHostToDevice), cudaSuccess);
  const auto s = static_cast<cudaStream_t>(cuda::register_backend().stream());
  const auto* t = static_cast<const cuda::ExpertDesc*>(table.data());
  EXPECT_TRUE(cuda::moe_e4m3_fold_ok(t, E, D, inter, s));
  // Expert 2's w2 (rows of inter / 32 = 8 scale bytes), row 5, the second 128-column group: byte 6.
  auto* scale = static_cast<uint8_t*>(const_cast<void*>(experts.on_device[2].w2.scale.data())) + 5 * (inter / 32) + 6;
  uint8_t group[4];
  ASSERT_EQ(cudaMemcpy(group, scale - 2, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  const int lo = std::min({group[0], group[1], group[3]}), hi = std::max({group[0], group[1], group[3]});
  for (const int shift : {8, 9}) {
    const uint8_t v = static_cast<uint8_t>(hi - shift);
    ASSERT_GE(lo, hi - 2);
    ASSERT_EQ(cudaMemcpy(scale, &v, 1, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cuda::moe_e4m3_fold_ok(t, E, D, inter, s), shift <= 8) << "a scale " << shift << " below its group's largest";
  }
}

// The e4m3 grouped kernels with every fold shift: each 128-column group of every row gets scales 0..8 below its
// largest (8 and 0 always among them), so the magnitude tables of every shift and e4m3's subnormal weights
// (0.5 x 2^-d for d >= 6) reach the tensor cores; against the CPU at 32-pair (100 tokens) and 64-pair tiles (600),
// and the calls counted on the e4m3 kernels (TERN_MOE_GROUPED=e4m3 falls back where it cannot run).
TEST(GpuActFp8, E4m3EveryFoldShiftAgainstCpu) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  constexpr int64_t E = 8, k = 2, D = 256, inter = 384;
  cuda::CudaBackend& be = cuda::register_backend();
  // T = 100 on the grouped kernels (the default takes them from 129 since session 22: the bulk ring below).
  const MoeGroupedMinTokensGuard grouped_from_65(65);
  setenv("TERN_MOE_GROUPED", "e4m3", 1);
  RandomExperts experts(ops::WeightFormat::mxfp4, E, D, inter, r);
  for (auto* list : {&experts.on_host, &experts.on_device})
    for (ops::Expert& e : *list) e.w1.act_fp8 = e.w2.act_fp8 = e.w3.act_fp8 = true;
  for (size_t m = 0; m < experts.host.size(); ++m) {
    Tensor& sc = experts.host[m].scale;
    auto* b = sc.data<uint8_t>();
    for (int64_t g = 0; g < sc.numel() / 4; ++g) {  // rows hold a whole number of 4-scale groups (K % 128 == 0)
      const int top = 124 + static_cast<int>(r.index(5));
      const int hot = static_cast<int>(r.index(4)), cold = (hot + 1 + static_cast<int>(r.index(3))) % 4;
      for (int j = 0; j < 4; ++j)
        b[4 * g + j] = static_cast<uint8_t>(top - (j == hot ? 0 : j == cold ? 8 : static_cast<int>(r.index(9))));
    }
    const ops::Expert& de = experts.on_device[m / 3];
    const ops::Weight& dw = m % 3 == 0 ? de.w1 : m % 3 == 1 ? de.w2 : de.w3;
    ASSERT_EQ(cudaMemcpy(const_cast<void*>(static_cast<const void*>(dw.scale.data())), b, sc.nbytes(),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  for (const int64_t T : {int64_t{100}, int64_t{600}}) {
    const Tensor x = spread_rows(T, D, r), w = random_f32({T, k}, r, 0.5f);
    Tensor idx(DType::i32, {T, k});
    for (int64_t t = 0; t < T; ++t) {
      const int32_t a = static_cast<int32_t>(r.index(E));
      idx.data<int32_t>()[t * k] = a, idx.data<int32_t>()[t * k + 1] = static_cast<int32_t>((a + 1 + r.index(E - 1)) % E);
    }
    Tensor ref(DType::f32, {T, D});
    ops::moe_experts(cpu::context(), ops::MoeExpertsArgs{x, idx, w, experts.on_host, 10.0f, ref});
    auto dx = upload(x), dw = upload(w), didx = upload(idx), y = poisoned(DType::f32, {T, D});
    const int64_t before = be.moe_e4m3_calls();
    ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, experts.on_device, 10.0f, y});
    EXPECT_EQ(be.moe_e4m3_calls(), before + 1) << "T=" << T << ": not on the e4m3 kernels (" << be.moe_path(experts.on_device[0].w1, T, k) << ")";
    expect_close(y, ref, kTolBf16, cat("moe e4m3, every fold shift, T=", T));
  }
  unsetenv("TERN_MOE_GROUPED");
}

TEST(GpuActFp8, QuantiserEqualsCpu) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  for (const int64_t T : {1, 5, 37, 64}) {
    const int64_t cols = 4096, blocks = cols / 128;
    const Tensor x = spread_rows(T, cols, r);
    std::vector<uint8_t> q(T * cols);
    std::vector<float> s(T * blocks), fq(T * cols), xb(T * cols), fqb(T * cols);
    // The in-place bf16 form (the experts' h on the prefill paths) quantises bf16 rows: x rounded to bf16 first.
    Tensor xh(DType::bf16, {T, cols});
    for (int64_t i = 0; i < T * cols; ++i) {
      xh.data<uint16_t>()[i] = f32_to_bf16(x.data<float>()[i]);
      xb[i] = bf16_to_f32(xh.data<uint16_t>()[i]);
    }
    for (int64_t t = 0; t < T; ++t) {
      ops::act_quant_fp8(x.data<float>() + t * cols, cols, q.data() + t * cols, s.data() + t * blocks);
      ops::act_fake_quant_fp8(x.data<float>() + t * cols, cols, fq.data() + t * cols);
      ops::act_fake_quant_fp8(xb.data() + t * cols, cols, fqb.data() + t * cols);
    }
    auto dx = upload(x);
    auto dq = poisoned(DType::u8, {T, cols});
    auto ds = poisoned(DType::f32, {T, blocks}), dst = poisoned(DType::f32, {blocks, T});
    auto df = poisoned(DType::f32, {T, cols}), db = upload(xh);
    const cuda::ActRows rows{dx.view().data_as<const float>(), T, cols, cols};
    cuda::launch_act_quant(rows, dq.view().data_as<uint8_t>(), ds.view().data_as<float>(), nullptr);
    cuda::launch_act_quant(rows, dq.view().data_as<uint8_t>(), dst.view().data_as<float>(), nullptr, T);  // token-major
    cuda::launch_act_fake_quant(rows, df.view().data_as<float>(), cols, nullptr);
    cuda::launch_act_fake_quant_bf16_inplace(cuda::Bf16Rows{db.view().data_as<uint16_t>(), T, cols, cols, 0}, nullptr);
    // The same rows in the grouped wgmma kernels' planes ((c / 8) * planes + r) * 8 + c % 8, with 3 padding rows a
    // plane that must stay as they are.
    const int64_t planes = T + 3;
    Tensor xp(DType::bf16, {cols / 8, planes, 8});
    for (int64_t i = 0; i < xp.numel(); ++i) xp.data<uint16_t>()[i] = static_cast<uint16_t>(0x3f80 + i % 7);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < cols; ++c) xp.data<uint16_t>()[((c / 8) * planes + t) * 8 + c % 8] = xh.data<uint16_t>()[t * cols + c];
    auto dp = upload(xp);
    cuda::launch_act_fake_quant_bf16_inplace(cuda::Bf16Rows{dp.view().data_as<uint16_t>(), T, cols, 0, planes}, nullptr);
    const Tensor hq = cuda::to_host(dq), hs = cuda::to_host(ds), hst = cuda::to_host(dst);
    const Tensor hf = cuda::to_host(df), hb = cuda::to_host(db), hp = cuda::to_host(dp);
    int64_t bad_q = 0, bad_s = 0, bad_f = 0, bad_b = 0, bad_p = 0;
    for (int64_t i = 0; i < T * cols; ++i) {
      bad_q += hq.data<uint8_t>()[i] != q[i];
      bad_f += std::memcmp(hf.data<float>() + i, fq.data() + i, 4) != 0;
      bad_b += bf16_to_f32(hb.data<uint16_t>()[i]) != fqb[i];
      const int64_t t = i / cols, c = i % cols;
      bad_p += bf16_to_f32(hp.data<uint16_t>()[((c / 8) * planes + t) * 8 + c % 8]) != fqb[i];
    }
    for (int64_t i = 0; i < xp.numel(); ++i)
      bad_p += (i / 8) % planes >= T && hp.data<uint16_t>()[i] != xp.data<uint16_t>()[i];
    for (int64_t t = 0; t < T; ++t)
      for (int64_t b = 0; b < blocks; ++b)
        bad_s += hs.data<float>()[t * blocks + b] != s[t * blocks + b] || hst.data<float>()[b * T + t] != s[t * blocks + b];
    EXPECT_EQ(bad_q, 0) << "e4m3 bytes differ from the CPU's, T=" << T;
    EXPECT_EQ(bad_s, 0) << "scales (row- or token-major) differ from the CPU's, T=" << T;
    EXPECT_EQ(bad_f, 0) << "dequantised f32 differs from the CPU's, T=" << T;
    EXPECT_EQ(bad_b, 0) << "bf16 rows quantised in place differ from the CPU's, T=" << T;
    EXPECT_EQ(bad_p, 0) << "bf16 planes quantised in place differ from the CPU's (or padding changed), T=" << T;
  }
}

class GpuActFp8Linear : public ::testing::TestWithParam<Shapes> {};

struct Case {
  const char* name;
  int64_t out, in;
};

std::vector<Case> fp8_cases(const Shapes& s) {
  return {{"wq_a", s.q_rank, s.D},
          {"wq_b", s.heads * s.head_dim, s.q_rank},
          {"wkv", s.head_dim, s.D},
          {"wo_b", s.D, s.groups * s.o_rank},
          {"shared.w1", s.inter, s.D},
          {"shared.w2", s.D, s.inter},
          {"fp8 odd rows (not the x8 kernel's)", 200, s.D}};
}

// Tolerance: the products are exact on both sides (e4m3 x e4m3); the FP8 tensor cores (linear_x8's wgmma and
// cuBLASLt's product for prefill chunks) keep about 14 bits of each 128-column block's sum, as DeepSeek measured
// on Hopper (their reference runs the same kind of product): measured 1-4e-4 of a product's norm. The paths that
// take the dequantised x (shapes linear_x8 does not take) sum in f32: ~1e-7.
constexpr double kTolActFp8 = 1e-3;
double act_fp8_tol(int64_t) { return kTolActFp8; }

TEST_P(GpuActFp8Linear, AgainstCpu) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  cuda::WeightStore store;
  for (const Case& c : fp8_cases(s)) {
    if (c.in % 128 != 0) continue;  // refused with a clear error (RefusesUnalignedRows)
    HostWeight hw = random_weight(WeightFormat::fp8_block, c.out, c.in, r, 1.0f / std::sqrt(static_cast<float>(c.in)),
                                  c.name);
    hw.w.act_fp8 = true;
    ops::Weight dw = store.upload(hw.w);
    dw.act_fp8 = true;
    const bool big = c.out * c.in > (64LL << 20);
    // 1 .. 64: one token tile of 1, 2, 4, 8 n-tiles; 100: two tiles; 600: a prefill chunk (library path).
    for (int64_t T : big ? std::vector<int64_t>{1, 16} : std::vector<int64_t>{1, 3, 16, 33, 64, 100, 600}) {
      const Tensor x = spread_rows(T, c.in, r);
      Tensor ref(DType::f32, {T, c.out});
      ops::linear(cpu::context(), x, hw.w, ref);
      auto dx = upload(x), y = poisoned(DType::f32, {T, c.out});
      ops::linear(cuda::context(), dx, dw, y);
      expect_close(y, ref, act_fp8_tol(T), cat("linear act fp8 ", c.name, " T=", T));
    }
  }
}

// The shape's wo_a with FP8 activations, on the host and uploaded.
struct WoA {
  HostWeight hw;
  cuda::WeightStore store;
  ops::Weight dw;
};
void make_wo_a(const Shapes& s, int64_t in_g, Rand& r, WoA& w) {
  w.hw = random_weight(WeightFormat::fp8_block, s.groups * s.o_rank, in_g, r, 1.0f / std::sqrt(static_cast<float>(in_g)),
                       "wo_a");
  w.hw.w.act_fp8 = true;
  w.dw = w.store.upload(w.hw.w);
  w.dw.act_fp8 = true;
}

TEST_P(GpuActFp8Linear, GroupedAgainstCpu) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  const int64_t in_g = s.heads / s.groups * s.head_dim;
  if (in_g % 128 != 0) GTEST_SKIP() << "in_g " << in_g << " is not a multiple of 128";
  WoA wo;
  make_wo_a(s, in_g, r, wo);
  const HostWeight& hw = wo.hw;
  const ops::Weight& dw = wo.dw;
  for (int64_t T : {1, 16, 64, 100, 600}) {
    const Tensor x = spread_rows(T, s.groups * in_g, r);
    Tensor xv(DType::f32, {T, s.groups, in_g});
    std::memcpy(xv.data<float>(), x.data<float>(), x.nbytes());
    Tensor ref(DType::f32, {T, s.groups, s.o_rank});
    ops::grouped_linear(cpu::context(), xv, hw.w, ref);
    auto dx = upload(xv), y = poisoned(DType::f32, {T, s.groups, s.o_rank});
    ops::grouped_linear(cuda::context(), dx, dw, y);
    expect_close(y, ref, act_fp8_tol(T), cat("grouped_linear act fp8 wo_a T=", T));
  }
}

// wo_a on rows already quantised (ops::Fp8Rows, what sparse_attention hands it for a prefill chunk): act_quant's rows
// of x, then grouped_linear from them, give grouped_linear's bits on x itself, on the library (600, and 601 with its
// padding row garbage) and on the own kernels (1, 64: the rows dequantised and quantised back); the CPU's FP8 rows
// the CPU's bits. Rows are written in two slices, as the model writes a step's tables rows and chunk rows.
TEST_P(GpuActFp8Linear, GroupedFromFp8RowsBitIdentical) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  const int64_t in_g = s.heads / s.groups * s.head_dim, width = s.groups * in_g;
  if (in_g % 128 != 0) GTEST_SKIP() << "in_g " << in_g << " is not a multiple of 128";
  WoA wo;
  make_wo_a(s, in_g, r, wo);
  const HostWeight& hw = wo.hw;
  const ops::Weight& dw = wo.dw;
  for (int64_t T : {1, 64, 600, 601}) {
    const Tensor x = spread_rows(T, width, r);
    const int64_t P = ops::Fp8Rows::padded_rows(T), cut = T / 3;
    auto dx = upload(x);
    auto values = poisoned(DType::u8, {P, width}), scales = poisoned(DType::f32, {width / 128, P});
    const ops::Fp8Rows rows{values, scales, T};
    ops::act_quant(cuda::context(), dx.view().rows(0, cut), rows.slice(0, cut));
    ops::act_quant(cuda::context(), dx.view().rows(cut, T), rows.slice(cut, T));
    auto want = poisoned(DType::f32, {T, s.groups, s.o_rank}), got = poisoned(DType::f32, {T, s.groups, s.o_rank});
    ops::grouped_linear(cuda::context(), dx.view().reshape({T, s.groups, in_g}), dw, want);
    ops::grouped_linear(cuda::context(), rows, s.groups, dw, got);
    const Tensor w = cuda::to_host(want), g = cuda::to_host(got);
    EXPECT_EQ(std::memcmp(w.data<float>(), g.data<float>(), w.nbytes()), 0)
        << "wo_a from FP8 rows is not grouped_linear's bits, T=" << T;
    // The CPU: its FP8 rows through its grouped_linear give its grouped_linear's bits too.
    Tensor hv(DType::u8, {P, width}), hs(DType::f32, {width / 128, P});
    const ops::Fp8Rows host_rows{hv, hs, T};
    ops::act_quant(cpu::context(), x, host_rows);
    Tensor ref(DType::f32, {T, s.groups, s.o_rank}), ref8(DType::f32, {T, s.groups, s.o_rank});
    ops::grouped_linear(cpu::context(), x.view().reshape({T, s.groups, in_g}), hw.w, ref);
    ops::grouped_linear(cpu::context(), host_rows, s.groups, hw.w, ref8);
    EXPECT_EQ(std::memcmp(ref.data<float>(), ref8.data<float>(), ref.nbytes()), 0) << "CPU, T=" << T;
    // The quantised rows themselves: the GPU's bytes and scales are the CPU's.
    const Tensor gv = cuda::to_host(values), gs = cuda::to_host(scales);
    EXPECT_EQ(std::memcmp(gv.data<uint8_t>(), hv.data<uint8_t>(), static_cast<size_t>(T * width)), 0) << "bytes, T=" << T;
    for (int64_t b = 0; b < width / 128; ++b)
      ASSERT_EQ(std::memcmp(gs.data<float>() + b * P, hs.data<float>() + b * P, static_cast<size_t>(T) * 4), 0)
          << "scales of block " << b << ", T=" << T;
    expect_close(got, ref, act_fp8_tol(T), cat("grouped_linear from FP8 rows, wo_a T=", T));
  }
}

// A token's bits do not depend on the batch (other token tiles, K-split choices, n-tile counts).
TEST_P(GpuActFp8Linear, BatchInvariant) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  cuda::WeightStore store;
  const int64_t N = 100;
  // linear_x8 at every row count up to N (the library takes 65+ by default since session 22: not batch invariant).
  const KnobGuard own_kernels("TERN_DENSE_LIBRARY_MIN_TOKENS", cuda::CudaBackend::library_min_tokens());
  for (const Case& c : fp8_cases(s)) {
    if (c.in % 128 != 0 || c.out * c.in > (64LL << 20)) continue;
    HostWeight hw = random_weight(WeightFormat::fp8_block, c.out, c.in, r, 1.0f / std::sqrt(static_cast<float>(c.in)),
                                  c.name);
    ops::Weight dw = store.upload(hw.w);
    dw.act_fp8 = true;
    expect_linear_batch_invariant(spread_rows(N, c.in, r), dw, r, cat("act fp8 ", c.name));
  }
}

// One of V4's FP8 decode products at T tokens as linear_x8 takes it (for_each_x8_product): the case, its uploaded
// weight (act_fp8) and x on the device.
struct X8Product {
  const Case& c;
  int64_t groups, T;
  const ops::Weight& w;
  const TensorView& x;

  // The op's output on the host (y poisoned first; grouped_linear for the grouped wo_a).
  Tensor run() const {
    auto y = poisoned(DType::f32, groups > 1 ? Shape{T, groups, c.out / groups} : Shape{T, c.out});
    if (groups > 1) ops::grouped_linear(cuda::context(), x, w, y);
    else ops::linear(cuda::context(), x, w, y);
    return cuda::to_host(y);
  }
  // The params the backend builds for it, with an unbounded split-K workspace.
  cuda::LinearParams params(const cuda::CudaBackend& be) const {
    cuda::LinearParams p;
    p.w.kind = cuda::WeightFormat::fp8_block;
    p.w.w = w.weight.data();
    p.w.s = w.scale.data();
    p.w.out = c.out;
    p.w.in = c.in;
    p.w.s_cols = w.scale.dim(1);
    p.x = x.data_as<const float>();
    p.x_stride = groups * c.in;
    p.rows_per_group = c.out / groups;
    p.T = T;
    p.num_sms = be.num_sms();
    p.partial_floats = INT64_MAX;
    p.num_counters = INT64_MAX;
    return p;
  }
};

// `check` for each FP8 product of fp8_cases that linear_x8 takes and the grouped wo_a, at each T of `tokens`, on
// fresh random weights and x.
void for_each_x8_product(const Shapes& s, std::initializer_list<int64_t> tokens, Rand& r,
                         const std::function<void(const X8Product&)>& check) {
  cuda::WeightStore store;
  std::vector<Case> cases = fp8_cases(s);
  cases.push_back({"wo_a (grouped)", s.groups * s.o_rank, s.heads / s.groups * s.head_dim});
  for (const Case& c : cases) {
    if (c.in % 128 != 0 || c.out % 128 != 0) continue;
    const int64_t groups = std::string_view(c.name) == "wo_a (grouped)" ? s.groups : 1, cols = groups * c.in;
    HostWeight hw = random_weight(WeightFormat::fp8_block, c.out, c.in, r, 1.0f / std::sqrt(static_cast<float>(c.in)),
                                  c.name);
    ops::Weight dw = store.upload(hw.w);
    dw.act_fp8 = true;
    for (int64_t T : tokens) {
      const Tensor x = spread_rows(T, cols, r);
      auto dx = upload(groups > 1 ? x.view().reshape({T, groups, c.in}) : x.view());
      check(X8Product{c, groups, T, dw, dx});
    }
  }
}

int64_t differing_floats(const Tensor& a, const Tensor& b) {
  int64_t differ = 0;
  for (int64_t i = 0; i < a.numel(); ++i) differ += std::memcmp(a.data<float>() + i, b.data<float>() + i, 4) != 0;
  return differ;
}

// linear_x8 quantising x itself (up to 8 tokens: linear_x8_quantises_x) gives act_quant + linear_x8's bits, the
// grouped wo_a included; the products of V4-Flash's decode shapes take it at 1-8 tokens (so the comparison is of
// the two forms, not of one form with itself).
TEST_P(GpuActFp8Linear, QuantisingKernelBitIdentical) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  cuda::CudaBackend& be = cuda::register_backend();
  for_each_x8_product(s, {1, 3, 8, 9, 16, 17}, r, [&](const X8Product& q) {
    Tensor got[2];
    const int64_t before = be.fused_quant_calls().linear_x8;
    for (int fused = 0; fused < 2; ++fused) {
      be.set_x8_quantises_x(fused == 1);
      got[fused] = q.run();
    }
    be.set_x8_quantises_x(true);
    const bool quantising = be.fused_quant_calls().linear_x8 == before + 1;
    EXPECT_EQ(differing_floats(got[0], got[1]), 0)
        << q.c.name << " T=" << q.T << ": outputs differ between act_quant + linear_x8 and the quantising kernel";
    if (s.D >= 4096 && q.T <= 8) {  // V4-Flash's decode products take the quantising form (split K as they run)
      EXPECT_TRUE(quantising) << q.c.name << " T=" << q.T << ": the quantising form did not run";
      EXPECT_TRUE(cuda::linear_x8_quantises_x(q.params(be))) << q.c.name << " T=" << q.T;
    }
  });
}

// linear_x8's K splits added as one thread-block cluster through shared memory (TERN_X8_CLUSTER) give the bits of
// the workspace's split (finish_split_k): the same splits, added in split order from 0. At every token tile (8, 16,
// 32, 64: 1-64 tokens), in the quantising form and after act_quant, the grouped wo_a included; at V4-Flash's decode
// shapes the split products must take the cluster (so the comparison is of the two ways, not of one with itself).
TEST_P(GpuActFp8Linear, ClusterSplitBitIdentical) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  cuda::CudaBackend& be = cuda::register_backend();
  int64_t clustered = 0;
  for_each_x8_product(s, {1, 5, 8, 9, 16, 23, 32, 40, 64}, r, [&](const X8Product& q) {
    Tensor got[2];
    for (int cluster = 0; cluster < 2; ++cluster) {
      const gputest::KnobGuard way("TERN_X8_CLUSTER", cluster);
      got[cluster] = q.run();
    }
    EXPECT_EQ(differing_floats(got[0], got[1]), 0)
        << q.c.name << " T=" << q.T << ": outputs differ between the workspace's split and the cluster's";
    cuda::LinearParams p = q.params(be);
    p.cluster_split = true;
    clustered += cuda::linear_x8_splits_in_cluster(p);
  });
  if (s.D >= 4096) EXPECT_GT(clustered, 20) << "V4-Flash's split decode products did not take the cluster";
}

// The routed experts with fp8 activations (x and h quantised) on every path against the CPU: the bulk kernels (1-64
// tokens, and 100), the grouped prefill kernels (600 tokens: mma.sync and wgmma forced), and the
// library's per-expert products (600, set_moe_prefill_library). The products sum in f32 on every path.
TEST_P(GpuActFp8Linear, MoeAgainstCpu) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  if (s.D % 128 != 0 || s.inter % 128 != 0) GTEST_SKIP() << "D and inter must be multiples of 128";
  Rand r(fresh_seed());
  const int64_t E = std::min<int64_t>(s.experts, 16), k = s.experts_per_token, D = s.D, inter = s.inter;
  cuda::CudaBackend& be = cuda::register_backend();
  // The runs at 100 tokens without decode_kernels are the grouped kernels' (from 65, the default of sessions 19-21).
  const MoeGroupedMinTokensGuard grouped_from_65(65);
  for (ops::WeightFormat f : {ops::WeightFormat::mxfp4, ops::WeightFormat::nvfp4}) {
    RandomExperts experts(f, E, D, inter, r);
    for (auto* list : {&experts.on_host, &experts.on_device})
      for (ops::Expert& e : *list) e.w1.act_fp8 = e.w2.act_fp8 = e.w3.act_fp8 = true;
    struct Run {
      int64_t T;
      const char* grouped;  // TERN_MOE_GROUPED for prefill chunks ("" unset)
      bool library;
      bool decode_kernels = false;  // below the library threshold on the decode kernels (100: the bulk kernels since session 21)
    };
    // e4m3 (TERN_MOE_GROUPED=e4m3, moe_grouped_e4m3.cuh): MXFP4 experts take the e4m3 kernels (32-pair tiles at 100
    // tokens, 64 at 600), NVFP4 ones the bf16 wgmma kernel (its scales do not fold); both against the CPU.
    for (const Run& run : {Run{1, "", false}, Run{16, "", false}, Run{64, "", false}, Run{100, "", false, true},
                           Run{100, "", false}, Run{600, "mma", false}, Run{600, "wgmma", false}, Run{600, "", true},
                           Run{100, "e4m3", false}, Run{600, "e4m3", false}}) {
      const int64_t T = run.T;
      const Tensor x = spread_rows(T, D, r), w = random_f32({T, k}, r, 0.5f);
      const Tensor idx = random_picks(T, E, k, r);
      Tensor ref(DType::f32, {T, D});
      ops::moe_experts(cpu::context(), ops::MoeExpertsArgs{x, idx, w, experts.on_host, 10.0f, ref});
      auto dx = upload(x), dw = upload(w), didx = upload(idx), y = poisoned(DType::f32, {T, D});
      if (*run.grouped != '\0') setenv("TERN_MOE_GROUPED", run.grouped, 1);
      be.set_moe_prefill_library(run.library);
      const bool e4m3 = std::string_view(run.grouped) == "e4m3";
      if (e4m3)
        EXPECT_EQ(be.moe_path(experts.on_device[0].w1, T, k).find("moe_grouped_e4m3_kernel") != std::string::npos,
                  f == ops::WeightFormat::mxfp4)
            << be.moe_path(experts.on_device[0].w1, T, k);
      const int64_t e4m3_before = be.moe_e4m3_calls();
      {
        const MoeGroupedMinTokensGuard paths(run.decode_kernels ? cuda::CudaBackend::library_min_tokens()
                                                                : be.moe_grouped_min_tokens());
        ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, experts.on_device, 10.0f, y});
      }
      unsetenv("TERN_MOE_GROUPED");
      be.set_moe_prefill_library(false);
      if (e4m3)  // MXFP4 on the e4m3 kernels (RandomExperts' scales fold), NVFP4 on the bf16 wgmma ones
        EXPECT_EQ(be.moe_e4m3_calls(), e4m3_before + (f == ops::WeightFormat::mxfp4 ? 1 : 0)) << "T=" << T;
      expect_close(y, ref, kTolBf16,
                   cat("moe act fp8 ", ops::weight_format_name(f), " T=", T, run.library ? " library" : "",
                       run.decode_kernels ? " decode kernels" : "",
                       *run.grouped != '\0' ? cat(" grouped ", run.grouped) : std::string()));
    }
  }
}

// The bulk decode kernels quantising x and h as they stage them (set_moe_stage_quant, the default) give the bits of
// quantising both first (act_fake_quant launches), at 1-100 tokens (100: the bulk kernels with the grouped ones held
// off), MXFP4 and NVFP4, rows with the spread of real activations (tiny blocks, outliers, subnormal e4m3).
TEST_P(GpuActFp8Linear, MoeStageQuantBitIdentical) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  if (s.D % 128 != 0 || s.inter % 128 != 0) GTEST_SKIP() << "D and inter must be multiples of 128";
  Rand r(fresh_seed());
  const int64_t E = std::min<int64_t>(s.experts, 16), k = s.experts_per_token, D = s.D;
  cuda::CudaBackend& be = cuda::register_backend();
  const MoeGroupedMinTokensGuard decode_kernels(cuda::CudaBackend::library_min_tokens());
  for (ops::WeightFormat f : {ops::WeightFormat::mxfp4, ops::WeightFormat::nvfp4}) {
    RandomExperts experts(f, E, D, s.inter, r);
    for (ops::Expert& e : experts.on_device) e.w1.act_fp8 = e.w2.act_fp8 = e.w3.act_fp8 = true;
    for (int64_t T : {1, 3, 16, 64, 100}) {
      const Tensor x = spread_rows(T, D, r), w = random_f32({T, k}, r, 0.5f);
      const Tensor idx = random_picks(T, E, k, r);
      auto dx = upload(x), dw = upload(w), didx = upload(idx);
      Tensor got[2];
      const int64_t before = be.fused_quant_calls().moe_staged;
      for (int staged = 0; staged < 2; ++staged) {
        be.set_moe_stage_quant(staged == 1);
        auto y = poisoned(DType::f32, {T, D});
        ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, experts.on_device, 10.0f, y});
        got[staged] = cuda::to_host(y);
      }
      be.set_moe_stage_quant(true);
      EXPECT_EQ(be.fused_quant_calls().moe_staged, before + 1)
          << ops::weight_format_name(f) << " T=" << T << ": the staged quantisation did not run ("
          << be.moe_path(experts.on_device[0].w1, T, k) << ")";
      int64_t differ = 0;
      for (int64_t i = 0; i < T * D; ++i)
        differ += std::memcmp(got[0].data<float>() + i, got[1].data<float>() + i, 4) != 0;
      EXPECT_EQ(differ, 0) << ops::weight_format_name(f) << " T=" << T << ": the staged quantisation changed "
                           << differ << " outputs (" << be.moe_path(experts.on_device[0].w1, T, k) << ")";
    }
  }
}

// The bulk kernels' layouts past fixed ranges give the fixed ranges' bits (the same items, K slices and sums):
// resident windows (TERN_MOE_RESIDENT, up to kMoeResidentMaxTokens tokens: every row staged once, the down kernel
// quantising h as it stages it) with items claimed past a static share (TERN_MOE_CLAIMS), each with the resident down
// kernel's copies before its PDL wait (TERN_MOE_EARLY_DOWN, the default) and after it. At 1-4, 16 and 64 tokens, both
// FP4 formats, bf16 and FP8 activations; the path names what ran.
TEST_P(GpuActFp8Linear, MoeLayoutsBitIdentical) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  if (s.D % 128 != 0 || s.inter % 128 != 0) GTEST_SKIP() << "D and inter must be multiples of 128";
  Rand r(fresh_seed());
  const int64_t E = std::min<int64_t>(s.experts, 16), k = s.experts_per_token, D = s.D;
  cuda::CudaBackend& be = cuda::register_backend();
  const MoeGroupedMinTokensGuard decode_kernels(cuda::CudaBackend::library_min_tokens());
  struct Form {
    int resident, claims, early;
  };
  const KnobGuard keep_resident("TERN_MOE_RESIDENT", 1), keep_claims("TERN_MOE_CLAIMS", 1),
      keep_early("TERN_MOE_EARLY_DOWN", 1);  // (each restores its switch's value of before at the end)
  auto set = [&](const Form& f) {
    be.set_knob("TERN_MOE_RESIDENT", f.resident);
    be.set_knob("TERN_MOE_CLAIMS", f.claims);
    be.set_knob("TERN_MOE_EARLY_DOWN", f.early);
  };
  for (ops::WeightFormat f : {ops::WeightFormat::mxfp4, ops::WeightFormat::nvfp4})
    for (const bool fp8 : {false, true}) {
      RandomExperts experts(f, E, D, s.inter, r);
      for (ops::Expert& e : experts.on_device) e.w1.act_fp8 = e.w2.act_fp8 = e.w3.act_fp8 = fp8;
      for (int64_t T : {1, 2, 3, 4, 16, 64}) {
        const Tensor x = spread_rows(T, D, r), w = random_f32({T, k}, r, 0.5f);
        const Tensor idx = random_picks(T, E, k, r);
        auto dx = upload(x), dw = upload(w), didx = upload(idx);
        Tensor base;
        for (const Form form : {Form{0, 0, 0}, Form{1, 0, 0}, Form{1, 1, 0}, Form{1, 0, 1}, Form{1, 1, 1}}) {
          set(form);
          const std::string path = be.moe_path(experts.on_device[0].w1, T, k);
          const std::string what = cat(ops::weight_format_name(f), fp8 ? " fp8" : " bf16", " T=", T, " resident ",
                                       form.resident, " claims ", form.claims, " early down ", form.early, " (", path,
                                       ")");
          // Resident where on and within kMoeResidentMaxTokens (the up kernel's T rows always fit there; the down
          // kernel's T k rows where they do beside its ring); claims named only with resident windows.
          const bool resident = path.find("resident windows (up") != std::string::npos;
          EXPECT_EQ(resident, form.resident == 1 && T <= cuda::kMoeResidentMaxTokens) << what;
          EXPECT_EQ(path.find("items claimed past half)") != std::string::npos, resident && form.claims == 1) << what;
          auto y = poisoned(DType::f32, {T, D});
          ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, experts.on_device, 10.0f, y});
          const Tensor got = cuda::to_host(y);
          if (form.resident == 0) {
            base = got;
            continue;
          }
          int64_t differ = 0;
          for (int64_t i = 0; i < T * D; ++i)
            differ += std::memcmp(got.data<float>() + i, base.data<float>() + i, 4) != 0;
          EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << T * D << " outputs differ from fixed ranges'";
        }
      }
    }
  be.check_device_errors();
}

TEST(GpuActFp8, RefusesUnalignedRows) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  HostWeight hw = random_weight(WeightFormat::fp8_block, 128, 192, r, 0.1f, "odd in");
  cuda::WeightStore store;
  ops::Weight dw = store.upload(hw.w);
  dw.act_fp8 = true;
  auto dx = upload(random_f32({2, 192}, r)), y = poisoned(DType::f32, {2, 128});
  EXPECT_THROW(ops::linear(cuda::context(), dx, dw, y), Error);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuActFp8Linear, ::testing::Values(kFixture, kV4Flash), ShapeName());

}  // namespace
}  // namespace tern::gputest
