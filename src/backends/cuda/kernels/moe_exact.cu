// The exact experts (--activations f32: every expert weight `exact`): f32 CUDA-core products with no bf16 operand,
// for tests at any shape and for telling a rounding from a kernel bug. One block per (token, pick) computes
// h = SwiGLU(w1 x, w3 x) over the expert's width into shared memory, then y = w2 h, each output a plain f32 dot
// product in column order (threads take rows); the combine adds the picks in pick order, as launch_moe's does.
// Slow by design: each pick reads its expert's weights whole, rows uncoalesced.
#include "backends/cuda/kernels/errors.h"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/moe.cuh"
#include "backends/cuda/kernels/weight_at.cuh"

namespace tern::cuda {
namespace dev {
namespace {

constexpr int kExactThreads = 256;

// Expert matrix i (0 w1, 1 w2, 2 w3) of desc as the element reader takes it.
__device__ SimpleMat expert_mat(const MoeParams& p, const ExpertDesc& d, int i, int64_t out, int64_t in) {
  const WeightFormat f = p.kind;
  const int64_t s_cols = f == WeightFormat::mxfp4       ? in / 32
                         : f == WeightFormat::nvfp4     ? in / 16
                         : f == WeightFormat::fp8_block ? (in + 127) / 128
                                                        : 0;
  return SimpleMat{static_cast<int>(f), static_cast<const uint8_t*>(d.w[i]), static_cast<const uint8_t*>(d.s[i]),
                   out, in, s_cols, p.scale_f32 ? 1 : 0, d.global_scale[i]};
}

__global__ void __launch_bounds__(kExactThreads) moe_exact_kernel(MoeParams p, float* y, int* pos) {
  pdl_prologue();
  extern __shared__ float smem[];  // x [D], then h [inter]
  float* xs = smem;
  float* hs = smem + p.D;
  const int64_t pair = blockIdx.x, t = pair / p.k;
  const int e = p.indices[pair];
  if (e < 0 || e >= p.E) {
    if (threadIdx.x == 0) {
      raise(p.err, kErrExpertIndex);
      pos[pair] = -1;
    }
    return;
  }
  for (int64_t i = threadIdx.x; i < p.D; i += blockDim.x) xs[i] = p.x[t * p.D + i];
  __syncthreads();
  const ExpertDesc& d = p.experts[e];
  const SimpleMat w1 = expert_mat(p, d, 0, p.inter, p.D), w3 = expert_mat(p, d, 2, p.inter, p.D);
  for (int64_t r = threadIdx.x; r < p.inter; r += blockDim.x) {
    float g = 0.0f, u = 0.0f;
    for (int64_t c = 0; c < p.D; ++c) {
      g = fmaf(weight_at(w1, r, c), xs[c], g);
      u = fmaf(weight_at(w3, r, c), xs[c], u);
    }
    hs[r] = siluf_(fminf(g, p.limit)) * fminf(fmaxf(u, -p.limit), p.limit);
  }
  __syncthreads();
  const SimpleMat w2 = expert_mat(p, d, 1, p.D, p.inter);
  for (int64_t r = threadIdx.x; r < p.D; r += blockDim.x) {
    float acc = 0.0f;
    for (int64_t c = 0; c < p.inter; ++c) acc = fmaf(weight_at(w2, r, c), hs[c], acc);
    y[pair * p.D + r] = acc;
  }
  if (threadIdx.x == 0) pos[pair] = static_cast<int>(pair);
}

}  // namespace
}  // namespace dev

int64_t moe_exact_workspace_bytes(const MoeParams& p) {
  return p.T * p.k * (p.D * static_cast<int64_t>(sizeof(float)) + static_cast<int64_t>(sizeof(int)));
}

size_t moe_exact_smem_bytes(const MoeParams& p) { return static_cast<size_t>(p.D + p.inter) * sizeof(float); }

void launch_moe_exact(const MoeParams& p, void* workspace, cudaStream_t stream) {
  if (p.T == 0) return;
  auto* y = static_cast<float*>(workspace);
  int* pos = reinterpret_cast<int*>(y + p.T * p.k * p.D);
  const size_t smem = moe_exact_smem_bytes(p);
  // Past the default 48 KB: the kernel's limit raised once to the most a block has (a failure shows in the launch's
  // error, which the caller checks).
  if (smem > 48 * 1024) {
    static const bool raised = cudaFuncSetAttribute(dev::moe_exact_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    static_cast<int>(kMoeExactMaxSmem)) == cudaSuccess;
    (void)raised;
  }
  launch(dev::moe_exact_kernel, static_cast<unsigned>(p.T * p.k), dev::kExactThreads, smem, stream, p, y, pos);
  launch_moe_combine(p, y, pos, stream);
}

}  // namespace tern::cuda
