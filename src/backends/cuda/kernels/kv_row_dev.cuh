// Decoding one value of a stored KV row on the device (nvcc only); shared by kv_unpack and attention.
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

}  // namespace tern::cuda::dev
