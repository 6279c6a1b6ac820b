// synth_fill on the host: the same values and quantization rules as the CUDA kernels (kernels/synth.cu),
// element for element (ops/synth_values.h).
#include <algorithm>
#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "ops/synth_values.h"

namespace tern::cpu {

namespace {

void values(const ops::SynthFillArgs& a) {
  const int64_t n = a.out.numel();
  const bool bf16 = a.out.dtype() == DType::bf16;
  parallel_for(0, n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const auto u = static_cast<uint64_t>(i);
      const float v = a.kind == ops::SynthKind::normal ? synth::normal_value(a.seed, u, a.a, a.b)
                                                       : synth::uniform_value(a.seed, u, a.a, a.b);
      if (bf16) a.out.data_as<uint16_t>()[i] = f32_to_bf16(v);
      else a.out.data_as<float>()[i] = v;
    }
  }, 4096);
}

void fp8_block(const ops::SynthFillArgs& a) {
  const int64_t R = a.rows, C = a.cols, bo = (R + 127) / 128, bi = (C + 127) / 128;
  auto* q = a.out.data_as<uint8_t>();
  auto* s = a.scale.data_as<uint8_t>();
  parallel_for(0, bo * bi, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b / bi * 128, c0 = b % bi * 128, r1 = std::min(R, r0 + 128), c1 = std::min(C, c0 + 128);
      float amax = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c)
          amax = std::max(amax, std::fabs(synth::normal_value(a.seed, static_cast<uint64_t>(r * C + c), 0.0f, a.b)));
      const uint8_t bits = e8m0_ceil_pow2(std::max(amax, 1e-30f) / 448.0f);
      const float scale = e8m0_to_f32(bits);
      s[b] = bits;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c)
          q[r * C + c] = f32_to_e4m3(synth::normal_value(a.seed, static_cast<uint64_t>(r * C + c), 0.0f, a.b) / scale);
    }
  }, 1);
}

void fp4(const ops::SynthFillArgs& a) {
  const bool nv = a.kind == ops::SynthKind::nvfp4;
  const int64_t block = nv ? 16 : 32, C = a.cols, blocks = a.rows * (C / block);
  auto* q = a.out.data_as<uint8_t>();
  auto* s = a.scale.data_as<uint8_t>();
  parallel_for(0, blocks, [&](int64_t b0, int64_t b1) {
    float v[32];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t first = b * block;  // element index: blocks never straddle rows
      float amax = 0;
      for (int64_t j = 0; j < block; ++j) {
        v[j] = synth::normal_value(a.seed, static_cast<uint64_t>(first + j), 0.0f, a.b);
        amax = std::max(amax, std::fabs(v[j]));
      }
      uint8_t bits;
      float scale;
      if (nv) {
        bits = f32_to_ue4m3(amax / (6.0f * a.global_scale));
        if (bits == 0) bits = 1;  // smallest positive scale for an all-tiny block
        scale = ue4m3_to_f32(bits) * a.global_scale;
      } else {
        bits = e8m0_ceil_pow2(std::max(amax, 1e-30f) / 6.0f);
        scale = e8m0_to_f32(bits);
      }
      s[b] = bits;
      for (int64_t j = 0; j < block; j += 2)
        q[(first + j) / 2] =
            static_cast<uint8_t>((f32_to_e2m1(v[j] / scale) & 15) | (f32_to_e2m1(v[j + 1] / scale) << 4));
    }
  }, 1024);
}

void distinct_rows(const ops::SynthFillArgs& a) {
  const int64_t rows = a.out.dim(0), k = a.out.dim(1);
  auto* p = a.out.data_as<int64_t>();
  parallel_for(0, rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) synth::distinct_row(a.seed, r, static_cast<int>(k), a.choices, p + r * k);
  }, 1024);
}

}  // namespace

void CpuBackend::synth_fill(const ops::SynthFillArgs& a) {
  switch (a.kind) {
    case ops::SynthKind::normal:
    case ops::SynthKind::uniform: return values(a);
    case ops::SynthKind::fp8_block: return fp8_block(a);
    case ops::SynthKind::mxfp4:
    case ops::SynthKind::nvfp4: return fp4(a);
    case ops::SynthKind::distinct_rows: return distinct_rows(a);
  }
}

}  // namespace tern::cpu
