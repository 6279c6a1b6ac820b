// The wgmma layout check (wgmma_probe.cuh): the S and P V steps of attention_prefill_wgmma_kernel on two
// given matrices, so a layout or descriptor error shows as a wrong product of its own rather than as an
// attention mismatch. The fragment mapping (S accumulators -> P A fragments) is the kernel's.
#include "backends/cuda/kernels/wgmma_probe.cuh"

#include <atomic>

#include "backends/cuda/kernels/attention_tile.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/wgmma.cuh"

namespace tern::cuda {
namespace dev {
namespace {

constexpr int kD = 512;                           // columns of a and b (head_dim)
constexpr int kKB = 64 * 128;                     // bytes of one swizzled 64-column block of a 64-row tile
constexpr size_t kSmem = 2 * 64 * kD * 2 + 1024;  // two bf16 tiles + alignment of the base

__global__ void __launch_bounds__(kTileThreads, 1)
    wgmma_probe_kernel(const float* a, const float* b, float* s_out, float* o_out) {
  pdl_prologue();
  extern __shared__ __align__(1024) uint8_t smem_base[];
  uint8_t* smem = smem_base + ((1024 - (smem_addr(smem_base) & 1023)) & 1023);
  uint8_t* sA = smem;
  uint8_t* sB = smem + 64 * kD * 2;
  for (int idx = threadIdx.x; idx < 64 * kD / 4; idx += kTileThreads) {
    const int r = idx / (kD / 4), c = idx % (kD / 4);
    const float4 va = reinterpret_cast<const float4*>(a)[idx], vb = reinterpret_cast<const float4*>(b)[idx];
    *reinterpret_cast<uint2*>(sA + sw128_offset<64>(r, 4 * c)) =
        make_uint2(pack_bf16(va.x, va.y), pack_bf16(va.z, va.w));
    *reinterpret_cast<uint2*>(sB + sw128_offset<64>(r, 4 * c)) =
        make_uint2(pack_bf16(vb.x, vb.y), pack_bf16(vb.z, vb.w));
  }
  fence_proxy_async();
  __syncthreads();
  const uint32_t a_addr = smem_addr(sA), b_addr = smem_addr(sB);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wg = warp >> 2, wq = warp & 3;

  float s[32];
#pragma unroll
  for (int e = 0; e < 32; ++e) s[e] = 0.0f;
  wgmma_pin(s);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t off = (kk >> 2) * kKB + (kk & 3) * 32;
    wgmma_ss_m64n64k16(s, sw128_desc(a_addr + off), sw128_desc(b_addr + off));
  }
  wgmma_commit();
  wgmma_wait_all();
  wgmma_pin(s);

  uint32_t pa[4][4];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      pa[j >> 1][2 * (j & 1) + hf] = pack_bf16(s[4 * j + 2 * hf], s[4 * j + 2 * hf + 1]);
      if (wg == 0)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          s_out[(16 * wq + 8 * hf + g) * 64 + 8 * j + 2 * t + e] = s[4 * j + 2 * hf + e];
    }

  float o[4][32];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
#pragma unroll
    for (int e = 0; e < 32; ++e) o[c][e] = 0.0f;
    wgmma_pin(o[c]);
  }
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) wgmma_pin(pa[ks]);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
#pragma unroll
    for (int c = 0; c < 4; ++c)
      wgmma_rs_m64n64k16_tb(o[c], pa[ks], sw128_desc(b_addr + (wg * 4 + c) * kKB + ks * 2048));
  wgmma_commit();
  wgmma_wait_all();
#pragma unroll
  for (int c = 0; c < 4; ++c) wgmma_pin(o[c]);
#pragma unroll
  for (int c = 0; c < 4; ++c)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          o_out[(16 * wq + 8 * hf + g) * kD + 64 * (wg * 4 + c) + 8 * j + 2 * t + e] =
              o[c][4 * j + 2 * hf + e];
}

}  // namespace
}  // namespace dev

cudaError_t launch_wgmma_probe(const float* a, const float* b, float* s, float* o, cudaStream_t stream) {
  static std::atomic<bool> opted_in{false};
  if (!opted_in.load()) {
    // A failure shows as the launch's error.
    if (cudaFuncSetAttribute(dev::wgmma_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(dev::kSmem)) == cudaSuccess)
      opted_in.store(true);
  }
  return launch(dev::wgmma_probe_kernel, dim3(1), dev::kTileThreads, dev::kSmem, stream, a, b, s, o);
}

}  // namespace tern::cuda
