// KV row packing: one block per row; each warp quantises blocks of 64 nope dims (amax, power-of-two
// scale, e4m3), then the rope dims go to bf16 and the scale bytes (zero padded) follow.
#include "backends/cuda/kernels/kv_row_dev.cuh"
#include "backends/cuda/kernels/launch.cuh"

namespace tern::cuda {
namespace dev {
namespace {

// The reference's scale rule 2^ceil(log2(max(amax, 1e-4) / 448)), exactly: q = v / 448 in double is a
// power of two only when v is one times 448 (no rounding can land on one otherwise), so frexp decides.
__device__ int fp8_scale_exponent(float amax) {
  const double q = static_cast<double>(fmaxf(amax, 1e-4f)) / 448.0;
  int e = 0;
  const double m = frexp(q, &e);  // q = m * 2^e, m in [0.5, 1)
  return m == 0.5 ? e - 1 : e;
}

__global__ void kv_pack_kernel(const float* x, KvRowDesc f, uint8_t* rows) {
  pdl_prologue();
  const float* src = x + static_cast<int64_t>(blockIdx.x) * f.head_dim;
  uint8_t* row = rows + static_cast<int64_t>(blockIdx.x) * f.row_bytes;
  if (!f.fp8) {
    float* dst = reinterpret_cast<float*>(row);
    for (int64_t i = threadIdx.x; i < f.head_dim; i += blockDim.x) dst[i] = src[i];
    return;
  }
  const int64_t nope = f.head_dim - f.rope_dim, blocks = nope / 64;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
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
  for (int64_t i = threadIdx.x; i < f.rope_dim; i += blockDim.x) {
    // One 16-bit store of the bf16 bits (2-byte aligned: nope and the row size are even). Storing the low
    // byte alone made ptxas 13.0 emit a float-to-u8 conversion of the bf16 register (F2I.U8.F16).
    *reinterpret_cast<uint16_t*>(row + nope + 2 * i) = __bfloat16_as_ushort(__float2bfloat16_rn(src[nope + i]));
  }
  for (int64_t j = blocks + threadIdx.x; j < (blocks + 7) / 8 * 8; j += blockDim.x) scales[j] = 0;
}

__global__ void kv_unpack_kernel(const uint8_t* rows, int64_t n, KvRowDesc f, float* x) {
  pdl_prologue();
  const int64_t total = n * f.head_dim;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = kv_value(rows + (i / f.head_dim) * f.row_bytes, f, i % f.head_dim);
}

}  // namespace
}  // namespace dev

void launch_kv_pack(const float* x, int64_t n, const KvRowDesc& f, uint8_t* rows, cudaStream_t stream) {
  if (n == 0) return;
  launch(dev::kv_pack_kernel, static_cast<unsigned>(n), 256, 0, stream, x, f, rows);
}

void launch_kv_unpack(const uint8_t* rows, int64_t n, const KvRowDesc& f, float* x, cudaStream_t stream) {
  const int64_t total = n * f.head_dim;
  if (total == 0) return;
  const int blocks = static_cast<int>(total / 256 + 1 > 65535 ? 65535 : total / 256 + 1);
  launch(dev::kv_unpack_kernel, blocks, 256, 0, stream, rows, n, f, x);
}

}  // namespace tern::cuda
