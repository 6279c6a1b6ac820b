// GPU vs CPU: the library paths (cuBLAS) that products of >= kLibraryMinTokens tokens take: linear in every
// weight format, exact weights in f32 (grouped_linear: GpuBasic.GroupedLinear), the MoE, mHC and the indexer;
// and batch-invariant mode, which keeps such products on tern's own kernels.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/kernels/moe_grouped.cuh"
#include "gpu_test_util.h"
#include "ops/indexer.h"
#include "ops/linear.h"
#include "ops/mhc.h"
#include "ops/moe.h"
#include "shapes.h"

namespace tern::gputest {
namespace {

using ops::WeightFormat;

// More tokens than the library threshold (512), not a multiple of any tile.
constexpr int64_t kTokens = 600;

class GpuLibrary : public ::testing::TestWithParam<Shapes> {
 protected:
  void TearDown() override {
    if (gpu_ready()) cuda::register_backend().set_batch_invariant(false);
  }
};

struct Case {
  const char* name;
  WeightFormat format;
  int64_t out, in;
  bool exact;
};

std::vector<Case> cases(const Shapes& s) {
  return {
      {"wq_a fp8", WeightFormat::fp8_block, s.q_rank, s.D, false},
      {"wq_b fp8", WeightFormat::fp8_block, s.heads * s.head_dim, s.q_rank, false},
      {"shared.w2 fp8", WeightFormat::fp8_block, s.D, s.inter, false},
      {"fp8 odd rows", WeightFormat::fp8_block, 200, s.D, false},
      {"comp.wkv bf16", WeightFormat::bf16, 2 * s.head_dim, s.D, false},
      {"expert.w1 mxfp4", WeightFormat::mxfp4, s.inter, s.D, false},
      {"expert.w2 nvfp4", WeightFormat::nvfp4, s.D, s.inter, false},
      {"f32", WeightFormat::f32, 96, s.D, false},
      {"gate bf16 exact", WeightFormat::bf16, s.experts, s.D, true},
      {"idx.wq_b fp8 exact", WeightFormat::fp8_block, s.index_heads * s.index_dim, s.q_rank, true},
  };
}

TEST_P(GpuLibrary, LinearAgainstCpu) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  cuda::WeightStore store;
  for (const Case& c : cases(s)) {
    HostWeight hw = random_weight(c.format, c.out, c.in, r, 1.0f / std::sqrt(static_cast<float>(c.in)), c.name);
    hw.w.exact = c.exact;
    ops::Weight dw = store.upload(hw.w);
    dw.exact = c.exact;
    Tensor x = random_f32({kTokens, c.in}, r);
    Tensor ref(DType::f32, {kTokens, c.out});
    ops::linear(cpu::context(), x, hw.w, ref);
    auto dx = upload(x), y = poisoned(DType::f32, {kTokens, c.out});
    ops::linear(cuda::context(), dx, dw, y);
    expect_close(y, ref, c.exact ? kTolF32 : kTolBf16,
                 cat("library linear ", c.name, " T=", kTokens));
  }
}

// Batch-invariant mode: rows of a 600-token product equal, bit for bit, the same rows computed alone; with
// the library on they need not (and the test only asks them to be close).
TEST_P(GpuLibrary, BatchInvariantModeKeepsOwnKernels) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  cuda::WeightStore store;
  const HostWeight hw = random_weight(WeightFormat::fp8_block, s.q_rank, s.D, r, 1.0f / std::sqrt(float(s.D)), "wq_a");
  const ops::Weight dw = store.upload(hw.w);
  const Tensor x = random_f32({kTokens, s.D}, r);
  const int64_t off = r.index(kTokens - 3), n = 3;
  Tensor xs(DType::f32, {n, s.D});
  std::memcpy(xs.data<float>(), x.data<float>() + off * s.D, n * s.D * sizeof(float));
  auto dx = upload(x), dxs = upload(xs);
  for (const bool invariant : {true, false}) {
    cuda::register_backend().set_batch_invariant(invariant);
    auto yall = poisoned(DType::f32, {kTokens, s.q_rank}), ys = poisoned(DType::f32, {n, s.q_rank});
    ops::linear(cuda::context(), dx, dw, yall);
    ops::linear(cuda::context(), dxs, dw, ys);
    const Tensor all = cuda::to_host(yall), part = cuda::to_host(ys);
    if (invariant) {
      EXPECT_EQ(std::memcmp(part.data<float>(), all.data<float>() + off * s.q_rank, n * s.q_rank * 4), 0)
          << "batch-invariant mode: tokens " << off << ".." << off + n - 1 << " differ between a batch of " << n
          << " and the batch of " << kTokens;
    } else {
      expect_close(ys, all.view().rows(off, off + n), kTolBf16, "library rows vs the same rows alone");
    }
  }
}

// The routed experts at V4-Flash width (16 experts stand for the 256).
TEST_P(GpuLibrary, MoeAgainstCpu) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  const int64_t E = std::min<int64_t>(s.experts, 16), k = s.experts_per_token, D = s.D, inter = s.inter;
  const int saved_tile = cuda::moe_grouped_tile_config();
  for (WeightFormat f : {WeightFormat::mxfp4, WeightFormat::nvfp4, WeightFormat::fp8_block}) {
    const RandomExperts experts(f, E, D, inter, r);
    const std::vector<ops::Expert>& hexp = experts.on_host;
    const std::vector<ops::Expert>& dexp = experts.on_device;
    const int64_t T = kTokens;
    Tensor x = random_f32({T, D}, r), w = random_f32({T, k}, r, 0.5f);
    Tensor idx(DType::i32, {T, k});
    for (int64_t t = 0; t < T; ++t) {  // distinct experts per token; one expert left out (no tokens)
      std::vector<int32_t> all(E - 1);
      std::iota(all.begin(), all.end(), 1);
      for (int64_t j = 0; j < k; ++j) std::swap(all[j], all[j + r.index(E - 1 - j)]);
      std::copy_n(all.begin(), k, idx.data<int32_t>() + t * k);
    }
    Tensor ref(DType::f32, {T, D});
    ops::moe_experts(cpu::context(), ops::MoeExpertsArgs{x, idx, w, hexp, 10.0f, ref});
    auto dx = upload(x), dw = upload(w), didx = upload(idx);
    // FP4 experts take the grouped kernels: every tile configuration (~225 pairs an expert at V4-Flash's top-6:
    // two 128-pair m-tiles, the second ragged; 64-pair tiles in the old config).
    for (int config : {cuda::kMoeGroupedTileDefault, cuda::kMoeGroupedTileOld, cuda::kMoeGroupedTileNarrow,
                       cuda::kMoeGroupedTileSmallUnswapped, cuda::kMoeGroupedTileWarps8}) {
      if (f == WeightFormat::fp8_block && config != cuda::kMoeGroupedTileDefault) continue;
      cuda::set_moe_grouped_tile_config(config);
      auto out = poisoned(DType::f32, {T, D});
      ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, dexp, 10.0f, out});
      expect_close(out, ref, kTolBf16,
                   cat("library moe_experts ", ops::weight_format_name(f), " T=", T,
                       config == cuda::kMoeGroupedTileOld      ? " tile config old"
                       : config == cuda::kMoeGroupedTileNarrow ? " tile config 128x128"
                                                               : ""));
      if (f == WeightFormat::fp8_block) continue;
      // The weights' L2 prefetch hint changes what DRAM is asked for, never a bit of the result.
      const int saved_hint = cuda::moe_l2_hint();
      for (int hint : {128, 256}) {
        cuda::set_moe_l2_hint(hint);
        auto hinted = poisoned(DType::f32, {T, D});
        ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, dexp, 10.0f, hinted});
        cuda::set_moe_l2_hint(0);
        const Tensor a = cuda::to_host(out), b = cuda::to_host(hinted);
        EXPECT_EQ(std::memcmp(a.data<float>(), b.data<float>(), static_cast<size_t>(T * D) * 4), 0)
            << "TERN_MOE_L2_HINT=" << hint << " changed the bits (" << ops::weight_format_name(f) << ")";
      }
      cuda::set_moe_l2_hint(saved_hint);
    }
    cuda::set_moe_grouped_tile_config(saved_tile);
  }
  cuda::register_backend().check_device_errors();
}

// mHC's mixing logits on the library (f32), then the usual finish kernels.
TEST_P(GpuLibrary, MhcAgainstCpu) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  const int64_t hc = 4, mix = (2 + hc) * hc, T = kTokens;
  Tensor streams = random_f32({T, hc, s.D}, r, 2.0f);
  Tensor fn = random_f32({mix, hc * s.D}, r, 0.02f), base = random_f32({mix}, r, 0.5f), scale = random_f32({3}, r, 0.5f);
  Tensor norm = random_bf16({s.D}, r);
  Tensor post(DType::f32, {T, hc}), comb(DType::f32, {T, hc, hc}), collapsed(DType::f32, {T, s.D});
  ops::hc_pre(cpu::context(),
              ops::HcPreArgs{streams, fn, base, scale, {}, post, comb, collapsed, true, norm, 1e-5f});
  auto ds = upload(streams), dfn = upload(fn), db = upload(base), dsc = upload(scale), dnorm = upload(norm);
  auto dpost = poisoned(DType::f32, {T, hc}), dcomb = poisoned(DType::f32, {T, hc, hc});
  auto dcol = poisoned(DType::f32, {T, s.D});
  ops::hc_pre(cuda::context(), ops::HcPreArgs{ds, dfn, db, dsc, {}, dpost, dcomb, dcol, true, dnorm, 1e-5f});
  expect_close(dpost, post, kTolF32, cat("library hc_pre post T=", T));
  expect_close(dcomb, comb, 1e-4, cat("library hc_pre comb (Sinkhorn) T=", T));
  expect_close(dcol, collapsed, kTolF32, cat("library hc_pre + rms_norm collapsed T=", T));
  Tensor hfn = random_f32({hc, hc * s.D}, r, 0.02f), hbase = random_f32({hc}, r), hscale = random_f32({1}, r);
  Tensor head(DType::f32, {T, s.D});
  ops::hc_head(cpu::context(), ops::HcHeadArgs{streams, hfn, hbase, hscale, {}, head});
  auto dhfn = upload(hfn), dhb = upload(hbase), dhs = upload(hscale), dhead = poisoned(DType::f32, {T, s.D});
  ops::hc_head(cuda::context(), ops::HcHeadArgs{ds, dhfn, dhb, dhs, {}, dhead});
  expect_close(dhead, head, kTolF32, cat("library hc_head T=", T));
}

// The indexer's top-k of a prefill chunk: scores from a library f32 product. 600 queries late in a long
// prompt (about 2 000 visible keys each), so the top-k really chooses; picks equal the CPU's except where two
// scores are within f32 noise of each other.
TEST_P(GpuLibrary, IndexerTopkAgainstCpu) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  const int64_t H = s.index_heads, dim = s.index_dim, n = kTokens, ratio = s.csa_ratio;
  const int64_t ctx = ratio * (s.index_topk * 4) + n, S = ctx / ratio;
  Tensor q = random_f32({n, H, dim}, r), w = random_f32({n, H}, r), keys = random_f32({S, dim}, r);
  Tensor pos(DType::i64, {n});
  for (int64_t i = 0; i < n; ++i) pos.data<int64_t>()[i] = ctx - n + i;
  const PagedPair paged = paged_pair(keys, 5, r);
  ops::IndexerArgs a{q, w, paged.host, S, pos, static_cast<int>(ratio)};
  Tensor scores(DType::f32, {n, S});
  ops::indexer_scores(cpu::context(), a, scores);
  const int topk = static_cast<int>(s.index_topk);
  Tensor idx(DType::i32, {n, topk});
  ops::indexer_topk(cpu::context(), a, topk, idx);
  auto dq = upload(q), dw = upload(w), dpos = upload(pos);
  ops::IndexerArgs da{dq, dw, paged.device, S, dpos, static_cast<int>(ratio)};
  auto didx = poisoned(DType::i32, {n, topk});
  ops::indexer_topk(cuda::context(), da, topk, didx);
  const Tensor got = cuda::to_host(didx);
  // A near-tie is a gap within f32 noise of the row's sums: the library adds q . k in another order than the
  // CPU, and a score is a sum of terms as large as the row's largest score (a score near 0 is no more exact
  // than that), so the noise is relative to the row's largest |score|, not to the two scores compared.
  int64_t mismatched = 0, near_ties = 0;
  double worst = 0;  // the largest gap of a differing pick, in units of its row's largest |score|
  for (int64_t i = 0; i < n * topk; ++i) {
    const int32_t want = idx.data<int32_t>()[i], have = got.data<int32_t>()[i];
    if (want == have) continue;
    const float* sc = scores.data<float>() + (i / topk) * S;
    float row_max = 0.0f;
    for (int64_t j = 0; j < S; ++j)
      if (std::isfinite(sc[j])) row_max = std::max(row_max, std::fabs(sc[j]));
    if (want >= 0 && have >= 0 && have < S && row_max > 0)
      worst = std::max(worst, static_cast<double>(std::fabs(sc[want] - sc[have]) / row_max));
    if (want < 0 || have < 0 || have >= S || std::fabs(sc[want] - sc[have]) > 1e-5f * row_max + 1e-7f)
      ++mismatched;
    else
      ++near_ties;
  }
  EXPECT_EQ(mismatched, 0) << "library indexer_topk, " << n << " queries over " << S << " keys";
  std::printf("  %-48s %lld mismatches, %lld near-ties in another order (largest gap %.2e of the row's max)\n",
              cat("library indexer_topk n=", n, " keys=", S).c_str(), static_cast<long long>(mismatched),
              static_cast<long long>(near_ties), worst);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuLibrary, ::testing::Values(kFixture, kV4Flash), ShapeName());

}  // namespace
}  // namespace tern::gputest
