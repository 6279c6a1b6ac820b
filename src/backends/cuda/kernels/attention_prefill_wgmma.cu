// Sparse attention of a prefill chunk on Hopper warpgroup MMAs (wgmma, sm_90a): the second version of the
// prefill kernel (TERN_ATTENTION_PREFILL=2; attention_prefill.cu, version 1, is mma.sync). Same contract:
// one block per query covers all its heads (padded to 64) and all its keys in tiles of 64, online softmax in
// base 2, the sink, bf16 q / K / V / P with f32 accumulation, P rounded to bf16 and the row sums over the
// rounded values; the rows are decoded by decode_tile_at, the same arithmetic as version 1 and the decode
// kernel, so every operand holds the same values and only the f32 summation order differs.
//
// Why: version 1's S = Q K^T reads 3 ldmatrix per 4 mma.sync and is shared-memory bound. wgmma reads its
// operands from shared memory once per warpgroup instruction (no register staging) and runs m64n64k16 per
// instruction, so S is Q (A, K-major) times the key tile (B, K-major) straight from shared memory, and P V
// takes P from the S accumulators in registers (the accumulator layout of 16 keys is the A fragment of one
// k16 step, as in FlashAttention-3) and V = the same key tile as an MN-major B (imm-trans-b): no P in shared
// memory, no exchange of row maxima between warps.
//
// Block: 256 threads = 2 warpgroups. Both compute the whole S (64 heads x 64 keys, 32 f32 a thread) and the
// same softmax (identical instructions on identical data: the same m and P bits in both), and warpgroup w
// keeps O for dims w * HD/2 .. (HD/2 = 256 at head_dim 512: 4 accumulators of m64n64, 128 f32 a thread).
// Duplicating S costs 1/3 more MMA work than splitting it, but a split would need the maxima and P of the
// other warpgroup through shared memory and two more barriers per tile.
//
// Per tile (the rounds of row lookups, the raw double buffer by cp.async, the q prologue and the L2 hints
// are version 1's): barrier A (raw rows landed; the last tile's MMAs, each warpgroup waited for its own,
// are done with the key tile), issue the next tile's raw rows, decode this tile into the 128-byte-swizzled
// key tile (wgmma's layout, wgmma.cuh), fence.proxy.async (the generic-proxy stores must be visible to the
// async proxy that wgmma reads through), barrier B, S by 32 wgmma, softmax in registers, O += P V by
// 4 x HD/128 wgmma. The decode does not overlap the MMAs (one key-tile buffer; see below).
//
// Version 3 (TERN_ATTENTION_PREFILL=3, kOverlap): the decode of a tile in HD/128 steps of 128 dims (2 swizzle
// blocks: every row's granules of those dims), each followed by fence.proxy.async, a block barrier and the 8
// S wgmma of those dims, issued without waiting: the tensor cores multiply step k while the threads decode
// step k + 1 (only the first step's decode is exposed), for HD/128 - 1 more barriers a tile. Same values,
// same MMAs in the same order: the same bits as version 2.
//
// Shared memory at head_dim 512 (every tile 1024-byte aligned, as the swizzle requires):
//   q bf16 swizzled [64 heads][512]   65,536
//   key tile bf16 swizzled [64][512]  65,536
//   row addresses [768]                6,144
//   mask [64]                            256
//   2 raw tiles (64 rows of 584 bytes) 74,752
//   alignment of the base              1,024
//   total                            213,248  (one block per SM; a second key tile to decode into while
//                                              the MMAs run would need 64 KiB more than the 227 KiB)
#include <algorithm>
#include <atomic>

#include "backends/cuda/kernels/act_quant_dev.cuh"
#include "backends/cuda/kernels/attention.cuh"
#include "backends/cuda/kernels/attention_prefill_steps.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/rope_dev.cuh"
#include "backends/cuda/kernels/wgmma.cuh"

namespace tern::cuda {
namespace dev {
namespace {


// Shared memory (dynamic, from a 1024-aligned base), offsets in bytes.
template <int HD>
struct WgmmaSmem {
  static constexpr size_t kTile = size_t{kTileKeys} * HD * 2;  // one swizzled bf16 tile of 64 rows
  static_assert(kTileHeads == 64 && kTileKeys == 64, "one m64 / n64 wgmma tile");
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kTile;
  static constexpr size_t kRows = 2 * kTile;                                 // const uint8_t* [kPrefillRound]
  static constexpr size_t kMask = kRows + kPrefillRound * 8;                        // int [kTileKeys]
  static constexpr size_t kRaw = (kMask + kTileKeys * 4 + 127) / 128 * 128;  // 2 raw tiles
  static size_t total(int64_t row_bytes) { return kRaw + 2 * raw_tile_bytes(row_bytes) + 1024; }
};

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Version 3's decode step: dims 64 kb0 .. 64 kb0 + 127 of the tile's 64 rows into the swizzled key tile, the
// values of decode_tile_at (fp8x8_to_bf16; the bf16 rope dims copied; masked rows and rows past nk zeros).
// 1024 granules of 8 dims, 4 a thread; 8 consecutive threads cover one row's 128 bytes of a block.
template <int HD>
__device__ __forceinline__ void decode_step(const KvRowDesc& f, const uint8_t* const* rows, int nk,
                                            const uint8_t* raw, uint8_t* tile, int kb0) {
  const int nope = HD - static_cast<int>(f.rope_dim), scale_at = nope + 2 * static_cast<int>(f.rope_dim);
#pragma unroll
  for (int u = 0; u < 2 * kTileKeys * 8 / kTileThreads; ++u) {
    const int task = threadIdx.x + kTileThreads * u;
    const int r = (task >> 3) & (kTileKeys - 1), d = 64 * (kb0 + (task >> 9)) + 8 * (task & 7);
    const bool valid = r < nk && rows[r] != nullptr;
    const uint8_t* src = raw + r * f.row_bytes;
    uint4 out = make_uint4(0, 0, 0, 0);
    if (valid) {
      if (d < nope) {
        out = fp8x8_to_bf16(*reinterpret_cast<const uint2*>(src + d), e8m0_to_f32(src[scale_at + d / 64]));
      } else {  // rope dims d .. d+7: bf16 at byte nope + 2 (d - nope) of the row
        const uint2 lo = *reinterpret_cast<const uint2*>(src + 2 * d - nope);
        const uint2 hi = *reinterpret_cast<const uint2*>(src + 2 * d - nope + 8);
        out = make_uint4(lo.x, lo.y, hi.x, hi.y);
      }
    }
    *reinterpret_cast<uint4*>(tile + sw128_offset<kTileKeys>(r, d)) = out;
  }
}

template <int HD, bool kOverlap>
__global__ void __launch_bounds__(kTileThreads, 1)
    attention_prefill_wgmma_kernel(AttentionParams a, int64_t q0) {
  pdl_prologue();
  using L = WgmmaSmem<HD>;
  constexpr int kNC = HD / 128;  // m64n64 O accumulators per warpgroup (half the dims each)
  constexpr int kKB = 64 * 128;  // bytes of one swizzled 64-column block of a 64-row tile
  extern __shared__ __align__(1024) uint8_t smem_base[];
  uint8_t* smem = smem_base + ((1024 - (smem_addr(smem_base) & 1023)) & 1023);
  uint8_t* sQ = smem + L::kQ;
  uint8_t* sK = smem + L::kK;
  auto* sRows = reinterpret_cast<const uint8_t**>(smem + L::kRows);
  auto* sMask = reinterpret_cast<int*>(smem + L::kMask);
  uint8_t* sRaw = smem + L::kRaw;
  const uint32_t q_addr = smem_addr(sQ), k_addr = smem_addr(sK);
  const size_t raw_bytes = raw_tile_bytes(a.fmt.row_bytes);

  const int64_t i = q0 + blockIdx.x;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int wg = warp >> 2, wq = warp & 3;  // warpgroup (dims half); warp in it: heads 16wq .. 16wq+15
  const int heads = static_cast<int>(a.heads);
  const KeyList kl = keys_of(a, i);  // eager mode (attention_path): the chunk's query start + i
  const int64_t total = kl.nwin + kl.count;
  const float scale2 = a.scale * kLog2e;
  {
    // The q and picks of the query one wave later into L2 (version 1's hint; nothing waits on it).
    const int64_t ahead = i + a.num_sms;
    if (ahead < q0 + static_cast<int64_t>(gridDim.x)) {
      const auto* qn = reinterpret_cast<const uint8_t*>(a.q + ahead * a.heads * HD);
      const int64_t q_bytes = a.heads * HD * 4;
      for (int64_t off = 128 * tid; off < q_bytes; off += 128 * kTileThreads) prefetch_l2(qn + off);
      if (a.selected != nullptr && 32 * tid < a.k_sel) prefetch_l2(a.selected + ahead * a.k_sel + 32 * tid);
    }
  }

  // o[c]: heads x dims 64 (wg * kNC + c) .. +63, the m64n64 accumulator layout: o[c][4j + 2hf + e] is head
  // 16wq + g + 8hf, dim 8j + 2t + e of the chunk.
  float o[kNC][32];
  float m_run[2], l_run[2];  // [row g / g + 8]; l_run is this thread's share (its 16 keys of each tile)
#pragma unroll
  for (int c = 0; c < kNC; ++c)
#pragma unroll
    for (int e = 0; e < 32; ++e) o[c][e] = 0.0f;
  m_run[0] = m_run[1] = -INFINITY;
  l_run[0] = l_run[1] = 0.0f;

  int64_t tile = 0;  // tiles walked so far (the raw buffer of tile T is T % 2)
  for (int64_t jr = 0; jr < total; jr += kPrefillRound) {
    const int nr = static_cast<int>(min(static_cast<int64_t>(kPrefillRound), total - jr));
    const int tiles = (nr + kTileKeys - 1) / kTileKeys;
    // The round's row addresses. No barrier before: sRows was last read by the previous round's last
    // decode, before its barrier B.
    lookup_round(a, i, kl, jr, nr, tid, sRows);
    __syncthreads();
    issue_raw(sRows, min(kTileKeys, nr), a.fmt.row_bytes, sRaw + (tile & 1) * raw_bytes);
    if (jr == 0) {
      // q as bf16 into the swizzled tile (heads past a.heads are zeros) while the first rows are in flight.
      load_q_bf16<HD>(a, i, heads, tid, sQ, [](int h, int d) { return sw128_offset<kTileHeads>(h, d); });
      fence_proxy_async();  // q is read by wgmma (async proxy) after barrier A
    }
    for (int tt = 0; tt < tiles; ++tt, ++tile) {
      const int nk = min(kTileKeys, nr - kTileKeys * tt);
      cp_async_wait_all();  // this thread's copies of this tile (the only group in flight)
      __syncthreads();      // A: every copy (and q) landed; both warpgroups' MMAs of the last tile are done
      if (tt + 1 < tiles)   // the next tile into the other buffer, last read by the decode of tile - 1
        issue_raw(sRows + kTileKeys * (tt + 1), min(kTileKeys, nr - kTileKeys * (tt + 1)), a.fmt.row_bytes,
                  sRaw + ((tile + 1) & 1) * raw_bytes);
      const uint8_t* const* rows = sRows + kTileKeys * tt;
      const uint8_t* raw = sRaw + (tile & 1) * raw_bytes;
      // S = Q K^T, 64 heads x 64 keys, over HD in steps of 16 (32 bytes into a 128-byte swizzled row).
      float s[32];
#pragma unroll
      for (int e = 0; e < 32; ++e) s[e] = 0.0f;
      wgmma_pin(s);
      if constexpr (!kOverlap) {
        decode_tile_at<HD>(a.fmt, rows, nk, raw, sK, sMask,
                           [](int r, int d) { return sw128_offset<kTileKeys>(r, d); });
        fence_proxy_async();  // the key tile is read by wgmma
        __syncthreads();      // B: the key tile and its mask are ready
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) {
          const uint32_t off = (kk >> 2) * kKB + (kk & 3) * 32;
          wgmma_ss_m64n64k16(s, sw128_desc(q_addr + off), sw128_desc(k_addr + off));
        }
      } else {
        if (tid < kTileKeys) sMask[tid] = tid < nk && rows[tid] != nullptr;  // read after the last wait
#pragma unroll
        for (int step = 0; step < HD / 128; ++step) {
          decode_step<HD>(a.fmt, rows, nk, raw, sK, 2 * step);
          fence_proxy_async();  // these dims of the key tile are read by wgmma
          __syncthreads();      // B(step): dims 128 step .. +127 (and, at step 0, the mask) are ready
          wgmma_fence();
#pragma unroll
          for (int kk = 8 * step; kk < 8 * step + 8; ++kk) {
            const uint32_t off = (kk >> 2) * kKB + (kk & 3) * 32;
            wgmma_ss_m64n64k16(s, sw128_desc(q_addr + off), sw128_desc(k_addr + off));
          }
          wgmma_commit();  // a group a step; the next step's decode runs while it multiplies
        }
      }
      if constexpr (!kOverlap) wgmma_commit();
      wgmma_wait_all();
      wgmma_pin(s);

      // This thread's keys: 8j + 2t + e (j < 8, e < 2) of rows g and g + 8.
      uint32_t valid = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = 8 * j + 2 * t + e;
          if (key < nk && sMask[key] != 0) valid |= 1u << (2 * j + e);
        }
      // Softmax step: scaled scores (base 2), masked keys -inf, the row max over the quad's 64 keys, P as
      // bf16 straight into the A fragments of P V (k step j / 2; cols 0..7 of it for even j, 8..15 odd).
      uint32_t pa[4][4];
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& v = s[4 * j + 2 * hf + e];
            v = (valid >> (2 * j + e)) & 1u ? v * scale2 : -INFINITY;
            mx = fmaxf(mx, v);
          }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        softmax_step<kTileKeys>(s, hf, mx, m_run[hf], l_run[hf], o, pa, [](int, uint32_t) {});
      }

      // O += P V: k step ks = keys 16ks .. (2048 bytes into each 64-dim block of the key tile), the
      // warpgroup's dim blocks wg * kNC + c.
#pragma unroll
      for (int c = 0; c < kNC; ++c) wgmma_pin(o[c]);
#pragma unroll
      for (int ks = 0; ks < kTileKeys / 16; ++ks) wgmma_pin(pa[ks]);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kTileKeys / 16; ++ks)
#pragma unroll
        for (int c = 0; c < kNC; ++c)
          wgmma_rs_m64n64k16_tb(o[c], pa[ks], sw128_desc(k_addr + (wg * kNC + c) * kKB + ks * 2048));
      wgmma_commit();
      wgmma_wait_all();  // the key tile is free for the next decode once every warpgroup is past barrier A
#pragma unroll
      for (int c = 0; c < kNC; ++c) wgmma_pin(o[c]);
    }
  }

  float l_row[2];  // the row sums over the quad's keys
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    l_row[hf] = l_run[hf];
    l_row[hf] += __shfl_xor_sync(0xffffffffu, l_row[hf], 1);
    l_row[hf] += __shfl_xor_sync(0xffffffffu, l_row[hf], 2);
  }
  prefill_epilogue<HD>(a, i, o, m_run, l_row, wg, wq, g, t, heads);
}

template <int HD, bool kOverlap>
cudaError_t launch_hd(const AttentionParams& p, cudaStream_t stream) {
  const size_t smem = WgmmaSmem<HD>::total(p.fmt.row_bytes);
  static std::atomic<size_t> opted_in{0};  // the most shared memory asked for so far
  if (smem > opted_in.load()) {
    // A failure shows as the launch's error.
    if (cudaFuncSetAttribute(attention_prefill_wgmma_kernel<HD, kOverlap>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)) == cudaSuccess)
      opted_in.store(smem);
  }
  constexpr int64_t kMaxGridX = int64_t{1} << 30;
  for (int64_t q0 = 0; q0 < p.n; q0 += kMaxGridX) {
    const int64_t nq = std::min(kMaxGridX, p.n - q0);
    const cudaError_t err = launch(attention_prefill_wgmma_kernel<HD, kOverlap>,
                                   dim3(static_cast<unsigned>(nq)), kTileThreads, smem, stream, p, q0);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace
}  // namespace dev

size_t attention_prefill_wgmma_smem_bytes(const KvRowDesc& f) {
  switch (f.head_dim) {
    case 128:
      return dev::WgmmaSmem<128>::total(f.row_bytes);
    case 256:
      return dev::WgmmaSmem<256>::total(f.row_bytes);
    case 512:
      return dev::WgmmaSmem<512>::total(f.row_bytes);
    default:
      return 0;
  }
}

cudaError_t launch_attention_prefill_wgmma(const AttentionParams& p, cudaStream_t stream,
                                           bool overlap_decode) {
  if (p.n == 0) return cudaSuccess;
  if (p.positions != nullptr) return cudaErrorInvalidValue;  // decode mode stays on attention_mma_kernel
  switch (p.fmt.head_dim) {
    case 128:
      return overlap_decode ? dev::launch_hd<128, true>(p, stream) : dev::launch_hd<128, false>(p, stream);
    case 256:
      return overlap_decode ? dev::launch_hd<256, true>(p, stream) : dev::launch_hd<256, false>(p, stream);
    case 512:
      return overlap_decode ? dev::launch_hd<512, true>(p, stream) : dev::launch_hd<512, false>(p, stream);
    default:
      return cudaErrorInvalidValue;  // attention_path sends only these here
  }
}

}  // namespace tern::cuda
