// Stored KV rows on the device (nvcc only): decoding one value (shared by kv_unpack and attention) and
// packing one row (shared by kv_pack and the decode step's fused emit chain, compress_emit.cu, so a
// compressed entry's stored bytes are the same either way).
#pragma once

#include "backends/cuda/kernels/device_common.cuh"
#include "backends/cuda/kernels/kv_row.cuh"

namespace tern::cuda::dev {

// Dim d of `row` as f32, exactly as ops::decode_kv_row gives it.
__device__ __forceinline__ float kv_value(const uint8_t* row, const KvRowDesc& f, int64_t d) {
  if (!f.fp8) return reinterpret_cast<const float*>(row)[d];
  const int64_t nope = f.head_dim - f.rope_dim;
  if (d < nope) return e4m3_to_f32(row[d]) * e8m0_to_f32(row[nope + 2 * f.rope_dim + d / 64]);
  const uint8_t* r = row + nope + 2 * (d - nope);
  return bf16_bits_to_f32(static_cast<uint16_t>(r[0] | (r[1] << 8)));
}


// The reference's scale rule 2^ceil(log2(max(amax, 1e-4) / 448)), exactly: q = v / 448 in double is a
// power of two only when v is one times 448 (no rounding can land on one otherwise), so frexp decides.
__device__ __forceinline__ int fp8_scale_exponent(float amax) {
  const double q = static_cast<double>(fmaxf(amax, 1e-4f)) / 448.0;
  int e = 0;
  const double m = frexp(q, &e);  // q = m * 2^e, m in [0.5, 1)
  return m == 0.5 ? e - 1 : e;
}

// src (f32 [head_dim]) packed into `row` by the `threads` threads of a block (a multiple of 32; this one is
// `thread`), every one calling: f32 rows are copied; FP8 rows have each warp quantise blocks of 64 nope dims
// (amax, power-of-two scale, e4m3), then the rope dims go to bf16 and the scale bytes (zero padded) follow.
__device__ __forceinline__ void pack_kv_row(const float* src, const KvRowDesc& f, uint8_t* row, int thread,
                                            int threads) {
  if (!f.fp8) {
    float* dst = reinterpret_cast<float*>(row);
    for (int64_t i = thread; i < f.head_dim; i += threads) dst[i] = src[i];
    return;
  }
  const int64_t nope = f.head_dim - f.rope_dim, blocks = nope / 64;
  const int lane = thread & 31, warp = thread >> 5, warps = threads >> 5;
  uint8_t* scales = row + nope + 2 * f.rope_dim;
  for (int64_t b = warp; b < blocks; b += warps) {
    const float v0 = src[b * 64 + lane], v1 = src[b * 64 + 32 + lane];
    const float amax = warp_max(fmaxf(fabsf(v0), fabsf(v1)));
    const int k = fp8_scale_exponent(amax);
    const float scale = ldexpf(1.0f, k);
    row[b * 64 + lane] = __nv_cvt_float_to_fp8(v0 / scale, __NV_SATFINITE, __NV_E4M3);
    row[b * 64 + 32 + lane] = __nv_cvt_float_to_fp8(v1 / scale, __NV_SATFINITE, __NV_E4M3);
    if (lane == 0) scales[b] = static_cast<uint8_t>(k + 127);
  }
  for (int64_t i = thread; i < f.rope_dim; i += threads) {
    // One 16-bit store of the bf16 bits (2-byte aligned: nope and the row size are even). Storing the low
    // byte alone made ptxas 13.0 emit a float-to-u8 conversion of the bf16 register (F2I.U8.F16).
    *reinterpret_cast<uint16_t*>(row + nope + 2 * i) = __bfloat16_as_ushort(__float2bfloat16_rn(src[nope + i]));
  }
  for (int64_t j = blocks + thread; j < (blocks + 7) / 8 * 8; j += threads) scales[j] = 0;
}

}  // namespace tern::cuda::dev
