// Linear dispatch: the tensor-core plan (token tiles, K splits), the exact CUDA-core fallback, dequantize.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <string_view>

#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/linear_bulk_impl.cuh"
#include "backends/cuda/kernels/linear_impl.cuh"
#include "backends/cuda/kernels/linear_stream_impl.cuh"
#include "backends/cuda/kernels/weight_at.cuh"
#include "core/env.h"

namespace tern::cuda {

extern template void launch_linear_stream<WeightFormat::fp8_block>(const LinearParams&, const StreamPlan&, const uint8_t*, cudaStream_t);
extern template void launch_linear_stream<WeightFormat::mxfp4>(const LinearParams&, const StreamPlan&, const uint8_t*, cudaStream_t);
extern template void launch_linear_stream<WeightFormat::nvfp4>(const LinearParams&, const StreamPlan&, const uint8_t*, cudaStream_t);

extern template void launch_linear_bulk<WeightFormat::fp8_block>(const LinearParams&, const BulkLinearPlan&, const uint8_t*, cudaStream_t);
extern template void launch_linear_bulk<WeightFormat::bf16>(const LinearParams&, const BulkLinearPlan&, const uint8_t*, cudaStream_t);

extern template void launch_linear_mma<WeightFormat::f32>(const LinearParams&, const LinearPlan&, cudaStream_t);
extern template void launch_linear_mma<WeightFormat::bf16>(const LinearParams&, const LinearPlan&, cudaStream_t);
extern template void launch_linear_mma<WeightFormat::fp8_block>(const LinearParams&, const LinearPlan&, cudaStream_t);
extern template void launch_linear_mma<WeightFormat::mxfp4>(const LinearParams&, const LinearPlan&, cudaStream_t);
extern template void launch_linear_mma<WeightFormat::nvfp4>(const LinearParams&, const LinearPlan&, cudaStream_t);

int chunk_of(WeightFormat k) { return (k == WeightFormat::mxfp4 || k == WeightFormat::nvfp4) ? 128 : 64; }

bool linear_mma_ok(const LinearParams& p) {
  const int64_t chunk = chunk_of(p.w.kind);
  const auto addr = reinterpret_cast<uintptr_t>(p.x);
  return p.w.in % chunk == 0 && (p.rows_per_group == p.w.out || p.rows_per_group % 32 == 0) && addr % 16 == 0 && p.x_stride % 4 == 0 &&
         reinterpret_cast<uintptr_t>(p.w.w) % 16 == 0 && (p.w.kind != WeightFormat::nvfp4 || p.w.s_cols % 2 == 0);
}

// Batch invariance: the K range of W is cut into groups that depend on the weight's shape only (as many
// as one token tile would want), and every output is (((0 + g0) + g1) + ...) over those groups, whether
// each group is its own K split (partials added in order by the last block) or one block walks them all.
// So a token's result never depends on how many other tokens share the call.
LinearPlan plan_linear(const LinearParams& p) {
  LinearPlan plan;
  plan.nt = p.T <= 8 ? 1 : p.T <= 16 ? 2 : 4;
  plan.bx = (p.w.out + 127) / 128;
  plan.bz = (p.T + plan.nt * 8 - 1) / (plan.nt * 8);
  const int64_t chunks = p.w.in / chunk_of(p.w.kind);
  // Aim for about 8 blocks of 4 warps per multiprocessor at one token tile, with at least 2 chunks per group.
  const int64_t target = 8LL * p.num_sms;
  int64_t ks = std::max<int64_t>(1, target / std::max<int64_t>(1, plan.bx));
  ks = std::min(ks, std::max<int64_t>(1, chunks / 2));
  ks = std::min<int64_t>(ks, 64);
  plan.chunks_per_split = (chunks + ks - 1) / ks;
  plan.ksplit = static_cast<int>((chunks + plan.chunks_per_split - 1) / plan.chunks_per_split);
  const bool fits = plan.bx * plan.bz <= p.num_counters &&
                    static_cast<int64_t>(plan.ksplit) * p.T * p.w.out <= p.partial_floats;
  // Many token tiles already fill the machine (or the partials do not fit): one block walks the groups.
  if (plan.ksplit > 1 && (!fits || plan.bx * plan.bz >= target)) plan.ksplit = 1;
  return plan;
}

namespace {

bool is_streamed(WeightFormat k) { return k == WeightFormat::fp8_block || k == WeightFormat::mxfp4 || k == WeightFormat::nvfp4; }

}  // namespace

// The streaming kernel (FP8 / FP4 weights): 128-row tiles, whole weight rows copied 16 bytes per lane,
// FP4 scale words of 4 (mxfp4) or 8 (nvfp4) bytes per row and chunk.
bool linear_stream_ok(const LinearParams& p) {
  if (!is_streamed(p.w.kind) || !linear_mma_ok(p)) return false;
  if (p.rows_per_group != p.w.out && p.rows_per_group % dev::kStreamRows != 0) return false;
  if (p.w.kind == WeightFormat::fp8_block) return true;
  const int word = p.w.kind == WeightFormat::nvfp4 ? 8 : 4;
  return p.w.s != nullptr && reinterpret_cast<uintptr_t>(p.w.s) % word == 0 && p.w.s_cols % word == 0;
}

// The K groups of the streaming kernels (linear_stream and linear_bulk: the same groups, so the same bits),
// from the weight's shape alone: as many as one token tile needs to give every multiprocessor two 128-row
// blocks, at least kStages - 1 chunks each, at most 64; or the tuner's count (p.groups).
int64_t stream_chunks_per_group(const LinearParams& p) {
  const int64_t bx = (p.w.out + dev::kStreamRows - 1) / dev::kStreamRows;
  const int64_t chunks = p.w.in / chunk_of(p.w.kind);
  const int64_t target = 2LL * p.num_sms;
  int64_t groups = p.groups > 0 ? p.groups : std::max<int64_t>(1, target / bx);
  groups = std::min<int64_t>({groups, std::max<int64_t>(1, chunks / (dev::kStages - 1)), 64});
  return (chunks + groups - 1) / groups;
}

// Whether the groups run as separate blocks (split K) for this call: when it is cheaper by a rough model:
// without a split the blocks reach a share of the bandwidth that grows with their number (one multiprocessor
// pulls about 1.6x its fair share); a split adds its partial sums (written and read once, mostly in L2:
// counted at half). Both choices give the same bits.
int stream_ksplit(const LinearParams& p, int64_t bx, int64_t bz, int64_t chunks_per_group) {
  const int64_t chunks = p.w.in / chunk_of(p.w.kind);
  const int64_t ngroups = (chunks + chunks_per_group - 1) / chunks_per_group;
  const bool fits = bx * bz <= p.num_counters && ngroups * p.T * p.w.out <= p.partial_floats;
  const double per_elem = p.w.kind == WeightFormat::fp8_block ? 1.0 : p.w.kind == WeightFormat::bf16 ? 2.0 : 0.5;
  const double wbytes = static_cast<double>(p.w.out) * p.w.in * per_elem;
  const double share = std::min(1.0, static_cast<double>(bx * bz) / (0.6 * p.num_sms));
  const double pbytes = 2.0 * 4.0 * static_cast<double>(ngroups) * static_cast<double>(p.T) * p.w.out;
  const bool cheaper = wbytes + 0.5 * pbytes < wbytes / share;
  return ngroups > 1 && fits && cheaper ? static_cast<int>(ngroups) : 1;
}

// Groups of K from the weight's shape alone: as many as one token tile needs to give every
// multiprocessor two blocks, at least kStages - 1 chunks each (a full pipeline), at most 64. Split over
// blocks when the row and token tiles alone do not fill the machine and the partials fit.
// m-tiles a warp of linear_stream takes below 64 tokens: 1 (8 warps a 128-row block: twice the warps a
// multiprocessor on the same shared memory, for a kernel that issues an instruction every ~5 cycles a warp
// at two warps a scheduler, ncu session 12), except at one n-tile for products under 16M weights, where 2
// (4 warps) measured faster (session 12: 8M-weight products 7.6 against 8.2 us at one token; with 1, wq_b
// 17.2 -> 15.9 us at one token and 10-25% off every product at 16 tokens). TERN_STREAM_MT=1 or 2 (or
// set_stream_m_tiles) forces one. Either gives the same bits (a row's sums do not depend on which warp makes
// them).
namespace {

std::atomic<int> g_stream_mt{-1};  // -1: not read from TERN_STREAM_MT yet

// An A/B knob's value: environment variable `name` when it reads `a` or `b`, 0 (the rule decides) when it is
// unset or reads auto; anything else is refused (core/env.h).
int env_forced(const char* name, int a, int b) {
  const std::string v = env_choice(name, {"auto", std::to_string(a), std::to_string(b)}, "auto");
  return v == "auto" ? 0 : std::stoi(v);
}

}  // namespace

void set_stream_m_tiles(int mt) { g_stream_mt.store(mt == 1 || mt == 2 ? mt : 0, std::memory_order_relaxed); }

int stream_m_tiles(int nt, int64_t weights) {
  int forced = g_stream_mt.load(std::memory_order_relaxed);
  if (forced < 0) {
    forced = env_forced("TERN_STREAM_MT", 1, 2);
    g_stream_mt.store(forced, std::memory_order_relaxed);
  }
  if (forced > 0) return forced;
  return nt == 1 && weights < (int64_t{16} << 20) ? 2 : 1;
}

// n-tiles of a linear_stream token tile at most: 4 (tiles of 32 tokens: at 33-64 tokens two blocks read each
// weight row tile, the second mostly from L2, with half the accumulators and two blocks a multiprocessor) for
// products of up to 8M weights, 8 (one tile up to 64 tokens) above. Session 12 at 64 tokens, us (8 / 4):
// wq_a 23.1 / 16.6, wkv 21.8 / 15.1, shared w1|w3 31.1 / 24.6, w2 29.5 / 20.3, idx.wq_b 15.1 / 13.9; but wq_b
// 34.3 / 39.0, wo_a 53.1 / 60.7, wo_b 50.8 / 97.0. TERN_STREAM_MAX_NT=4 or 8 forces one. The same bits either
// way (a token's sums do not depend on its tile).
int stream_max_n_tiles(int64_t weights) {
  static const int forced = env_forced("TERN_STREAM_MAX_NT", 4, 8);
  if (forced > 0) return forced;
  return weights <= (int64_t{8} << 20) ? 4 : 8;
}

StreamPlan plan_linear_stream(const LinearParams& p) {
  StreamPlan plan;
  plan.nt = p.T <= 8 ? 1 : p.T <= 16 ? 2 : p.T <= 32 || stream_max_n_tiles(p.w.out * p.w.in) == 4 ? 4 : 8;
  plan.mt = plan.nt == 8 ? 1 : stream_m_tiles(plan.nt, p.w.out * p.w.in);
  plan.bx = (p.w.out + dev::kStreamRows - 1) / dev::kStreamRows;
  plan.bz = (p.T + plan.nt * 8 - 1) / (plan.nt * 8);
  const int chunk = chunk_of(p.w.kind);
  const int64_t chunks = p.w.in / chunk;
  plan.chunks_per_group = stream_chunks_per_group(p);
  plan.ksplit = stream_ksplit(p, plan.bx, plan.bz, plan.chunks_per_group);
  const int64_t range = plan.ksplit > 1 ? plan.chunks_per_group : chunks;  // chunks one block walks
  const int rows = plan.nt * 8;
  const int64_t fit = ((dev::stream_x_budget(plan.nt) / rows - 64) / 2) / chunk;  // chunks of x the budget holds
  plan.win_chunks = static_cast<int>(std::clamp<int64_t>(fit, 1, range));
  plan.scale_words = p.w.kind == WeightFormat::fp8_block ? static_cast<int>(range * chunk / 128 + 2) : 0;
  const int warps = dev::stream_warps(plan.mt);
  const int ring = p.w.kind == WeightFormat::fp8_block ? (plan.mt == 2 ? dev::ring_bytes<WeightFormat::fp8_block, 2>()
                                                                : dev::ring_bytes<WeightFormat::fp8_block, 1>())
                                               : (plan.mt == 2 ? dev::ring_bytes<WeightFormat::mxfp4, 2>()
                                                                : dev::ring_bytes<WeightFormat::mxfp4, 1>());
  plan.smem = static_cast<size_t>(warps) * ring + rows * (plan.win_chunks * chunk * 2 + 64) + plan.scale_words * 4;
  return plan;
}

namespace {

std::atomic<int> g_linear_variant{-1};

}  // namespace

int linear_variant() {
  int v = g_linear_variant.load(std::memory_order_relaxed);
  if (v < 0) {
    v = static_cast<int>(env_int("TERN_LINEAR_VARIANT", 0, 0, 2));
    g_linear_variant.store(v, std::memory_order_relaxed);
  }
  return v;
}

void set_linear_variant(int variant) { g_linear_variant.store(variant, std::memory_order_relaxed); }

// The bulk-copy kernel (linear_bulk_impl.cuh): FP8-block and bf16 weights, the streaming kernel's tiles (row
// groups whole 128-row tiles); its copies need 16-byte aligned rows, which linear_mma_ok's 64-column chunks
// and aligned base give.
bool linear_bulk_ok(const LinearParams& p) {
  if (p.w.kind != WeightFormat::fp8_block && p.w.kind != WeightFormat::bf16) return false;
  if (!linear_mma_ok(p)) return false;
  return p.rows_per_group == p.w.out || p.rows_per_group % dev::kBulkLinRows == 0;
}

// Variant 0 sends only bf16 to the bulk kernel: on the H200 (session 7, results.md) its FP8 products ran slower
// than linear_stream's at T = 1 and 64 on every V4-Flash shape (wq_b 27.3 vs 18.3 us at T = 1), and FP8 gives the
// same bits in both, so the faster one is kept; bf16 gained 1.8x at 16 tokens over linear_mma.
bool linear_bulk_used(const LinearParams& p) {
  const int v = linear_variant();
  return linear_bulk_ok(p) && (v == 2 || (v == 0 && p.w.kind == WeightFormat::bf16));
}

// Tiles, groups and splits as plan_linear_stream (the same groups: the same bits for FP8). Shared memory is
// sized for two blocks per multiprocessor (16 warps): the x window first (its budget by token count), then
// each warp's ring: S stages of 16 rows x SC chunks, the most bytes in flight ((S - 1) * SC chunks) that the
// rest holds, preferring 4 stages (a stage is released and refilled while 3 fly) unless that leaves copies of
// under 2 chunks per row.
BulkLinearPlan plan_linear_bulk(const LinearParams& p) {
  BulkLinearPlan plan;
  plan.nt = p.T <= 8 ? 1 : p.T <= 16 ? 2 : p.T <= 32 ? 4 : 8;
  plan.bx = (p.w.out + dev::kBulkLinRows - 1) / dev::kBulkLinRows;
  plan.bz = (p.T + plan.nt * 8 - 1) / (plan.nt * 8);
  const int64_t chunks = p.w.in / 64;
  plan.chunks_per_group = stream_chunks_per_group(p);
  plan.ksplit = stream_ksplit(p, plan.bx, plan.bz, plan.chunks_per_group);
  const int64_t range = plan.ksplit > 1 ? plan.chunks_per_group : chunks;  // chunks one block walks
  const int rows = plan.nt * 8;
  const bool fp8 = p.w.kind == WeightFormat::fp8_block;
  const int cb = fp8 ? dev::bulk_chunk_bytes<WeightFormat::fp8_block>() : dev::bulk_chunk_bytes<WeightFormat::bf16>();
  // Two blocks per multiprocessor (227 KB, 1 KB reserved each) up to 32 tokens (64-112 registers); at 64 tokens
  // the 8 n-tiles' accumulators take ~166 registers, one block fits, and it gets the whole shared memory.
  const int64_t block_budget = plan.nt == 8 ? 220 * 1024 : 110 * 1024;
  const int64_t win_budget = plan.nt == 8 ? 64 * 1024 : plan.nt == 4 ? 24 * 1024 : 16 * 1024;
  const int64_t fit = ((win_budget / rows - 64) / 2) / 64;  // chunks of x (bf16) the window holds
  plan.win_chunks = static_cast<int>(std::clamp<int64_t>(fit, 1, range));
  plan.scale_words = fp8 ? static_cast<int>(range * 64 / 128 + 2) : 0;
  const int64_t win_bytes = static_cast<int64_t>(rows) * (plan.win_chunks * 64 * 2 + 64);
  const int64_t tab_bytes = (plan.scale_words * 4 + 15) / 16 * 16;
  // Row stride of a stage: a quarter-warp's A loads cover rows g and g + 1 at the same 16-byte offsets, so
  // the stride must not be a multiple of 128 bytes (== 64 for FP8's 16-byte lane runs, == 16 for bf16's 32).
  auto stride_of = [&](int sc) {
    int st = sc * cb;
    const int want = fp8 ? 64 : 16;
    while (st % 128 != want) st += 16;
    return st;
  };
  const int64_t per_warp = (block_budget - win_bytes - tab_bytes - dev::kBulkLinWarps * 4 * 8) / dev::kBulkLinWarps;
  int best_s = 2, best_sc = 1;
  int64_t best_score = -1;
  for (int st = 4; st >= 2; --st) {
    int sc = 1;
    while (sc < range && static_cast<int64_t>(st) * 16 * stride_of(sc + 1) <= per_warp) ++sc;
    const int64_t nst = (range + sc - 1) / sc;
    const int64_t score = std::min<int64_t>(st - 1, nst) * sc;
    if (score > best_score && (sc >= 2 || st == 2 || range < 2)) {
      best_score = score;
      best_s = st;
      best_sc = sc;
    }
  }
  plan.stage_chunks = best_sc;
  plan.stages = static_cast<int>(std::min<int64_t>(best_s, (range + best_sc - 1) / best_sc));
  plan.row_stride = stride_of(best_sc);
  plan.smem = static_cast<size_t>(dev::kBulkLinWarps) * plan.stages * 16 * plan.row_stride + win_bytes + tab_bytes +
              static_cast<size_t>(dev::kBulkLinWarps) * plan.stages * 8;
  return plan;
}

std::vector<int> linear_group_candidates(const LinearParams& p) {
  std::vector<int> out;
  if (!linear_stream_ok(p)) return out;
  // Counts that give distinct groupings (chunks per group), up to the rule's limits.
  const int64_t chunks = p.w.in / chunk_of(p.w.kind);
  const int64_t most = std::min<int64_t>(std::max<int64_t>(1, chunks / (dev::kStages - 1)), 64);
  int64_t last_per = -1;
  for (int64_t g = 1; g <= most; g *= 2) {
    const int64_t per = (chunks + g - 1) / g;
    if (per == last_per) continue;
    last_per = per;
    out.push_back(static_cast<int>(g));
  }
  return out;
}

int linear_groups_used(const LinearParams& p) {
  if (!linear_stream_ok(p)) return 0;
  LinearParams q = p;
  q.partial_floats = INT64_MAX;
  q.num_counters = INT64_MAX;
  const StreamPlan plan = plan_linear_stream(q);
  const int64_t chunks = p.w.in / chunk_of(p.w.kind);
  return static_cast<int>((chunks + plan.chunks_per_group - 1) / plan.chunks_per_group);
}

int64_t linear_x_cols(const LinearParams& p) {
  return p.rows_per_group == p.w.out ? p.w.in : p.w.out / p.rows_per_group * p.w.in;
}

namespace {

int64_t round_up4(int64_t v) { return (v + 3) / 4 * 4; }  // floats: keeps the x windows 16-byte aligned

// The streaming kernels take x ready-made from 9 tokens (stream_tile.cuh, linear_x_window_kernel: staging it per
// block cost more than the weights at 16-64 tokens), except in variant 1 (the previous kernels, for
// comparison). The workspace is sized for the windows from 9 tokens whatever the variant (x_window_wanted);
// where it is short the kernels stage x themselves: the same bits either way.
// TERN_X_WINDOW_MIN sets the first token count that takes them (9; for A/Bs).
int64_t x_window_min_tokens() {
  static const int64_t n = env_int("TERN_X_WINDOW_MIN", 9, 1, int64_t{1} << 30);
  return n;
}
bool x_window_wanted(const LinearParams& p) { return p.T > 8; }
bool x_window_used(const LinearParams& p) {
  return x_window_wanted(p) && p.T >= x_window_min_tokens() && linear_variant() != 1;
}
int64_t x_window_floats(const LinearParams& p) { return round_up4((p.T * linear_x_cols(p) * 2 + 3) / 4); }
int64_t split_partial_floats(const LinearParams& p, int ksplit) { return ksplit > 1 ? ksplit * p.T * p.w.out : 0; }

// Split-K partials, then the x windows where wanted.
int64_t stream_workspace_floats(const LinearParams& p, int ksplit) {
  const int64_t partials = split_partial_floats(p, ksplit);
  return x_window_wanted(p) ? round_up4(partials) + x_window_floats(p) : partials;
}

// Converts x into the windows' layout in the workspace after the split-K partials and returns it, or nullptr
// (the kernel stages x itself) when not used or the workspace is short.
template <WeightFormat F>
const uint8_t* make_x_windows(const LinearParams& p, int ksplit, cudaStream_t stream) {
  if (!x_window_used(p) || p.partial == nullptr) return nullptr;
  const int64_t at = round_up4(split_partial_floats(p, ksplit));
  if (at + x_window_floats(p) > p.partial_floats) return nullptr;
  uint8_t* xw = reinterpret_cast<uint8_t*>(p.partial + at);
  const int64_t cols = linear_x_cols(p), pieces = p.T * cols / 8;
  constexpr int kThreads = 256;
  launch(dev::linear_x_window_kernel<F>, static_cast<unsigned>((pieces + kThreads - 1) / kThreads), kThreads,
         0, stream, p.x, p.x_stride, p.T, cols, xw);
  return xw;
}

}  // namespace

int64_t linear_partial_floats(const LinearParams& p) {
  if (!linear_mma_ok(p)) return 0;
  LinearParams q = p;
  q.partial_floats = INT64_MAX;
  q.num_counters = INT64_MAX;
  // The most any variant wants (the variant may change between calls: benchmarks, tests).
  int64_t most = 0;
  if (linear_bulk_ok(q)) most = stream_workspace_floats(p, plan_linear_bulk(q).ksplit);
  if (linear_stream_ok(q)) return std::max(most, stream_workspace_floats(p, plan_linear_stream(q).ksplit));
  return std::max(most, split_partial_floats(p, plan_linear(q).ksplit));
}

namespace dev {
namespace {

// Tokens per warp of the exact kernel: each weight element is decoded once for all of them.
constexpr int kSimpleTokens = 8;

// One warp per (row, kSimpleTokens tokens): exact f32 products, warp-reduced. Each token's sum runs in the
// same order whatever the other tokens (lane-strided partial sums, then warp_sum): batch invariant.
__global__ void linear_simple_kernel(SimpleMat m, const float* x, int64_t x_stride, int64_t rows_per_group,
                                     int64_t T, float* y) {
  pdl_prologue();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  const int64_t tok0 = static_cast<int64_t>(blockIdx.y) * kSimpleTokens;
  const int lane = threadIdx.x & 31;
  if (row >= m.out || tok0 >= T) return;
  const int nt = static_cast<int>(T - tok0 < kSimpleTokens ? T - tok0 : kSimpleTokens);
  const float* xr = x + tok0 * x_stride + (row / rows_per_group) * m.in;
  float acc[kSimpleTokens];
#pragma unroll
  for (int j = 0; j < kSimpleTokens; ++j) acc[j] = 0.0f;
  for (int64_t c = lane; c < m.in; c += 32) {
    const float w = weight_at(m, row, c);
#pragma unroll
    for (int j = 0; j < kSimpleTokens; ++j)
      if (j < nt) acc[j] += xr[j * x_stride + c] * w;
  }
#pragma unroll
  for (int j = 0; j < kSimpleTokens; ++j) {
    const float sum = warp_sum(acc[j]);
    if (lane == 0 && j < nt) y[(tok0 + j) * m.out + row] = sum;
  }
}

// 8 bf16 values (one 16-byte load) as floats.
__device__ __forceinline__ void bf16x8_to_f32(uint4 q, float (&w)[8]) {
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    w[2 * k] = bf16_bits_to_f32(static_cast<uint16_t>(words[k] & 0xffffu));
    w[2 * k + 1] = bf16_bits_to_f32(static_cast<uint16_t>(words[k] >> 16));
  }
}

// Eight weights of FP8 row `row` at columns col .. col + 7 (col a multiple of 8) as f32, exactly: one 8-byte load
// with its 128x128 block scale (the hardware e4m3x2 -> f16x2 conversion, exact, subnormals and NaN included: 3
// instructions a byte pair instead of ~10 a byte). (bf16 rows: bf16x8_to_f32 of one 16-byte load.)
__device__ __forceinline__ void exact_weights8_fp8(const SimpleMat& m, int64_t row, int64_t col, float (&w)[8]) {
  const uint2 q = __ldg(reinterpret_cast<const uint2*>(m.w + row * m.in + col));
  const int64_t si = (row >> 7) * m.s_cols + (col >> 7);
  const float sc = m.scale_f32 ? reinterpret_cast<const float*>(m.s)[si] : e8m0_to_f32(m.s[si]);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t word = k < 2 ? q.x : q.y;
    const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>((word >> (16 * (k % 2))) & 0xffffu), __NV_E4M3)));
    w[2 * k] = f.x * sc;
    w[2 * k + 1] = f.y * sc;
  }
}

// acc += x[0..7] . w[0..7], one product at a time in column order (the exact kernels' per-token order); x is
// 16-byte aligned (global or shared memory).
__device__ __forceinline__ void dot8(float& acc, const float* x, const float (&w)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(x);
  const float4 b = *reinterpret_cast<const float4*>(x + 4);
  acc += a.x * w[0];
  acc += a.y * w[1];
  acc += a.z * w[2];
  acc += a.w * w[3];
  acc += b.x * w[4];
  acc += b.y * w[5];
  acc += b.z * w[6];
  acc += b.w * w[7];
}

// The exact path for bf16 weights whose rows are whole 8-column chunks (the router gates, the indexer's
// weights_proj; FP8 rows take linear_exact_lanes_kernel below, faster there): as linear_simple_kernel, but each
// 8-column chunk is one 16-byte load, and a row is cut into `wpr` K slices, one warp each (wpr from the row's
// length alone: enough warps that the block's 8 warps stream a row at once; a gate row of 4 096 columns was one
// warp, 2 loads in flight per lane, 29 us a call at 16 tokens). Lane l of a slice takes its chunks l, l+32, ...;
// the slice's sum is warp-reduced, and the slices are added in order through shared memory: each token's sum
// runs in an order fixed by the weight's shape, whatever the other tokens (batch invariant).
// R: a warp takes its slice of R rows (rows warp / wpr * R ..), loading a chunk's x for its tokens into registers
// once for the R rows: at 8 tokens a chunk's 16 bytes of weights came with 256 bytes of x from L1 / L2 per row,
// which held the gate at ~9 us a call at 16 tokens (H100). Every (row, token) sum keeps its chunks, order and
// reductions, so R does not change a bit.
template <int R>
__global__ void __launch_bounds__(256) linear_exact_rows_kernel(SimpleMat m, const float* x, int64_t x_stride,
                                                                int64_t rows_per_group, int64_t T, int wpr, float* y) {
  __shared__ float red[8][R][kSimpleTokens];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t rows_block = (8 / wpr) * R;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * rows_block + (warp / wpr) * R;  // the warp's first row
  const int slice = warp % wpr;
  const int chunks = static_cast<int>(m.in >> 3), per = (chunks + wpr - 1) / wpr;
  const int c0 = slice * per, c1 = min(chunks, c0 + per);
  // Before the wait: the lane's first two chunks of its rows' weights (a weight's bytes: no kernel writes them), so
  // that their DRAM latency overlaps the previous kernel; a router gate row of 4 096 columns is two chunks a lane, so
  // nothing is left to fetch from DRAM after the wait. (At batch 1 the gate runs beside the shared expert's product
  // on the side branch and took 8 us a call for its 2 MB, session 27's trace.)
  // The lane's R rows of chunk ch (16 bytes each; zeros past the rows or the slice).
  const auto load_chunk = [&](int ch, uint4 (&q)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i)
      q[i] = row0 + i < m.out && ch < c1
                 ? __ldg(reinterpret_cast<const uint4*>(m.w + ((row0 + i) * m.in + 8 * static_cast<int64_t>(ch)) * 2))
                 : make_uint4(0u, 0u, 0u, 0u);
  };
  uint4 pre[2][R];
  load_chunk(c0 + lane, pre[0]);
  load_chunk(c0 + lane + 32, pre[1]);
  pdl_prologue();
  const int64_t tok0 = static_cast<int64_t>(blockIdx.y) * kSimpleTokens;
  const int nt = static_cast<int>(T - tok0 < kSimpleTokens ? T - tok0 : kSimpleTokens);
  float acc[R][kSimpleTokens];
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < kSimpleTokens; ++j) acc[i][j] = 0.0f;
  if (row0 < m.out) {
    // The warp's rows share a row group (R > 1 only where rows_per_group is a multiple of the block's rows).
    const float* xr = x + tok0 * x_stride + (row0 / rows_per_group) * m.in;
    // One chunk of the lane: its R rows' weights (q) against each token's 8 values of x.
    const auto step = [&](int ch, const uint4 (&q)[R]) {
      float w[R][8];
#pragma unroll
      for (int i = 0; i < R; ++i) bf16x8_to_f32(q[i], w[i]);
      if constexpr (R == 1) {
#pragma unroll
        for (int j = 0; j < kSimpleTokens; ++j) {
          if (j >= nt) break;
          dot8(acc[0][j], xr + j * x_stride + 8 * ch, w[0]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kSimpleTokens; ++j) {
          if (j >= nt) break;
          __align__(16) float xv[8];
          *reinterpret_cast<float4*>(xv) = *reinterpret_cast<const float4*>(xr + j * x_stride + 8 * ch);
          *reinterpret_cast<float4*>(xv + 4) = *reinterpret_cast<const float4*>(xr + j * x_stride + 8 * ch + 4);
#pragma unroll
          for (int i = 0; i < R; ++i) dot8(acc[i][j], xv, w[i]);
        }
      }
    };
    if (c0 + lane < c1) step(c0 + lane, pre[0]);
    if (c0 + lane + 32 < c1) step(c0 + lane + 32, pre[1]);
#pragma unroll 2
    for (int ch = c0 + lane + 64; ch < c1; ch += 32) {
      uint4 q[R];
      load_chunk(ch, q);
      step(ch, q);
    }
  }
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < kSimpleTokens; ++j) {
      const float sum = warp_sum(acc[i][j]);
      if (lane == 0) red[warp][i][j] = sum;
    }
  __syncthreads();
  // Thread (row of the block r, token j): the row's slices in order.
  const int r = threadIdx.x / kSimpleTokens, j = threadIdx.x % kSimpleTokens;
  const int64_t out_row = static_cast<int64_t>(blockIdx.x) * rows_block + r;
  if (r < rows_block && j < nt && out_row < m.out) {
    const int rr = r / R, i = r % R;  // the row's warps (rr * wpr ..) and its index among a warp's rows
    float total = 0.0f;
    for (int sl = 0; sl < wpr; ++sl) total += red[rr * wpr + sl][i][j];
    y[(tok0 + j) * m.out + out_row] = total;
  }
}

// Warps per row of linear_exact_rows_kernel: one per 32 chunks of 8 columns (one chunk per lane), at most 8;
// a power of two so that a block's 8 warps hold whole rows. From the weight's shape alone.
int exact_rows_wpr(int64_t in) {
  const int64_t chunks = in / 8;
  int w = 1;
  while (w < 8 && static_cast<int64_t>(w) * 32 < chunks) w *= 2;
  return w;
}

// The exact path for FP8-block weights (the indexer's wq_b: its top-k must agree with the f32 reference). One
// thread per weight row, kExactTokens tokens per pass, and the K range cut into slices of kExactSlice columns,
// one block each (so an 8192-row, 1024-column matrix makes 256 blocks at one token):
//   - the block stages its tokens' x for the slice in shared memory; every thread reads the same x element at
//     the same time (a broadcast), so x costs no bandwidth per row: a warp-per-row kernel re-read 32 KB of x for
//     every 1 KB row (the indexer's wq_b: 57 us a call) or spent as many shuffles reducing as multiplying;
//   - a thread walks its row in 8-column steps (one 8-byte load, one block scale), one
//     accumulator per token, in column order; the slices' partial sums are added in slice order by the last
//     block of the row tile to arrive (arrival counters return to zero).
// Each token's sum runs in an order fixed by the weight's shape, whatever the other tokens (batch invariant).
constexpr int kExactRows = 256;   // rows per block: one per thread
constexpr int kExactSlice = 128;  // columns per K slice (8 slices of a 1024-column row: 2 blocks per SM at T = 1)
constexpr int kExactTokens = 8;   // tokens per pass over the weights

__global__ void __launch_bounds__(kExactRows) linear_exact_lanes_kernel(SimpleMat m, const float* x, int64_t x_stride,
                                                                        int64_t rows_per_group, int64_t T, float* y,
                                                                        float* partial, int* counters) {
  pdl_prologue();
  __shared__ __align__(16) float xs[kExactTokens][kExactSlice];
  const int slices = static_cast<int>(gridDim.y), slice = static_cast<int>(blockIdx.y);
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kExactRows, row = row0 + threadIdx.x;
  const int64_t tok0 = static_cast<int64_t>(blockIdx.z) * kExactTokens;
  const int nt = static_cast<int>(min(T - tok0, static_cast<int64_t>(kExactTokens)));
  const int64_t c0 = static_cast<int64_t>(slice) * kExactSlice;
  const int cols = static_cast<int>(min(static_cast<int64_t>(kExactSlice), m.in - c0));

  // Every row of the block is in the row group of row0 (a launch condition).
  const float* xb = x + tok0 * x_stride + (row0 / rows_per_group) * m.in + c0;
  for (int i = threadIdx.x; i < kExactTokens * kExactSlice / 4; i += kExactRows) {
    const int j = i / (kExactSlice / 4), c = 4 * (i % (kExactSlice / 4));
    const float4 v = j < nt && c < cols ? *reinterpret_cast<const float4*>(xb + j * x_stride + c) : make_float4(0, 0, 0, 0);
    *reinterpret_cast<float4*>(&xs[j][c]) = v;
  }
  __syncthreads();

  float acc[kExactTokens];
#pragma unroll
  for (int j = 0; j < kExactTokens; ++j) acc[j] = 0.0f;
  if (row < m.out) {
#pragma unroll 4
    for (int c = 0; c < cols; c += 8) {
      float w[8];
      exact_weights8_fp8(m, row, c0 + c, w);
#pragma unroll
      for (int j = 0; j < kExactTokens; ++j) {
        if (j >= nt) break;
        dot8(acc[j], &xs[j][c], w);
      }
    }
  }
  // (unrolled with a guard: a run-time index into acc would put it in local memory)
  float* dst = slices == 1 ? y + tok0 * m.out : partial + (slice * T + tok0) * m.out;
  if (row < m.out) {
#pragma unroll
    for (int j = 0; j < kExactTokens; ++j)
      if (j < nt) dst[j * m.out + row] = acc[j];
  }
  if (slices == 1) return;

  finish_split_k(partial, y, counters, blockIdx.x + static_cast<int64_t>(gridDim.x) * blockIdx.z, slices, row0,
                 kExactRows, m.out, T, tok0, tok0 + nt, 1.0f);
}

// The exact kernel's grid: row tiles, K slices, token passes.
dim3 exact_grid(const LinearParams& p) {
  return dim3(static_cast<unsigned>((p.w.out + kExactRows - 1) / kExactRows),
              static_cast<unsigned>((p.w.in + kExactSlice - 1) / kExactSlice),
              static_cast<unsigned>((p.T + kExactTokens - 1) / kExactTokens));
}

dim3 simple_grid(int64_t out, int64_t T) {
  return dim3(static_cast<unsigned>((out + 7) / 8), static_cast<unsigned>((T + kSimpleTokens - 1) / kSimpleTokens));
}

__global__ void dequantize_kernel(SimpleMat m, float* out) {
  pdl_prologue();
  const int64_t n = m.out * m.in;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = weight_at(m, i / m.in, i % m.in);
}

SimpleMat simple_mat(const DeviceMat& w) {
  return SimpleMat{static_cast<int>(w.kind), static_cast<const uint8_t*>(w.w), static_cast<const uint8_t*>(w.s),
                   w.out, w.in, w.s_cols, w.scale_f32 ? 1 : 0, w.global_scale};
}

}  // namespace
}  // namespace dev

void launch_linear(const LinearParams& p, cudaStream_t stream) {
  if (p.T == 0) return;
  if (!linear_mma_ok(p)) return launch_linear_exact(p, stream);
  if (linear_bulk_used(p)) {
    const BulkLinearPlan plan = plan_linear_bulk(p);
    if (p.w.kind == WeightFormat::fp8_block)
      launch_linear_bulk<WeightFormat::fp8_block>(p, plan, make_x_windows<WeightFormat::fp8_block>(p, plan.ksplit, stream), stream);
    else
      launch_linear_bulk<WeightFormat::bf16>(p, plan, make_x_windows<WeightFormat::bf16>(p, plan.ksplit, stream), stream);
    return;
  }
  if (linear_stream_ok(p)) {
    const StreamPlan plan = plan_linear_stream(p);
    if (p.w.kind == WeightFormat::fp8_block)
      launch_linear_stream<WeightFormat::fp8_block>(p, plan, make_x_windows<WeightFormat::fp8_block>(p, plan.ksplit, stream), stream);
    else if (p.w.kind == WeightFormat::mxfp4)
      launch_linear_stream<WeightFormat::mxfp4>(p, plan, make_x_windows<WeightFormat::mxfp4>(p, plan.ksplit, stream), stream);
    else
      launch_linear_stream<WeightFormat::nvfp4>(p, plan, make_x_windows<WeightFormat::nvfp4>(p, plan.ksplit, stream), stream);
    return;
  }
  const LinearPlan plan = plan_linear(p);
  switch (p.w.kind) {
    case WeightFormat::f32: launch_linear_mma<WeightFormat::f32>(p, plan, stream); return;
    case WeightFormat::bf16: launch_linear_mma<WeightFormat::bf16>(p, plan, stream); return;
    case WeightFormat::fp8_block: launch_linear_mma<WeightFormat::fp8_block>(p, plan, stream); return;
    case WeightFormat::mxfp4: launch_linear_mma<WeightFormat::mxfp4>(p, plan, stream); return;
    case WeightFormat::nvfp4: launch_linear_mma<WeightFormat::nvfp4>(p, plan, stream); return;
  }
}

// The exact kernels' conditions: bf16 (linear_exact_rows_kernel) or FP8-block (linear_exact_lanes_kernel)
// weights, rows of whole 8-column steps, 16-byte aligned weights and x rows; for FP8 also every 256-row tile
// inside one row group and enough arrival counters and partial-sum space for its K slices.
bool linear_exact_fast_ok(const LinearParams& p) {
  const auto aligned16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  if ((p.w.kind != WeightFormat::bf16 && p.w.kind != WeightFormat::fp8_block) || p.w.in % 8 != 0 || p.x_stride % 4 != 0 ||
      !aligned16(p.w.w) || !aligned16(p.x))
    return false;
  if (p.w.kind == WeightFormat::bf16) return p.w.in < (int64_t{1} << 31);  // linear_exact_rows_kernel
  if (p.rows_per_group % dev::kExactRows != 0 && p.rows_per_group < p.w.out) return false;
  const dim3 g = dev::exact_grid(p);
  if (g.z > 65535) return false;
  return g.y == 1 || (static_cast<int64_t>(g.x) * g.z <= p.num_counters && p.partial != nullptr &&
                      static_cast<int64_t>(g.y) * p.T * p.w.out <= p.partial_floats);
}

int64_t linear_exact_partial_floats(const LinearParams& p) {
  if (p.w.kind != WeightFormat::fp8_block) return 0;  // (the tensor-core kernel needs none)
  const dim3 g = dev::exact_grid(p);
  return g.y > 1 ? static_cast<int64_t>(g.y) * p.T * p.w.out : 0;
}

void launch_linear_exact(const LinearParams& p, cudaStream_t stream) {
  if (p.T == 0) return;
  if (exact_on_tensor_cores(p.w.kind) && linear_exact_tc_ok(p)) return launch_linear_exact_tc(p, stream);
  const dev::SimpleMat m = dev::simple_mat(p.w);
  if (!linear_exact_fast_ok(p)) {
    launch(dev::linear_simple_kernel, dev::simple_grid(p.w.out, p.T), 256, 0, stream, m, p.x, p.x_stride,
           p.rows_per_group, p.T, p.y);
    return;
  }
  if (p.w.kind == WeightFormat::bf16) {  // measured: 5.9 / 7.1 us a gate call at 1 / 16 tokens, the lanes kernel 12.9 / 22.5
    // Rows a warp (linear_exact_rows_kernel's R): 4 from 3 tokens, where x's reads set the pace (at 1-2 tokens the
    // weights do, and a row a warp keeps 4x the blocks streaming them), when the blocks' rows stay in one row group.
    const int wpr = dev::exact_rows_wpr(p.w.in);
    const int R = p.T > 2 && p.rows_per_group % (8 / wpr * 4) == 0 ? 4 : 1, rows = 8 / wpr * R;
    const dim3 grid(static_cast<unsigned>((p.w.out + rows - 1) / rows),
                    static_cast<unsigned>((p.T + dev::kSimpleTokens - 1) / dev::kSimpleTokens));
    const auto kernel = R == 4 ? dev::linear_exact_rows_kernel<4> : dev::linear_exact_rows_kernel<1>;
    launch(kernel, grid, 256, 0, stream, m, p.x, p.x_stride, p.rows_per_group, p.T, wpr, p.y);
    return;
  }
  launch(dev::linear_exact_lanes_kernel, dev::exact_grid(p), dev::kExactRows, 0, stream, m, p.x, p.x_stride,
         p.rows_per_group, p.T, p.y, p.partial, p.counters);
}

std::string linear_exact_path_name(const LinearParams& p) {
  if (exact_on_tensor_cores(p.w.kind) && linear_exact_tc_ok(p)) return linear_exact_tc_name(p);
  return !linear_exact_fast_ok(p)      ? "linear_simple (CUDA cores, f32)"
         : p.w.kind == WeightFormat::bf16 ? "linear_exact_rows (CUDA cores, f32)"
                                        : "linear_exact_lanes (CUDA cores, f32)";
}

std::string linear_path_name(const LinearParams& p) {
  if (!linear_mma_ok(p)) return "linear_simple (CUDA cores, f32)";
  // linear_x_window_kernel first where the workspace allows (it does wherever linear_partial_floats sized it)
  const std::string xw = x_window_used(p) ? "x_window + " : "";
  if (linear_bulk_used(p))
    return xw + (p.w.kind == WeightFormat::fp8_block ? "linear_bulk<fp8 block>" : "linear_bulk<bf16>") +
           " (tensor cores, cp.async.bulk warp rings)";
  if (linear_stream_ok(p)) {
    const char* fmt = p.w.kind == WeightFormat::fp8_block ? "fp8 block" : p.w.kind == WeightFormat::mxfp4 ? "mxfp4" : "nvfp4";
    return xw + "linear_stream<" + fmt + "> (tensor cores, cp.async weight ring)";
  }
  switch (p.w.kind) {
    case WeightFormat::f32: return "linear_mma<f32->bf16> (tensor cores)";
    case WeightFormat::bf16: return "linear_mma<bf16> (tensor cores)";
    case WeightFormat::fp8_block: return "linear_mma<fp8 block> (tensor cores)";
    case WeightFormat::mxfp4: return "linear_mma<mxfp4> (tensor cores)";
    case WeightFormat::nvfp4: return "linear_mma<nvfp4> (tensor cores)";
  }
  return "?";
}

void launch_dequantize(const DeviceMat& w, float* out, cudaStream_t stream) {
  const int64_t n = w.out * w.in;
  launch(dev::dequantize_kernel, dev::grid_stride_blocks(n), 256, 0, stream, dev::simple_mat(w), out);
}

}  // namespace tern::cuda
