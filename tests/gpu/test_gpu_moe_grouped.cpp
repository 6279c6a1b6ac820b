// GPU vs CPU: the grouped FP4 MoE kernels (kernels/moe_grouped.cuh, and the wgmma ones of moe_grouped_wgmma.cuh
// under TERN_MOE_GROUPED=wgmma, also against the mma.sync ones) that prefill chunks' routed experts take
// (>= the library threshold of tokens, MXFP4 / NVFP4 experts), at every expert of the real model: against the
// CPU reference on a sample of the batch's tokens (a token's output depends only on its own row, so the
// reference of those rows alone is theirs in the batch), and against the older library path
// (set_moe_prefill_library) on every token; in every tile configuration (cuda::set_moe_grouped_tile_config:
// the 128 x 256 and 128 x 128 tiles, the 32 / 64-pair ones with the weights or x as the mma's A, and the old
// ones), which must also agree bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/kernels/moe_grouped.cuh"
#include "backends/cuda/kernels/moe_grouped_wgmma.cuh"
#include "gpu_test_util.h"
#include "ops/moe.h"
#include "shapes.h"

namespace tern::gputest {
namespace {

using ops::WeightFormat;

class GpuMoeGrouped : public ::testing::TestWithParam<Shapes> {
 protected:
  void TearDown() override {
    if (gpu_ready()) cuda::register_backend().set_moe_prefill_library(false);
    if (gpu_ready() && saved_min_tokens_ > 0) cuda::register_backend().set_moe_grouped_min_tokens(saved_min_tokens_);
    cuda::set_moe_grouped_tile_config(saved_tile_);
    unsetenv("TERN_MOE_GROUPED");  // the default again: chosen by the pairs per expert
    unsetenv("TERN_MOE_WGMMA_N");
  }
  // run_grouped_moe reads TERN_MOE_GROUPED at each call: wgmma or mma forces that kernel (unset, the pairs per
  // expert choose), so each check below names the kernel it means.
  static void set_grouped_kernel(bool wgmma) {
    setenv("TERN_MOE_GROUPED", wgmma ? "wgmma" : "mma", 1);
    unsetenv("TERN_MOE_WGMMA_N");
  }
  int saved_tile_ = cuda::moe_grouped_tile_config();
  int64_t saved_min_tokens_ = 0;  // set by a test that moves the grouped kernels' threshold
};

// k distinct experts per token. skew: pick j comes from 2 + j^2 candidates among the first two thirds of the
// experts, so a few experts get most pairs (several tiles, ragged ends), some few, many none; otherwise uniform.
Tensor random_picks(int64_t T, int64_t E, int64_t k, bool skew, Rand& r) {
  Tensor idx(DType::i32, {T, k});
  const int64_t used = skew ? std::max<int64_t>(k + 1, E - E / 3) : E;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> all(used);
    std::iota(all.begin(), all.end(), 0);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t span = skew ? std::min<int64_t>(used - j, 2 + j * j) : used - j;
      std::swap(all[j], all[j + r.index(span)]);
    }
    std::copy_n(all.begin(), k, idx.data<int32_t>() + t * k);
  }
  return idx;
}

Tensor rows_of(const Tensor& t, const std::vector<int64_t>& rows) {
  const int64_t width = t.numel() / t.dim(0), bytes = static_cast<int64_t>(t.nbytes()) / t.dim(0);
  Tensor out(t.dtype(), {static_cast<int64_t>(rows.size()), width});
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(out.view().data_as<std::byte>() + i * bytes, t.view().data_as<const std::byte>() + rows[i] * bytes, bytes);
  return out;
}

TEST_P(GpuMoeGrouped, AgainstCpuAndLibrary) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  const int64_t E = s.experts, k = s.experts_per_token, D = s.D, inter = s.inter;
  cuda::CudaBackend& be = cuda::register_backend();
  struct Run {
    int64_t T;
    bool skew;
  };
  // V4-Flash: 512 and 1 024 tokens take 32-pair tiles (12 and 24 pairs an expert), 8 192 the 128-pair tiles (64
  // in the old config); 1 000 skewed tokens give ragged jobs and experts without pairs. The fixture (8 experts,
  // top-2): 128-pair tiles (64 in the old config), ragged last tiles with dead 16-pair m-tiles.
  const std::vector<Run> runs = {{512, false}, {1024, false}, {1000, true}, {8192, false}};
  constexpr int kConfigs = 5;
  const int configs[kConfigs] = {cuda::kMoeGroupedTileDefault, cuda::kMoeGroupedTileOld, cuda::kMoeGroupedTileNarrow,
                                 cuda::kMoeGroupedTileSmallUnswapped, cuda::kMoeGroupedTileWarps8};
  const char* const config_names[kConfigs] = {"default", "old", "128x128", "small-unswapped", "8-warp-32"};
  // In the path name (old: no 128-pair tile); the default's 32 / 64-pair tiles take the weights as A, the
  // small-unswapped config's x.
  const char* const config_tiles[kConfigs] = {"128x256", "", "128x128", "128x256", "128x256"};
  for (WeightFormat f : {WeightFormat::mxfp4, WeightFormat::nvfp4}) {
    RandomExperts experts(f, E, D, inter, r);
    if (f == WeightFormat::nvfp4)  // per-matrix global scales that differ within an expert and across experts
      for (int64_t e = 0; e < E; ++e) {
        const float g3 = 1.75f + 0.01f * static_cast<float>(e % 7), g2 = 0.6f;
        for (auto* list : {&experts.on_host, &experts.on_device}) {
          (*list)[e].w3.global_scale *= g3;
          (*list)[e].w2.global_scale *= g2;
        }
      }
    const std::vector<ops::Expert>& hexp = experts.on_host;
    const std::vector<ops::Expert>& dexp = experts.on_device;
    for (const Run& run : runs) {
      const int64_t T = run.T;
      Tensor x = random_f32({T, D}, r), w = random_f32({T, k}, r, 0.5f);
      Tensor idx = random_picks(T, E, k, run.skew, r);
      auto dx = upload(x), dw = upload(w), didx = upload(idx);
      const std::string base =
          cat("moe grouped ", ops::weight_format_name(f), " T=", T, run.skew ? " skewed" : "");

      // The CPU reference of 40 random tokens and the first and last.
      std::vector<int64_t> rows = {0, T - 1};
      for (int i = 0; i < 40; ++i) rows.push_back(r.index(T));
      const Tensor xr = rows_of(x, rows), wr = rows_of(w, rows), ir = rows_of(idx, rows);
      Tensor ref(DType::f32, {static_cast<int64_t>(rows.size()), D});
      ops::moe_experts(cpu::context(), ops::MoeExpertsArgs{xr, ir, wr, hexp, 10.0f, ref});

      // The library path on every token.
      be.set_moe_prefill_library(true);
      const std::string lib_path = be.moe_path(dexp[0].w1, T, k);
      EXPECT_EQ(lib_path.find("moe_grouped_kernel"), std::string::npos) << lib_path;
      EXPECT_EQ(lib_path.find("moe_grouped_wgmma_kernel"), std::string::npos) << lib_path;
      auto lib = poisoned(DType::f32, {T, D});
      ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, dexp, 10.0f, lib});
      be.set_moe_prefill_library(false);
      const Tensor lib_host = cuda::to_host(lib);

      Tensor got[kConfigs];
      set_grouped_kernel(false);  // the mma.sync kernels in every tile configuration
      for (int c = 0; c < kConfigs; ++c) {
        cuda::set_moe_grouped_tile_config(configs[c]);
        const std::string path = be.moe_path(dexp[0].w1, T, k);
        const std::string what = cat("moe grouped ", ops::weight_format_name(f), " T=", T, run.skew ? " skewed" : "",
                                     " tile config ", config_names[c], " (", path, ")");
        EXPECT_NE(path.find("moe_grouped_kernel"), std::string::npos) << what;
        EXPECT_EQ(path.find(c == 1 ? "| 128x" : config_tiles[c]) != std::string::npos, c != 1) << what;
        if (path.find("32x256 (") != std::string::npos || path.find("64x128 (") != std::string::npos)
          EXPECT_NE(path.find(c == 0 || c == 2 || c == 4 ? "weights as A" : "x as A"), std::string::npos) << what;
        if (c == 4) EXPECT_NE(path.find("32x256 (8 warps)"), std::string::npos) << what;
        auto out = poisoned(DType::f32, {T, D});
        ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, dexp, 10.0f, out});
        got[c] = cuda::to_host(out);
        expect_close(upload(rows_of(got[c], rows)), ref, kTolBf16, what + " vs cpu");
        // Against the library: the same bf16 operands and f32 sums in another order (h's bf16 rounding may flip
        // for a few values), so far under the bf16 tolerance.
        expect_close(out, lib_host, 1e-3, what + " vs library");
      }
      cuda::set_moe_grouped_tile_config(saved_tile_);
      // Every pair row sees the same weights and k order in every tile (the 128-pair tiles with the mma operands
      // swapped: each output is still the same 16 exact products a k-step): the same bits expected.
      for (int c = 1; c < kConfigs; ++c)
        EXPECT_EQ(std::memcmp(got[0].data<float>(), got[c].data<float>(), static_cast<size_t>(T * D) * 4), 0)
            << "moe grouped " << ops::weight_format_name(f) << " T=" << T << (run.skew ? " skewed" : "")
            << ": tile config " << config_names[c] << " differs from the default in some bits (both are checked "
            << "against the library above)";

      // The wgmma kernel (TERN_MOE_GROUPED=wgmma; then 96-pair tiles by TERN_MOE_WGMMA_N, ragged tiles of
      // another width, and 128-pair tiles, whose up kernel runs a 3-stage ring) against the CPU, the library and
      // the default mma.sync tiles: the same bf16 operands and f32 sums in another order (h's bf16 rounding may
      // flip for a few values), so far under the bf16 tolerance.
      Tensor wgmma_default;  // at the width the pairs per expert choose
      for (const char* n : {"", "96", "128"}) {
        set_grouped_kernel(true);
        if (*n != '\0') setenv("TERN_MOE_WGMMA_N", n, 1);
        const std::string path = be.moe_path(dexp[0].w1, T, k);
        const std::string what = cat(base, *n != '\0' ? cat(" ", n, "-pair tiles") : std::string(), " (", path, ")");
        EXPECT_NE(path.find("moe_grouped_wgmma_kernel"), std::string::npos) << what;
        auto out = poisoned(DType::f32, {T, D});
        ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, dexp, 10.0f, out});
        expect_close(upload(rows_of(cuda::to_host(out), rows)), ref, kTolBf16, what + " vs cpu");
        expect_close(out, lib_host, 1e-3, what + " vs library");
        expect_close(out, got[0], 1e-3, what + " vs mma.sync");
        if (*n == '\0') wgmma_default = cuda::to_host(out);
      }
      // Unforced (the default): wgmma from kMoeWgmmaMinPairs mean pairs an expert, mma.sync below; the path
      // names both, and the bits are those of the kernel the pairs choose.
      unsetenv("TERN_MOE_GROUPED");
      unsetenv("TERN_MOE_WGMMA_N");
      {
        const bool wgmma = T * k >= cuda::kMoeWgmmaMinPairs * E;
        const std::string path = be.moe_path(dexp[0].w1, T, k);
        const std::string what = cat(base, " unforced (", path, ")");
        EXPECT_NE(path.find("moe_grouped_wgmma_kernel"), std::string::npos) << what;
        EXPECT_NE(path.find("moe_grouped_kernel"), std::string::npos) << what;
        auto out = poisoned(DType::f32, {T, D});
        ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, dexp, 10.0f, out});
        const Tensor want = wgmma ? wgmma_default : got[0];
        EXPECT_EQ(std::memcmp(cuda::to_host(out).data<float>(), want.data<float>(), static_cast<size_t>(T * D) * 4), 0)
            << what << ": not the bits of the " << (wgmma ? "wgmma" : "mma.sync") << " kernel the pairs choose";
      }
      set_grouped_kernel(false);
    }
  }
  be.check_device_errors();
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuMoeGrouped, ::testing::Values(kFixture, kV4Flash), ShapeName());

// The wgmma kernel's edges at every tile width (TERN_MOE_WGMMA_N 64 / 96 / 112 / 128) against the CPU and the
// default mma.sync tiles, on a shape of neither model: D = 384 (the down kernel's second 256-row n-tile runs
// past D: rows zero-filled, outputs not stored), inter = 256 (two up n-tiles), 16 experts, top-4. Runs: one hot
// expert (every token's first pick: 600 pairs, many m-tiles of one expert, the others ~120), skewed routing
// (experts without pairs, ragged jobs) and 513 uniform tokens (odd pair counts).
TEST(GpuMoeGroupedWgmma, EdgeShapesEveryTileWidth) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  constexpr int64_t E = 16, k = 4, D = 384, inter = 256;
  cuda::CudaBackend& be = cuda::register_backend();
  struct Run {
    int64_t T;
    int mode;  // 0 uniform, 1 skewed, 2 one hot expert
  };
  const Run runs[] = {{600, 2}, {1000, 1}, {513, 0}};
  for (WeightFormat f : {WeightFormat::mxfp4, WeightFormat::nvfp4}) {
    RandomExperts experts(f, E, D, inter, r);
    const std::vector<ops::Expert>& hexp = experts.on_host;
    const std::vector<ops::Expert>& dexp = experts.on_device;
    for (const Run& run : runs) {
      const int64_t T = run.T;
      Tensor x = random_f32({T, D}, r), w = random_f32({T, k}, r, 0.5f);
      Tensor idx = random_picks(T, E, k, run.mode == 1, r);
      if (run.mode == 2)  // expert 3 first for every token (swapped with it where another pick holds it)
        for (int64_t t = 0; t < T; ++t) {
          int32_t* row = idx.data<int32_t>() + t * k;
          for (int64_t j = 1; j < k; ++j)
            if (row[j] == 3) row[j] = row[0];
          row[0] = 3;
        }
      auto dx = upload(x), dw = upload(w), didx = upload(idx);
      std::vector<int64_t> rows = {0, T - 1};
      for (int i = 0; i < 30; ++i) rows.push_back(r.index(T));
      const Tensor xr = rows_of(x, rows), wr = rows_of(w, rows), ir = rows_of(idx, rows);
      Tensor ref(DType::f32, {static_cast<int64_t>(rows.size()), D});
      ops::moe_experts(cpu::context(), ops::MoeExpertsArgs{xr, ir, wr, hexp, 10.0f, ref});

      setenv("TERN_MOE_GROUPED", "mma", 1);
      unsetenv("TERN_MOE_WGMMA_N");
      auto mma = poisoned(DType::f32, {T, D});
      ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, dexp, 10.0f, mma});
      const Tensor mma_host = cuda::to_host(mma);
      for (const char* n : {"32", "64", "96", "112", "128"}) {
        setenv("TERN_MOE_GROUPED", "wgmma", 1);
        setenv("TERN_MOE_WGMMA_N", n, 1);
        const std::string path = be.moe_path(dexp[0].w1, T, k);
        const std::string what = cat("moe grouped wgmma ", ops::weight_format_name(f), " T=", T,
                                     run.mode == 1 ? " skewed" : run.mode == 2 ? " one hot expert" : "", " ", n,
                                     "-pair tiles (", path, ")");
        EXPECT_NE(path.find("moe_grouped_wgmma_kernel"), std::string::npos) << what;
        auto out = poisoned(DType::f32, {T, D});
        ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, dexp, 10.0f, out});
        expect_close(upload(rows_of(cuda::to_host(out), rows)), ref, kTolBf16, what + " vs cpu");
        expect_close(out, mma_host, 1e-3, what + " vs mma.sync");
      }
      unsetenv("TERN_MOE_GROUPED");
      unsetenv("TERN_MOE_WGMMA_N");
    }
  }
  be.check_device_errors();
}

// The wgmma kernels with a row's scales copied 16 bytes at a time (TERN_MOE_SCALE_GROUPS=1: every 4 stages for MXFP4,
// 2 for NVFP4, into a two-group ring) give the bits of the per-stage copies: K = 1 024 (up) and 512 (down), so groups
// span tiles' stages and the ring wraps; both FP4 formats, 32-, 64- and 128-pair tiles (3 or 4 stages in the ring).
TEST(GpuMoeGroupedWgmma, ScaleGroupsBitIdentical) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  constexpr int64_t E = 16, k = 4, D = 1024, inter = 512, T = 600;
  cuda::CudaBackend& be = cuda::register_backend();
  setenv("TERN_MOE_GROUPED", "wgmma", 1);
  for (WeightFormat f : {WeightFormat::mxfp4, WeightFormat::nvfp4}) {
    RandomExperts experts(f, E, D, inter, r);
    const Tensor x = random_f32({T, D}, r), w = random_f32({T, k}, r, 0.5f);
    const Tensor idx = random_picks(T, E, k, true, r);
    auto dx = upload(x), dw = upload(w), didx = upload(idx);
    for (const char* n : {"32", "64", "128"}) {
      setenv("TERN_MOE_WGMMA_N", n, 1);
      Tensor got[2];
      for (int groups = 0; groups < 2; ++groups) {
        if (groups == 1) setenv("TERN_MOE_SCALE_GROUPS", "1", 1);
        auto y = poisoned(DType::f32, {T, D});
        ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, experts.on_device, 10.0f, y});
        got[groups] = cuda::to_host(y);
        unsetenv("TERN_MOE_SCALE_GROUPS");
      }
      unsetenv("TERN_MOE_WGMMA_N");
      int64_t differ = 0;
      for (int64_t i = 0; i < T * D; ++i)
        differ += std::memcmp(got[0].data<float>() + i, got[1].data<float>() + i, 4) != 0;
      EXPECT_EQ(differ, 0) << ops::weight_format_name(f) << " " << n << "-pair tiles: scale groups changed " << differ
                           << " outputs (" << be.moe_path(experts.on_device[0].w1, T, k) << ")";
    }
  }
  unsetenv("TERN_MOE_GROUPED");
  be.check_device_errors();
}

// Decode and verify batches on the grouped kernels (set_moe_grouped_min_tokens; TERN_MOE_GROUPED_MIN_TOKENS in a
// server): 1 to 256 tokens at the real model's 256 experts (6 pairs an expert at 256 tokens, most experts one pair
// or none at 16) and the fixture's, uniform and skewed, against the CPU on a sample of rows and against the decode
// kernels on every row (bf16 operands both; h rounded to bf16 on the grouped path), and the path names say which
// ran. Then the same batch inside a CUDA graph replays the eager bits (the plan stays on the device).
TEST_P(GpuMoeGrouped, SmallBatchesAgainstCpuAndDecodeKernels) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  const int64_t E = s.experts, k = s.experts_per_token, D = s.D, inter = s.inter;
  cuda::CudaBackend& be = cuda::register_backend();
  saved_min_tokens_ = be.moe_grouped_min_tokens();
  for (WeightFormat f : {WeightFormat::mxfp4, WeightFormat::nvfp4}) {
    RandomExperts experts(f, E, D, inter, r);
    const std::vector<ops::Expert>& hexp = experts.on_host;
    const std::vector<ops::Expert>& dexp = experts.on_device;
    for (const int64_t T : {int64_t{1}, int64_t{16}, int64_t{64}, int64_t{128}, int64_t{256}})
      for (const bool skew : {false, true}) {
        Tensor x = random_f32({T, D}, r), w = random_f32({T, k}, r, 0.5f);
        Tensor idx = random_picks(T, E, k, skew, r);
        auto dx = upload(x), dw = upload(w), didx = upload(idx);
        std::vector<int64_t> rows = {0, T - 1};
        for (int i = 0; i < 20; ++i) rows.push_back(r.index(T));
        const Tensor xr = rows_of(x, rows), wr = rows_of(w, rows), ir = rows_of(idx, rows);
        Tensor ref(DType::f32, {static_cast<int64_t>(rows.size()), D});
        ops::moe_experts(cpu::context(), ops::MoeExpertsArgs{xr, ir, wr, hexp, 10.0f, ref});

        be.set_moe_grouped_min_tokens(T + 1);  // the decode kernels
        const std::string decode_path = be.moe_path(dexp[0].w1, T, k);
        EXPECT_EQ(decode_path.find("moe_grouped"), std::string::npos) << decode_path;
        auto dec = poisoned(DType::f32, {T, D});
        ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, dexp, 10.0f, dec});
        const Tensor dec_host = cuda::to_host(dec);

        be.set_moe_grouped_min_tokens(T);  // the grouped kernels
        const std::string path = be.moe_path(dexp[0].w1, T, k);
        const std::string what =
            cat("moe ", ops::weight_format_name(f), " T=", T, skew ? " skewed" : "", " on the grouped kernels (", path, ")");
        EXPECT_NE(path.find("moe_grouped"), std::string::npos) << what;
        auto out = poisoned(DType::f32, {T, D});
        ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, dexp, 10.0f, out});
        const Tensor eager = cuda::to_host(out);
        expect_close(upload(rows_of(eager, rows)), ref, kTolBf16, what + " vs cpu");
        expect_close(out, dec_host, kTolBf16, what + " vs the decode kernels");

        // Captured (the expert table and the scratch exist since the eager call) and replayed.
        auto replayed = poisoned(DType::f32, {T, D});
        be.synchronize();
        CapturedOps graph([&] {
          ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, dexp, 10.0f, replayed});
        });
        ASSERT_EQ(graph.error(), "") << what;
        ASSERT_EQ(graph.replay(), "") << what;
        EXPECT_EQ(std::memcmp(cuda::to_host(replayed).data<float>(), eager.data<float>(), static_cast<size_t>(T * D) * 4),
                  0)
            << what << ": a graph replay differs from the eager call";
      }
  }
  be.check_device_errors();
}

}  // namespace
}  // namespace tern::gputest
