// The FP4 decode probe (tern_gpu_bench --only decode_probe): the MoE decode kernel's inner loop alone, streaming
// FP4 rows through a bulk-copy ring, to measure how fast an instruction mix can decode before a kernel is
// rewritten around it (docs/cuda-backend.md, "Measured gaps", session 19: the MoE decode kernel is issue-bound at
// 70-73% of copy, ~165 warp instructions per KB of FP4). The rows are constant bytes and the products are not
// checked: only the rate is measured, and the row says so.
//
// Geometry as the planned kernel's (one warpgroup per item of 64 rows over the whole K, K = 4096): an item is 64
// rows x 2 KB of FP4 (rows 2 KB apart in global memory, as one expert's) plus its e8m0 scales; a stage is the
// item's 64 rows x 1 024 columns (64 bulk copies of 512 bytes, one a row, into rows 528 bytes apart so that the 8
// rows of a quad hit distinct banks) and the stage's 2 KB of scales (one copy); 4 stages an item. Blocks: one a
// multiprocessor, C consumer warpgroups and one producer warp; the block's items in turn (block b: b, b + G, ...),
// warpgroup c taking the block's items c, c + C, ... through its own ring. Consumers, per variant:
// - bytes: wait, read one word, release (the copy pattern's ceiling);
// - bf16: moe_bulk's loop itself (bulk_consume: mma_tile.cuh's e2m1 -> bf16 decode with the scale multiply,
//   mma.sync m16n8k16 against bf16 token rows), each warp 16 rows of the stage;
// - e4m3-natural / e4m3-moved: the e2m1 codes to e4m3 by prmt from an 8-entry table (natural: the sign in each
//   nibble's bit 3, spread by a byte prmt and a shift; moved: the signs stored at load time where the bytes want
//   them), wgmma m64n8k32 e4m3 with A from registers against 8 e4m3 token rows, a fresh sum per 32 columns (one
//   MXFP4 scale) added with the row's scale, x's scale every 128 columns.
#include <cuda_runtime.h>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/bulk_pipe.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/mma_tile.cuh"
#include "backends/cuda/kernels/moe_bulk_impl.cuh"
#include "backends/cuda/kernels/read_probe.cuh"
#include "backends/cuda/kernels/wgmma.cuh"

namespace tern::cuda {
namespace dev {
namespace {

constexpr int kPRows = 64, kPRowBytes = 512, kPPitch = 528, kPStagesPerItem = 4;
constexpr int kPScaleBytes = kPRows * (kPRowBytes * 2 / 32);     // 64 rows x 32 e8m0 a stage
constexpr int kPStage = kPRows * kPPitch + kPScaleBytes;          // 35 840 bytes of shared memory
constexpr int kPItemRowBytes = kPRowBytes * kPStagesPerItem;      // 2 KB: a row of K = 4096
constexpr int kPItemBytes = kPRows * kPItemRowBytes;              // 128 KB of FP4
constexpr int kPWindow = 16 * 1024;                               // x: 8 tokens x 1 024 columns (bf16) / e4m3
// e4m3 bytes of the e2m1 magnitudes 0, 0.5, 1, 1.5 (kLut0) and 2, 3, 4, 6 (kLut1).
constexpr uint32_t kLut0 = 0x3C383000u, kLut1 = 0x4C484440u;

enum Variant : int { kBytes = 0, kBf16 = 1, kE4m3Natural = 2, kE4m3Moved = 3 };

// Eight e2m1 codes (a word, nibble n = column n) as e4m3: lo = nibbles 0-3, hi = 4-7, one byte a column.
__device__ __forceinline__ void e2m1x8_to_e4m3_natural(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t m = w & 0x77777777u;
  const uint32_t t0 = prmt(w, 0u, 0x1100u), t1 = prmt(w, 0u, 0x3322u);  // bytes [b0 b0 b1 b1], [b2 b2 b3 b3]
  // bytes 1 / 3 of t keep the odd nibble's sign at bit 7; bytes 0 / 2 of t << 4 hold the even nibble's there.
  lo = prmt(kLut0, kLut1, m) | (t0 & 0x80008000u) | ((t0 << 4) & 0x00800080u);
  hi = prmt(kLut0, kLut1, m >> 16) | (t1 & 0x80008000u) | ((t1 << 4) & 0x00800080u);
}
// The same with the signs moved at load time: columns 0-3's at bits 7/15/23/31, columns 4-7's at 3/11/19/27.
__device__ __forceinline__ void e2m1x8_to_e4m3_moved(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t m = w & 0x77777777u;
  lo = prmt(kLut0, kLut1, m) | (w & 0x80808080u);
  hi = prmt(kLut0, kLut1, m >> 16) | ((w << 4) & 0x80808080u);
}

// d[64 x 8] = A[64 x 32] (registers, e4m3: the m16n8k32 fragment of each warp's 16 rows) x B[32 x 8] (shared,
// K-major, descriptor); scale-d 0: a fresh sum.
__device__ __forceinline__ void wgmma_m64n8k32_e4m3_rs(float (&d)[4], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(0));
}

// No-swizzle K-major descriptor: core matrices (8 token rows x 16 bytes) 128 bytes apart along K (leading byte
// offset); one along N (stride byte offset unused, set to 256).
__device__ __forceinline__ uint64_t probe_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(128 >> 4) << 16) |
         (static_cast<uint64_t>(256 >> 4) << 32);
}

__device__ __forceinline__ float e8m0_f32(uint32_t word, int j) { return __uint_as_float(((word >> (8 * j)) & 0xffu) << 23); }

// One stage of the e4m3 variants: 32 k32 blocks, two wgmma groups in flight (a fresh d per block, read once the
// next block's group was issued), the block's row scales on the fresh sums, x's scales every 4 blocks.
template <int V>
__device__ __forceinline__ void consume_e4m3(uint32_t st, uint32_t win, float (&acc)[4]) {
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint32_t rg = st + (16 * warp + g) * kPPitch + 4 * t, rg8 = rg + 8 * kPPitch;
  const uint32_t sc = st + kPRows * kPPitch + (16 * warp + g) * 32;
  float d[2][4] = {}, part[4] = {};
  uint32_t a[2][4];
  uint32_t s_g = 0, s_g8 = 0;
  auto decode = [&](int kb, uint32_t (&frag)[4]) {
    const uint32_t wa = lds32_at(rg + 16 * kb), wb = lds32_at(rg8 + 16 * kb);
    if constexpr (V == kE4m3Moved) {
      e2m1x8_to_e4m3_moved(wa, frag[0], frag[2]);
      e2m1x8_to_e4m3_moved(wb, frag[1], frag[3]);
    } else {
      e2m1x8_to_e4m3_natural(wa, frag[0], frag[2]);
      e2m1x8_to_e4m3_natural(wb, frag[1], frag[3]);
    }
  };
  auto add = [&](int kb, const float (&dd)[4]) {  // block kb's fresh sum with its row scales
    if ((kb & 3) == 0) s_g = lds32_at(sc + kb), s_g8 = lds32_at(sc + 8 * 32 + kb);
    const float w0 = e8m0_f32(s_g, kb & 3), w1 = e8m0_f32(s_g8, kb & 3);
    part[0] += dd[0] * w0, part[1] += dd[1] * w0, part[2] += dd[2] * w1, part[3] += dd[3] * w1;
    if ((kb & 3) == 3) {  // x's scale per token (here 1 and 0.5) every 128 columns
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i] += part[i] * ((i & 1) ? 0.5f : 1.0f), part[i] = 0.0f;
    }
  };
#pragma unroll
  for (int kb = 0; kb < 32; ++kb) {  // unrolled: b, kb & 3 and the offsets are constants
    const int b = kb & 1;
    decode(kb, a[b]);
    wgmma_pin(a[b]);
    wgmma_fence();
    wgmma_m64n8k32_e4m3_rs(d[b], a[b], probe_desc(win + kb * 256));
    wgmma_commit();
    if (kb > 0) {
      wgmma_wait<1>();
      wgmma_pin(d[b ^ 1]);
      add(kb - 1, d[b ^ 1]);
    }
  }
  wgmma_wait<0>();
  wgmma_pin(d[1]);
  add(31, d[1]);
}

// One stage of the bf16 variant: moe_bulk's own loop (bulk_consume), each warp its 16 rows of the stage over its 8
// chunks of 128 columns, with the default variant's x window (jobs of 4 tokens: token g reads row min(g, 3)).
__device__ __forceinline__ void consume_bf16(uint32_t st, uint32_t win, float (&acc)[4]) {
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  constexpr int kWinStride = XWindow<WeightFormat::mxfp4>::stride(2 * kPRowBytes);
  static_assert(3 * kWinStride + 8 * XWindow<WeightFormat::mxfp4>::kChunkBytes <= kPWindow);
  const LaneOffsets o{static_cast<uint32_t>((16 * warp + g) * kPPitch + 16 * t),
                      static_cast<uint32_t>(kPRows * kPPitch + (16 * warp + g) * 32 + t),
                      static_cast<uint32_t>(min(g, 3) * kWinStride + 16 * t)};
  bulk_consume<WeightFormat::mxfp4>(st, o, 8 * kPPitch, 8 * 32, win, 2 * kPRowBytes / 128, acc);
}

template <int V, int C>
__global__ void __launch_bounds__(128 * C + 32, 1) fp4_decode_probe_kernel(const uint8_t* buf, int64_t items,
                                                                          int stages, uint32_t* sink,
                                                                          const uint32_t* x, float* check) {
  pdl_prologue();
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* window = smem;
  uint8_t* ring_base = smem + kPWindow;
  uint64_t* bars = reinterpret_cast<uint64_t*>(ring_base + static_cast<size_t>(stages) * kPStage);
  // One ring per warpgroup (stages / C slots each): a slot's rounds must be consumed in order by one owner. With one
  // ring shared by warpgroups taking items in turn, a warpgroup waiting for round 1 of a slot whose round 0 (another
  // warpgroup's) had not landed yet saw the fresh barrier's "phase -1" as complete (parity 1) and read the slot
  // early: the first version hung on the GPU (session 19).
  const int per = stages / C;
  auto ring_of = [&](int g) { return BulkRing{bars + g * per, bars + stages + g * per, per}; };
  auto slot_addr = [&](int g, const BulkRing& r, int j) {
    return ring_base + static_cast<size_t>(g * per + r.slot(j)) * kPStage;
  };
  for (int i = threadIdx.x; i < kPWindow / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(window)[i] = x != nullptr ? x[i] : 0x38383838u;
  fence_proxy_async();  // the window's generic stores before wgmma reads it
  if (threadIdx.x == 0) {
    for (int g = 0; g < C; ++g) ring_of(g).init(4);  // the warpgroup's 4 warps release each slot
    mbar_init_fence();
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t mine = (items - blockIdx.x + gridDim.x - 1) / gridDim.x;  // items b, b + G, ...
  const uint8_t* scales = buf + items * kPItemBytes;
  if (warp == 4 * C) {  // producer: item li's 4 stages into the ring of warpgroup li % C, in item order
    int next[C] = {};
    for (int64_t li = 0; li < mine; ++li) {
      const int64_t item = blockIdx.x + li * gridDim.x;
      const int g = static_cast<int>(li % C);
      const BulkRing ring = ring_of(g);
      for (int q = 0; q < kPStagesPerItem; ++q) {
        const int j = next[g]++;
        ring.wait_free(j);
        if (lane == 0) ring.arm(j, kPRows * kPRowBytes + kPScaleBytes);
        __syncwarp();
        uint8_t* slot = slot_addr(g, ring, j);
        for (int r = lane; r < kPRows; r += 32)
          bulk_copy_g2s(slot + r * kPPitch, buf + item * kPItemBytes + r * kPItemRowBytes + q * kPRowBytes,
                        kPRowBytes, ring.full_bar(j));
        if (lane == 0)
          bulk_copy_g2s(slot + kPRows * kPPitch, scales + (item * kPStagesPerItem + q) * kPScaleBytes, kPScaleBytes,
                        ring.full_bar(j));
      }
    }
    return;
  }
  const int wg = warp >> 2;
  const BulkRing ring = ring_of(wg);
  const uint32_t win = smem_addr(window);
  float acc[4] = {};
  uint32_t touched = 0;
  int j = 0;
  for (int64_t li = wg; li < mine; li += C) {
    if (check != nullptr) acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
    for (int q = 0; q < kPStagesPerItem; ++q, ++j) {
      ring.wait_full(j);
      const uint32_t st = smem_addr(slot_addr(wg, ring, j));
      if constexpr (V == kBytes) touched ^= lds32_at(st + lane * 4);
      else if constexpr (V == kBf16) consume_bf16(st, win, acc);
      else consume_e4m3<V>(st, win, acc);
      ring.release(j);
    }
    if (check != nullptr) {  // the m64n8 D fragment: rows 16 w + g (d0, d1) and + 8 (d2, d3), tokens 2t, 2t + 1
      const int w = warp & 3, g = lane >> 2, t = lane & 3;
      float* out = check + (blockIdx.x + li * gridDim.x) * kPRows * 8;
      out[(16 * w + g) * 8 + 2 * t] = acc[0], out[(16 * w + g) * 8 + 2 * t + 1] = acc[1];
      out[(16 * w + g + 8) * 8 + 2 * t] = acc[2], out[(16 * w + g + 8) * 8 + 2 * t + 1] = acc[3];
    }
  }
  if (touched == 0x12345678u || acc[0] + acc[1] + acc[2] + acc[3] == 1.2345f) sink[0] = touched;  // keeps the work
}

template <int V, int C>
void set_smem() {
  TERN_CUDA(cudaFuncSetAttribute(fp4_decode_probe_kernel<V, C>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 227 * 1024));
}

template <int V>
void launch_variant(int consumers, const uint8_t* buf, int64_t items, int stages, int grid, uint32_t* sink,
                    const uint32_t* x, float* check, cudaStream_t stream) {
  const size_t smem = kPWindow + static_cast<size_t>(stages) * kPStage + 2 * stages * 8;
  if (consumers == 2)
    launch(fp4_decode_probe_kernel<V, 2>, grid, 128 * 2 + 32, smem, stream, buf, items, stages, sink, x, check);
  else launch(fp4_decode_probe_kernel<V, 3>, grid, 128 * 3 + 32, smem, stream, buf, items, stages, sink, x, check);
}

}  // namespace
}  // namespace dev

const char* fp4_decode_probe_name(int variant) {
  static const char* const kNames[] = {"bytes only", "bf16 decode + mma.sync (moe_bulk's loop)",
                                       "e4m3 decode, natural layout + wgmma", "e4m3 decode, moved signs + wgmma"};
  return variant >= 0 && variant < 4 ? kNames[variant] : "?";
}

int64_t fp4_decode_probe_item_bytes() { return dev::kPItemBytes + dev::kPStagesPerItem * dev::kPScaleBytes; }

int fp4_decode_probe_max_stages() {
  return static_cast<int>((227 * 1024 - dev::kPWindow) / (dev::kPStage + 16));
}

void prepare_fp4_decode_probe() {
  dev::set_smem<dev::kBytes, 2>(), dev::set_smem<dev::kBytes, 3>();
  dev::set_smem<dev::kBf16, 2>(), dev::set_smem<dev::kBf16, 3>();
  dev::set_smem<dev::kE4m3Natural, 2>(), dev::set_smem<dev::kE4m3Natural, 3>();
  dev::set_smem<dev::kE4m3Moved, 2>(), dev::set_smem<dev::kE4m3Moved, 3>();
}

void launch_fp4_decode_probe(int variant, int consumers, const uint8_t* buf, int64_t items, int stages, int grid,
                             uint32_t* sink, cudaStream_t stream, const uint32_t* x, float* check) {
  TERN_CHECK((consumers == 2 || consumers == 3) && stages % consumers == 0 && stages >= 2 * consumers &&
                 stages <= fp4_decode_probe_max_stages(),
             "fp4 decode probe: 2 or 3 warpgroups with 2 or more slots each (at most ",
             fp4_decode_probe_max_stages(), " in all), not ", consumers, " and ", stages);
  switch (variant) {
    case dev::kBytes: dev::launch_variant<dev::kBytes>(consumers, buf, items, stages, grid, sink, x, check, stream); break;
    case dev::kBf16: dev::launch_variant<dev::kBf16>(consumers, buf, items, stages, grid, sink, x, check, stream); break;
    case dev::kE4m3Natural:
      dev::launch_variant<dev::kE4m3Natural>(consumers, buf, items, stages, grid, sink, x, check, stream);
      break;
    default: dev::launch_variant<dev::kE4m3Moved>(consumers, buf, items, stages, grid, sink, x, check, stream); break;
  }
}

}  // namespace tern::cuda
