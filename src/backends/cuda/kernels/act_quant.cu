// act_quant.cuh's kernels: one warp a (row, 128-column block); a lane holds 4 consecutive values. (Four items a
// warp, their loads issued together, measured the same: 141 us a call at 8 192 tokens, results.md session 14.)
// bf16 planes (the grouped MoE kernels' h): a thread per row, 16 planes of 8 values, so a warp's loads are 512
// contiguous bytes (a warp per block read 16-byte pieces a plane apart: 361 us a call, now 133).
#include "backends/cuda/kernels/act_quant.cuh"
#include "backends/cuda/kernels/act_quant_dev.cuh"
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
  const int64_t row = item / blocks, block_col = (item - row * blocks) * 128, col = block_col + 4 * lane;
  if constexpr (O == ActOut::bytes) {
    const float4 v = *reinterpret_cast<const float4*>(r.x + row * r.x_stride + col);
    int k = 0;
    const uint32_t packed = act_quant_lane(v, k);
    *reinterpret_cast<uint32_t*>(o.xq + row * r.cols + col) = packed;
    if (lane == 0)
      o.sx[o.sx_token_ld > 0 ? (col / 128) * o.sx_token_ld + row : row * blocks + col / 128] = ldexpf(1.0f, k);
  } else {
    act_fake_quant_block(r.x + row * r.x_stride + block_col, o.f + row * o.f_stride + block_col, lane);
  }
}

// The planes layout: a thread per (row, 128-column block), its 16 planes' 8 values (one 16-byte load each; a
// warp's 32 rows of a plane are 512 contiguous bytes), the block's largest |value| without shuffles.
__global__ void __launch_bounds__(256) act_fake_quant_bf16_planes_kernel(Bf16Rows r) {
  pdl_prologue();
  const int64_t blocks = r.cols / 128;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t b = i / r.rows, row = i - b * r.rows;  // consecutive threads: consecutive rows of a block
  if (b >= blocks) return;
  uint4 w[16];
#pragma unroll
  for (int p = 0; p < 16; ++p) w[p] = *reinterpret_cast<const uint4*>(r.h + ((b * 16 + p) * r.planes + row) * 8);
  fake_quant_bf16_planes(w);
#pragma unroll
  for (int p = 0; p < 16; ++p) *reinterpret_cast<uint4*>(r.h + ((b * 16 + p) * r.planes + row) * 8) = w[p];
}

__global__ void __launch_bounds__(256) act_fake_quant_bf16_kernel(Bf16Rows r) {
  pdl_prologue();
  const int lane = threadIdx.x & 31;
  const int64_t blocks = r.cols / 128;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (item >= r.rows * blocks) return;
  const int64_t row = item / blocks, col = (item - row * blocks) * 128 + 4 * lane;
  uint2* at = reinterpret_cast<uint2*>(r.h + row * r.stride + col);  // row-major (planes: the kernel above)
  const uint2 raw = *at;
  const float v[4] = {__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xffff0000u), __uint_as_float(raw.y << 16),
                      __uint_as_float(raw.y & 0xffff0000u)};
  const float amax = warp_max(fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3]))));
  const int k = fp8_scale_exponent(amax);
  const float inv = ldexpf(1.0f, -k), s = ldexpf(1.0f, k);
  float d[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) d[i] = act_fake_quant_value(v[i], inv, s);
  *at = make_uint2(pack_bf16(d[0], d[1]), pack_bf16(d[2], d[3]));  // exact: 4 significant bits
}

// A thread 4 values of a row: e4m3 * its block's scale (token-major scales).
__global__ void __launch_bounds__(256) act_dequant_kernel(const uint8_t* q, const float* scales, int64_t scale_ld,
                                                          int64_t T, int64_t cols, float* out) {
  pdl_prologue();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, per_row = cols / 4;
  if (i >= T * per_row) return;
  const int64_t row = i / per_row, col = (i - row * per_row) * 4;
  const uint32_t packed = *reinterpret_cast<const uint32_t*>(q + row * cols + col);
  const float s = scales[(col / 128) * scale_ld + row];
  float d[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) d[k] = e4m3_to_f32(static_cast<uint8_t>(packed >> (8 * k))) * s;
  *reinterpret_cast<float4*>(out + row * cols + col) = make_float4(d[0], d[1], d[2], d[3]);
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

void launch_act_dequant(const uint8_t* q, const float* scales, int64_t scale_ld, int64_t T, int64_t cols, float* out,
                        cudaStream_t stream) {
  const int64_t items = T * (cols / 4);
  if (items == 0) return;
  launch(dev::act_dequant_kernel, static_cast<unsigned>((items + 255) / 256), 256, 0, stream, q, scales, scale_ld, T,
         cols, out);
}

void launch_act_fake_quant_bf16_inplace(const Bf16Rows& r, cudaStream_t stream) {
  const int64_t items = r.rows * (r.cols / 128);
  if (items == 0) return;
  if (r.planes > 0) {
    launch(dev::act_fake_quant_bf16_planes_kernel, static_cast<unsigned>((items + 255) / 256), 256, 0, stream, r);
    return;
  }
  launch(dev::act_fake_quant_bf16_kernel, static_cast<unsigned>((items + 7) / 8), 256, 0, stream, r);
}

}  // namespace tern::cuda
