// Device sampling: one block per row. The arithmetic is the host sampler's (engine/sampler.cpp) through
// ops/sampling_math.h, and every sum the host computes sequentially (double, in a fixed order) is
// computed sequentially here too, by one thread, in the same order: the draw compares u with these sums,
// so the same bits give the same token. Everything order-free (max, counts, argmax, the selection of
// candidates) runs on the whole block.
//
// Candidates in the host's order (weight descending, index ascending) come in tiers: a radix select
// (8 passes of 8 bits over the 64-bit candidate key) finds the kTier largest keys below a bound, a bitonic
// sort orders them in shared memory, thread 0 consumes them, and the next tier starts below the last
// key. A top-k of at most kTier or a nucleus within kTier candidates takes one tier.
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/sampling.cuh"

namespace tern::cuda {
namespace dev {
namespace {

using sampling::SampledRow;
using sampling::SampleRowDesc;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kTier = 4096;        // candidates sorted at a time
constexpr int kCheckpoints = 512;  // partial sums kept by the unsorted draw

struct Shared {
  uint64_t keys[kTier];
  int hist[256];
  double checkpoint[kCheckpoints + 1];
  uint64_t red_u64[kWarps];
  float red_f[kWarps];
  double red_d[kWarps];
  int red_i[kWarps];
  uint64_t prefix;
  int remaining;
  int take_all;
  int count;
  int64_t tier_first;  // sorted position of keys[0]; -1: keys hold nothing reusable
  int tier_count;
  int stop;
  float bcast_f;
  int bcast_i;
};

// ---- block reductions (every thread gets the result) ----

__device__ float block_max(Shared& s, float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) s.red_f[warp] = v;
  __syncthreads();
  float r = s.red_f[0];
  for (int w = 1; w < kWarps; ++w) r = fmaxf(r, s.red_f[w]);
  __syncthreads();
  return r;
}

__device__ uint64_t block_max_u64(Shared& s, uint64_t v) {
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t x = __shfl_xor_sync(0xffffffffu, v, o);
    v = x > v ? x : v;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) s.red_u64[warp] = v;
  __syncthreads();
  uint64_t r = s.red_u64[0];
  for (int w = 1; w < kWarps; ++w) r = s.red_u64[w] > r ? s.red_u64[w] : r;
  __syncthreads();
  return r;
}

// Block-wide sum through `red` (one slot per warp, summed in warp order on every thread).
template <typename T>
__device__ T block_add(T* red, T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  T r = 0;
  for (int w = 0; w < kWarps; ++w) r += red[w];
  __syncthreads();
  return r;
}

__device__ double block_sum(Shared& s, double v) { return block_add(s.red_d, v); }
__device__ int block_count(Shared& s, int v) { return block_add(s.red_i, v); }

// ---- selection of the largest keys ----

struct WeightKey {
  const float* w;
  __device__ uint64_t operator()(int i) const { return sampling::candidate_key(w[i], static_cast<uint32_t>(i)); }
};
struct LogitKey {
  const float* l;
  __device__ uint64_t operator()(int i) const { return sampling::logit_key(l[i], static_cast<uint32_t>(i)); }
};

// Puts the `want` (<= kTier) largest keys below `bound` into s.keys[0, s.count), sorted descending (all of
// them when fewer are below the bound). Keys are distinct (they hold the index).
template <class Key>
__device__ void select_sorted(Shared& s, Key key, int n, uint64_t bound, int want) {
  if (threadIdx.x == 0) {
    s.prefix = 0;
    s.remaining = want;
    s.take_all = 0;
    s.count = 0;
  }
  __syncthreads();
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) s.hist[b] = 0;
    __syncthreads();
    const uint64_t prefix = s.prefix;
    for (int i = threadIdx.x; i < n; i += kThreads) {
      const uint64_t k = key(i);
      if (k < bound && (shift == 56 || (k >> (shift + 8)) == (prefix >> (shift + 8))))
        atomicAdd(&s.hist[(k >> shift) & 255], 1);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l holds bins 255-8l .. 248-8l (highest first); a warp scan finds the bin of the
      // remaining-th largest key.
      const int lane = threadIdx.x, need = s.remaining;
      int local[8], sum = 0;
#pragma unroll
      for (int q = 0; q < 8; ++q) sum += local[q] = s.hist[255 - 8 * lane - q];
      int incl = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      const int total = __shfl_sync(0xffffffffu, incl, 31);
      if (shift == 56 && total <= need) {
        if (lane == 0) s.take_all = 1;  // every key below the bound is wanted
      } else {
        const int excl = incl - sum;
        const unsigned hit = __ballot_sync(0xffffffffu, excl < need && need <= incl);
        if (hit != 0 && lane == __ffs(hit) - 1) {
          int cum = excl, q = 0;
          for (; q < 7; ++q) {
            if (cum + local[q] >= need) break;
            cum += local[q];
          }
          s.remaining = need - cum;
          s.prefix = prefix | (static_cast<uint64_t>(255 - 8 * lane - q) << shift);
        }
      }
    }
    __syncthreads();
    if (s.take_all) break;
  }
  const uint64_t thresh = s.take_all ? 0 : s.prefix;  // the want-th largest key (keys are distinct)
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const uint64_t k = key(i);
    if (k < bound && k >= thresh) {
      const int slot = atomicAdd(&s.count, 1);
      if (slot < kTier) s.keys[slot] = k;
    }
  }
  __syncthreads();
  const int count = min(s.count, kTier);
  int p2 = 1;
  while (p2 < count) p2 <<= 1;
  for (int i = count + threadIdx.x; i < p2; i += kThreads) s.keys[i] = 0;  // below every real key
  __syncthreads();
  // Bitonic sort, descending.
  for (int k = 2; k <= p2; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < p2; i += kThreads) {
        const int ixj = i ^ j;
        if (ixj > i) {
          const uint64_t a = s.keys[i], b = s.keys[ixj];
          const bool descending = (i & k) == 0;
          if (descending ? a < b : a > b) {
            s.keys[i] = b;
            s.keys[ixj] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  if (threadIdx.x == 0) s.count = count;
  __syncthreads();
}

// Visits the candidates at sorted positions [0, limit) in order on thread 0, calling f(position, weight,
// index) until it returns true. Tier 0 stays in shared memory between walks while no later tier was
// needed. Every thread must call it.
template <class F>
__device__ void walk_sorted(Shared& s, const float* w, int n, int64_t limit, F f) {
  uint64_t bound = ~0ull;
  int64_t first = 0;
  while (first < limit) {
    if (s.tier_first != first) {  // every thread reads the same value (written before a barrier)
      __syncthreads();            // nobody still reads the previous tier
      select_sorted(s, WeightKey{w}, n, bound, kTier);
      if (threadIdx.x == 0) {
        s.tier_first = first;
        s.tier_count = s.count;
      }
      __syncthreads();
    }
    const int count = s.tier_count;
    if (threadIdx.x == 0) {
      int stop = 0;
      for (int j = 0; j < count && first + j < limit; ++j) {
        const uint64_t k = s.keys[j];
        if (f(first + j, sampling::key_weight(k), static_cast<int>(sampling::key_index(k)))) {
          stop = 1;
          break;
        }
      }
      s.stop = stop;
    }
    __syncthreads();
    const bool stop = s.stop != 0;
    const uint64_t last = count > 0 ? s.keys[count - 1] : 0;
    __syncthreads();  // s.stop and the keys are read before anyone rewrites them
    if (stop || count < kTier || count == 0) break;
    bound = last;
    first += count;
  }
}

// ---- the kernel ----

__global__ void __launch_bounds__(kThreads) sample_rows_kernel(const float* __restrict__ logits, int vocab,
                                                              const uint8_t* __restrict__ packed, int rows,
                                                              float* __restrict__ work, SampledRow* out) {
  pdl_prologue();
  __shared__ Shared s;
  const int row = blockIdx.x;
  const SampleRowDesc d = reinterpret_cast<const SampleRowDesc*>(packed)[row];
  const int32_t* ids = reinterpret_cast<const int32_t*>(packed + static_cast<size_t>(rows) * sizeof(SampleRowDesc));
  const float* L = logits + static_cast<int64_t>(row) * vocab;
  float* W = work + static_cast<int64_t>(row) * vocab;
  SampledRow& o = out[row];
  const int tid = threadIdx.x;
  if (tid == 0) s.tier_first = -1;
  __syncthreads();

  // Logprobs of the unmodified logits (as fill_logprobs): log_z = max + log(sum exp(l - max)).
  float log_z = 0.0f;
  if (d.top_logprobs >= 0) {
    float m = -__int_as_float(0x7f800000);
    for (int i = tid; i < vocab; i += kThreads) m = fmaxf(m, L[i]);
    const float max_l = block_max(s, m);
    double z = 0;
    for (int i = tid; i < vocab; i += kThreads) z += sampling::exp_weight(sampling::fsub(L[i], max_l));
    z = block_sum(s, z);
    log_z = static_cast<float>(sampling::dadd(static_cast<double>(max_l), log(z)));
    const int top_n = min(d.top_logprobs, sampling::kMaxTopLogprobs);
    if (top_n > 0) {
      select_sorted(s, LogitKey{L}, vocab, ~0ull, top_n);
      const int got = min(s.count, top_n);
      if (tid < got) {
        const int t = static_cast<int>(sampling::key_index(s.keys[tid]));
        o.top_tokens[tid] = t;
        o.top_logprobs[tid] = sampling::fsub(L[t], log_z);
      }
      if (tid == 0) o.num_top = got;
      __syncthreads();
    } else if (tid == 0) {
      o.num_top = 0;
    }
  } else if (tid == 0) {
    o.num_top = 0;
  }

  const bool penalised = sampling::row_penalised(d);
  const bool greedy = sampling::row_greedy(d);
  const float* src = L;
  if (penalised || !greedy) {
    for (int i = tid; i < vocab; i += kThreads) W[i] = L[i];
    __syncthreads();
    if (d.repetition != 1.0f)
      for (int j = tid; j < d.seen_count; j += kThreads) {
        const int t = ids[d.seen_offset + j];
        W[t] = sampling::repetition_penalised(W[t], d.repetition);
      }
    __syncthreads();
    if (d.presence != 0.0f || d.frequency != 0.0f)
      for (int j = tid; j < d.counts_count; j += kThreads) {
        const int t = ids[d.counts_offset + 2 * j], c = ids[d.counts_offset + 2 * j + 1];
        W[t] = sampling::count_penalised(W[t], d.presence, d.frequency, c);
      }
    __syncthreads();
    src = W;
  }

  int token = 0;
  if (greedy) {  // argmax, the lowest index among ties
    uint64_t best = 0;
    for (int i = tid; i < vocab; i += kThreads) {
      const uint64_t k = sampling::logit_key(src[i], static_cast<uint32_t>(i));
      best = k > best ? k : best;
    }
    token = static_cast<int>(sampling::key_index(block_max_u64(s, best)));
  } else {
    // Weights exp((l - max) / T), max 1, in place.
    float m = -__int_as_float(0x7f800000);
    for (int i = tid; i < vocab; i += kThreads) m = fmaxf(m, W[i]);
    const float max_l = block_max(s, m);
    const float inv_t = sampling::fdiv(1.0f, d.temperature);
    for (int i = tid; i < vocab; i += kThreads)
      W[i] = sampling::exp_weight(sampling::fmul(sampling::fsub(W[i], max_l), inv_t));
    __syncthreads();
    const float min_p = d.min_p;
    if (d.top_k <= 0 && d.top_p >= 1.0f) {
      // draw_unsorted: an inverse-CDF scan in index order over the weights >= min_p. Thread 0 sums in
      // index order (the host's order), keeping the partial sum at each chunk start; the scan then
      // starts at the last chunk whose partial sum does not exceed u.
      const int chunk = (vocab + kCheckpoints - 1) / kCheckpoints;
      if (tid == 0) {
        double total = 0;
        int last = 0;
        for (int c = 0; c * chunk < vocab; ++c) {
          s.checkpoint[c] = total;
          const int end = min(vocab, (c + 1) * chunk);
          for (int i = c * chunk; i < end; ++i) {
            const float wi = W[i];
            if (wi < min_p) continue;
            total = sampling::dadd(total, static_cast<double>(wi));
            last = i;
          }
        }
        const double u = sampling::dmul(d.uniform, total);
        int c = 0;
        while ((c + 1) * chunk < vocab && s.checkpoint[c + 1] <= u) ++c;
        double acc = s.checkpoint[c];
        token = last;
        for (int i = c * chunk; i < vocab; ++i) {
          const float wi = W[i];
          if (wi < min_p) continue;
          acc = sampling::dadd(acc, static_cast<double>(wi));
          if (u < acc) {
            token = i;
            break;
          }
        }
        s.bcast_i = token;
      }
      __syncthreads();
      token = s.bcast_i;
    } else {
      // sorted_candidates + the draw, in the host's candidate order.
      const int64_t n = d.top_k > 0 ? min(static_cast<int64_t>(d.top_k), static_cast<int64_t>(vocab)) : vocab;
      double z = 0;  // thread 0's
      if (d.top_k > 0) {
        walk_sorted(s, W, vocab, n, [&](int64_t, float wi, int) {
          z = sampling::dadd(z, static_cast<double>(wi));
          return false;
        });
      } else if (tid == 0) {  // the sum of every weight in index order (the host's exp loop)
        for (int i = 0; i < vocab; ++i) z = sampling::dadd(z, static_cast<double>(W[i]));
      }
      int64_t cut = n;
      if (d.top_p < 1.0f) {
        double mass = 0;
        const double top_p = d.top_p;
        walk_sorted(s, W, vocab, n, [&](int64_t pos, float wi, int) {
          mass = sampling::dadd(mass, sampling::ddiv(static_cast<double>(wi), z));
          if (mass >= top_p) {
            cut = pos + 1;
            return true;
          }
          return false;
        });
      }
      // min-p: the sorted prefix of weights >= min_p, at least the best token.
      int local = 0;
      for (int i = tid; i < vocab; i += kThreads) local += W[i] >= min_p;
      const int64_t above = block_count(s, local);
      if (tid == 0) s.bcast_i = static_cast<int>(min(cut, max(int64_t{1}, above)));  // cut is thread 0's
      __syncthreads();
      const int64_t keep = s.bcast_i;  // the same on every thread: walk_sorted's barriers depend on it
      double total = 0;
      walk_sorted(s, W, vocab, keep, [&](int64_t, float wi, int) {
        total = sampling::dadd(total, static_cast<double>(wi));
        return false;
      });
      const double u = sampling::dmul(d.uniform, total);
      double acc = 0;
      walk_sorted(s, W, vocab, keep, [&](int64_t, float wi, int index) {
        acc = sampling::dadd(acc, static_cast<double>(wi));
        token = index;  // the last visited stays when u is never below acc (position keep - 1)
        return u < acc;
      });
      if (tid == 0) s.bcast_i = token;
      __syncthreads();
      token = s.bcast_i;
    }
  }
  if (tid == 0) {
    o.token = token;
    o.logprob = d.top_logprobs >= 0 ? sampling::fsub(L[token], log_z) : 0.0f;
  }
}

}  // namespace
}  // namespace dev

void launch_sample_rows(const float* logits, int64_t rows, int64_t vocab, const void* packed, float* work,
                        sampling::SampledRow* out, cudaStream_t stream) {
  if (rows == 0) return;
  launch(dev::sample_rows_kernel, static_cast<unsigned>(rows), dev::kThreads, 0, stream, logits,
         static_cast<int>(vocab), static_cast<const uint8_t*>(packed), static_cast<int>(rows), work, out);
}

}  // namespace tern::cuda
