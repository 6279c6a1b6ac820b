// Routing, the MoE plan (pairs grouped by expert, stable and deterministic), the combine, and dispatch.
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/act_quant.cuh"
#include "backends/cuda/kernels/act_quant_dev.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/moe_bulk_impl.cuh"
#include "core/env.h"
#include "core/error.h"

namespace tern::cuda {

extern template void launch_moe_experts<WeightFormat::f32>(const MoeParams&, const MoeLayout&, char*, cudaStream_t);
extern template void launch_moe_experts<WeightFormat::bf16>(const MoeParams&, const MoeLayout&, char*, cudaStream_t);
extern template void launch_moe_experts<WeightFormat::fp8_block>(const MoeParams&, const MoeLayout&, char*, cudaStream_t);
extern template void launch_moe_experts<WeightFormat::mxfp4>(const MoeParams&, const MoeLayout&, char*, cudaStream_t);
extern template void launch_moe_experts<WeightFormat::nvfp4>(const MoeParams&, const MoeLayout&, char*, cudaStream_t);
extern template void launch_moe_bulk<WeightFormat::mxfp4>(const MoeParams&, const MoeLayout&, const MoeBulkPlan&,
                                                       const MoeBulkPlan&, int, char*, cudaStream_t);
extern template void launch_moe_bulk<WeightFormat::nvfp4>(const MoeParams&, const MoeLayout&, const MoeBulkPlan&,
                                                       const MoeBulkPlan&, int, char*, cudaStream_t);


namespace dev {
namespace {

// sqrt(softplus(x)) with torch's threshold (x > 20: softplus(x) = x).
__device__ __forceinline__ float sqrt_softplus(float x) { return sqrtf(x > 20.0f ? x : log1pf(expf(x))); }

constexpr int kRouteWarps = 4, kMaxExperts = 1024;

// Warp per token: k rounds of a warp argmax over (score + bias), ties to the lower expert id. Every lane ends a
// round with the winner (butterfly), so every lane keeps the sum and lane j the j-th pick's score: no global
// read-back of the weights at the end (session 14: 9.6 -> 8.6 us a call at 64 tokens; still ~9 us at one token,
// where the cause is not known).
__global__ void __launch_bounds__(kRouteWarps * 32) route_scored_kernel(const float* logits, const float* bias,
                                                                       int64_t T, int64_t E, int k, float scale,
                                                                       int32_t* indices, float* weights, int* err) {
  pdl_prologue();
  __shared__ float sc[kRouteWarps][kMaxExperts];
  __shared__ float bi[kRouteWarps][kMaxExperts];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp;
  if (t >= T) return;
  for (int64_t e = lane; e < E; e += 32) {
    sc[warp][e] = sqrt_softplus(logits[t * E + e]);
    bi[warp][e] = sc[warp][e] + bias[e];
  }
  __syncwarp();
  float sum = 0.0f, mine = 0.0f;
  for (int j = 0; j < k; ++j) {
    float best = -INFINITY;
    int best_e = INT32_MAX;
    for (int e = lane; e < E; e += 32)
      if (bi[warp][e] > best || (bi[warp][e] == best && e < best_e)) best = bi[warp][e], best_e = e;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (ob > best || (ob == best && oe < best_e)) best = ob, best_e = oe;
    }
    // No expert compared (every score NaN): best_e would index past the rows and the MoE plan would report an
    // expert index out of range; say what happened instead (the intermittent graph-test failure of sessions
    // 6 and 7 is this or a real out-of-range index), and keep the memory accesses in bounds.
    if (best_e == INT32_MAX) {
      if (lane == 0) raise(err, kErrRouterScore);
      best_e = 0;
    }
    const float w = sc[warp][best_e];
    sum += w;
    if (lane == j) mine = w;
    __syncwarp();
    if (lane == 0) {
      indices[t * k + j] = best_e;
      if (k > 32) weights[t * k + j] = w;  // (more picks than lanes: read back below, as before)
      bi[warp][best_e] = -INFINITY;
    }
    __syncwarp();
  }
  if (k <= 32) {
    if (lane < k) weights[t * k + lane] = mine / (sum + 1e-20f) * scale;
  } else if (lane == 0) {
    for (int j = 0; j < k; ++j) weights[t * k + j] = weights[t * k + j] / (sum + 1e-20f) * scale;
  }
}

// The top-k key of a score + bias: larger float, larger key; 0 for what never wins (NaN and -inf: the float
// comparisons of route_scored_kernel never pick them; a pick already taken). -0 is keyed as +0 (the two compare
// equal, so the lower expert id wins their tie, as in the float comparisons).
__device__ __forceinline__ unsigned route_key(float v) {
  if (!(v > -INFINITY)) return 0u;
  const unsigned u = v == 0.0f ? 0u : __float_as_uint(v);
  return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}

// The lane's PER values of the bias (experts lane + 32 i), loaded once for every token a warp routes, and before
// the kernels' PDL waits (a weight's bytes: no kernel writes them) so that their DRAM latency overlaps the gate.
template <int PER>
__device__ __forceinline__ void route_bias_regs(const float* bias, int64_t E, float (&bs)[PER]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < PER; ++i) bs[i] = lane + 32 * i < E ? bias[lane + 32 * i] : 0.0f;
}

template <int PER>
__device__ __forceinline__ void route_scored_token_regs(const float* row, const float (&bs)[PER], int64_t E, int k,
                                                        float scale, int32_t* indices, float* weights, int* err) {
  const int lane = threadIdx.x & 31;
  float lg[PER], sc[PER];
  unsigned key[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int e = lane + 32 * i;
    lg[i] = e < E ? row[e] : 0.0f;
  }
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    sc[i] = sqrt_softplus(lg[i]);
    key[i] = lane + 32 * i < E ? route_key(sc[i] + bs[i]) : 0u;
  }
  float sum = 0.0f, mine = 0.0f;
  int mine_e = 0;
  for (int j = 0; j < k; ++j) {
    unsigned best = 0u;
    int slot = 0;
#pragma unroll
    for (int i = 0; i < PER; ++i)
      if (key[i] > best) best = key[i], slot = i;  // ascending ids: a tie keeps the lower one
    const unsigned top = __reduce_max_sync(0xffffffffu, best);
    int win = __reduce_min_sync(0xffffffffu, best == top && top != 0u ? lane + 32 * slot : INT32_MAX);
    if (top == 0u) {  // no expert left to compare (every score NaN): as route_scored_kernel, expert 0
      if (lane == 0) raise(err, kErrRouterScore);
      win = 0;
    }
    float my = sc[0];
#pragma unroll
    for (int i = 1; i < PER; ++i)
      if (slot == i) my = sc[i];
    const float w = __shfl_sync(0xffffffffu, my, win & 31);  // the winner's lane holds it in its best slot
#pragma unroll
    for (int i = 0; i < PER; ++i)
      if (lane + 32 * i == win) key[i] = 0u;
    sum += w;
    if (lane == j) mine = w, mine_e = win;
  }
  if (lane < k) {
    indices[lane] = mine_e;
    weights[lane] = mine / (sum + 1e-20f) * scale;
  }
}

// route_scored_kernel's picks and weights (the same floats, the same order of the sum) with each lane's PER
// experts (lane + 32 i) held in registers: every logit and bias load issued at once, and a round is a lane's
// argmax over its registers and two warp reductions (the largest key, then the lowest expert holding it: ties to
// the lower id) instead of a shared-memory scan and ten shuffles. Up to 32 picks (lane j keeps pick j).
// route_scored_kernel took 9.1 us at one token on the H100 (session 22), this kernel 3.1 (session 23, results.md).
template <int PER>
__global__ void __launch_bounds__(kRouteWarps * 32) route_scored_regs_kernel(const float* logits, const float* bias,
                                                                            int64_t T, int64_t E, int k, float scale,
                                                                            int32_t* indices, float* weights, int* err) {
  float bs[PER];
  route_bias_regs<PER>(bias, E, bs);  // before the wait (route_bias_regs says why)
  pdl_prologue();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + (threadIdx.x >> 5);
  if (t >= T) return;
  route_scored_token_regs<PER>(logits + t * E, bs, E, k, scale, indices + t * k, weights + t * k, err);
}

// One token's hash routing (a thread): tid2eid's row of the token, weights from its scores.
__device__ __forceinline__ void route_hash_token(const float* logits, const void* tid2eid, int i64, int64_t vocab,
                                                 int64_t token, int64_t E, int k, float scale, int32_t* indices,
                                                 float* weights, int* err) {
  const bool ok = token >= 0 && token < vocab;
  if (!ok) raise(err, kErrTokenId);
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    int64_t e = !ok ? 0
                    : i64 ? static_cast<const int64_t*>(tid2eid)[token * k + j]
                          : static_cast<const int32_t*>(tid2eid)[token * k + j];
    if (e < 0 || e >= E) {
      raise(err, kErrExpertIndex);
      e = 0;
    }
    indices[j] = static_cast<int32_t>(e);
    sum += weights[j] = sqrt_softplus(logits[e]);
  }
  for (int j = 0; j < k; ++j) weights[j] = weights[j] / (sum + 1e-20f) * scale;
}

__global__ void route_hash_kernel(const float* logits, const void* tid2eid, int i64, int64_t vocab,
                                  const int64_t* token_ids, int64_t T, int64_t E, int k, float scale, int32_t* indices,
                                  float* weights, int* err) {
  pdl_prologue();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= T) return;
  route_hash_token(logits + t * E, tid2eid, i64, vocab, token_ids[t], E, k, scale, indices + t * k, weights + t * k,
                   err);
}

constexpr int kPlanThreads = 1024, kPlanStaged = 6144, kRankExperts = 256;
// The plan of up to kRankExperts experts in a block of that many threads (moe_prep_kernel, and moe_plan_kernel_small
// under TERN_MOE_FUSED_PLAN): a 1024-thread block needs ~50K registers free on one multiprocessor, which the side
// branch's FP8 products (two 256-thread blocks an SM) leave only when they end: session 27's first prep kernel of
// 1024 threads waited for the shared expert's product at batch 1 (results.md).
constexpr int kPlanThreadsSmall = kRankExperts;

// One block: per-expert counts, offsets, sorted pair list (each expert's pairs in pick order), each pair's
// sorted slot, and the job list (expert, first slot, count <= tile). Up to kRankExperts experts, the block
// takes 1024 picks at a time: __match_any_sync gives a pick its rank among its warp's picks of the same
// expert and the warp's count, a running sum over the warps (in warp order: pick order) the rank among the
// expert's picks so far, kept in pos[] until the offsets are known. (Warp ballots per expert over every pick,
// the way for more experts, took 20 us a layer at 384 picks.)
// THREADS: the block's threads (E <= THREADS: the scans take an expert a thread, and thread E - 1 writes num_jobs;
// the launches check it on the host); STAGED: the picks the path for more than kRankExperts experts keeps in shared
// memory.
template <int THREADS, int STAGED>
__device__ __forceinline__ void plan_block(const int32_t* indices, int64_t P, int64_t E, int tile, int* sorted,
                                           int* pos, int* jobs, int* num_jobs, int* err) {
  __shared__ int count[THREADS], offset[THREADS], job_off[THREADS];
  __shared__ union {
    int32_t staged[STAGED];                           // more experts: the picks, read many times below
    int warp_count[THREADS / 32 * kRankExperts];      // up to kRankExperts: [warp][expert] counts, then running sums
  } sm;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const bool ranked = E <= kRankExperts;
  if (ranked) {
    for (int e = threadIdx.x; e < E; e += blockDim.x) count[e] = 0;
    for (int64_t base = 0; base < P; base += blockDim.x) {
      const int64_t q = base + threadIdx.x;
      const int e = q < P ? indices[q] : -1;
      const bool valid = q < P && e >= 0 && e < E;
      if (q < P && !valid) {
        raise(err, kErrExpertIndex);
        pos[q] = -1;
      }
      // Only the warps holding picks of this round (a decode step's 6-384 picks: 1-12 of the 32) count: the
      // others' columns would be zeros, and the running sums below walk them serially (session 22: moe_plan 4.8 us
      // at one token on the H100).
      const int busy = static_cast<int>(min(static_cast<int64_t>(warps), (P - base + 31) / 32));
      for (int i = threadIdx.x; i < busy * E; i += blockDim.x) sm.warp_count[i] = 0;
      __syncthreads();
      const unsigned peers = __match_any_sync(0xffffffffu, valid ? e : -1 - lane);  // invalid picks match none
      const int rank = __popc(peers & ((1u << lane) - 1));
      if (valid && rank == 0) sm.warp_count[warp * E + e] = __popc(peers);
      __syncthreads();
      for (int x = threadIdx.x; x < E; x += blockDim.x) {
        int run = count[x];
        for (int w = 0; w < busy; ++w) {
          const int c = sm.warp_count[w * E + x];
          sm.warp_count[w * E + x] = run;
          run += c;
        }
        count[x] = run;
      }
      __syncthreads();
      if (valid) pos[q] = sm.warp_count[warp * E + e] + rank;
      __syncthreads();  // (the next round clears warp_count)
    }
  } else {
    for (int64_t q = threadIdx.x; q < P; q += blockDim.x) {
      const int e = indices[q];
      if (q < STAGED) sm.staged[q] = e;
      if (e < 0 || e >= E) {
        raise(err, kErrExpertIndex);
        pos[q] = -1;
      }
    }
    __syncthreads();
    if (P <= STAGED) indices = sm.staged;
    for (int e = warp; e < E; e += warps) {
      int c = 0;
      for (int64_t base = 0; base < P; base += 32) {
        const int64_t q = base + lane;
        c += __popc(__ballot_sync(0xffffffffu, q < P && indices[q] == e));
      }
      if (lane == 0) count[e] = c;
    }
  }
  __syncthreads();
  {  // exclusive scans of the counts and of the jobs per expert: one expert per thread
    __shared__ int warp_pairs[32], warp_jobs[32];
    const int e = threadIdx.x;
    const int c = e < E ? count[e] : 0, jb = (c + tile - 1) / tile;
    int ic = c, ij = jb;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int vc = __shfl_up_sync(0xffffffffu, ic, o), vj = __shfl_up_sync(0xffffffffu, ij, o);
      if (lane >= o) ic += vc, ij += vj;
    }
    if (lane == 31) warp_pairs[warp] = ic, warp_jobs[warp] = ij;
    __syncthreads();
    int bc = 0, bj = 0;
    for (int w = 0; w < warp; ++w) bc += warp_pairs[w], bj += warp_jobs[w];
    if (e < E) offset[e] = bc + ic - c, job_off[e] = bj + ij - jb;
    if (e == E - 1) {
      num_jobs[0] = bj + ij;
      num_jobs[1] = num_jobs[2] = 0;  // the bulk up and down kernels' item claims (MoeLayout::num_jobs)
    }
  }
  __syncthreads();
  if (ranked) {
    for (int64_t q = threadIdx.x; q < P; q += blockDim.x) {  // the same thread wrote pos[q] above
      const int e = indices[q];
      if (e < 0 || e >= E) continue;
      const int slot = offset[e] + pos[q];
      sorted[slot] = static_cast<int>(q);
      pos[q] = slot;
    }
  } else {
    for (int e = warp; e < E; e += warps) {
      int run = offset[e];
      for (int64_t base = 0; base < P; base += 32) {
        const int64_t q = base + lane;
        const bool mine = q < P && indices[q] == e;
        const unsigned ball = __ballot_sync(0xffffffffu, mine);
        if (mine) {
          const int slot = run + __popc(ball & ((1u << lane) - 1));
          sorted[slot] = static_cast<int>(q);
          pos[q] = slot;
        }
        run += __popc(ball);
      }
    }
  }
  for (int e = threadIdx.x; e < E; e += blockDim.x)
    for (int c = 0; c * tile < count[e]; ++c) {
      int* j = jobs + 3 * (job_off[e] + c);
      j[0] = e, j[1] = offset[e] + c * tile, j[2] = min(tile, count[e] - c * tile);
    }
}

__global__ void __launch_bounds__(kPlanThreads) moe_plan_kernel(const int32_t* indices, int64_t P, int64_t E, int tile,
                                                                int* sorted, int* pos, int* jobs, int* num_jobs,
                                                                int* err) {
  pdl_prologue();
  plan_block<kPlanThreads, kPlanStaged>(indices, P, E, tile, sorted, pos, jobs, num_jobs, err);
}

// moe_plan_kernel in kPlanThreadsSmall threads, for up to that many experts (the same plan: a pick's slot depends on
// the pick order only).
__global__ void __launch_bounds__(kPlanThreadsSmall) moe_plan_kernel_small(const int32_t* indices, int64_t P,
                                                                           int64_t E, int tile, int* sorted, int* pos,
                                                                           int* jobs, int* num_jobs, int* err) {
  pdl_prologue();
  plan_block<kPlanThreadsSmall, 1>(indices, P, E, tile, sorted, pos, jobs, num_jobs, err);
}

struct PrepArgs {
  MoeRoute route;  // route.logits nullptr: the picks are inputs
  int64_t T, E;
  int k, tile;
  const int32_t* indices;
  int* sorted;
  int* pos;
  int* jobs;
  int* num_jobs;
  int* err;
  const float* x_from;  // nullptr: no quantisation (then gridDim.x is 1)
  float* x;
  int64_t D;
};

// moe_plan_kernel_small with the work of the launches before it (MoeParams::route, x_from), for steps of up to
// kMoePrepMaxTokens tokens: block 0 routes (a warp a token, route_scored_regs_kernel's device code; or a thread a
// token, route_hash_kernel's), then plans the picks it wrote (__syncthreads makes the block's global writes visible to
// the block); blocks 1.. quantise x, a warp a (row, 128-column block), as act_quant_kernel does. The same bits as the
// three launches.
__global__ void __launch_bounds__(kPlanThreadsSmall) moe_prep_kernel(PrepArgs a) {
  float bs[kRouteRegsPerLane] = {};
  if (blockIdx.x == 0 && a.route.bias != nullptr)
    route_bias_regs<kRouteRegsPerLane>(a.route.bias, a.E, bs);  // before the wait (route_bias_regs says why)
  pdl_prologue();
  constexpr int kWarps = kPlanThreadsSmall / 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (blockIdx.x > 0) {
    const int64_t blocks = a.D / 128;
    const int64_t item = static_cast<int64_t>(blockIdx.x - 1) * kWarps + warp;
    if (item >= a.T * blocks) return;
    const int64_t row = item / blocks, col = (item - row * blocks) * 128;
    act_fake_quant_block(a.x_from + row * a.D + col, a.x + row * a.D + col, lane);
    return;
  }
  const MoeRoute r = a.route;
  if (r.logits != nullptr) {
    if (r.tid2eid != nullptr) {
      for (int64_t t = threadIdx.x; t < a.T; t += kPlanThreadsSmall)
        route_hash_token(r.logits + t * a.E, r.tid2eid, r.tid2eid_i64 ? 1 : 0, r.vocab, r.token_ids[t], a.E, a.k,
                         r.scale, r.indices + t * a.k, r.weights + t * a.k, a.err);
    } else {
      for (int64_t t = warp; t < a.T; t += kWarps)
        route_scored_token_regs<kRouteRegsPerLane>(r.logits + t * a.E, bs, a.E, a.k, r.scale, r.indices + t * a.k,
                                                   r.weights + t * a.k, a.err);
    }
    __syncthreads();
  }
  plan_block<kPlanThreadsSmall, 1>(a.indices, a.T * a.k, a.E, a.tile, a.sorted, a.pos, a.jobs, a.num_jobs, a.err);
}

// V floats from p (zeros where p is null): one 16-byte load for V = 4 (p 16-byte aligned), else scalar.
template <int V>
__device__ __forceinline__ void load_floats(const float* p, float (&v)[V]) {
  if constexpr (V == 4) {
    const float4 f = p != nullptr ? *reinterpret_cast<const float4*>(p) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
#pragma unroll
    for (int c = 0; c < V; ++c) v[c] = p != nullptr ? p[c] : 0.0f;
  }
}
template <int V>
__device__ __forceinline__ void store_floats(float* p, const float (&v)[V]) {
  if constexpr (V == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
#pragma unroll
    for (int c = 0; c < V; ++c) p[c] = v[c];
  }
}

// out[t, d] = sum_j weights[t, j] * y[pos[t, j], d], in pick order (+ residual[t, d]: the add_kernel's sum). A
// thread takes V consecutive d (4 where D % 4 == 0: one index and weight read and one 64-bit division for four
// outputs, 16-byte loads; session 33, the 1K prefill's combine at ~69% of copy with V = 1), each output summed as
// before (the same products in pick order), so the same bits.
template <int V>
__global__ void moe_combine_kernel(const float* y, const int* pos, const float* weights, int64_t T, int k, int64_t D,
                                   const float* residual, float* out) {
  pdl_prologue();
  const int64_t DV = D / V, total = T * DV;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / DV, d = (i - t * DV) * V;
    float acc[V];
#pragma unroll
    for (int c = 0; c < V; ++c) acc[c] = 0.0f;
    for (int j0 = 0; j0 < k; j0 += 8) {  // eight picks' loads in flight at once
      int slot[8];
      float w[8], v[8][V];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        slot[j] = j0 + j < k ? pos[t * k + j0 + j] : -1;
        w[j] = j0 + j < k ? weights[t * k + j0 + j] : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j)
        load_floats<V>(slot[j] >= 0 ? y + static_cast<int64_t>(slot[j]) * D + d : nullptr, v[j]);
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int c = 0; c < V; ++c) acc[c] += v[j][c] * w[j];
    }
    float r[V];
    load_floats<V>(residual != nullptr ? residual + t * D + d : nullptr, r);
#pragma unroll
    for (int c = 0; c < V; ++c) acc[c] = residual != nullptr ? acc[c] + r[c] : acc[c];
    store_floats<V>(out + t * D + d, acc);
  }
}

}  // namespace
}  // namespace dev

void launch_route_scored(const float* logits, const float* bias, int64_t T, int64_t E, int k, float routed_scale,
                         int32_t* indices, float* weights, int* err, bool regs, cudaStream_t stream) {
  if (T == 0) return;
  const unsigned blocks = static_cast<unsigned>((T + dev::kRouteWarps - 1) / dev::kRouteWarps);
  if (regs && route_in_registers(E, k))
    launch(dev::route_scored_regs_kernel<kRouteRegsPerLane>, blocks, dev::kRouteWarps * 32, 0, stream, logits, bias,
           T, E, k, routed_scale, indices, weights, err);
  else
    launch(dev::route_scored_kernel, blocks, dev::kRouteWarps * 32, 0, stream, logits, bias, T, E, k, routed_scale,
           indices, weights, err);
}

void launch_route_hash(const float* logits, const void* tid2eid, bool tid2eid_i64, int64_t vocab,
                       const int64_t* token_ids, int64_t T, int64_t E, int k, float routed_scale, int32_t* indices,
                       float* weights, int* err, cudaStream_t stream) {
  if (T == 0) return;
  launch(dev::route_hash_kernel, static_cast<unsigned>((T + 127) / 128), 128, 0, stream, logits, tid2eid,
         tid2eid_i64 ? 1 : 0, vocab, token_ids, T, E, k, routed_scale, indices, weights, err);
}

namespace {
std::atomic<int64_t>& moe_prep_max_tokens_setting() {
  static std::atomic<int64_t> n{env_int("TERN_MOE_PREP_MAX_TOKENS", kMoePrepMaxTokens, 1, kMoeSmallPlanMaxTokens)};
  return n;
}
}  // namespace

int64_t moe_prep_max_tokens() { return moe_prep_max_tokens_setting().load(std::memory_order_relaxed); }

void set_moe_prep_max_tokens(int64_t tokens) {
  TERN_CHECK(tokens >= 1 && tokens <= kMoeSmallPlanMaxTokens, "TERN_MOE_PREP_MAX_TOKENS takes 1 .. ",
             kMoeSmallPlanMaxTokens, ", not ", tokens);
  moe_prep_max_tokens_setting() = tokens;
}

// (block 0 routes a token a warp, its 8 warps looping over the tokens, then plans in 256 threads: any T up to
// kMoeSmallPlanMaxTokens is correct; the bound is where one block's serial routing stops paying for the launches)
bool moe_prep_supported(int64_t T, int64_t E) { return T <= moe_prep_max_tokens() && E <= dev::kPlanThreadsSmall; }

void launch_moe_route(const MoeParams& p, bool regs, cudaStream_t stream) {
  const MoeRoute& r = p.route;
  if (r.logits == nullptr) return;
  if (r.tid2eid != nullptr)
    launch_route_hash(r.logits, r.tid2eid, r.tid2eid_i64, r.vocab, r.token_ids, p.T, p.E, p.k, r.scale, r.indices,
                      r.weights, p.err, stream);
  else
    launch_route_scored(r.logits, r.bias, p.T, p.E, p.k, r.scale, r.indices, r.weights, p.err, regs, stream);
}

namespace {
MoeBulkStamps g_bulk_stamps;
}  // namespace
void set_moe_bulk_stamps(const MoeBulkStamps& s) { g_bulk_stamps = s; }
MoeBulkStamps moe_bulk_stamps() { return g_bulk_stamps; }

bool moe_kind_supported(WeightFormat kind, int64_t D, int64_t inter) {
  const int64_t chunk = chunk_of(kind);
  return D % chunk == 0 && inter % chunk == 0 && D % 32 == 0 && inter % 16 == 0;
}

namespace {

// The expert kernel variants: ring stages of the up and down kernels, consumer warps, m-tiles per down item
// at most; `bulk` false forces moe_expert_kernel (the baseline the benchmark measures beside the others).
// Up items are one m-tile (8 rows of w1 and w3) x 8 K slices at V4-Flash: 8 warps an item; down items
// mt m-tiles x 4 slices.
struct MoeVariant {
  const char* name;
  bool bulk;
  int stages_up, stages_down, consumers, down_mt;
  int job_tokens;     // pairs per job (x window rows): 8, or 4 to make room for a third group of consumers
  bool pad = false;         // padded stage rows (issue_octets: no bank conflicts on the A loads)
  bool pad_scales = false;  // and padded scale rows (one copy each: no bank conflicts on the scale loads)
  bool lean = false;        // item bookkeeping by counters, no run-time integer divisions (moe_bulk_kernel LEAN)
};
constexpr MoeVariant kMoeVariants[] = {
    // 0: measured fastest on the H200 (session 9: 50.4 / 372.0 / 1020.1 us at T = 1 / 16 / 64, mxfp4, against
    // 53.2 / 431.3 / 1189.7 for 6, the same kernel with the item bookkeeping's run-time integer divisions, the
    // default of session 8). 8 -> 16 consumer warps (1 -> 2 items decoded at once) gave 1.3-1.4x and 16 -> 24 a
    // further 3-8%: jobs of at most 4 tokens keep the x window at 4 rows so that five stages fit beside the
    // third group.
    {"bulk 24 warps, jobs of 4 tokens (above 64 tokens: variant 1), 5/5 stages, counters", true, 5, 5, 24, 2, 4, false, false, true},
    // 1: the default of session 7 (493 / 1260 us at T = 16 / 64 against 501 / 1280 for 2)
    {"bulk 16 warps, down 32-row items, 4/5 stages", true, 4, 5, 16, 2, 8},
    {"bulk 16 warps, down 16-row items, 4/8 stages", true, 4, 8, 16, 1, 8},
    {"bulk 8 warps, down 32-row items, 4/5 stages", true, 4, 5, 8, 2, 8},
    {"register kernel", false, 0, 0, 0, 0, 8},
    // 5-8 (session 9, issue #14): session 8's default with padded stage rows and scale rows, with divisions
    // (6: session 8's default itself), with both padding and counters, and with padded stage rows only (the
    // scale rows' 8-40 small copies an item left out). The same items, K slices and sums as 0: the same bits
    // (GpuV4.MoeVariantsBitIdentical). Measured (session 9, mxfp4, T = 16 / 64): padding is SLOWER (5: 443 /
    // 1335, 7: 444 / 1229, 8: 434 / 1200 us against 0: 372 / 1020): the conflicts it removes cost less than the
    // extra copies and address arithmetic.
    {"bulk 24 warps, jobs of 4 tokens, 5/5 stages, padded rows", true, 5, 5, 24, 2, 4, true, true, false},
    {"bulk 24 warps, jobs of 4 tokens, 5/5 stages (divisions)", true, 5, 5, 24, 2, 4, false, false, false},
    {"bulk 24 warps, jobs of 4 tokens, 5/5 stages, padded rows, counters", true, 5, 5, 24, 2, 4, true, true, true},
    {"bulk 24 warps, jobs of 4 tokens, 5/5 stages, padded rows (not scales)", true, 5, 5, 24, 2, 4, true, false,
     false},
};
constexpr int kNumMoeVariants = static_cast<int>(sizeof(kMoeVariants) / sizeof(kMoeVariants[0]));

// The default (variant 0) above 64 tokens takes variant 1's configuration: jobs of 8 tokens decode an expert's
// weights once per 8 of its pairs instead of 4 (at 128 tokens ~3 pairs an expert, so ~1.05 jobs an expert against
// ~1.3). Measured on an H100 (session 21, decode batch 128 on the bulk kernels): 87.9 ms with variant 1 against
// 89.1 with variant 0. The same K slices, so the same bits (GpuV4.MoeVariantsBitIdentical).
constexpr int64_t kMoeJobs4MaxTokens = 64;

const MoeVariant& variant_of(const MoeParams& p) {
  const int v = p.variant >= 0 && p.variant < kNumMoeVariants ? p.variant : 0;
  return kMoeVariants[v == 0 && p.T > kMoeJobs4MaxTokens ? 1 : v];
}

struct BulkPlans {
  MoeBulkPlan up, down;
  bool ok = false;
};

BulkPlans bulk_plans(const MoeParams& p) {
  BulkPlans b;
  const MoeVariant& v = variant_of(p);
  if (!v.bulk || (p.kind != WeightFormat::mxfp4 && p.kind != WeightFormat::nvfp4) || p.T > kMoeBulkMaxTokens ||
      !p.experts_aligned)
    return b;
  // The variant's plan for up or down, with a resident window of `rows` rows (0: none).
  auto plan = [&](bool up, int rows) {
    return plan_moe_bulk(p, up, up ? v.stages_up : v.stages_down, v.consumers, up ? 8 : v.down_mt, v.job_tokens, v.pad,
                         v.pad_scales, v.lean, rows);
  };
  b.up = plan(true, 0);
  b.down = plan(false, 0);
  b.ok = b.up.ok && b.down.ok;
  // The resident windows (MoeBulkPlan::resident) where they fit beside the same ring: the same items, K slices and
  // sums, so the same bits (GpuActFp8Linear.MoeLayoutsBitIdentical).
  if (b.ok && p.resident && v.lean && p.T <= kMoeResidentMaxTokens) {
    const int claim = p.claims ? kMoeClaimSharePct : 100;
    MoeBulkPlan up = plan(true, static_cast<int>(p.T)), down = plan(false, static_cast<int>(p.T * p.k));
    if (up.ok) up.claim_share_pct = claim, b.up = up;
    if (down.ok) down.claim_share_pct = claim, b.down = down;
  }
  return b;
}

}  // namespace

int moe_variant_count() { return kNumMoeVariants; }
const char* moe_variant_name(int variant) {
  return variant >= 0 && variant < kNumMoeVariants ? kMoeVariants[variant].name : "unknown";
}

MoeBulkPlan plan_moe_bulk(const MoeParams& p, bool up, int stages, int consumers, int max_mt, int job_tokens,
                          bool pad, bool pad_scales, bool lean, int resident_rows) {
  MoeBulkPlan pl;
  const int64_t in = up ? p.D : p.inter, out = up ? p.inter : p.D;
  const int64_t row_bytes = in / 2, s_cols = in / (p.kind == WeightFormat::nvfp4 ? 16 : 32);
  const int64_t chunks = in / 128;
  constexpr int64_t kStageWeightBytes = 32 * 1024;  // weight bytes per stage at most (16 rows of 2 KB)
  // K slices as moe_expert_kernel takes them; m-tiles per item: the largest power of two up to max_mt whose
  // rows fit the stage and whose (m-tile, slice) warps fit the consumers. The consumers form
  // consumers / (mt * ks) groups that decode separate items.
  const int ks = dev::moe_k_slices(chunks);
  int mt = 1;
  while (mt * 2 <= max_mt && mt * 2 * ks <= consumers && 16 * (mt * 2) * row_bytes <= kStageWeightBytes) mt *= 2;
  const int units = mt * ks;
  if (16 * row_bytes > kStageWeightBytes || chunks % ks != 0 || consumers > dev::kBulkMaxConsumers ||
      consumers % units != 0 || out % 16 != 0 || s_cols % 4 != 0)
    return pl;
  pl.mt = mt;
  pl.ks = ks;
  pl.consumers = consumers;
  pl.rows_per_item = (up ? 8 : 16) * mt;
  pl.tiles = static_cast<int>((out + pl.rows_per_item - 1) / pl.rows_per_item);
  pl.row_bytes = static_cast<int>(row_bytes);
  pl.s_cols = static_cast<int>(s_cols);
  // Padded (issue_octets): an octet's rows 4-7 64 bytes further than back to back, so half_off is 64
  // modulo 128 (row_bytes % 32 == 0; fp4 rows are whole 64-byte chunks). With pad_scales, scale rows one
  // copy each, 16 bytes further apart, where s_cols is a multiple of 32 (a multiple of 128 at V4-Flash: the
  // conflicting case); an odd multiple of 16 is conflict-free as it is, and smaller rows cannot be copied
  // one by one (16-byte sizes): both stay contiguous.
  pl.lean = lean;
  pl.pad = pad;
  if (pad && row_bytes % 32 != 0) return pl;
  pl.pad_scales = pad && pad_scales && s_cols % 32 == 0;
  pl.half_off = pad ? static_cast<int>(4 * row_bytes + 64) : 0;
  pl.oct_bytes = static_cast<int>(8 * row_bytes + (pad ? 64 : 0));
  pl.s_stride = static_cast<int>(s_cols + (pl.pad_scales ? 16 : 0));
  pl.scale_off = 2 * mt * pl.oct_bytes;
  pl.stage_bytes = (pl.scale_off + 16 * mt * pl.s_stride + 127) / 128 * 128;
  pl.win_stride = dev::XWindow<WeightFormat::mxfp4>::stride(static_cast<int>(in));
  pl.job_tokens = job_tokens;
  pl.resident = resident_rows > 0;
  pl.win_rows = pl.resident ? resident_rows : job_tokens;
  const int win_bytes = pl.win_rows * pl.win_stride;
  const int red_bytes = units * 4 * 32 * static_cast<int>(sizeof(float));  // per ring slot (ks > 1)
  for (int s = stages; s >= 2; --s) {
    const int red_off = s * pl.stage_bytes + win_bytes;
    const int cnt_off = red_off + (ks > 1 ? s * red_bytes : 0);
    // arrived[s], armed[s], slot_item[s], stage_end
    const int bar_off = cnt_off + (3 * s * 4 + 4 + 15) / 16 * 16;
    const int smem = bar_off + 2 * s * 8;
    if (pl.resident && s < stages) return pl;  // the resident window only where the variant's ring still fits
    if (smem <= dev::kBulkMaxSmem) {
      pl.stages = s;
      pl.win_off = s * pl.stage_bytes;
      pl.red_off = red_off;
      pl.cnt_off = cnt_off;
      pl.item_off = cnt_off + 2 * s * 4;
      pl.bar_off = bar_off;
      pl.smem = smem;
      pl.ok = true;
      return pl;
    }
  }
  return pl;
}

bool moe_bulk_taken(const MoeParams& p) { return bulk_plans(p).ok; }

int moe_bulk_job_tokens(const MoeParams& p) { return variant_of(p).job_tokens; }

int64_t moe_workspace_bytes(const MoeParams& p) { return static_cast<int64_t>(MoeLayout(p).total); }

const char* moe_path_name(const MoeParams& p) {
  const BulkPlans bulk = bulk_plans(p);
  if (!bulk.ok) return "moe_plan + moe_expert up/down + moe_combine";
  // One name per variant and layout (resident up, resident down, claimed items: 8 forms), built once:
  // the bulk kernels and what the variant and the layout change in them.
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const MoeVariant& v : kMoeVariants)
      for (int form = 0; form < 8; ++form) {
        std::string what = "bulk-copy ring, jobs of " + std::to_string(v.job_tokens) + " tokens";
        if (v.pad) what += v.pad_scales ? ", padded rows" : ", padded rows (not scales)";
        if (v.lean) what += ", counters";
        if (form & 3) {
          what += std::string(", resident windows (") + ((form & 3) == 3 ? "up and down" : form & 1 ? "up" : "down");
          what += form & 4 ? ", items claimed past half)" : ")";
        }
        n.push_back("moe_plan + moe_bulk up/down (" + what + ") + moe_combine");
      }
    return n;
  }();
  const bool claims = (bulk.up.resident && bulk.up.claim_share_pct < 100) ||
                      (bulk.down.resident && bulk.down.claim_share_pct < 100);
  const int form = (bulk.up.resident ? 1 : 0) | (bulk.down.resident ? 2 : 0) | (claims ? 4 : 0);
  return names[8 * (&variant_of(p) - kMoeVariants) + form].c_str();
}

namespace {

void launch_moe_plan(const MoeParams& p, int tile, int* sorted, int* pos, int* jobs, int* num_jobs,
                     cudaStream_t stream) {
  if (p.route.logits == nullptr && p.x_from == nullptr) {
    if (p.small_plan && p.E <= dev::kPlanThreadsSmall)
      launch(dev::moe_plan_kernel_small, 1, dev::kPlanThreadsSmall, 0, stream, p.indices, p.T * p.k, p.E, tile, sorted,
             pos, jobs, num_jobs, p.err);
    else
      launch(dev::moe_plan_kernel, 1, dev::kPlanThreads, 0, stream, p.indices, p.T * p.k, p.E, tile, sorted, pos,
             jobs, num_jobs, p.err);
    return;
  }
  TERN_CHECK(moe_prep_supported(p.T, p.E), "launch_moe: the plan kernel routes and quantises x for up to ",
             moe_prep_max_tokens(), " tokens and ", dev::kPlanThreadsSmall, " experts (", p.T, " / ", p.E, ")");
  TERN_CHECK(p.route.logits == nullptr || p.route.tid2eid != nullptr || route_in_registers(p.E, p.k),
             "launch_moe: the plan kernel routes ", p.E, " experts / ", p.k, " picks only on the register kernel's shape");
  TERN_CHECK(p.x_from == nullptr || p.D % 128 == 0, "launch_moe: x quantised in the plan kernel needs D % 128 == 0");
  dev::PrepArgs a{p.route, p.T, p.E, p.k, tile, p.indices, sorted, pos, jobs, num_jobs, p.err, p.x_from,
                  const_cast<float*>(p.x), p.D};
  const int64_t items = p.x_from != nullptr ? p.T * (p.D / 128) : 0;
  constexpr int64_t kWarps = dev::kPlanThreadsSmall / 32;
  const auto blocks = static_cast<unsigned>(1 + (items + kWarps - 1) / kWarps);
  launch(dev::moe_prep_kernel, blocks, dev::kPlanThreadsSmall, 0, stream, a);
}

}  // namespace

void quantize_moe_h(const MoeParams& p, float* h, int64_t rows, cudaStream_t stream) {
  if (!p.act_fp8) return;
  launch_act_fake_quant(ActRows{h, rows, p.inter, p.inter}, h, p.inter, stream);
}

void launch_moe_combine(const MoeParams& p, const float* y, const int* pos, cudaStream_t stream) {
  // Four d a thread where every row starts 16-byte aligned (y, residual and out rows of D floats; D % 4 == 0 for
  // every V4 shape), else one.
  const auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  const bool by4 = p.D % 4 == 0 && aligned(y) && aligned(p.out) && (p.residual == nullptr || aligned(p.residual));
  const int64_t total = p.T * (by4 ? p.D / 4 : p.D);
  const int blocks = static_cast<int>(std::min<int64_t>((total + 255) / 256, 65535));
  if (p.combine_waits != nullptr) TERN_CUDA(cudaStreamWaitEvent(stream, p.combine_waits, 0));
  if (by4)
    launch(dev::moe_combine_kernel<4>, blocks, 256, 0, stream, y, pos, p.weights, p.T, p.k, p.D, p.residual, p.out);
  else
    launch(dev::moe_combine_kernel<1>, blocks, 256, 0, stream, y, pos, p.weights, p.T, p.k, p.D, p.residual, p.out);
}

void launch_moe(const MoeParams& p, void* workspace, int num_sms, cudaStream_t stream) {
  if (p.T == 0) return;
  const MoeLayout L(p);
  const BulkPlans bulk = bulk_plans(p);
  TERN_CHECK((!p.stage_quant && !p.stage_quant_h) || bulk.ok,
             "launch_moe: x or h quantised as staged need the bulk kernels (moe_bulk_taken)");
  char* ws = static_cast<char*>(workspace);
  launch_moe_plan(p, static_cast<int>(L.tile), reinterpret_cast<int*>(ws + L.sorted), reinterpret_cast<int*>(ws + L.pos),
                  reinterpret_cast<int*>(ws + L.jobs), reinterpret_cast<int*>(ws + L.num_jobs), stream);
  if (bulk.ok && p.kind == WeightFormat::mxfp4) {
    launch_moe_bulk<WeightFormat::mxfp4>(p, L, bulk.up, bulk.down, num_sms, ws, stream);
  } else if (bulk.ok) {
    launch_moe_bulk<WeightFormat::nvfp4>(p, L, bulk.up, bulk.down, num_sms, ws, stream);
  } else {
    switch (p.kind) {
      case WeightFormat::f32: launch_moe_experts<WeightFormat::f32>(p, L, ws, stream); break;
      case WeightFormat::bf16: launch_moe_experts<WeightFormat::bf16>(p, L, ws, stream); break;
      case WeightFormat::fp8_block: launch_moe_experts<WeightFormat::fp8_block>(p, L, ws, stream); break;
      case WeightFormat::mxfp4: launch_moe_experts<WeightFormat::mxfp4>(p, L, ws, stream); break;
      case WeightFormat::nvfp4: launch_moe_experts<WeightFormat::nvfp4>(p, L, ws, stream); break;
    }
  }
  launch_moe_combine(p, reinterpret_cast<const float*>(ws + L.y), reinterpret_cast<const int*>(ws + L.pos), stream);
}

}  // namespace tern::cuda
