// KV row packing (host interface): f32 rows <-> the stored row format of ops/kv_row.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

struct KvRowDesc {
  int fp8 = 0;  // 0: f32 rows; 1: DeepSeek FP8 rows (e4m3 nope dims in blocks of 64, bf16 rope dims, e8m0)
  int64_t head_dim = 0, rope_dim = 0, row_bytes = 0;
};

void launch_kv_pack(const float* x, int64_t n, const KvRowDesc& f, uint8_t* rows, cudaStream_t stream);
void launch_kv_unpack(const uint8_t* rows, int64_t n, const KvRowDesc& f, float* x, cudaStream_t stream);

}  // namespace tern::cuda
