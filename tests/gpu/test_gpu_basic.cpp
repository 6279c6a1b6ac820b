// GPU vs CPU: the generic ops (elementwise, norm, rope, kv rows, linear in every format, dequantize).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/kernels/linear.cuh"
#include "gpu_test_util.h"
#include "ops/elementwise.h"
#include "ops/kv_row.h"
#include "ops/linear.h"
#include "ops/mhc.h"
#include "ops/moe.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "shapes.h"

namespace tern::gputest {
namespace {

using ops::WeightFormat;

class GpuBasic : public ::testing::TestWithParam<Shapes> {};

TEST_P(GpuBasic, Elementwise) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  for (int64_t T : {1, 7}) {
    // embedding: the real row width; the vocabulary cut to 16384 rows to keep the test fast.
    const int64_t vocab = std::min<int64_t>(s.vocab, 16384);
    Tensor table = random_bf16({vocab, s.D}, r);
    Tensor ids(DType::i64, {T});
    for (int64_t t = 0; t < T; ++t) ids.data<int64_t>()[t] = r.index(vocab);
    Tensor ref(DType::f32, {T, s.D});
    ops::embedding(cpu::context(), table, ids, ref);
    auto dtable = upload(table), dids = upload(ids);
    auto out = poisoned(DType::f32, {T, s.D});
    ops::embedding(cuda::context(), dtable, dids, out);
    expect_close(out, ref, 0.0, "embedding");

    Tensor x = random_f32({T, s.D}, r), y = random_f32({T, s.D}, r);
    auto dx = upload(x), dy = upload(y);
    ops::add(cpu::context(), x, y);
    ops::add(cuda::context(), dx, dy);
    expect_close(dy, y, 0.0, "add");

    Tensor gate = random_f32({T, s.inter}, r, 8.0f), up = random_f32({T, s.inter}, r, 8.0f);
    Tensor sw(DType::f32, {T, s.inter});
    ops::swiglu(cpu::context(), gate, up, 10.0f, sw);
    auto dg = upload(gate), du = upload(up), dsw = poisoned(DType::f32, {T, s.inter});
    ops::swiglu(cuda::context(), dg, du, 10.0f, dsw);
    expect_close(dsw, sw, kTolF32, "swiglu");

    Tensor rows(DType::i64, {T + 2});
    for (int64_t i = 0; i < T + 2; ++i) rows.data<int64_t>()[i] = r.index(T);
    Tensor g(DType::f32, {T + 2, s.D});
    ops::gather_rows(cpu::context(), x, rows, g);
    auto drows = upload(rows), dgat = poisoned(DType::f32, {T + 2, s.D});
    auto dx2 = upload(x);
    ops::gather_rows(cuda::context(), dx2, drows, dgat);
    expect_close(dgat, g, 0.0, "gather_rows");

    Tensor st(DType::f32, {T, 4, s.D});
    ops::hc_expand(cpu::context(), x, st);
    auto dst = poisoned(DType::f32, {T, 4, s.D});
    ops::hc_expand(cuda::context(), dx2, dst);
    expect_close(dst, st, 0.0, "hc_expand");
  }
  cuda::register_backend().check_device_errors();
}

TEST_P(GpuBasic, RmsNorm) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  struct Case {
    int64_t rows, dim;
    int weight;  // 0 none, 1 f32, 2 bf16
  };
  for (const Case c : {Case{5, s.D, 2}, Case{3 * s.heads, s.head_dim, 0}, Case{4, s.q_rank, 1},
                       Case{6, s.head_dim, 2}, Case{2, 4 * s.D, 0},
                       // the vectorised widths (128 .. 1024) over several blocks of 8 rows
                       Case{17, 128, 1}, Case{37, 256, 2}, Case{9, 1024, 0}}) {
    Tensor x = random_f32({c.rows, c.dim}, r, 3.0f);
    Tensor w = c.weight == 2 ? random_bf16({c.dim}, r) : random_f32({c.dim}, r);
    TensorView wv = c.weight == 0 ? TensorView() : w.view();
    Tensor ref(DType::f32, {c.rows, c.dim});
    ops::rms_norm(cpu::context(), x, wv, 1e-6f, ref);
    auto dx = upload(x), dw = upload(w), out = poisoned(DType::f32, {c.rows, c.dim});
    ops::rms_norm(cuda::context(), dx, c.weight == 0 ? TensorView() : dw.view(), 1e-6f, out);
    expect_close(out, ref, kTolF32, cat("rms_norm dim ", c.dim, " weight ", c.weight));
  }
}

TEST_P(GpuBasic, Rope) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  ops::RopeParams swa;
  swa.dim = s.rope_dim;
  ops::RopeParams yarn = swa;
  yarn.theta = 160000.0;
  yarn.yarn = true;
  yarn.factor = 16.0;
  yarn.original_max_position = 65536;
  for (const ops::RopeParams& rp : {swa, yarn})
    for (bool inverse : {false, true}) {
      const int64_t n = 9;
      Tensor freq = ops::rope_inv_freq(rp);
      Tensor pos(DType::i64, {n});
      for (int64_t i = 0; i < n; ++i) pos.data<int64_t>()[i] = i < 3 ? i : r.index(1 << 20);
      Tensor q = random_f32({n, s.heads, s.head_dim}, r);
      Tensor k = random_f32({n, s.index_dim}, r);
      auto dq = upload(q), dk = upload(k), dpos = upload(pos), dfreq = upload(freq);
      ops::rope(cpu::context(), q, pos, freq, inverse);
      ops::rope(cpu::context(), k, pos, freq, inverse);
      ops::rope(cuda::context(), dq, dpos, dfreq, inverse);
      ops::rope(cuda::context(), dk, dpos, dfreq, inverse);
      expect_close(dq, q, kTolF32, cat("rope heads yarn=", rp.yarn, " inverse=", inverse));
      expect_close(dk, k, kTolF32, cat("rope rows yarn=", rp.yarn, " inverse=", inverse));
    }
}

// norm_rope (the attention's q heads and kv rows in one launch): the same bits as rms_norm then rope on the GPU,
// and the CPU's within f32 tolerance; heads [n, H, hd] unweighted in place, and strided rows (a stacked
// product's column range) with a weight; the register widths, a generic width and one past the fused kernel.
TEST_P(GpuBasic, NormRope) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  struct Case {
    int64_t n, heads, dim, rope_dim;
    int weight;  // 0 none, 1 f32, 2 bf16
  };
  for (const Case c : {Case{9, s.heads, s.head_dim, s.rope_dim, 0}, Case{9, 1, s.head_dim, s.rope_dim, 2},
                       Case{5, 3, 96, 32, 1}, Case{17, 1, 128, 64, 2}, Case{3, 2, 1024, 64, 1},
                       Case{4, 1, 1536, 64, 0}}) {
    ops::RopeParams rp;
    rp.dim = c.rope_dim;
    Tensor freq = ops::rope_inv_freq(rp);
    Tensor pos(DType::i64, {c.n});
    for (int64_t i = 0; i < c.n; ++i) pos.data<int64_t>()[i] = i < 2 ? i : r.index(1 << 20);
    Tensor w = c.weight == 2 ? random_bf16({c.dim}, r) : random_f32({c.dim}, r);
    auto dpos = upload(pos), dfreq = upload(freq), dw = upload(w);
    const TensorView wv = c.weight == 0 ? TensorView() : w.view();
    const TensorView dwv = c.weight == 0 ? TensorView() : dw.view();
    const std::string what = cat("norm_rope n ", c.n, " heads ", c.heads, " dim ", c.dim, " weight ", c.weight);
    if (c.heads > 1 || c.weight == 0) {  // heads, in place
      Tensor x = random_f32({c.n, c.heads, c.dim}, r, 3.0f);
      Tensor ref = random_f32({c.n, c.heads, c.dim}, r);
      ops::norm_rope(cpu::context(), x, wv, 1e-6f, pos, freq, ref);
      auto dx = upload(x), dy = upload(x);
      ops::norm_rope(cuda::context(), dx, dwv, 1e-6f, dpos, dfreq, dx);
      ops::rms_norm(cuda::context(), dy, dwv, 1e-6f, dy);
      ops::rope(cuda::context(), dy, dpos, dfreq);
      expect_close(dx, ref, kTolF32, what + " vs cpu");
      expect_close(dx, cuda::to_host(dy), 0.0, what + " vs rms_norm + rope");
    } else {  // strided rows: the last dim columns of [n, 64 + dim]
      Tensor stacked = random_f32({c.n, 64 + c.dim}, r, 3.0f);
      Tensor ref(DType::f32, {c.n, c.dim});
      ops::norm_rope(cpu::context(), stacked.view().cols(64, 64 + c.dim), wv, 1e-6f, pos, freq, ref);
      auto ds = upload(stacked);
      auto out = poisoned(DType::f32, {c.n, c.dim}), two = poisoned(DType::f32, {c.n, c.dim});
      ops::norm_rope(cuda::context(), ds.view().cols(64, 64 + c.dim), dwv, 1e-6f, dpos, dfreq, out);
      ops::rms_norm(cuda::context(), ds.view().cols(64, 64 + c.dim), dwv, 1e-6f, two);
      ops::rope(cuda::context(), two, dpos, dfreq);
      expect_close(out, ref, kTolF32, what + " vs cpu");
      expect_close(out, cuda::to_host(two), 0.0, what + " vs rms_norm + rope");
    }
  }
}

TEST_P(GpuBasic, KvRows) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  for (ops::KvFormat kf : {ops::KvFormat::fp8_ds, ops::KvFormat::f32}) {
    const ops::KvRowFormat f{kf, s.head_dim, s.rope_dim};
    const int64_t n = 37;
    Tensor x = random_f32({n, s.head_dim}, r, 2.0f);
    for (int64_t d = 0; d < 64; ++d) x.data<float>()[d] *= 1e-6f;  // a block under the 1e-4 amax floor
    Tensor rows(DType::u8, {n, f.row_bytes()});
    ops::kv_pack(cpu::context(), x, f, rows);
    auto dx = upload(x), drows = poisoned(DType::u8, {n, f.row_bytes()});
    ops::kv_pack(cuda::context(), dx, f, drows);
    const Tensor got = cuda::to_host(drows);
    int64_t differ = 0;
    for (int64_t i = 0; i < rows.numel(); ++i) {
      const uint8_t g = got.data<uint8_t>()[i], c = rows.data<uint8_t>()[i];
      if (g != c && differ++ < 8)
        std::printf("  kv_pack row %lld byte %lld: gpu %02x cpu %02x\n", static_cast<long long>(i / f.row_bytes()),
                    static_cast<long long>(i % f.row_bytes()), g, c);
    }
    EXPECT_EQ(differ, 0) << "kv_pack " << ops::kv_format_name(kf) << ": bytes differ from the CPU codec";
    Tensor back(DType::f32, {n, s.head_dim});
    ops::kv_unpack(cpu::context(), rows, f, back);
    auto dback = poisoned(DType::f32, {n, s.head_dim});
    ops::kv_unpack(cuda::context(), drows, f, dback);
    expect_close(dback, back, 0.0, cat("kv_unpack ", ops::kv_format_name(kf)));
  }
}

struct LinearCase {
  const char* name;
  WeightFormat format;
  int64_t out, in;
  bool exact = false;  // ops::Weight::exact: f32 products on every backend (router gates, indexer projections)
};

std::vector<LinearCase> linear_cases(const Shapes& s) {
  const int64_t D = s.D;
  return {
      {"wq_a", WeightFormat::fp8_block, s.q_rank, D},
      {"wq_b", WeightFormat::fp8_block, s.heads * s.head_dim, s.q_rank},
      {"wkv", WeightFormat::fp8_block, s.head_dim, D},
      {"wo_a (as one matrix)", WeightFormat::fp8_block, s.groups * s.o_rank, s.heads / s.groups * s.head_dim},
      {"wo_b", WeightFormat::fp8_block, D, s.groups * s.o_rank},
      {"idx.wq_b", WeightFormat::fp8_block, s.index_heads * s.index_dim, s.q_rank},
      {"shared.w1", WeightFormat::fp8_block, s.inter, D},
      {"shared.w2", WeightFormat::fp8_block, D, s.inter},
      {"comp.wkv(csa)", WeightFormat::bf16, 2 * s.head_dim, D},
      {"comp.wkv|wgate(csa)", WeightFormat::bf16, 4 * s.head_dim, D},  // stacked, as the model runs it
      {"comp.wkv(hca)", WeightFormat::bf16, s.head_dim, D},
      {"comp 256 rows", WeightFormat::bf16, s.head_dim / 2, D},
      {"bf16 odd rows", WeightFormat::bf16, 200, D},
      {"idx.weights_proj", WeightFormat::bf16, s.index_heads, D},
      {"gate", WeightFormat::bf16, s.experts, D},
      {"head", WeightFormat::bf16, s.vocab, D},
      {"expert.w1 mxfp4", WeightFormat::mxfp4, s.inter, D},
      {"expert.w2 mxfp4", WeightFormat::mxfp4, D, s.inter},
      {"expert.w1 nvfp4", WeightFormat::nvfp4, s.inter, D},
      {"expert.w2 nvfp4", WeightFormat::nvfp4, D, s.inter},
      {"f32", WeightFormat::f32, 96, D},
      {"f32 odd in (CUDA-core path)", WeightFormat::f32, 40, 100},
      {"fp8 odd rows", WeightFormat::fp8_block, 200, D},
      {"gate (exact)", WeightFormat::bf16, s.experts, D, true},
      {"idx.wq_b (exact)", WeightFormat::fp8_block, s.index_heads * s.index_dim, s.q_rank, true},
      {"idx.weights_proj (exact)", WeightFormat::bf16, s.index_heads, D, true},
      {"fp8 odd rows (exact)", WeightFormat::fp8_block, 200, D, true},
      {"f32 odd in (exact)", WeightFormat::f32, 40, 100, true},
  };
}

TEST_P(GpuBasic, Linear) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  cuda::WeightStore store;
  for (const LinearCase& c : linear_cases(s)) {
    const HostWeight hw = random_weight(c.format, c.out, c.in, r, 1.0f / std::sqrt(static_cast<float>(c.in)), c.name);
    ops::Weight dw = store.upload(hw.w);
    dw.exact = c.exact;
    const bool big = c.out * c.in > (64LL << 20);
    // 1, 3: one token tile; 16, 64: one tile of 2 / 8 n-tiles; 100: two tiles (the second partly padding).
    for (int64_t T : big ? std::vector<int64_t>{1, 3} : std::vector<int64_t>{1, 3, 16, 64, 100}) {
      Tensor x = random_f32({T, c.in}, r);
      Tensor ref(DType::f32, {T, c.out});
      ops::linear(cpu::context(), x, hw.w, ref);
      auto dx = upload(x), y = poisoned(DType::f32, {T, c.out});
      ops::linear(cuda::context(), dx, dw, y);
      const bool exact = c.exact || (c.format == WeightFormat::f32 && c.in % 64 != 0);
      expect_close(y, ref, exact ? kTolF32 : kTolBf16, cat("linear ", c.name, " T=", T));
    }
  }
}

// The compressors' bf16 products with x rounded in linear_x8 (up to 8 tokens) give round_bf16 + linear_x8's bits, and
// at V4-Flash's shapes take that form (so the comparison is of the two forms); the head stays on round_bf16 (its
// grid is four waves).
TEST_P(GpuBasic, Bf16RoundingKernelBitIdentical) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  cuda::CudaBackend& be = cuda::register_backend();
  cuda::WeightStore store;
  struct Bf16Case {
    const char* name;
    int64_t out;
  };
  for (const Bf16Case& c : {Bf16Case{"comp.wkv|wgate(csa)", 4 * s.head_dim}, Bf16Case{"comp.wkv|wgate(hca)", 2 * s.head_dim},
                            Bf16Case{"idx.comp wkv|wgate", 4 * s.index_dim}}) {
    if (c.out % 128 != 0 || s.D % 64 != 0) continue;
    const HostWeight hw = random_weight(WeightFormat::bf16, c.out, s.D, r, 1.0f / std::sqrt(static_cast<float>(s.D)),
                                        c.name);
    const ops::Weight dw = store.upload(hw.w);
    for (int64_t T : {1, 3, 8, 9}) {
      auto x = upload(random_f32({T, s.D}, r));
      Tensor got[2];
      const int64_t before = be.fused_quant_calls().linear_x8;
      for (int fused = 0; fused < 2; ++fused) {
        be.set_x8_quantises_x(fused == 1);
        auto y = poisoned(DType::f32, {T, c.out});
        ops::linear(cuda::context(), x, dw, y);
        got[fused] = cuda::to_host(y);
      }
      be.set_x8_quantises_x(true);
      EXPECT_EQ(std::memcmp(got[0].data<float>(), got[1].data<float>(), got[0].nbytes()), 0)
          << c.name << " T=" << T << ": outputs differ between round_bf16 + linear_x8 and the rounding kernel";
      if (s.D >= 4096)
        EXPECT_EQ(be.fused_quant_calls().linear_x8, before + (T <= 8 ? 1 : 0))
            << c.name << " T=" << T << ": the rounding form " << (T <= 8 ? "did not run" : "ran past 8 tokens");
    }
  }
}

// A token's output bits must not depend on the batch it shares (CUDA graphs pad batches, the server mixes
// requests): rows of a 100-token product equal, bit for bit, the same rows computed in batches of 1, 3, 16
// and 64 at other offsets (other token tiles, other K-split choices, other n-tile counts).
TEST_P(GpuBasic, LinearBatchInvariant) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  cuda::WeightStore store;
  const int64_t N = 100;
  // tern's own kernels up to 511 tokens: the dense library products from 65 (session 22's default) are not batch
  // invariant (as documented; --batch-invariant keeps these kernels).
  const KnobGuard own_kernels("TERN_DENSE_LIBRARY_MIN_TOKENS", cuda::CudaBackend::library_min_tokens());
  for (const LinearCase& c : linear_cases(s)) {
    if (c.out * c.in > (64LL << 20)) continue;
    const HostWeight hw = random_weight(c.format, c.out, c.in, r, 1.0f / std::sqrt(static_cast<float>(c.in)), c.name);
    ops::Weight dw = store.upload(hw.w);
    dw.exact = c.exact;
    expect_linear_batch_invariant(random_f32({N, c.in}, r), dw, r, cat("linear ", c.name));
  }
}

// The exact products on tensor cores (TERN_EXACT_PATH=tc: x as three bf16 planes, f32 accuracy): against the
// CPU's f32 at f32 tolerance, batch invariant (a token's bits alone and among 100 tokens at other offsets), and
// the router gate's top-6 picks equal to the f32 CUDA-core path's but for near-ties.
TEST_P(GpuBasic, ExactOnTensorCores) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  cuda::WeightStore store;
  struct Restore {
    cuda::ExactPath was = cuda::exact_path();
    ~Restore() { cuda::set_exact_path(was); }
  } restore;
  const int64_t N = 100;
  for (const LinearCase& c : linear_cases(s)) {
    if (!c.exact) continue;
    const HostWeight hw = random_weight(c.format, c.out, c.in, r, 1.0f / std::sqrt(static_cast<float>(c.in)), c.name);
    ops::Weight dw = store.upload(hw.w);
    dw.exact = true;
    const Tensor x = random_f32({N, c.in}, r);
    auto dx = upload(x);
    cuda::set_exact_path(cuda::ExactPath::tensor_cores);
    auto yall = poisoned(DType::f32, {N, c.out});
    ops::linear(cuda::context(), dx, dw, yall);
    const Tensor all = cuda::to_host(yall);
    for (const int64_t T : {1, 3, 16, 64, 100}) {
      const int64_t off = T == N ? 0 : r.index(N - T + 1);
      Tensor xs(DType::f32, {T, c.in});
      std::memcpy(xs.data<float>(), x.data<float>() + off * c.in, T * c.in * sizeof(float));
      Tensor ref(DType::f32, {T, c.out});
      ops::linear(cpu::context(), xs, hw.w, ref);
      auto dxs = upload(xs), ys = poisoned(DType::f32, {T, c.out});
      ops::linear(cuda::context(), dxs, dw, ys);
      expect_close(ys, ref, kTolF32, cat("exact on tensor cores ", c.name, " T=", T));
      const Tensor part = cuda::to_host(ys);
      int64_t differ = 0;
      for (int64_t i = 0; i < T * c.out; ++i)
        if (std::memcmp(part.data<float>() + i, all.data<float>() + off * c.out + i, 4) != 0) ++differ;
      EXPECT_EQ(differ, 0) << "exact on tensor cores " << c.name << ": " << differ << " outputs of tokens " << off
                           << ".." << off + T - 1 << " differ between a batch of " << T << " and the batch of " << N;
    }
    if (c.out != s.experts || c.format != WeightFormat::bf16) continue;
    // The gate: each token's top-6 by the tensor-core logits against the CUDA-core f32 logits.
    cuda::set_exact_path(cuda::ExactPath::cuda_cores);
    auto yf = poisoned(DType::f32, {N, c.out});
    ops::linear(cuda::context(), dx, dw, yf);
    const Tensor f32 = cuda::to_host(yf);
    int64_t mismatched = 0;
    double worst_gap = 0.0;
    for (int64_t t = 0; t < N; ++t) {
      const float* a = all.data<float>() + t * c.out;
      const float* b = f32.data<float>() + t * c.out;
      std::vector<int64_t> ia(c.out), ib(c.out);
      for (int64_t e = 0; e < c.out; ++e) ia[e] = ib[e] = e;
      const auto top = [&](std::vector<int64_t>& idx, const float* v) {
        std::partial_sort(idx.begin(), idx.begin() + 7, idx.end(),
                          [&](int64_t i, int64_t j) { return v[i] > v[j] || (v[i] == v[j] && i < j); });
      };
      top(ia, a);
      top(ib, b);
      std::vector<int64_t> sa(ia.begin(), ia.begin() + 6), sb(ib.begin(), ib.begin() + 6);  // the picked sets
      std::sort(sa.begin(), sa.end());
      std::sort(sb.begin(), sb.end());
      if (sa != sb) {
        ++mismatched;
        worst_gap = std::max(worst_gap, static_cast<double>(std::fabs(b[ib[5]] - b[ib[6]])));
      }
    }
    std::printf("  exact on tensor cores: gate top-6 differs from the f32 path's in %lld of %lld tokens "
                "(largest 6th/7th gap among them %.3g)\n",
                static_cast<long long>(mismatched), static_cast<long long>(N), worst_gap);
    EXPECT_LE(worst_gap, 1e-5) << "a top-6 choice moved at a gap wider than f32 rounding";
  }
}

// Restores the process-wide linear kernel variant (cuda::set_linear_variant) when a test ends.
struct LinearVariantGuard {
  int saved = cuda::linear_variant();
  ~LinearVariantGuard() { cuda::set_linear_variant(saved); }
};

// The other variants stay correct against the CPU (the tests above run variant 0: linear_bulk for bf16,
// linear_stream for FP8): 1, the previous kernels (linear_mma for bf16), and 2, linear_bulk for FP8 too;
// the benchmarks compare them on the same shapes.
TEST_P(GpuBasic, LinearOldVariant) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  LinearVariantGuard guard;
  Rand r(fresh_seed());
  cuda::WeightStore store;
  for (const LinearCase& c : linear_cases(s)) {
    if (c.exact || (c.format != WeightFormat::fp8_block && c.format != WeightFormat::bf16)) continue;
    if (c.out * c.in > (64LL << 20)) continue;
    const HostWeight hw = random_weight(c.format, c.out, c.in, r, 1.0f / std::sqrt(static_cast<float>(c.in)), c.name);
    const ops::Weight dw = store.upload(hw.w);
    for (int64_t T : {1, 16, 100}) {
      Tensor x = random_f32({T, c.in}, r);
      Tensor ref(DType::f32, {T, c.out});
      ops::linear(cpu::context(), x, hw.w, ref);
      auto dx = upload(x), y = poisoned(DType::f32, {T, c.out});
      for (int v : {1, 2}) {
        cuda::set_linear_variant(v);
        ops::linear(cuda::context(), dx, dw, y);
        cuda::set_linear_variant(0);
        expect_close(y, ref, kTolBf16, cat("linear (variant ", v, ") ", c.name, " T=", T));
      }
    }
  }
}

// FP8 products: linear_bulk_kernel uses linear_stream_kernel's tiles, K groups and fragments, so both give the
// same bits for every T (1, 3: one n-tile; 16, 64: 2 / 8 n-tiles; 100: two token tiles), plain and grouped
// (wo_a); bf16 products of the bulk kernel are checked against the CPU above and here only for the path name.
// From 9 tokens variants 0 and 2 take x from linear_x_window_kernel (made once per product) where variant 1's blocks
// stage it themselves: the same bytes, so the same bits again. And linear_stream with one m-tile a warp (8 warps a
// block) gives the bits of two (4 warps): TERN_STREAM_MT's two settings.
TEST_P(GpuBasic, LinearBulkMatchesStream) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  LinearVariantGuard guard;
  Rand r(fresh_seed());
  cuda::WeightStore store;
  const int64_t in_g = s.heads / s.groups * s.head_dim;
  struct Case {
    const char* name;
    int64_t out, in, groups;
  };
  std::vector<Case> cases;
  for (const LinearCase& c : linear_cases(s))
    if (!c.exact && c.format == WeightFormat::fp8_block && c.out * c.in <= (64LL << 20))
      cases.push_back({c.name, c.out, c.in, 1});
  cases.push_back({"wo_a (grouped)", s.groups * s.o_rank, in_g, s.groups});
  for (const Case& c : cases) {
    const HostWeight hw = random_weight(WeightFormat::fp8_block, c.out, c.in, r,
                                        1.0f / std::sqrt(static_cast<float>(c.in)), c.name);
    const ops::Weight dw = store.upload(hw.w);
    for (int64_t T : {1, 3, 16, 64, 100}) {
      const Tensor x = c.groups > 1 ? random_f32({T, c.groups, c.in}, r) : random_f32({T, c.in}, r);
      const Shape ys = c.groups > 1 ? Shape{T, c.groups, c.out / c.groups} : Shape{T, c.out};
      auto dx = upload(x);
      auto run = [&](int variant) {
        auto y = poisoned(DType::f32, ys);
        cuda::set_linear_variant(variant);
        if (c.groups > 1) ops::grouped_linear(cuda::context(), dx, dw, y);
        else ops::linear(cuda::context(), dx, dw, y);
        cuda::set_linear_variant(0);
        return cuda::to_host(y);
      };
      const Tensor staged = run(1);
      struct Against {
        int variant, m_tiles;  // m_tiles 0: linear_stream's own rule (stream_m_tiles)
        const char* what;
      };
      for (const auto& [variant, m_tiles, what] :
           {Against{2, 0, "linear_bulk"}, Against{0, 0, "linear_stream (x windows)"},
            Against{0, 1, "one m-tile a warp"}, Against{0, 2, "two m-tiles a warp"}}) {
        cuda::set_stream_m_tiles(m_tiles);
        const Tensor a = run(variant);
        cuda::set_stream_m_tiles(0);
        int64_t differ = 0;
        for (int64_t i = 0; i < a.numel(); ++i)
          if (std::memcmp(a.data<float>() + i, staged.data<float>() + i, 4) != 0) ++differ;
        EXPECT_EQ(differ, 0) << c.name << " T=" << T << ": " << differ << " of " << a.numel() << " outputs differ between "
                             << what << " and linear_stream staging x per block";
      }
    }
  }
}

TEST_P(GpuBasic, GroupedLinear) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  const int64_t in_g = s.heads / s.groups * s.head_dim;
  const HostWeight hw = random_weight(WeightFormat::fp8_block, s.groups * s.o_rank, in_g, r,
                                      1.0f / std::sqrt(static_cast<float>(in_g)), "wo_a");
  cuda::WeightStore store;
  const ops::Weight dw = store.upload(hw.w);
  // 600: the library path (strided batched cuBLAS) of a prefill chunk; 100: two token tiles of the bulk kernel.
  for (int64_t T : {1, 3, 6, 16, 19, 64, 100, 600}) {
    Tensor x = random_f32({T, s.groups, in_g}, r);
    Tensor ref(DType::f32, {T, s.groups, s.o_rank});
    ops::grouped_linear(cpu::context(), x, hw.w, ref);
    auto dx = upload(x), y = poisoned(DType::f32, {T, s.groups, s.o_rank});
    ops::grouped_linear(cuda::context(), dx, dw, y);
    expect_close(y, ref, kTolBf16, cat("grouped_linear wo_a T=", T));
  }
}

// The model's stacked pairs (model/stacked.h): one product over [a + b, in] whose column ranges are the parts'
// products (within the tolerance of the CPU's separate products), and the ops that read those ranges as
// row-strided views (rms_norm, swiglu) equal to the CPU's on the same bytes.
TEST_P(GpuBasic, StackedLinearAndItsColumnRanges) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  cuda::WeightStore store;
  struct Pair {
    const char* name;
    WeightFormat format;
    int64_t a, b;
    bool exact;
  };
  for (const Pair& p : {Pair{"wq_a + wkv", WeightFormat::fp8_block, s.q_rank, s.head_dim, false},
                        Pair{"compressor wkv + wgate", WeightFormat::bf16, 2 * s.head_dim, 2 * s.head_dim, false},
                        Pair{"indexer compressor wkv + wgate", WeightFormat::bf16, 2 * s.index_dim, 2 * s.index_dim, true},
                        Pair{"shared w1 + w3", WeightFormat::fp8_block, s.inter, s.inter, false}}) {
    const bool fp8 = p.format == WeightFormat::fp8_block;
    if (fp8 && p.a % 128 != 0) continue;  // the model keeps such a pair apart (model::stack_refusal)
    const int64_t N = p.a + p.b;
    const HostWeight hw = random_weight(p.format, N, s.D, r, 1.0f / std::sqrt(static_cast<float>(s.D)), p.name);
    // The parts: the stack's rows and scale rows, as model::view_parts makes them.
    ops::Weight wa = hw.w, wb = hw.w;
    wa.out = p.a, wb.out = p.b;
    wa.weight = hw.w.weight.rows(0, p.a), wb.weight = hw.w.weight.rows(p.a, N);
    if (fp8) {
      wa.scale = hw.w.scale.rows(0, p.a / 128), wb.scale = hw.w.scale.rows(p.a / 128, hw.w.scale.dim(0));
    }
    wa.exact = wb.exact = p.exact;
    ops::Weight dw = store.upload(hw.w);
    dw.exact = p.exact;
    for (int64_t T : {1, 3, 16, 100}) {
      const std::string what = cat(p.name, " T=", T);
      Tensor x = random_f32({T, s.D}, r);
      Tensor ya(DType::f32, {T, p.a}), yb(DType::f32, {T, p.b}), ref(DType::f32, {T, N});
      ops::linear(cpu::context(), x, wa, ya);
      ops::linear(cpu::context(), x, wb, yb);
      for (int64_t t = 0; t < T; ++t) {
        std::memcpy(ref.data<float>() + t * N, ya.data<float>() + t * p.a, p.a * sizeof(float));
        std::memcpy(ref.data<float>() + t * N + p.a, yb.data<float>() + t * p.b, p.b * sizeof(float));
      }
      auto dx = upload(x), dy = poisoned(DType::f32, {T, N});
      ops::linear(cuda::context(), dx, dw, dy);
      expect_close(dy, ref, p.exact ? kTolF32 : kTolBf16, cat("stacked linear ", what));
      // The consumers, from the GPU's own product: the same inputs on both sides.
      const Tensor y = cuda::to_host(dy);
      const TensorView ha = y.view().cols(0, p.a), hb = y.view().cols(p.a, N);
      const TensorView da = dy.view().cols(0, p.a), db = dy.view().cols(p.a, N);
      Tensor nw = random_bf16({p.a}, r);
      auto dnw = upload(nw);
      Tensor na(DType::f32, {T, p.a});
      ops::rms_norm(cpu::context(), ha, nw, 1e-6f, na);
      auto dna = poisoned(DType::f32, {T, p.a});
      ops::rms_norm(cuda::context(), da, dnw, 1e-6f, dna);
      expect_close(dna, na, kTolF32, cat("rms_norm of the first range of ", what));
      if (p.a != p.b) continue;
      Tensor sw(DType::f32, {T, p.a});
      ops::swiglu(cpu::context(), ha, hb, 10.0f, sw);
      auto dsw = poisoned(DType::f32, {T, p.a});
      ops::swiglu(cuda::context(), da, db, 10.0f, dsw);
      expect_close(dsw, sw, kTolF32, cat("swiglu of the two ranges of ", what));
    }
  }
}

TEST_P(GpuBasic, Dequantize) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  cuda::WeightStore store;
  for (WeightFormat f : {WeightFormat::f32, WeightFormat::bf16, WeightFormat::fp8_block, WeightFormat::mxfp4,
                         WeightFormat::nvfp4}) {
    const HostWeight hw = random_weight(f, 300, s.D, r, 0.05f, "w");
    Tensor ref(DType::f32, {300, s.D});
    ops::dequantize(cpu::context(), hw.w, ref);
    auto out = poisoned(DType::f32, {300, s.D});
    ops::dequantize(cuda::context(), store.upload(hw.w), out);
    expect_close(out, ref, 0.0, cat("dequantize ", ops::weight_format_name(f)));
  }
}

TEST(GpuErrors, BadTokenIdIsReported) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  Tensor table = random_f32({10, 8}, r);
  Tensor ids(DType::i64, {2});
  ids.data<int64_t>()[0] = 3;
  ids.data<int64_t>()[1] = 10;
  auto dt = upload(table), di = upload(ids), out = poisoned(DType::f32, {2, 8});
  ops::embedding(cuda::context(), dt, di, out);
  EXPECT_THROW(cuda::register_backend().check_device_errors(), Error);
  cuda::register_backend().check_device_errors();  // the word was cleared
}

// A token whose router scores are all NaN has no best expert: route_scored reports it (and writes expert 0
// to stay in bounds) instead of an index past the table that the MoE plan would then report as out of range.
TEST(GpuErrors, NanRouterScoresAreReported) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  const int64_t T = 3, E = 64, k = 6;
  Tensor logits = random_f32({T, E}, r), bias = random_f32({E}, r);
  for (int64_t e = 0; e < E; ++e) logits.data<float>()[1 * E + e] = std::nanf("");
  auto dl = upload(logits), db = upload(bias);
  auto idx = poisoned(DType::i32, {T, k}), w = poisoned(DType::f32, {T, k});
  ops::route_scored(cuda::context(), dl, db, 1.0f, idx, w);
  try {
    cuda::register_backend().check_device_errors();
    ADD_FAILURE() << "no device error for NaN router scores";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("router scores are all NaN"), std::string::npos) << e.what();
  }
  const Tensor hi = cuda::to_host(idx);
  for (int64_t i = 0; i < T * k; ++i) {
    EXPECT_GE(hi.data<int32_t>()[i], 0);
    EXPECT_LT(hi.data<int32_t>()[i], E);
  }
  cuda::register_backend().check_device_errors();  // the word was cleared
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuBasic, ::testing::Values(kFixture, kV4Flash), ShapeName());

}  // namespace
}  // namespace tern::gputest
