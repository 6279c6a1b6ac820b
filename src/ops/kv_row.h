// How one key/value row (K = V in V4) is stored in the window ring and among the compressed rows.
//
//   f32     head_dim fp32 values (the exact mode).
//   fp8_ds  DeepSeek's FP8 row: the nope = head_dim - rope_dim dims in blocks of 64 as e4m3 with a
//           power-of-two scale 2^ceil(log2(max(amax, 1e-4) / 448)) per block, the rope dims as bf16:
//             [nope x e4m3 | rope_dim x bf16 | nope/64 x e8m0 scale | zero pad to a multiple of 8 bytes
//             of scales]  -- 448 + 128 + 7 + 1 = 584 bytes for V4-Flash.
//           Decoding gives exactly the reference's fake-quantised row (e4m3 * scale, bf16 -> f32).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/tensor.h"

namespace tern::ops {

class Context;  // ops/context.h: each op runs in one

enum class KvFormat : uint8_t { f32, fp8_ds };

std::string_view kv_format_name(KvFormat f);

struct KvRowFormat {
  KvFormat format = KvFormat::f32;
  int64_t head_dim = 0;
  int64_t rope_dim = 0;

  int64_t nope_dim() const { return head_dim - rope_dim; }
  int64_t scale_count() const { return nope_dim() / 64; }
  int64_t row_bytes() const;
  // Throws unless the dims fit the format (fp8_ds: nope_dim a multiple of 64).
  void check() const;
};

// rows u8 [n, row_bytes] <- x f32 [n, head_dim]
void kv_pack(const Context& ctx, const TensorView& x, const KvRowFormat& f, const TensorView& rows);
// x f32 [n, head_dim] <- rows u8 [n, row_bytes]
void kv_unpack(const Context& ctx, const TensorView& rows, const KvRowFormat& f, const TensorView& x);

// Host codec of one row, shared by the CPU backend and the tests.
void encode_kv_row(const float* x, const KvRowFormat& f, std::byte* row);
void decode_kv_row(const std::byte* row, const KvRowFormat& f, float* x);

}  // namespace tern::ops
