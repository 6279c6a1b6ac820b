// The FP8-block decode product on the tensor-map copy engine (TMA), 1..64 tokens: linear_tma_kernel
// (TERN_LINEAR_VARIANT=5; the default stays linear_stream until measured). Same bits as linear_stream.
//
// Why: a decode product streams each weight byte once, and linear_stream's fetch pattern, not its arithmetic,
// held it to 33% / 23% / 12% of copy at 1 / 16 / 64 tokens (session 8: loads alone as slow as the kernel):
// per-lane 16-byte cp.async of 64 bytes a row per chunk, 4-8 warp rings per block, the x window staged per
// 128-row tile (at 64 tokens as many bytes as the weights) and a split-K finish reading partials one block
// at a time. The read probe reached 100-110% of copy with one producer issuing bulk copies into a ring of
// stages and 32-64 KB in flight per multiprocessor.
//
// Grid: persistent, one block per multiprocessor (the plan fills its shared memory). A block owns ONE x
// window: gpb consecutive K groups of one row group (grouped products read their own x columns), staged
// once, and a contiguous range of 32-row units of that row group; unit = 32 rows x one K group, computed by
// ONE consumer warp (two m-tiles, every token) from zero to the group's end. The K groups of a row block are
// the cs blocks of one thread-block cluster (gpb = ceil(K groups / 8)): each writes its groups' partial sums
// (partial[group][T][out]), a cluster barrier, then each block adds 1/cs of the row block's outputs over the
// groups in group order. One K group: no partials, the warp stores its sums.
// Block: 8 consumer warps and 1 producer warp. The producer's lane 0 walks the block's ring items in order:
// an item is (unit, K slice of sc chunks) = 32 rows x sc * 64 bytes, one 2-D TMA box per chunk (64 bytes x
// 32 rows, 2 KB, rows 64 bytes apart: a quarter-warp's A loads, rows g and g + 1, fall in the two halves of
// the banks; the 128-byte swizzle would not do it, it XORs rows g and g + 1 into the same half), into a
// ring of `slots` items with full/empty mbarriers (bulk_pipe.cuh's BulkRing; one consumer warp releases each
// item). The tensor map's 256-byte L2 promotion fetches a row's next chunks with the first. Items go round-robin over the warps (the ring order of round r is slice-major: every
// warp's slice s before any warp's slice s + 1), so all 8 warps compute while the rest of the ring is in
// flight. The plan picks sc per T: long row runs (8 chunks: 512 bytes) where x leaves room, shorter where
// x takes most of the shared memory (64 tokens: 135 KB for a 1024-column window).
//
// Numerics, the SAME BITS as linear_stream_kernel for every T: the K groups are plan_linear_stream's
// (stream_chunks_per_group: the weight's shape or the tuner's count), a group's sum is one accumulator
// reset at the group's start and fed the chunks in order through stream_tile.cuh's mma_chunk (the same
// mma.sync on the same fragments: A from the lane's 16 bytes of rows g and g + 8, the same scale multiplier
// fp8_scale_mult, x from the same window layout and bytes), and the outputs are ((0 + g0) + g1) + ... in
// group order (mma_tile.cuh's sum_splits), times 2^16, as linear_stream's last block or its one-block walk
// gives them. A token's bits depend on neither T nor its neighbours (batch invariant); no atomics on sums.
//
// PDL: before grid_dependency_wait() only the barriers, the weights (the first ring of TMA boxes) and their
// FP8 scales; x, the partials and y after it.
#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes from the runtime's driver entry point (no -lcuda)
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

#include "backends/cuda/kernels/bulk_pipe.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/linear_tma.cuh"
#include "backends/cuda/kernels/stream_tile.cuh"

namespace tern::cuda {
namespace dev {

constexpr int kTmaConsumers = 8;                          // consumer warps (two per scheduler)
constexpr int kTmaThreads = (kTmaConsumers + 1) * 32;     // + the producer warp
constexpr int kTmaUnitRows = 32;                          // a unit: two m-tiles of one warp
constexpr int kTmaBoxBytes = 64;                          // a box row: one 64-column chunk of FP8
constexpr int kTmaBox = kTmaBoxBytes * kTmaUnitRows;      // 2 KB a box
constexpr int kTmaMaxSlots = 64;
constexpr int kTmaMaxSmem = 227 * 1024;                   // sm_90's opt-in limit per block

struct TmaArgs {
  CUtensorMap tmap;  // the weight [out, in] as bytes, boxes of 64 x 32, no swizzle
  MatRef mat;
  int64_t out, rows_per_group, x_stride, T, nchunks, cpg, iru, nrb;
  int kg, gpb, cs, sc, items, slots, win_chunks, tab_cols, win_off, tab_off, bar_off;
  const float* x;
  const uint8_t* xw;     // x's windows made once for the product (linear_x_window_kernel), or nullptr
  int64_t xw_row_bytes;
  float* y;
  float* partial;        // [kg][T][out] when kg > 1
};

// One 2-D box of the tensor map at (column byte c0, row c1) into shared memory at `dst`, completing on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}

__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

template <int NT>
__global__ void __launch_bounds__(kTmaThreads, 1) linear_tma_kernel(const __grid_constant__ TmaArgs a) {
  constexpr int MT = 2;
  constexpr WFmt F = WFmt::fp8;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // Every box starts on 1024 bytes (TMA wants 128; the plan adds the slack).
  uint8_t* sm = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  uint8_t* win = sm + a.win_off;
  uint32_t* tab = reinterpret_cast<uint32_t*>(sm + a.tab_off);
  uint64_t* bars = reinterpret_cast<uint64_t*>(sm + a.bar_off);
  const BulkRing ring{bars, bars + a.slots, a.slots};
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int slot_bytes = a.sc * kTmaBox;

  // The block's share: K groups [kg0, kg0 + ng) (its cluster rank), row units [ru0, ru1) of row group rg.
  const int rank = static_cast<int>(blockIdx.x % a.cs);
  const int64_t cl = blockIdx.x / a.cs, rg = cl / a.nrb, j = cl % a.nrb;
  const int kg0 = rank * a.gpb, ng = min(a.kg, kg0 + a.gpb) - kg0;
  const int64_t ru0 = a.iru * j / a.nrb, ru1 = a.iru * (j + 1) / a.nrb;
  const int n_u = static_cast<int>(ru1 - ru0) * ng;  // units, row-major (a row unit's groups side by side)
  const int S = a.items, total = n_u * S, per_round = kTmaConsumers * S;
  const int64_t grow0 = rg * a.rows_per_group;
  const int64_t rlo = grow0 + ru0 * kTmaUnitRows;
  const int64_t rhi = min(min(grow0 + ru1 * kTmaUnitRows, grow0 + a.rows_per_group), a.out);
  const int64_t c_lo = kg0 * a.cpg, c_hi = min(a.nchunks, (kg0 + ng) * a.cpg);  // the window's chunks
  const int64_t sr0 = rlo / 128, sc0 = c_lo / 2;  // the scale table's first row and column

  // Ring position p <-> (unit u, slice s): round r = units 8r .. 8r + n_r - 1, slice-major inside it.
  struct Item {
    int u, s;
  };
  auto item_of = [&](int p) {
    const int r = p / per_round, rem = p - r * per_round, n_r = min(kTmaConsumers, n_u - kTmaConsumers * r);
    const int s = rem / n_r;
    return Item{kTmaConsumers * r + (rem - s * n_r), s};
  };
  auto unit_row0 = [&](int u) { return rlo + static_cast<int64_t>(u / ng) * kTmaUnitRows; };
  auto unit_group = [&](int u) { return kg0 + u % ng; };
  auto item_chunks = [&](int u, int s, int64_t& first) {  // the item's chunks: [first, first + count)
    const int64_t kb = static_cast<int64_t>(unit_group(u)) * a.cpg, ke = min(a.nchunks, kb + a.cpg);
    first = kb + static_cast<int64_t>(s) * a.sc;
    const int64_t left = ke - first;
    return left <= 0 ? 0 : left >= a.sc ? a.sc : static_cast<int>(left);
  };
  // Producer lane: item p's boxes into its slot (an empty item, past a short last group, just arrives).
  auto issue = [&](int p) {
    const Item it = item_of(p);
    int64_t first = 0;
    const int nch = item_chunks(it.u, it.s, first);
    uint64_t* bar = ring.full_bar(p);
    if (nch == 0) {
      mbar_arrive(bar);
      return;
    }
    ring.arm(p, static_cast<uint32_t>(nch * kTmaBox));  // rows past the matrix are zero-filled and counted
    const uint32_t dst = smem_addr(sm) + static_cast<uint32_t>(ring.slot(p) * slot_bytes);
    const int row = static_cast<int>(unit_row0(it.u));
    for (int b = 0; b < nch; ++b) tma_load_2d(dst + b * kTmaBox, &a.tmap, static_cast<int>((first + b) * 64), row, bar);
  };

  if (threadIdx.x == 0) {
    ring.init(1);  // empty: one arrival, the item's consumer warp
    mbar_init_fence();
  }
  __syncthreads();
  const bool producer = warp == kTmaConsumers;
  const int prologue = min(a.slots, total);
  // Before the wait (PDL, launch.cuh): only the weights (a full ring of boxes) and their FP8 scales, which no
  // kernel writes; x, the partials and y are touched after grid_dependency_wait().
  if (producer && lane == 0) {
    prefetch_tensor_map(&a.tmap);
    for (int p = 0; p < prologue; ++p) issue(p);
  }
  const int trows = static_cast<int>((rhi - 1) / 128 - sr0 + 1);
  for (int i = threadIdx.x; i < trows * a.tab_cols; i += blockDim.x)
    tab[i] = fp8_scale_mult(a.mat, sr0 + i / a.tab_cols, sc0 + i % a.tab_cols);
  grid_dependency_wait();

  const int n_live = static_cast<int>((a.T + 7) / 8);
  const int wstride = XWindow<F>::stride(a.win_chunks * Fmt<F>::kChunk);
  fill_x_window<F>(win, n_live * 8, wstride, a.x, a.x_stride, a.T, 0, rg * a.mat.in, a.xw, a.xw_row_bytes,
                   c_lo * Fmt<F>::kChunk, static_cast<int>(c_hi - c_lo) * Fmt<F>::kChunk);
  __syncthreads();  // the window and the scale table are in

  if (producer) {
    if (lane == 0)
      for (int p = prologue; p < total; ++p) {
        ring.wait_free(p);
        issue(p);
      }
    __syncwarp();
  } else {
    const float mult = a.mat.out_mult;
    // A in a slot: chunk c is box c, the lane's 16 bytes of row g (+ 8h + 16m) at t * 16.
    const int lane_off = g * kTmaBoxBytes + t * 16;
    for (int r = 0; kTmaConsumers * r + warp < n_u; ++r) {
      const int u = kTmaConsumers * r + warp, n_r = min(kTmaConsumers, n_u - kTmaConsumers * r);
      const int64_t row0 = unit_row0(u);
      const int group = unit_group(u);
      const uint32_t* trow = tab + (row0 / 128 - sr0) * a.tab_cols;
      float part[MT][NT][4];
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) part[m][n][e] = 0.0f;
      for (int s = 0; s < S; ++s) {
        const int p = r * per_round + s * n_r + warp;
        int64_t first = 0;
        const int nch = item_chunks(u, s, first);
        ring.wait_full(p);
        const uint8_t* st = sm + ring.slot(p) * slot_bytes + lane_off;
        for (int c = 0; c < nch; ++c) {
          LaneRow<F> raw[MT][2];
          const uint8_t* box = st + c * kTmaBox;
#pragma unroll
          for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) raw[m][h].v[0] = lds128(box + (16 * m + 8 * h) * kTmaBoxBytes);
          const uint32_t v = trow[(first + c) / 2 - sc0];
          uint32_t msc[MT][2][2];
#pragma unroll
          for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) msc[m][h][0] = msc[m][h][1] = v;
          mma_chunk<F, MT, NT>(raw, msc, win + (first + c - c_lo) * XWindow<F>::kChunkBytes + t * 16 + g * wstride,
                               wstride, n_live, part);
        }
        ring.release(p);
      }
      // One group: y = (0 + group) * 2^16, as linear_stream's walk. Several: the group's partial sums.
      float* dst = a.kg > 1 ? a.partial + static_cast<int64_t>(group) * a.T * a.out : a.y;
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int64_t row = row0 + 16 * m + g + 8 * (e >> 1);
            const int64_t tok = 8 * n + 2 * t + (e & 1);
            if (n < n_live && row < rhi && tok < a.T)
              dst[tok * a.out + row] = a.kg > 1 ? part[m][n][e] : (0.0f + part[m][n][e]) * mult;
          }
    }
  }
  grid_dependents_launch();  // every weight byte of the block is in: the next kernel may be scheduled
  if (a.kg == 1) return;

  // The row block's K groups are this cluster's blocks: once all have stored their partials, each adds 1/cs
  // of the row block's outputs (row-fastest: coalesced) over the groups in group order.
  __threadfence();
  if (a.cs > 1) cooperative_groups::this_cluster().sync();
  else __syncthreads();
  const int64_t nrows = rhi - rlo, P = nrows * a.T;
  const int64_t i0 = P * rank / a.cs, i1 = P * (rank + 1) / a.cs;
  // Eight outputs a thread at a time: at 64 tokens and 8 groups a block adds ~7 outputs a thread over 8
  // partials each, so their loads go out together (a load per add would take ~60 L2 round trips).
  constexpr int kOut = 8;
  const float mult = a.mat.out_mult;
  for (int64_t i = i0 + threadIdx.x; i < i1; i += kOut * static_cast<int64_t>(blockDim.x)) {
    int64_t tok[kOut], row[kOut];
    bool live[kOut];
#pragma unroll
    for (int o = 0; o < kOut; ++o) {
      const int64_t k = i + o * static_cast<int64_t>(blockDim.x);
      live[o] = k < i1;
      const int64_t kk = live[o] ? k : i;  // a dead output loads the first one's (discarded)
      tok[o] = kk / nrows;
      row[o] = rlo + kk % nrows;
    }
    float s[kOut];
    sum_splits<kOut>(a.partial, a.kg, a.T, a.out, tok, row, s);
#pragma unroll
    for (int o = 0; o < kOut; ++o)
      if (live[o]) a.y[tok[o] * a.out + row[o]] = s[o] * mult;
  }
}

}  // namespace dev

// linear.cu: linear_stream's K groups (the weight's shape or the tuner's count).
int64_t stream_chunks_per_group(const LinearParams& p);

namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled through the runtime (the binaries do not link libcuda), or nullptr.
EncodeTiled tensor_map_encoder() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // not a launch error: the product stays on linear_stream, and the path name says so
      f = nullptr;
    }
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

// The weight's tensor map, encoded once per (address, shape) and kept (a decode step reuses every weight).
const CUtensorMap& weight_tensor_map(const DeviceMat& w) {
  using Key = std::tuple<const void*, int64_t, int64_t>;
  thread_local std::map<Key, CUtensorMap> maps;
  const Key key{w.w, w.out, w.in};
  if (auto it = maps.find(key); it != maps.end()) return it->second;
  if (maps.size() >= 4096) maps.clear();
  CUtensorMap m;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(w.in), static_cast<cuuint64_t>(w.out)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(w.in)};  // bytes between rows (FP8: one a column)
  const cuuint32_t box[2] = {dev::kTmaBoxBytes, dev::kTmaUnitRows};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(w.w), dims, strides,
                                          box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("linear_tma: cuTensorMapEncodeTiled failed (" + std::to_string(static_cast<int>(r)) +
                             ") for a " + std::to_string(w.out) + " x " + std::to_string(w.in) + " FP8 weight");
  return maps.emplace(key, m).first->second;
}

template <int NT>
void set_smem_attribute() {
  static const bool done = [] {
    cudaFuncSetAttribute(dev::linear_tma_kernel<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, dev::kTmaMaxSmem);
    return true;
  }();
  (void)done;
}

// Clusters of `cs` blocks (one per multiprocessor: the plan fills the shared memory) that fit the device at
// once, queried once per device and size: clusters must sit in one GPC, so it is not num_sms / cs (132
// multiprocessors hold 32 clusters of 4, not 33). 0: none fits (the plan declines); a failed query falls back
// to num_sms / cs.
int64_t cluster_capacity(int cs, int num_sms) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, int64_t> known;
  int device = 0;
  cudaGetDevice(&device);
  const std::lock_guard<std::mutex> lock(mu);
  if (auto it = known.find({device, cs}); it != known.end()) return it->second;
  set_smem_attribute<8>();
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(cs));
  cfg.blockDim = dim3(dev::kTmaThreads);
  cfg.dynamicSmemBytes = dev::kTmaMaxSmem;
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(cs);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, dev::linear_tma_kernel<8>, &cfg) != cudaSuccess) {
    cudaGetLastError();  // not a launch error
    n = std::max(1, num_sms / cs);
  }
  known[{device, cs}] = n;
  return n;
}

// TERN_LINEAR_TMA_SC: chunks per ring item (1..16) instead of the plan's choice, for measurements.
int sc_override() {
  static const int v = [] {
    const char* e = std::getenv("TERN_LINEAR_TMA_SC");
    const int s = e != nullptr ? std::atoi(e) : 0;
    return s >= 1 && s <= 16 ? s : 0;
  }();
  return v;
}

}  // namespace

TmaPlan plan_linear_tma(const LinearParams& p) {
  TmaPlan plan;
  auto no = [&](const char* why) {
    plan.ok = false;
    plan.why = why;
    return plan;
  };
  if (p.w.kind != WeightKind::fp8) return no("not FP8-block weights");
  if (p.T < 1 || p.T > 64) return no("more than 64 tokens");
  if (!linear_stream_ok(p)) return no("a shape linear_stream does not take");
  if (tensor_map_encoder() == nullptr) return no("the driver has no cuTensorMapEncodeTiled");
  const int64_t chunks = p.w.in / 64;
  plan.nt = p.T <= 8 ? 1 : p.T <= 16 ? 2 : p.T <= 32 ? 4 : 8;
  plan.cpg = stream_chunks_per_group(p);
  plan.kg = static_cast<int>((chunks + plan.cpg - 1) / plan.cpg);
  plan.gpb = (plan.kg + 7) / 8;  // clusters of at most 8 blocks (the portable size)
  plan.cs = (plan.kg + plan.gpb - 1) / plan.gpb;
  if (plan.kg > 1 && (p.partial == nullptr || p.partial_floats < plan.kg * p.T * p.w.out))
    return no("no workspace for its K groups' partial sums");
  plan.rg = p.w.out / p.rows_per_group;
  plan.iru = (p.rows_per_group + dev::kTmaUnitRows - 1) / dev::kTmaUnitRows;
  plan.win_chunks = static_cast<int>(std::min<int64_t>(plan.gpb * plan.cpg, chunks));
  const int64_t win_bytes = static_cast<int64_t>(plan.nt) * 8 * (plan.win_chunks * 64 * 2 + 64);
  const int64_t clusters = cluster_capacity(plan.cs, p.num_sms);
  if (clusters <= 0) return no("no cluster of its K groups' blocks fits the device");
  plan.nrb = std::clamp<int64_t>(clusters / plan.rg, 1, plan.iru);
  plan.grid = plan.rg * plan.nrb * plan.cs;
  const int64_t rows_block = (plan.iru + plan.nrb - 1) / plan.nrb * dev::kTmaUnitRows;
  plan.tab_rows = static_cast<int>((rows_block + 127) / 128 + 1);
  plan.tab_cols = (plan.win_chunks + 1) / 2 + 1;  // a K range may start at an odd chunk
  const int64_t tab_bytes = (static_cast<int64_t>(plan.tab_rows) * plan.tab_cols * 4 + 15) / 16 * 16;
  const int64_t budget = dev::kTmaMaxSmem - 1024 - (win_bytes + 15) / 16 * 16 - tab_bytes - 2 * dev::kTmaMaxSlots * 8;
  // Chunks per item: the longest row runs (at most 8 chunks, 512 bytes: the last item of a unit is the
  // warp's tail) that leave >= 64 KB in flight beside the items the consumers hold (more the more tokens:
  // at 64 tokens a warp takes ~0.6 us per 4 KB item), else the most bytes in flight.
  // Divisors of the group's chunks first (no short last item holding a whole slot), then any count.
  const int busy = plan.nt == 1 ? 2 : plan.nt == 2 ? 3 : plan.nt == 4 ? 5 : 6;
  const int sc_max = static_cast<int>(std::min<int64_t>(8, plan.cpg));
  int64_t best = -1;
  for (int pass = 0; pass < 2 && best < 64 * 1024; ++pass)
    for (int sc = sc_max; sc >= 1; --sc) {
      if (pass == 0 && plan.cpg % sc != 0) continue;
      const int64_t slot = sc * dev::kTmaBox, n = std::min<int64_t>(dev::kTmaMaxSlots, budget / slot);
      if (n < busy + 2) continue;
      const int64_t inflight = (n - busy) * slot;
      if (inflight > best) {
        best = inflight;
        plan.sc = sc;
      }
      if (inflight >= 64 * 1024) break;
    }
  if (const int o = sc_override(); o > 0 && budget / (o * dev::kTmaBox) >= 2) plan.sc = o;
  if (plan.sc == 0) return no("its x window leaves no room for the weight ring");
  const int64_t slot = plan.sc * dev::kTmaBox;
  plan.slots = static_cast<int>(std::min<int64_t>(dev::kTmaMaxSlots, budget / slot));
  plan.items = static_cast<int>((plan.cpg + plan.sc - 1) / plan.sc);
  plan.win_off = static_cast<int>(plan.slots * slot);
  plan.tab_off = plan.win_off + static_cast<int>((win_bytes + 15) / 16 * 16);
  plan.bar_off = plan.tab_off + static_cast<int>(tab_bytes);
  plan.smem = 1024 + static_cast<size_t>(plan.bar_off) + 2 * static_cast<size_t>(plan.slots) * 8;
  plan.ok = true;
  return plan;
}

void launch_linear_tma(const LinearParams& p, const TmaPlan& plan, const uint8_t* xw, cudaStream_t stream) {
  dev::TmaArgs a{};
  a.tmap = weight_tensor_map(p.w);
  a.mat.w = static_cast<const uint8_t*>(p.w.w);
  a.mat.s = static_cast<const uint8_t*>(p.w.s);
  a.mat.in = p.w.in;
  a.mat.s_cols = p.w.s_cols;
  a.mat.scale_f32 = p.w.scale_f32 ? 1 : 0;
  a.mat.out_mult = dev::kWeightShift;
  a.out = p.w.out;
  a.rows_per_group = p.rows_per_group;
  a.x_stride = p.x_stride;
  a.T = p.T;
  a.nchunks = p.w.in / 64;
  a.cpg = plan.cpg;
  a.iru = plan.iru;
  a.nrb = plan.nrb;
  a.kg = plan.kg;
  a.gpb = plan.gpb;
  a.cs = plan.cs;
  a.sc = plan.sc;
  a.items = plan.items;
  a.slots = plan.slots;
  a.win_chunks = plan.win_chunks;
  a.tab_cols = plan.tab_cols;
  a.win_off = plan.win_off;
  a.tab_off = plan.tab_off;
  a.bar_off = plan.bar_off;
  a.x = p.x;
  a.xw = xw;
  a.xw_row_bytes = 2 * linear_x_cols(p);
  a.y = p.y;
  a.partial = p.partial;
  LaunchShape s{dim3(static_cast<unsigned>(plan.grid)), dim3(dev::kTmaThreads), plan.smem, stream};
  if (plan.cs > 1) s.cluster_x = static_cast<unsigned>(plan.cs);
  switch (plan.nt) {
    case 1: set_smem_attribute<1>(); launch(s, dev::linear_tma_kernel<1>, a); break;
    case 2: set_smem_attribute<2>(); launch(s, dev::linear_tma_kernel<2>, a); break;
    case 4: set_smem_attribute<4>(); launch(s, dev::linear_tma_kernel<4>, a); break;
    default: set_smem_attribute<8>(); launch(s, dev::linear_tma_kernel<8>, a); break;
  }
}

}  // namespace tern::cuda
