// The compressor's fold on the device (nvcc only): one thread's work on one (channel, window), shared by
// compressor_kernel and the decode step's fused emit chain (compress_emit.cu), so both fold in the one order
// the CPU reference uses and a decode step gives the bits of a prefill chunk.
#pragma once

#include "backends/cuda/kernels/compressor.cuh"

namespace tern::cuda::dev {

// Running (max, sum, weighted sum) of one channel's softmax-weighted pool; s == 0 means empty.
struct Acc {
  float m = 0.0f, s = 0.0f, v = 0.0f;
  __device__ void fold(float gate, float kv) {
    if (s == 0.0f) {
      m = gate, s = 1.0f, v = kv;
    } else if (gate > m) {
      const float shrink = expf(m - gate);
      s = s * shrink + 1.0f;
      v = v * shrink + kv;
      m = gate;
    } else {
      const float e = expf(gate - m);
      s += e;
      v += kv * e;
    }
  }
};

// Decode (step) mode: points p at slot `slot` as the chunk of its sequence's tokens (its position, accumulators
// and kv / gate rows; emitted rows from row `slot` when p has emitted rows). False when the slot is inert or
// continues a sequence whose first slot takes the chunk.
__device__ __forceinline__ bool select_decode_slot(CompressorParams& p, int64_t slot) {
  p.start_pos = p.positions[slot];
  if (p.start_pos < 0) return false;
  p.n = 1;
  if (p.firsts != nullptr) {  // the sequence's first slot takes its whole chunk; the others nothing
    if (p.firsts[slot] != slot) return false;
    while (slot + p.n < p.slots && p.firsts[slot + p.n] == slot) ++p.n;
  }
  p.acc = reinterpret_cast<float*>(p.accs[slot]);
  p.kv += slot * p.row_stride;
  p.gate += slot * p.row_stride;
  if (p.emitted != nullptr) p.emitted += slot * p.width;
  return true;
}

// The row of p.emitted window w's entry goes to: eager mode, w - w0 (the chunk's entries in order); step mode, the
// row of the token that closes w (its slot relative to the chunk's first; 0 for a one-token chunk).
__device__ __forceinline__ int64_t emit_row(const CompressorParams& p, int64_t w) {
  return p.positions != nullptr ? w * p.ratio + p.ratio - 1 - p.start_pos : w - p.start_pos / p.ratio;
}

// Pending accumulator k (0; 1: the overlapped series' first halves) of channel c.
__device__ __forceinline__ Acc pending_acc(const CompressorParams& p, int k, int64_t c) {
  const float* a = p.acc + 3 * k * p.width;
  return Acc{a[c], a[p.width + c], a[2 * p.width + c]};
}

// Folds channel ch of the chunk's tokens in [t0, t1) into a.
__device__ __forceinline__ void fold_tokens(const CompressorParams& p, Acc& a, int64_t t0, int64_t t1, int64_t ch) {
  const int64_t C = p.width * (p.overlap ? 2 : 1), r = p.ratio, s0 = p.start_pos, end = p.start_pos + p.n;
  for (int64_t t = max(t0, s0); t < min(t1, end); ++t)
    a.fold(p.gate[(t - s0) * p.row_stride + ch] + p.ape[(t % r) * C + ch], p.kv[(t - s0) * p.row_stride + ch]);
}

// Window w of the chunk (its first w0, its last wlast, w0 <= w <= wlast) for channel c < width, given the
// pending accumulators acc0 / acc1 read before any thread replaced them: the open window is folded (from the
// pending accumulators when w is the chunk's first or second window); when w is the last window the new
// pending accumulators are written. Returns the entry's value, with *complete saying whether w closes in the
// chunk (only then is there an entry).
__device__ __forceinline__ float fold_window(const CompressorParams& p, int64_t c, int64_t w, const Acc& acc0,
                                             const Acc& acc1, bool* complete) {
  const int64_t r = p.ratio, end = p.start_pos + p.n;
  const int64_t w0 = p.start_pos / r, wlast = (end - 1) / r;
  *complete = (w + 1) * r <= end;
  Acc open;
  if (!p.overlap) {
    if (w == w0) open = acc0;
    fold_tokens(p, open, w * r, (w + 1) * r, c);
  } else {
    if (w == w0) {
      open = acc0;
    } else {
      if (w == w0 + 1) open = acc1;
      fold_tokens(p, open, (w - 1) * r, w * r, c);  // the previous window's first halves
    }
    fold_tokens(p, open, w * r, (w + 1) * r, p.width + c);
  }
  const float value = open.v / open.s;
  if (w != wlast) return value;
  Acc next0 = *complete ? Acc{} : open, next1;
  if (p.overlap) {
    Acc firsts = w == w0 ? acc1 : Acc{};
    fold_tokens(p, firsts, w * r, (w + 1) * r, c);
    if (*complete) next0 = firsts;
    else next1 = firsts;
  }
  p.acc[c] = next0.m, p.acc[p.width + c] = next0.s, p.acc[2 * p.width + c] = next0.v;
  if (p.overlap) p.acc[3 * p.width + c] = next1.m, p.acc[4 * p.width + c] = next1.s, p.acc[5 * p.width + c] = next1.v;
  return value;
}

}  // namespace tern::cuda::dev
