// Sparse attention of a prefill chunk, warp-specialised (TERN_ATTENTION_PREFILL=4, sm_90a): version 4 of the prefill
// kernel. The contract of versions 1-3 (attention_prefill_wgmma.cu's head comment): one block a query, all its heads
// (padded to 64) and keys, online softmax in base 2, the sink, bf16 q / K / V / P with f32 sums, P rounded to bf16
// and the row sums over the rounded values, the rows decoded with fp8x8_to_bf16 (the same values as every version);
// the same epilogue (prefill_epilogue). Its sums run in another order (two 32-key tiles share a running max), so its
// bits are its own: held to the CPU and to version 2 within bf16 (GpuAttentionPrefill).
//
// Why (session 32): versions 2 / 3 run one block of 8 warps an SM whose phases never overlap: the row lookups, the
// raw copies' wait, the FP8 decode into the one key tile, S (computed twice: both warpgroups need all of it), the
// softmax and P V follow each other behind five block barriers a tile; ncu (session 30, 1K prefill, CSA): 68.6% of
// cycles with no eligible warp, ~15 us a 64-key tile against ~1.5-3 us of MMA. FlashMLA's sparse kernels (sm90)
// keep the tensor cores fed with a producer warpgroup and split the work of two key tiles between two consumer
// warpgroups; this kernel takes that shape (written from reading it, not copied):
//
// Block: 384 threads. Warps 0..7 = two consumer warpgroups (setmaxnreg 216), warps 8..11 = the producer warpgroup
// (setmaxnreg 72). The keys go in tiles of 32 through a ring of 4 bf16 key tiles (128-byte swizzled [32][HD],
// wgmma's layout) on mbarriers (bulk_pipe.cuh's BulkRing: full = the 128 producer threads' arrivals, empty = the 8
// consumer warps').
// - Producer: looks up 128 keys' rows at once (a thread a key; the next round's lookups in flight while this round's
//   tiles decode), then for each tile waits for a free slot, decodes the tile's FP8 rows straight from global memory
//   (no raw staging: a thread 16 granules of 8 dims, 8 threads a row's 128-byte swizzle block), writes the rows'
//   mask, fence.proxy.async, arrives.
// - Consumers: warpgroup w takes tile 2j + w of pair j: S_w = Q K_w^T (64 heads x 32 keys, 32 wgmma m64n32k16 from
//   shared memory), its masked row maxima to shared memory, one named barrier, the pair's maximum from both; P_w =
//   2^(S_w - m) as bf16 into registers (the A fragments of P V) and into shared memory (sw128 [64][64], keys 0..31);
//   a second named barrier; then O[:, dims of w] += P_w V_w + P_(1-w) V_(1-w), its own P from registers, the
//   other's from shared memory (each warpgroup owns half of HD, as in versions 2 / 3). Both slots are released when
//   the warpgroup's P V is done. The row sums stay per warpgroup and meet once at the end.
// So S is computed once (versions 2 / 3: twice), the decode of pair j + 1 overlaps pair j's MMAs, and a pair costs
// two named barriers of the consumers instead of ten block barriers.
//
// Shared memory at head_dim 512: q 64 KB, 4 key tiles 128 KB, 2 P tiles 16 KB, maxima / sums / masks / row addresses
// / barriers ~3 KB, 1 KB of alignment: ~212 KB, one block an SM.
//
// Version 5 (TERN_ATTENTION_PREFILL=5, session 34): the same kernel on keys decoded once a launch. Version 4's producer
// decodes every key of every query (FP8 rows straight from global memory, a thread's loads, conversions and stores in
// one chain: an L2 round trip a tile), yet a chunk's queries share their keys: at 8K tokens a CSA layer's ~10 400 rows
// (the chunk, the ring's window, the compressed rows) are decoded ~500 times each. attention_kv_bf16_kernel writes
// them once as bf16 rows (the same values: fp8x8_to_bf16, the rope dims copied) into the launch's workspace
// (attention_prefill_kv_bytes; AttentionParams::partial), and the producer only copies each tile's rows into the
// swizzled slot with cp.async (16 granules a thread, the slot's full barrier armed by cp.async.mbarrier.arrive.noinc),
// so the ring runs ahead of the consumers. The same bf16 tiles in the same order: version 4's bits.
#include <algorithm>

#include "backends/cuda/kernels/attention.cuh"
#include "backends/cuda/kernels/attention_prefill_steps.cuh"
#include "backends/cuda/kernels/bulk_pipe.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/stream_tile.cuh"
#include "backends/cuda/kernels/wgmma.cuh"

namespace tern::cuda {
namespace dev {
namespace {

constexpr int kWsKeys = 32;                                // keys a tile (a ring slot)
constexpr int kWsSlots = 4;                                // the consumers read two, the producer fills two
constexpr int kWsConsumers = 256;                          // warps 0..7
constexpr int kWsProducers = 128;                          // warps 8..11
constexpr int kWsThreads = kWsConsumers + kWsProducers;
constexpr int kWsRound = kWsProducers;                     // keys looked up at once, one a producer thread
constexpr int kWsProducerRegs = 72, kWsConsumerRegs = 216;  // 128 x 72 + 256 x 216 = 384 x 168
static_assert(kWsProducers * kWsProducerRegs + kWsConsumers * kWsConsumerRegs <= 65536);
static_assert(kTileThreads == kWsConsumers, "load_q_bf16 strides over the consumers");
// Named barriers (0 is __syncthreads): the consumers' (q loaded, maxima in, P in, sums in), the producer's rows.
constexpr int kBarQ = 1, kBarMax = 2, kBarP = 3, kBarSum = 4, kBarRows = 5;
// Measured and dropped (session 35, each alone against this form on the 8K prefill, H100, results.md): the next
// pair's S issued right after P V (+0.7% a layer), q loaded 4 heads a warp at once (+1.3%), a persistent grid (a block
// a multiprocessor, the producer running on into the next query: +6.5%). Kept: version 5 reads the epilogue's sinks and
// rope sines in the prologue (prefill_epilogue_tables; -1.9%).

template <int HD>
struct WsSmem {
  static constexpr size_t kQBytes = size_t{kTileHeads} * HD * 2;  // sw128 [64][HD]
  static constexpr size_t kSlotBytes = size_t{kWsKeys} * HD * 2;  // sw128 [32][HD]
  static constexpr size_t kBlock = size_t{kWsKeys} * 128;         // one 64-dim block of a key tile
  static constexpr size_t kPBytes = size_t{kTileHeads} * 128;     // sw128 [64][64], keys 0..31 used
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + kQBytes;
  static constexpr size_t kP = kK + kWsSlots * kSlotBytes;
  static constexpr size_t kMax = kP + 2 * kPBytes;                 // float [2][64]
  static constexpr size_t kSum = kMax + 2 * kTileHeads * 4;        // float [2][64]
  static constexpr size_t kMask = kSum + 2 * kTileHeads * 4;       // int [slots][32]
  static constexpr size_t kRows = kMask + kWsSlots * kWsKeys * 4;  // const uint8_t* [kWsRound]
  static constexpr size_t kSincos = kRows + kWsRound * 8;          // float2 [32]: the output's rope pairs
  static constexpr size_t kSinks = kSincos + 32 * 8;               // float [kTileHeads]
  static constexpr size_t kBars = kSinks + kTileHeads * 4;         // full [slots], empty [slots]
  static constexpr size_t kTotal = kBars + 2 * kWsSlots * 8 + 1024;  // + the base's alignment to 1024
  static_assert(kK % 1024 == 0 && kP % 1024 == 0 && kSlotBytes % 1024 == 0 && kPBytes % 1024 == 0);
};

// Producer thread p's share of a 32-key tile: rows p / 8 and p / 8 + 16, granule p % 8 of each 64-dim block: fn(r, d,
// src) for each (src: row r's address, nullptr for a masked row or one past the keys); mask[r] says which rows are
// keys. rows: the tile's 32 row addresses.
template <int HD, typename Fn>
__device__ __forceinline__ void ws_tile_granules(const uint8_t* const* rows, int* mask, int p, Fn fn) {
  if (p < kWsKeys) mask[p] = rows[p] != nullptr;
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int r = (p >> 3) + 16 * u;
    const uint8_t* src = rows[r];
#pragma unroll
    for (int kb = 0; kb < HD / 64; ++kb) fn(r, 64 * kb + 8 * (p & 7), src);
  }
}

// Version 4: the granules decoded (decode_tile_at's values; masked rows zeros) into the 128-byte-swizzled tile.
template <int HD>
__device__ __forceinline__ void ws_decode_tile(const KvRowDesc& f, const uint8_t* const* rows, uint8_t* tile,
                                               int* mask, int p) {
  const int64_t nope = HD - f.rope_dim, scale_at = nope + 2 * f.rope_dim;
  ws_tile_granules<HD>(rows, mask, p, [&](int r, int d, const uint8_t* src) {
    *reinterpret_cast<uint4*>(tile + sw128_offset<kWsKeys>(r, d)) =
        src != nullptr ? fp8_row_granule_bf16(src, d, nope, scale_at) : make_uint4(0, 0, 0, 0);
  });
}

// Version 5: the granules copied (cp.async, 16 bytes) from the bf16 rows attention_kv_bf16_kernel wrote; a masked row
// zero-filled (any_row: a mapped address for its zero-byte copy). The caller arms the slot's full barrier once these
// land (cp_async_mbar_arrive_noinc) and again for the mask (mbar_arrive).
template <int HD>
__device__ __forceinline__ void ws_copy_tile(const uint8_t* const* rows, const uint8_t* any_row, uint8_t* tile,
                                             int* mask, int p) {
  ws_tile_granules<HD>(rows, mask, p, [&](int r, int d, const uint8_t* src) {
    cp_async16(tile + sw128_offset<kWsKeys>(r, d), src != nullptr ? src + 2 * d : any_row, src != nullptr);
  });
}

// Version 5's decode of a launch's key rows (the chunk's n rows, the ring's window rows, the num_compressed compressed
// rows, in that order) into bf16 rows of head_dim at out + kKvHead: a thread a granule of 8 dims, ws_decode_tile's
// values (fp8_row_granule_bf16). out's first 4 bytes: the flat block table's one entry (0) of the compressed rows'
// PagedRowsDesc.
constexpr int64_t kKvHead = 16;
// The ring's rows in the copy (its whole window, or none without a ring), between the chunk's and the compressed ones.
__host__ __device__ inline int64_t kv_bf16_ring_rows(const AttentionParams& p) {
  return p.ring != nullptr ? p.window : 0;
}
__global__ void attention_kv_bf16_kernel(AttentionParams a, uint8_t* out) {
  pdl_prologue();
  const int64_t hd = a.fmt.head_dim, granules = hd / 8, row_out = 2 * hd;
  const int64_t nope = hd - a.fmt.rope_dim, scale_at = nope + 2 * a.fmt.rope_dim;
  const int64_t n_ring = kv_bf16_ring_rows(a), rows = a.n + n_ring + a.num_compressed;
  if (blockIdx.x == 0 && threadIdx.x == 0) *reinterpret_cast<int32_t*>(out) = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * granules;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / granules, d = 8 * (i - r * granules);
    const uint8_t* src = r < a.n            ? a.chunk_rows + r * a.fmt.row_bytes
                         : r < a.n + n_ring ? a.ring + (r - a.n) * a.fmt.row_bytes
                                            : paged_row(a.compressed, r - a.n - n_ring);
    *reinterpret_cast<uint4*>(out + kKvHead + r * row_out + 2 * d) = fp8_row_granule_bf16(src, d, nope, scale_at);
  }
}

// Version 5's launch parameters: p's, with the key rows read from the bf16 copy at buf (attention_kv_bf16_kernel):
// rows of 2 head_dim bytes, the compressed ones as one flat page (table[0] = 0).
AttentionParams kv_bf16_params(const AttentionParams& p, uint8_t* buf) {
  AttentionParams b = p;
  const int64_t row = 2 * p.fmt.head_dim, n_ring = kv_bf16_ring_rows(p);
  uint8_t* base = buf + kKvHead;
  b.fmt.row_bytes = row;
  b.chunk_rows = base;
  b.ring = p.ring != nullptr ? base + p.n * row : nullptr;
  b.compressed = PagedRowsDesc{base + (p.n + n_ring) * row, reinterpret_cast<const int32_t*>(buf), 0, 0,
                               int64_t{1} << 40, row};
  return b;
}

// Block b takes query q0 + b. prefetch_ahead: the query that many later has its q and picks prefetched into L2 by
// this block (0: none).
template <int HD, bool PRE>
__global__ void __launch_bounds__(kWsThreads, 1) attention_prefill_ws_kernel(AttentionParams a, int64_t q0,
                                                                             int64_t q_end, int64_t prefetch_ahead) {
  pdl_prologue();
  using L = WsSmem<HD>;
  constexpr int kNC = HD / 128;  // m64n64 O accumulators a consumer warpgroup (half the dims each)
  extern __shared__ __align__(1024) uint8_t smem_base[];
  uint8_t* smem = smem_base + ((1024 - (smem_addr(smem_base) & 1023)) & 1023);
  uint8_t* sQ = smem + L::kQ;
  uint8_t* sK = smem + L::kK;
  uint8_t* sP = smem + L::kP;
  auto* sMax = reinterpret_cast<float*>(smem + L::kMax);
  auto* sSum = reinterpret_cast<float*>(smem + L::kSum);
  auto* sMask = reinterpret_cast<int*>(smem + L::kMask);
  auto* sRows = reinterpret_cast<const uint8_t**>(smem + L::kRows);
  auto* bars = reinterpret_cast<uint64_t*>(smem + L::kBars);
  const BulkRing ring{bars, bars + kWsSlots, kWsSlots};

  const int tid = threadIdx.x, warp = tid >> 5;
  const int64_t i = q0 + blockIdx.x;
  // The query's keys and its pairs of 32-key tiles (both roles).
  const KeyList kl = keys_of(a, i);
  const int64_t total = kl.nwin + kl.count;
  const int pairs = static_cast<int>((total + 2 * kWsKeys - 1) / (2 * kWsKeys));
  if (tid == 0) {
    ring.init(kWsConsumers / 32, PRE ? 2 * kWsProducers : kWsProducers);  // (version 5: the copies' and the mask's)
    mbar_init_fence();
  }
  __syncthreads();

  if (warp >= kWsConsumers / 32) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kWsProducerRegs));
    const int p = tid - kWsConsumers;
    RingCursor c;
    const int64_t keys = int64_t{2} * kWsKeys * pairs;  // the last pair's second tile may hold no key
    const uint8_t* next = p < total ? key_row(a, i, kl, p) : nullptr;
    for (int64_t jr = 0; jr < keys; jr += kWsRound) {
      named_bar_sync(kBarRows, kWsProducers);  // the previous round's tiles are decoded: sRows is free
      sRows[p] = next;
      named_bar_sync(kBarRows, kWsProducers);
      const int64_t jn = jr + kWsRound + p;  // the next round's lookups fly while this round's tiles decode
      next = jn < total ? key_row(a, i, kl, jn) : nullptr;
      const int tiles = static_cast<int>(min(static_cast<int64_t>(kWsRound), keys - jr) / kWsKeys);
      for (int tt = 0; tt < tiles; ++tt, c.next(kWsSlots)) {
        ring.wait_free_at(c.slot, c.parity);
        if constexpr (PRE) {
          ws_copy_tile<HD>(sRows + kWsKeys * tt, a.chunk_rows, sK + c.slot * L::kSlotBytes, sMask + kWsKeys * c.slot,
                           p);
          cp_async_mbar_arrive_noinc(&ring.full[c.slot]);  // once this thread's copies have landed
        } else {
          ws_decode_tile<HD>(a.fmt, sRows + kWsKeys * tt, sK + c.slot * L::kSlotBytes, sMask + kWsKeys * c.slot, p);
          fence_proxy_async();  // the tile is read by wgmma (async proxy)
        }
        mbar_arrive(&ring.full[c.slot]);
      }
    }
    if constexpr (PRE) cp_async_wait_all();  // no copy of this thread in flight when it exits
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kWsConsumerRegs));
  const int lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int wg = warp >> 2, wq = warp & 3;  // warpgroup: its tile of a pair and its half of the dims
  const int heads = static_cast<int>(a.heads);
  const float scale2 = a.scale * kLog2e;
  const EpilogueTables tables{reinterpret_cast<float2*>(smem + L::kSincos), reinterpret_cast<float*>(smem + L::kSinks)};
  const uint32_t q_addr = smem_addr(sQ), k_addr = smem_addr(sK), p_addr = smem_addr(sP);
  RingCursor c0;  // the pair's first tile (warpgroup 0's); its second (warpgroup 1's) is c0 + 1
  // The q and picks of the query prefetch_ahead later into L2 (versions 1-3's hint: one wave later; nothing waits on
  // it).
  if (const int64_t ahead = i + prefetch_ahead; prefetch_ahead > 0 && ahead < q_end) {
    const auto* qn = reinterpret_cast<const uint8_t*>(a.q + ahead * a.heads * HD);
    const int64_t q_bytes = a.heads * HD * 4;
    for (int64_t off = 128 * tid; off < q_bytes; off += 128 * kWsConsumers)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(qn + off));
    if (a.selected != nullptr && 32 * tid < a.k_sel)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(a.selected + ahead * a.k_sel + 32 * tid));
  }
  // Version 5: the epilogue's sinks and rope sines first (their loads in flight under q's); then q.
  if constexpr (PRE) prefill_epilogue_tables<HD>(a, i, heads, tid, tables);
  load_q_bf16<HD>(a, i, heads, tid, sQ, [](int h, int d) { return sw128_offset<kTileHeads>(h, d); });
  fence_proxy_async();  // q is read by wgmma
  named_bar_sync(kBarQ, kWsConsumers);  // (also publishes the tables)

  float o[kNC][32];
  float m_run[2], l_run[2];  // [row g / g + 8]; l_run over this warpgroup's keys and this thread's columns
#pragma unroll
  for (int c = 0; c < kNC; ++c)
#pragma unroll
    for (int e = 0; e < 32; ++e) o[c][e] = 0.0f;
  m_run[0] = m_run[1] = -INFINITY;
  l_run[0] = l_run[1] = 0.0f;

  // S = Q K^T of the tile in slot `slot` (64 heads x 32 keys, over HD in steps of 16) into s, issued and committed
  // as one wgmma group, not waited for.
  float s[16];
  const auto issue_s = [&](int slot, uint32_t parity) {
    ring.wait_full_at(slot, parity);
    if constexpr (PRE) fence_proxy_async();  // the producer's cp.async (generic proxy) before wgmma's reads
    const uint32_t k_tile = k_addr + slot * L::kSlotBytes;
#pragma unroll
    for (int e = 0; e < 16; ++e) s[e] = 0.0f;
    wgmma_pin(s);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk)
      wgmma_ss_m64n32k16(s, sw128_desc(q_addr + (kk >> 2) * (kTileHeads * 128) + (kk & 3) * 32),
                         sw128_desc(k_tile + (kk >> 2) * L::kBlock + (kk & 3) * 32));
    wgmma_commit();
  };
  for (int pair = 0; pair < pairs; ++pair) {
    RingCursor c1 = c0;
    c1.next(kWsSlots);
    issue_s(wg == 0 ? c0.slot : c1.slot, wg == 0 ? c0.parity : c1.parity);
    const int slot_mine = wg == 0 ? c0.slot : c1.slot, slot_theirs = wg == 0 ? c1.slot : c0.slot;
    const uint32_t par_theirs = wg == 0 ? c1.parity : c0.parity;
    const uint32_t k_mine = k_addr + slot_mine * L::kSlotBytes, k_theirs = k_addr + slot_theirs * L::kSlotBytes;
    wgmma_wait_all();  // this pair's S (and the previous pair's P V, an older group)
    wgmma_pin(s);

    // This thread's keys 8j + 2t + e (j < 4) of rows g and g + 8: scaled (base 2), masked -inf, the rows' maxima
    // over the quad, to shared memory for the other warpgroup.
    const int* mask = sMask + kWsKeys * slot_mine;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& v = s[4 * j + 2 * hf + e];
          v = mask[8 * j + 2 * t + e] != 0 ? v * scale2 : -INFINITY;
          mx = fmaxf(mx, v);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      if (t == 0) sMax[kTileHeads * wg + 16 * wq + 8 * hf + g] = mx;
    }
    named_bar_sync(kBarMax, kWsConsumers);  // both warpgroups' maxima are in

    // The pair's running max, P as bf16 into the A fragments of P V (k step j / 2; columns 0..7 of it for even j,
    // 8..15 odd) and into shared memory for the other warpgroup; O and the row sums rescaled.
    uint32_t pa[2][4];
    uint8_t* p_mine = sP + wg * L::kPBytes;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int row = 16 * wq + 8 * hf + g;
      softmax_step<kWsKeys>(s, hf, fmaxf(sMax[row], sMax[kTileHeads + row]), m_run[hf], l_run[hf], o, pa,
                            [&](int j, uint32_t p2) {
                              *reinterpret_cast<uint32_t*>(p_mine + sw128_offset<kTileHeads>(row, 8 * j + 2 * t)) =
                                  p2;
                            });
    }
    fence_proxy_async();                          // P is read by the other warpgroup's wgmma
    ring.wait_full_at(slot_theirs, par_theirs);     // the other tile's rows, for this warpgroup's P V
    if constexpr (PRE) fence_proxy_async();
    named_bar_sync(kBarP, kWsConsumers);          // both P tiles are in

    // O[:, dims of this warpgroup] += P_mine V_mine + P_theirs V_theirs: V = the key tiles (MN-major B), this
    // warpgroup's 64-dim blocks wg * kNC + c, k step ks = keys 16 ks .. (2 048 bytes into each block). The same
    // order in both warpgroups (warpgroup 1 adds its tile, the pair's second, first): a branch on the warpgroup
    // around the MMAs made ptxas serialise them (C7520, a warpgroup.arrive in a divergent path).
    const uint32_t p_theirs = p_addr + (1 - wg) * L::kPBytes;
#pragma unroll
    for (int c = 0; c < kNC; ++c) wgmma_pin(o[c]);
    wgmma_pin(pa[0]);
    wgmma_pin(pa[1]);
    wgmma_fence();
    const uint32_t v_mine = k_mine + wg * kNC * L::kBlock, v_theirs = k_theirs + wg * kNC * L::kBlock;
#pragma unroll
    for (int ks = 0; ks < kWsKeys / 16; ++ks)
#pragma unroll
      for (int c = 0; c < kNC; ++c)
        wgmma_rs_m64n64k16_tb(o[c], pa[ks], sw128_desc(v_mine + c * L::kBlock + ks * 2048));
#pragma unroll
    for (int ks = 0; ks < kWsKeys / 16; ++ks)
#pragma unroll
      for (int c = 0; c < kNC; ++c)
        wgmma_ss_m64n64k16_tb(o[c], sw128_desc(p_theirs + ks * 32), sw128_desc(v_theirs + c * L::kBlock + ks * 2048));
    wgmma_commit();
    wgmma_wait_all();  // P V: its slots are free, O is whole
    // P's registers (read by the asynchronous P V) stay live until it is done.
    wgmma_pin(pa[0]);
    wgmma_pin(pa[1]);
#pragma unroll
    for (int c = 0; c < kNC; ++c) wgmma_pin(o[c]);
    ring.release_at(c0.slot);
    ring.release_at(c1.slot);
    c0 = c1;
    c0.next(kWsSlots);  // the next pair's first tile
  }

  // The row sums: this warpgroup's over the quad, then both warpgroups'.
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float l = l_run[hf];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (t == 0) sSum[kTileHeads * wg + 16 * wq + 8 * hf + g] = l;
  }
  named_bar_sync(kBarSum, kWsConsumers);
  float l_row[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int row = 16 * wq + 8 * hf + g;
    l_row[hf] = sSum[row] + sSum[kTileHeads + row];
  }
  prefill_epilogue<HD>(a, i, o, m_run, l_row, wg, wq, g, t, heads, PRE ? tables : EpilogueTables{nullptr, nullptr});
}

template <int HD, bool PRE>
cudaError_t launch_ws(const AttentionParams& p, cudaStream_t stream) {
  constexpr size_t kSmem = WsSmem<HD>::kTotal;
  // Each launch (cheap next to the kernel; a failure is the launch's error, and every device is covered).
  const cudaError_t attr = cudaFuncSetAttribute(attention_prefill_ws_kernel<HD, PRE>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem));
  if (attr != cudaSuccess) return attr;
  // Version 4 prefetches the q one wave ahead into L2 (versions 1-3's hint); version 5 none: with it the 8K prefill's
  // attention ran 5.6% slower a layer (session 35, H100: 2 150-2 171 against 2 037-2 043 us).
  const int64_t ahead = PRE ? 0 : std::max(p.num_sms, 1);
  constexpr int64_t kMaxGridX = int64_t{1} << 30;
  for (int64_t q0 = 0; q0 < p.n; q0 += kMaxGridX) {
    const int64_t nq = std::min(kMaxGridX, p.n - q0);
    const cudaError_t err = launch(attention_prefill_ws_kernel<HD, PRE>, dim3(static_cast<unsigned>(nq)), kWsThreads,
                                   kSmem, stream, p, q0, q0 + nq, ahead);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

template <bool PRE>
cudaError_t launch_ws_hd(const AttentionParams& p, cudaStream_t stream) {
  switch (p.fmt.head_dim) {
    case 128:
      return launch_ws<128, PRE>(p, stream);
    case 256:
      return launch_ws<256, PRE>(p, stream);
    case 512:
      return launch_ws<512, PRE>(p, stream);
    default:
      return cudaErrorInvalidValue;  // attention_path sends only these here
  }
}

}  // namespace
}  // namespace dev

size_t attention_prefill_ws_smem_bytes(const KvRowDesc& f) {
  switch (f.head_dim) {
    case 128:
      return dev::WsSmem<128>::kTotal;
    case 256:
      return dev::WsSmem<256>::kTotal;
    case 512:
      return dev::WsSmem<512>::kTotal;
    default:
      return 0;
  }
}

cudaError_t launch_attention_prefill_ws(const AttentionParams& p, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  if (p.positions != nullptr) return cudaErrorInvalidValue;  // decode mode stays on attention_mma_kernel
  return dev::launch_ws_hd<false>(p, stream);
}

int64_t attention_prefill_kv_bytes(const AttentionParams& p) {
  return dev::kKvHead + (p.n + dev::kv_bf16_ring_rows(p) + p.num_compressed) * 2 * p.fmt.head_dim;
}

cudaError_t launch_attention_prefill_pre(const AttentionParams& p, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  // Decode mode stays on attention_mma_kernel; the bf16 copy needs FP8 rows and the workspace.
  if (p.positions != nullptr || p.fmt.fp8 == 0 || p.partial == nullptr) return cudaErrorInvalidValue;
  auto* buf = reinterpret_cast<uint8_t*>(p.partial);
  const int64_t granules = (attention_prefill_kv_bytes(p) - dev::kKvHead) / 16;
  const cudaError_t e = launch(dev::attention_kv_bf16_kernel, dev::grid_stride_blocks(std::max<int64_t>(granules, 1)),
                               256, 0, stream, p, buf);
  if (e != cudaSuccess) return e;
  return dev::launch_ws_hd<true>(dev::kv_bf16_params(p, buf), stream);
}

}  // namespace tern::cuda
