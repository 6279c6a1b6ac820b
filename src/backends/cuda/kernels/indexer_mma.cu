// The lightning indexer's scores of a prefill chunk on tensor cores, in one kernel: q . k for every
// (query, head, key), ReLU, the scales and head weights, the sum over heads and the visibility, so that only
// the [queries, keys] scores reach memory (the SGEMM path writes and rereads [queries x heads, keys]: ~4 GB a
// CSA layer at 8 192 queries). The top-k that follows is indexer_topk_kernel, unchanged.
//
// Numerics, bf16x6 (IndexerMmaSplit::bf16x6, TERN_INDEXER_PREFILL=mma): q and the keys are f32 (the CPU
// reference's, and the top-k must pick what it picks), so each f32 x is cut into three bf16 planes, x = hi +
// mid + lo: hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid). Each bf16 holds 8 significant bits and
// every difference is exact in f32, so the three hold all 24 bits of x (exactly, for |x| above ~2^-100, where
// lo stays a normal bf16), with |mid| <= 2^-8 |x| and |lo| <= 2^-16 |x|. q . k = sum over dims of the nine
// products; the tensor cores form each bf16 x bf16 product exactly and add in f32. Kept: hi*hi, hi*mid,
// mid*hi, mid*mid, hi*lo, lo*hi (six mma.sync a k-step). Dropped: mid*lo, lo*mid (each <= 2^-24 |q_d k_d|)
// and lo*lo (2^-32): <= 2^-23 sum_d |q_d k_d| in all, two f32 roundings' worth. hi*hi goes to its own
// accumulator (8 mma additions, each rounded to f32: <= ~8 * 2^-23 relative to the largest partial sum, less
// than SGEMM's 128 sequential f32 FMAs, worst case 128 * 2^-24); the cross terms, ~2^-8 of it, to two others
// whose rounding is ~2^-8 smaller still, added to it once at the end. So the error bound is that of an f32
// dot product of 128 terms, a little under an f32 SGEMM's. TF32x3 (big/small tf32 halves, three mma) costs
// the same tensor time (tf32 runs at half bf16's rate) but keeps 22 bits (dropped small*small and the two
// halves' remainders ~3 * 2^-22, ~6x this bound) and needs twice the registers for fragments held in
// registers; so bf16x6 rather than TF32x3.
//
// fp16x3 (IndexerMmaSplit::fp16x3, TERN_INDEXER_PREFILL=mma-fp16x3): half the tensor work. Each row (a key; a
// (query, head) of q) is first multiplied by a power of two that brings its largest |x| into [2^14, 2^15)
// (exact), then cut into two fp16, x = hi + lo + r: fp16 holds 11 significant bits, the difference is exact,
// |r| <= 2^-22 |x| (lo normal for |x| >= 2^-17 of the row's largest; below, lo's absolute step is 2^-39 of
// it). Kept hi*hi, hi*lo, lo*hi: 3 mma a k-step; dropped lo*lo and the remainders: <= ~3 * 2^-22 sum|q_d
// k_d|, ~5x the bf16x6 bound and still under an f32 SGEMM's worst case. Emulated on the host
// (tools/reference/indexer_split_numerics.py, Gaussian data, each mma's sum rounded to nearest or toward zero):
// scores within 0.9-1.9e-7 of the row's max of f64 (bf16x6 0.6-1.3e-7; the CPU's own f32 sums 2-3e-7), top-512
// identical to the CPU's. The row scales come off exactly after the products (ReLU commutes with a positive
// scale): q's per head before the ReLU, the key's once on the head sum.
//
// Layout: a block owns 128 keys (8 warps x 16) and qpb queries. Each warp holds its 16 keys' planes in
// registers for the whole block (the A operand: 96 registers for three planes) and reads q's planes for one
// query at a time (the B operand: heads as columns, 64 heads = 8 n-tiles of 8) from shared memory through
// ldmatrix. q is copied f32 from global memory by cp.async one query ahead and split into planes by the whole
// block (warp w splits head rows w, w + 8, ...) while the next copy flies; one barrier a query. The
// accumulator rows are keys and the columns heads, so a thread holds 16 heads of two keys: it applies ReLU,
// dot scale and weight and sums them in registers; two quad shuffles finish the 64 heads. Head order of the
// sum (differs from the CPU's 0..63): thread c of a quad adds heads 16 jp + 8 t + 2 c + e for jp = 0..3, t =
// 0..1, e = 0..1 in that order; then lanes (c, c^1) and (c, c^2) are added pairwise. Every (query, key) score
// is computed by the same instruction sequence wherever the key or the query sits in the launch, so the
// scores' bits do not depend on the chunk's size or start.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string_view>

#include "backends/cuda/kernels/device_common.cuh"
#include "backends/cuda/kernels/indexer.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/mma_tile.cuh"
#include "core/env.h"

namespace tern::cuda {
namespace dev {
namespace {

constexpr int kDim = kIndexerMmaDim;  // 8 k-steps of 16
constexpr int kSteps = kDim / 16;
constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kKeys = 16 * kWarps;        // keys a block
constexpr int kHeads = kMaxIndexerHeads;  // planes padded to 64 heads (zeros past p.heads)
constexpr int kPairs = kHeads / 16;       // n-tile pairs (one ldmatrix.x4 a plane each)
constexpr int kRow =
    kDim + 8;  // 16-bit values a plane row: a 16-byte pad puts ldmatrix rows in distinct banks
constexpr int kPlane = kHeads * kRow;  // 16-bit values a plane
constexpr int kMaxQpb = 32;            // queries a block at most
static_assert(kHeads == kWarps * 8 && kDim == 32 * 4, "split_q: warp w splits rows w + 8u, a lane 4 dims");

// Dynamic shared memory: two f32 stages of one query's q (cp.async lands there), two sets of its planes (one
// read by the mma while the next is split), two rows of head weights (times heads^-0.5) and of q's row
// unscales.
template <int P>
struct Smem {
  static constexpr size_t kStage = size_t{kHeads} * kDim * 4;
  static constexpr size_t kPlanes = size_t{P} * kPlane * 2;
  static constexpr size_t kStageAt = 0, kPlanesAt = 2 * kStage, kWAt = kPlanesAt + 2 * kPlanes;
  static constexpr size_t kInvAt = kWAt + 2 * kHeads * 4;
  static constexpr size_t kTotal = kInvAt + 2 * kHeads * 4;
};
static_assert(Smem<3>::kTotal <= 227 * 1024, "one block an SM");

__device__ __forceinline__ uint32_t shared_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void async_copy16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_b16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  mma_bf16(c, a[0], a[1], a[2], a[3], b0, b1);
}

// The two numerics. split(): two floats (already row-scaled when kScaled) as kPlanes 16-bit x2 registers, the
// first float in the low half (the fragments' lower k). step(): one k-step of two n-tiles (B registers 2t,
// 2t+1 are n-tile t's); the large product (hi*hi) has an accumulator of its own, the small ones two more, so
// a warp has six independent accumulator chains. dot(): the f32 product from the accumulators, smallest
// first.
struct Bf16x6 {
  static constexpr int kPlanes = 3, kAcc = 3;
  static constexpr bool kScaled = false;
  __device__ static __forceinline__ void split(float a, float b, uint32_t (&o)[kPlanes]) {
    o[0] = pack_bf16(a, b);
    a -= __uint_as_float(o[0] << 16);  // exact: a and bf16(a) agree in their top 8 bits
    b -= __uint_as_float(o[0] & 0xffff0000u);
    o[1] = pack_bf16(a, b);
    a -= __uint_as_float(o[1] << 16);
    b -= __uint_as_float(o[1] & 0xffff0000u);
    o[2] = pack_bf16(a, b);
  }
  __device__ static __forceinline__ void step(float (&acc)[kAcc][2][4], const uint32_t (&a)[kPlanes][4],
                                              const uint32_t (&b)[kPlanes][4]) {
#pragma unroll
    for (int t = 0; t < 2; ++t) mma_b16(acc[0][t], a[0], b[0][2 * t], b[0][2 * t + 1]);  // hi*hi
#pragma unroll
    for (int t = 0; t < 2; ++t) mma_b16(acc[1][t], a[0], b[1][2 * t], b[1][2 * t + 1]);  // hi*mid
#pragma unroll
    for (int t = 0; t < 2; ++t) mma_b16(acc[2][t], a[1], b[1][2 * t], b[1][2 * t + 1]);  // mid*mid
#pragma unroll
    for (int t = 0; t < 2; ++t) mma_b16(acc[1][t], a[1], b[0][2 * t], b[0][2 * t + 1]);  // mid*hi
#pragma unroll
    for (int t = 0; t < 2; ++t) mma_b16(acc[2][t], a[0], b[2][2 * t], b[2][2 * t + 1]);  // hi*lo
#pragma unroll
    for (int t = 0; t < 2; ++t) mma_b16(acc[2][t], a[2], b[0][2 * t], b[0][2 * t + 1]);  // lo*hi
  }
  __device__ static __forceinline__ float dot(const float (&acc)[kAcc][2][4], int t, int e) {
    return acc[0][t][e] + (acc[1][t][e] + acc[2][t][e]);
  }
};

struct Fp16x3 {
  static constexpr int kPlanes = 2, kAcc = 3;
  static constexpr bool kScaled = true;
  __device__ static __forceinline__ void split(float a, float b, uint32_t (&o)[kPlanes]) {
    const __half2 hi = __floats2half2_rn(a, b);
    const float2 back = __half22float2(hi);
    const __half2 lo = __floats2half2_rn(a - back.x, b - back.y);  // exact differences (11 of 24 bits taken)
    o[0] = *reinterpret_cast<const uint32_t*>(&hi);
    o[1] = *reinterpret_cast<const uint32_t*>(&lo);
  }
  __device__ static __forceinline__ void step(float (&acc)[kAcc][2][4], const uint32_t (&a)[kPlanes][4],
                                              const uint32_t (&b)[kPlanes][4]) {
#pragma unroll
    for (int t = 0; t < 2; ++t) mma_f16(acc[0][t], a[0], b[0][2 * t], b[0][2 * t + 1]);  // hi*hi
#pragma unroll
    for (int t = 0; t < 2; ++t) mma_f16(acc[1][t], a[0], b[1][2 * t], b[1][2 * t + 1]);  // hi*lo
#pragma unroll
    for (int t = 0; t < 2; ++t) mma_f16(acc[2][t], a[1], b[0][2 * t], b[0][2 * t + 1]);  // lo*hi
  }
  __device__ static __forceinline__ float dot(const float (&acc)[kAcc][2][4], int t, int e) {
    return acc[0][t][e] + (acc[1][t][e] + acc[2][t][e]);
  }
};

// The power of two that brings a row whose largest |x| is m into [2^14, 2^15), and its inverse (exponents
// clamped so that both are normal: an all-zero row gets 2^126, infinities and NaN stay what they are).
__device__ __forceinline__ float row_scale(float m, float& inv) {
  const int ex = min(max(static_cast<int>((__float_as_uint(m) >> 23) & 0xffu), 15), 254);
  inv = __uint_as_float(static_cast<uint32_t>(ex - 14) << 23);
  return __uint_as_float(static_cast<uint32_t>(268 - ex) << 23);
}

// grid (key blocks, query blocks from first_block on): scores of queries i0 .. i0 + qpb - 1 for keys k0 .. k0
// + 127 (those < num_keys), -inf where not visible.
template <class N>
__global__ void __launch_bounds__(kThreads, 1)
    indexer_mma_kernel(IndexerParams p, float* scores, int qpb, int64_t first_block) {
  grid_dependency_wait();
  constexpr int P = N::kPlanes;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int vis_s[kMaxQpb];
  __shared__ int max_vis_s;
  float* stage = reinterpret_cast<float*>(smem + Smem<P>::kStageAt);
  uint16_t* planes = reinterpret_cast<uint16_t*>(smem + Smem<P>::kPlanesAt);
  float* wbuf = reinterpret_cast<float*>(smem + Smem<P>::kWAt);
  float* qinv = reinterpret_cast<float*>(smem + Smem<P>::kInvAt);  // kScaled: q rows' unscales
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
  // Query j's stage into planes (rows past p.heads zero), its weights into wbuf (and its rows' unscales into
  // qinv). Warp w splits head rows w, w + 8, ...: a lane 4 dims of the row, so a row's largest |x| is one
  // warp max.
  auto split_q = [&](int j) {
    const float* st = stage + (j & 1) * (kHeads * kDim);
    uint16_t* pl = planes + (j & 1) * (P * kPlane);
#pragma unroll 2
    for (int u = 0; u < kHeads / kWarps; ++u) {
      const int h = warp + kWarps * u, d = 4 * lane;
      float4 v = h < heads ? *reinterpret_cast<const float4*>(st + h * kDim + d) : make_float4(0, 0, 0, 0);
      if constexpr (N::kScaled) {
        float inv;
        const float sc =
            row_scale(warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)))), inv);
        v.x *= sc, v.y *= sc, v.z *= sc, v.w *= sc;
        if (lane == 0) qinv[(j & 1) * kHeads + h] = inv;
      }
      uint32_t a[P], b[P];
      N::split(v.x, v.y, a);
      N::split(v.z, v.w, b);
      uint16_t* at = pl + h * kRow + d;
#pragma unroll
      for (int q = 0; q < P; ++q) *reinterpret_cast<uint2*>(at + q * kPlane) = make_uint2(a[q], b[q]);
    }
    if (tid < kHeads)
      wbuf[(j & 1) * kHeads + tid] = tid < heads ? p.weights[(i0 + j) * p.heads + tid] * head_scale : 0.0f;
  };

  issue_q(0);
  if (nq > 1) issue_q(1);

  // The warp's 16 keys as A fragments (row = key, k = dim): register r of k-step kk holds rows quad (r even)
  // or quad + 8 (r odd), dims 16 kk + 2 c (r < 2) or 16 kk + 8 + 2 c (r >= 2), two values each. Keys past
  // num_keys are zeros (never written out). kScaled: each key row times its power of two first (the quad's 4
  // lanes hold the row's 128 dims); kinv undoes it on the head sum.
  const int64_t kw = k0 + 16 * warp;
  uint32_t ak[kSteps][P][4];
  float kinv[2] = {1.0f, 1.0f};
  {
    float2 kv[kSteps][2][2];  // [kk][half][r]
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t key = kw + quad + 8 * r;
      const float* row = key < p.num_keys ? reinterpret_cast<const float*>(paged_row(p.keys, key)) : nullptr;
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          kv[kk][half][r] = row != nullptr
                                ? __ldg(reinterpret_cast<const float2*>(row + 16 * kk + 8 * half + 2 * c))
                                : make_float2(0.0f, 0.0f);
    }
    float ksc[2] = {1.0f, 1.0f};
    if constexpr (N::kScaled) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float m = 0.0f;
#pragma unroll
        for (int kk = 0; kk < kSteps; ++kk)
#pragma unroll
          for (int half = 0; half < 2; ++half)
            m = fmaxf(m, fmaxf(fabsf(kv[kk][half][r].x), fabsf(kv[kk][half][r].y)));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        ksc[r] = row_scale(m, kinv[r]);
      }
    }
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk)
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          uint32_t o[P];
          N::split(kv[kk][half][r].x * ksc[r], kv[kk][half][r].y * ksc[r], o);
#pragma unroll
          for (int q = 0; q < P; ++q) ak[kk][q][2 * half + r] = o[q];
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
      const uint32_t base = shared_u32(planes + (j & 1) * (P * kPlane)) + lane_off;
      const float* wj = wbuf + (j & 1) * kHeads;
      const float* qi = qinv + (j & 1) * kHeads;
      float s0 = 0.0f, s1 = 0.0f;  // keys kw + quad, kw + quad + 8: this lane's 16 heads of each pair
      uint32_t fb[2][P][4];        // B fragments (one register set a plane) of this step and the next
      auto load = [&](int step, uint32_t(&f)[P][4]) {
        const uint32_t at = base + ((step / kSteps) * 16 * kRow + (step % kSteps) * 16) * 2;
#pragma unroll
        for (int q = 0; q < P; ++q) ldsm4(f[q], at + q * kPlane * 2);
      };
      load(0, fb[0]);
      float acc[N::kAcc][2][4];
#pragma unroll
      for (int step = 0; step < kPairs * kSteps; ++step) {
        const int kk = step % kSteps, jp = step / kSteps;
        if (step + 1 < kPairs * kSteps) load(step + 1, fb[(step + 1) & 1]);
        if (kk == 0) {
#pragma unroll
          for (int x = 0; x < N::kAcc; ++x)
#pragma unroll
            for (int t = 0; t < 2; ++t)
#pragma unroll
              for (int e = 0; e < 4; ++e) acc[x][t][e] = 0.0f;
        }
        N::step(acc, ak[kk], fb[step & 1]);
        if (kk == kSteps - 1) {
          // Heads 16 jp + 8 t + 2 c + e: accumulator element e (key quad) and 2 + e (key quad + 8).
#pragma unroll
          for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int h = 16 * jp + 8 * t + 2 * c + e;
              float d0 = N::dot(acc, t, e), d1 = N::dot(acc, t, 2 + e);
              if constexpr (N::kScaled) d0 *= qi[h], d1 *= qi[h];
              s0 += (fmaxf(d0, 0.0f) * dot_scale) * wj[h];
              s1 += (fmaxf(d1, 0.0f) * dot_scale) * wj[h];
            }
        }
      }
      // The quad's four lanes hold disjoint heads: lanes c and c^1 trade so that even lanes keep key quad and
      // odd ones key quad + 8, then c and c^2 add. Lane c < 2 writes key quad + 8c: 16 lanes, 64 contiguous
      // bytes.
      float keep = (c & 1) ? s1 : s0;
      const float give = (c & 1) ? s0 : s1;
      keep += __shfl_xor_sync(0xffffffffu, give, 1);
      keep += __shfl_xor_sync(0xffffffffu, keep, 2);
      if constexpr (N::kScaled) keep *= (c & 1) ? kinv[1] : kinv[0];
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
constexpr IndexerPrefill kDefaultPrefill = IndexerPrefill::mma;  // measured session 10 call 3: 3.25 vs 5.58 ms a CSA layer at 8K

template <class N>
void launch_split(const IndexerParams& p, float* scores, int qpb, cudaStream_t stream) {
  constexpr size_t smem = Smem<N::kPlanes>::kTotal;
  static std::atomic<bool> opted_in{false};
  if (!opted_in.load()) {
    // A failure shows as the launch's error.
    if (cudaFuncSetAttribute(indexer_mma_kernel<N>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)) == cudaSuccess)
      opted_in.store(true);
  }
  const int64_t kblocks = (p.num_keys + kKeys - 1) / kKeys, qblocks = (p.n + qpb - 1) / qpb;
  constexpr int64_t kMaxGridY = 65535;
  for (int64_t b0 = 0; b0 < qblocks; b0 += kMaxGridY) {
    const dim3 grid(static_cast<unsigned>(kblocks), static_cast<unsigned>(std::min(kMaxGridY, qblocks - b0)));
    if (launch(indexer_mma_kernel<N>, grid, kThreads, smem, stream, p, scores, qpb, b0) != cudaSuccess)
      return;  // check_launch reports it
  }
}

}  // namespace
}  // namespace dev

IndexerPrefill indexer_prefill() {
  int v = dev::g_prefill.load(std::memory_order_relaxed);
  if (v < 0) {
    // "auto": dev::kDefaultPrefill.
    const std::string s =
        env_choice("TERN_INDEXER_PREFILL", {"auto", "mma", "mma-bf16x6", "mma-fp16x3", "sgemm"}, "auto");
    const IndexerPrefill m = s == "mma" || s == "mma-bf16x6" ? IndexerPrefill::mma
                             : s == "mma-fp16x3"             ? IndexerPrefill::mma_fp16x3
                             : s == "sgemm"                  ? IndexerPrefill::sgemm
                                                             : dev::kDefaultPrefill;
    v = static_cast<int>(m);
    dev::g_prefill.store(v, std::memory_order_relaxed);
  }
  return static_cast<IndexerPrefill>(v);
}

void set_indexer_prefill(IndexerPrefill mode) {
  dev::g_prefill.store(static_cast<int>(mode), std::memory_order_relaxed);
}

bool indexer_mma_supported(const IndexerParams& p) {
  return p.key_tables == nullptr && p.dim == kIndexerMmaDim && p.heads >= 1 && p.heads <= kMaxIndexerHeads &&
         p.num_keys < (int64_t{1} << 30) && reinterpret_cast<uintptr_t>(p.q) % 16 == 0;
}

int indexer_mma_queries_per_block(int64_t n, int64_t num_keys, int num_sms) {
  // Enough blocks for 4 a multiprocessor (half of them may sit above the causal diagonal and exit at once);
  // more queries a block spread the keys' load and split over more work.
  const int64_t kblocks = (num_keys + dev::kKeys - 1) / dev::kKeys;
  int qpb = dev::kMaxQpb;
  while (qpb > 4 && (n + qpb - 1) / qpb * kblocks < 4 * int64_t{num_sms}) qpb /= 2;
  return qpb;
}

void launch_indexer_scores_mma(const IndexerParams& p, float* scores, int num_sms, cudaStream_t stream,
                               IndexerMmaSplit split) {
  if (p.n == 0 || p.num_keys == 0) return;
  const int qpb = indexer_mma_queries_per_block(p.n, p.num_keys, num_sms);
  if (split == IndexerMmaSplit::fp16x3)
    dev::launch_split<dev::Fp16x3>(p, scores, qpb, stream);
  else
    dev::launch_split<dev::Bf16x6>(p, scores, qpb, stream);
}

}  // namespace tern::cuda
