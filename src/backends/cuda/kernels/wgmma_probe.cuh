// A check of the wgmma layouts of attention_prefill_wgmma.cu on known matrices (tests only; wgmma_probe.cu).
#pragma once

#include <cuda_runtime.h>

namespace tern::cuda {

// One block, the prefill kernel's arrangement at head_dim 512: a and b are [64][512] f32 (rounded to bf16
// into the 128-byte-swizzled tiles); s [64][64] = a b^T (f32 accumulation; the S step: both operands
// K-major descriptors); o [64][512] = bf16(s) b (the P V step: A from the S accumulators in registers, b as
// the MN-major B).
cudaError_t launch_wgmma_probe(const float* a, const float* b, float* s, float* o, cudaStream_t stream);

}  // namespace tern::cuda
