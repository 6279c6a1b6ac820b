// Sparse attention of one sequence's chunk (host interface; semantics in ops/attention.h): all heads of
// a query share each decoded K=V row; keys are split across blocks (flash-decoding) and the partial
// (max, sum, weighted rows) merged with the sink by a second kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/kv_row.cuh"
#include "backends/cuda/kernels/paged_rows.cuh"

namespace tern::cuda {

struct AttentionParams {
  const float* q = nullptr;  // [n, heads, head_dim]
  int64_t n = 0, heads = 0, start = 0;
  KvRowDesc fmt;
  const uint8_t* chunk_rows = nullptr;  // [n, row_bytes]
  const uint8_t* ring = nullptr;        // [window, row_bytes]
  int64_t window = 0;
  PagedRowsDesc compressed;             // >= num_compressed rows of row_bytes, in pages
  int64_t num_compressed = 0;
  int ratio = 0;
  const int32_t* selected = nullptr;    // [n, k_sel] or null
  int64_t k_sel = 0;
  const float* sinks = nullptr;         // [heads]
  float scale = 1.0f;
  float* out = nullptr;                 // [n, heads, head_dim]
  float* partial = nullptr;             // workspace: attention_partial_floats()
  int* err = nullptr;
  int num_sms = 132;
  // Decode mode (positions != null): n slots of one query each. Slot i's query is at positions[i] (-1: an
  // inert padding slot, which writes zeros and reads nothing), its own row is chunk_rows row i, its ring
  // starts at the address rings[i], its compressed rows are in the pages of the pool at pools[i] through the
  // block table at comp_tables[i] (compressed gives only the page geometry), and it sees (positions[i] + 1) /
  // ratio compressed rows; num_compressed is then only the bound that sizes the launch.
  const int64_t* positions = nullptr;
  const uint64_t* rings = nullptr;
  const uint64_t* pools = nullptr;
  const uint64_t* comp_tables = nullptr;
};

int attention_splits(const AttentionParams& p);
int64_t attention_partial_floats(const AttentionParams& p);
void launch_sparse_attention(const AttentionParams& p, cudaStream_t stream);

}  // namespace tern::cuda
