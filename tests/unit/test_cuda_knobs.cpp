// The CUDA backend's TERN_* knobs as their accessors read them (issue #17): the documented values select what
// they did before core/env.h, and a value a knob does not know is refused instead of running the default path.
// Host code only (no kernel, no device call): runs on machines without a GPU, in builds with the CUDA toolkit.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>

#include "backends/cuda/kernels/attention.cuh"
#include "backends/cuda/kernels/indexer.cuh"
#include "backends/cuda/kernels/linear.cuh"
#include "backends/cuda/kernels/linear_x8.cuh"
#include "backends/cuda/kernels/moe.cuh"
#include "backends/cuda/kernels/moe_grouped.cuh"
#include "backends/cuda/kernels/moe_grouped_wgmma.cuh"
#include "core/error.h"
#include "refusal.h"

namespace tern::cuda {
namespace {

// Sets (nullptr: unsets) one variable for a scope; restores what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* was = std::getenv(name)) was_ = was, had_ = true;
    set(value);
  }
  ~ScopedEnv() { set(had_ ? was_.c_str() : nullptr); }
  void set(const char* value) const {
    if (value != nullptr) setenv(name_, value, 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::string was_;
  bool had_ = false;
};

using test::refusal;

// Knobs read once keep -1 in their atomic until read; storing it back (through the setter, as a test-only
// value) makes the next call read the environment again.
template <class E>
E unread() {
  return static_cast<E>(-1);
}

// The scored routing's register kernel takes V4-Flash's 256 experts and 6 picks; more experts (a lane holds 8) or
// more than 32 picks (lane j keeps pick j) stay on route_scored_kernel, whatever TERN_ROUTE_REGS says.
TEST(CudaKnobs, RouteRegisterKernelShapes) {
  EXPECT_TRUE(route_in_registers(256, 6));
  EXPECT_TRUE(route_in_registers(16, 2));
  EXPECT_TRUE(route_in_registers(256, 32));
  EXPECT_FALSE(route_in_registers(257, 6));
  EXPECT_FALSE(route_in_registers(1024, 6));
  EXPECT_FALSE(route_in_registers(256, 33));
}

// linear_x8's plan (host code, no device): V4-Flash's split decode products whose grid is one block an SM take the
// cluster split when asked (TERN_X8_CLUSTER) and then want no workspace; the same split without it wants the
// workspace; a product that does not split (wq_b: 256 row tiles), splits over more than 8 blocks or splits into more
// blocks than SMs (wo_b, w1|w3: 256) never takes it.
TEST(CudaKnobs, X8ClusterSplitShapes) {
  auto params = [](int64_t out, int64_t in, int64_t T, bool cluster) {
    LinearParams p;
    p.w.kind = WeightFormat::fp8_block;
    p.w.w = reinterpret_cast<const void*>(uintptr_t{4096});  // never read: 16-byte aligned
    p.w.out = out;
    p.w.in = in;
    p.w.s_cols = in / 128;
    p.x_stride = in;
    p.rows_per_group = out;
    p.T = T;
    p.num_sms = 132;
    p.partial_floats = INT64_MAX;
    p.num_counters = INT64_MAX;
    p.cluster_split = cluster;
    return p;
  };
  struct Product {
    const char* name;
    int64_t out, in;
    bool splits;
  };
  const Product products[] = {{"wq_a", 1024, 4096, true},     {"wkv", 512, 4096, true},  {"wq_a|wkv", 1536, 4096, true},
                              {"wo_b", 4096, 8192, false},    {"w1", 2048, 4096, true},  {"w1|w3", 4096, 4096, false},
                              {"w2", 4096, 2048, true},       {"wq_b", 32768, 1024, false}};
  for (const Product& pr : products)
    for (int64_t T : {1, 16, 64}) {
      const LinearParams on = params(pr.out, pr.in, T, true), off = params(pr.out, pr.in, T, false);
      ASSERT_TRUE(linear_x8_ok(on)) << pr.name;
      EXPECT_EQ(linear_x8_splits_in_cluster(on), pr.splits) << pr.name << " T=" << T;
      EXPECT_FALSE(linear_x8_splits_in_cluster(off)) << pr.name << " T=" << T;
      if (pr.splits) {
        EXPECT_EQ(linear_x8_partial_floats(on), 0) << pr.name << " T=" << T;
        EXPECT_GT(linear_x8_partial_floats(off), 0) << pr.name << " T=" << T;
      } else if (std::string(pr.name) != "wq_b") {  // split through the workspace, asked or not
        EXPECT_GT(linear_x8_partial_floats(on), 0) << pr.name << " T=" << T;
      }
    }
  // bf16 wkv|wgate of a CSA compressor (2048 x 4096): 16 row tiles, 8 splits (one block an SM) in a cluster; the
  // indexer's (512 x 4096): 4 row tiles, 16 splits through the workspace (8 would leave most SMs idle).
  for (int64_t T : {1, 16, 64}) {
    LinearParams csa = params(2048, 4096, T, true), idx = params(512, 4096, T, true);
    for (LinearParams* q : {&csa, &idx}) {
      q->w.kind = WeightFormat::bf16;
      q->w.s_cols = 0;
    }
    EXPECT_TRUE(linear_x8_splits_in_cluster(csa)) << "T=" << T;
    EXPECT_EQ(linear_x8_partial_floats(csa), 0) << "T=" << T;
    EXPECT_FALSE(linear_x8_splits_in_cluster(idx)) << "T=" << T;
    EXPECT_EQ(linear_x8_partial_floats(idx), 16 * T * 512) << "T=" << T;
  }
}

TEST(CudaKnobs, MoeGroupedReadAtEachCall) {
  ScopedEnv env("TERN_MOE_GROUPED", nullptr);
  EXPECT_STREQ(moe_grouped_kernel_forced(), "");
  for (const char* v : {"", "auto"}) {
    env.set(v);
    EXPECT_STREQ(moe_grouped_kernel_forced(), "") << v;
  }
  env.set("wgmma");
  EXPECT_STREQ(moe_grouped_kernel_forced(), "wgmma");
  env.set("mma");
  EXPECT_STREQ(moe_grouped_kernel_forced(), "mma");
  env.set("e4m3");
  EXPECT_STREQ(moe_grouped_kernel_forced(), "e4m3");
  env.set("wgma");
  EXPECT_EQ(refusal([] { moe_grouped_kernel_forced(); }),
            "TERN_MOE_GROUPED=\"wgma\": expected auto, wgmma, mma or e4m3 (unset: auto)");
}

TEST(CudaKnobs, MoeWgmmaN) {
  ScopedEnv env("TERN_MOE_WGMMA_N", nullptr);
  MoeParams shape_only;  // E == 0: 0 unless forced
  EXPECT_EQ(moe_grouped_wgmma_tile_pairs(shape_only), 0);
  env.set("auto");
  EXPECT_EQ(moe_grouped_wgmma_tile_pairs(shape_only), 0);
  for (int n : {32, 64, 96, 112, 128}) {
    env.set(std::to_string(n).c_str());
    EXPECT_EQ(moe_grouped_wgmma_tile_pairs(shape_only), n);
  }
  // Before: any other value fell back to the rule without a word.
  for (const char* junk : {"100", "0", "96x", "wide"}) {
    env.set(junk);
    EXPECT_THROW(moe_grouped_wgmma_tile_pairs(shape_only), Error) << junk;
  }
  env.set("100");
  EXPECT_EQ(refusal([&] { moe_grouped_wgmma_tile_pairs(shape_only); }),
            "TERN_MOE_WGMMA_N=\"100\": expected auto, 32, 64, 96, 112 or 128 (unset: auto)");
}

TEST(CudaKnobs, MoeWgmmaCluster) {
  ScopedEnv env("TERN_MOE_WGMMA_CLUSTER", nullptr);
  EXPECT_EQ(moe_grouped_wgmma_cluster(16), 2);  // the default (session 36: faster at 2K-8K)
  EXPECT_EQ(moe_grouped_wgmma_cluster(15), 1);  // a job's n-tiles must divide into clusters
  EXPECT_NE(moe_grouped_wgmma_path_name(MoeParams{}).find("multicast to 2-block"), std::string::npos);
  env.set("1");
  EXPECT_EQ(moe_grouped_wgmma_cluster(16), 1);
  EXPECT_EQ(moe_grouped_wgmma_path_name(MoeParams{}).find("multicast"), std::string::npos);
  env.set("4");  // 4-block clusters were slower (session 37) and are gone
  EXPECT_EQ(refusal([] { moe_grouped_wgmma_cluster(16); }),
            "TERN_MOE_WGMMA_CLUSTER=\"4\": expected 1 or 2 (unset: 2)");
}

// Auto: the fewest tiles over an expert's mean pairs plus 10%, then the narrowest width with that many. At 8K tokens
// of V4-Flash (256 experts, 6 a token: mean 192 pairs) the least padding alone picked 7 x 32 over 2 x 128, a 2.3x
// slower up kernel (session 36).
TEST(CudaKnobs, MoeWgmmaNAutoFewestTiles) {
  ScopedEnv env("TERN_MOE_WGMMA_N", nullptr);
  MoeParams p;
  p.k = 6;
  p.E = 256;
  for (const auto& [tokens, pairs] : std::initializer_list<std::pair<int64_t, int>>{
           {1024, 32}, {2048, 64}, {3072, 96}, {4096, 128}, {8192, 128}, {16384, 128}, {65536, 128}}) {
    p.T = tokens;
    EXPECT_EQ(moe_grouped_wgmma_tile_pairs(p), pairs) << tokens << " tokens";
  }
}

TEST(CudaKnobs, MoeGroupedTile) {
  const int saved = moe_grouped_tile_config();
  ScopedEnv env("TERN_MOE_GROUPED_TILE", nullptr);
  const auto read = [](const char* v) {
    ScopedEnv e("TERN_MOE_GROUPED_TILE", v);
    set_moe_grouped_tile_config(-1);
    return moe_grouped_tile_config();
  };
  EXPECT_EQ(read(nullptr), kMoeGroupedTileDefault);
  EXPECT_EQ(read(""), kMoeGroupedTileDefault);
  EXPECT_EQ(read("default"), kMoeGroupedTileDefault);
  EXPECT_EQ(read("old"), kMoeGroupedTileOld);
  EXPECT_EQ(read("128x128"), kMoeGroupedTileNarrow);
  EXPECT_EQ(read("small-unswapped"), kMoeGroupedTileSmallUnswapped);
  EXPECT_EQ(read("8-warp-32"), kMoeGroupedTileWarps8);
  EXPECT_EQ(refusal([&] { read("128x256"); }),
            "TERN_MOE_GROUPED_TILE=\"128x256\": expected default, old, 128x128, small-unswapped or 8-warp-32 (unset: default)");
  set_moe_grouped_tile_config(saved);
}

TEST(CudaKnobs, MoeL2Hint) {
  const int saved = moe_l2_hint();
  const auto read = [](const char* v) {
    ScopedEnv e("TERN_MOE_L2_HINT", v);
    set_moe_l2_hint(-1);
    return moe_l2_hint();
  };
  EXPECT_EQ(read(nullptr), 256);  // session 33: the MoE kernels -3.5% at 1K on the H100
  EXPECT_EQ(read("0"), 0);
  EXPECT_EQ(read("128"), 128);
  EXPECT_EQ(read("256"), 256);
  EXPECT_EQ(refusal([&] { read("64"); }), "TERN_MOE_L2_HINT=\"64\": expected 0, 128 or 256 (unset: 256)");
  set_moe_l2_hint(saved);
}

TEST(CudaKnobs, IndexerPrefill) {
  const IndexerPrefill saved = indexer_prefill();
  const auto read = [](const char* v) {
    ScopedEnv e("TERN_INDEXER_PREFILL", v);
    set_indexer_prefill(unread<IndexerPrefill>());
    return indexer_prefill();
  };
  EXPECT_EQ(read(nullptr), IndexerPrefill::mma);
  EXPECT_EQ(read("auto"), IndexerPrefill::mma);
  EXPECT_EQ(read("mma"), IndexerPrefill::mma);
  EXPECT_EQ(read("mma-bf16x6"), IndexerPrefill::mma);
  EXPECT_EQ(read("mma-fp16x3"), IndexerPrefill::mma_fp16x3);
  EXPECT_EQ(read("sgemm"), IndexerPrefill::sgemm);
  EXPECT_EQ(refusal([&] { read("sgem"); }),
            "TERN_INDEXER_PREFILL=\"sgem\": expected auto, mma, mma-bf16x6, mma-fp16x3 or sgemm (unset: auto)");
  set_indexer_prefill(saved);
}

TEST(CudaKnobs, ExactPath) {
  const ExactPath saved = exact_path();
  const auto read = [](const char* v) {
    ScopedEnv e("TERN_EXACT_PATH", v);
    set_exact_path(unread<ExactPath>());
    return exact_path();
  };
  EXPECT_EQ(read(nullptr), ExactPath::fp8_on_tensor_cores);
  EXPECT_EQ(read("auto"), ExactPath::fp8_on_tensor_cores);
  EXPECT_EQ(read("tc"), ExactPath::tensor_cores);
  EXPECT_EQ(read("cuda-cores"), ExactPath::cuda_cores);
  EXPECT_EQ(refusal([&] { read("cuda_cores"); }),
            "TERN_EXACT_PATH=\"cuda_cores\": expected auto, tc or cuda-cores (unset: auto)");
  set_exact_path(saved);
}

TEST(CudaKnobs, AttentionDecode) {
  const AttentionDecode saved = attention_decode();
  const auto read = [](const char* v) {
    ScopedEnv e("TERN_ATTENTION_DECODE", v);
    set_attention_decode(unread<AttentionDecode>());
    return attention_decode();
  };
  EXPECT_EQ(read(nullptr), AttentionDecode::heads);
  EXPECT_EQ(read("heads"), AttentionDecode::heads);
  EXPECT_EQ(read("heads16"), AttentionDecode::heads16);
  EXPECT_EQ(read("heads32"), AttentionDecode::heads32);
  EXPECT_EQ(read("cluster"), AttentionDecode::cluster);
  EXPECT_EQ(refusal([&] { read("heads8"); }),
            "TERN_ATTENTION_DECODE=\"heads8\": expected heads, heads16, heads32 or cluster (unset: heads)");
  set_attention_decode(saved);
}

TEST(CudaKnobs, LinearVariant) {
  const int saved = linear_variant();
  const auto read = [](const char* v) {
    ScopedEnv e("TERN_LINEAR_VARIANT", v);
    set_linear_variant(-1);
    return linear_variant();
  };
  EXPECT_EQ(read(nullptr), 0);
  EXPECT_EQ(read("0"), 0);
  EXPECT_EQ(read("1"), 1);
  EXPECT_EQ(read("2"), 2);
  // Before: 3 ran a mix of paths no variant names, and junk (atoi: 0) the default.
  EXPECT_EQ(refusal([&] { read("3"); }),
            "TERN_LINEAR_VARIANT=\"3\": out of range, expected an integer from 0 to 2 (unset: 0)");
  EXPECT_THROW(read("bulk"), Error);
  set_linear_variant(saved);
}

}  // namespace
}  // namespace tern::cuda
