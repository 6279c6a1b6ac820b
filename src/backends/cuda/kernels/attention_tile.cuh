// The key tile of the tensor-core attention kernels (nvcc only; attention_mma.cu for decode steps,
// attention_prefill.cu for prefill chunks): 64 keys' raw FP8 rows arrive in shared memory by cp.async and are
// decoded once into a bf16 tile (e4m3 * e8m0 scale and the bf16 rope dims are exact in bf16) that every warp
// reads through ldmatrix. One place for both kernels, so their rows and numerics are the same.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backends/cuda/kernels/attention.cuh"
#include "backends/cuda/kernels/device_common.cuh"
#include "backends/cuda/kernels/mma_tile.cuh"
#include "backends/cuda/kernels/stream_tile.cuh"  // smem_addr, cp_async_commit

namespace tern::cuda::dev {

constexpr int kTileHeads = kAttentionMmaMaxHeads;  // heads padded to 4 m-tiles of 16
constexpr int kTileKeys = 64;                      // keys per tile
constexpr int kTileThreads = 256;                  // 8 warps
constexpr float kLog2e = 1.4426950408889634f;

// bf16 per row of q / key tile: a 16-byte pad, so ldmatrix rows fall in distinct banks.
template <int HD>
constexpr int kTileRowStride = HD + 8;

// Bytes of one raw tile (rows of row_bytes, a multiple of 8), rounded to 16.
__host__ __device__ inline size_t raw_tile_bytes(int64_t row_bytes) {
  return static_cast<size_t>(kTileKeys * row_bytes + 15) / 16 * 16;
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;" ::: "memory");
}

// The raw bytes of a tile's rows into `raw` (row r at r * row_bytes): warp w copies rows w, w + 8, ... in
// 8-byte granules. Masked rows (nullptr) and rows past nk are not read.
__device__ __forceinline__ void issue_raw(const uint8_t* const* rows, int nk, int64_t row_bytes,
                                          uint8_t* raw) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int granules = static_cast<int>(row_bytes / 8);
  for (int r = warp; r < nk; r += kTileThreads / 32) {
    const uint8_t* src = rows[r];
    if (src == nullptr) continue;
    uint8_t* dst = raw + r * row_bytes;
    for (int g = lane; g < granules; g += 32) cp_async8(dst + 8 * g, src + 8 * g);
  }
  cp_async_commit();
}

// 8 e4m3 values (v, low byte first) times their e8m0 scale sc as 8 bf16, exactly: hardware e4m3x2 -> f16x2
// (exact), f32, times the scale (exact), rounded to bf16 (exact unless the product leaves bf16's range).
__device__ __forceinline__ uint4 fp8x8_to_bf16(uint2 v, float sc) {
  uint32_t w[4];
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    const uint32_t word = b < 2 ? v.x : v.y;
    const __half2 h(__nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>((word >> (16 * (b % 2))) & 0xffffu), __NV_E4M3));
    const float2 x = __half22float2(h);
    w[b] = pack_bf16(x.x * sc, x.y * sc);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The 8 bf16 values of dims d .. d+7 (d % 8 == 0) of a DeepSeek FP8 row at src (KvRowDesc's layout): below nope the
// e4m3 bytes times their 64-dim block's e8m0 scale (fp8x8_to_bf16), else the bf16 rope dims as stored (at byte nope +
// 2 (d - nope)). scale_at: the row's first scale byte (nope + 2 rope_dim).
__device__ __forceinline__ uint4 fp8_row_granule_bf16(const uint8_t* src, int64_t d, int64_t nope, int64_t scale_at) {
  if (d < nope) return fp8x8_to_bf16(*reinterpret_cast<const uint2*>(src + d), e8m0_to_f32(src[scale_at + d / 64]));
  const uint2 lo = *reinterpret_cast<const uint2*>(src + 2 * d - nope);
  const uint2 hi = *reinterpret_cast<const uint2*>(src + 2 * d - nope + 8);
  return make_uint4(lo.x, lo.y, hi.x, hi.y);
}

// The raw tile decoded to bf16 into a key tile whose layout is `at(r, d)`: the byte offset of row r, dim d
// (d a multiple of 4; the 8 dims d .. d+7 of an FP8 granule, d a multiple of 8, must be contiguous there);
// masked rows and rows past nk become zeros (P V then adds 0 * 0) and mask[r] says which rows are keys.
// decode_tile below is the padded row-major layout of attend_tile; attention_prefill_wgmma.cu passes the
// 128-byte-swizzled layout of wgmma. The arithmetic is the same, so both tiles hold the same values.
template <int HD, typename At>
__device__ __forceinline__ void decode_tile_at(const KvRowDesc& f, const uint8_t* const* rows, int nk,
                                               const uint8_t* raw, uint8_t* tile, int* mask, At at) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int nope = HD - static_cast<int>(f.rope_dim), fp8_gran = nope / 8;
  const int granules = fp8_gran + static_cast<int>(f.rope_dim) / 4;
  const int scale_at = nope + 2 * static_cast<int>(f.rope_dim);
  for (int r = warp; r < kTileKeys; r += kTileThreads / 32) {
    const bool valid = r < nk && rows[r] != nullptr;
    if (lane == 0) mask[r] = valid;
    const uint8_t* src = raw + r * f.row_bytes;
    for (int g = lane; g < granules; g += 32) {
      if (g < fp8_gran) {
        *reinterpret_cast<uint4*>(tile + at(r, 8 * g)) =
            valid ? fp8_row_granule_bf16(src, 8 * g, nope, scale_at) : make_uint4(0, 0, 0, 0);
      } else {
        const int k = g - fp8_gran;
        *reinterpret_cast<uint2*>(tile + at(r, nope + 4 * k)) =
            valid ? *reinterpret_cast<const uint2*>(src + nope + 8 * k) : make_uint2(0, 0);
      }
    }
  }
}

// The key tile of attend_tile: row r at r * kTileRowStride<HD> bf16.
template <int HD>
__device__ __forceinline__ void decode_tile(const KvRowDesc& f, const uint8_t* const* rows, int nk,
                                            const uint8_t* raw, __nv_bfloat16* tile, int* mask) {
  decode_tile_at<HD>(f, rows, nk, raw, reinterpret_cast<uint8_t*>(tile), mask,
                     [](int r, int d) { return 2 * (r * kTileRowStride<HD> + d); });
}

// Orders the 8 warps of the block (the decode kernel's exchanges).
struct BlockSync {
  __device__ __forceinline__ void operator()() const { __syncthreads(); }
};

// bf16 per row of P (a 16-byte pad, as the tiles).
constexpr int kTilePStride = kTileKeys + 8;

// One key tile's attention for warp (mp, qq) = (warp % 2, warp / 2), heads 32mp .. 32mp+31:
//   S = Q K^T for its heads x keys 16qq .. 16qq+15 over all HD dims (mma.sync m16n8k16, bf16 operands, f32
//   accumulation; a warp whose keys are all past nk has none); scores scaled to base 2 (scale2 = scale *
//   log2 e), masked keys -inf; the tile's row maxima meet in sTmax [4][kTileHeads]; P = 2^(s - m) rounded to
//   bf16 (the row sums add the rounded values) into sP [kTileHeads][kTilePStride]; O += P V for its heads x
//   dims qq * HD/4 .. with V = the same key tile through ldmatrix.trans. o / m_run / l_run are the warp's
//   running state ([m-tile][n-tile][c] and [m-tile][row g / g + 8]); every warp of the same heads computes
//   the same running max. `sync` orders the warps that exchange maxima and P: at least the 4 warps of the
//   same mp. The key tile, sMask and sQ must be complete before the call and stay until it returns.
template <int HD, typename Sync>
__device__ __forceinline__ void attend_tile(const __nv_bfloat16* sQ, const __nv_bfloat16* sK,
                                            __nv_bfloat16* sP, float* sTmax, const int* sMask, int nk,
                                            float scale2, float (&o)[2][HD / 32][4], float (&m_run)[2][2],
                                            float (&l_run)[2][2], Sync sync) {
  constexpr int kNT = HD / 32;  // n-tiles of 8 dims per warp in P V (a quarter of the dims)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int mp = warp & 1, qq = warp >> 1;
  // S = Q K^T for heads 32mp.. x keys 16qq.. (a warp whose keys are all past nk has none).
  const int kb = 16 * qq;
  float s[2][2][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int n = 0; n < 2; ++n) s[mi][n][0] = s[mi][n][1] = s[mi][n][2] = s[mi][n][3] = 0.0f;
  if (kb < nk) {
    const __nv_bfloat16* qa = sQ + (32 * mp + (lane & 15)) * kTileRowStride<HD> + (lane >> 4) * 8;
    const __nv_bfloat16* kbp =
        sK + (kb + (lane & 7) + ((lane >> 4) << 3)) * kTileRowStride<HD> + ((lane >> 3) & 1) * 8;
#pragma unroll 4
    for (int k0 = 0; k0 < HD; k0 += 16) {
      uint32_t qa0[4], qa1[4], kf[4];
      ldsm_x4(qa0, qa + k0);
      ldsm_x4(qa1, qa + 16 * kTileRowStride<HD> + k0);
      ldsm_x4(kf, kbp + k0);
      mma_bf16(s[0][0], qa0[0], qa0[1], qa0[2], qa0[3], kf[0], kf[1]);
      mma_bf16(s[0][1], qa0[0], qa0[1], qa0[2], qa0[3], kf[2], kf[3]);
      mma_bf16(s[1][0], qa1[0], qa1[1], qa1[2], qa1[3], kf[0], kf[1]);
      mma_bf16(s[1][1], qa1[0], qa1[1], qa1[2], qa1[3], kf[2], kf[3]);
    }
  }
  // Scaled scores (base 2), masked keys -inf; the warp's row maxima to shared memory.
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int key = kb + 8 * n + 2 * t + c;
          float& v = s[mi][n][2 * hf + c];
          v = key < nk && sMask[key] ? v * scale2 : -INFINITY;
          mx = fmaxf(mx, v);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      if (t == 0) sTmax[qq * kTileHeads + 32 * mp + 16 * mi + 8 * hf + g] = mx;
    }
  sync();  // the maxima of every warp of these heads are in
  // New running max, P (bf16) for the warp's keys, O and the row sums rescaled.
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int row = 32 * mp + 16 * mi + 8 * hf + g;
      const float tmax = fmaxf(fmaxf(sTmax[row], sTmax[kTileHeads + row]),
                               fmaxf(sTmax[2 * kTileHeads + row], sTmax[3 * kTileHeads + row]));
      const float m_new = fmaxf(m_run[mi][hf], tmax);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float corr = exp2f(m_run[mi][hf] - m_use);
      m_run[mi][hf] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const uint32_t p2 = pack_bf16(exp2f(s[mi][n][2 * hf] - m_use), exp2f(s[mi][n][2 * hf + 1] - m_use));
        sum += __uint_as_float(p2 << 16) + __uint_as_float(p2 & 0xffff0000u);
        if (kb < nk) *reinterpret_cast<uint32_t*>(sP + row * kTilePStride + kb + 8 * n + 2 * t) = p2;
      }
      l_run[mi][hf] = l_run[mi][hf] * corr + sum;
#pragma unroll
      for (int n = 0; n < kNT; ++n) {
        o[mi][n][2 * hf] *= corr;
        o[mi][n][2 * hf + 1] *= corr;
      }
    }
  sync();  // P of these heads is complete
  // O += P V for heads 32mp.. x dims qq * HD/4 .. over the tile's 16-key steps that hold keys.
  const int ksteps = (nk + 15) / 16;
  const __nv_bfloat16* pa = sP + (32 * mp + (lane & 15)) * kTilePStride + (lane >> 4) * 8;
  const __nv_bfloat16* vb =
      sK + ((lane & 7) + ((lane >> 3) & 1) * 8) * kTileRowStride<HD> + qq * (HD / 4) + (lane >> 4) * 8;
  for (int ks = 0; ks < ksteps; ++ks) {
    uint32_t pa0[4], pa1[4];
    ldsm_x4(pa0, pa + 16 * ks);
    ldsm_x4(pa1, pa + 16 * kTilePStride + 16 * ks);
#pragma unroll
    for (int np = 0; np < kNT / 2; ++np) {
      uint32_t vf[4];
      ldsm_x4_trans(vf, vb + 16 * ks * kTileRowStride<HD> + 16 * np);
      mma_bf16(o[0][2 * np], pa0[0], pa0[1], pa0[2], pa0[3], vf[0], vf[1]);
      mma_bf16(o[0][2 * np + 1], pa0[0], pa0[1], pa0[2], pa0[3], vf[2], vf[3]);
      mma_bf16(o[1][2 * np], pa1[0], pa1[1], pa1[2], pa1[3], vf[0], vf[1]);
      mma_bf16(o[1][2 * np + 1], pa1[0], pa1[1], pa1[2], pa1[3], vf[2], vf[3]);
    }
  }
}

}  // namespace tern::cuda::dev
