// The grouped MXFP4 expert GEMMs of prefill chunks on e4m3 wgmma (moe_grouped_e4m3.cu; host interface): the
// plan, tile table and walk of moe_grouped_wgmma.cu, with the FP4 weights decoded to e4m3 (not bf16) once a stage by
// the producer warpgroup and the activations (x, then h) as e4m3 with their 1 x 128 power-of-two scales, as
// `--activations fp8` defines them: twice the tensor-core rate of bf16 and half the activation bytes, both operands
// read by the tensor cores from shared memory. Each row's four MXFP4 scales of a 128-column stage fold into the e4m3
// codes relative to the largest (exact while they lie within 2^8 of it); one promotion a stage adds the fresh sums
// times 2^smax(row) x sx(pair). docs/cuda-backend.md, "The MoE prefill on e4m3 wgmma".
//
// Not the default yet: TERN_MOE_GROUPED=e4m3 asks for it (and stays on the bf16 wgmma kernel, said in the log,
// where the experts cannot take it); to be measured against the bf16 kernel on the GPU first.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "backends/cuda/kernels/moe_grouped.cuh"

namespace tern::cuda {

// MXFP4 experts (e8m0 scales), --activations fp8, D and inter multiples of 128, aligned experts and p.e4m3_fold_ok (moe_e4m3_fold_ok for these experts): nullptr, else the first
// of these that fails, for the log.
const char* moe_grouped_e4m3_refusal(const MoeParams& p);
inline bool moe_grouped_e4m3_supported(const MoeParams& p) { return moe_grouped_e4m3_refusal(p) == nullptr; }
// Pairs a tile: 32, 64, 96 or 128, by the bf16 kernel's rule (moe_grouped_wgmma_tile_pairs; its 112 as 128).
int moe_grouped_e4m3_tile_pairs(const MoeParams& p);
std::string moe_grouped_e4m3_path_name(const MoeParams& p);
// gather (x to e4m3 planes and scales), tiles, up (h as e4m3 planes and scales in the h buffer, quantised in its
// epilogue), down (y [P, D] complete when the stream reaches it; then launch_moe_combine). Requires
// moe_grouped_e4m3_supported(p).
void launch_moe_grouped_e4m3(const MoeParams& p, const MoeGroupedBuffers& b, cudaStream_t stream);
// Whether every row of the E experts' three matrices (device table `experts`, MXFP4 with e8m0 scales) has the four
// scales of each 128-column group within 2^8 of their largest: what folding them into e4m3 codes needs (e2m1 x 2^-d
// is an e4m3 number for d <= 8). Scans the scale bytes on the device and synchronises for the answer.
bool moe_e4m3_fold_ok(const ExpertDesc* experts, int64_t E, int64_t D, int64_t inter, cudaStream_t stream);

}  // namespace tern::cuda
