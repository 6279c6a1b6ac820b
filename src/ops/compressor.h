// The V4 KV compressor, accumulated online.
//
// Token t (absolute position) brings kv_t = wkv h_t and gate_t = wgate h_t + ape[t mod ratio]. Entry w
// pools, per channel, softmax over its candidate tokens of gate, weighting kv:
//   HCA (overlap = false, width channels): the `ratio` tokens of window w.
//   CSA (overlap = true, 2*width channels): the first `width` channels of window w-1's tokens and the
//        last `width` channels of window w's tokens (2*ratio candidates; window -1 contributes nothing).
// A softmax-weighted sum per channel folds one token at a time into (running max m, sum s, weighted sum
// v), so the pending state of a sequence is O(width):
//   acc f32 [n_acc, 3, width], rows m, s, v; s == 0 marks an empty accumulator (all-zero = fresh state).
//   HCA: n_acc = 1 (the open window's entry).  CSA: n_acc = 2 (acc[0]: the entry of the open window,
//   already holding window w-1's first halves; acc[1]: the next entry, collecting this window's first
//   halves).
// When token t closes its window (t mod ratio == ratio-1) the entry v/s is emitted and the accumulators
// shift. Emitted rows are raw pools: the caller applies the compressor's RMSNorm and RoPE at w*ratio.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tern::ops {

class Context;  // ops/context.h: each op runs in one

struct CompressorArgs {
  TensorView acc;   // f32 [overlap ? 2 : 1, 3, width], updated in place
  TensorView kv;    // f32 [n, C] for the tokens at start_pos .. start_pos+n-1; C = width * (overlap ? 2 : 1)
  TensorView gate;  // f32 [n, C] (without ape)
  // kv and gate are rows (TensorView::row_stride), equally spaced: column ranges of one stacked product's
  // output (model/stacked.h) or tensors of their own.
  TensorView ape;   // f32 [ratio, C]
  int64_t start_pos = 0;
  int ratio = 0;
  bool overlap = false;
  TensorView emitted;  // out f32 [>= emitted count, width]: entries start_pos/ratio, ... in order
};

// Number of entries a chunk of n tokens starting at start_pos completes.
inline int64_t compressor_emit_count(int64_t start_pos, int64_t n, int ratio) {
  return (start_pos + n) / ratio - start_pos / ratio;
}

// Folds the chunk into acc and writes the completed entries; returns how many.
int64_t compressor_update(const Context& ctx, const CompressorArgs& a);

}  // namespace tern::ops
