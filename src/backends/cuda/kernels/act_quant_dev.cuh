// The official reference's 1x128 activation quantisation of one warp's block (nvcc only): shared by act_quant's
// kernels and linear_x8's in-kernel quantisation of a decode product's x, so both give the same bytes and scales.
#pragma once

#include "backends/cuda/kernels/kv_row_dev.cuh"

namespace tern::cuda::dev {

// A warp holds one 128-value block, 4 consecutive values a lane (every lane calls): returns the lane's 4 e4m3
// bytes of v / 2^k packed little-endian, k the block's scale exponent 2^ceil(log2(max(amax, 1e-4) / 448)).
__device__ __forceinline__ uint32_t act_quant_lane(float4 v, int& k) {
  const float amax = warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  k = fp8_scale_exponent(amax);
  const float inv = ldexpf(1.0f, -k);  // x / 2^k == x * 2^-k exactly (both the one rounding of the same value)
  const uint32_t q0 = __nv_cvt_float_to_fp8(v.x * inv, __NV_SATFINITE, __NV_E4M3);
  const uint32_t q1 = __nv_cvt_float_to_fp8(v.y * inv, __NV_SATFINITE, __NV_E4M3);
  const uint32_t q2 = __nv_cvt_float_to_fp8(v.z * inv, __NV_SATFINITE, __NV_E4M3);
  const uint32_t q3 = __nv_cvt_float_to_fp8(v.w * inv, __NV_SATFINITE, __NV_E4M3);
  return q0 | (q1 << 8) | (q2 << 16) | (q3 << 24);
}

// e4m3(v / 2^k) * 2^k (inv = 2^-k, s = 2^k): a value quantised and dequantised as act_fake_quant's kernels do, so
// exact in bf16 and f32.
__device__ __forceinline__ float act_fake_quant_value(float v, float inv, float s) {
  return e4m3_to_f32(static_cast<uint8_t>(__nv_cvt_float_to_fp8(v * inv, __NV_SATFINITE, __NV_E4M3))) * s;
}

// e4m3(v / 2^k) * 2^k for the 8 bf16 values of `w` (k: the block's scale exponent), repacked as bf16 (exact: 4
// significant bits).
__device__ __forceinline__ uint4 fake_quant_bf16x8(uint4 w, float inv, float s) {
  uint32_t q[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float a = __uint_as_float(q[i] << 16), b = __uint_as_float(q[i] & 0xffff0000u);
    q[i] = pack_bf16(act_fake_quant_value(a, inv, s), act_fake_quant_value(b, inv, s));
  }
  return make_uint4(q[0], q[1], q[2], q[3]);
}

// The largest |value| of N x 8 bf16 values (16 bytes each).
template <int N>
__device__ __forceinline__ float bf16x8_amax(const uint4 (&w)[N]) {
  float amax = 0.0f;
#pragma unroll
  for (int p = 0; p < N; ++p) {
    const uint32_t q[4] = {w[p].x, w[p].y, w[p].z, w[p].w};
#pragma unroll
    for (int k = 0; k < 4; ++k)
      amax = fmaxf(amax, fmaxf(fabsf(__uint_as_float(q[k] << 16)), fabsf(__uint_as_float(q[k] & 0xffff0000u))));
  }
  return amax;
}

// One row's 128-column block of bf16 planes (16 x 8 values, any order of planes) quantised and dequantised in place
// by the block's largest |value|: act_fake_quant_bf16_planes_kernel's item. (Session 37 measured it folded into the
// wgmma up kernel's epilogue: the up kernel +383 us a layer at 8K for the 256 us kernel it saved; removed.)
__device__ __forceinline__ void fake_quant_bf16_planes(uint4 (&w)[16]) {
  const int k = fp8_scale_exponent(bf16x8_amax(w));
  const float inv = ldexpf(1.0f, -k), s = ldexpf(1.0f, k);
#pragma unroll
  for (int p = 0; p < 16; ++p) w[p] = fake_quant_bf16x8(w[p], inv, s);
}

// One warp's (row, 128-column block): x's 128 values (4 a lane, from x + 4 lane) quantised and dequantised to out
// (e4m3(v / 2^k) * 2^k, exact in f32): act_quant_kernel's f32 output and the MoE plan kernel's quantisation of x.
__device__ __forceinline__ void act_fake_quant_block(const float* x, float* out, int lane) {
  const float4 v = *reinterpret_cast<const float4*>(x + 4 * lane);
  int k = 0;
  const uint32_t packed = act_quant_lane(v, k);
  const float s = ldexpf(1.0f, k);
  float d[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) d[i] = e4m3_to_f32(static_cast<uint8_t>(packed >> (8 * i))) * s;
  *reinterpret_cast<float4*>(out + 4 * lane) = make_float4(d[0], d[1], d[2], d[3]);
}

}  // namespace tern::cuda::dev
