// The routed experts at decode sizes with FP4 weights (nvcc only; instantiated per format in
// moe_bulk_<fmt>.cu): a persistent grid whose blocks stream whole weight-row tiles through a ring of shared
// memory stages filled by bulk copies (bulk_pipe.cuh), and decode them there for tensor-core MMAs.
//
// Work items: (job, row tile). UP: 8*mt rows of w1 and the same rows of w3, interleaved per m-tile (stage
// rows 16j..16j+7 = w1, 16j+8..16j+15 = w3), so one m16n8k16 tile gives a lane w1x (c0, c1) and w3x (c2, c3)
// of the same output row and SwiGLU is applied in registers. DOWN: 16*mt rows of w2. A stage is one item:
// every row whole (the full K), so each (m-tile, matrix) segment is ONE contiguous bulk copy (UP at
// V4-Flash: 8 rows x 2 KB = 16 KB twice + scales; DOWN: 16*mt rows x 1 KB + scales). The padded layout
// (plan.pad, issue_octets) moves rows apart against bank conflicts at the cost of more copies.
// Block: `groups` x `mt * ks` consumer warps (each group decodes its own items; warp u of a group: m-tile
// u / ks, K slice u % ks) + one producer warp. The grid is one block per multiprocessor; block b takes the
// contiguous item range [b*N/G, (b+1)*N/G) of the N = jobs x tiles items the plan kernel listed (read on
// the device: the host sizes the grid without a sync), so consecutive items mostly share a job and its x
// stays staged; the resident layout (MoeBulkPlan::resident) takes a static share of those ranges and claims the
// rest.
//
// Numerics (as mma_tile.cuh): weights exact in bf16, x (UP) and h (DOWN) rounded to bf16 once, in the
// shared-memory x window (stream_tile.cuh's layout), f32 accumulation. Batch invariance: a token's output
// row is sum over K slices s = 0..ks-1 (in that order) of the slice's chunks in column order; ks and the
// slices come from the weight shape and the variant only, never from T, the job or its token count.
#pragma once

#include <climits>

#include "backends/cuda/kernels/bulk_pipe.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/moe_impl.cuh"

namespace tern::cuda {

// Shared-memory plan of one of the two kernels (host-side, from the shapes and the variant alone).
struct MoeBulkPlan {
  bool ok = false;
  int mt = 0, ks = 0;             // m-tiles per item, K slices (moe_k_slices): mt * ks warps per item
  int consumers = 0;              // consumer warps: consumers / (mt * ks) groups, each decoding its own items
  int rows_per_item = 0;          // matrix rows per item (of each of w1 and w3 for UP)
  int tiles = 0;                  // items per job
  int row_bytes = 0, s_cols = 0;  // bytes of a weight row, scale bytes of a row
  int stages = 0, stage_bytes = 0, scale_off = 0;
  int win_off = 0, win_stride = 0, red_off = 0, cnt_off = 0, bar_off = 0;
  int job_tokens = 8;             // pairs per job: x window rows (lanes g >= job_tokens read the last row)
  int smem = 0;
  // Stage layout by octets (8 consecutive rows of one matrix: UP m-tile j holds octets 2j (w1) and 2j + 1
  // (w3), DOWN m-tile j octets 2j, 2j + 1 (its rows 0-7, 8-15)). Unpadded: rows back to back, oct_bytes =
  // 8 * row_bytes, s_stride = s_cols. Padded (`pad`, see issue_octets): an octet's rows 4-7 start
  // half_off = 4 * row_bytes + 64 bytes after its rows 0-3, and scale rows are s_stride apart (an odd
  // multiple of 16) when `pad_scales`.
  bool pad = false, pad_scales = false;
  bool lean = false;  // the bookkeeping by counters (RingCursor, job and tile counters): no integer divisions
  int oct_bytes = 0, half_off = 0, s_stride = 0;
  // Resident window (MoeParams::resident, at up to kMoeResidentMaxTokens tokens where it fits beside the variant's
  // ring): the window holds every row the kernel reads (UP: the T token rows of x; DOWN: the T k pair rows of h),
  // staged once as the kernel starts. No job change restages it (each one made every consumer warp wait for the
  // slowest group's item, then for the staging), so items may come in any order: each block takes a static first
  // share and then claims items one at a time from a device counter (claim_share_pct: the static share of the items
  // in percent; 100: fixed ranges, as the other layouts). Each item's slot names its item (slot_item) for the
  // consumers, and the count of the block's stages, stored once all are armed, ends the walk. win_rows: the window's
  // rows (resident: T or T k; else job_tokens).
  bool resident = false;
  int win_rows = 0;
  int claim_share_pct = 100;
  int item_off = 0;  // slot_item[stages] (resident), after armed[stages], then stage_end
};

// The plan for UP (w1, w3) or DOWN (w2) with `stages` ring stages (fewer when the shared memory is short,
// at least 2), `consumers` consumer warps, at most `max_mt` m-tiles per item, jobs of at most `job_tokens`
// (<= 8) pairs, the padded stage layout (rows; scale rows too with pad_scales) or not and the bookkeeping by
// counters or not; !ok when the shape does not fit the kernel.
// resident_rows > 0: the resident window of that many rows (!ok where it does not fit with `stages` stages).
MoeBulkPlan plan_moe_bulk(const MoeParams& p, bool up, int stages, int consumers, int max_mt, int job_tokens,
                          bool pad, bool pad_scales, bool lean, int resident_rows = 0);

template <WeightFormat F>
void launch_moe_bulk(const MoeParams& p, const MoeLayout& L, const MoeBulkPlan& up, const MoeBulkPlan& down,
                     int num_sms, char* ws, cudaStream_t stream);

namespace dev {

// Consumer warps: up to 16 in the kernel compiled for 17 warps (120 registers a thread), up to 24 in the wide
// one (25 warps, 80 registers).
constexpr int kBulkNarrowConsumers = 16, kBulkMaxConsumers = 24;
constexpr int bulk_threads(bool wide) { return ((wide ? kBulkMaxConsumers : kBulkNarrowConsumers) + 1) * 32; }
constexpr int kBulkMaxSmem = 227 * 1024;  // sm_90's opt-in limit per block

struct MoeBulkArgs {
  MoeParams p;
  MoeBulkPlan plan;
  const int* sorted;  // pair ids grouped by expert
  const int* jobs;    // [max_jobs][3]: expert, first sorted slot, count (<= plan.job_tokens)
  const int* num_jobs;
  int* claim;  // the claimed items' counter (resident windows; MoeLayout::num_jobs[1] UP, [2] DOWN; zeroed by the
               // plan)
  float* h;  // [P, inter] by sorted slot: SwiGLU output of UP, x of DOWN
  float* y;  // [P, D] by sorted slot
  // The timeline instrument (set_moe_bulk_stamps; nullptr in every real run): kMoeBulkStampWords words a block.
  unsigned long long* stamps = nullptr;
};

// The block's timeline (MoeBulkStamp says which word is which): the SM's cycle counter, and the global timer at
// the block's entry and its first group's exit to line blocks up against each other.
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void stamp(const MoeBulkArgs& a, int word, unsigned long long v) {
  if (a.stamps != nullptr) a.stamps[blockIdx.x * kMoeBulkStampWords + word] = v;
}

// Which of an expert's matrices (ExpertDesc::w / s / global_scale index) the kernel's matrix m is: UP w1 (m 0) and
// w3 (m 1), DOWN w2.
template <bool UP>
__device__ __forceinline__ int expert_matrix(int m) {
  return UP ? (m == 0 ? 0 : 2) : 1;
}

// The kernel's matrices' weight and scale pointers of expert d (the producers' copies read them).
template <bool UP>
__device__ __forceinline__ void expert_pointers(const ExpertDesc& d, unsigned long long (&w)[UP ? 2 : 1],
                                                unsigned long long (&s)[UP ? 2 : 1]) {
#pragma unroll
  for (int m = 0; m < (UP ? 2 : 1); ++m) {
    w[m] = reinterpret_cast<unsigned long long>(d.w[expert_matrix<UP>(m)]);
    s[m] = reinterpret_cast<unsigned long long>(d.s[expert_matrix<UP>(m)]);
  }
}

// Producer warp: looks up 32 items at a time (lane l: item b0 + l, its expert's matrices and first row),
// then for each item waits for a free slot and has the whole warp issue the item's copies into it:
// issue(stage, full, r0, w, s) with the slot's memory and full barrier, the item's first matrix row and its
// matrices' weight and scale pointers (UP: w1, w3; DOWN: w2); issue arms `full` before its copies.
// LEAN: the stage's slot and parity by a RingCursor instead of divisions by the ring depth.
// Before arming a slot for round r, lane 0 stores r in armed[slot] (moe_bulk_kernel says why).
template <bool UP, bool LEAN, class Issue>
__device__ __forceinline__ void bulk_produce(const MoeBulkArgs& a, const BulkRing& ring, int* armed, uint8_t* smem,
                                             int begin, int end, Issue issue) {
  const MoeBulkPlan& pl = a.plan;
  const int lane = threadIdx.x & 31;
  constexpr int kMats = UP ? 2 : 1;
  RingCursor cur;
  for (int b0 = begin; b0 < end; b0 += 32) {
    unsigned long long wq[kMats], sq[kMats];
    int row0 = 0;
#pragma unroll
    for (int m = 0; m < kMats; ++m) wq[m] = sq[m] = 0;
    if (b0 + lane < end) {
      const int item = b0 + lane, job = item / pl.tiles;
      row0 = (item % pl.tiles) * pl.rows_per_item;
      expert_pointers<UP>(a.p.experts[__ldcg(a.jobs + 3 * job)], wq, sq);  // (L2: DOWN reads it before the wait)
    }
    const int nb = min(32, end - b0);
    for (int i = 0; i < nb; ++i) {
      const int idx = b0 + i - begin;  // this block's stage sequence
      const int r0 = __shfl_sync(0xffffffffu, row0, i);
      unsigned long long w[kMats], s[kMats];
#pragma unroll
      for (int m = 0; m < kMats; ++m) {
        w[m] = __shfl_sync(0xffffffffu, wq[m], i);
        s[m] = __shfl_sync(0xffffffffu, sq[m], i);
      }
      const int slot = LEAN ? cur.slot : ring.slot(idx);
      ring.wait_free_at(slot, LEAN ? cur.parity : ring.round_parity(idx));
      if (lane == 0) st_volatile_shared(&armed[slot], LEAN ? cur.round : idx / ring.stages);
      if constexpr (LEAN) cur.next(ring.stages);
      issue(smem + slot * pl.stage_bytes, &ring.full[slot], r0, w, s);
      if (lane == 0 && idx == 0) stamp(a, MoeBulkStamp::first_issue, clock64());
    }
  }
  if (lane == 0) stamp(a, MoeBulkStamp::last_issue, clock64());
}

// The resident layout's producer (MoeBulkPlan::resident): the block's static share [begin, end), then items claimed
// one at a time from the kernel's counter (a.claim; each claim is asked for one item before it is needed, so its round
// trip overlaps that item's copies: the first as the share's last item is issued, not at the start, where it would
// bind a run to the block before the block has shown its pace), items past the end ending the walk. Each stage names
// its item in slot_item[slot], stored before armed[slot]; at the end the number of stages goes to *stage_end, which
// ends every group's walk (end marks in the ring instead deadlock where the groups outnumber the stages: a mark's
// slot would wait for an earlier mark's release, which never comes). The expert's pointers are looked up again only where the
// job changes.
// (Claims of runs of 8 consecutive items where the kernels are not resident, every warp reading each stage's item
// from a log, were measured in session 28's code: +14% a step at batch 16 on the H100; removed.)
template <bool UP, class Issue>
__device__ __forceinline__ void bulk_produce_claimed(const MoeBulkArgs& a, const BulkRing& ring, int* armed,
                                                     int* slot_item, int* stage_end, uint8_t* smem, int items,
                                                     int begin, int end, int claimed0, Issue issue) {
  const MoeBulkPlan& pl = a.plan;
  const int lane = threadIdx.x & 31;
  constexpr int kMats = UP ? 2 : 1;
  RingCursor cur;
  const bool claims = claimed0 < items;
  int next = items;  // lane 0: the claim asked for ahead
  auto ask = [&] {
    if (lane == 0) next = claimed0 + atomicAdd(a.claim, 1);
  };
  if (claims && begin >= end) ask();  // no share: the first claim now
  int item = begin, stop = end, cached_job = -1, stages = 0;
  unsigned long long w[kMats], s[kMats];
#pragma unroll
  for (int m = 0; m < kMats; ++m) w[m] = s[m] = 0;
  for (;;) {
    if (item >= stop) {
      if (!claims) break;
      item = __shfl_sync(0xffffffffu, next, 0);
      if (item >= items) break;
      stop = item + 1;
      ask();
    }
    if (claims && item == end - 1) ask();  // the share's last item: the first claim
    const int job = item / pl.tiles;
    if (job != cached_job) {
      cached_job = job;
      expert_pointers<UP>(a.p.experts[__ldcg(a.jobs + 3 * job)], w, s);
    }
    const int r0 = (item - job * pl.tiles) * pl.rows_per_item;
    ring.wait_free_at(cur.slot, cur.parity);
    if (lane == 0) {
      st_volatile_shared(&slot_item[cur.slot], item);
      __threadfence_block();
      st_volatile_shared(&armed[cur.slot], cur.round);
    }
    issue(smem + cur.slot * pl.stage_bytes, &ring.full[cur.slot], r0, w, s);
    if (lane == 0 && item == begin && begin < end) stamp(a, MoeBulkStamp::first_issue, clock64());
    cur.next(ring.stages);
    ++item;
    ++stages;
  }
  if (lane == 0) {
    __threadfence_block();
    st_volatile_shared(stage_end, stages);
    stamp(a, MoeBulkStamp::last_issue, clock64());
  }
}

// An item's copies in the unpadded layout, one per lane: for each m-tile j < mt and matrix m (UP: w1, w3;
// DOWN: w2), the weight rows and their scale rows (8 rows each for UP, 16 for DOWN: one copy each).
template <bool UP>
__device__ __forceinline__ void issue_segments(const MoeBulkPlan& pl, int64_t out, uint8_t* stage, uint64_t* full,
                                               int r0, const unsigned long long (&w)[UP ? 2 : 1],
                                               const unsigned long long (&s)[UP ? 2 : 1]) {
  const int lane = threadIdx.x & 31;
  constexpr int kMats = UP ? 2 : 1, kSegRows = UP ? 8 : 16;  // matrix rows per copy
  const uint32_t seg_w = kSegRows * pl.row_bytes, seg_s = kSegRows * pl.s_cols;
  const int copies = 2 * kMats * pl.mt;  // <= 32 (mt <= 8)
  // Segments inside the matrix (out is a multiple of 16, so a segment is whole or absent).
  const int segs = min(pl.mt, static_cast<int>((out - r0 + kSegRows - 1) / kSegRows));
  if (lane == 0) mbar_arrive_expect_tx(full, static_cast<uint32_t>(segs * kMats) * (seg_w + seg_s));
  __syncwarp();
  if (lane < copies) {
    const int j = lane % pl.mt, kind = lane / pl.mt, m = kind % kMats;
    if (j < segs) {
      const int64_t row = r0 + static_cast<int64_t>(kSegRows) * j;
      const int srow = 16 * j + (UP ? 8 * m : 0);  // first stage row of the segment
      // (selects, not w[m]: a run-time index would put the arrays in local memory)
      const unsigned long long wm = m == 0 ? w[0] : w[kMats - 1], sm = m == 0 ? s[0] : s[kMats - 1];
      if (kind < kMats)
        bulk_copy_g2s(stage + srow * pl.row_bytes, reinterpret_cast<const uint8_t*>(wm) + row * pl.row_bytes, seg_w,
                      full);
      else
        bulk_copy_g2s(stage + pl.scale_off + srow * pl.s_cols, reinterpret_cast<const uint8_t*>(sm) + row * pl.s_cols,
                      seg_s, full);
    }
  }
}

// An item's copies in the padded layout (plan.pad). Why padded: a quarter-warp's 16-byte A loads are lanes
// g = 2q, 2q + 1 (t = 0..3) at the same columns of two stage rows; back-to-back rows are row_bytes apart, a
// multiple of 128, so both rows hit the same 16 banks (2 wavefronts per quarter-warp). Here mma row g of an
// octet is its matrix row (g & 1) * 4 + (g >> 1) (octet_row), and rows 4-7 start half_off = 4 * row_bytes +
// 64 bytes after rows 0-3: rows g and g + 1 of a quarter-warp are 64 bytes apart modulo 128 (1 wavefront).
// The scale loads (mxfp4: one byte per row, 8 rows a warp; nvfp4: 8 bytes) are 8-way (4-way) conflicts when
// scale rows are s_cols (a multiple of 128) apart; with pad_scales they are s_stride (an odd multiple of 16)
// apart, so the 8 rows fall in 8 distinct 16-byte bank groups. Copies per octet: its rows 0-3 and 4-7 (two
// of 4 * row_bytes, where the unpadded layout copies 8 or 16 rows at once), and its scale rows: one copy of
// 8 rows, or with pad_scales one per row (s_cols bytes; the plan pads where s_cols % 32 == 0). Which matrix
// row sits in which mma row does not change a bit of any output: mma rows are independent sums in the same
// k order.
template <bool UP>
__device__ __forceinline__ void issue_octets(const MoeBulkPlan& pl, int64_t out, uint8_t* stage, uint64_t* full, int r0,
                                             const unsigned long long (&w)[UP ? 2 : 1],
                                             const unsigned long long (&s)[UP ? 2 : 1]) {
  const int lane = threadIdx.x & 31;
  constexpr int kMats = UP ? 2 : 1, kTileRows = UP ? 8 : 16;  // matrix rows of an m-tile (of each matrix)
  const int oct_copies = 2 + (pl.pad_scales ? 8 : 1);         // <= 10: one per lane
  const uint32_t half_w = 4 * pl.row_bytes, scale_bytes = pl.pad_scales ? pl.s_cols : 8 * pl.s_cols;
  // Octets inside the matrix (out is a multiple of 16, so an m-tile is whole or absent).
  const int octs = 2 * min(pl.mt, static_cast<int>((out - r0 + kTileRows - 1) / kTileRows));
  // The bytes the octets' copies bring (the padding is never written).
  if (lane == 0) mbar_arrive_expect_tx(full, static_cast<uint32_t>(octs) * 8 * (pl.row_bytes + pl.s_cols));
  __syncwarp();
  if (lane >= oct_copies) return;
  const int half = lane & 1, k = lane - 2;  // lane 0, 1: the octet's rows 0-3, 4-7; 2 + k: scale rows k (or 0-7)
  for (int o = 0; o < octs; ++o) {
    const int m = UP ? (o & 1) : 0;
    const int64_t row = r0 + 8 * (UP ? o >> 1 : o);  // the octet's first matrix row
    // (selects, not w[m]: a run-time index would put the arrays in local memory)
    const unsigned long long wm = m == 0 ? w[0] : w[kMats - 1], sm = m == 0 ? s[0] : s[kMats - 1];
    if (lane < 2)
      bulk_copy_g2s(stage + o * pl.oct_bytes + half * pl.half_off,
                    reinterpret_cast<const uint8_t*>(wm) + (row + 4 * half) * pl.row_bytes, half_w, full);
    else
      bulk_copy_g2s(stage + pl.scale_off + (8 * o + k) * pl.s_stride,
                    reinterpret_cast<const uint8_t*>(sm) + (row + k) * pl.s_cols, scale_bytes, full);
  }
}

// The matrix row (within its octet) that mma row g of a lane holds: g, or octet_row in the padded layout.
__device__ __forceinline__ int octet_row(bool pad, int g) { return pad ? (g & 1) * 4 + (g >> 1) : g; }

// This lane's shared-memory offsets for the consumer loop: its two weight rows (16*mtile + g, +8) at its
// 16-byte run t of the first chunk of its K slice, its scale byte(s) there, and token g's x at the same
// columns.
struct LaneOffsets {
  uint32_t w, s, x;
};

__device__ __forceinline__ uint32_t lds8_at(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared.u8 %0, [%1];" : "=r"(v) : "r"(a));
  return v;
}

// acc += the stage's rows x the x window's token g, over `chunks` chunks of 128 columns from the lane's
// offsets, in chunk and k-step order with one accumulator (the order moe_expert_kernel uses). Lane t of a
// quad owns the 16-byte run t of each chunk's 64 bytes of a row (32 columns, the mma_tile.cuh k
// permutation), its scale byte(s) and the same columns of x. Rows of the x window past the job's tokens hold
// stale values: they only reach output columns that are never stored (mma columns are independent).
// mxfp4: the lane's offset `s` already points at its own e8m0 byte (one ld.shared.u8, no shift and mask).
template <WeightFormat F>
__device__ __forceinline__ void bulk_consume(uint32_t stage, const LaneOffsets& o, int row8_w, int row8_s,
                                             uint32_t win, int chunks, float (&acc)[4]) {
  const int t = threadIdx.x & 3;
  constexpr int kWord = scale_word_bytes<F>();  // one row's scale bytes per chunk: 4 (mxfp4), 8 (nvfp4)
  uint32_t w = stage + o.w, s = stage + o.s, x = win + o.x;
#pragma unroll 2
  for (int c = 0; c < chunks; ++c, w += 64, s += kWord, x += XWindow<F>::kChunkBytes) {
    LaneRow<F> r0, r1;
    r0.v[0] = lds128_at(w);
    r1.v[0] = lds128_at(w + row8_w);
    uint32_t m0[2], m1[2];
    if constexpr (F == WeightFormat::mxfp4) {
      m0[0] = m0[1] = e8m0_mult_bf16x2(lds8_at(s));
      m1[0] = m1[1] = e8m0_mult_bf16x2(lds8_at(s + row8_s));
    } else {
      fp4_row_scales<F>(lds64_at(s), t, m0);
      fp4_row_scales<F>(lds64_at(s + row8_s), t, m1);
    }
    uint4 b[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) b[q] = lds128_at(x + q * 64);
    static_for<4>([&](auto qc) {
      constexpr int Q = decltype(qc)::value;
      static_for<2>([&](auto hc) {
        constexpr int H = decltype(hc)::value, S = 2 * Q + H;
        const uint32_t a0 = a_pair<F, S, 0>(r0, m0), a1 = a_pair<F, S, 0>(r1, m1);
        const uint32_t a2 = a_pair<F, S, 1>(r0, m0), a3 = a_pair<F, S, 1>(r1, m1);
        mma_bf16(acc, a0, a1, a2, a3, H == 0 ? b[Q].x : b[Q].z, H == 0 ? b[Q].y : b[Q].w);
      });
    });
  }
}

// Stores m-tile `mtile` of an item from its finished sums v (the mma C fragment of this lane): UP applies
// SwiGLU (c0, c1: the w1 row, c2, c3: the w3 row, same matrix row) into h, DOWN writes y.
// prow: the matrix row (within its octet) of the lane's mma row g (octet_row).
template <bool UP>
__device__ __forceinline__ void bulk_store(const MoeBulkArgs& a, int64_t tile_row0, int mtile, int prow, int first,
                                           int count, const float (&mult)[2], const float (&v)[4]) {
  const MoeParams& p = a.p;
  const int t = threadIdx.x & 3;
  const int64_t out = UP ? p.inter : p.D;
#pragma unroll
  for (int q = 0; q < 2; ++q) {  // tokens 2t, 2t+1 of the n-tile
    const int slot = 2 * t + q;
    if (slot >= count) continue;
    if constexpr (UP) {
      const int64_t row = tile_row0 + 8 * mtile + prow;
      if (row < out) {
        const float gate = v[q] * mult[0], up = v[2 + q] * mult[1];
        a.h[static_cast<int64_t>(first + slot) * p.inter + row] =
            siluf_(fminf(gate, p.limit)) * fminf(fmaxf(up, -p.limit), p.limit);
      }
    } else {
      const int64_t row = tile_row0 + 16 * mtile + prow;
      float* dst = a.y + static_cast<int64_t>(first + slot) * p.D;
      if (row < out) dst[row] = v[q] * mult[0];
      if (row + 8 < out) dst[row + 8] = v[2 + q] * mult[0];
    }
  }
}

// Consumer warps come in `groups` groups of `units` = mt * ks warps; group G takes the block's items
// G, G + groups, ... (so up to `groups` items are decoded at once) and warp u of a group owns (m-tile
// u / ks, K slice u % ks) of each of its items. The K slices of an m-tile meet in shared memory without
// a barrier: each warp stores its partial sums in its item's ring slot, then counts itself in with a
// shared-memory atomic; the warp that arrives last adds the slices in slice order and stores the item
// (any warp may be last: the sum does not depend on which). The slot's partials are reused only after
// the ring refilled the slot, i.e. after every warp of the item released it, and warps release only
// after their count (the last one after its stores).
// LEAN: the item bookkeeping (job = item / tiles, tile = item % tiles, the group's turn idx % groups, the
// ring slot and parity) by counters advanced once per item instead of run-time integer divisions; the
// same items, slots and sums.
// The groups share one ring, so a slot's consecutive rounds belong to different groups, and a parity wait
// alone is not enough: a group that reaches round r of a slot while round r - 1 (another group's) has not
// landed sees the barrier in phase r - 1, and a wait for r's parity returns at once (it reads the phase
// before, r - 2, as complete); the group would decode stale bytes and release the slot early (session 19
// found it when the decode probe, built this way, hung). So the producer stores the round it arms in
// armed[slot] (after the slot's previous round was released, hence after that round's phase completed),
// and a consumer first waits until armed[slot] reaches its round: from then on the barrier is in phase r or
// past it, and phase r + 1 cannot complete before this group releases round r, so the parity wait is exact.
// (Waiting for the skipped rounds' parities instead can deadlock: a group two rounds behind would wait on a
// phase only its own later release can complete.)
// RESIDENT (MoeBulkPlan::resident; with LEAN's counters): every row staged once, then each group walks its stages of
// the block's sequence (its turn: stage index % groups), reading each stage's item from slot_item[slot] once
// armed[slot] reaches the stage's round, until the block's stage count says it has none left; no job change touches
// the window or the other groups. With p.early_down the resident down kernel's producer claims and copies before the
// PDL wait as the other layouts' does (the claim counters are the plan kernel's, complete by then).
template <WeightFormat F, bool UP, bool WIDE, bool LEAN, bool RESIDENT>
__global__ void __launch_bounds__(bulk_threads(WIDE), 1) moe_bulk_kernel(MoeBulkArgs a) {
  // PDL (launch.cuh). The weights never change, but WHICH rows to copy comes from the plan kernel's job list
  // (num_jobs sets the block's item range, jobs the experts), written every step at the same addresses. UP: by
  // the previous kernel, so nothing happens before the wait. DOWN (with p.early_down): the plan kernel completed
  // before the up kernel (the previous kernel, or the one before h's quantisation) passed its own wait, so before
  // this kernel could be scheduled, and nothing writes the job list until a later step's plan kernel; so before
  // the wait DOWN sets up its barriers, reads the job list (ld.global.cg) and its producer copies w2's rows (the
  // weights) into the ring: the ring fills while the up kernel's last blocks finish, where it used to start after
  // them. Its consumers wait before they read h or write y; the producer waits before it returns.
  const bool early = !UP && RESIDENT && a.p.early_down;
  if (threadIdx.x == 0) {
    stamp(a, MoeBulkStamp::entry_ns, global_ns());
    stamp(a, MoeBulkStamp::entry, clock64());
  }
  if (!early) grid_dependency_wait();
  extern __shared__ __align__(128) uint8_t smem[];
  const MoeBulkPlan& pl = a.plan;
  const MoeParams& p = a.p;
  const int consumers = pl.consumers, threads = consumers * 32;
  const int units = pl.mt * pl.ks, groups = consumers / units;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int items = __ldcg(a.num_jobs) * pl.tiles;
  // RESIDENT: the static share is claim_share_pct percent of the items in equal contiguous ranges (the rest claimed);
  // otherwise, and at 100%, block b's range [b N / G, (b + 1) N / G).
  const int share = RESIDENT && pl.claim_share_pct < 100
                        ? static_cast<int>(static_cast<int64_t>(items) * pl.claim_share_pct / 100 / gridDim.x)
                        : -1;
  const int begin = share >= 0 ? static_cast<int>(blockIdx.x) * share
                               : static_cast<int>(static_cast<int64_t>(blockIdx.x) * items / gridDim.x);
  const int end = share >= 0 ? begin + share : static_cast<int>(static_cast<int64_t>(blockIdx.x + 1) * items / gridDim.x);
  const int claimed0 = share >= 0 ? share * static_cast<int>(gridDim.x) : items;  // where the claimed items start
  if (threadIdx.x == 0) {
    stamp(a, MoeBulkStamp::items, static_cast<unsigned long long>(end - begin));
    stamp(a, MoeBulkStamp::jobs, static_cast<unsigned long long>(
                                     end > begin ? (end - 1) / pl.tiles - begin / pl.tiles + 1 : 0));
  }
  if (begin >= end && claimed0 >= items) {  // the whole block: no barrier has been touched yet
    if (early) grid_dependency_wait();
    return;
  }

  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + pl.bar_off);
  int* arrived = reinterpret_cast<int*>(smem + pl.cnt_off);  // [stages]: partials stored per slot
  int* armed = arrived + pl.stages;                             // [stages]: the round last armed per slot
  int* slot_item = reinterpret_cast<int*>(smem + pl.item_off);  // [stages] (RESIDENT): each armed stage's item
  int* stage_end = slot_item + pl.stages;                        // (RESIDENT) the block's stages, once all are armed
  const BulkRing ring{bars, bars + pl.stages, pl.stages};
  if (threadIdx.x == 0) {
    ring.init(units);  // an item's slot is released by the warps of the one group that decodes it
    for (int s = 0; s < pl.stages; ++s) arrived[s] = 0, armed[s] = -1;
    *stage_end = INT_MAX;
    mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) stamp(a, MoeBulkStamp::ready, clock64());
  if (warp == consumers) {
    const int64_t out = UP ? p.inter : p.D;
    if constexpr (RESIDENT) {
      if (pl.pad)
        bulk_produce_claimed<UP>(a, ring, armed, slot_item, stage_end, smem, items, begin, end, claimed0,
                                 [&](uint8_t* stage, uint64_t* full, int r0, auto& w, auto& s) {
                                   issue_octets<UP>(pl, out, stage, full, r0, w, s);
                                 });
      else
        bulk_produce_claimed<UP>(a, ring, armed, slot_item, stage_end, smem, items, begin, end, claimed0,
                                 [&](uint8_t* stage, uint64_t* full, int r0, auto& w, auto& s) {
                                   issue_segments<UP>(pl, out, stage, full, r0, w, s);
                                 });
    } else if (pl.pad)
      bulk_produce<UP, LEAN>(a, ring, armed, smem, begin, end, [&](uint8_t* stage, uint64_t* full, int r0, auto& w, auto& s) {
        issue_octets<UP>(pl, out, stage, full, r0, w, s);
      });
    else
      bulk_produce<UP, LEAN>(a, ring, armed, smem, begin, end, [&](uint8_t* stage, uint64_t* full, int r0, auto& w, auto& s) {
        issue_segments<UP>(pl, out, stage, full, r0, w, s);
      });
    // This block's copies are all issued: the next kernel may be scheduled. (In the UP kernel this MUST stay
    // after the wait at the top: DOWN's early reads of the job list rely on every UP block having passed it.)
    grid_dependents_launch();
    if (early) grid_dependency_wait();
    return;
  }
  if (early) grid_dependency_wait();  // h (the up kernel's) is read and y written from here on

  const int64_t in = UP ? p.D : p.inter;
  const int per = static_cast<int>(in / Fmt<F>::kChunk) / pl.ks;  // chunks of a K slice
  const int group = warp / units, u = warp % units, mtile = u / pl.ks, slice = u % pl.ks;
  // The lane's mma row g is matrix row prow of its octets (octet 2 * mtile: w1 / rows 0-7, 2 * mtile + 1:
  // w3 / rows 8-15; issue_octets says why the padded layout permutes them).
  const int prow = octet_row(pl.pad, g);
  const int w_in_octet = pl.pad ? (g & 1) * pl.half_off + (g >> 1) * pl.row_bytes : g * pl.row_bytes;
  constexpr int kWord = scale_word_bytes<F>();
  LaneOffsets lo{static_cast<uint32_t>(2 * mtile * pl.oct_bytes + w_in_octet + per * slice * 64 + t * 16),
                 static_cast<uint32_t>(pl.scale_off + (16 * mtile + prow) * pl.s_stride + per * slice * kWord +
                                       (F == WeightFormat::mxfp4 ? t : 0)),
                 static_cast<uint32_t>(min(g, pl.job_tokens - 1) * pl.win_stride +
                                       per * slice * XWindow<F>::kChunkBytes + t * 16)};
  const uint32_t smem0 = smem_addr(smem);
  uint8_t* win = smem + pl.win_off;
  float* red = reinterpret_cast<float*>(smem + pl.red_off);  // [stages][units][4][32]

  int cur_job = -1, first = 0, count = 0;
  float mult[2] = {1.0f, 1.0f};
  // Every consumer warp (all groups) at each item: when the item starts a job, stage the job's x (UP) or h
  // (DOWN) rows as bf16.
  // The job's pairs and its expert's scales.
  auto load_job = [&](int job) {
    cur_job = job;
    const int e = a.jobs[3 * job];
    first = a.jobs[3 * job + 1];
    count = a.jobs[3 * job + 2];
    const ExpertDesc& d = p.experts[e];
#pragma unroll
    for (int m = 0; m < 2; ++m)
      mult[m] = kWeightShift * (F == WeightFormat::nvfp4 ? d.global_scale[expert_matrix<UP>(m)] : 1.0f);
  };
  auto enter_job = [&](int job) {
    if (job == cur_job) return;
    named_bar_sync(1, threads);  // every consumer warp is done with the previous window
    load_job(job);
    auto xrow = [&](int i) -> const float* {
      if constexpr (UP) return p.x + static_cast<int64_t>(a.sorted[first + i] / p.k) * p.D;
      else return a.h + static_cast<int64_t>(first + i) * p.inter;
    };
    if (p.stage_quant || (!UP && p.stage_quant_h))
      stage_x<F, true>(win, count, 0, static_cast<int>(in), pl.win_stride, xrow, threadIdx.x, threads);
    else stage_x<F>(win, count, 0, static_cast<int>(in), pl.win_stride, xrow, threadIdx.x, threads);
    named_bar_sync(1, threads);
    if (a.stamps != nullptr && threadIdx.x == 0 && job == begin / pl.tiles) stamp(a, MoeBulkStamp::staged, clock64());
  };
  // The resident layout's walk: waits until stage idx's round is armed in its slot (true), or
  // returns false at the walk's end (the producer stores stage_end only after its last stage's round, and never arms
  // a stage past it, so a stage past the end never sees its round armed). Then the stage's item may be read (it was
  // stored before armed).
  auto armed_or_ended = [&](int idx, const RingCursor& cur) {
    while (ld_volatile_shared(&armed[cur.slot]) < cur.round)
      if (idx >= ld_volatile_shared(stage_end)) return false;
    __threadfence_block();
    return true;
  };
  // This group's item: tile `tile` of the current job, in ring slot `slot` of round `round`.
  auto decode = [&](int tile, int slot, int round) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    while (ld_volatile_shared(&armed[slot]) < round) {
    }
    ring.wait_full_at(slot, static_cast<uint32_t>(round & 1));
    if (a.stamps != nullptr && warp == 0 && lane == 0 && round == 0 && slot == 0)
      stamp(a, MoeBulkStamp::first_full, clock64());
    bulk_consume<F>(smem0 + slot * pl.stage_bytes, lo, pl.oct_bytes, 8 * pl.s_stride, smem0 + pl.win_off, per, acc);
    const int64_t tile_row0 = static_cast<int64_t>(tile) * pl.rows_per_item;
    if (pl.ks == 1) {  // one slice: the warp finishes its m-tile ((0 + s0): -0 becomes +0, as the sums below)
      float v[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] = 0.0f + acc[i];
      bulk_store<UP>(a, tile_row0, mtile, prow, first, count, mult, v);
      ring.release_at(slot);
      return;
    }
    float* parts = red + slot * units * 128;
#pragma unroll
    for (int i = 0; i < 4; ++i) parts[(u * 4 + i) * 32 + lane] = acc[i];
    __threadfence_block();  // the partials before the count (release), for whichever warp is last
    __syncwarp();
    int last = 0;
    if (lane == 0) last = atomicAdd(&arrived[slot], 1) == units - 1;
    last = __shfl_sync(0xffffffffu, last, 0);
    if (last) {
      __threadfence_block();  // every partial of the item after the count (acquire)
      for (int m = 0; m < pl.mt; ++m) {
        float v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float s = 0.0f;
          for (int sl = 0; sl < pl.ks; ++sl) s += parts[((m * pl.ks + sl) * 4 + i) * 32 + lane];
          v[i] = s;
        }
        bulk_store<UP>(a, tile_row0, m, prow, first, count, mult, v);
      }
      if (lane == 0) arrived[slot] = 0;  // for the slot's next item (after the ring refilled it)
    }
    ring.release_at(slot);
  };
  if constexpr (RESIDENT) {
    // Every row the kernel reads, once: UP the T token rows of x, DOWN the T k pair rows of h (quantised here under
    // act_fp8: launch_moe_bulk runs no act_fake_quant between a resident down kernel and its up kernel).
    auto xrow = [&](int i) -> const float* {
      if constexpr (UP) return p.x + static_cast<int64_t>(i) * p.D;
      else return a.h + static_cast<int64_t>(i) * p.inter;
    };
    if (p.stage_quant || (!UP && (p.stage_quant_h || p.act_fp8)))
      stage_x<F, true>(win, pl.win_rows, 0, static_cast<int>(in), pl.win_stride, xrow, threadIdx.x, threads);
    else stage_x<F>(win, pl.win_rows, 0, static_cast<int>(in), pl.win_stride, xrow, threadIdx.x, threads);
    named_bar_sync(1, threads);
    if (threadIdx.x == 0) stamp(a, MoeBulkStamp::staged, clock64());
    const uint32_t x_cols = static_cast<uint32_t>(per * slice * XWindow<F>::kChunkBytes + t * 16);
    RingCursor cur;  // this group's stages: group, group + groups, ...
    for (int i = 0; i < group; ++i) cur.next(pl.stages);
    for (int idx = group; armed_or_ended(idx, cur); idx += groups) {
      const int item = ld_volatile_shared(&slot_item[cur.slot]);
      const int job = item / pl.tiles;
      if (job != cur_job) {
        load_job(job);
        // The lane's token g of the job: its window row (rows past the job's pairs repeat its last, as above).
        const int gi = min(g, count - 1);
        const int row = UP ? a.sorted[first + gi] / p.k : first + gi;
        lo.x = static_cast<uint32_t>(row * pl.win_stride) + x_cols;
      }
      decode(item - job * pl.tiles, cur.slot, cur.round);
      for (int i = 0; i < groups; ++i) cur.next(pl.stages);
    }
  } else if constexpr (LEAN) {
    int job = begin / pl.tiles, tile = begin - job * pl.tiles, turn = 0;  // turn: (item - begin) % groups
    RingCursor cur;
    for (int item = begin; item < end; ++item) {
      enter_job(job);
      if (turn == group) decode(tile, cur.slot, cur.round);
      cur.next(pl.stages);
      if (++turn == groups) turn = 0;
      if (++tile == pl.tiles) tile = 0, ++job;
    }
  } else {
    for (int item = begin; item < end; ++item) {
      const int idx = item - begin;
      enter_job(item / pl.tiles);
      if (idx % groups != group) continue;  // another group's item
      decode(item % pl.tiles, ring.slot(idx), idx / pl.stages);
    }
  }
  if (a.stamps != nullptr && u == 0 && lane == 0 && group < MoeBulkStamp::kExitGroups) {
    stamp(a, MoeBulkStamp::exit0 + group, clock64());
    if (group == 0) stamp(a, MoeBulkStamp::exit_ns, global_ns());
  }
}

template <WeightFormat F, bool UP, bool WIDE, bool LEAN, bool RESIDENT = false>
void launch_bulk_kernel_as(const MoeBulkArgs& a, int grid, cudaStream_t stream) {
  static const bool attr = [] {
    cudaFuncSetAttribute(moe_bulk_kernel<F, UP, WIDE, LEAN, RESIDENT>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, kBulkMaxSmem);
    return true;
  }();
  (void)attr;
  const int threads = (a.plan.consumers + 1) * 32;
  launch(moe_bulk_kernel<F, UP, WIDE, LEAN, RESIDENT>, grid, threads, a.plan.smem, stream, a);
}

template <WeightFormat F, bool UP>
void launch_bulk_kernel(const MoeBulkArgs& a, int grid, cudaStream_t stream) {
  const bool wide = a.plan.consumers > kBulkNarrowConsumers;
  if (a.plan.resident) {  // (bulk_plans asks for resident plans lean only)
    if (wide) launch_bulk_kernel_as<F, UP, true, true, true>(a, grid, stream);
    else launch_bulk_kernel_as<F, UP, false, true, true>(a, grid, stream);
  } else if (a.plan.lean) {
    if (wide) launch_bulk_kernel_as<F, UP, true, true>(a, grid, stream);
    else launch_bulk_kernel_as<F, UP, false, true>(a, grid, stream);
  } else {
    if (wide) launch_bulk_kernel_as<F, UP, true, false>(a, grid, stream);
    else launch_bulk_kernel_as<F, UP, false, false>(a, grid, stream);
  }
}

}  // namespace dev

template <WeightFormat F>
void launch_moe_bulk(const MoeParams& p, const MoeLayout& L, const MoeBulkPlan& up, const MoeBulkPlan& down,
                     int num_sms, char* ws, cudaStream_t stream) {
  dev::MoeBulkArgs a;
  point_at_workspace(a, p, L, ws);
  const MoeBulkStamps stamps = moe_bulk_stamps();
  // One block per multiprocessor (blocks past the device-side item count exit at once).
  auto grid = [&](const MoeBulkPlan& pl) {
    return static_cast<int>(std::min<int64_t>(num_sms, L.max_jobs * pl.tiles));
  };
  int* claims = reinterpret_cast<int*>(ws + L.num_jobs) + 1;  // zeroed by the plan kernel
  a.plan = up;
  a.stamps = stamps.up;
  a.claim = claims;
  dev::launch_bulk_kernel<F, true>(a, grid(up), stream);
  // else the down kernel quantises h as it stages it
  if (!p.stage_quant && !p.stage_quant_h && !down.resident) quantize_moe_h(p, a.h, L.P, stream);
  a.plan = down;
  a.stamps = stamps.down;
  a.claim = claims + 1;
  dev::launch_bulk_kernel<F, false>(a, grid(down), stream);
}

}  // namespace tern::cuda
