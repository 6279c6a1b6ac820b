// The warp-level tensor-core core of every weight-streaming product (linear, grouped linear, MoE
// experts): one warp computes MT m-tiles of 16 weight rows against NT n-tiles of 8 tokens with
// mma.sync.m16n8k16 (bf16 operands, f32 accumulation), dequantizing the weights in registers.
//
// Weights are the A operand ("swap AB": the many weight rows fill M, the few tokens N), so a decode step
// with one token wastes no weight bytes. The order of the k (column) index inside one mma does not
// matter as long as A and B use the same one, so each lane of a quad reads its OWN run of contiguous
// columns (16 B of FP8 / FP4 per row, 32 B of bf16) and feeds them to the k slots it owns; the x values
// are picked with the same permutation. Exactness: e4m3, e2m1 and their block scales (e8m0, ue4m3) are
// converted to bf16 exactly (bit placement, then one exact multiply by a power of two or a 4-bit
// scale); only x is rounded to bf16. To keep every product inside bf16's range the weights are held as
// W * 2^-16 and the final sum multiplied by Fmt::out_mult (and NVFP4's global scale).
#pragma once

#include <type_traits>
#include <utility>

#include "backends/cuda/kernels/device_common.cuh"
#include "ops/weight_format.h"

namespace tern::cuda::dev {

using ops::WeightFormat;  // the kernels' template parameter is the ops' format (ops/weight_format.h)

// kChunk: columns one quad (4 lanes) covers per iteration; kLaneCols: columns per lane; kLaneBytes: weight
// bytes per lane per row; kSteps: mma k-steps per chunk (kLaneCols / 4).
template <WeightFormat F> struct Fmt;
template <> struct Fmt<WeightFormat::f32> { static constexpr int kChunk = 64, kLaneCols = 16, kLaneBytes = 64; };
template <> struct Fmt<WeightFormat::bf16> { static constexpr int kChunk = 64, kLaneCols = 16, kLaneBytes = 32; };
template <> struct Fmt<WeightFormat::fp8_block> { static constexpr int kChunk = 64, kLaneCols = 16, kLaneBytes = 16; };
template <> struct Fmt<WeightFormat::mxfp4> { static constexpr int kChunk = 128, kLaneCols = 32, kLaneBytes = 16; };
template <> struct Fmt<WeightFormat::nvfp4> { static constexpr int kChunk = 128, kLaneCols = 32, kLaneBytes = 16; };

constexpr float kWeightShift = 65536.0f;  // weights are held as W * 2^-16 in scaled formats

template <WeightFormat F>
constexpr bool is_scaled() {
  return F == WeightFormat::fp8_block || F == WeightFormat::mxfp4 || F == WeightFormat::nvfp4;
}

// One weight matrix as the kernels read it.
struct MatRef {
  const uint8_t* w = nullptr;  // row-major raw bytes
  const uint8_t* s = nullptr;  // scales: fp8 [ceil(out/128), ceil(in/128)] e8m0|f32; fp4 [out, in/block]
  int64_t in = 0;              // columns
  int64_t s_cols = 0;          // scale columns
  int scale_f32 = 0;           // fp8 scales stored as f32
  float out_mult = 1.0f;       // applied to the sum: 2^16 for scaled formats, times NVFP4's global scale
};

__device__ __forceinline__ uint4 ldg_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t bf16_mul2(uint32_t a, uint32_t m) {
  __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162*>(&a), y = *reinterpret_cast<__nv_bfloat162*>(&m);
  __nv_bfloat162 r = __hmul2(x, y);
  return *reinterpret_cast<uint32_t*>(&r);
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// Two e4m3 bytes of `word` as bf16x2 holding e4m3 * 2^-120, exactly. `sel` is a prmt selector giving
// [b_lo, sign(b_lo) x 8, b_hi, sign(b_hi) x 8] (prmt's sign-replicate mode); shifted left by 4, each half
// then has the magnitude bits at 4..10 and a copy of the sign at 15, and the mask drops the rest.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2_raw(uint32_t word, uint32_t sel) {
  return (prmt(word, 0u, sel) << 4) & 0x87F087F0u;
}

__device__ __forceinline__ uint32_t bf16x2_splat(float v) { return pack_bf16(v, v); }

// Nibbles i and i+4 of `word` as bf16x2 holding e2m1 * 2^-126, exactly (nibble i in the low half): the
// magnitude bits go to 6..8 (exponent low bits + top mantissa bit), the sign to 15. The pair sits at bit
// 4*(i%2) of each half of word (i >= 2: of word >> 8, shared by both); one multiply by 2^a + 2^b places two
// copies of it, a magnitude copy and a sign copy (the two terms never overlap, so no carry), and the mask
// keeps those bits: 3 instructions a pair where separate shifts of magnitude and sign take 4.
template <int I>
__device__ __forceinline__ uint32_t e2m1x2_to_bf16x2_raw(uint32_t word) {
  const uint32_t w = I >= 2 ? word >> 8 : word;
  const uint32_t v = w & (0x000F000Fu << (4 * (I % 2)));
  return (v * (I % 2 == 0 ? 0x1040u : 0x104u)) & 0x81C081C0u;  // I%2 == 0: x(2^6 + 2^12), else x(2^2 + 2^8)
}

// bf16x2 multiplier (both halves) of an e8m0 scale for e2m1 raw values (2^-126): 2^(e-127) * 2^110 =
// 2^(e-17) straight from the bits (exponent field e + 110; inf where the f32 product overflows, e > 144; NaN
// for 0xff): the bits of bf16x2_splat(e8m0_to_f32(e) * 0x1p110f) without its branches.
__device__ __forceinline__ uint32_t e8m0_mult_bf16x2(uint32_t e) {
  const uint32_t h = e == 0xffu ? 0x7fc0u : min(e + 110u, 255u) << 7;
  return h * 0x10001u;
}

// Multipliers of two ue4m3 scales (bits 0..7 and 8..15 of `two`) for e2m1 raw values: ue4m3 * 2^110, through
// the hardware e4m3 -> f16 conversion (exact, subnormals included); a set sign bit (invalid in ue4m3) reads
// as NaN, as in ue4m3_to_f32.
__device__ __forceinline__ void ue4m3x2_mult_bf16x2(uint32_t two, uint32_t (&m)[2]) {
  uint32_t h2;
  asm("{\n .reg .b16 s;\n cvt.u16.u32 s, %1;\n cvt.rn.f16x2.e4m3x2 %0, s;\n}" : "=r"(h2) : "r"(two));
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h2));
  m[0] = bf16x2_splat((two & 0x80u) ? nan_f32() : f.x * 0x1p110f);
  m[1] = bf16x2_splat((two & 0x8000u) ? nan_f32() : f.y * 0x1p110f);
}


// Raw weight bytes of one lane for one row of one chunk.
template <WeightFormat F>
struct LaneRow {
  uint4 v[Fmt<F>::kLaneBytes / 16];
};

template <WeightFormat F>
__device__ __forceinline__ void load_lane_row(LaneRow<F>& r, const uint8_t* row, int64_t col) {
  constexpr int kN = Fmt<F>::kLaneBytes / 16;
  if (row == nullptr) {
#pragma unroll
    for (int i = 0; i < kN; ++i) r.v[i] = make_uint4(0, 0, 0, 0);
    return;
  }
  const uint8_t* p;
  if constexpr (F == WeightFormat::f32) p = row + col * 4;
  else if constexpr (F == WeightFormat::bf16) p = row + col * 2;
  else if constexpr (F == WeightFormat::fp8_block) p = row + col;
  else p = row + col / 2;
#pragma unroll
  for (int i = 0; i < kN; ++i) r.v[i] = ldg_stream(p + 16 * i);
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The A pair (P = 0: k slots 2t,2t+1; P = 1: 2t+8,2t+9) of k-step S from one lane's raw row; `m` holds the
// bf16x2 scale multiplier(s) of scaled formats (nvfp4: m[0] for the first 16 columns, m[1] for the rest).
template <WeightFormat F, int S, int P>
__device__ __forceinline__ uint32_t a_pair(const LaneRow<F>& r, const uint32_t (&m)[2]) {
  if constexpr (F == WeightFormat::f32) {
    // 16 floats in 4 uint4: pair = floats 4S+2P, 4S+2P+1
    const uint4& v = r.v[S];
    return P == 0 ? pack_bf16(__uint_as_float(v.x), __uint_as_float(v.y))
                  : pack_bf16(__uint_as_float(v.z), __uint_as_float(v.w));
  } else if constexpr (F == WeightFormat::bf16) {
    return word_of(r.v[(2 * S + P) / 4], (2 * S + P) % 4);
  } else if constexpr (F == WeightFormat::fp8_block) {
    const uint32_t w = word_of(r.v[0], S);
    return bf16_mul2(e4m3x2_to_bf16x2_raw(w, P == 0 ? 0x9180u : 0xB3A2u), m[0]);
  } else {
    const uint32_t w = word_of(r.v[0], S / 2);
    const uint32_t raw = e2m1x2_to_bf16x2_raw<2 * (S % 2) + P>(w);
    if constexpr (F == WeightFormat::mxfp4) return bf16_mul2(raw, m[0]);
    else return bf16_mul2(raw, m[S / 4]);
  }
}

// Scale multipliers of one row for the chunk at `col0` (lane's first column `lcol`).
template <WeightFormat F>
__device__ __forceinline__ void row_scales(const MatRef& w, const uint8_t* srow, int64_t col0, int64_t lcol,
                                           uint32_t (&m)[2]) {
  if constexpr (F == WeightFormat::fp8_block) {
    // srow: the scale row of the warp's 128-row block; one scale per 128 columns.
    const int64_t j = col0 / 128;
    const float s = w.scale_f32 ? reinterpret_cast<const float*>(srow)[j] : e8m0_to_f32(srow[j]);
    m[0] = bf16x2_splat(s * 0x1p104f);  // e4m3 raw is 2^-120: W * 2^-16
    m[1] = m[0];
  } else if constexpr (F == WeightFormat::mxfp4) {
    if (srow == nullptr) { m[0] = m[1] = 0; return; }
    m[0] = e8m0_mult_bf16x2(srow[lcol / 32]);  // e2m1 raw is 2^-126
    m[1] = m[0];
  } else if constexpr (F == WeightFormat::nvfp4) {
    if (srow == nullptr) { m[0] = m[1] = 0; return; }
    const uint8_t* s = srow + lcol / 16;
    ue4m3x2_mult_bf16x2(s[0] | (static_cast<uint32_t>(s[1]) << 8), m);
  } else {
    m[0] = m[1] = 0;
  }
}

template <typename Fn, int... I>
__device__ __forceinline__ void static_for_impl(Fn&& fn, std::integer_sequence<int, I...>) {
  (fn(std::integral_constant<int, I>{}), ...);
}
// fn(std::integral_constant<int, i>) for i = 0 .. N-1, unrolled.
template <int N, typename Fn>
__device__ __forceinline__ void static_for(Fn&& fn) {
  static_for_impl(fn, std::make_integer_sequence<int, N>{});
}

// B pairs of k-step S for one token row (x already offset to the lane's first column).
template <WeightFormat F, int S>
__device__ __forceinline__ void b_pairs(const float* x, uint32_t& b0, uint32_t& b1) {
  if (x == nullptr) {
    b0 = b1 = 0;
    return;
  }
  if constexpr (F == WeightFormat::mxfp4 || F == WeightFormat::nvfp4) {
    constexpr int c = 8 * (S / 2) + 2 * (S % 2);
    const float2 lo = *reinterpret_cast<const float2*>(x + c);
    const float2 hi = *reinterpret_cast<const float2*>(x + c + 4);
    b0 = pack_bf16(lo.x, hi.x);
    b1 = pack_bf16(lo.y, hi.y);
  } else {
    const float4 v = *reinterpret_cast<const float4*>(x + 4 * S);
    b0 = pack_bf16(v.x, v.y);
    b1 = pack_bf16(v.z, v.w);
  }
}

// One warp's product over columns [k_begin, k_end) (multiples of Fmt<F>::kChunk):
//   acc[m][n] += W_m[rows g, g+8][k] * x_n[k]      (g = lane / 4; C fragment: c0,c1 row g, c2,c3 row g+8,
//                                                    tokens 2t, 2t+1 of the n-tile, t = lane % 4)
// wrow[m][r]: start of weight row (g + 8r) of m-tile m, or nullptr past the matrix; srow[m][r]: its scale
// row (fp4), or the 128-row block's scale row (fp8); xrow[n]: this lane's token row (token 8n + g), offset
// to the matrix's first column (16-byte aligned), or nullptr for padding tokens.
template <WeightFormat F, int MT, int NT>
__device__ __forceinline__ void warp_mma(const MatRef (&mat)[MT], const uint8_t* const (&wrow)[MT][2],
                                         const uint8_t* const (&srow)[MT][2], const float* const (&xrow)[NT],
                                         int64_t k_begin, int64_t k_end, float (&acc)[MT][NT][4]) {
  using Tr = Fmt<F>;
  constexpr int kSteps = Tr::kLaneCols / 4;
  // Chunks whose weight loads are all issued before any of them is used: decode is latency-bound, so a
  // warp keeps G * MT * 2 * kLaneBytes bytes in flight (4 KB for FP8 / FP4 with MT = 2).
  constexpr int G = Tr::kLaneBytes <= 16 ? 4 : Tr::kLaneBytes <= 32 ? 2 : 1;
  const int t = threadIdx.x & 3;
#pragma unroll 1
  for (int64_t k = k_begin; k < k_end; k += G * Tr::kChunk) {
    LaneRow<F> raw[G][MT][2];
    uint32_t msc[G][MT][2][2];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int64_t kk = k + g * Tr::kChunk;
      if (kk >= k_end) break;
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) load_lane_row<F>(raw[g][m][r], wrow[m][r], kk + t * Tr::kLaneCols);
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int64_t kk = k + g * Tr::kChunk;
      if (kk >= k_end) break;
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        row_scales<F>(mat[m], srow[m][0], kk, kk + t * Tr::kLaneCols, msc[g][m][0]);
        if constexpr (F == WeightFormat::fp8_block) {  // one scale per 128x128 block: both rows share it
          msc[g][m][1][0] = msc[g][m][0][0];
          msc[g][m][1][1] = msc[g][m][0][1];
        } else {
          row_scales<F>(mat[m], srow[m][1], kk, kk + t * Tr::kLaneCols, msc[g][m][1]);
        }
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int64_t kk = k + g * Tr::kChunk;
      if (kk >= k_end) break;
      const int64_t lcol = kk + t * Tr::kLaneCols;
      static_for<kSteps>([&](auto sc) {
        constexpr int S = decltype(sc)::value;
        uint32_t b[NT][2];
#pragma unroll
        for (int n = 0; n < NT; ++n)
          b_pairs<F, S>(xrow[n] == nullptr ? nullptr : xrow[n] + lcol, b[n][0], b[n][1]);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          const uint32_t a0 = a_pair<F, S, 0>(raw[g][m][0], msc[g][m][0]);
          const uint32_t a1 = a_pair<F, S, 0>(raw[g][m][1], msc[g][m][1]);
          const uint32_t a2 = a_pair<F, S, 1>(raw[g][m][0], msc[g][m][0]);
          const uint32_t a3 = a_pair<F, S, 1>(raw[g][m][1], msc[g][m][1]);
#pragma unroll
          for (int n = 0; n < NT; ++n) mma_bf16(acc[m][n], a0, a1, a2, a3, b[n][0], b[n][1]);
        }
      });
    }
  }
}

// Split-K without atomics on the sums: every block of a (row tile, token tile) stores its K split's partial
// sums (partial[split][T][out]), then the LAST block to arrive adds the splits in split order (times `mult`)
// into y and returns the tile's arrival counter to zero, so the result is the same bits whichever block
// arrives last (graph replays equal eager runs). Called by every thread of the block; thread i sums the
// (row, token) items i, i + blockDim.x, ... (row tile_row0 + item % rows_per_tile, token tok0 + item /
// rows_per_tile), V consecutive rows an item. The adder is on every split product's critical path: it holds two
// items' loads of 8 splits in flight, then adds each item's values in split order (the same bits). Against one load
// then one add a split: -3 to -3.5 us a split linear_x8 product at 64 tokens (8 items a thread), nothing at 1 or 16
// tokens (H200, results.md session 24). V = 4 (float4 loads and stores; rows_per_tile, out and T * out multiples
// of 4, partial and y 16-byte aligned) takes a tile's 64 tokens x 128 rows in 4 rounds of loads where single rows
// took 16 (linear_x8 from 16 tokens; session 29); the register cost (64 floats of loads) is why it is not the default.
template <int V = 1>
__device__ __forceinline__ void finish_split_k(const float* partial, float* y, int* counters, int64_t counter,
                                               int ksplit, int64_t tile_row0, int rows_per_tile, int64_t out,
                                               int64_t T, int64_t tok0, int64_t tok_end, float mult) {
  static_assert(V == 1 || V == 4, "finish_split_k: one row or four an item");
  using Vec = std::conditional_t<V == 4, float4, float>;
  __shared__ int is_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(&counters[counter], 1) == ksplit - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  constexpr int kItems = 2, kSplits = 8;
  const int per_row = rows_per_tile / V;  // items a token
  const int items = per_row * static_cast<int>(tok_end - tok0), step = static_cast<int>(blockDim.x);
  const int64_t split_stride = T * out;
  auto add = [](Vec& s, const Vec& v) {
    if constexpr (V == 4) s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
    else s += v;
  };
  for (int it0 = static_cast<int>(threadIdx.x); it0 < items; it0 += kItems * step) {
    int64_t at[kItems];  // the item's (first) index in y and in each split's partials (-1: none)
    Vec s[kItems];
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int it = it0 + i * step;
      const int64_t row = tile_row0 + static_cast<int64_t>(it % per_row) * V, tok = tok0 + it / per_row;
      at[i] = it < items && row < out ? tok * out + row : -1;
      s[i] = Vec{};
    }
    for (int sp0 = 0; sp0 < ksplit; sp0 += kSplits) {
      Vec v[kItems][kSplits];
#pragma unroll
      for (int i = 0; i < kItems; ++i)
#pragma unroll
        for (int j = 0; j < kSplits; ++j)
          v[i][j] = at[i] >= 0 && sp0 + j < ksplit
                        ? __ldcg(reinterpret_cast<const Vec*>(partial + (sp0 + j) * split_stride + at[i]))
                        : Vec{};
#pragma unroll
      for (int i = 0; i < kItems; ++i)
#pragma unroll
        for (int j = 0; j < kSplits; ++j)
          if (sp0 + j < ksplit) add(s[i], v[i][j]);
    }
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (at[i] < 0) continue;
      if constexpr (V == 4)
        *reinterpret_cast<float4*>(y + at[i]) = make_float4(s[i].x * mult, s[i].y * mult, s[i].z * mult, s[i].w * mult);
      else y[at[i]] = s[i] * mult;
    }
  }
  if (threadIdx.x == 0) counters[counter] = 0;
}

}  // namespace tern::cuda::dev
