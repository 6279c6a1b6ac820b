// Micro-benchmark of the key kernels at the real V4-Flash decode shapes, each against its floor.
// Copy bandwidth is measured first in the same run; weight-streaming kernels rotate over enough weight
// copies that they never sit in L2, and report weight bytes / time as a share of the copy figure.
// Usage: tern_gpu_bench [--quick] [--profile-report]      (prints one table; every kernel was checked by
// tern_gpu_tests). --profile-report also records the whole run with the built-in profiler (cuda::Profiler)
// and prints its per-kernel totals: its us/call of each kernel is a cross-check of the table's figures.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/device_memory.h"
#include "backends/cuda/kernels/act_quant.cuh"
#include "backends/cuda/kernels/attention.cuh"
#include "backends/cuda/kernels/indexer.cuh"
#include "backends/cuda/kernels/linear.cuh"
#include "backends/cuda/kernels/moe_grouped.cuh"
#include "backends/cuda/kernels/pdl.cuh"
#include "backends/cuda/library_gemm.h"
#include "backends/cuda/profiler.h"
#include "backends/cuda/timing.h"
#include "core/dtype.h"
#include "bench_sections.h"
#include "gpu_test_util.h"
#include "ops/attention.h"
#include "ops/step.h"
#include "ops/indexer.h"
#include "ops/linear.h"
#include "ops/mhc.h"
#include "ops/moe.h"

namespace tern::gputest {
namespace {

struct Row {
  std::string kernel, shape;
  double us = 0, eager_us = 0, gbs = 0, floor_us = 0;
};

std::vector<Row> g_rows;
double g_copy_gbs = 0;
bool g_profile = false;  // --profile: run each call twice, eagerly, and time nothing

// us: per call inside a CUDA graph (device time); eager_us: per call issued from the host one by one.
void report(const std::string& kernel, const std::string& shape, double us, double eager_us, double bytes) {
  Row r{kernel, shape, us, eager_us, bytes > 0 ? bytes / (us * 1e3) : 0, bytes > 0 ? bytes / (g_copy_gbs * 1e3) : 0};
  g_rows.push_back(r);
  std::printf("%-34s %-28s %9.1f us (eager %7.1f, floor %6.1f)  %7.0f GB/s  %5.0f%% of copy\n", kernel.c_str(),
              shape.c_str(), us, eager_us, r.floor_us, r.gbs, g_copy_gbs > 0 ? 100.0 * r.gbs / g_copy_gbs : 0.0);
  std::fflush(stdout);
}

// Graph and eager timings of call(i) (i cycles over `count` variants, e.g. weight copies).
void measure(const std::string& kernel, const std::string& shape, double bytes, int count,
             const std::function<void(int)>& call) {
  if (g_profile) {
    call(0);
    call(0);
    cuda::register_backend().synchronize();
    return;
  }
  const cuda::Timing g = cuda::time_graph(call, count, 20);
  int i = 0;
  const cuda::Timing e = cuda::time_device([&] { call(i++ % count); }, 3, 30);
  report(kernel, shape, g.median_us, e.median_us, bytes);
}

// Enough device copies of one weight that cycling through them never hits L2.
struct Rotation {
  std::vector<cuda::WeightStore> stores;
  std::vector<ops::Weight> copies;
  Rotation(const HostWeight& hw, size_t bytes) {
    const int n = static_cast<int>(std::clamp<size_t>((512u << 20) / std::max<size_t>(bytes, 1) + 1, 2, 64));
    stores.resize(n);
    for (int i = 0; i < n; ++i) copies.push_back(stores[i].upload(hw.w));
  }
};

size_t weight_bytes(const ops::Weight& w) {
  return w.weight.nbytes() + (w.scale.empty() ? 0 : w.scale.nbytes());
}

// groups > 1: a grouped linear (wo_a): W [out, in] holds `groups` blocks of out/groups rows, x [T, groups, in].
void bench_linear(const char* name, ops::WeightFormat f, int64_t out, int64_t in, std::vector<int64_t> Ts, Rand& r,
                  int64_t groups = 1) {
  const HostWeight hw = random_weight(f, out, in, r, 1.0f / std::sqrt(float(in)), name);
  const size_t bytes = weight_bytes(hw.w);
  Rotation rot(hw, bytes);
  // FP8 block and bf16 weights: one row per kernel (cuda::set_linear_variant), so one run compares them on the
  // same shapes.
  const bool variants = f == ops::WeightFormat::fp8_block || f == ops::WeightFormat::bf16;
  for (int64_t T : Ts) {
    auto x = upload(groups > 1 ? random_f32({T, groups, in}, r) : random_f32({T, in}, r));
    cuda::DeviceTensor y(DType::f32, groups > 1 ? Shape{T, groups, out / groups} : Shape{T, out});
    // FP8: variant 0 = linear_stream (from 9 tokens with x windows made once per product), 1 = linear_stream
    // staging x per block; bf16: 0 = linear_x8<bf16> (round_bf16 included), 2 = linear_bulk (x windows from 9
    // tokens), 1 = linear_mma.
    const bool fp8 = f == ops::WeightFormat::fp8_block;
    const std::string row = cat(groups > 1 ? "grouped_linear " : "linear ", name, " (", ops::weight_format_name(f), ")");
    const std::string shape = cat(out, "x", in, " T=", T);
    auto product = [&](const ops::Weight& w) {
      if (groups > 1) ops::grouped_linear(cuda::context(), x, w, y);
      else ops::linear(cuda::context(), x, w, y);
    };
    const std::vector<int> vs = !variants ? std::vector<int>{0} : fp8 ? std::vector<int>{0, 1} : std::vector<int>{0, 2, 1};
    for (int v : vs) {
      if (variants) cuda::set_linear_variant(v);
      const char* tag = !variants ? ""
                        : v == 0  ? (fp8 ? " v0 stream" : " v0 x8")
                        : v == 2  ? " v2 bulk"
                        : fp8     ? " v1 staged"
                                  : " v1 old";
      measure(row + tag, shape, static_cast<double>(bytes), static_cast<int>(rot.copies.size()),
              [&](int i) { product(rot.copies[i]); });
    }
    if (variants) cuda::set_linear_variant(0);
    // --activations fp8: act_quant + linear_x8_kernel (below 512 tokens), the quantisation included.
    if (fp8) {
      std::vector<ops::Weight> q(rot.copies.begin(), rot.copies.end());
      for (ops::Weight& w : q) w.act_fp8 = true;
      measure(row + " act-fp8 x8", shape, static_cast<double>(bytes), static_cast<int>(q.size()),
              [&](int i) { product(q[i]); });
    }
    // The same weight every call (up to ~40 MB stays in L2): what the kernel gives when its bytes are near,
    // i.e. whether DRAM or the kernel itself sets the time above.
    if (!g_profile && bytes <= (size_t{40} << 20))
      measure(row + " L2-hot", shape, static_cast<double>(bytes), 8, [&](int) { product(rot.copies[0]); });
  }
}

// One layer's 256 routed experts (one random expert replicated on the device), uniform routing.
void bench_moe(ops::WeightFormat f, std::vector<int64_t> Ts, Rand& r) {
  const int64_t E = 256, D = 4096, inter = 2048, k = 6;
  const HostWeight w1 = random_weight(f, inter, D, r, 0.03f, "w1"), w2 = random_weight(f, D, inter, r, 0.02f, "w2");
  cuda::WeightStore store;
  std::vector<ops::Expert> experts(E);
  for (int64_t e = 0; e < E; ++e) experts[e] = ops::Expert{store.upload(w1.w), store.upload(w2.w), store.upload(w1.w)};
  const double expert_bytes = 2.0 * static_cast<double>(weight_bytes(w1.w)) + static_cast<double>(weight_bytes(w2.w));
  for (int64_t T : Ts) {
    const Tensor idx = random_picks(T, E, k, r);
    std::vector<char> used(E, 0);
    for (int64_t i = 0; i < T * k; ++i) used[idx.data<int32_t>()[i]] = 1;
    const int64_t distinct = std::count(used.begin(), used.end(), 1);
    auto dx = upload(random_f32({T, D}, r)), dw = upload(random_f32({T, k}, r)), didx = upload(idx);
    cuda::DeviceTensor out(DType::f32, {T, D});
    // One row per kernel variant (ring depth, warps, the register kernel) where the bulk kernels take T;
    // the first is the default.
    cuda::CudaBackend& be = cuda::register_backend();
    const int variants = T <= 256 && !g_profile ? cuda::CudaBackend::moe_variants() : 1;
    {  // the decode kernels at every T (above 256: the register kernel); the grouped kernels in their own row below
      const gputest::MoeGroupedMinTokensGuard decode_kernels(cuda::CudaBackend::library_min_tokens());
      for (int v = 0; v < variants; ++v) {
        be.set_moe_variant(v);
        const std::string label =
            variants > 1 ? cat(" v", v, " ", cuda::CudaBackend::moe_variant_name(v)) : std::string();
        measure(cat("moe_experts (", ops::weight_format_name(f), ")", label),
                cat("T=", T, " experts=", distinct), expert_bytes * static_cast<double>(distinct), 1,
                [&](int) {
                  ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, experts, 10.0f, out});
                });
      }
      be.set_moe_variant(0);
      std::printf("  (path at T=%lld: %s)\n", static_cast<long long>(T), be.moe_path(experts[0].w1, T, k).c_str());
    }
    // The same call on the grouped tensor-core kernels (the crossover TERN_MOE_GROUPED_MIN_TOKENS would move):
    // their time follows the experts touched, the decode kernels' the pairs.
    {  // (MXFP4 / NVFP4 at 4096 x 2048: shapes the grouped kernels take)
      const gputest::MoeGroupedMinTokensGuard grouped(1);
      measure(cat("moe_experts grouped (", ops::weight_format_name(f), ")"),
              cat("T=", T, " experts=", distinct), expert_bytes * static_cast<double>(distinct), 1, [&](int) {
                ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, experts, 10.0f, out});
              });
      std::printf("  (grouped path at T=%lld: %s)\n", static_cast<long long>(T), be.moe_path(experts[0].w1, T, k).c_str());
    }
  }
}

// A prefill chunk's routed experts, whole op (plan, gather, products, SwiGLU, combine), at one layer's 256
// distinct experts (3.4 GB: never in L2), uniform routing: the grouped FP4 kernels (moe_grouped.cuh) against the
// older library path (experts expanded to bf16, per-expert cuBLAS; TERN_MOE_PREFILL=library), beside cuBLAS's
// own bf16 rate on one product of the same FLOP ([T k, D] x [3 inter, D]^T) measured in the same run, and the
// time to read the experts' FP4 bytes once at the copy bandwidth. FLOP: 2 * 3 * D * inter a pair. The grouped
// kernels in every tile configuration (cuda::set_moe_grouped_tile_config: default (128 x 256 from ~96 pairs an
// expert, weights as A everywhere), "128x128", "old" = the 32 / 64-pair tiles only, x as A; "small-unswapped" =
// session 9's default). Eager timings (the library path synchronises, so it
// cannot be captured in a graph).
void bench_moe_prefill(ops::WeightFormat f, std::vector<int64_t> Ts, Rand& r) {
  const int64_t E = 256, D = 4096, inter = 2048, k = 6;
  const HostWeight w1 = random_weight(f, inter, D, r, 0.03f, "w1"), w2 = random_weight(f, D, inter, r, 0.02f, "w2");
  cuda::WeightStore store;
  std::vector<ops::Expert> experts(E);
  for (int64_t e = 0; e < E; ++e) experts[e] = ops::Expert{store.upload(w1.w), store.upload(w2.w), store.upload(w1.w)};
  const double expert_bytes = 2.0 * static_cast<double>(weight_bytes(w1.w)) + static_cast<double>(weight_bytes(w2.w));
  cuda::CudaBackend& be = cuda::register_backend();
  const std::string fmt(ops::weight_format_name(f));
  for (int64_t T : Ts) {
    const Tensor idx = random_picks(T, E, k, r);
    std::vector<char> used(E, 0);
    for (int64_t i = 0; i < T * k; ++i) used[idx.data<int32_t>()[i]] = 1;
    const int64_t distinct = std::count(used.begin(), used.end(), 1), P = T * k;
    const double flop = 2.0 * 3.0 * static_cast<double>(D * inter) * static_cast<double>(P);
    const double bytes = expert_bytes * static_cast<double>(distinct);
    auto dx = upload(random_f32({T, D}, r)), dw = upload(random_f32({T, k}, r)), didx = upload(idx);
    cuda::DeviceTensor out(DType::f32, {T, D});
    const auto call = [&] {
      ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, experts, 10.0f, out});
    };
    const double cublas_us = be.library_gemm_us(P, 3 * inter, D, false, 10);
    be.set_moe_prefill_library(false);
    // The mma.sync tile configurations, then the wgmma kernel (TERN_MOE_GROUPED=wgmma, read at each call;
    // TERN_MOE_WGMMA_N as the caller set it); the variable and the tile configuration are restored after.
    const char* was = std::getenv("TERN_MOE_GROUPED");
    const std::string saved = was != nullptr ? was : "";
    setenv("TERN_MOE_GROUPED", "mma", 1);
    const int saved_tile = cuda::moe_grouped_tile_config();
    cuda::set_moe_grouped_tile_config(cuda::kMoeGroupedTileOld);
    const double old_us = cuda::time_device(call, 2, 10).median_us;
    cuda::set_moe_grouped_tile_config(cuda::kMoeGroupedTileNarrow);
    const double narrow_us = cuda::time_device(call, 2, 10).median_us;
    cuda::set_moe_grouped_tile_config(cuda::kMoeGroupedTileSmallUnswapped);
    const double unswapped_us = cuda::time_device(call, 2, 10).median_us;
    cuda::set_moe_grouped_tile_config(cuda::kMoeGroupedTileWarps8);
    const double warps8_us = cuda::time_device(call, 2, 10).median_us;
    cuda::set_moe_grouped_tile_config(cuda::kMoeGroupedTileDefault);
    const double grouped_us = cuda::time_device(call, 2, 10).median_us;
    cuda::set_moe_grouped_tile_config(saved_tile);
    const std::string path = be.moe_path(experts[0].w1, T, k);
    setenv("TERN_MOE_GROUPED", "wgmma", 1);
    const double wgmma_us = cuda::time_device(call, 2, 10).median_us;
    const std::string wgmma_path = be.moe_path(experts[0].w1, T, k);
    // --activations fp8 (the GPU default): the bf16 wgmma kernel (x and h fake-quantised) against the e4m3 kernels
    // (MXFP4 only; moe_e4m3_calls says whether they ran).
    std::vector<ops::Expert> fp8x = experts;
    for (ops::Expert& e : fp8x) e.w1.act_fp8 = e.w2.act_fp8 = e.w3.act_fp8 = true;
    const auto call8 = [&] {
      ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, fp8x, 10.0f, out});
    };
    const double wgmma8_us = cuda::time_device(call8, 2, 10).median_us;
    double e4m3_us = 0.0;
    bool e4m3_ran = false;
    if (f == ops::WeightFormat::mxfp4) {
      setenv("TERN_MOE_GROUPED", "e4m3", 1);
      const int64_t before = be.moe_e4m3_calls();
      e4m3_us = cuda::time_device(call8, 2, 10).median_us;
      e4m3_ran = be.moe_e4m3_calls() > before;
    }
    if (was != nullptr) setenv("TERN_MOE_GROUPED", saved.c_str(), 1);
    else unsetenv("TERN_MOE_GROUPED");
    be.set_moe_prefill_library(true);
    const double library_us = cuda::time_device(call, 1, 5).median_us;
    be.set_moe_prefill_library(false);
    const std::string shape = cat("T=", T, " experts=", distinct);
    report(cat("moe_prefill grouped (", fmt, ")"), shape, grouped_us, grouped_us, bytes);
    report(cat("moe_prefill grouped tile old (", fmt, ")"), shape, old_us, old_us, bytes);
    report(cat("moe_prefill grouped tile 128x128 (", fmt, ")"), shape, narrow_us, narrow_us, bytes);
    report(cat("moe_prefill grouped tile small-unswapped (", fmt, ")"), shape, unswapped_us, unswapped_us, bytes);
    report(cat("moe_prefill grouped tile 8-warp-32 (", fmt, ")"), shape, warps8_us, warps8_us, bytes);
    report(cat("moe_prefill grouped wgmma (", fmt, ")"), shape, wgmma_us, wgmma_us, bytes);
    report(cat("moe_prefill library (", fmt, ")"), shape, library_us, library_us, bytes);
    const auto tflops = [&](double us) { return flop / (us * 1e6); };
    std::printf("  moe_prefill %s T=%lld: grouped %.0f us %.0f TFLOP/s (%.0f%% of cuBLAS bf16 %.0f TFLOP/s, %.0f us), "
                "library %.0f us %.0f TFLOP/s; FP4 bytes once %.0f us (grouped %.2fx of it); grouped tile old %.0f us "
                "%.0f TFLOP/s (default %.2fx faster), tile 128x128 %.0f us %.0f TFLOP/s\n  (grouped path: %s)\n",
                fmt.c_str(), static_cast<long long>(T), grouped_us, tflops(grouped_us), 100.0 * cublas_us / grouped_us,
                tflops(cublas_us), cublas_us, library_us, tflops(library_us), bytes / (g_copy_gbs * 1e3),
                grouped_us / (bytes / (g_copy_gbs * 1e3)), old_us, tflops(old_us), old_us / grouped_us, narrow_us,
                tflops(narrow_us), path.c_str());
    std::printf("  moe_prefill %s T=%lld: wgmma %.0f us %.0f TFLOP/s (%.0f%% of cuBLAS bf16)\n  (wgmma path: %s)\n",
                fmt.c_str(), static_cast<long long>(T), wgmma_us, tflops(wgmma_us), 100.0 * cublas_us / wgmma_us,
                wgmma_path.c_str());
    report(cat("moe_prefill grouped wgmma, fp8 activations (", fmt, ")"), shape, wgmma8_us, wgmma8_us, bytes);
    if (e4m3_us > 0) report(cat("moe_prefill grouped e4m3, fp8 activations (", fmt, ")"), shape, e4m3_us, e4m3_us, bytes);
    std::printf("  moe_prefill %s T=%lld, fp8 activations: wgmma (bf16) %.0f us %.0f TFLOP/s; e4m3 %s\n", fmt.c_str(),
                static_cast<long long>(T), wgmma8_us, tflops(wgmma8_us),
                e4m3_us > 0 ? cat(static_cast<int64_t>(e4m3_us), " us ", static_cast<int64_t>(tflops(e4m3_us)),
                                  " TFLOP/s (", wgmma8_us / e4m3_us, "x the bf16 kernel", e4m3_ran ? "" : "; NOT the e4m3 kernel: it fell back",
                                  ")").c_str()
                            : "- (MXFP4 only)");
  }
}

void bench_attention(Rand& r, bool quick) {
  const int64_t H = 64, hd = 512, W = 128, k = 512;
  const ops::KvRowFormat f{ops::KvFormat::fp8_ds, hd, 64};
  const int64_t rb = f.row_bytes();
  for (int64_t ctx : quick ? std::vector<int64_t>{8192} : std::vector<int64_t>{8192, 65536}) {
    const int64_t num_c = ctx / 4;
    auto packed = [&](int64_t rows) {
      Tensor x = random_f32({rows, hd}, r), p(DType::u8, {rows, rb});
      ops::kv_pack(cpu::context(), x, f, p);
      return upload(p);
    };
    auto ring = packed(W), chunk = packed(1);
    // The compressed rows in shuffled pages of 64 rows (256 tokens of CSA), as the state pool holds them.
    Tensor comp_x = random_f32({num_c, hd}, r), comp_host(DType::u8, {num_c, rb});
    ops::kv_pack(cpu::context(), comp_x, f, comp_host);
    const PagedPair comp = paged_pair(comp_host, 64, r);
    auto selection = [&](int64_t n) {
      Tensor sel(DType::i32, {n, k});
      for (int64_t j = 0; j < n * k; ++j) sel.data<int32_t>()[j] = static_cast<int32_t>(r.index(num_c - n));
      return upload(sel);
    };
    auto dsel = selection(1);
    auto q = upload(random_f32({1, H, hd}, r)), sinks = upload(random_f32({H}, r));
    cuda::DeviceTensor out(DType::f32, {1, H, hd});
    ops::AttentionArgs a{q, ctx - 1, f, chunk, ring, W, comp.device, num_c, 4, dsel, sinks, 1.0f / std::sqrt(512.0f)};
    measure("sparse_attention csa fp8 rows", cat("1 query, 128+512 keys, ctx ", ctx),
            static_cast<double>((W + k) * rb), 1,
            [&](int) { ops::sparse_attention(cuda::context(), a, out); });
    // n queries of one sequence at once (a prefill chunk; each reads its own 128 + 512 rows, as n decode
    // slots would).
    for (int64_t n : ctx == 8192 ? std::vector<int64_t>{16, 64} : std::vector<int64_t>{}) {
      auto qn = upload(random_f32({n, H, hd}, r)), seln = selection(n), chunkn = packed(n);
      cuda::DeviceTensor outn(DType::f32, {n, H, hd});
      ops::AttentionArgs an{qn, ctx - n, f, chunkn, ring, W, comp.device, num_c, 4, seln, sinks, a.scale};
      measure("sparse_attention csa fp8 rows", cat(n, " queries, 128+512 keys each"),
              static_cast<double>(n * (W + k) * rb), 1,
              [&](int) { ops::sparse_attention(cuda::context(), an, outn); });
    }
    // HCA: every compressed row (ctx / 128).
    ops::AttentionArgs h = a;
    h.num_compressed = ctx / 128;
    h.ratio = 128;
    h.selected = TensorView();
    measure("sparse_attention hca fp8 rows", cat("1 query, 128+", ctx / 128, " keys"),
            static_cast<double>((W + ctx / 128) * rb), 1,
            [&](int) { ops::sparse_attention(cuda::context(), h, out); });
  }
}

// Decode steps as the model runs them (step_attention: one launch for every slot), each slot its own
// sequence (its ring, its new row, its compressed rows in its own shuffled pages of 64 rows, its own picks) at
// context 1024 (the decode profile's: CSA 128 + 512 rows of which 256 picks are real and 256 are -1, HCA 128 +
// 8) and 8192 (CSA 128 + 512, HCA 128 + 64), at batch 1 .. 128, on each decode kernel (TERN_ATTENTION_DECODE:
// cluster = attention_mma_kernel; heads16 / heads32 / heads = attention_heads_kernel at 16 / 32 heads a block /
// by launch size; the same bits). The bytes are the rows read plus q and out (f32, 128 KiB each per slot).
// FlashMLA's V4 kernel on this card (performance.md, 128 + 512 rows) is printed in the shape column.
void bench_decode_attention_at(Rand& r, bool quick, int64_t ctx) {
  const int64_t H = 64, hd = 512, W = 128, k = 512;
  const ops::KvRowFormat f{ops::KvFormat::fp8_ds, hd, 64};
  const int64_t rb = f.row_bytes();
  struct Kind {
    const char* name;
    int ratio;
    bool select;
  };
  const std::vector<std::pair<int64_t, double>> batches =
      quick ? std::vector<std::pair<int64_t, double>>{{1, 14.1}, {64, 46.3}}
            : std::vector<std::pair<int64_t, double>>{{1, 14.1}, {16, 19.2}, {64, 46.3}, {128, 50.1}};
  for (const Kind kind : {Kind{"csa", 4, true}, Kind{"hca", 128, false}}) {
    const int64_t num_c = ctx / kind.ratio;
    const int64_t slot_rows = (num_c + 63) / 64 * 64;  // a slot's pages of 64 rows (HCA at 1K: 8 rows in one)
    // One sequence's rows, replicated into every slot's own pages.
    Tensor seq_x = random_f32({num_c + W + 1, hd}, r), seq(DType::u8, {num_c + W + 1, rb});
    ops::kv_pack(cpu::context(), seq_x, f, seq);
    for (const auto& [B, flashmla] : batches) {
      Tensor comp(DType::u8, {B * slot_rows, rb}), rings(DType::u8, {B * W, rb}), rows(DType::u8, {B, rb});
      std::memset(comp.data<uint8_t>(), 0, comp.nbytes());
      for (int64_t b = 0; b < B; ++b) {
        std::memcpy(comp.data<uint8_t>() + b * slot_rows * rb, seq.data<uint8_t>(), num_c * rb);
        std::memcpy(rings.data<uint8_t>() + b * W * rb, seq.data<uint8_t>() + num_c * rb, W * rb);
        std::memcpy(rows.data<uint8_t>() + b * rb, seq.data<uint8_t>() + (num_c + W) * rb, rb);
      }
      const PagedPair pages = paged_pair(comp, 64, r);
      auto drings = upload(rings), drows = upload(rows);
      Tensor pos(DType::i64, {B}), ring_at(DType::i64, {B}), pool_at(DType::i64, {B}), table_at(DType::i64, {B});
      Tensor sel(DType::i32, {B, k});
      for (int64_t b = 0; b < B; ++b) {
        pos.data<int64_t>()[b] = ctx - 1;
        ring_at.data<int64_t>()[b] = reinterpret_cast<int64_t>(drings.view().data_as<uint8_t>() + b * W * rb);
        pool_at.data<int64_t>()[b] = reinterpret_cast<int64_t>(pages.device.pool.data());
        table_at.data<int64_t>()[b] =
            reinterpret_cast<int64_t>(pages.device.block_table.data_as<int32_t>() + b * (slot_rows / 64));
        // Picks among the visible rows; past them -1 (masked), as the indexer leaves them at short contexts.
        for (int64_t j = 0; j < k; ++j)
          sel.data<int32_t>()[b * k + j] = j < num_c ? static_cast<int32_t>(r.index(num_c)) : -1;
      }
      auto dpos = upload(pos), drat = upload(ring_at), dpat = upload(pool_at), dtat = upload(table_at);
      auto dsel = upload(sel), q = upload(random_f32({B, H, hd}, r)), sinks = upload(random_f32({H}, r));
      cuda::DeviceTensor out(DType::f32, {B, H, hd});
      ops::StepAttentionArgs a;
      a.q = q;
      a.positions = dpos;
      a.format = f;
      a.rows = drows;
      a.rings = drat;
      a.compressed = {dpat, dtat, pages.device.page_bytes(), pages.device.offset_in_page, 64, rb};
      a.window = W;
      a.ratio = kind.ratio;
      a.max_compressed = num_c;
      if (kind.select) a.selected = dsel;
      a.sinks = sinks;
      a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
      const int64_t keys = W + (kind.select ? std::min(k, num_c) : num_c);  // rows read
      const std::string shape = kind.select ? cat("ctx ", ctx, " batch ", B, ", 128+512 rows (FlashMLA ", flashmla, ")")
                                            : cat("ctx ", ctx, " batch ", B, ", 128+", num_c, " rows");
      const cuda::AttentionDecode saved = cuda::attention_decode();
      for (const cuda::AttentionDecode d : {cuda::AttentionDecode::cluster, cuda::AttentionDecode::heads16,
                                            cuda::AttentionDecode::heads32, cuda::AttentionDecode::heads}) {
        cuda::set_attention_decode(d);
        measure(cat("step_attention ", kind.name, " ", cuda::attention_decode_name(d)), shape,
                static_cast<double>(B * (keys * rb + 2 * H * hd * 4)), 1,
                [&](int) { ops::step_attention(cuda::context(), a, out); });
      }
      cuda::set_attention_decode(saved);
    }
  }
}

void bench_decode_attention(Rand& r, bool quick) {
  for (const int64_t ctx : quick ? std::vector<int64_t>{1024} : std::vector<int64_t>{1024, 8192})
    bench_decode_attention_at(r, quick, ctx);
}

// One layer's sparse_attention in a prefill chunk of 8 192 queries (the library-GEMM chunks), on the decode
// kernel (attention_mma_kernel, as TERN_ATTENTION_PREFILL=0) and on the prefill kernels (version 1
// attention_prefill_kernel, versions 2 and 3 attention_prefill_wgmma_kernel, 4 attention_prefill_ws_kernel, 5 it on
// keys decoded once a launch), same
// inputs: CSA
// (ratio 4, 512 picks + window 128) and HCA (ratio 128, every compressed row + window 128), as the chunk
// after 8 192 tokens (every CSA query has its 512 picks) and as the first chunk of a prompt (start 0: fewer
// visible rows). FLOPs: 2 * heads * keys * (head_dim + head_dim) a query (QK^T and PV), over the keys each
// query really has. The ceiling is a library bf16 product's rate measured here (linear 8192 x 4096 x 4096
// with bf16 weights: cuBLAS, x rounded to bf16 in the call).
void bench_attention_prefill(Rand& r) {
  const int64_t H = 64, hd = 512, W = 128, k = 512, n = 8192;
  const ops::KvRowFormat f{ops::KvFormat::fp8_ds, hd, 64};
  const int64_t rb = f.row_bytes();
  double lib_tflops = 0;
  {
    const HostWeight hw = random_weight(ops::WeightFormat::bf16, 4096, 4096, r, 1.0f / 64.0f, "ceiling");
    cuda::WeightStore store;
    const ops::Weight w = store.upload(hw.w);
    auto x = upload(random_f32({n, 4096}, r));
    cuda::DeviceTensor y(DType::f32, {n, 4096});
    const cuda::Timing t = cuda::time_device([&] { ops::linear(cuda::context(), x, w, y); }, 3, 10);
    lib_tflops = 2.0 * n * 4096.0 * 4096.0 / (t.median_us * 1e6);
    std::printf("ceiling: library bf16 product 8192x4096x4096 %.1f us, %.0f TFLOP/s\n", t.median_us, lib_tflops);
  }
  auto q = upload(random_f32({n, H, hd}, r, 0.5f)), sinks = upload(random_f32({H}, r));
  cuda::DeviceTensor out(DType::f32, {n, H, hd});
  auto packed = [&](int64_t rows) {
    Tensor x = random_f32({rows, hd}, r), p(DType::u8, {rows, rb});
    ops::kv_pack(cpu::context(), x, f, p);
    return p;
  };
  auto chunk = upload(packed(n)), ring = upload(packed(W));
  struct Kind {
    const char* name;
    int ratio;
    bool select;
    int64_t start;
  };
  std::vector<std::string> lines;
  for (const Kind kind : {Kind{"csa", 4, true, n}, Kind{"csa", 4, true, 0}, Kind{"hca", 128, false, n},
                          Kind{"hca", 128, false, 0}}) {
    const int64_t num_c = (kind.start + n) / kind.ratio;
    const PagedPair comp = paged_pair(packed(std::max<int64_t>(num_c, 1)), 64, r);
    Tensor sel(DType::i32, {n, k});
    int64_t keys = 0;  // over all queries
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = kind.start + i, vis = (p + 1) / kind.ratio;
      keys += std::min(W, p + 1) + (kind.select ? std::min(k, vis) : vis);
      for (int64_t j = 0; j < k; ++j)
        sel.data<int32_t>()[i * k + j] = j < vis ? static_cast<int32_t>(r.index(vis)) : -1;
    }
    auto dsel = upload(sel);
    ops::AttentionArgs a{q, kind.start, f, chunk, ring, W, comp.device, num_c, kind.ratio,
                         kind.select ? dsel.view() : TensorView(), sinks, 1.0f / std::sqrt(static_cast<float>(hd))};
    const double flop = 2.0 * H * static_cast<double>(keys) * (hd + hd);
    const double bytes = static_cast<double>(keys * rb + 2 * n * H * hd * 4);
    const std::string shape = cat(n, " queries at ", kind.start, ", ", keys / n, " keys avg");
    for (const int version : {0, 1, 2, 3, 4, 5}) {
      cuda::set_attention_prefill_version(version);
      const char* kernel = version == 5   ? "attention_prefill_ws_kernel on keys decoded once (attention_kv_bf16_kernel)"
                           : version == 4 ? "attention_prefill_ws_kernel (warp-specialised)"
                           : version == 3 ? "attention_prefill_wgmma_kernel (overlapped decode)"
                           : version == 2 ? "attention_prefill_wgmma_kernel"
                           : version == 1 ? "attention_prefill_kernel"
                                          : "attention_mma_kernel";
      measure(cat("sparse_attention ", kind.name, " prefill: ", version == 0 ? "off" : cat("v", version)), shape,
              bytes, 1, [&](int) { ops::sparse_attention(cuda::context(), a, out); });
      const double us = g_profile || g_rows.empty() ? 0 : g_rows.back().us;
      lines.push_back(cat("| ", kind.name, " | ", kind.start, " | ", keys / n, " | ", kernel, " | ", us, " | ",
                          us > 0 ? flop / (us * 1e6) : 0.0, " | ", us > 0 ? 100.0 * flop / (us * 1e6) / lib_tflops : 0.0,
                          "% |"));
    }
  }
  cuda::set_attention_prefill(true);  // the default version
  std::printf("\nprefill attention, one layer at %lld queries (graph us; TFLOP/s counts 2*heads*keys*(hd+hd) a "
              "query; ceiling %.0f TFLOP/s):\n| layer | chunk start | keys/query | kernel | us | TFLOP/s | %% of ceiling |\n"
              "|---|---:|---:|---|---:|---:|---:|\n",
              static_cast<long long>(n), lib_tflops);
  for (const std::string& l : lines) std::printf("%s\n", l.c_str());
  std::printf("\n");
}

// n queries at the same position over one sequence's keys (a decode batch reads n sequences' keys: the
// bytes column counts n x the key bytes, as the step would).
void bench_indexer(Rand& r, bool quick) {
  // 1 024 and 2 048: rows of at most 512 keys (every key taken: the top-k's short way); 8 192 and 65 536: the select.
  for (int64_t ctx : quick ? std::vector<int64_t>{2048, 8192} : std::vector<int64_t>{1024, 2048, 8192, 65536}) {
    const int64_t S = ctx / 4, H = 64, dim = 128;
    const PagedPair keys = paged_pair(random_f32({S, dim}, r), 64, r);  // in shuffled pages of 64 keys
    for (int64_t n : ctx > 8192 ? std::vector<int64_t>{1, 16} : std::vector<int64_t>{1, 16, 64}) {
      auto q = upload(random_f32({n, H, dim}, r)), w = upload(random_f32({n, H}, r));
      Tensor pos(DType::i64, {n});
      for (int64_t i = 0; i < n; ++i) pos.data<int64_t>()[i] = ctx - 1;
      auto dpos = upload(pos);
      cuda::DeviceTensor idx(DType::i32, {n, 512});
      ops::IndexerArgs a{q, w, keys.device, S, dpos, 4};
      measure("indexer scores+top512 (f32)", cat(n, " queries, ", S, " keys"), static_cast<double>(n * S * dim * 4),
              1, [&](int) { ops::indexer_topk(cuda::context(), a, 512, idx); });
    }
  }
}

// indexer_topk of a prefill chunk (one CSA layer: 64 heads x 128 dims, top-512; a prompt's first n queries over
// its n / 4 keys), SGEMM path against the fused tensor-core kernel (TERN_INDEXER_PREFILL), timed eagerly (the
// SGEMM path reads the positions back, so it cannot be captured), plus the fused kernel's scores alone. TFLOP/s
// count the products each visible (query, head, key) costs: six bf16 (bf16x6) or three fp16 (fp16x3) of 128.
void bench_indexer_prefill(Rand& r, bool quick) {
  const int64_t H = 64, dim = 128, topk = 512;
  cuda::CudaBackend& b = cuda::register_backend();
  const cuda::IndexerPrefill saved = cuda::indexer_prefill();
  std::vector<std::string> lines;
  for (const int64_t n : quick ? std::vector<int64_t>{8192} : std::vector<int64_t>{1024, 8192}) {
    const int64_t S = n / 4;
    const PagedPair keys = paged_pair(random_f32({S, dim}, r), 64, r);
    auto q = upload(random_f32({n, H, dim}, r)), w = upload(random_f32({n, H}, r));
    Tensor pos(DType::i64, {n});
    int64_t visible = 0;
    for (int64_t i = 0; i < n; ++i) {
      pos.data<int64_t>()[i] = i;
      visible += std::min(S, (i + 1) / 4);
    }
    auto dpos = upload(pos);
    cuda::DeviceTensor idx(DType::i32, {n, topk}), scores(DType::f32, {n, S});
    const ops::IndexerArgs a{q, w, keys.device, S, dpos, 4};
    const double bytes = static_cast<double>(n * H * dim * 4 + n * S * 4);  // q read once, scores written once
    const std::string shape = cat(n, " queries, ", S, " keys");
    // sgemm, mma (bf16x6), mma-fp16x3 through the op; then the fused kernel alone, bf16x6 and fp16x3.
    constexpr const char* kNames[] = {"indexer_topk prefill: sgemm", "indexer_topk prefill: mma (bf16x6)",
                                      "indexer_topk prefill: mma-fp16x3", "indexer_mma_kernel bf16x6 (scores)",
                                      "indexer_mma_kernel fp16x3 (scores)"};
    for (int v = 0; v < 5; ++v) {
      std::function<void()> call;
      if (v < 3) {
        cuda::set_indexer_prefill(v == 0   ? cuda::IndexerPrefill::sgemm
                                  : v == 1 ? cuda::IndexerPrefill::mma
                                           : cuda::IndexerPrefill::mma_fp16x3);
        call = [&] { ops::indexer_topk(cuda::context(), a, topk, idx); };
      } else {
        cuda::IndexerParams p;
        p.q = q.view().data_as<const float>();
        p.weights = w.view().data_as<const float>();
        const PagedRows& k = keys.device;
        p.keys = {k.pool.data_as<const uint8_t>(), k.block_table.data_as<const int32_t>(), k.page_bytes(),
                  k.offset_in_page, k.rows_per_page, k.row_bytes};
        p.n = n, p.heads = H, p.dim = dim, p.num_keys = S, p.positions = dpos.view().data_as<const int64_t>();
        p.ratio = 4;
        float* out = scores.view().data_as<float>();
        const cuda::IndexerMmaSplit split = v == 3 ? cuda::IndexerMmaSplit::bf16x6 : cuda::IndexerMmaSplit::fp16x3;
        call = [&b, p, out, split] {
          cuda::launch_indexer_scores_mma(p, out, b.num_sms(), static_cast<cudaStream_t>(b.stream()), split);
        };
      }
      if (g_profile) {
        call();
        call();
        b.synchronize();
        continue;
      }
      const cuda::Timing t = cuda::time_device(call, 2, 10);
      report(kNames[v], shape, t.median_us, t.median_us, bytes);
      // TFLOP/s of the products the path really issues: six bf16 or three fp16 a (query, head, visible key).
      const double flop = (v == 1 || v == 3 ? 6.0 : 3.0) * 2.0 * H * dim * static_cast<double>(visible);
      lines.push_back(cat("| ", n, " | ", kNames[v], " | ", t.median_us, " | ", t.median_us * 21 / 1000, " | ",
                          v == 0 ? 0.0 : flop / (t.median_us * 1e6), " |"));
    }
  }
  cuda::set_indexer_prefill(saved);
  if (g_profile) return;
  std::printf("\nindexer of a prefill chunk, one CSA layer (eager us; x21 = the 21 CSA layers of V4-Flash; TFLOP/s of "
              "the tensor products issued, mma rows only):\n| queries | path | us | ms x21 | TFLOP/s |\n|---:|---|---:|---:|---:|\n");
  for (const std::string& l : lines) std::printf("%s\n", l.c_str());
  std::printf("\n");
}

// hc_pre as the model calls it (with the sub-layer norm) and alone, hc_post; fn rotates over copies so
// that it comes from memory as in a real step (43 layers x 2 sites x 1.5 MiB do not stay in L2).
void bench_mhc(Rand& r) {
  const int64_t D = 4096, hc = 4, mix = (2 + hc) * hc;
  const Tensor fn_host = random_f32({mix, hc * D}, r, 0.01f);
  const int copies = 48;  // 72 MiB of fn
  std::vector<cuda::DeviceTensor> fns;
  for (int i = 0; i < copies; ++i) fns.push_back(upload(fn_host));
  auto base = upload(random_f32({mix}, r)), scale = upload(random_f32({3}, r)), norm = upload(random_bf16({D}, r));
  const double fn_bytes = static_cast<double>(mix * hc * D * 4);
  for (int64_t T : {1, 16, 64}) {
    auto streams = upload(random_f32({T, hc, D}, r)), sub = upload(random_f32({T, D}, r));
    cuda::DeviceTensor post(DType::f32, {T, hc}), comb(DType::f32, {T, hc, hc}), col(DType::f32, {T, D}),
        next(DType::f32, {T, hc, D});
    const double stream_bytes = static_cast<double>(T * hc * D * 4);
    measure("hc_pre + rms_norm (model's call)", cat("T=", T), fn_bytes + stream_bytes, copies, [&](int i) {
      ops::hc_pre(cuda::context(),
                  ops::HcPreArgs{streams, fns[i], base, scale, {}, post, comb, col, true, norm, 1e-6f});
    });
    // The same with one Sinkhorn iteration (of 20): what the 4x4 normalisation's serial chain adds to the call.
    ops::HcParams one_iter;
    one_iter.sinkhorn_iters = 1;
    measure("hc_pre + rms_norm, 1 Sinkhorn iteration", cat("T=", T), fn_bytes + stream_bytes, copies, [&](int i) {
      ops::hc_pre(cuda::context(),
                  ops::HcPreArgs{streams, fns[i], base, scale, one_iter, post, comb, col, true, norm, 1e-6f});
    });
    measure("hc_pre (mix + sinkhorn + collapse)", cat("T=", T), fn_bytes + stream_bytes, copies, [&](int i) {
      ops::hc_pre(cuda::context(), ops::HcPreArgs{streams, fns[i], base, scale, {}, post, comb, col});
    });
    measure("hc_post", cat("T=", T), 2.0 * stream_bytes + static_cast<double>(T * D * 4), 1,
            [&](int) { ops::hc_post(cuda::context(), streams, sub, post, comb, next); });
  }
}

// act_quant alone (the FP8 products' x: f32 in, e4m3 bytes and f32 scales out) at decode and prefill sizes, over
// enough copies of x that none sits in L2; bytes = x read + bytes and scales written. At 8 192 tokens also with
// the scales token-major (cuBLASLt's 1x128 layout, the prefill products'). The 8K prefill's profile credits it
// 143 us a call (1.1 TB/s) with other streams' kernels beside it: this says what it takes alone.
void bench_act_quant(Rand& r) {
  cuda::CudaBackend& be = cuda::register_backend();
  for (const auto& [T, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {16, 4096}, {64, 4096}, {8192, 1024}, {8192, 4096}, {8192, 8192}}) {
    const int copies = static_cast<int>(std::clamp<int64_t>((int64_t{256} << 20) / (T * cols * 4) + 1, 2, 32));
    std::vector<cuda::DeviceTensor> xs;
    for (int i = 0; i < copies; ++i) xs.push_back(upload(random_f32({T, cols}, r, 3.0f)));
    cuda::DeviceTensor xq(DType::u8, {T, cols}), sx(DType::f32, {T, cols / 128});
    const double bytes = static_cast<double>(T * cols * 5 + T * (cols / 128) * 4);
    for (const int64_t ld : T >= 512 ? std::vector<int64_t>{0, T} : std::vector<int64_t>{0}) {
      measure(ld > 0 ? "act_quant (scales token-major)" : "act_quant", cat("T=", T, " cols=", cols), bytes, copies,
              [&](int i) {
                cuda::launch_act_quant(cuda::ActRows{xs[i].view().data_as<const float>(), T, cols, cols},
                                       xq.view().data_as<uint8_t>(), sx.view().data_as<float>(),
                                       static_cast<cudaStream_t>(be.stream()), ld);  // (a graph's capture stream)
              });
    }
  }
}

// The exact products (ops::Weight::exact: f32 results for the router's and the indexer's top-k) on both exact
// paths (cuda::set_exact_path: the CUDA-core kernels, linear_exact_tc_kernel), over weight copies that never sit in
// L2; the floor is the weight bytes at the copy bandwidth (x and y are extra). The rows' shapes: the router gate,
// the indexer's weights_proj, wq_b and compressor wkv|wgate of a V4-Flash layer.
void bench_exact(std::vector<int64_t> Ts, Rand& r) {
  struct ExactShape {
    const char* name;
    ops::WeightFormat f;
    int64_t out, in;
  };
  const ExactShape shapes[] = {{"gate", ops::WeightFormat::bf16, 256, 4096},
                          {"idx.weights_proj", ops::WeightFormat::bf16, 64, 4096},
                          {"idx.wq_b", ops::WeightFormat::fp8_block, 8192, 1024},
                          {"idx.comp wkv|wgate", ops::WeightFormat::bf16, 512, 4096}};
  const cuda::ExactPath saved = cuda::exact_path();
  struct Choice {
    const char* label;
    cuda::ExactPath path;
  };
  const Choice choices[] = {{"cuda-cores", cuda::ExactPath::cuda_cores}, {"tc", cuda::ExactPath::tensor_cores}};
  for (const ExactShape& sh : shapes) {
    const HostWeight hw = random_weight(sh.f, sh.out, sh.in, r, 1.0f / std::sqrt(float(sh.in)), sh.name);
    const size_t bytes = weight_bytes(hw.w);
    Rotation rot(hw, bytes);
    for (ops::Weight& w : rot.copies) w.exact = true;
    for (int64_t T : Ts) {
      auto x = upload(random_f32({T, sh.in}, r));
      cuda::DeviceTensor y(DType::f32, {T, sh.out});
      for (const Choice& c : choices) {
        cuda::set_exact_path(c.path);
        cuda::LinearParams p;
        p.w.kind = sh.f == ops::WeightFormat::fp8_block ? cuda::WeightFormat::fp8_block : cuda::WeightFormat::bf16;
        p.w.w = rot.copies[0].weight.data();
        p.w.s = rot.copies[0].scale.empty() ? nullptr : rot.copies[0].scale.data();
        p.w.out = sh.out;
        p.w.in = sh.in;
        p.w.s_cols = rot.copies[0].scale.empty() ? 0 : rot.copies[0].scale.dim(1);
        p.x = x.view().data_as<const float>();
        p.x_stride = sh.in;
        p.rows_per_group = sh.out;
        p.T = T;
        p.num_sms = cuda::register_backend().num_sms();
        measure(cat("exact ", sh.name, " (", ops::weight_format_name(sh.f), ") ", c.label),
                cat(sh.out, "x", sh.in, " T=", T), static_cast<double>(bytes), static_cast<int>(rot.copies.size()),
                [&](int i) { ops::linear(cuda::context(), x, rot.copies[i], y); });
        std::printf("  (path: %s)\n", cuda::linear_exact_path_name(p).c_str());
      }
    }
  }
  cuda::set_exact_path(saved);
}

// The library's rates on V4-Flash's dense projection shapes at prefill chunk sizes: cuBLAS bf16 (the product
// linear runs from kLibraryMinTokens tokens, on weights expanded to bf16) beside cuBLASLt's FP8 product with
// DeepSeek's block scales (LibraryGemm::fp8_block: 1x128 activation and 128x128 weight scales, sm_90 only).
// The products alone, on random operands already in device memory (no rounding of x, weight expansion or
// activation quantisation). FLOP: 2 T out in.
void bench_library(const std::vector<int64_t>& Ts) {
  struct Projection {
    const char* name;
    int64_t out, in;
  };
  const std::vector<Projection> projections{{"wq_a", 1024, 4096},         {"wq_b", 32768, 1024},
                                            {"wkv", 512, 4096},           {"wo_b", 4096, 8192},
                                            {"shared.w1|w3", 4096, 4096}, {"shared.w2", 4096, 2048}};
  cuda::LibraryGemm lib;
  const auto s = static_cast<cudaStream_t>(cuda::register_backend().stream());
  const bool fp8 = lib.fp8_block_supported();
  std::printf("\nlibrary GEMMs (products alone, random operands in device memory)%s:\n"
              "| product | out x in | T | bf16 us | bf16 TFLOP/s | fp8 block us | fp8 block TFLOP/s | fp8 / bf16 time |\n"
              "|---|---|---:|---:|---:|---:|---:|---:|\n",
              fp8 ? "" : " (no FP8 block-scaled figures: they need an sm_90 card and cuBLASLt >= 12.9)");
  for (const int64_t T : Ts) {
    for (const Projection& p : projections) {
      const double flop = 2.0 * static_cast<double>(T) * static_cast<double>(p.out) * static_cast<double>(p.in);
      const double bf16_us = lib.time_us(s, T, p.out, p.in, false, 10);
      const double fp8_us = fp8 ? lib.time_fp8_block_us(s, T, p.out, p.in, 10) : 0.0;
      std::printf("| %s | %lldx%lld | %lld | %.1f | %.0f | %.1f | %.0f | %.2f |\n", p.name,
                  static_cast<long long>(p.out), static_cast<long long>(p.in), static_cast<long long>(T), bf16_us,
                  flop / (bf16_us * 1e6), fp8_us, fp8 ? flop / (fp8_us * 1e6) : 0.0, fp8 ? fp8_us / bf16_us : 0.0);
      std::fflush(stdout);
    }
  }
  if (!fp8) return;
  // wo_a: 8 groups of 1024 x 4096, one cuBLASLt call per group on the side streams, against one group's time x 8 (the
  // groups in series) and the whole shape in one bf16 product (the bench-step row's reference).
  std::printf("\nwo_a as fp8_block in 8 groups (1024 x 4096 each) against 8 single-group calls in series:\n"
              "| T | 8 groups us | TFLOP/s | 8 x one group us | bf16 8192x4096 us (whole shape, one product) |\n"
              "|---:|---:|---:|---:|---:|\n");
  for (const int64_t T : Ts) {
    const double flop = 2.0 * static_cast<double>(T) * 8 * 1024 * 4096;
    const double grouped = lib.time_fp8_block_us(s, T, 1024, 4096, 10, 8);
    const double one = lib.time_fp8_block_us(s, T, 1024, 4096, 10);
    const double bf16_us = lib.time_us(s, T, 8192, 4096, false, 10);
    std::printf("| %lld | %.1f | %.0f | %.1f | %.1f |\n", static_cast<long long>(T), grouped, flop / (grouped * 1e6),
                8 * one, bf16_us);
    std::fflush(stdout);
  }
  // The heuristic's first algorithm (what fp8_block runs) against its next ones, per shape: whether a sweep at plan
  // time would pay.
  std::printf("\ncuBLASLt FP8 block-scaled algorithms in the heuristic's order (us; fp8_block runs the first):\n"
              "| product | out x in | T | first | best | best's index | all |\n|---|---|---:|---:|---:|---:|---|\n");
  const std::vector<Projection> sweep{{"wq_a+wkv", 1536, 4096}, {"shared.w2", 4096, 2048}, {"wo_a group", 1024, 4096},
                                      {"wq_b", 32768, 1024}};
  for (const int64_t T : Ts)
    for (const Projection& p : sweep) {
      const std::vector<double> us = lib.time_fp8_block_algos_us(s, T, p.out, p.in, 10, 8);
      size_t best = 0;
      std::string all;
      for (size_t i = 0; i < us.size(); ++i) {
        if (us[i] < us[best]) best = i;
        char one[32];
        std::snprintf(one, sizeof(one), "%s%.1f", i ? " / " : "", us[i]);
        all += one;
      }
      std::printf("| %s | %lldx%lld | %lld | %.1f | %.1f | %zu | %s |\n", p.name, static_cast<long long>(p.out),
                  static_cast<long long>(p.in), static_cast<long long>(T), us[0], us[best], best, all.c_str());
      std::fflush(stdout);
    }
}

}  // namespace
}  // namespace tern::gputest

int main(int argc, char** argv) {
  using namespace tern;
  using namespace tern::gputest;
  bool quick = false, profile = false, profile_report = false;
  // --only SECTION: one section's rows (linear, exact, library, moe, moe_prefill, attention, attention_prefill,
  // indexer, indexer_prefill, mhc, probe, tile_probe, small_reads, decode_probe, moe_timeline, act_quant)
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      only = argv[++i];
      if (only != "linear" && only != "moe" && only != "moe_prefill" && only != "attention" &&
          only != "attention_prefill" && only != "indexer" && only != "indexer_prefill" && only != "mhc" &&
          only != "probe" && only != "small_reads" && only != "exact" && only != "library" &&
          only != "decode_probe" && only != "moe_timeline" && only != "act_quant" && only != "tile_probe") {
        std::fprintf(stderr,
                     "tern_gpu_bench: --only takes linear, exact, library, moe, moe_prefill, attention, "
                     "attention_prefill, indexer, indexer_prefill, mhc, probe, tile_probe, small_reads, decode_probe, moe_timeline or act_quant, not %s\n",
                     only.c_str());
        return 2;
      }
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--profile") == 0) {
      // Each key kernel a few times, eagerly, for an external profiler (ncu -c N tern_gpu_bench --profile).
      profile = true;
    } else if (std::strcmp(argv[i], "--profile-report") == 0) {
      profile_report = true;
    } else {
      std::fprintf(stderr, "tern_gpu_bench: unknown argument %s (expected --quick, --profile, --profile-report, --only SECTION)\n",
                   argv[i]);
      return 2;
    }
  }
  if (!gpu_ready()) {
    std::printf("tern_gpu_bench: no CUDA device, nothing to measure\n");
    return 0;
  }
  std::printf("device: %s\n", cuda::device_description().c_str());
  g_copy_gbs = cuda::copy_bandwidth_gbs(size_t{1} << 30);
  std::printf("copy bandwidth (1 GiB device-to-device, read+write): %.0f GB/s\n", g_copy_gbs);
  // With PDL the calls of one graph overlap (each starts while the previous one finishes), as in a decode step.
  std::printf("programmatic dependent launch: %s\n\n", cuda::pdl_enabled() ? "on (TERN_PDL=0 turns it off)" : "off");
  Rand r(12345);
  using ops::WeightFormat;
  if (profile && only == "act_quant") {  // (ncu: launches 8-11 are 8 192 x 4 096, row-major then token-major scales)
    g_profile = true;
    bench_act_quant(r);
    return 0;
  }
  if (profile) {
    g_profile = true;
    bench_linear("wq_b", WeightFormat::fp8_block, 32768, 1024, {1, 16, 64}, r);
    bench_linear("wo_b", WeightFormat::fp8_block, 4096, 8192, {1, 16, 64}, r);
    bench_moe(WeightFormat::mxfp4, {1, 16}, r);
    bench_attention(r, true);
    bench_decode_attention(r, true);
    bench_indexer(r, true);
    bench_indexer_prefill(r, true);
    bench_mhc(r);
    return 0;
  }
  std::unique_ptr<cuda::Profiler> profiler;
  if (profile_report) {
    profiler = std::make_unique<cuda::Profiler>();
    profiler->start();
  }
  // Every FP8 projection of a V4-Flash decode step (weight bytes only in the floor; outputs and x are extra).
  // (128 and 256: decode batches where linear_x8 runs two and four 64-token tiles; the library table has the same T)
  const std::vector<int64_t> dec = quick ? std::vector<int64_t>{1, 16} : std::vector<int64_t>{1, 16, 64, 128, 256};
  const auto section = [&](const char* name) { return only.empty() || only == name; };
  if (section("linear")) {
    // tern's own kernels at every T here: the dense products take the library from 65 tokens by default since
    // session 22 (the library's own rows are `--only library`).
    const gputest::KnobGuard own_kernels("TERN_DENSE_LIBRARY_MIN_TOKENS", cuda::CudaBackend::library_min_tokens());
    bench_linear("wq_a", WeightFormat::fp8_block, 1024, 4096, dec, r);
    bench_linear("wq_b", WeightFormat::fp8_block, 32768, 1024, dec, r);
    bench_linear("wkv", WeightFormat::fp8_block, 512, 4096, dec, r);
    bench_linear("wo_a", WeightFormat::fp8_block, 8192, 4096, dec, r, 8);
    bench_linear("wo_b", WeightFormat::fp8_block, 4096, 8192, dec, r);
    bench_linear("shared.w1/w3", WeightFormat::fp8_block, 2048, 4096, dec, r);
    bench_linear("shared.w2", WeightFormat::fp8_block, 4096, 2048, dec, r);
    bench_linear("idx.wq_b", WeightFormat::fp8_block, 8192, 1024, dec, r);
    bench_linear("head", WeightFormat::bf16, 129280, 4096, quick ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 16}, r);
    bench_linear("comp.wkv|wgate csa", WeightFormat::bf16, 2048, 4096, dec, r);
    bench_linear("comp.wkv", WeightFormat::bf16, 1024, 4096, dec, r);
    bench_linear("comp.wkv/wgate 512", WeightFormat::bf16, 512, 4096, dec, r);
    bench_linear("comp.wkv/wgate 256", WeightFormat::bf16, 256, 4096, dec, r);
  }
  if (section("exact")) bench_exact(dec, r);
  if (section("library"))
    bench_library(quick ? std::vector<int64_t>{8192} : std::vector<int64_t>{64, 128, 256, 1024, 2048, 8192});
  const std::vector<int64_t> moe_t =
      quick ? std::vector<int64_t>{1, 16} : std::vector<int64_t>{1, 16, 32, 64, 96, 128, 192, 256, 384};
  if (section("moe")) {
    bench_moe(WeightFormat::mxfp4, moe_t, r);
    bench_moe(WeightFormat::nvfp4, moe_t, r);
  }
  if (section("moe_prefill")) {
    const std::vector<int64_t> prefill_t = quick ? std::vector<int64_t>{1024} : std::vector<int64_t>{1024, 2048, 8192};
    bench_moe_prefill(WeightFormat::mxfp4, prefill_t, r);
    bench_moe_prefill(WeightFormat::nvfp4, prefill_t, r);
  }
  if (section("attention")) {
    bench_attention(r, quick);
    bench_decode_attention(r, quick);
  }
  if (section("attention_prefill")) bench_attention_prefill(r);
  if (only == "moe_timeline") bench_moe_timeline(r, g_copy_gbs);  // (a diagnostic: only when asked for)
  if (section("indexer")) bench_indexer(r, quick);
  if (section("indexer_prefill")) bench_indexer_prefill(r, quick);
  if (section("mhc")) bench_mhc(r);
  if (section("act_quant")) bench_act_quant(r);
  if (section("probe")) {
    // What the card's reads give by the decode kernels' fetch patterns (read_probe.cu), as ceilings for them.
    std::printf("\nread-bandwidth probes (2 GiB read once; %% of the copy bandwidth's %.0f GB/s):\n", g_copy_gbs);
    std::printf("| how | stage KB | stages / loads in flight | copies a stage | blocks/SM | KB in flight/SM | GB/s | %% of copy |\n"
                "|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const cuda::ReadProbe& p : cuda::read_bandwidth_probes(size_t{2} << 30, cuda::register_backend().num_sms()))
      std::printf("| %s | %d | %d | %d | %d | %lld | %.0f | %.0f%% |\n", p.how, p.stage_kb, p.stages, p.copies,
                  p.blocks_per_sm, static_cast<long long>(p.kb_in_flight), p.gbs, 100.0 * p.gbs / g_copy_gbs);
  }
  if (section("probe") || only == "tile_probe") {
    // The prefill grouped MoE kernels' fetch pattern (256 rows x 64 bytes a stage) against longer runs a row at the
    // same stage size (read_probe.cu, tile): whether DRAM locality caps them (session 31).
    std::printf("\ntile read probe (2 GiB of 2 KB rows read once in 16 KB stages of rows x chunk; %% of the copy "
                "bandwidth's %.0f GB/s; L2 hint: cp.async's prefetch size):\n| rows a stage | bytes a row a stage | L2 hint "
                "| stages | blocks/SM | GB/s | %% of copy |\n|---:|---:|---:|---:|---:|---:|---:|\n",
                g_copy_gbs);
    for (const cuda::TileProbe& p : cuda::tile_read_probes(size_t{2} << 30, cuda::register_backend().num_sms()))
      std::printf("| %d | %d | %d | %d | %d | %.0f | %.0f%% |\n", p.rows, p.chunk, p.l2_prefetch, p.stages,
                  p.blocks_per_sm, p.gbs, 100.0 * p.gbs / g_copy_gbs);
  }
  if (section("probe") || section("decode_probe")) {
    // What an FP4 decode instruction mix streams through the MoE kernel's ring, alone (fp4_decode_probe.cu): the
    // case for (or against) an e4m3 wgmma MoE decode kernel, before it is written. Rates only, products unchecked.
    std::printf("\nFP4 decode probe (2 GiB of 64-row x 4096-column FP4 items read once; %% of the copy bandwidth's "
                "%.0f GB/s; products not checked):\n| decode | warpgroups a block | stages | GB/s | %% of copy |\n"
                "|---|---:|---:|---:|---:|\n",
                g_copy_gbs);
    for (const cuda::DecodeProbe& p : cuda::fp4_decode_probes(size_t{2} << 30, cuda::register_backend().num_sms()))
      std::printf("| %s | %d | %d | %.0f | %.0f%% |\n", p.name, p.consumers, p.stages, p.gbs, 100.0 * p.gbs / g_copy_gbs);
  }
  if (section("probe") || section("small_reads")) {
    // The ceiling of one kernel reading a decode product's bytes (ramp and tail included), back to back in a graph.
    std::printf("\nsmall reads in a graph (ldg, each read waits for the previous; %% of the copy bandwidth's %.0f GB/s):\n"
                "| MB | L2 | loads in flight a thread | blocks/SM | us a read | GB/s | %% of copy |\n"
                "|---:|---|---:|---:|---:|---:|---:|\n",
                g_copy_gbs);
    const std::vector<size_t> sizes{size_t{2} << 20, size_t{6} << 20, size_t{8} << 20, size_t{16} << 20,
                                    size_t{32} << 20, size_t{64} << 20, size_t{128} << 20};
    for (const cuda::SmallReadProbe& p : cuda::small_read_probes(sizes, cuda::register_backend().num_sms()))
      std::printf("| %.1f | %s | %d | %d | %.1f | %.0f | %.0f%% |\n", p.bytes / 1048576.0, p.hot ? "hot" : "cold",
                  p.unroll, p.blocks_per_sm, p.us, p.gbs, 100.0 * p.gbs / g_copy_gbs);
  }
  std::printf("\n| kernel | shape | us (graph) | us (eager) | floor us (bytes / copy) | GB/s | %% of copy (%.0f GB/s) |\n"
              "|---|---|---:|---:|---:|---:|---:|\n", g_copy_gbs);
  for (const Row& row : g_rows)
    std::printf("| %s | %s | %.1f | %.1f | %.1f | %.0f | %.0f%% |\n", row.kernel.c_str(), row.shape.c_str(), row.us,
                row.eager_us, row.floor_us, row.gbs, g_copy_gbs > 0 ? 100.0 * row.gbs / g_copy_gbs : 0.0);
  if (profiler) {
    profiler->stop();
    // The whole run as one "step": warm-ups, eager runs and graph replays of every row above together.
    std::printf("\nbuilt-in profiler over the whole benchmark run (all shapes, eager and graph runs together):\n%s",
                cuda::format_report(cuda::categorize(profiler->records()), 1, 25, "run").c_str());
  }
  return 0;
}
