// The lightning indexer (host interface): f32 scores of every visible compressed key, then an exact
// top-k per query (radix select on the float bits, ties to the lower index, sorted best first).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backends/cuda/kernels/paged_rows.cuh"

namespace tern::cuda {

struct IndexerParams {
  const float* q = nullptr;        // [n, heads, dim]
  const float* weights = nullptr;  // [n, heads]
  PagedRowsDesc keys;              // num_keys rows of dim floats, in pages
  int64_t n = 0, heads = 0, dim = 0, num_keys = 0;
  const int64_t* positions = nullptr;  // [n]
  int ratio = 4;
  // Decode mode (key_tables != null): query i is slot i of its own sequence, whose keys are in the pages
  // of the pool at pools[i] through the block table at key_tables[i] (keys gives only the page geometry)
  // and number (positions[i] + 1) / ratio (positions[i] = -1: inert, all picks -1); num_keys is then the
  // bound that sizes the launch and strides the scores.
  const uint64_t* pools = nullptr;
  const uint64_t* key_tables = nullptr;
  // indexer_topk_kernel's short ways (TERN_TOPK_FAST=0: off, A/B; the same picks): a row of at most topk keys
  // skips the radix select, and up to 1024 entries sort in registers (shuffles below a warp's stride).
  bool fast_topk = true;
};

constexpr int kMaxIndexerTopk = 2048;
constexpr int kMaxIndexerHeads = 64;                 // the backend checks heads <= 64 and dim % 4 == 0
constexpr int64_t kIndexerTopkCachedKeys = 32768;    // rows up to this many keys are cached in shared memory

// scores [n, num_keys], -inf where not visible.
void launch_indexer_scores(const IndexerParams& p, float* scores, cudaStream_t stream);
// The library path of a prefill (no decode mode): the keys out of their pages into out [num_keys, dim]; then,
// for queries first .. first+count-1, their scores from S [count * heads, cols] = q . k of the first `cols`
// keys (cols covers every key these queries see; the rest are -inf).
void launch_indexer_gather_keys(const IndexerParams& p, float* out, cudaStream_t stream);
void launch_indexer_reduce(const IndexerParams& p, const float* S, int64_t first, int64_t count, int64_t cols,
                           float* scores, cudaStream_t stream);
// indices [n, topk] from scores [n, num_keys].
void launch_indexer_topk(const IndexerParams& p, const float* scores, int topk, int32_t* indices,
                         cudaStream_t stream);

// The fused tensor-core path of a prefill chunk (indexer_mma.cu): scores [n, num_keys] as launch_indexer_scores
// writes them (-inf where not visible), from split products of q and the keys straight out of their pages at f32
// accuracy (bf16x6: three bf16 planes, six products; fp16x3: two fp16 planes of power-of-two-scaled rows, three
// products, half the tensor work; the file's header gives both bounds), head sums in another order than the CPU's.
// Eager calls only (no decode mode), dims == kIndexerMmaDim, heads <= 64, q 16-byte aligned: indexer_mma_supported.
constexpr int64_t kIndexerMmaDim = 128;
enum class IndexerMmaSplit : int { bf16x6 = 0, fp16x3 = 1 };
bool indexer_mma_supported(const IndexerParams& p);
void launch_indexer_scores_mma(const IndexerParams& p, float* scores, int num_sms, cudaStream_t stream,
                               IndexerMmaSplit split = IndexerMmaSplit::bf16x6);
// Queries a block of the fused kernel for this launch (tests and the benchmark print it).
int indexer_mma_queries_per_block(int64_t n, int64_t num_keys, int num_sms);

// How indexer_topk scores a prefill chunk (>= kLibraryMinTokens queries, not batch invariant): sgemm (gather
// the keys, cuBLAS f32 q . k into [n x heads, keys], indexer_reduce_kernel), mma (the default since session 10:
// the fused kernel above, bf16x6) or mma_fp16x3. TERN_INDEXER_PREFILL=auto|sgemm|mma|mma-bf16x6|mma-fp16x3 sets
// it at first use (other values are refused); set_indexer_prefill for tests and benches.
enum class IndexerPrefill : int { sgemm = 0, mma = 1, mma_fp16x3 = 2 };
IndexerPrefill indexer_prefill();
void set_indexer_prefill(IndexerPrefill mode);

}  // namespace tern::cuda
