// Linear layers on the GPU (host interface; compiled by the host compiler too, so no device code here).
//   y[t, r] = sum_i x[t, g(r) * in + i] * W[r, i],  g(r) = r / rows_per_group (0 for a plain linear)
// Tensor-core paths when the shape allows it: the streaming kernel (stream_tile.cuh) for FP8 / FP4 weights,
// the register kernel (mma_tile.cuh) for f32 / bf16 and the shapes the streaming one does not take; both
// split over K with a deterministic last-block reduction. An exact f32 CUDA-core path otherwise.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ops/weight_format.h"

namespace tern::cuda {

using ops::WeightFormat;

// A weight matrix in device memory, as the kernels see it.
struct DeviceMat {
  WeightFormat kind = WeightFormat::f32;
  const void* w = nullptr;
  const void* s = nullptr;  // scales (fp8: e8m0 or f32 per 128x128; mxfp4: e8m0 per 32; nvfp4: ue4m3 per 16)
  int64_t out = 0, in = 0;
  int64_t s_cols = 0;
  bool scale_f32 = false;
  float global_scale = 1.0f;  // nvfp4
};

struct LinearParams {
  DeviceMat w;
  const float* x = nullptr;
  int64_t x_stride = 0;        // floats between token rows of x
  int64_t rows_per_group = 0;  // == w.out for a plain linear
  int64_t T = 0;
  float* y = nullptr;          // [T, w.out]
  // Split-K workspace (tensor-core path): partial sums and per-tile arrival counters (kept at zero).
  float* partial = nullptr;
  int64_t partial_floats = 0;
  int* counters = nullptr;
  int64_t num_counters = 0;
  int num_sms = 132;
  // linear_x8: a split over K of at most 8 blocks adds its partial sums through the blocks' shared memory as one
  // thread-block cluster (CudaBackend's TERN_X8_CLUSTER), not through `partial` and the counters.
  bool cluster_split = false;
  // Streaming kernel: the K groups (a function of the weight alone, so results do not depend on the batch),
  // measured by the tuner (CudaBackend::tune_linears); 0: the built-in rule.
  int groups = 0;
};

// Columns one k-chunk of the tensor-core path covers for this format (its K must be a multiple).
int chunk_of(WeightFormat k);

// True when the tensor-core path takes this product (shape and alignment); otherwise launch_linear uses
// the exact CUDA-core kernel.
bool linear_mma_ok(const LinearParams& p);
// True when the streaming kernel (FP8 / FP4 weights, linear_stream_impl.cuh) takes this product.
bool linear_stream_ok(const LinearParams& p);
// The streaming kernel's K group counts worth measuring for this weight (the tuner's candidates; empty when
// the streaming kernel does not take it), and the count it uses for these params (p.groups or the rule).
std::vector<int> linear_group_candidates(const LinearParams& p);
int linear_groups_used(const LinearParams& p);
// Part of every tuning key of the streaming linear: bump it when a change to the kernel makes old
// measurements meaningless.
// v2: K groups shared with linear_bulk; v3 (session 12): 8 warps a block from 9 tokens (stream_m_tiles)
inline constexpr const char* kLinearStreamTuneVersion = "linear_stream.v3";
// The kernel variant of FP8-block and bf16 products (process-wide; benchmarks and tests compare them on the
// same shapes): 0 (default) = linear_bulk_kernel (cp.async.bulk warp rings) for bf16, linear_stream for FP8;
// 1 = the previous kernels (linear_stream for FP8, linear_mma for bf16); 2 = linear_bulk_kernel for both. FP8
// gives the same bits in every variant; bf16 does not (linear_mma's K order differs). Initialised from
// TERN_LINEAR_VARIANT; linear_path_name says which kernel runs.
int linear_variant();
void set_linear_variant(int variant);
// linear_stream's m-tiles a warp below 64 tokens: 0 = the rule (linear.cu, stream_m_tiles), 1 or 2 forced (tests
// and benchmarks; TERN_STREAM_MT sets the start value). The same bits either way.
void set_stream_m_tiles(int mt);
// True when the bulk-copy kernel can take this product (FP8 block or bf16, the streaming kernel's tiles), and
// when launch_linear will use it (that, and bf16 in variant 0 or any in variant 2).
bool linear_bulk_ok(const LinearParams& p);
bool linear_bulk_used(const LinearParams& p);
// Columns of x one token row of a product reads (every row group's, for a grouped linear).
int64_t linear_x_cols(const LinearParams& p);
// Floats of workspace launch_linear wants for this product in p.partial (0: none): the split-K partial sums,
// then (from 9 tokens) x converted once into the streaming kernels' window layout (stream_tile.cuh).
int64_t linear_partial_floats(const LinearParams& p);
void launch_linear(const LinearParams& p, cudaStream_t stream);
// The exact path whatever the shape (router gates and the indexer: their top-k must agree with the f32
// reference): f32 on CUDA cores, 8 tokens per weight pass; linear_exact_rows_kernel (a warp per row slice) for
// bf16 rows, linear_exact_lanes_kernel (a thread per row, K slices over blocks: partial sums in p.partial,
// linear_exact_partial_floats of them) for FP8 rows, linear_simple_kernel otherwise.
int64_t linear_exact_partial_floats(const LinearParams& p);
void launch_linear_exact(const LinearParams& p, cudaStream_t stream);
// Where the exact products run (TERN_EXACT_PATH): linear_exact_tc.cu's tensor-core kernel (x as three bf16
// terms, weights bf16 numbers, f32 accumulation: f32 accuracy; weights in registers, the K slices of a row tile
// summed through a thread-block cluster) or the CUDA-core kernels above. auto (the default): FP8 weights (the
// indexer's wq_b) on tensor cores, bf16 ones (gates, weights_proj, the indexer's compressor) on CUDA cores, the
// faster for each (session 11, call 9: wq_b 9.4 / 12.7 / 39.6 us at T = 1 / 16 / 64 against 10.8 / 36.5 / 88 on
// CUDA cores; the gate 2.8 / 8.7 / 25.9 on CUDA cores against 5.0 / 7.8 / 23.0); tc: every exact weight the kernel
// takes; cuda-cores: none. Per weight format, never per T, so a token's bits do not depend on its batch. A bad
// value throws.
enum class ExactPath : int { cuda_cores, fp8_on_tensor_cores, tensor_cores };
ExactPath exact_path();
void set_exact_path(ExactPath path);  // tests and benchmarks
bool exact_on_tensor_cores(WeightFormat kind);
// True when linear_exact_tc_kernel can take this product; otherwise `why` (when given) says what it lacks.
bool linear_exact_tc_ok(const LinearParams& p, std::string* why = nullptr);
void launch_linear_exact_tc(const LinearParams& p, cudaStream_t stream);  // no workspace
std::string linear_exact_tc_name(const LinearParams& p);  // "" when it does not take the product
// Name of the kernel launch_linear_exact runs for these params (the exact path's switch as it is now).
std::string linear_exact_path_name(const LinearParams& p);

// out f32 [w.out, w.in] = W exactly.
void launch_dequantize(const DeviceMat& w, float* out, cudaStream_t stream);

// Name of the kernel path launch_linear takes (startup report and benchmarks).
std::string linear_path_name(const LinearParams& p);

}  // namespace tern::cuda
