// Operands of the library GEMMs: memory-bound passes, 16 columns (one fp4 scale group piece, an eighth of an
// fp8 block) per thread, vector loads and stores.
#include <algorithm>

#include "backends/cuda/kernels/device_common.cuh"
#include "backends/cuda/kernels/gemm_prep.cuh"
#include "backends/cuda/kernels/launch.cuh"

namespace tern::cuda {

namespace dev {
namespace {

// A weight as the expanders read it (row-major, `in` a multiple of 32).
struct Mat16 {
  WeightFormat kind;
  const uint8_t* w;
  const uint8_t* s;
  int64_t in, s_cols;
  int scale_f32;
  float global_scale;
};

// Columns col .. col+15 of row `row` (col a multiple of 16), exactly; kGlobal: NVFP4's global scale too.
template <bool kGlobal>
__device__ __forceinline__ void decode16(const Mat16& m, int64_t row, int64_t col, float (&v)[16]) {
  switch (m.kind) {
    case WeightFormat::f32: {
      const float4* p = reinterpret_cast<const float4*>(m.w + (row * m.in + col) * 4);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 q = p[i];
        v[4 * i] = q.x, v[4 * i + 1] = q.y, v[4 * i + 2] = q.z, v[4 * i + 3] = q.w;
      }
      return;
    }
    case WeightFormat::bf16: {
      const uint4* p = reinterpret_cast<const uint4*>(m.w + (row * m.in + col) * 2);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint4 q = p[i];
        const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          v[8 * i + 2 * j] = bf16_bits_to_f32(static_cast<uint16_t>(words[j] & 0xffffu));
          v[8 * i + 2 * j + 1] = bf16_bits_to_f32(static_cast<uint16_t>(words[j] >> 16));
        }
      }
      return;
    }
    case WeightFormat::fp8_block: {
      const uint4 q = *reinterpret_cast<const uint4*>(m.w + row * m.in + col);
      const int64_t si = (row / 128) * m.s_cols + col / 128;
      const float s = m.scale_f32 ? reinterpret_cast<const float*>(m.s)[si] : e8m0_to_f32(m.s[si]);
      const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = e4m3_to_f32(static_cast<uint8_t>(words[i / 4] >> (8 * (i % 4)))) * s;
      return;
    }
    case WeightFormat::mxfp4:
    case WeightFormat::nvfp4: {
      const uint2 q = *reinterpret_cast<const uint2*>(m.w + row * (m.in / 2) + col / 2);
      float s;
      if (m.kind == WeightFormat::mxfp4) {
        s = e8m0_to_f32(m.s[row * m.s_cols + col / 32]);
      } else {
        s = ue4m3_to_f32(m.s[row * m.s_cols + col / 16]);
        if (kGlobal) s *= m.global_scale;
      }
      const uint32_t words[2] = {q.x, q.y};
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = e2m1_to_f32(words[i / 8] >> (4 * (i % 8))) * s;
      return;
    }
  }
}

__device__ __forceinline__ void store8(uint16_t* out, const float* v) {
  *reinterpret_cast<uint4*>(out) =
      make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]), pack_bf16(v[6], v[7]));
}
__device__ __forceinline__ void store16(uint16_t* out, const float (&v)[16]) {
  store8(out, v);
  store8(out + 8, v + 8);
}
__device__ __forceinline__ void store16(float* out, const float (&v)[16]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) reinterpret_cast<float4*>(out)[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
}

template <typename Out, bool kGlobal>
__global__ void expand_kernel(Mat16 m, int64_t rows, Out* out) {
  pdl_prologue();
  const int64_t per_row = m.in / 16, n = rows * per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / per_row, col = (i - row * per_row) * 16;
    float v[16];
    decode16<kGlobal>(m, row, col, v);
    store16(out + row * m.in + col, v);
  }
}

__device__ __forceinline__ int64_t expert_scale_cols(WeightFormat k, int64_t in) {
  return k == WeightFormat::fp8_block ? (in + 127) / 128 : k == WeightFormat::mxfp4 ? in / 32 : k == WeightFormat::nvfp4 ? in / 16 : 0;
}

// grid (pieces of one matrix, job, matrix): matrix 0 = w1, 1 = w3 ([inter, D]), 2 = w2 ([D, inter]).
__global__ void moe_expand_kernel(const ExpertDesc* experts, WeightFormat kind, int scale_f32, const int* jobs,
                                  int first, int64_t D, int64_t inter, uint16_t* out) {
  pdl_prologue();
  const int j = blockIdx.y, which = blockIdx.z;
  const int e = jobs[3 * (first + j)];
  const ExpertDesc& ed = experts[e];
  const int slot = which == 0 ? 0 : which == 1 ? 2 : 1;  // ExpertDesc order: w1, w2, w3
  const int64_t in = which == 2 ? inter : D;
  const Mat16 m{kind, static_cast<const uint8_t*>(ed.w[slot]), static_cast<const uint8_t*>(ed.s[slot]), in,
                expert_scale_cols(kind, in), scale_f32, 1.0f};
  const int64_t per_row = in / 16, n = inter * D / 16;
  uint16_t* dst = out + (static_cast<int64_t>(j) * 3 + which) * inter * D;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / per_row, col = (i - row * per_row) * 16;
    float v[16];
    decode16<false>(m, row, col, v);
    store16(dst + row * in + col, v);
  }
}

__device__ __forceinline__ void load8(const float* p, float* v) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__global__ void round_bf16_kernel(const float* x, int64_t rows, int64_t cols, int64_t ld, uint16_t* y) {
  pdl_prologue();
  const int64_t per_row = cols / 8, n = rows * per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, c = (i - r * per_row) * 8;
    float v[8];
    load8(x + r * ld + c, v);
    store8(y + r * cols + c, v);
  }
}

// x = x1 + x2 + x3 with each part a bf16 number (x1 = bf16(x), x2 = bf16(x - x1), x3 = bf16(x - x1 - x2); the
// residuals are exact in f32), into three planes of [rows, cols]: 24 significant bits, f32's, in three bf16
// operands, so a weight that is exactly bf16 times x is three bf16 tensor-core products (the exact path).
__global__ void split_bf16x3_kernel(const float* x, int64_t rows, int64_t cols, int64_t ld, uint16_t* y) {
  pdl_prologue();
  const int64_t per_row = cols / 8, n = rows * per_row, plane = rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, c = (i - r * per_row) * 8;
    float v[8];
    load8(x + r * ld + c, v);
#pragma unroll
    for (int part = 0; part < 3; ++part) {
      float b[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t bits = pack_bf16(v[j], 0.0f) & 0xffffu;
        b[j] = bf16_bits_to_f32(static_cast<uint16_t>(bits));
      }
      store8(y + part * plane + r * cols + c, b);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] -= b[j];
    }
  }
}

__global__ void moe_gather_bf16_kernel(const float* x, const int* sorted, int64_t P, int k, int64_t D, uint16_t* xs) {
  pdl_prologue();
  const int64_t per_row = D / 8, n = P * per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t slot = i / per_row, c = (i - slot * per_row) * 8;
    float v[8];
    load8(x + static_cast<int64_t>(sorted[slot] / k) * D + c, v);
    store8(xs + slot * D + c, v);
  }
}

__global__ void moe_swiglu_bf16_kernel(const float* h13, int64_t rows, int64_t inter, float limit, uint16_t* h) {
  pdl_prologue();
  const int64_t per_row = inter / 8, n = rows * per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, c = (i - r * per_row) * 8;
    float g[8], u[8], v[8];
    load8(h13 + r * 2 * inter + c, g);
    load8(h13 + r * 2 * inter + inter + c, u);
#pragma unroll
    for (int q = 0; q < 8; ++q) v[q] = siluf_(fminf(g[q], limit)) * fminf(fmaxf(u[q], -limit), limit);
    store8(h + r * inter + c, v);
  }
}

__global__ void fill_random_bf16_kernel(uint16_t* out, int64_t n, float sigma, uint64_t seed) {
  pdl_prologue();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    // The sum of four 16-bit uniforms, centred and scaled to variance 1.
    const float u = static_cast<float>((z & 0xffff) + ((z >> 16) & 0xffff) + ((z >> 32) & 0xffff) + (z >> 48));
    const float v = (u / 65536.0f - 2.0f) * 1.7320508f * sigma;
    out[i] = static_cast<uint16_t>(pack_bf16(v, 0.0f) & 0xffff);
  }
}

// One thread a scale of the padded [rows, ld] output; the padding columns get 0 (cuBLASLt never reads them as
// scales of real blocks, but they must be finite memory it may load).
__global__ void block_scales_f32_kernel(const uint8_t* s, int scale_f32, int64_t rows, int64_t cols, int64_t ld,
                                        float* out) {
  pdl_prologue();
  const int64_t n = rows * ld;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / ld, c = i - r * ld;
    float v = 0.0f;
    if (c < cols) v = scale_f32 ? reinterpret_cast<const float*>(s)[r * cols + c] : e8m0_to_f32(s[r * cols + c]);
    out[i] = v;
  }
}

// Random e4m3 bytes with the exponent field's top bit cleared: |value| < 2, never NaN (0x7f / 0xff need it set).
__global__ void fill_random_e4m3_kernel(uint8_t* out, int64_t n, uint64_t seed) {
  pdl_prologue();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    out[i] = static_cast<uint8_t>(z & 0xbfu);
  }
}

Mat16 mat16(const DeviceMat& w) {
  return Mat16{w.kind, static_cast<const uint8_t*>(w.w), static_cast<const uint8_t*>(w.s), w.in, w.s_cols,
               w.scale_f32 ? 1 : 0, w.global_scale};
}

}  // namespace
}  // namespace dev

bool expand_ok(const DeviceMat& w) {
  const auto aligned = [](const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
  return w.in % 32 == 0 && aligned(w.w, 16);
}

void launch_expand_bf16(const DeviceMat& w, uint16_t* out, cudaStream_t stream) {
  const int64_t n = w.out * w.in / 16;
  if (n == 0) return;
  launch(dev::expand_kernel<uint16_t, false>, dev::grid_stride_blocks(n), 256, 0, stream, dev::mat16(w),
         w.out, out);
}

void launch_expand_f32(const DeviceMat& w, float* out, cudaStream_t stream) {
  const int64_t n = w.out * w.in / 16;
  if (n == 0) return;
  launch(dev::expand_kernel<float, true>, dev::grid_stride_blocks(n), 256, 0, stream, dev::mat16(w), w.out,
         out);
}

void launch_round_bf16(const float* x, int64_t rows, int64_t cols, int64_t ld, uint16_t* y, cudaStream_t stream) {
  const int64_t n = rows * cols / 8;
  if (n == 0) return;
  launch(dev::round_bf16_kernel, dev::grid_stride_blocks(n), 256, 0, stream, x, rows, cols, ld, y);
}

void launch_split_bf16x3(const float* x, int64_t rows, int64_t cols, int64_t ld, uint16_t* y, cudaStream_t stream) {
  const int64_t n = rows * cols / 8;
  if (n == 0) return;
  launch(dev::split_bf16x3_kernel, dev::grid_stride_blocks(n), 256, 0, stream, x, rows, cols, ld, y);
}

void launch_moe_gather_bf16(const float* x, const int* sorted, int64_t P, int k, int64_t D, uint16_t* xs,
                            cudaStream_t stream) {
  const int64_t n = P * D / 8;
  if (n == 0) return;
  launch(dev::moe_gather_bf16_kernel, dev::grid_stride_blocks(n), 256, 0, stream, x, sorted, P, k, D, xs);
}

void launch_moe_expand(const ExpertDesc* experts, WeightFormat kind, bool scale_f32, const int* jobs, int first,
                       int count, int64_t D, int64_t inter, uint16_t* out, cudaStream_t stream) {
  if (count == 0) return;
  const int64_t pieces = inter * D / 16;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((pieces + 255) / 256, 512)), static_cast<unsigned>(count), 3);
  launch(dev::moe_expand_kernel, grid, 256, 0, stream, experts, kind, scale_f32 ? 1 : 0, jobs, first, D,
         inter, out);
}

void launch_moe_swiglu_bf16(const float* h13, int64_t rows, int64_t inter, float limit, uint16_t* h,
                            cudaStream_t stream) {
  const int64_t n = rows * inter / 8;
  if (n == 0) return;
  launch(dev::moe_swiglu_bf16_kernel, dev::grid_stride_blocks(n), 256, 0, stream, h13, rows, inter, limit, h);
}

void launch_block_scales_f32(const void* s, bool scale_f32, int64_t rows, int64_t cols, int64_t ld, float* out,
                             cudaStream_t stream) {
  const int64_t n = rows * ld;
  if (n == 0) return;
  launch(dev::block_scales_f32_kernel, dev::grid_stride_blocks(n), 256, 0, stream, static_cast<const uint8_t*>(s),
         scale_f32 ? 1 : 0, rows, cols, ld, out);
}

void launch_fill_random_e4m3(uint8_t* out, int64_t n, uint64_t seed, cudaStream_t stream) {
  if (n == 0) return;
  launch(dev::fill_random_e4m3_kernel, dev::grid_stride_blocks(n), 256, 0, stream, out, n, seed);
}

void launch_fill_random_bf16(uint16_t* out, int64_t n, float sigma, uint64_t seed, cudaStream_t stream) {
  if (n == 0) return;
  launch(dev::fill_random_bf16_kernel, dev::grid_stride_blocks(n), 256, 0, stream, out, n, sigma, seed);
}

}  // namespace tern::cuda
