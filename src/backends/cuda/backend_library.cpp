// CudaBackend: the library paths of linear, grouped_linear and moe_experts for many tokens (prefill chunks):
// operands prepared by gemm_prep kernels, products by cuBLAS (library_gemm.h, docs/cuda-backend.md
// "Library GEMMs").
#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <vector>

#include "backends/cuda/backend_impl.h"
#include "backends/cuda/kernels/act_quant.cuh"
#include "backends/cuda/kernels/gemm_prep.cuh"
#include "backends/cuda/kernels/indexer.cuh"
#include "backends/cuda/kernels/mhc.cuh"
#include "backends/cuda/kernels/moe_grouped.cuh"
#include "backends/cuda/kernels/moe_grouped_e4m3.cuh"
#include "backends/cuda/kernels/moe_grouped_wgmma.cuh"
#include "core/env.h"
#include "core/log.h"

namespace tern::cuda {

namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Carves 256-byte aligned pieces out of one scratch allocation.
struct Carve {
  size_t used = 0;
  size_t take(size_t bytes) {
    const size_t at = used;
    used += (bytes + 255) / 256 * 256;
    return at;
  }
};

// TERN_FP8_LIBRARY=0 sends prefill chunks of --activations fp8 to the dequantised x on cuBLAS bf16 instead (A/B).
bool fp8_library_enabled() {
  static const bool on = env_flag("TERN_FP8_LIBRARY", true);
  return on;
}

}  // namespace

namespace {

// Whether cuBLASLt's block-scaled FP8 product takes this weight and these operands.
bool fp8_library_takes(CudaBackend::Impl& impl, const DeviceMat& m, int64_t groups, const void* x, const TensorView& y) {
  if (!fp8_library_enabled()) return false;
  const int64_t out_g = m.out / groups;
  if (m.kind != WeightFormat::fp8_block || m.in % 128 != 0 || out_g % 128 != 0 || m.s_cols != m.in / 128) return false;
  return aligned16(x) && aligned16(m.w) && aligned16(y.data()) && impl.lib().fp8_block_supported();
}

// y = x W^T for x quantised: xq [Tp, cols] e4m3, sx [cols / 128, Tp] token-major, Tp = T rounded up to the library's
// token multiple (the rows past T: any bytes, their outputs dropped).
void fp8_library_product(CudaBackend::Impl& impl, const DeviceMat& m, int64_t T, int64_t groups, const uint8_t* xq,
                         const float* sx, const TensorView& y) {
  cudaStream_t s = impl.stream;
  const int64_t cols = groups * m.in, out_g = m.out / groups;
  const int64_t Tp = align_up(T, LibraryGemm::kFp8TokenMultiple);
  // The weight's scales as f32 in cuBLASLt's padded layout, made per call (out/128 x in/128 values: a few us against
  // a product of >= 512 tokens). A cache keyed by the weight's address went stale when a freed weight's memory
  // was reused (session 13: wrong outputs in tests that upload weights one after another).
  const int64_t srows = m.out / 128, sld = LibraryGemm::fp8_weight_scale_ld(m.in);
  Tensor sw = impl.tensor(DType::f32, {srows, sld});
  launch_block_scales_f32(m.s, m.scale_f32, srows, m.in / 128, sld, sw.data<float>(), s);
  check_launch("block_scales_f32");
  Tensor ypad;
  float* yp = y.data_as<float>();
  if (Tp != T) {
    ypad = impl.tensor(DType::f32, {Tp, m.out});
    yp = ypad.data<float>();
  }
  impl.lib().fp8_block(s, Tp, out_g, m.in, xq, cols, sx, static_cast<const uint8_t*>(m.w), sw.data<float>(), yp,
                       m.out, static_cast<int>(groups));
  if (Tp != T)
    TERN_CUDA(cudaMemcpyAsync(y.data(), yp, static_cast<size_t>(T * m.out) * sizeof(float), cudaMemcpyDeviceToDevice, s));
}

}  // namespace

bool run_library_linear_fp8(CudaBackend::Impl& impl, const TensorView& x, const ops::Weight& w, int64_t groups,
                            const TensorView& y) {
  const DeviceMat m = device_mat(w);
  if (!fp8_library_takes(impl, m, groups, x.data(), y)) return false;
  const int64_t T = x.dim(0), cols = groups * m.in;
  cudaStream_t s = impl.stream;
  // cuBLASLt takes a multiple of 4 tokens: the padding rows are zeros (scale 0) and their outputs are dropped.
  const int64_t Tp = align_up(T, LibraryGemm::kFp8TokenMultiple);
  Tensor xq = impl.tensor(DType::u8, {Tp, cols});
  Tensor sx = impl.tensor(DType::f32, {cols / 128, Tp});
  if (Tp != T) {
    TERN_CUDA(cudaMemsetAsync(xq.data<uint8_t>() + T * cols, 0, static_cast<size_t>((Tp - T) * cols), s));
    TERN_CUDA(cudaMemsetAsync(sx.data<float>(), 0, sx.nbytes(), s));
  }
  launch_act_quant(ActRows{x.data_as<const float>(), T, cols, cols}, xq.data<uint8_t>(), sx.data<float>(), s, Tp);
  check_launch("act_quant");
  fp8_library_product(impl, m, T, groups, xq.data<uint8_t>(), sx.data<float>(), y);
  return true;
}

bool run_library_linear_fp8_rows(CudaBackend::Impl& impl, const ops::Fp8Rows& x, const ops::Weight& w, int64_t groups,
                                 const TensorView& y) {
  const DeviceMat m = device_mat(w);
  const int64_t Tp = align_up(x.rows, LibraryGemm::kFp8TokenMultiple);
  static_assert(ops::Fp8Rows::kRowAlign % LibraryGemm::kFp8TokenMultiple == 0, "Fp8Rows::padded_rows pads for cuBLASLt");
  if (x.values.dim(0) < Tp || x.scales.dim(1) < Tp || x.scales.row_stride() != Tp) return false;
  if (!fp8_library_takes(impl, m, groups, x.values.data(), y) || !aligned16(x.scales.data())) return false;
  fp8_library_product(impl, m, x.rows, groups, x.values.data_as<const uint8_t>(), x.scales.data_as<const float>(), y);
  return true;
}

bool run_library_linear(CudaBackend::Impl& impl, const TensorView& x, const ops::Weight& w, int64_t groups,
                        const TensorView& y) {
  const int64_t T = x.dim(0);
  const DeviceMat m = device_mat(w);
  // bf16 weights that are not exact from the dense threshold (cuBLAS reads them as they are); FP8 ones of the native
  // mode would be expanded to bf16 every call, and exact ones split x in three: both from the library threshold.
  if (!(!w.exact && m.kind == WeightFormat::bf16 ? impl.dense_library_for(T) : impl.library_for(T))) return false;
  if (!expand_ok(m) || m.out % groups != 0 || !aligned16(x.data()) || (groups * m.in) % 8 != 0) return false;
  const int64_t rows = m.out / groups, in = m.in, ldx = groups * in;
  GemmBatch b;
  if (groups > 1) b = GemmBatch{static_cast<int>(groups), in, rows * in, rows};
  cudaStream_t s = impl.stream;
  float* yp = y.data_as<float>();
  // Exact weights (the top-k choices downstream must agree with the reference) are products at f32 accuracy.
  // Narrow products (weights_proj, 64 rows: 169 us split against 108 us in f32 at 8 192 tokens) stay on cuBLAS
  // f32: three bf16 products of 64 columns do not fill the card.
  const bool bf16_numbers = m.kind == WeightFormat::bf16 || (m.kind == WeightFormat::fp8_block && !m.scale_f32);
  if (w.exact && (!bf16_numbers || rows < 128)) {  // f32 throughout (f32 scales, FP4 global scales: not bf16 numbers)
    const float* wf = static_cast<const float*>(m.w);
    if (m.kind != WeightFormat::f32) {
      float* expanded = static_cast<float*>(impl.scratch(static_cast<size_t>(m.out * in) * 4));
      launch_expand_f32(m, expanded, s);
      check_launch("expand_f32");
      wf = expanded;
    }
    impl.lib().f32(s, T, rows, in, x.data_as<const float>(), ldx, wf, in, yp, m.out, b);
    return true;
  }
  if (w.exact) {
    // bf16 and FP8 weights are bf16 numbers (e4m3 times its e8m0 block scale, exactly), and x is three bf16
    // planes whose sum is x to f32's 24 bits: y = W x3 + W x2 + W x1 (smallest first), three bf16 products with
    // f32 accumulation, each term w * x_i exact in f32. f32 accuracy at the tensor cores' rate: cuBLAS f32
    // (no TF32) ran these at 50 TFLOP/s, 2.8 ms an indexer wq_b at 8 192 tokens.
    Carve c;
    const size_t xs_at = c.take(static_cast<size_t>(3 * T * ldx) * 2);
    const size_t wb_at = m.kind == WeightFormat::bf16 ? 0 : c.take(static_cast<size_t>(m.out * in) * 2);
    char* ws = static_cast<char*>(impl.scratch(c.used));
    auto* xs = reinterpret_cast<uint16_t*>(ws + xs_at);
    launch_split_bf16x3(x.data_as<const float>(), T, ldx, ldx, xs, s);
    check_launch("split_bf16x3");
    const void* wb = m.w;
    if (m.kind != WeightFormat::bf16) {
      launch_expand_bf16(m, reinterpret_cast<uint16_t*>(ws + wb_at), s);
      check_launch("expand_bf16");
      wb = ws + wb_at;
    }
    for (int part = 2; part >= 0; --part)
      impl.lib().bf16(s, T, rows, in, xs + static_cast<size_t>(part) * T * ldx, ldx, wb, in, yp, m.out, 1.0f, b,
                      part == 2 ? 0.0f : 1.0f);
    return true;
  }
  Carve c;
  const size_t xb_at = c.take(static_cast<size_t>(T * ldx) * 2);
  const size_t wb_at = m.kind == WeightFormat::bf16 ? 0 : c.take(static_cast<size_t>(m.out * in) * 2);
  char* ws = static_cast<char*>(impl.scratch(c.used));
  auto* xb = reinterpret_cast<uint16_t*>(ws + xb_at);
  launch_round_bf16(x.data_as<const float>(), T, ldx, ldx, xb, s);
  check_launch("round_bf16");
  const void* wb = m.w;
  if (m.kind != WeightFormat::bf16) {
    launch_expand_bf16(m, reinterpret_cast<uint16_t*>(ws + wb_at), s);
    check_launch("expand_bf16");
    wb = ws + wb_at;
  }
  const float alpha = m.kind == WeightFormat::nvfp4 ? m.global_scale : 1.0f;
  impl.lib().bf16(s, T, rows, in, xb, ldx, wb, in, yp, m.out, alpha, b);
  return true;
}

// mHC's mixing logits (fn [mix, hc D] times each token's flattened streams) are a skinny f32 product: at
// 8 192 tokens hc_mix_kernel took 3 ms a call (12% of the prefill), cuBLAS f32 a fraction of that.
bool library_hc_for(const CudaBackend::Impl& impl, const HcParams& p) {
  return impl.library_for(p.T) && aligned16(p.streams);
}

float* library_hc_partial(CudaBackend::Impl& impl, const HcParams& p, bool head) {
  const int64_t mix = head ? p.hc : (2 + p.hc) * p.hc;
  return static_cast<float*>(impl.scratch(static_cast<size_t>(p.T * (mix + 1)) * 4));
}

bool run_library_hc(CudaBackend::Impl& impl, HcParams& p, bool head, bool squares_done) {
  if (!library_hc_for(impl, p)) return false;
  const int64_t mix = head ? p.hc : (2 + p.hc) * p.hc, N = p.hc * p.D;
  float* partial = library_hc_partial(impl, p, head);
  impl.lib().f32(impl.stream, p.T, mix, N, p.streams, N, p.fn, N, partial, mix + 1);
  if (!squares_done) launch_hc_squares(p.streams, p.T, N, mix + 1, partial + mix, impl.stream);
  p.partial = partial;
  launch_hc_finish(p, head, 1, impl.stream);
  check_launch(head ? "hc_head" : "hc_pre");
  return true;
}

// The lightning indexer's scores for a prefill chunk: q . k for every (query, head, key) is one f32 library
// product per chunk of queries (indexer_scores_kernel took 16 ms a CSA layer at 8 192 queries on CUDA cores),
// then indexer_reduce_kernel applies ReLU, the scales and the head weights as that kernel does. The queries'
// positions are read back (one synchronisation) so that a chunk multiplies only the keys it can see.
// TERN_INDEXER_PREFILL=mma / mma-fp16x3 (indexer_prefill()) take the fused tensor-core kernel instead (indexer_mma.cu: no
// [n x heads, keys] products in memory, no synchronisation).
bool run_library_indexer(CudaBackend::Impl& impl, const IndexerParams& p, float* scores) {
  if (!impl.library_for(p.n) || p.key_tables != nullptr || p.num_keys == 0 || p.dim % 4 != 0 || !aligned16(p.q) ||
      p.heads > kMaxIndexerHeads)
    return false;
  if (const IndexerPrefill mode = indexer_prefill(); mode != IndexerPrefill::sgemm && indexer_mma_supported(p)) {
    launch_indexer_scores_mma(p, scores, impl.num_sms, impl.stream,
                              mode == IndexerPrefill::mma_fp16x3 ? IndexerMmaSplit::fp16x3 : IndexerMmaSplit::bf16x6);
    check_launch("indexer_scores_mma");
    return true;
  }
  cudaStream_t s = impl.stream;
  auto* pos = static_cast<int64_t*>(impl.pinned_scratch(static_cast<size_t>(p.n) * 8));
  TERN_CUDA(cudaMemcpyAsync(pos, p.positions, static_cast<size_t>(p.n) * 8, cudaMemcpyDeviceToHost, s));
  TERN_CUDA(cudaStreamSynchronize(s));
  // Chunks of queries whose products S [chunk * heads, keys] stay under 256 MiB.
  const int64_t chunk = std::max<int64_t>(1, (int64_t{256} << 20) / (p.heads * p.num_keys * 4));
  Carve c;
  const size_t keys_at = c.take(static_cast<size_t>(p.num_keys * p.dim) * 4),
               s_at = c.take(static_cast<size_t>(std::min(chunk, p.n) * p.heads * p.num_keys) * 4);
  char* lw = static_cast<char*>(impl.library_scratch(c.used));
  auto* keys = reinterpret_cast<float*>(lw + keys_at);
  auto* S = reinterpret_cast<float*>(lw + s_at);
  launch_indexer_gather_keys(p, keys, s);
  check_launch("indexer_gather_keys");
  for (int64_t i0 = 0; i0 < p.n; i0 += chunk) {
    const int64_t count = std::min(chunk, p.n - i0);
    int64_t cols = 0;
    for (int64_t i = i0; i < i0 + count; ++i) cols = std::max<int64_t>(cols, (pos[i] + 1) / p.ratio);
    cols = std::min(cols, p.num_keys);
    if (cols > 0) impl.lib().f32(s, count * p.heads, cols, p.dim, p.q + i0 * p.heads * p.dim, p.dim, keys, p.dim, S, cols);
    launch_indexer_reduce(p, S, i0, count, cols, scores, s);
    check_launch("indexer_reduce");
  }
  return true;
}

namespace {

// Expanded experts kept at once: bf16 w1, w3, w2 of one V4-Flash expert are 50 MB.
constexpr size_t kMoeExpandBudget = size_t{3} << 29;  // 1.5 GiB

struct Job {
  int expert = 0, first = 0, count = 0;
};

}  // namespace

// The plan stays on the device: the grouped kernels' grids are bounded from T, k and E, and each block finds its
// (job, m-tile, n-tile) in the tile table, so this path never synchronises and may be captured.
bool grouped_moe_takes(const CudaBackend::Impl& impl, const MoeParams& p) {
  return impl.moe_grouped_for(p.T) && !impl.moe_library_forced(p.T) && moe_grouped_supported(p) && aligned16(p.x);
}

bool run_grouped_moe(CudaBackend::Impl& impl, const MoeParams& p) {
  if (!grouped_moe_takes(impl, p)) return false;
  const int64_t P = p.T * p.k, max_jobs = std::min<int64_t>(P, p.E) + 2;
  TERN_CHECK(P <= INT32_MAX / 2, "cuda moe_experts: ", P, " pairs");
  cudaStream_t s = impl.stream;
  Carve c;
  const size_t sorted_at = c.take(P * 4), pos_at = c.take(P * 4), jobs_at = c.take(max_jobs * 3 * 4),
               num_at = c.take(4), counts_at = c.take(moe_sort_count_ints(P, p.E) * 4),
               tiles_at = c.take((p.E + 1) * 4), xs_at = c.take(moe_grouped_rows(p) * p.D * 2),
               h_at = c.take(moe_grouped_rows(p) * p.inter * 2),
               y_at = c.take(P * p.D * 4);
  char* ws = static_cast<char*>(impl.scratch(c.used));
  MoeGroupedBuffers b;
  b.sorted = reinterpret_cast<const int*>(ws + sorted_at);
  b.jobs = reinterpret_cast<const int*>(ws + jobs_at);
  b.num_jobs = reinterpret_cast<const int*>(ws + num_at);
  b.tile_first = reinterpret_cast<int*>(ws + tiles_at);
  b.xs = reinterpret_cast<uint16_t*>(ws + xs_at);
  b.h = reinterpret_cast<uint16_t*>(ws + h_at);
  b.y = reinterpret_cast<float*>(ws + y_at);
  auto* pos = reinterpret_cast<int*>(ws + pos_at);
  launch_moe_sort(p, reinterpret_cast<int*>(ws + counts_at), reinterpret_cast<int*>(ws + sorted_at), pos,
                  reinterpret_cast<int*>(ws + jobs_at), reinterpret_cast<int*>(ws + num_at), s);
  check_launch("moe_sort");
  // The wgmma kernels from 48 mean pairs an expert, the mma.sync ones below (TERN_MOE_GROUPED forces either);
  // TERN_MOE_GROUPED=e4m3 the e4m3 ones where the experts allow them (else the bf16 wgmma ones, said once).
  const bool e4m3 = std::string_view(moe_grouped_kernel_forced()) == "e4m3";
  const char* refusal = e4m3 ? moe_grouped_e4m3_refusal(p) : nullptr;
  if (e4m3 && refusal == nullptr) {
    launch_moe_grouped_e4m3(p, b, s);
    ++impl.moe_e4m3_calls;
  } else {
    if (e4m3) {
      static std::once_flag said;
      std::call_once(said, [&] {
        log::warn("TERN_MOE_GROUPED=e4m3: some routed experts take the bf16 wgmma kernel instead (",
                  ops::weight_format_name(p.kind), " experts: ", refusal, ")");
      });
    }
    if (moe_grouped_wgmma_selected(p)) launch_moe_grouped_wgmma(p, b, s);
    else launch_moe_grouped(p, b, s);
  }
  check_launch("moe_grouped");
  launch_moe_combine(p, b.y, pos, s);
  check_launch("moe_combine");
  return true;
}

// The plan (pairs grouped by expert, one job per expert) is read back to the host: the per-expert products
// need their token counts there. So this path synchronises once per call and never runs inside a capture.
bool library_moe_takes(const CudaBackend::Impl& impl, const MoeParams& p) {
  // experts_aligned: every matrix 16-byte aligned (the expert table checks it once per expert list).
  if (!impl.library_for(p.T) || p.D % 32 != 0 || p.inter % 32 != 0 || !aligned16(p.x) || !p.experts_aligned)
    return false;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  TERN_CUDA(cudaStreamIsCapturing(impl.stream, &capturing));
  return capturing == cudaStreamCaptureStatusNone;
}

bool run_library_moe(CudaBackend::Impl& impl, const MoeParams& p, std::span<const ops::Expert> experts) {
  if (!library_moe_takes(impl, p)) return false;
  cudaStream_t s = impl.stream;

  const int64_t P = p.T * p.k, max_jobs = std::min<int64_t>(P, p.E) + 2;
  TERN_CHECK(P <= INT32_MAX / 2, "cuda moe_experts: ", P, " pairs");
  Carve c;
  const size_t sorted_at = c.take(P * 4), pos_at = c.take(P * 4), jobs_at = c.take(max_jobs * 3 * 4),
               num_at = c.take(4), counts_at = c.take(moe_sort_count_ints(P, p.E) * 4), xs_at = c.take(P * p.D * 2),
               y_at = c.take(P * p.D * 4);
  char* ws = static_cast<char*>(impl.scratch(c.used));
  auto* sorted = reinterpret_cast<int*>(ws + sorted_at);
  auto* pos = reinterpret_cast<int*>(ws + pos_at);
  auto* jobs = reinterpret_cast<int*>(ws + jobs_at);
  auto* y = reinterpret_cast<float*>(ws + y_at);
  auto* xs = reinterpret_cast<uint16_t*>(ws + xs_at);
  launch_moe_sort(p, reinterpret_cast<int*>(ws + counts_at), sorted, pos, jobs, reinterpret_cast<int*>(ws + num_at), s);
  launch_moe_gather_bf16(p.x, sorted, P, p.k, p.D, xs, s);
  check_launch("moe plan + gather");

  // The plan on the host: jobs are in expert order, their pairs contiguous in sorted order.
  const size_t readback = (max_jobs * 3 + 1) * 4;
  char* host = static_cast<char*>(impl.pinned_scratch(readback));
  TERN_CUDA(cudaMemcpyAsync(host, jobs, max_jobs * 3 * 4, cudaMemcpyDeviceToHost, s));
  TERN_CUDA(cudaMemcpyAsync(host + max_jobs * 3 * 4, ws + num_at, 4, cudaMemcpyDeviceToHost, s));
  TERN_CUDA(cudaStreamSynchronize(s));
  const int* hj = reinterpret_cast<const int*>(host);
  const int num_jobs = hj[max_jobs * 3];
  TERN_CHECK(num_jobs >= 0 && num_jobs <= max_jobs, "cuda moe_experts: plan with ", num_jobs, " jobs");
  std::vector<Job> list(static_cast<size_t>(num_jobs));
  for (int j = 0; j < num_jobs; ++j) list[j] = Job{hj[3 * j], hj[3 * j + 1], hj[3 * j + 2]};

  // Chunks of jobs whose expanded weights fit the budget; their buffers sized for the largest chunk.
  const size_t expert_elems = static_cast<size_t>(p.inter * p.D);  // each of w1, w3, w2
  const int per_chunk = static_cast<int>(std::max<size_t>(1, kMoeExpandBudget / (3 * expert_elems * 2)));
  int64_t most_pairs = 0;
  for (int j0 = 0; j0 < num_jobs; j0 += per_chunk) {
    const int j1 = std::min(num_jobs, j0 + per_chunk);
    most_pairs = std::max<int64_t>(most_pairs, list[j1 - 1].first + list[j1 - 1].count - list[j0].first);
  }
  Carve cc;
  const size_t wexp_at = cc.take(static_cast<size_t>(std::min(per_chunk, num_jobs)) * 3 * expert_elems * 2),
               h13_at = cc.take(most_pairs * 2 * p.inter * 4), h_at = cc.take(most_pairs * p.inter * 2);
  char* lw = static_cast<char*>(impl.library_scratch(cc.used));
  auto* wexp = reinterpret_cast<uint16_t*>(lw + wexp_at);
  auto* h13 = reinterpret_cast<float*>(lw + h13_at);
  auto* h = reinterpret_cast<uint16_t*>(lw + h_at);

  auto gscale = [&](const ops::Weight& w) { return p.kind == WeightFormat::nvfp4 ? w.global_scale : 1.0f; };
  // w1 and w3 are adjacent in the expansion: one [2 inter, D] product per expert, unless NVFP4 gives them
  // different global scales (then one product each, into the two halves of h13's rows).
  bool fused = true;
  for (const Job& jb : list) fused = fused && gscale(experts[jb.expert].w1) == gscale(experts[jb.expert].w3);
  std::vector<GroupedProblem> up, down;
  for (int j0 = 0; j0 < num_jobs; j0 += per_chunk) {
    const int j1 = std::min(num_jobs, j0 + per_chunk);
    const int64_t s0 = list[j0].first, pairs = list[j1 - 1].first + list[j1 - 1].count - s0;
    launch_moe_expand(p.experts, p.kind, p.scale_f32, jobs, j0, j1 - j0, p.D, p.inter, wexp, s);
    check_launch("moe_expand");
    up.clear();
    down.clear();
    for (int j = j0; j < j1; ++j) {
      const Job& jb = list[j];
      const ops::Expert& e = experts[jb.expert];
      const uint16_t* w = wexp + static_cast<size_t>(j - j0) * 3 * expert_elems;
      const uint16_t* xj = xs + static_cast<int64_t>(jb.first) * p.D;
      float* hj13 = h13 + (jb.first - s0) * 2 * p.inter;
      up.push_back({w, xj, hj13, jb.count, gscale(e.w1)});
      if (!fused) up.push_back({w + expert_elems, xj, hj13 + p.inter, jb.count, gscale(e.w3)});
      down.push_back({w + 2 * expert_elems, h + (jb.first - s0) * p.inter, y + static_cast<int64_t>(jb.first) * p.D,
                      jb.count, gscale(e.w2)});
    }
    // w1 and w3 into h13 [pairs, 2 inter]; SwiGLU to bf16; w2 into the pairs' rows of y.
    impl.lib().bf16_each(s, up, fused ? 2 * p.inter : p.inter, p.D, p.D, p.D, 2 * p.inter);
    launch_moe_swiglu_bf16(h13, pairs, p.inter, p.limit, h, s);
    check_launch("moe_swiglu_bf16");
    if (p.act_fp8) launch_act_fake_quant_bf16_inplace(Bf16Rows{h, pairs, p.inter, p.inter, 0}, s);
    impl.lib().bf16_each(s, down, p.D, p.inter, p.inter, p.inter, p.D);
  }
  launch_moe_combine(p, y, pos, s);
  check_launch("moe_combine");
  return true;
}

}  // namespace tern::cuda
