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
  // Decode mode (positions != null): blockIdx.y is a slot of one token at positions[slot] (-1: inert,
  // touches nothing); its accumulators start at the address accs[slot], its kv / gate are row `slot`, and
  // an entry it completes goes to emitted row `slot`. n, start_pos and acc are then unused.
  const int64_t* positions = nullptr;
  const uint64_t* accs = nullptr;
  int64_t slots = 0;
};

void launch_compressor(const CompressorParams& p, cudaStream_t stream);

}  // namespace tern::cuda
