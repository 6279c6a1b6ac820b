// The exact products (the router gates and the indexer: their top-k choices must agree with the f32
// reference) on tensor cores at f32 accuracy. x is split into three bf16 planes whose sum is x to f32's 24
// bits (hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid)); the weights are bf16 numbers (bf16 as
// stored; FP8 e4m3 times its e8m0 block scale, exactly); y = W lo + W mid + W hi per k-step with mma.sync
// m16n8k16 and f32 accumulation, each product w * x_i exact in f32: the scheme prefill's library path uses
// (three cuBLAS bf16 products). The CUDA-core kernels (linear.cu, 8 tokens per weight pass, one FMA per weight
// and token) took 27 us (bf16 rows) and 89 us (the indexer's FP8 wq_b) a call at 64 tokens.
//
// Grid (row tiles of kRows, K slices, token tiles of kTokens): a block of 8 warps, warp w on rows
// row0 + 16 w .. + 15 for all the tile's tokens (up to 8 n-tiles of 8). The block walks its K slice in chunks
// of kChunk columns: it splits the tokens' x chunk into the three planes in shared memory (once, for all its
// warps), then each warp loads its rows' weights for the chunk straight from global memory (16 bytes a lane
// a 32-column step) into mma A fragments. Lane (g, t) holds columns 8t .. 8t+7 of a 32-column step: the
// first mma takes 8t .. 8t+3 (as the fragment's k pairs 2t, 2t+8), the second 8t+4 .. 8t+7, and the B
// fragments (token g's planes) are the same columns: a k permutation both operands share.
// The K slices (a function of the weight's shape only) are added in slice order by the last block of a row
// tile to arrive (finish_split_k); mma columns are independent sums: a token's bits depend on neither T nor
// the other tokens (batch invariant).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string_view>

#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/linear.cuh"
#include "backends/cuda/kernels/mma_tile.cuh"
#include "core/error.h"

namespace tern::cuda {
namespace dev {
namespace {

constexpr int kRows = 128;                    // weight rows per block: 16 per warp
constexpr int kTokens = 64;                   // tokens per block: 8 n-tiles
constexpr int kChunk = 128;                   // columns of x staged at once
constexpr int kPlaneStride = kChunk * 2 + 64;  // bytes per token row of a plane: rows g and g+1 64 bytes apart
                                               // modulo 128, so a quarter-warp's 16-byte B loads hit distinct banks
constexpr int kPlaneBytes = kTokens * kPlaneStride;
constexpr int kSmem = 3 * kPlaneBytes;  // 61 440 bytes
constexpr int kMaxSlices = 64;

struct ExactMmaArgs {
  const uint8_t* w;
  const uint8_t* s;  // fp8: e8m0 per 128x128 block
  int64_t out, in, s_cols;
  int fp8;
  const float* x;
  int64_t x_stride, T, slice_cols;
  float* y;
  float* partial;
  int* counters;
};

// x = hi + mid + lo (each a bf16), exact to f32's 24 bits: split_bf16x3_kernel's planes.
__device__ __forceinline__ void split3(float v, uint16_t (&p)[3]) {
#pragma unroll
  for (int part = 0; part < 3; ++part) {
    const uint16_t b = static_cast<uint16_t>(pack_bf16(v, 0.0f) & 0xffffu);
    p[part] = b;
    v -= bf16_bits_to_f32(b);
  }
}

// The A fragment words of row `row` at columns col .. col+7: 4 bf16x2 words (columns 2i, 2i+1 in word i).
template <bool kFp8>
__device__ __forceinline__ uint4 weight_words(const ExactMmaArgs& a, int64_t row, int64_t col) {
  if (row >= a.out || col >= a.in) return make_uint4(0, 0, 0, 0);
  if constexpr (!kFp8) {
    return __ldg(reinterpret_cast<const uint4*>(a.w + (row * a.in + col) * 2));
  } else {
    const uint2 q = __ldg(reinterpret_cast<const uint2*>(a.w + row * a.in + col));
    const float sc = e8m0_to_f32(a.s[(row >> 7) * a.s_cols + (col >> 7)]);
    uint32_t words[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t word = k < 2 ? q.x : q.y;
      const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>((word >> (16 * (k % 2))) & 0xffffu), __NV_E4M3)));
      words[k] = pack_bf16(f.x * sc, f.y * sc);  // e4m3 (4 significant bits) times 2^e: exact in bf16
    }
    return make_uint4(words[0], words[1], words[2], words[3]);
  }
}

template <bool kFp8>
__global__ void __launch_bounds__(256) linear_exact_mma_kernel(ExactMmaArgs a) {
  pdl_prologue();
  extern __shared__ __align__(16) uint8_t planes[];  // [3][kTokens][kPlaneStride]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int slices = static_cast<int>(gridDim.y), slice = static_cast<int>(blockIdx.y);
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows, wrow = row0 + 16 * warp + g;
  const int64_t tok0 = static_cast<int64_t>(blockIdx.z) * kTokens;
  const int nt = static_cast<int>(min(a.T - tok0, static_cast<int64_t>(kTokens)));
  const int ntiles = (nt + 7) / 8;
  const int64_t c_begin = slice * a.slice_cols, c_end = min(a.in, c_begin + a.slice_cols);

  float acc[8][4];
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[n][i] = 0.0f;

  for (int64_t c0 = c_begin; c0 < c_end; c0 += kChunk) {
    __syncthreads();  // every warp is done with the previous chunk's planes
    // The chunk's x as three planes: thread -> (token, 4 columns); tokens past nt and columns past the
    // slice are zeros.
    for (int i = threadIdx.x; i < kTokens * kChunk / 4; i += 256) {
      const int tok = i / (kChunk / 4), c = 4 * (i % (kChunk / 4));
      float4 v = make_float4(0, 0, 0, 0);
      if (tok < nt && c0 + c < c_end) v = *reinterpret_cast<const float4*>(a.x + (tok0 + tok) * a.x_stride + c0 + c);
      uint16_t p[4][3];
      split3(v.x, p[0]);
      split3(v.y, p[1]);
      split3(v.z, p[2]);
      split3(v.w, p[3]);
#pragma unroll
      for (int part = 0; part < 3; ++part) {
        const uint2 word = make_uint2(uint32_t(p[0][part]) | (uint32_t(p[1][part]) << 16),
                                      uint32_t(p[2][part]) | (uint32_t(p[3][part]) << 16));
        *reinterpret_cast<uint2*>(planes + part * kPlaneBytes + tok * kPlaneStride + 2 * c) = word;
      }
    }
    __syncthreads();
    const int steps = static_cast<int>(min(static_cast<int64_t>(kChunk), c_end - c0) + 31) / 32;
    for (int s = 0; s < steps; ++s) {
      const int64_t col = c0 + 32 * s + 8 * t;
      const uint4 w0 = weight_words<kFp8>(a, wrow, col), w1 = weight_words<kFp8>(a, wrow + 8, col);
      const int boff = (32 * s + 8 * t) * 2;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        if (n >= ntiles) break;
        const int brow = (8 * n + g) * kPlaneStride + boff;
        // smallest plane first: y = W lo + W mid + W hi, term by term into the same accumulator
#pragma unroll
        for (int part = 2; part >= 0; --part) {
          const uint4 b = *reinterpret_cast<const uint4*>(planes + part * kPlaneBytes + brow);
          mma_bf16(acc[n], w0.x, w1.x, w0.y, w1.y, b.x, b.y);
          mma_bf16(acc[n], w0.z, w1.z, w0.w, w1.w, b.z, b.w);
        }
      }
    }
  }
  grid_dependents_launch();

  // C fragment: acc[n][0, 1] = row g, tokens 8n + 2t, +1; acc[n][2, 3] = row g + 8.
  float* dst = slices == 1 ? a.y : a.partial + static_cast<int64_t>(slice) * a.T * a.out;
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    if (n >= ntiles) break;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t row = wrow + 8 * (e >> 1);
      const int tok = 8 * n + 2 * t + (e & 1);
      if (row < a.out && tok < nt) dst[(tok0 + tok) * a.out + row] = acc[n][e];
    }
  }
  if (slices == 1) return;
  finish_split_k(a.partial, a.y, a.counters, blockIdx.x + static_cast<int64_t>(gridDim.x) * blockIdx.z, slices, row0,
                 kRows, a.out, a.T, tok0, tok0 + nt, 1.0f);
}

// K slices from the weight's shape alone (batch invariance): about two blocks a multiprocessor's worth of
// (row tile, slice) pairs at one token, slices of whole chunks.
int exact_mma_slices(int64_t out, int64_t in, int num_sms) {
  const int64_t tiles = (out + kRows - 1) / kRows, chunks = (in + kChunk - 1) / kChunk;
  int64_t s = (2 * static_cast<int64_t>(num_sms) + tiles - 1) / tiles;
  s = std::max<int64_t>(1, std::min({s, chunks, static_cast<int64_t>(kMaxSlices)}));
  const int64_t per = (chunks + s - 1) / s;  // chunks a slice; no slice left empty
  return static_cast<int>((chunks + per - 1) / per);
}

dim3 exact_mma_grid(const LinearParams& p, int slices) {
  return dim3(static_cast<unsigned>((p.w.out + kRows - 1) / kRows), static_cast<unsigned>(slices),
              static_cast<unsigned>((p.T + kTokens - 1) / kTokens));
}

int64_t slice_cols(int64_t in, int slices) {
  const int64_t chunks = (in + kChunk - 1) / kChunk;
  return (chunks + slices - 1) / slices * kChunk;
}

}  // namespace
}  // namespace dev

namespace {
// -1: not read from the environment yet; else an ExactPath.
std::atomic<int> g_exact_path{-1};
}  // namespace

ExactPath exact_path() {
  int v = g_exact_path.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv("TERN_EXACT_PATH");
    if (e == nullptr || std::string_view(e) == "auto") v = static_cast<int>(ExactPath::fp8_on_tensor_cores);
    else if (std::string_view(e) == "cuda-cores") v = static_cast<int>(ExactPath::cuda_cores);
    else if (std::string_view(e) == "tc") v = static_cast<int>(ExactPath::tensor_cores);
    else fail("TERN_EXACT_PATH=", e, ": expected auto (FP8 exact products on tensor cores, bf16 ones on CUDA cores), "
              "tc (all on tensor cores, split bf16 x3) or cuda-cores");
    g_exact_path.store(v, std::memory_order_relaxed);
  }
  return static_cast<ExactPath>(v);
}

void set_exact_path(ExactPath path) { g_exact_path.store(static_cast<int>(path), std::memory_order_relaxed); }

bool exact_on_tensor_cores(WeightKind kind) {
  const ExactPath p = exact_path();
  return p == ExactPath::tensor_cores || (p == ExactPath::fp8_on_tensor_cores && kind == WeightKind::fp8);
}

bool linear_exact_mma_ok(const LinearParams& p) {
  const auto aligned16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  // Plain products of bf16 weights or FP8 weights with e8m0 block scales (bf16 numbers), rows of whole
  // 8-column steps, 16-byte aligned x rows.
  if (!((p.w.kind == WeightKind::bf16) || (p.w.kind == WeightKind::fp8 && !p.w.scale_f32))) return false;
  if (p.rows_per_group != p.w.out || p.w.in % 8 != 0 || p.x_stride % 4 != 0 || !aligned16(p.w.w) ||
      !aligned16(p.x) || p.T == 0)
    return false;
  const int slices = dev::exact_mma_slices(p.w.out, p.w.in, p.num_sms);
  const dim3 g = dev::exact_mma_grid(p, slices);
  if (g.z > 65535) return false;
  return slices == 1 || (static_cast<int64_t>(g.x) * g.z <= p.num_counters && p.partial != nullptr &&
                         static_cast<int64_t>(slices) * p.T * p.w.out <= p.partial_floats);
}

int64_t linear_exact_mma_partial_floats(const LinearParams& p) {
  const int slices = dev::exact_mma_slices(p.w.out, p.w.in, p.num_sms);
  return slices > 1 ? static_cast<int64_t>(slices) * p.T * p.w.out : 0;
}

void launch_linear_exact_mma(const LinearParams& p, cudaStream_t stream) {
  static const bool attr = [] {
    cudaFuncSetAttribute(dev::linear_exact_mma_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, dev::kSmem);
    cudaFuncSetAttribute(dev::linear_exact_mma_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, dev::kSmem);
    return true;
  }();
  (void)attr;
  const int slices = dev::exact_mma_slices(p.w.out, p.w.in, p.num_sms);
  dev::ExactMmaArgs a{};
  a.w = static_cast<const uint8_t*>(p.w.w);
  a.s = static_cast<const uint8_t*>(p.w.s);
  a.out = p.w.out;
  a.in = p.w.in;
  a.s_cols = p.w.s_cols;
  a.fp8 = p.w.kind == WeightKind::fp8 ? 1 : 0;
  a.x = p.x;
  a.x_stride = p.x_stride;
  a.T = p.T;
  a.slice_cols = dev::slice_cols(p.w.in, slices);
  a.y = p.y;
  a.partial = p.partial;
  a.counters = p.counters;
  const dim3 grid = dev::exact_mma_grid(p, slices);
  if (a.fp8)
    launch(dev::linear_exact_mma_kernel<true>, grid, 256, dev::kSmem, stream, a);
  else
    launch(dev::linear_exact_mma_kernel<false>, grid, 256, dev::kSmem, stream, a);
}

}  // namespace tern::cuda
