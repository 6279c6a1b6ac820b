// act_quant.cuh's kernels: one warp a (row, 128-column block); a lane holds 4 consecutive values.
#include "backends/cuda/kernels/act_quant.cuh"
#include "backends/cuda/kernels/kv_row_dev.cuh"
#include "backends/cuda/kernels/launch.cuh"

namespace tern::cuda {
namespace dev {

enum class ActOut : int { bytes, f32 };

struct ActOutArgs {
  uint8_t* xq = nullptr;  // bytes
  float* sx = nullptr;    // bytes
  int64_t sx_token_ld = 0;  // bytes: > 0 stores sx token-major
  float* f = nullptr;     // f32
  int64_t f_stride = 0;
};

template <ActOut O>
__global__ void __launch_bounds__(256) act_quant_kernel(ActRows r, ActOutArgs o) {
  pdl_prologue();
  const int lane = threadIdx.x & 31;
  const int64_t blocks = r.cols / 128;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (item >= r.T * blocks) return;
  const int64_t row = item / blocks, col = (item - row * blocks) * 128 + 4 * lane;
  const float4 v = *reinterpret_cast<const float4*>(r.x + row * r.x_stride + col);
  const float amax = warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  const int k = fp8_scale_exponent(amax);
  const float inv = ldexpf(1.0f, -k);  // x / 2^k == x * 2^-k exactly (both the one rounding of the same value)
  uint8_t q[4];
  q[0] = __nv_cvt_float_to_fp8(v.x * inv, __NV_SATFINITE, __NV_E4M3);
  q[1] = __nv_cvt_float_to_fp8(v.y * inv, __NV_SATFINITE, __NV_E4M3);
  q[2] = __nv_cvt_float_to_fp8(v.z * inv, __NV_SATFINITE, __NV_E4M3);
  q[3] = __nv_cvt_float_to_fp8(v.w * inv, __NV_SATFINITE, __NV_E4M3);
  if constexpr (O == ActOut::bytes) {
    *reinterpret_cast<uint32_t*>(o.xq + row * r.cols + col) =
        q[0] | (static_cast<uint32_t>(q[1]) << 8) | (static_cast<uint32_t>(q[2]) << 16) | (static_cast<uint32_t>(q[3]) << 24);
    if (lane == 0)
      o.sx[o.sx_token_ld > 0 ? (col / 128) * o.sx_token_ld + row : row * blocks + col / 128] = ldexpf(1.0f, k);
  } else {
    const float s = ldexpf(1.0f, k);
    float d[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) d[i] = e4m3_to_f32(q[i]) * s;
    *reinterpret_cast<float4*>(o.f + row * o.f_stride + col) = make_float4(d[0], d[1], d[2], d[3]);
  }
}

// A lane's 4 consecutive (stored) columns of a bf16 row, row-major or in planes of 8 (Bf16Rows).
__device__ __forceinline__ uint16_t* bf16_lane_at(const Bf16Rows& r, int64_t row, int64_t col) {
  if (r.planes > 0) return r.h + ((col >> 3) * r.planes + row) * 8 + (col & 7);
  return r.h + row * r.stride + col;
}

__global__ void __launch_bounds__(256) act_fake_quant_bf16_kernel(Bf16Rows r) {
  pdl_prologue();
  const int lane = threadIdx.x & 31;
  const int64_t blocks = r.cols / 128;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (item >= r.rows * blocks) return;
  const int64_t row = item / blocks, col = (item - row * blocks) * 128 + 4 * lane;
  uint2* at = reinterpret_cast<uint2*>(bf16_lane_at(r, row, col));
  const uint2 raw = *at;
  const float v[4] = {__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xffff0000u), __uint_as_float(raw.y << 16),
                      __uint_as_float(raw.y & 0xffff0000u)};
  const float amax = warp_max(fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3]))));
  const int k = fp8_scale_exponent(amax);
  const float inv = ldexpf(1.0f, -k), s = ldexpf(1.0f, k);
  float d[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) d[i] = e4m3_to_f32(__nv_cvt_float_to_fp8(v[i] * inv, __NV_SATFINITE, __NV_E4M3)) * s;
  *at = make_uint2(pack_bf16(d[0], d[1]), pack_bf16(d[2], d[3]));  // exact: 4 significant bits
}

template <ActOut O>
void launch_act(const ActRows& r, const ActOutArgs& o, cudaStream_t stream) {
  const int64_t items = r.T * (r.cols / 128);
  if (items == 0) return;
  launch(act_quant_kernel<O>, static_cast<unsigned>((items + 7) / 8), 256, 0, stream, r, o);
}

}  // namespace dev

void launch_act_quant(const ActRows& r, uint8_t* xq, float* sx, cudaStream_t stream, int64_t sx_token_ld) {
  dev::ActOutArgs o;
  o.xq = xq, o.sx = sx, o.sx_token_ld = sx_token_ld;
  dev::launch_act<dev::ActOut::bytes>(r, o, stream);
}

void launch_act_fake_quant(const ActRows& r, float* out, int64_t out_stride, cudaStream_t stream) {
  dev::ActOutArgs o;
  o.f = out, o.f_stride = out_stride;
  dev::launch_act<dev::ActOut::f32>(r, o, stream);
}

void launch_act_fake_quant_bf16_inplace(const Bf16Rows& r, cudaStream_t stream) {
  const int64_t items = r.rows * (r.cols / 128);
  if (items == 0) return;
  launch(dev::act_fake_quant_bf16_kernel, static_cast<unsigned>((items + 7) / 8), 256, 0, stream, r);
}

}  // namespace tern::cuda
