#include "ops/kv_row.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "ops/act_quant.h"

namespace tern::ops {

std::string_view kv_format_name(KvFormat f) {
  switch (f) {
    case KvFormat::f32:
      return "f32";
    case KvFormat::fp8_ds:
      return "fp8_ds";
  }
  return "?";
}

void KvRowFormat::check() const {
  TERN_CHECK(head_dim > 0 && rope_dim >= 0 && rope_dim <= head_dim && rope_dim % 2 == 0,
             "kv row format: bad head_dim ", head_dim, " / rope_dim ", rope_dim);
  if (format == KvFormat::fp8_ds)
    TERN_CHECK(nope_dim() % 64 == 0, "kv row format fp8_ds: the no-RoPE dims (", nope_dim(),
               ") must be a multiple of 64");
}

int64_t KvRowFormat::row_bytes() const {
  switch (format) {
    case KvFormat::f32:
      return head_dim * 4;
    case KvFormat::fp8_ds:
      return nope_dim() + rope_dim * 2 + (scale_count() + 7) / 8 * 8;
  }
  return 0;
}

void encode_kv_row(const float* x, const KvRowFormat& f, std::byte* row) {
  if (f.format == KvFormat::f32) {
    std::memcpy(row, x, f.head_dim * sizeof(float));
    return;
  }
  const int64_t nope = f.nope_dim();
  auto* fp8 = reinterpret_cast<uint8_t*>(row);
  std::byte* rope = row + nope;
  auto* scales = reinterpret_cast<uint8_t*>(row + nope + f.rope_dim * 2);
  std::memset(scales, 0, (f.scale_count() + 7) / 8 * 8);
  for (int64_t b = 0; b < f.scale_count(); ++b) {
    float amax = 0.0f;
    for (int64_t i = 0; i < 64; ++i) amax = std::max(amax, std::fabs(x[b * 64 + i]));
    const float scale = std::ldexp(1.0f, fp8_scale_exponent(amax));  // the reference's rule (act_quant.h)
    scales[b] = f32_to_e8m0(scale);
    for (int64_t i = 0; i < 64; ++i) fp8[b * 64 + i] = f32_to_e4m3(x[b * 64 + i] / scale);
  }
  for (int64_t i = 0; i < f.rope_dim; ++i) {
    const uint16_t bits = f32_to_bf16(x[nope + i]);
    std::memcpy(rope + 2 * i, &bits, 2);
  }
}

void decode_kv_row(const std::byte* row, const KvRowFormat& f, float* x) {
  if (f.format == KvFormat::f32) {
    std::memcpy(x, row, f.head_dim * sizeof(float));
    return;
  }
  const int64_t nope = f.nope_dim();
  const auto* fp8 = reinterpret_cast<const uint8_t*>(row);
  const std::byte* rope = row + nope;
  const auto* scales = reinterpret_cast<const uint8_t*>(row + nope + f.rope_dim * 2);
  for (int64_t b = 0; b < f.scale_count(); ++b) {
    const float scale = e8m0_to_f32(scales[b]);
    for (int64_t i = 0; i < 64; ++i) x[b * 64 + i] = e4m3_to_f32(fp8[b * 64 + i]) * scale;
  }
  for (int64_t i = 0; i < f.rope_dim; ++i) {
    uint16_t bits;
    std::memcpy(&bits, rope + 2 * i, 2);
    x[nope + i] = bf16_to_f32(bits);
  }
}

}  // namespace tern::ops
