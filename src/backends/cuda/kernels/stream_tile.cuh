// The weight-streaming core of the decode products with FP8 / FP4 weights (linear_stream;
// nvcc only). Builds on mma_tile.cuh's fragment layout and exact dequantization; what changes is where the
// bytes wait:
//
// - Weights: each lane copies its OWN 16-byte runs (4 rows x 16 B per chunk at MT = 2) into a per-warp ring
//   of kStages chunks in shared memory with cp.async (no registers held by loads in flight, no barriers:
//   a lane reads back only what it copied), so a warp keeps (kStages - 1) chunks = 6 KB in flight.
// - FP4 scales: the 4-byte (mxfp4) / 8-byte (nvfp4) scale word of each row for the chunk, one cp.async per
//   lane (lane t of row group g copies row r = t), read by the other lanes after a __syncwarp.
// - x: converted to bf16 once per block into shared memory (XWindow), laid out so that a lane's B fragment of
//   k-step S is one 8-byte load and a quad's loads fall in distinct banks. Every warp of the block and every
//   weight row share it: no per-warp conversion, no per-k-step global load.
//
// Numerics are those of mma_tile.cuh (weights exact, x rounded to bf16, f32 accumulation); the k order of
// a token's sum depends only on the chunk sequence, never on how many tokens share the tile.
#pragma once

#include "backends/cuda/kernels/act_quant_dev.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/mma_tile.cuh"

namespace tern::cuda::dev {

constexpr int kStages = 5;  // chunks per warp ring (kStages - 1 in flight while one is consumed)

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, bypassing L1; zero-filled when !valid (src must still be a mapped address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
// The same with an L2 prefetch size hint (`l2_prefetch` bytes: 0 none, 128 or 256; uniform across the warp): the
// L2 fetches the aligned 128 / 256 bytes around the 16 asked for, so a row read 64 bytes a stage (the grouped MoE
// kernels: 256 rows x 64 bytes, rows 2 KB apart) asks DRAM for runs of 2-4 stages at once (session 32:
// TERN_MOE_L2_HINT, tern_gpu_bench --only tile_probe).
__device__ __forceinline__ void cp_async16_l2(uint32_t dst, const void* src, int src_bytes, int l2_prefetch) {
  if (l2_prefetch >= 256)
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
                 : "memory");
  else if (l2_prefetch >= 128)
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
                 : "memory");
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
template <int N>  // 4 or 8 bytes
__device__ __forceinline__ void cp_async_small(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(smem_addr(dst)), "l"(src), "n"(N),
               "r"(valid ? N : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}
__device__ __forceinline__ uint4 lds128(const void* p) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(smem_addr(p)));
  return v;
}
__device__ __forceinline__ uint2 lds64(const void* p) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(smem_addr(p)));
  return v;
}

template <WeightFormat F>
constexpr bool is_fp4() {
  return F == WeightFormat::mxfp4 || F == WeightFormat::nvfp4;
}
// Bytes of one row's scale word per chunk (fp4), copied by one lane.
template <WeightFormat F>
constexpr int scale_word_bytes() {
  return F == WeightFormat::nvfp4 ? 8 : 4;
}

// Shared-memory bytes of one warp's ring: weights (2*MT rows x 32 lanes x 16 B per stage) and fp4 scale
// words (32 lanes x 8 B per stage).
template <WeightFormat F, int MT>
constexpr int ring_bytes() {
  return kStages * (2 * MT * 32 * 16 + (is_fp4<F>() ? 32 * 8 : 0));
}

// x of the block's tokens for a window of columns, bf16, in shared memory. Within each chunk, lane t's
// columns come in pieces of 8 (piece q at byte q*64 + t*16 of the chunk), so one k-step's B pair is the
// 8-byte half S%2 of piece S/2; fp4 pieces hold their 8 columns in the order 0,4,1,5,2,6,3,7 (the nibble
// pairs of e2m1x2_to_bf16x2_raw). Rows are `stride` bytes apart (== 64 mod 128: the two token rows of a
// quarter-warp's loads fall in different banks).
template <WeightFormat F>
struct XWindow {
  static constexpr int kChunkBytes = Fmt<F>::kChunk * 2;
  static constexpr int kPieces = Fmt<F>::kLaneCols / 8;
  static __host__ __device__ constexpr int stride(int cols) { return cols * 2 + 64; }
  static __host__ __device__ constexpr int bytes(int rows, int cols) { return rows * stride(cols); }
};

// One 8-column piece of x (columns cc .. cc + 7: a, c) as the window holds it, bf16 (fp4: in the order
// 0,4,1,5,2,6,3,7), and its byte offset in a window row from the row's first (chunk-aligned) column.
template <WeightFormat F>
__device__ __forceinline__ uint4 x_piece(const float4& a, const float4& c) {
  if constexpr (is_fp4<F>())
    return make_uint4(pack_bf16(a.x, c.x), pack_bf16(a.y, c.y), pack_bf16(a.z, c.z), pack_bf16(a.w, c.w));
  else
    return make_uint4(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w), pack_bf16(c.x, c.y), pack_bf16(c.z, c.w));
}
template <WeightFormat F>
__device__ __forceinline__ int64_t x_piece_offset(int64_t cc) {
  const int64_t chunk = cc / Fmt<F>::kChunk;
  const int in_chunk = static_cast<int>(cc % Fmt<F>::kChunk);
  const int t = in_chunk / Fmt<F>::kLaneCols, q = (in_chunk % Fmt<F>::kLaneCols) / 8;
  return chunk * XWindow<F>::kChunkBytes + q * 64 + t * 16;
}

// Fills the window (rows `stride` bytes apart): rows [0, rows) of the tile are x rows (row i of the tile at
// xrow(i), nullptr for a padding row: zeros), columns [col0, col0 + cols) of each. Called by all `nthreads`
// threads of the block.
// QUANT (--activations fp8): each 128 columns of a row quantised and dequantised as act_fake_quant does (the block's
// largest |value| over the 16 consecutive threads that hold its 8-column pieces, the reference's power-of-two scale,
// e4m3), so the window holds what staging the quantised rows would: the same bits, without the kernel that
// quantises them first. Needs col0 and cols multiples of 128 and nthreads a multiple of 32 (piece p sits in
// thread p mod nthreads, so a block's 16 pieces are one half-warp's, all inside or all past the rows).
template <WeightFormat F, bool QUANT = false, typename RowFn>
__device__ __forceinline__ void stage_x(uint8_t* win, int rows, int64_t col0, int cols, int stride, RowFn xrow,
                                        int tid, int nthreads) {
  // Pieces whose loads are in flight together (x comes from L2); 2 when quantising, whose extra live values made the
  // wide bulk MoE kernel (80 registers a thread) spill with 4.
  constexpr int kBatch = QUANT ? 2 : 4;
  const int per_row = cols / 8, total = rows * per_row;
  for (int p0 = tid; p0 < total; p0 += kBatch * nthreads) {
    float4 v[kBatch][2];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int p = p0 + b * nthreads;
      const float* src = p < total ? xrow(p / per_row) : nullptr;
      if (src != nullptr) {
        const float* at = src + col0 + (p % per_row) * 8;
        v[b][0] = __ldg(reinterpret_cast<const float4*>(at));
        v[b][1] = __ldg(reinterpret_cast<const float4*>(at + 4));
      } else {
        v[b][0] = v[b][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
    if constexpr (QUANT) {
      const unsigned half = 0xffffu << (tid & 16);  // this thread's half-warp: one 128-column block
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        float4& a = v[b][0];
        float4& c = v[b][1];  // the piece's 8 values
        float amax = fmaxf(fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(a.z), fabsf(a.w))),
                           fmaxf(fmaxf(fabsf(c.x), fabsf(c.y)), fmaxf(fabsf(c.z), fabsf(c.w))));
#pragma unroll
        for (int o = 1; o < 16; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(half, amax, o));
        const int k = fp8_scale_exponent(amax);
        const float inv = ldexpf(1.0f, -k), s = ldexpf(1.0f, k);
        a = make_float4(act_fake_quant_value(a.x, inv, s), act_fake_quant_value(a.y, inv, s),
                        act_fake_quant_value(a.z, inv, s), act_fake_quant_value(a.w, inv, s));
        c = make_float4(act_fake_quant_value(c.x, inv, s), act_fake_quant_value(c.y, inv, s),
                        act_fake_quant_value(c.z, inv, s), act_fake_quant_value(c.w, inv, s));
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int p = p0 + b * nthreads;
      if (p >= total) break;
      const int row = p / per_row, cc = (p % per_row) * 8;
      *reinterpret_cast<uint4*>(win + row * stride + x_piece_offset<F>(cc)) = x_piece<F>(v[b][0], v[b][1]);
    }
  }
}

// Why a product can take its x window ready-made: at 16-64 tokens, staging x per block (each of up to 256
// blocks reading and converting T x K floats from L2, 4 loads in flight a thread, between two barriers) cost
// more than the weights (session 8: wq_b at 64 tokens 43 us with no arithmetic at all, 17.5 us at one token).
// linear_x_window_kernel converts x once per product into the windows' byte order in global memory (row r at
// r * cols * 2 bytes; a chunk-aligned column range of a row is then one contiguous run of the window row), and
// copy_x_window fills a block's window from it with cp.async, every piece in flight at once. Same bytes as
// stage_x, so the same results bit for bit.
template <WeightFormat F>
__global__ void linear_x_window_kernel(const float* x, int64_t x_stride, int64_t T, int64_t cols, uint8_t* xw) {
  pdl_prologue();
  const int64_t per_row = cols / 8;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= T * per_row) return;
  const int64_t row = p / per_row, cc = (p % per_row) * 8;
  const float* at = x + row * x_stride + cc;
  const float4 a = __ldg(reinterpret_cast<const float4*>(at)), c = __ldg(reinterpret_cast<const float4*>(at + 4));
  *reinterpret_cast<uint4*>(xw + row * cols * 2 + x_piece_offset<F>(cc)) = x_piece<F>(a, c);
}

// The window from linear_x_window_kernel's rows: rows [0, rows) of the tile, row i at xw + i * xw_row_bytes and live
// while i < live (zeros past it), columns [col0, col0 + cols) (col0 chunk-aligned). Waits for its copies
// (cp.async.wait_group 0: also for the calling thread's earlier weight copies, which the window boundary
// then waits out once); the caller's __syncthreads publishes the window.
__device__ __forceinline__ void copy_x_window(uint8_t* win, int rows, int64_t live, const uint8_t* xw,
                                              int64_t xw_row_bytes, int64_t col0, int cols, int stride, int tid,
                                              int nthreads) {
  const int per_row = cols / 8, total = rows * per_row;  // 16-byte pieces
  for (int p = tid; p < total; p += nthreads) {
    const int row = p / per_row, piece = p % per_row;
    uint8_t* dst = win + row * stride + piece * 16;
    if (row < live) cp_async16(dst, xw + row * xw_row_bytes + col0 * 2 + piece * 16, true);
    else *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  }
  cp_async_commit();
  cp_async_wait<0>();
}

// A block's x window, the one place both streaming kernels fill it: rows [0, rows) are tokens tok0 + i (zeros
// from T on), columns [xcol0 + c0, + cols) of x (xcol0: the tile's row group). From the product's windows
// (xw, linear_x_window_kernel) when they were made, else read and converted here (stage_x). All threads.
template <WeightFormat F>
__device__ __forceinline__ void fill_x_window(uint8_t* win, int rows, int stride, const float* x, int64_t x_stride,
                                              int64_t T, int64_t tok0, int64_t xcol0, const uint8_t* xw,
                                              int64_t xw_row_bytes, int64_t c0, int cols) {
  if (xw != nullptr) {
    copy_x_window(win, rows, T - tok0, xw + tok0 * xw_row_bytes, xw_row_bytes, xcol0 + c0, cols, stride,
                  threadIdx.x, blockDim.x);
    return;
  }
  auto xrow = [&](int i) -> const float* {
    const int64_t tok = tok0 + i;
    return tok < T ? x + tok * x_stride + xcol0 : nullptr;
  };
  stage_x<F>(win, rows, c0, cols, stride, xrow, threadIdx.x, blockDim.x);
}

// The FP8 scale multipliers of a 128-row tile for its scale blocks sb0 .. sb0 + words - 1 (one per 128
// columns; zero past the matrix) as bf16x2: e4m3 raw is 2^-120, so W * 2^-16. All threads of the block.
__device__ __forceinline__ void stage_fp8_scales(const MatRef& mat, int64_t tile_row0, int64_t sb0, int words,
                                                 uint32_t* tab) {
  const int64_t srow = tile_row0 / 128;
  for (int j = threadIdx.x; j < words; j += blockDim.x) {
    const int64_t col = sb0 + j;
    float s = 0.0f;
    if (col < mat.s_cols) {
      const int64_t i = srow * mat.s_cols + col;
      s = mat.scale_f32 ? reinterpret_cast<const float*>(mat.s)[i] : e8m0_to_f32(mat.s[i]);
    }
    tab[j] = bf16x2_splat(s * 0x1p104f);
  }
}

// One lane's share of its warp's MT m-tiles: the 2*MT rows it copies (row r = m-tile r/2, row g + 8*(r%2)),
// and for fp4 the scale row it copies (r = t, when t < 2*MT).
template <WeightFormat F, int MT>
struct LaneSrc {
  const uint8_t* w[2 * MT];  // start of each weight row (a mapped address when !w_ok)
  bool w_ok[2 * MT];
  const uint8_t* s = nullptr;  // fp4: start of the scale row this lane copies
  bool s_ok = false;
};

// Issues this lane's copies of chunk `chunk` (matrix column chunk * kChunk) into ring stage `slot`.
template <WeightFormat F, int MT>
__device__ __forceinline__ void issue_chunk(uint8_t* ring, int slot, const LaneSrc<F, MT>& src, int64_t chunk,
                                            int lane) {
  constexpr int kRowBytes = 16 * 4;  // bytes of one row per chunk (4 lanes x 16 B)
  const int t = lane & 3;
  uint8_t* wst = ring + slot * (2 * MT * 32 * 16);
#pragma unroll
  for (int r = 0; r < 2 * MT; ++r)
    cp_async16(wst + (r * 32 + lane) * 16, src.w[r] + chunk * kRowBytes + t * 16, src.w_ok[r]);
  if constexpr (is_fp4<F>()) {
    constexpr int kWord = scale_word_bytes<F>();
    uint8_t* sst = ring + kStages * (2 * MT * 32 * 16) + slot * (32 * 8);
    if (t < 2 * MT) cp_async_small<kWord>(sst + lane * 8, src.s + chunk * kWord, src.s_ok);
  }
}

// Scale multiplier(s) of row r (fp4) from the ring's scale words of this row group.
template <WeightFormat F>
__device__ __forceinline__ void fp4_row_scales(const uint2& word, int t, uint32_t (&m)[2]) {
  if constexpr (F == WeightFormat::mxfp4) {
    m[0] = e8m0_mult_bf16x2((word.x >> (8 * t)) & 0xffu);  // e2m1 raw is 2^-126: W * 2^-16
    m[1] = m[0];
  } else {
    const uint32_t w = t < 2 ? word.x : word.y;
    ue4m3x2_mult_bf16x2(w >> (16 * (t & 1)), m);
  }
}

// acc[m][n] += the chunk in ring stage `slot` times the x window's chunk `wchunk`, for the n-tiles
// n < n_live (the rest are all padding). fp8_mult[m]: the bf16x2 scale multiplier of m-tile m for this
// chunk (fp8 only). FULL: n_live == NT, known at compile time (the common case from 9 tokens: no per-n-tile
// test around each load and mma; the same operations in the same order).
template <WeightFormat F, int MT, int NT, bool FULL = false>
__device__ __forceinline__ void consume_chunk(const uint8_t* ring, int slot, const uint8_t* win, int wstride,
                                              int wchunk, int n_live, const uint32_t (&fp8_mult)[MT],
                                              float (&acc)[MT][NT][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint8_t* wst = ring + slot * (2 * MT * 32 * 16);
  LaneRow<F> raw[MT][2];
#pragma unroll
  for (int r = 0; r < 2 * MT; ++r) raw[r / 2][r % 2].v[0] = lds128(wst + (r * 32 + lane) * 16);
  uint32_t msc[MT][2][2];
  if constexpr (is_fp4<F>()) {
    const uint8_t* sst = ring + kStages * (2 * MT * 32 * 16) + slot * (32 * 8) + g * 32;
    uint2 words[4];
    if constexpr (MT == 2) {
      const uint4 a = lds128(sst), b = lds128(sst + 16);
      words[0] = make_uint2(a.x, a.y), words[1] = make_uint2(a.z, a.w);
      words[2] = make_uint2(b.x, b.y), words[3] = make_uint2(b.z, b.w);
    } else {
      const uint4 a = lds128(sst);
      words[0] = make_uint2(a.x, a.y), words[1] = make_uint2(a.z, a.w);
    }
#pragma unroll
    for (int r = 0; r < 2 * MT; ++r) fp4_row_scales<F>(words[r], t, msc[r / 2][r % 2]);
  } else {
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) msc[m][h][0] = msc[m][h][1] = fp8_mult[m];
  }
  const uint8_t* xb = win + wchunk * XWindow<F>::kChunkBytes + t * 16 + g * wstride;
  static_for<XWindow<F>::kPieces>([&](auto qc) {
    constexpr int Q = decltype(qc)::value;
    uint4 b[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n)
      if (FULL || n < n_live) b[n] = lds128(xb + n * 8 * wstride + Q * 64);
    static_for<2>([&](auto hc) {
      constexpr int H = decltype(hc)::value, S = 2 * Q + H;
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const uint32_t a0 = a_pair<F, S, 0>(raw[m][0], msc[m][0]);
        const uint32_t a1 = a_pair<F, S, 0>(raw[m][1], msc[m][1]);
        const uint32_t a2 = a_pair<F, S, 1>(raw[m][0], msc[m][0]);
        const uint32_t a3 = a_pair<F, S, 1>(raw[m][1], msc[m][1]);
#pragma unroll
        for (int n = 0; n < NT; ++n)
          if (FULL || n < n_live)
            mma_bf16(acc[m][n], a0, a1, a2, a3, H == 0 ? b[n].x : b[n].z, H == 0 ? b[n].y : b[n].w);
      }
    });
  });
}

}  // namespace tern::cuda::dev
