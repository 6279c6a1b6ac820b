// The steps both prefill attention kernels (attention_prefill.cu, mma.sync; attention_prefill_wgmma.cu, wgmma)
// take the same way (nvcc only): a round's row lookups and the query's q rounded to bf16 into shared memory.
// Only where q lands differs (a padded row layout for ldmatrix, a 128-byte-swizzled one for wgmma), so the
// caller passes the byte offset of (head, dim).
#pragma once

#include "backends/cuda/kernels/act_quant_dev.cuh"
#include "backends/cuda/kernels/attention_keys.cuh"
#include "backends/cuda/kernels/attention_tile.cuh"
#include "backends/cuda/kernels/norm_dev.cuh"
#include "backends/cuda/kernels/rope_dev.cuh"

namespace tern::cuda::dev {

constexpr int kPrefillLookups = 3;                          // row addresses a thread looks up per round
constexpr int kPrefillRound = kPrefillLookups * kTileThreads;  // keys whose rows are looked up at once

// The round's row addresses (keys jr .. jr + nr - 1 of query i), all lookups of a thread in flight together,
// then stored into sRows. The caller orders this against the previous readers of sRows and syncs after.
__device__ __forceinline__ void lookup_round(const AttentionParams& a, int64_t i, const KeyList& kl, int64_t jr,
                                             int nr, int tid, const uint8_t** sRows) {
  const uint8_t* found[kPrefillLookups];
#pragma unroll
  for (int u = 0; u < kPrefillLookups; ++u) {
    const int r = tid + u * kTileThreads;
    found[u] = r < nr ? key_row(a, i, kl, jr + r) : nullptr;
  }
#pragma unroll
  for (int u = 0; u < kPrefillLookups; ++u) sRows[tid + u * kTileThreads] = found[u];
}

// load_q_bf16 where q is as wq_b wrote it (AttentionParams::q_inv_freq): a warp a head, kAtOnce heads at once (lane
// holds dims lane + 32 c, as norm_rope_kernel's rows), normed by rms_norm_lanes with unit weights and the rope pairs
// rotated by rope_rotate (a pair's two dims sit in lanes l and l ^ 1), then rounded to bf16: the bits of
// norm_rope then load_q_bf16. kAtOnce x HD / 32 loads of a lane in flight (32 KiB a block, half the plain load's: 4
// heads at once spilled registers of the wgmma kernel; q is mostly in L2: the block one wave ahead prefetched it).
// A lane's rotation angles are the same in every head: its sines and cosines are computed once a query (session 30's
// first fold took sincosf a head, 64 times as many, in the block's exposed prologue: +3% a prefill).
constexpr int kQRopeCols = 4;  // the lane columns the rope dims may occupy: the last 128 (attention_q_norm_in_kernel)
// Two heads a warp in flight (four in version 5, whose accumulators are not yet live there, measured 1.3% slower a
// layer: session 35).
template <int HD, typename QAt>
__device__ __forceinline__ void load_q_normed_bf16(const AttentionParams& a, int64_t i, int heads, int tid, uint8_t* sQ,
                                                   QAt q_at) {
  constexpr int kCols = HD / 32, kWarps = kTileThreads / 32, kAtOnce = 2, kRope0 = kCols - kQRopeCols;
  static_assert(HD % 32 == 0 && kCols >= kQRopeCols && kTileHeads % (kWarps * kAtOnce) == 0, "whole heads a warp");
  const int warp = tid >> 5, lane = tid & 31;
  const float* src = a.q + i * a.heads * HD;
  const float position = static_cast<float>(a.q_positions[i]);
  const int first = HD - 2 * static_cast<int>(a.q_rope_half);
  float sn[kQRopeCols], cs[kQRopeCols];  // column kRope0 + k's rotation (identity outside the rope dims)
#pragma unroll
  for (int k = 0; k < kQRopeCols; ++k) {
    const int d = lane + 32 * (kRope0 + k);
    sn[k] = 0.0f, cs[k] = 1.0f;
    if (d >= first) sincosf(a.q_inv_freq[(d - first) >> 1] * position, &sn[k], &cs[k]);
  }
  float ones[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) ones[c] = 1.0f;
#pragma unroll 1
  for (int h0 = warp * kAtOnce; h0 < kTileHeads; h0 += kWarps * kAtOnce) {
    float v[kAtOnce][kCols];
#pragma unroll
    for (int u = 0; u < kAtOnce; ++u)
#pragma unroll
      for (int c = 0; c < kCols; ++c) v[u][c] = h0 + u < heads ? __ldg(src + (h0 + u) * HD + lane + 32 * c) : 0.0f;
#pragma unroll
    for (int u = 0; u < kAtOnce; ++u) {
      const int h = h0 + u;
      if (h < heads) rms_norm_lanes(v[u], ones, a.q_norm_eps);  // (warp-uniform)
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int d = lane + 32 * c;
        if (c >= kRope0) {
          const float partner = __shfl_xor_sync(0xffffffffu, v[u][c], 1);
          if (h < heads && d >= first) {  // pair (d - first) / 2: x0 at the even dim, x1 at the odd one
            const bool even = (lane & 1) == 0;
            float pair[2] = {even ? v[u][c] : partner, even ? partner : v[u][c]};
            rope_rotate(pair, sn[c - kRope0], cs[c - kRope0]);
            v[u][c] = even ? pair[0] : pair[1];
          }
        }
        const float next = __shfl_xor_sync(0xffffffffu, v[u][c], 1);
        if ((lane & 1) == 0) *reinterpret_cast<uint32_t*>(sQ + q_at(h, d)) = pack_bf16(v[u][c], next);
      }
    }
  }
}

// Query i's q as bf16 into sQ at byte offset q_at(head, dim) (dim a multiple of 4; heads past `heads` are
// zeros): kBatch float4 of a thread loaded before any is stored, so 64 KiB of q is in flight per block. With
// AttentionParams::q_inv_freq, load_q_normed_bf16.
template <int HD, typename QAt>
__device__ __forceinline__ void load_q_bf16(const AttentionParams& a, int64_t i, int heads, int tid, uint8_t* sQ,
                                            QAt q_at) {
  if (a.q_inv_freq != nullptr) {
    load_q_normed_bf16<HD>(a, i, heads, tid, sQ, q_at);
    return;
  }
  const float4* src = reinterpret_cast<const float4*>(a.q + i * a.heads * HD);
  constexpr int kPer = kTileHeads * HD / 4 / kTileThreads;  // float4 of padded q per thread
  constexpr int kBatch = kPer < 16 ? kPer : 16;
  static_assert(kPer % kBatch == 0, "q batches");
#pragma unroll 1
  for (int b0 = 0; b0 < kPer; b0 += kBatch) {
    float4 v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int idx = tid + kTileThreads * (b0 + u), h = idx / (HD / 4);
      v[u] = h < heads ? __ldg(src + idx) : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int idx = tid + kTileThreads * (b0 + u), h = idx / (HD / 4), c = idx % (HD / 4);
      *reinterpret_cast<uint2*>(sQ + q_at(h, 4 * c)) = make_uint2(pack_bf16(v[u].x, v[u].y), pack_bf16(v[u].z, v[u].w));
    }
  }
}

// One online-softmax step of the wgmma prefill kernels (versions 2-4; nvcc only) for row g (hf 0) or g + 8 (hf 1) of
// a thread's S accumulators over a tile of N keys (s[4j + 2hf + e]: key 8j + 2t + e, j < N / 8; scaled to base 2,
// masked keys -inf), given the row's maximum over the tile's keys (tmax): the running max, P = 2^(s - m) rounded to
// bf16 into the A fragments of P V (pa[j / 2][2 (j % 2) + hf]: k step j / 2, columns 0..7 of it for even j, 8..15
// odd) and to p_out(j, pair), the row sum over the rounded values, and O rescaled.
template <int N, int kNC, typename PairOut>
__device__ __forceinline__ void softmax_step(const float (&s)[N / 2], int hf, float tmax, float& m_run, float& l_run,
                                             float (&o)[kNC][32], uint32_t (&pa)[N / 16][4], PairOut p_out) {
  const float m_new = fmaxf(m_run, tmax);
  const float m_use = m_new == -INFINITY ? 0.0f : m_new;
  const float corr = exp2f(m_run - m_use);
  m_run = m_new;
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
    const uint32_t p2 = pack_bf16(exp2f(s[4 * j + 2 * hf] - m_use), exp2f(s[4 * j + 2 * hf + 1] - m_use));
    sum += __uint_as_float(p2 << 16) + __uint_as_float(p2 & 0xffff0000u);
    pa[j >> 1][2 * (j & 1) + hf] = p2;
    p_out(j, p2);
  }
  l_run = l_run * corr + sum;
#pragma unroll
  for (int c = 0; c < kNC; ++c)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      o[c][4 * j + 2 * hf] *= corr;
      o[c][4 * j + 2 * hf + 1] *= corr;
    }
}

// The end of a query in the wgmma prefill kernels (versions 2-4; nvcc only): thread (wg, wq, g, t) holds o[c], heads
// x dims 64 (wg * HD/128 + c) .. +63 in the m64n64 accumulator layout (o[c][4j + 2hf + e]: head 16wq + g + 8hf, dim
// 8j + 2t + e of the chunk), m_run the running maxima of its rows g, g + 8 (base 2), l_row their sums over every key.
// No block-wide barrier in here: version 4's producer warps have returned by the time its consumers come here.
// What the epilogue of query i reads from global memory, read in the kernel's prologue into shared memory (version 5,
// session 34), so that the end of every query does not wait on those loads and on sincosf: the sinks (base 2, head
// h < kTileHeads; 0 past the heads, as the epilogue takes them) and the output's rope pairs' sines and cosines (the
// head's last 64 dims: pair k = dims HD - 64 + 2k, k < 32; pairs before the rope dims not written), rope_sincos's
// values. Thread k of the caller's (k < 64 used).
struct EpilogueTables {
  float2* sincos;  // [32]
  float* sinks;    // [kTileHeads]
};
template <int HD>
__device__ __forceinline__ void prefill_epilogue_tables(const AttentionParams& a, int64_t i, int heads, int k,
                                                        EpilogueTables tb) {
  if (k < kTileHeads) tb.sinks[k] = k < heads ? a.sinks[k] * kLog2e : 0.0f;
  if (a.out_inv_freq == nullptr || k >= 32) return;
  const int d = HD - 64 + 2 * k, first = HD - 2 * static_cast<int>(a.out_rope_half);
  if (d < first) return;
  float sn, cs;
  rope_sincos(a.out_inv_freq[(d - first) >> 1], a.out_positions[i], /*inverse=*/true, &sn, &cs);
  tb.sincos[k] = make_float2(sn, cs);
}

// tables: prefill_epilogue_tables's for this query, or null ones (the sinks and sines read and computed here).
template <int HD>
__device__ __forceinline__ void prefill_epilogue(const AttentionParams& a, int64_t i, float (&o)[HD / 128][32],
                                                 const float (&m_run)[2], const float (&l_row)[2], int wg, int wq,
                                                 int g, int t, int heads, EpilogueTables tables = {nullptr, nullptr}) {
  constexpr int kNC = HD / 128;
  // out = O 2^(m - top) / (l 2^(m - top) + 2^(sink - top)), top = max(m, sink); l the row's sum over every key
  // (l_row). With a.out_inv_freq the rope dims rotated back (a pair is e = 0, 1 of one thread's dims 8j + 2t), with a.out_q
  // quantised 1x128 (act_quant_lane's arithmetic: a 128-column block of a head is chunks c, c + 1 of one warpgroup,
  // its 128 values in one quad).
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const float l = l_row[hf];
    const int row = 16 * wq + 8 * hf + g;
    const float m = m_run[hf];
    const float sink = tables.sinks != nullptr ? tables.sinks[row] : row < heads ? a.sinks[row] * kLog2e : 0.0f;
    const float top = fmaxf(m, sink);
    const float keep = exp2f(m - top);
    const float w = keep / (l * keep + exp2f(sink - top));
#pragma unroll
    for (int c = 0; c < kNC; ++c)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        o[c][4 * j + 2 * hf] *= w;
        o[c][4 * j + 2 * hf + 1] *= w;
      }
  }
  // The rope dims, the last 2 out_rope_half <= 64 of a head (attention_out_in_kernel): warpgroup 1's last chunk
  // alone, one angle a pair of dims for both of a thread's heads. Session 30 rotated every pair of every chunk under
  // a per-pair test: 64 inlined precise sincosf, an epilogue of ~17 000 instructions, +1.6 ms a layer at 8K (H100).
  if (a.out_inv_freq != nullptr && wg == 1) {
    const float2* sincos = tables.sincos;
    const int64_t position = sincos != nullptr ? 0 : a.out_positions[i];
    const int first = HD - 2 * static_cast<int>(a.out_rope_half);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int d = HD - 64 + 8 * j + 2 * t;
      if (d < first) continue;
      float sn, cs;
      if (sincos != nullptr) {
        const float2 v = sincos[4 * j + t];  // pair (d - (HD - 64)) / 2
        sn = v.x, cs = v.y;
      } else {
        rope_sincos(a.out_inv_freq[(d - first) >> 1], position, /*inverse=*/true, &sn, &cs);
      }
      rope_rotate(&o[kNC - 1][4 * j], sn, cs);
      rope_rotate(&o[kNC - 1][4 * j + 2], sn, cs);
    }
  }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int row = 16 * wq + 8 * hf + g;
    const bool valid = row < heads;  // (alike in a quad; every lane reaches the quad's shuffles below)
    if (a.out_q == nullptr) {
      if (!valid) continue;
      float* dst = a.out + (i * a.heads + row) * HD + 2 * t;
#pragma unroll
      for (int c = 0; c < kNC; ++c)
#pragma unroll
        for (int j = 0; j < 8; ++j)
          *reinterpret_cast<float2*>(dst + 64 * (wg * kNC + c) + 8 * j) =
              make_float2(o[c][4 * j + 2 * hf], o[c][4 * j + 2 * hf + 1]);
      continue;
    }
    uint8_t* qdst = a.out_q + (i * a.heads + row) * HD + 2 * t;
#pragma unroll
    for (int c0 = 0; c0 < kNC; c0 += 2) {
      float amax = 0.0f;
#pragma unroll
      for (int c = c0; c < c0 + 2; ++c)
#pragma unroll
        for (int j = 0; j < 8; ++j)
          amax = fmaxf(amax, fmaxf(fabsf(o[c][4 * j + 2 * hf]), fabsf(o[c][4 * j + 2 * hf + 1])));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
      const int k = fp8_scale_exponent(amax);
      const float inv = ldexpf(1.0f, -k);  // x / 2^k == x * 2^-k exactly (act_quant_lane)
      if (!valid) continue;
#pragma unroll
      for (int c = c0; c < c0 + 2; ++c)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const uint32_t q0 = __nv_cvt_float_to_fp8(o[c][4 * j + 2 * hf] * inv, __NV_SATFINITE, __NV_E4M3);
          const uint32_t q1 = __nv_cvt_float_to_fp8(o[c][4 * j + 2 * hf + 1] * inv, __NV_SATFINITE, __NV_E4M3);
          *reinterpret_cast<uint16_t*>(qdst + 64 * (wg * kNC + c) + 8 * j) = static_cast<uint16_t>(q0 | (q1 << 8));
        }
      if (t == 0)
        a.out_scales[((row * HD + 64 * (wg * kNC + c0)) / 128) * a.out_scale_ld + i] = ldexpf(1.0f, k);
    }
  }
}

}  // namespace tern::cuda::dev
