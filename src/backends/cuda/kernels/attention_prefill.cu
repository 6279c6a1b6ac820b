// Sparse attention of a prefill chunk on tensor cores (FP8 rows, up to 64 heads): one block of 8 warps per
// query covers all its heads (padded to 64 = 4 m-tiles of 16) and all its keys, in tiles of 64, with online
// softmax and the sink, so no split, no cluster and no merge (attention_mma.cu, the decode kernel, cuts a
// query over up to 5 blocks that each load q and meet in a DSMEM merge). Per query:
//   - its keys' row addresses are looked up once per round of up to kPrefillRound keys (3 per thread: CSA's 128 +
//     512 and HCA's 128 + up to 640 keys are one round), in the key order of attention_keys.cuh;
//   - q (128 KiB of f32 at 64 x 512) is rounded to bf16 into shared memory while the first tile's raw rows
//     are in flight;
//   - per tile: two block-wide barriers (A: the tile's raw bytes have landed and the previous tile's P V is
//     done with the key tile; B: the key tile is decoded). Right after A the next tile's raw rows are issued
//     (cp.async into the other raw buffer), so they arrive while this tile is decoded and computed. The S,
//     softmax and P V of the tile are attend_tile (attention_tile.cuh, the decode kernel's arithmetic) with
//     the row-maxima and P exchanges ordered by a named barrier of the 4 warps of the same 32 heads instead
//     of the whole block (the two head groups drift apart and overlap);
//   - q and the picks of the query one wave later are prefetched into L2 at the start (a hint);
//   - then the 4 warps of the same heads add their row sums (in warp order) and each writes its O slice:
//     out = O 2^(m - top) / (l 2^(m - top) + 2^(sink - top)), top = max(m, sink) (base 2).
// Numerics: the decode kernel's (bf16 q, K, V, P; f32 accumulation; P rounded to bf16 and the row sums over
// the rounded values), one split, so its error against the CPU reference is of the same size; its bits differ
// from the decode kernel's (that one merges up to 5 splits).
//
// Shared memory at head_dim 512: 225,536 bytes (one block per SM).
//
// Batch invariance: a query's result depends on its own keys only, but not the same bits as the decode
// kernel: attention_path sends a launch here only when AttentionParams::prefill says the caller's chunk takes
// the library GEMMs (many tokens, not --batch-invariant), never in decode mode.
#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "backends/cuda/kernels/attention.cuh"
#include "backends/cuda/kernels/attention_prefill_steps.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "core/env.h"

namespace tern::cuda {
namespace dev {
namespace {


// Shared memory (dynamic), offsets in bytes.
template <int HD>
struct PrefillSmem {
  static constexpr int kRowStride = kTileRowStride<HD>;
  static constexpr size_t kQ = 0;                                         // bf16 [kTileHeads][kRowStride]
  static constexpr size_t kK = kQ + size_t{kTileHeads} * kRowStride * 2;  // bf16 [kTileKeys][kRowStride]
  static constexpr size_t kP = kK + size_t{kTileKeys} * kRowStride * 2;   // bf16 [kTileHeads][kTilePStride]
  static constexpr size_t kRows = kP + size_t{kTileHeads} * kTilePStride * 2;  // const uint8_t* [kPrefillRound]
  static constexpr size_t kTmax = kRows + kPrefillRound * 8;                          // f32 [4][kTileHeads]
  static constexpr size_t kLsum = kTmax + 4 * kTileHeads * 4;                  // f32 [4][kTileHeads]
  static constexpr size_t kMask = kLsum + 4 * kTileHeads * 4;                  // int [kTileKeys]
  static constexpr size_t kRaw = (kMask + kTileKeys * 4 + 127) / 128 * 128;    // 2 raw tiles
  static size_t total(int64_t row_bytes) { return kRaw + 2 * raw_tile_bytes(row_bytes); }
};

// Orders the 4 warps of heads 32mp .. 32mp+31 (warps mp, mp + 2, mp + 4, mp + 6): named barrier 1 + mp
// (barrier 0 is __syncthreads).
struct HeadsSync {
  int mp;
  __device__ __forceinline__ void operator()() const {
    asm volatile("bar.sync %0, %1;" ::"r"(1 + mp), "r"(kTileThreads / 2) : "memory");
  }
};

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

template <int HD>
__global__ void __launch_bounds__(kTileThreads, 1) attention_prefill_kernel(AttentionParams a, int64_t q0) {
  pdl_prologue();
  using L = PrefillSmem<HD>;
  constexpr int kNT = HD / 32;  // n-tiles of 8 dims per warp in P V (a quarter of the dims)
  extern __shared__ __align__(128) uint8_t smem[];
  auto* sQ = reinterpret_cast<__nv_bfloat16*>(smem + L::kQ);
  auto* sK = reinterpret_cast<__nv_bfloat16*>(smem + L::kK);
  auto* sP = reinterpret_cast<__nv_bfloat16*>(smem + L::kP);
  auto* sRows = reinterpret_cast<const uint8_t**>(smem + L::kRows);
  auto* sTmax = reinterpret_cast<float*>(smem + L::kTmax);
  auto* sLsum = reinterpret_cast<float*>(smem + L::kLsum);
  auto* sMask = reinterpret_cast<int*>(smem + L::kMask);
  uint8_t* sRaw = smem + L::kRaw;
  const size_t raw_bytes = raw_tile_bytes(a.fmt.row_bytes);

  const int64_t i = q0 + blockIdx.x;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int mp = warp & 1, qq = warp >> 1;  // heads 32mp .. 32mp+31; key quarter / dim quarter qq
  const int heads = static_cast<int>(a.heads);
  const KeyList kl = keys_of(a, i);  // eager mode (attention_path): the chunk's query start + i
  const int64_t total = kl.nwin + kl.count;
  const float scale2 = a.scale * kLog2e;
  {
    // The q and picks of the query one wave later (query i + num_sms: its block starts, on some SM, about
    // when this one ends) into L2, so that its prologue reads L2 instead of HBM. Only a hint: nothing waits.
    const int64_t ahead = i + a.num_sms;
    if (ahead < q0 + static_cast<int64_t>(gridDim.x)) {
      const auto* qn = reinterpret_cast<const uint8_t*>(a.q + ahead * a.heads * HD);
      const int64_t q_bytes = a.heads * HD * 4;
      for (int64_t off = 128 * tid; off < q_bytes; off += 128 * kTileThreads) prefetch_l2(qn + off);
      if (a.selected != nullptr && 32 * tid < a.k_sel) prefetch_l2(a.selected + ahead * a.k_sel + 32 * tid);
    }
  }

  float o[2][kNT][4];
  float m_run[2][2], l_run[2][2];  // [m-tile][row g / g + 8]
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int n = 0; n < kNT; ++n) o[mi][n][0] = o[mi][n][1] = o[mi][n][2] = o[mi][n][3] = 0.0f;
    m_run[mi][0] = m_run[mi][1] = -INFINITY;
    l_run[mi][0] = l_run[mi][1] = 0.0f;
  }

  int64_t tile = 0;  // tiles walked so far (the raw buffer of tile T is T % 2)
  for (int64_t jr = 0; jr < total; jr += kPrefillRound) {
    const int nr = static_cast<int>(min(static_cast<int64_t>(kPrefillRound), total - jr));
    const int tiles = (nr + kTileKeys - 1) / kTileKeys;
    // The round's row addresses (all lookups of a thread in flight together, then stored). No barrier
    // before: sRows was last read by the previous round's last decode, before its barrier B.
    lookup_round(a, i, kl, jr, nr, tid, sRows);
    __syncthreads();
    // The round's first tile into raw buffer tile % 2 (last read by the decode of tile - 2, long done).
    issue_raw(sRows, min(kTileKeys, nr), a.fmt.row_bytes, sRaw + (tile & 1) * raw_bytes);
    if (jr == 0) {
      // q as bf16 (heads past a.heads are zeros) while the first tile's rows are in flight: kBatch float4 of
      // a thread loaded before any is stored, so 64 KiB of q is in flight per block.
      load_q_bf16<HD>(a, i, heads, tid, reinterpret_cast<uint8_t*>(sQ),
                      [](int h, int d) { return (h * L::kRowStride + d) * 2; });
    }
    for (int tt = 0; tt < tiles; ++tt, ++tile) {
      const int nk = min(kTileKeys, nr - kTileKeys * tt);
      cp_async_wait_all();  // this thread's copies of this tile (the only group in flight)
      __syncthreads();      // A: every thread's copies (and q) have landed; the last P V is done with sK / sP
      if (tt + 1 < tiles)   // the next tile into the other buffer, last read by the decode of tile - 1
        issue_raw(sRows + kTileKeys * (tt + 1), min(kTileKeys, nr - kTileKeys * (tt + 1)), a.fmt.row_bytes,
                  sRaw + ((tile + 1) & 1) * raw_bytes);
      decode_tile<HD>(a.fmt, sRows + kTileKeys * tt, nk, sRaw + (tile & 1) * raw_bytes, sK, sMask);
      __syncthreads();  // B: the key tile and its mask are ready
      attend_tile<HD>(sQ, sK, sP, sTmax, sMask, nk, scale2, o, m_run, l_run, HeadsSync{mp});
    }
  }

  // Row sums of the 4 warps of the same heads (each summed its own keys under the common running max).
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float l = l_run[mi][hf];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      if (t == 0) sLsum[qq * kTileHeads + 32 * mp + 16 * mi + 8 * hf + g] = l;
    }
  HeadsSync{mp}();  // the row sums of these heads are in (each warp reads only its own heads' rows)
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int row = 32 * mp + 16 * mi + 8 * hf + g;
      if (row >= heads) continue;
      const float l = ((sLsum[row] + sLsum[kTileHeads + row]) + sLsum[2 * kTileHeads + row]) +
                      sLsum[3 * kTileHeads + row];
      const float m = m_run[mi][hf], sink = a.sinks[row] * kLog2e;
      const float top = fmaxf(m, sink);
      const float keep = exp2f(m - top);
      const float w = keep / (l * keep + exp2f(sink - top));
      float* dst = a.out + (i * a.heads + row) * HD + qq * (HD / 4) + 2 * t;
#pragma unroll
      for (int n = 0; n < kNT; ++n)
        *reinterpret_cast<float2*>(dst + 8 * n) = make_float2(o[mi][n][2 * hf] * w, o[mi][n][2 * hf + 1] * w);
    }
}

template <int HD>
cudaError_t launch_hd(const AttentionParams& p, cudaStream_t stream) {
  const size_t smem = PrefillSmem<HD>::total(p.fmt.row_bytes);
  static std::atomic<size_t> opted_in{0};  // the most shared memory asked for so far
  if (smem > opted_in.load()) {
    // A failure shows as the launch's error.
    if (cudaFuncSetAttribute(attention_prefill_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)) == cudaSuccess)
      opted_in.store(smem);
  }
  constexpr int64_t kMaxGridX = int64_t{1} << 30;
  for (int64_t q0 = 0; q0 < p.n; q0 += kMaxGridX) {
    const int64_t nq = std::min(kMaxGridX, p.n - q0);
    const cudaError_t err = launch(attention_prefill_kernel<HD>, dim3(static_cast<unsigned>(nq)),
                                   kTileThreads, smem, stream, p, q0);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace
}  // namespace dev

size_t attention_prefill_v1_smem_bytes(const KvRowDesc& f) {
  switch (f.head_dim) {
    case 128:
      return dev::PrefillSmem<128>::total(f.row_bytes);
    case 256:
      return dev::PrefillSmem<256>::total(f.row_bytes);
    case 512:
      return dev::PrefillSmem<512>::total(f.row_bytes);
    default:
      return 0;
  }
}

namespace {
std::atomic<int> g_attention_prefill{-1};  // the version; -1: not read from the environment yet
// Version 5 (version 4's warp-specialised kernel on keys decoded once a launch) measured fastest on the H100
// (session 34, one layer at 8 192 queries): CSA 2.30 ms a layer against 4.88 (version 3), 7.05 (4), 6.02 (2), 6.49
// (1) and 8.63 (the decode kernel); HCA 1.47 against 2.40 (3); the 8K prefill 0.785 -> 0.742 s. Version 3 had been
// the default since session 9.
constexpr int kDefaultAttentionPrefill = 5;
}  // namespace

int attention_prefill_version() {
  int v = g_attention_prefill.load(std::memory_order_relaxed);
  if (v < 0) {
    v = static_cast<int>(env_int("TERN_ATTENTION_PREFILL", kDefaultAttentionPrefill, 0, 5));
    g_attention_prefill.store(v, std::memory_order_relaxed);
  }
  return v;
}

bool attention_prefill_enabled() { return attention_prefill_version() != 0; }

void set_attention_prefill(bool on) {
  g_attention_prefill.store(on ? kDefaultAttentionPrefill : 0, std::memory_order_relaxed);
}

void set_attention_prefill_version(int version) {
  g_attention_prefill.store(std::clamp(version, 0, 5), std::memory_order_relaxed);
}

size_t attention_prefill_smem_bytes(const KvRowDesc& f) {
  const int version = attention_prefill_version();
  return version >= 4  ? attention_prefill_ws_smem_bytes(f)
         : version >= 2 ? attention_prefill_wgmma_smem_bytes(f)
                        : attention_prefill_v1_smem_bytes(f);
}

cudaError_t launch_attention_prefill(const AttentionParams& p, cudaStream_t stream) {
  const int version = attention_prefill_version();
  if (version == 4) return launch_attention_prefill_ws(p, stream);
  if (version == 5) return launch_attention_prefill_pre(p, stream);
  return version >= 2 ? launch_attention_prefill_wgmma(p, stream, version == 3)
                      : launch_attention_prefill_v1(p, stream);
}

cudaError_t launch_attention_prefill_v1(const AttentionParams& p, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  if (p.positions != nullptr) return cudaErrorInvalidValue;  // decode mode stays on attention_mma_kernel
  switch (p.fmt.head_dim) {
    case 128:
      return dev::launch_hd<128>(p, stream);
    case 256:
      return dev::launch_hd<256>(p, stream);
    case 512:
      return dev::launch_hd<512>(p, stream);
    default:
      return cudaErrorInvalidValue;  // attention_path sends only these here
  }
}

}  // namespace tern::cuda
