// CudaBackend: the batched step ops (ops/step.h). Each sets the decode mode of the eager op's
// kernel (same kernel, same arithmetic per slot) and launches once for every slot; step_compress_emit runs
// the compressor's emit chain as one kernel built from the device code of the five it replaces.
#include <initializer_list>

#include "backends/cuda/backend_impl.h"
#include "backends/cuda/kernels/attention.cuh"
#include "backends/cuda/kernels/compress_emit.cuh"
#include "backends/cuda/kernels/compressor.cuh"
#include "backends/cuda/kernels/decode_rows.cuh"
#include "backends/cuda/kernels/indexer.cuh"

namespace tern::cuda {

namespace {
const uint64_t* table(const TensorView& t) { return t.empty() ? nullptr : t.data_as<const uint64_t>(); }
// The page geometry of slot rows (pool and table per slot come from the tables).
PagedRowsDesc geometry(const ops::StepPagedRows& r) {
  PagedRowsDesc d;
  d.page_bytes = r.page_bytes;
  d.offset = r.offset_in_page;
  d.rows_per_page = r.rows_per_page;
  d.row_bytes = r.row_bytes;
  return d;
}
}  // namespace

void CudaBackend::step_attention(const ops::StepAttentionArgs& a, const TensorView& out) {
  AttentionParams p = attention_params("step_attention", a.q, a.format, a.selected, a.sinks, a.scale, out, *impl_);
  p.chunk_rows = a.rows.data_as<const uint8_t>();
  p.window = a.window;
  p.ratio = a.ratio;
  p.num_compressed = a.ratio > 0 ? a.max_compressed : 0;
  p.positions = a.positions.data_as<const int64_t>();
  p.firsts = a.firsts.empty() ? nullptr : a.firsts.data_as<const int64_t>();
  p.rings = table(a.rings);
  if (a.ratio > 0) {
    p.compressed = geometry(a.compressed);
    p.pools = table(a.compressed.pools);
    p.comp_tables = table(a.compressed.tables);
  }
  if (!a.inv_freq.empty()) {
    require_cuda_f32("step_attention", {&a.inv_freq});
    p.rope_inv_freq = a.inv_freq.data_as<const float>();
    p.rope_half = a.inv_freq.dim(0);
  }
  launch_attention("step_attention", p, *impl_);
}

namespace {
// step_compressor's kernel parameters (decode mode), after checking its tensors; emitted rows only when the
// op has them.
CompressorParams compressor_params(const char* op, const ops::StepCompressorArgs& a) {
  require_cuda_f32(op, {&a.ape});
  require_cuda_f32_rows(op, {&a.kv, &a.gate});
  CompressorParams p;
  p.kv = a.kv.data_as<const float>();
  p.gate = a.gate.data_as<const float>();
  p.row_stride = a.kv.row_stride();  // gate's too (ops::step_compressor checks)
  p.ape = a.ape.data_as<const float>();
  p.width = a.width;
  p.ratio = a.ratio;
  p.overlap = a.overlap;
  p.emitted = a.emitted.empty() ? nullptr : a.emitted.data_as<float>();
  p.positions = a.positions.data_as<const int64_t>();
  p.firsts = a.firsts.empty() ? nullptr : a.firsts.data_as<const int64_t>();
  p.accs = table(a.accs);
  p.slots = a.positions.dim(0);
  // A chunk's windows are the block's lanes 0..2 (w0, w0 + 1, the last): three windows hold any 2 ratio + 1 tokens.
  TERN_CHECK(a.max_queries <= 2 * a.ratio + 1, "cuda ", op, ": sequences of up to ", a.max_queries,
             " tokens at ratio ", a.ratio, " (the step kernels take at most 2 ratio + 1 = ", 2 * a.ratio + 1, ")");
  return p;
}
}  // namespace

void CudaBackend::step_compressor(const ops::StepCompressorArgs& a) {
  require_cuda_f32("step_compressor", {&a.emitted});
  launch_compressor(compressor_params("step_compressor", a), impl_->stream);
  check_launch("step_compressor");
}

bool CudaBackend::step_compress_emit_supported(int64_t width) const { return compress_emit_width_supported(width); }

void CudaBackend::step_compress_emit(const ops::StepCompressEmitArgs& a) {
  const char* op = "step_compress_emit";
  const ops::StepCompressorArgs& c = a.compressor;
  require_cuda_f32(op, {&a.inv_freq});
  TERN_CHECK(a.norm.device() == Device::cuda, "cuda ", op, ": the norm weight is on the host");
  if (!compress_emit_width_supported(c.width)) no_kernel(op, cat("entries of ", c.width, " dims"));
  CompressEmitParams p;
  p.compressor = compressor_params(op, c);
  p.norm = a.norm.data();
  p.norm_kind = a.norm.dtype() == DType::bf16 ? NormWeight::bf16 : NormWeight::f32;
  p.eps = a.eps;
  p.inv_freq = a.inv_freq.data_as<const float>();
  p.half = a.inv_freq.dim(0);
  p.format = kv_desc(a.format);
  p.paged = geometry(a.dest);
  p.pools = table(a.dest.pools);
  p.tables = table(a.dest.tables);
  launch_compress_emit(p, impl_->stream);
  check_launch(op);
}

void CudaBackend::step_indexer_topk(const ops::StepIndexerArgs& a, int topk, const TensorView& indices) {
  require_cuda_f32("step_indexer_topk", {&a.q, &a.weights});
  TERN_CHECK(topk <= kMaxIndexerTopk, "cuda step_indexer_topk: topk ", topk, " exceeds the kernel's ",
             kMaxIndexerTopk);
  IndexerParams p;
  p.q = a.q.data_as<const float>();
  p.weights = a.weights.data_as<const float>();
  p.n = a.q.dim(0);
  p.heads = a.q.dim(1);
  p.dim = a.q.dim(2);
  p.num_keys = std::max<int64_t>(1, a.max_keys);
  p.positions = a.positions.data_as<const int64_t>();
  p.ratio = a.ratio;
  p.keys = geometry(a.keys);
  p.pools = table(a.keys.pools);
  p.key_tables = table(a.keys.tables);
  p.fast_topk = impl_->topk_fast;
  check_indexer_shape("step_indexer_topk", p);
  auto* scores = static_cast<float*>(impl_->scratch(std::max<int64_t>(1, p.n * p.num_keys) * sizeof(float)));
  launch_indexer_scores(p, scores, impl_->stream);
  check_launch("decode_indexer_scores");
  launch_indexer_topk(p, scores, topk, indices.data_as<int32_t>(), impl_->stream);
  check_launch("step_indexer_topk");
}

namespace {
void require_device_tables(const char* op, std::initializer_list<const TensorView*> views) {
  for (const TensorView* v : views)
    TERN_CHECK(v->device() == Device::cuda && v->is_contiguous(), "cuda ", op, ": tensors must be contiguous "
               "device memory");
}
}  // namespace

void CudaBackend::store_ring_rows(const TensorView& rows, const TensorView& rings, const TensorView& positions,
                                  const TensorView& firsts, int64_t window) {
  require_device_tables("store_ring_rows", {&rows, &rings, &positions});
  if (!firsts.empty()) require_device_tables("store_ring_rows", {&firsts});
  StoreRowsParams p;
  p.src = rows.data_as<const uint8_t>();
  p.positions = positions.data_as<const int64_t>();
  p.slots = rows.dim(0);
  p.row_bytes = rows.dim(1);
  p.rings = table(rings);
  p.firsts = firsts.empty() ? nullptr : firsts.data_as<const int64_t>();
  p.window = window;
  launch_store_rows(p, impl_->stream);
  check_launch("store_ring_rows");
}

void CudaBackend::store_paged_rows(const TensorView& rows, const ops::StepPagedRows& dest,
                                   const TensorView& positions, int ratio) {
  require_device_tables("store_paged_rows", {&rows, &dest.pools, &dest.tables, &positions});
  StoreRowsParams p;
  p.src = rows.data_as<const uint8_t>();
  p.positions = positions.data_as<const int64_t>();
  p.slots = rows.dim(0);
  p.row_bytes = rows.dim(1);
  p.ratio = ratio;
  p.paged = geometry(dest);
  p.pools = table(dest.pools);
  p.tables = table(dest.tables);
  launch_store_rows(p, impl_->stream);
  check_launch("store_paged_rows");
}

}  // namespace tern::cuda
