// CudaBackend: the generic ops (host checks, then one launch each).
#include <cstdlib>
#include <string_view>

#include "backends/cuda/backend_impl.h"
#include "backends/cuda/kernels/act_quant.cuh"
#include "backends/cuda/kernels/linear_x8.cuh"
#include "backends/cuda/kernels/elementwise.cuh"
#include "backends/cuda/kernels/gemm_prep.cuh"
#include "backends/cuda/kernels/kv_row.cuh"
#include "backends/cuda/kernels/norm.cuh"
#include "backends/cuda/kernels/prefetch.cuh"
#include "backends/cuda/kernels/rope.cuh"
#include "core/env.h"

namespace tern::cuda {

void CudaBackend::embedding(const TensorView& table, const TensorView& ids, const TensorView& out) {
  require_cuda_f32("embedding", {&out});
  TERN_CHECK(table.device() == Device::cuda && ids.device() == Device::cuda, "cuda embedding: host tensors");
  launch_embedding(table.data(), table.dtype() == DType::bf16, table.dim(0), table.dim(1),
                   ids.data_as<const int64_t>(), ids.dim(0), out.data_as<float>(), impl_->err(), impl_->stream);
  check_launch("embedding");
}

void CudaBackend::add(const TensorView& x, const TensorView& y) {
  require_cuda_f32("add", {&x, &y});
  launch_add(x.data_as<const float>(), y.data_as<float>(), x.numel(), impl_->stream);
  check_launch("add");
}

void CudaBackend::swiglu(const TensorView& gate, const TensorView& up, float limit, const TensorView& out) {
  require_cuda_f32("swiglu", {&out});
  require_cuda_f32_rows("swiglu", {&gate, &up});
  const int64_t cols = gate.dim(-1), rows = cols > 0 ? gate.numel() / cols : 0;
  launch_swiglu(gate.data_as<const float>(), gate.row_stride(), up.data_as<const float>(), up.row_stride(), limit,
                out.data_as<float>(), rows, cols, impl_->stream);
  check_launch("swiglu");
}

void CudaBackend::gather_rows(const TensorView& x, const TensorView& rows, const TensorView& out) {
  require_cuda_f32("gather_rows", {&x, &out});
  launch_gather_rows(x.data_as<const float>(), x.dim(0), x.dim(1), rows.data_as<const int64_t>(), rows.dim(0),
                     out.data_as<float>(), impl_->err(), impl_->stream);
  check_launch("gather_rows");
}

namespace {
// A norm's weight as the kernels take it (none, f32 or bf16), checked to be on the device.
NormWeight norm_weight_kind(std::string_view op, const TensorView& weight) {
  if (weight.empty()) return NormWeight::none;
  TERN_CHECK(weight.device() == Device::cuda, "cuda ", op, ": weight is on the host");
  return weight.dtype() == DType::bf16 ? NormWeight::bf16 : NormWeight::f32;
}
}  // namespace

void CudaBackend::rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) {
  require_cuda_f32("rms_norm", {&out});
  require_cuda_f32_rows("rms_norm", {&x});
  const int64_t dim = x.dim(-1), rows = dim > 0 ? x.numel() / dim : 0;
  const NormWeight kind = norm_weight_kind("rms_norm", weight);
  launch_rms_norm(x.data_as<const float>(), x.row_stride(), weight.data(), kind, eps, rows, dim, out.data_as<float>(),
                  impl_->stream);
  check_launch("rms_norm");
}

void CudaBackend::rope(const TensorView& x, const TensorView& positions, const TensorView& inv_freq, bool inverse) {
  require_cuda_f32("rope", {&x, &inv_freq});
  const int64_t heads = x.rank() == 3 ? x.dim(1) : 1;
  launch_rope(x.data_as<float>(), x.dim(0), heads, x.dim(-1), positions.data_as<const int64_t>(),
              inv_freq.data_as<const float>(), inv_freq.dim(0), inverse, impl_->stream);
  check_launch("rope");
}

void CudaBackend::norm_rope(const TensorView& x, const TensorView& weight, float eps, const TensorView& positions,
                            const TensorView& inv_freq, const TensorView& out) {
  require_cuda_f32("norm_rope", {&out, &inv_freq});
  require_cuda_f32_rows("norm_rope", {&x});
  const int64_t dim = x.dim(-1), rows = dim > 0 ? x.numel() / dim : 0, heads = x.rank() == 3 ? x.dim(1) : 1;
  const NormWeight kind = norm_weight_kind("norm_rope", weight);
  if (launch_norm_rope(x.data_as<const float>(), x.row_stride(), weight.data(), kind, eps, rows, heads, dim,
                       positions.data_as<const int64_t>(), inv_freq.data_as<const float>(), inv_freq.dim(0),
                       out.data_as<float>(), impl_->stream)) {
    check_launch("norm_rope");
    return;
  }
  rms_norm(x, weight, eps, out);  // rows wider than the fused kernel takes (kernel_paths says so)
  rope(out, positions, inv_freq, false);
}

namespace {

// TERN_X8_BF16=0 sends bf16 decode products back to linear_bulk (A/B); the other linear variants
// (set_linear_variant, TERN_LINEAR_VARIANT) keep their own bf16 kernels.
bool linear_x8_enabled() {
  static const bool on = env_flag("TERN_X8_BF16", true);
  return on && linear_variant() == 0;
}

// A product's params (x f32 [T, groups * in], y [T, out]), without its split-K workspace.
LinearParams linear_params(const CudaBackend::Impl& impl, const TensorView& x, const ops::Weight& w, int64_t groups,
                           const TensorView& y) {
  LinearParams p;
  p.w = device_mat(w);
  p.x = x.data_as<const float>();
  p.T = x.dim(0);
  p.x_stride = groups * w.in;
  p.rows_per_group = w.out / groups;
  p.y = y.data_as<float>();
  p.num_sms = impl.num_sms;
  p.cluster_split = impl.x8_cluster;
  return p;
}

// The split-K workspace of `want` floats (none when 0) and the arrival counters.
void give_partials(CudaBackend::Impl& impl, LinearParams& p, int64_t want) {
  if (want <= 0) return;
  p.partial = static_cast<float*>(impl.scratch(want * sizeof(float)));
  p.partial_floats = want;
  p.counters = static_cast<int*>(impl.counters.data());
  p.num_counters = impl.num_counters;
}

// Up to 8 tokens linear_x8 quantises (FP8 weights) or rounds (bf16) x itself where it takes the product
// (linear_x8_quantises_x; TERN_X8_QUANT): launches that form and says so, or false (the caller prepares x).
bool launch_x8_with_x_in_kernel(CudaBackend::Impl& impl, const LinearParams& p, const char* what) {
  if (!impl.x8_quantises_x || !linear_x8_quantises_x(p)) return false;
  launch_linear_x8_quantising(p, impl.stream);
  check_launch(what);
  ++impl.x8_quantising_calls;
  return true;
}

// --activations fp8 (ops::Weight::act_fp8): x quantised as the official reference does (act_quant.cuh), then
// prefill chunks on cuBLASLt's block-scaled FP8 product (run_library_linear_fp8), decode sizes on the FP8 x FP8
// kernel (linear_x8.cuh); shapes neither takes get the dequantised x (e4m3 * scale, exact in bf16 and f32)
// through the paths that take x as it comes.
void run_linear_act_fp8(CudaBackend::Impl& impl, const TensorView& x, const ops::Weight& w, int64_t groups,
                        const TensorView& y) {
  const int64_t T = x.dim(0), cols = groups * w.in;
  TERN_CHECK(w.format == ops::WeightFormat::fp8_block, "linear ", w.name, ": --activations fp8 applies to FP8 weights, not ",
             ops::weight_format_name(w.format));
  TERN_CHECK(cols % 128 == 0, "linear ", w.name, ": --activations fp8 needs rows of a multiple of 128 columns, got ",
             cols);
  const ActRows rows{x.data_as<const float>(), T, cols, cols};
  LinearParams p = linear_params(impl, x, w, groups, y);
  // Exact weights (the indexer's wq_b) stay exact products: of the dequantised x, below.
  if (!w.exact && impl.dense_library_for(T) && run_library_linear_fp8(impl, x, w, groups, y)) return;
  if (!w.exact && !impl.library_for(T) && linear_x8_ok(p)) {  // (what the library turned down, too)
    give_partials(impl, p, linear_x8_partial_floats(p));
    if (launch_x8_with_x_in_kernel(impl, p, "linear_x8 (x quantised in the kernel)")) return;
    Tensor xq = impl.tensor(DType::u8, {T, cols});
    Tensor sx = impl.tensor(DType::f32, {T, cols / 128});
    launch_act_quant(rows, xq.data<uint8_t>(), sx.data<float>(), impl.stream);
    check_launch("act_quant");
    launch_linear_x8(p, xq.data<const uint8_t>(), sx.data<const float>(), impl.stream);
    check_launch("linear_x8");
    return;
  }
  Tensor xf = impl.tensor(DType::f32, {T, cols});
  launch_act_fake_quant(rows, xf.data<float>(), cols, impl.stream);
  check_launch("act_fake_quant");
  ops::Weight plain = w;
  plain.act_fp8 = false;
  run_linear(impl, xf.view(), plain, groups, y);
}

}  // namespace

void run_linear(CudaBackend::Impl& impl, const TensorView& x, const ops::Weight& w, int64_t groups,
                const TensorView& y) {
  if (w.act_fp8) {
    run_linear_act_fp8(impl, x, w, groups, y);
    return;
  }
  if (run_library_linear(impl, x, w, groups, y)) return;
  LinearParams p = linear_params(impl, x, w, groups, y);
  // bf16 weights at decode sizes (the compressors, the head): x rounded to bf16, the wgmma kernel of the FP8
  // products (linear_x8.cuh); linear_bulk read them at 0.2-0.3 of the copy rate (results.md, session 14).
  if (!w.exact && w.format == ops::WeightFormat::bf16 && linear_x8_enabled() && linear_x8_ok(p)) {
    const int64_t T = x.dim(0), cols = p.x_stride;
    give_partials(impl, p, linear_x8_partial_floats(p));
    if (launch_x8_with_x_in_kernel(impl, p, "linear_x8<bf16> (x rounded in the kernel)")) return;
    Tensor xb = impl.tensor(DType::u8, {T, 2 * cols});
    launch_round_bf16(p.x, T, cols, cols, xb.data<uint16_t>(), impl.stream);
    check_launch("round_bf16");
    launch_linear_x8(p, xb.data<const uint8_t>(), nullptr, impl.stream);
    check_launch("linear_x8<bf16>");
    return;
  }
  if (auto it = impl.linear_groups.find(p.w.w); it != impl.linear_groups.end()) p.groups = it->second;
  give_partials(impl, p, w.exact ? linear_exact_partial_floats(p) : linear_partial_floats(p));
  if (w.exact) launch_linear_exact(p, impl.stream);
  else launch_linear(p, impl.stream);
  check_launch("linear");
}

void CudaBackend::linear(const TensorView& x, const ops::Weight& w, const TensorView& y) {
  require_cuda_f32("linear", {&x, &y});
  impl_->linear_ran.insert(w.weight.data());
  run_linear(*impl_, x, w, 1, y);
}

void CudaBackend::grouped_linear(const TensorView& x, const ops::Weight& w, const TensorView& y) {
  require_cuda_f32("grouped_linear", {&x, &y});
  impl_->linear_ran.insert(w.weight.data());
  run_linear(*impl_, x, w, x.dim(1), y);
}

void CudaBackend::act_quant_rows(const TensorView& x, const ops::Fp8Rows& out) {
  require_cuda_f32_rows("act_quant", {&x});
  TERN_CHECK(out.values.device() == Device::cuda, "cuda act_quant: the rows are on the host");
  launch_act_quant(ActRows{x.data_as<const float>(), out.rows, x.row_stride(), x.dim(1)}, out.values.data_as<uint8_t>(),
                   out.scales.data_as<float>(), impl_->stream, out.scales.row_stride());
  check_launch("act_quant");
}

// Rows already quantised: cuBLASLt's block-scaled FP8 product straight from them at the library's sizes; elsewhere
// (few tokens, --batch-invariant) the dequantised rows through grouped_linear's own path, which quantises them back to
// the same bytes (the same bits as grouped_linear of the f32 rows the producer quantised).
void CudaBackend::grouped_linear_fp8(const ops::Fp8Rows& x, int64_t groups, const ops::Weight& w, const TensorView& y) {
  require_cuda_f32("grouped_linear", {&y});
  TERN_CHECK(x.values.device() == Device::cuda, "cuda grouped_linear: the FP8 rows are on the host");
  impl_->linear_ran.insert(w.weight.data());
  const int64_t T = x.rows, cols = x.cols();
  if (impl_->dense_library_for(T) && run_library_linear_fp8_rows(*impl_, x, w, groups, y)) return;
  Tensor xf = impl_->tensor(DType::f32, {T, cols});
  launch_act_dequant(x.values.data_as<const uint8_t>(), x.scales.data_as<const float>(), x.scales.row_stride(), T,
                     cols, xf.data<float>(), impl_->stream);
  check_launch("act_dequant");
  run_linear(*impl_, xf.view().reshape({T, groups, cols / groups}), w, groups, y);
}

// The weight's bytes asked into L2 (l2_prefetch_kernel). Not its scales: 1/16 000 of an FP8 weight's bytes, which
// the products read first, before their PDL wait.
void CudaBackend::prefetch(const ops::Weight& w) {
  launch_l2_prefetch(w.weight.data(), static_cast<int64_t>(w.weight.nbytes()), impl_->stream);
  check_launch("prefetch");
}

void CudaBackend::dequantize(const ops::Weight& w, const TensorView& out) {
  require_cuda_f32("dequantize", {&out});
  launch_dequantize(device_mat(w), out.data_as<float>(), impl_->stream);
  check_launch("dequantize");
}

void CudaBackend::hc_expand(const TensorView& x, const TensorView& streams) {
  require_cuda_f32("hc_expand", {&x, &streams});
  launch_hc_expand(x.data_as<const float>(), x.dim(0), streams.dim(1), x.dim(1), streams.data_as<float>(),
                   impl_->stream);
  check_launch("hc_expand");
}

void CudaBackend::kv_pack(const TensorView& x, const ops::KvRowFormat& f, const TensorView& rows) {
  require_cuda_f32("kv_pack", {&x});
  TERN_CHECK(rows.device() == Device::cuda, "cuda kv_pack: rows are on the host");
  launch_kv_pack(x.data_as<const float>(), x.dim(0), kv_desc(f), rows.data_as<uint8_t>(), impl_->stream);
  check_launch("kv_pack");
}

void CudaBackend::kv_unpack(const TensorView& rows, const ops::KvRowFormat& f, const TensorView& x) {
  require_cuda_f32("kv_unpack", {&x});
  TERN_CHECK(rows.device() == Device::cuda, "cuda kv_unpack: rows are on the host");
  launch_kv_unpack(rows.data_as<const uint8_t>(), rows.dim(0), kv_desc(f), x.data_as<float>(), impl_->stream);
  check_launch("kv_unpack");
}

}  // namespace tern::cuda
