// The online KV compressor (host interface; semantics in ops/compressor.h). One thread per (channel,
// window): each emitted entry is folded independently from the chunk's tokens (and the pending
// accumulators for the first two windows); the thread of the last window writes the new accumulators after a
// barrier in the same block as the readers, so no thread reads state another has already replaced.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

struct CompressorParams {
  float* acc = nullptr;        // [overlap ? 2 : 1, 3, width]
  const float* kv = nullptr;   // [n, channels], rows row_stride floats apart
  const float* gate = nullptr; // [n, channels], rows row_stride floats apart
  int64_t row_stride = 0;      // channels, or more: kv and gate are column ranges of one stacked product
  const float* ape = nullptr;  // [ratio, channels]
  int64_t n = 0, width = 0, start_pos = 0;
  int ratio = 0;
  bool overlap = false;
  float* emitted = nullptr;    // [>= emit count, width]
  // Decode (step) mode (positions != null): blockIdx.y is a slot at positions[slot] (-1: inert, touches nothing).
  // A sequence's first slot (firsts[slot] == slot; every slot without firsts) folds the sequence's tokens (its
  // slots slot .. while firsts names it) as one chunk from the address accs[slot], its kv / gate rows from row
  // `slot`; the entry of window w goes to the row of the token that closes it (emit_row). The other slots'
  // blocks return at once. n, start_pos and acc are then set per block. A chunk spans at most three windows
  // (w0, w0 + 1 and the last: the block's lanes 0..2; the backend checks max_queries <= 2 ratio + 1).
  const int64_t* positions = nullptr;
  const int64_t* firsts = nullptr;
  const uint64_t* accs = nullptr;
  int64_t slots = 0;
};

void launch_compressor(const CompressorParams& p, cudaStream_t stream);

}  // namespace tern::cuda
