// DeepSeek's activation quantisation, as the official reference's act_quant runs it before every FP8
// product (deepseek-v4.md section 3, "Reference activations"): each run of kActBlock = 128 values of a row
// is divided by a power-of-two scale s = 2^ceil(log2(max(amax, 1e-4) / 448)) and rounded to e4m3 (nearest
// even; |x / s| <= 448, so nothing saturates). The product then sees e4m3(x / s) * s, a number with 4
// significant bits: exact in bf16 and f32, so a kernel may carry it in any of them.
//
// `--activations fp8` (ops::Weight::act_fp8: the FP8 and FP4 products, routed experts included) runs this way on
// every backend; `native` keeps each backend's own activations (CPU f32, CUDA bf16 on the tensor cores); `auto`
// (app/device.h) picks fp8 on a GPU.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/tensor.h"

namespace tern::ops {

inline constexpr int64_t kActBlock = 128;

// Rows already quantised for an FP8 product (act_quant_fp8's bytes and scales), so that a producer can hand its
// output to the product without storing it in f32 first: values u8 [P, cols] (contiguous rows), scales f32
// [cols / kActBlock, P] token-major (scales[b, t] is block b of row t; its rows `scales.row_stride()` apart), for
// `rows` <= P rows. A consumer may compute on rows past `rows` (whatever they hold: their results are dropped), so
// a whole step's buffers have P = padded_rows(rows); a producer writes rows 0 .. rows - 1 of what it is given, and
// slice() gives a producer its rows of a step (the prefill chunk's heads: sparse_attention, per sequence).
struct Fp8Rows {
  TensorView values, scales;
  int64_t rows = 0;
  // FP8 tensor-core libraries take row counts in multiples of 4 (cuBLASLt's 1x128 scales: 16-byte aligned rows).
  static constexpr int64_t kRowAlign = 4;
  static int64_t padded_rows(int64_t rows) { return (rows + kRowAlign - 1) / kRowAlign * kRowAlign; }
  int64_t cols() const { return values.dim(1); }
  Fp8Rows slice(int64_t begin, int64_t end) const {
    return {values.rows(begin, end), scales.cols(begin, end), end - begin};
  }
};

// Which activations the products see.
enum class Activations : uint8_t {
  native,  // each backend's own (CPU f32, CUDA bf16 tensor-core operands)
  fp8,     // the official reference's: 1x128 e4m3 with power-of-two scales
  f32,     // the exact mode (issue #17): every product in f32 on every backend (each weight `exact`: on the GPU the
           // exact CUDA-core and split tensor-core kernels; slow), so a GPU run differs from the CPU's only by
           // summation order and tells a rounding from a kernel bug
};
std::string_view activations_name(Activations a);
// "native", "fp8" or "f32"; throws tern::Error naming the choices otherwise.
Activations parse_activations(std::string_view s);

// The exponent k of the scale 2^k for a block whose largest |value| is amax (the reference's rule, evaluated
// as it does, in double). Shared with the FP8 KV rows (kv_row.h), whose blocks are 64 values.
int fp8_scale_exponent(float amax);

// x [n] (n a multiple of kActBlock) -> q [n] e4m3 bytes, scales [n / kActBlock] f32.
void act_quant_fp8(const float* x, int64_t n, uint8_t* q, float* scales);
// x [n] -> out [n] = e4m3(x / s) * s, blockwise (out may alias x).
void act_fake_quant_fp8(const float* x, int64_t n, float* out);

}  // namespace tern::ops
