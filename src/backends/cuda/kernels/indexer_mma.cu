// The lightning indexer's scores of a prefill chunk on tensor cores, in one kernel: q . k for every
// (query, head, key), ReLU, the scales and head weights, the sum over heads and the visibility, so that only the
// [queries, keys] scores reach memory (the SGEMM path writes and rereads [queries x heads, keys]: ~4 GB a CSA
// layer at 8 192 queries). The top-k that follows is indexer_topk_kernel, unchanged.
//
// Numerics: split bf16. q and the keys are f32 (the CPU reference's, and the top-k must pick what it picks), so
// each f32 x is cut into three bf16 planes, x = hi + mid + lo: hi = bf16(x), mid = bf16(x - hi),
// lo = bf16(x - hi - mid). Each bf16 holds 8 significant bits and every difference is exact in f32, so the three
// hold all 24 bits of x (exactly, for |x| above ~2^-100, where lo stays a normal bf16), with |mid| <= 2^-8 |x|
// and |lo| <= 2^-16 |x|. q . k = sum over dims of the nine products; the tensor cores form each bf16 x bf16
// product exactly and add in f32. Kept: hi*hi, hi*mid, mid*hi, mid*mid, hi*lo, lo*hi (six mma.sync a k-step).
// Dropped: mid*lo, lo*mid (each <= 2^-24 |q_d k_d|) and lo*lo (2^-32): <= 2^-23 sum_d |q_d k_d| in all, two f32
// roundings' worth. hi*hi goes to its own accumulator (8 mma additions, each rounded to f32: <= ~8 * 2^-23
// relative to the largest partial sum, less than SGEMM's 128 sequential f32 FMAs, worst case 128 * 2^-24); the
// cross terms, ~2^-8 of it, to two others whose rounding is ~2^-8 smaller still, added to it once at the end.
// So the error bound is that of an f32 dot product of 128 terms, a little under an f32 SGEMM's.
// TF32x3 (big/small tf32 halves, three mma) costs the same tensor time (tf32 runs at half bf16's rate) but keeps
// 22 bits (dropped small*small and the two halves' remainders ~3 * 2^-22, ~6x this bound) and needs twice the
// registers for fragments held in registers; so bf16x6.
//
// Layout: a block owns 128 keys (8 warps x 16) and qpb queries. Each warp holds its 16 keys' three planes in
// registers for the whole block (the A operand, 96 registers) and reads q's planes for one query at a time (the B
// operand: heads as columns, 64 heads = 8 n-tiles of 8) from shared memory through ldmatrix. q is copied f32 from
// global memory by cp.async one query ahead and split into planes by the whole block while the next copy flies;
// one barrier a query. The accumulator rows are keys and the columns heads, so a thread holds 16 heads of two
// keys: it applies ReLU, dot scale and weight and sums them in registers; two quad shuffles finish the 64 heads.
// Head order of the sum (differs from the CPU's 0..63): thread c of a quad adds heads 16 jp + 8 t + 2 c + e for
// jp = 0..3, t = 0..1, e = 0..1 in that order; then lanes (c, c^1) and (c, c^2) are added pairwise.
// Every (query, key) score is computed by the same instruction sequence wherever the key or the query sits in
// the launch, so the scores' bits do not depend on the chunk's size or start.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string_view>

#include "backends/cuda/kernels/device_common.cuh"
#include "backends/cuda/kernels/indexer.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/mma_tile.cuh"

namespace tern::cuda {
namespace dev {
namespace {

constexpr int kDim = kIndexerMmaDim;              // 8 k-steps of 16
constexpr int kSteps = kDim / 16;
constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kKeys = 16 * kWarps;                // keys a block
constexpr int kHeads = kMaxIndexerHeads;          // planes padded to 64 heads (zeros past p.heads)
constexpr int kPairs = kHeads / 16;               // n-tile pairs (one ldmatrix.x4 a plane each)
constexpr int kRow = kDim + 8;                    // bf16 a plane row: a 16-byte pad puts ldmatrix rows in distinct banks
constexpr int kPlane = kHeads * kRow;             // bf16 a plane
constexpr int kMaxQpb = 32;                       // queries a block at most

// Dynamic shared memory: two f32 stages of one query's q (cp.async lands there), two sets of its three planes
// (one read by the mma while the next is split), two rows of head weights (times heads^-0.5).
struct Smem {
  static constexpr size_t kStage = size_t{kHeads} * kDim * 4;
  static constexpr size_t kPlanes = size_t{3} * kPlane * 2;
  static constexpr size_t kStageAt = 0, kPlanesAt = 2 * kStage, kWAt = kPlanesAt + 2 * kPlanes;
  static constexpr size_t kTotal = kWAt + 2 * kHeads * 4;
};
static_assert(Smem::kTotal <= 227 * 1024, "one block an SM");

__device__ __forceinline__ uint32_t shared_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void async_copy16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Two floats as three bf16x2 planes (the first float in the low half, as the fragments want the lower k).
struct Split3 {
  uint32_t hi, mid, lo;
};
__device__ __forceinline__ Split3 split3(float a, float b) {
  Split3 s;
  s.hi = pack_bf16(a, b);
  a -= __uint_as_float(s.hi << 16);  // exact: a and bf16(a) agree in their top 8 bits
  b -= __uint_as_float(s.hi & 0xffff0000u);
  s.mid = pack_bf16(a, b);
  a -= __uint_as_float(s.mid << 16);
  b -= __uint_as_float(s.mid & 0xffff0000u);
  s.lo = pack_bf16(a, b);
  return s;
}

// grid (key blocks, query blocks from first_block on): scores of queries i0 .. i0 + qpb - 1 for keys k0 .. k0 + 127
// (those < num_keys), -inf where not visible.
__global__ void __launch_bounds__(kThreads, 1)
    indexer_mma_kernel(IndexerParams p, float* scores, int qpb, int64_t first_block) {
  grid_dependency_wait();
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int vis_s[kMaxQpb];
  __shared__ int max_vis_s;
  float* stage = reinterpret_cast<float*>(smem + Smem::kStageAt);
  uint16_t* planes = reinterpret_cast<uint16_t*>(smem + Smem::kPlanesAt);
  float* wbuf = reinterpret_cast<float*>(smem + Smem::kWAt);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, quad = lane >> 2, c = lane & 3;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kKeys;
  const int64_t i0 = (first_block + blockIdx.y) * qpb;
  const int nq = static_cast<int>(min(static_cast<int64_t>(qpb), p.n - i0));
  const int heads = static_cast<int>(p.heads);

  if (tid == 0) max_vis_s = 0;
  __syncthreads();
  if (tid < nq) {
    const int64_t v = (p.positions[i0 + tid] + 1) / p.ratio;
    vis_s[tid] = static_cast<int>(max(int64_t{0}, min(v, p.num_keys)));
    atomicMax(&max_vis_s, vis_s[tid]);
  }
  __syncthreads();
  grid_dependents_launch();
  const int max_vis = max_vis_s;
  if (max_vis <= k0) {  // no query of the block sees a key of it (above the causal diagonal)
    const int nk = static_cast<int>(min(static_cast<int64_t>(kKeys), p.num_keys - k0));
    for (int e = tid; e < nq * nk; e += kThreads)
      scores[(i0 + e / nk) * p.num_keys + k0 + e % nk] = -INFINITY;
    return;
  }

  // q of query j (heads x 128 f32, contiguous) into a stage: one commit group a query.
  auto issue_q = [&](int j) {
    const float* src = p.q + (i0 + j) * p.heads * kDim;
    float* dst = stage + (j & 1) * (kHeads * kDim);
    for (int ch = tid; ch < heads * (kDim / 4); ch += kThreads) async_copy16(dst + 4 * ch, src + 4 * ch);
    async_commit();
  };
  const float head_scale = 1.0f / sqrtf(static_cast<float>(p.heads));
  const float dot_scale = 1.0f / sqrtf(static_cast<float>(kDim));
  // Query j's stage into planes (rows past p.heads zero) and its weights into wbuf.
  auto split_q = [&](int j) {
    const float* st = stage + (j & 1) * (kHeads * kDim);
    uint16_t* pl = planes + (j & 1) * (3 * kPlane);
#pragma unroll 4
    for (int f = tid; f < kHeads * kDim / 4; f += kThreads) {
      const int h = f / (kDim / 4), d = 4 * (f % (kDim / 4));
      const float4 v = h < heads ? *reinterpret_cast<const float4*>(st + h * kDim + d) : make_float4(0, 0, 0, 0);
      const Split3 a = split3(v.x, v.y), b = split3(v.z, v.w);
      uint16_t* at = pl + h * kRow + d;
      *reinterpret_cast<uint2*>(at) = make_uint2(a.hi, b.hi);
      *reinterpret_cast<uint2*>(at + kPlane) = make_uint2(a.mid, b.mid);
      *reinterpret_cast<uint2*>(at + 2 * kPlane) = make_uint2(a.lo, b.lo);
    }
    if (tid < kHeads) wbuf[(j & 1) * kHeads + tid] = tid < heads ? p.weights[(i0 + j) * p.heads + tid] * head_scale : 0.0f;
  };

  issue_q(0);
  if (nq > 1) issue_q(1);

  // The warp's 16 keys as A fragments (row = key, k = dim): register r of k-step kk holds rows quad (r even) or
  // quad + 8 (r odd), dims 16 kk + 2 c (r < 2) or 16 kk + 8 + 2 c (r >= 2), two bf16 each. Keys past num_keys
  // are zeros (never written out).
  const int64_t kw = k0 + 16 * warp;
  uint32_t ah[kSteps][4], am[kSteps][4], al[kSteps][4];
  {
    const float* rows[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t key = kw + quad + 8 * r;
      rows[r] = key < p.num_keys ? reinterpret_cast<const float*>(paged_row(p.keys, key)) : nullptr;
    }
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk)
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float2 v = rows[r] != nullptr
                               ? __ldg(reinterpret_cast<const float2*>(rows[r] + 16 * kk + 8 * half + 2 * c))
                               : make_float2(0.0f, 0.0f);
          const Split3 s = split3(v.x, v.y);
          ah[kk][2 * half + r] = s.hi, am[kk][2 * half + r] = s.mid, al[kk][2 * half + r] = s.lo;
        }
  }

  if (nq > 1)
    async_wait<1>();
  else
    async_wait<0>();
  __syncthreads();
  split_q(0);

  // ldmatrix.x4 rows of this lane: matrices (n-tile 0, dims 0-7), (n-tile 0, dims 8-15), (n-tile 1, 0-7),
  // (n-tile 1, 8-15) of a pair; lanes 8m .. 8m+7 address matrix m's 8 head rows.
  const uint32_t lane_off = ((8 * (lane >> 4) + (lane & 7)) * kRow + 8 * ((lane >> 3) & 1)) * 2;
  for (int j = 0; j < nq; ++j) {
    async_wait<0>();
    __syncthreads();  // q_j's planes are split, q_{j+1} has landed, query j-1's planes are free
    if (j + 2 < nq) issue_q(j + 2);
    const int vis = vis_s[j];
    const int64_t row_out = (i0 + j) * p.num_keys;
    if (kw < vis) {
      const uint32_t base = shared_u32(planes + (j & 1) * (3 * kPlane)) + lane_off;
      const float* wj = wbuf + (j & 1) * kHeads;
      float s0 = 0.0f, s1 = 0.0f;  // keys kw + quad, kw + quad + 8: this lane's 16 heads of each pair
      uint32_t fb[2][3][4];         // B fragments (hi, mid, lo) of this step and the next
      auto load = [&](int step, uint32_t (&f)[3][4]) {
        const uint32_t at = base + ((step / kSteps) * 16 * kRow + (step % kSteps) * 16) * 2;
#pragma unroll
        for (int pl = 0; pl < 3; ++pl) ldsm4(f[pl], at + pl * kPlane * 2);
      };
      load(0, fb[0]);
      float big[2][4], sa[2][4], sb[2][4];  // hi*hi; hi*mid + mid*hi; mid*mid + hi*lo + lo*hi
#pragma unroll
      for (int step = 0; step < kPairs * kSteps; ++step) {
        const int kk = step % kSteps, jp = step / kSteps;
        if (step + 1 < kPairs * kSteps) load(step + 1, fb[(step + 1) & 1]);
        const uint32_t(&bh)[4] = fb[step & 1][0];
        const uint32_t(&bm)[4] = fb[step & 1][1];
        const uint32_t(&bl)[4] = fb[step & 1][2];
        if (kk == 0) {
#pragma unroll
          for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) big[t][e] = sa[t][e] = sb[t][e] = 0.0f;
        }
        const uint32_t* a_h = ah[kk];
        const uint32_t* a_m = am[kk];
        const uint32_t* a_l = al[kk];
        // Interleaved so that two mma on one accumulator are at least three apart.
#pragma unroll
        for (int t = 0; t < 2; ++t) mma_bf16(big[t], a_h[0], a_h[1], a_h[2], a_h[3], bh[2 * t], bh[2 * t + 1]);
#pragma unroll
        for (int t = 0; t < 2; ++t) mma_bf16(sa[t], a_h[0], a_h[1], a_h[2], a_h[3], bm[2 * t], bm[2 * t + 1]);
#pragma unroll
        for (int t = 0; t < 2; ++t) mma_bf16(sb[t], a_m[0], a_m[1], a_m[2], a_m[3], bm[2 * t], bm[2 * t + 1]);
#pragma unroll
        for (int t = 0; t < 2; ++t) mma_bf16(sa[t], a_m[0], a_m[1], a_m[2], a_m[3], bh[2 * t], bh[2 * t + 1]);
#pragma unroll
        for (int t = 0; t < 2; ++t) mma_bf16(sb[t], a_h[0], a_h[1], a_h[2], a_h[3], bl[2 * t], bl[2 * t + 1]);
#pragma unroll
        for (int t = 0; t < 2; ++t) mma_bf16(sb[t], a_l[0], a_l[1], a_l[2], a_l[3], bh[2 * t], bh[2 * t + 1]);
        if (kk == kSteps - 1) {
          // Heads 16 jp + 8 t + 2 c + e: accumulator element e (key quad) and 2 + e (key quad + 8).
#pragma unroll
          for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float wh = wj[16 * jp + 8 * t + 2 * c + e];
              const float d0 = big[t][e] + (sa[t][e] + sb[t][e]);
              const float d1 = big[t][2 + e] + (sa[t][2 + e] + sb[t][2 + e]);
              s0 += (fmaxf(d0, 0.0f) * dot_scale) * wh;
              s1 += (fmaxf(d1, 0.0f) * dot_scale) * wh;
            }
        }
      }
      // The quad's four lanes hold disjoint heads: lanes c and c^1 trade so that even lanes keep key quad and odd
      // ones key quad + 8, then c and c^2 add. Lane c < 2 writes key quad + 8c: 16 lanes, 64 contiguous bytes.
      float keep = (c & 1) ? s1 : s0;
      const float give = (c & 1) ? s0 : s1;
      keep += __shfl_xor_sync(0xffffffffu, give, 1);
      keep += __shfl_xor_sync(0xffffffffu, keep, 2);
      const int64_t key = kw + quad + 8 * c;
      if (c < 2 && key < p.num_keys) scores[row_out + key] = key < vis ? keep : -INFINITY;
    } else if (lane < 16 && kw + lane < p.num_keys) {
      scores[row_out + kw + lane] = -INFINITY;  // none of the warp's keys is visible to query j
    }
    if (j + 1 < nq) split_q(j + 1);
  }
}

std::atomic<int> g_prefill{-1};  // IndexerPrefill; -1: not read from the environment yet
// The SGEMM path stays the default until the fused kernel has been checked and timed on an H200.
constexpr IndexerPrefill kDefaultPrefill = IndexerPrefill::sgemm;

}  // namespace
}  // namespace dev

IndexerPrefill indexer_prefill() {
  int v = dev::g_prefill.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv("TERN_INDEXER_PREFILL");
    const std::string_view s = e != nullptr ? e : "";
    v = static_cast<int>(s == "mma" ? IndexerPrefill::mma : s == "sgemm" ? IndexerPrefill::sgemm : dev::kDefaultPrefill);
    dev::g_prefill.store(v, std::memory_order_relaxed);
  }
  return static_cast<IndexerPrefill>(v);
}

void set_indexer_prefill(IndexerPrefill mode) { dev::g_prefill.store(static_cast<int>(mode), std::memory_order_relaxed); }

bool indexer_mma_supported(const IndexerParams& p) {
  return p.key_tables == nullptr && p.dim == kIndexerMmaDim && p.heads >= 1 && p.heads <= kMaxIndexerHeads &&
         p.num_keys < (int64_t{1} << 30) && reinterpret_cast<uintptr_t>(p.q) % 16 == 0;
}

size_t indexer_mma_smem_bytes() { return dev::Smem::kTotal; }

int indexer_mma_queries_per_block(int64_t n, int64_t num_keys, int num_sms) {
  // Enough blocks for 4 a multiprocessor (half of them may sit above the causal diagonal and exit at once);
  // more queries a block spread the keys' load and split over more work.
  const int64_t kblocks = (num_keys + dev::kKeys - 1) / dev::kKeys;
  int qpb = dev::kMaxQpb;
  while (qpb > 4 && (n + qpb - 1) / qpb * kblocks < 4 * int64_t{num_sms}) qpb /= 2;
  return qpb;
}

void launch_indexer_scores_mma(const IndexerParams& p, float* scores, int num_sms, cudaStream_t stream) {
  if (p.n == 0 || p.num_keys == 0) return;
  static std::atomic<bool> opted_in{false};
  if (!opted_in.load()) {
    // A failure shows as the launch's error.
    if (cudaFuncSetAttribute(dev::indexer_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(dev::Smem::kTotal)) == cudaSuccess)
      opted_in.store(true);
  }
  const int qpb = indexer_mma_queries_per_block(p.n, p.num_keys, num_sms);
  const int64_t kblocks = (p.num_keys + dev::kKeys - 1) / dev::kKeys, qblocks = (p.n + qpb - 1) / qpb;
  constexpr int64_t kMaxGridY = 65535;
  for (int64_t b0 = 0; b0 < qblocks; b0 += kMaxGridY) {
    const dim3 grid(static_cast<unsigned>(kblocks), static_cast<unsigned>(std::min(kMaxGridY, qblocks - b0)));
    if (launch(dev::indexer_mma_kernel, grid, dev::kThreads, dev::Smem::kTotal, stream, p, scores, qpb, b0) !=
        cudaSuccess)
      return;  // check_launch reports it
  }
}

}  // namespace tern::cuda
