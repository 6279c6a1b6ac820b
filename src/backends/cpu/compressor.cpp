// The online compressor: per channel, fold one token at a time into (max, sum, weighted sum).
#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "core/thread_pool.h"

namespace tern::cpu {
namespace {

// One channel's softmax accumulator; s == 0 means empty.
struct Acc {
  float* m;
  float* s;
  float* v;

  void fold(float gate, float kv) const {
    if (*s == 0.0f) {
      *m = gate, *s = 1.0f, *v = kv;
    } else if (gate > *m) {
      const float shrink = std::exp(*m - gate);
      *s = *s * shrink + 1.0f;
      *v = *v * shrink + kv;
      *m = gate;
    } else {
      const float e = std::exp(gate - *m);
      *s += e;
      *v += kv * e;
    }
  }
  float value() const { return *v / *s; }
  void clear() const { *m = 0.0f, *s = 0.0f, *v = 0.0f; }
  void take(const Acc& o) const { *m = *o.m, *s = *o.s, *v = *o.v; }
};

// acc is [n_acc, 3, width]: accumulator `which`, channel c.
Acc acc_at(float* acc, int64_t width, int which, int64_t c) {
  float* base = acc + which * 3 * width;
  return {base + c, base + width + c, base + 2 * width + c};
}

}  // namespace

int64_t CpuBackend::compressor_update(const ops::CompressorArgs& a) {
  require_f32("compressor_update", {&a.acc, &a.kv, &a.gate, &a.emitted});
  const int64_t width = a.acc.dim(2), channels = a.kv.dim(1), n = a.kv.dim(0);
  const int64_t stride = a.kv.row_stride();  // gate's too (ops::compressor_update checks)
  const float* kv = a.kv.data_as<const float>();
  const float* gate = a.gate.data_as<const float>();
  const float* ape = a.ape.data_as<const float>();
  float* acc = a.acc.data_as<float>();
  float* emitted = a.emitted.data_as<float>();
  parallel_for(
      0, width,
      [&](int64_t lo, int64_t hi) {
        for (int64_t c = lo; c < hi; ++c) {
          const Acc open = acc_at(acc, width, 0, c);
          int64_t e = 0;
          for (int64_t i = 0; i < n; ++i) {
            const int64_t pos = a.start_pos + i, slot = pos % a.ratio;
            // CSA: channel c + width (Cb) feeds this window's entry, channel c (Ca) the next one.
            const int64_t own = a.overlap ? width + c : c;
            open.fold(gate[i * stride + own] + ape[slot * channels + own], kv[i * stride + own]);
            if (a.overlap)
              acc_at(acc, width, 1, c).fold(gate[i * stride + c] + ape[slot * channels + c], kv[i * stride + c]);
            if (slot != a.ratio - 1) continue;
            emitted[e++ * width + c] = open.value();
            if (a.overlap) {
              const Acc next = acc_at(acc, width, 1, c);
              open.take(next);
              next.clear();
            } else {
              open.clear();
            }
          }
        }
      },
      16);
  return ops::compressor_emit_count(a.start_pos, n, a.ratio);
}

}  // namespace tern::cpu
