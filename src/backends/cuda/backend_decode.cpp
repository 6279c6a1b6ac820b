// CudaBackend: the batched decode-step ops (ops/decode.h). Each sets the decode mode of the eager op's
// kernel (same kernel, same arithmetic per slot) and launches once for every slot.
#include <initializer_list>

#include "backends/cuda/backend_impl.h"
#include "backends/cuda/kernels/attention.cuh"
#include "backends/cuda/kernels/compressor.cuh"
#include "backends/cuda/kernels/decode_rows.cuh"
#include "backends/cuda/kernels/indexer.cuh"

namespace tern::cuda {

namespace {
const uint64_t* table(const TensorView& t) { return t.empty() ? nullptr : t.data_as<const uint64_t>(); }
// The page geometry of slot rows (pool and table per slot come from the tables).
PagedRowsDesc geometry(const ops::DecodePagedRows& r) {
  PagedRowsDesc d;
  d.page_bytes = r.page_bytes;
  d.offset = r.offset_in_page;
  d.rows_per_page = r.rows_per_page;
  d.row_bytes = r.row_bytes;
  return d;
}
}  // namespace

void CudaBackend::decode_attention(const ops::DecodeAttentionArgs& a, const TensorView& out) {
  require_cuda_f32("decode_attention", {&a.q, &a.sinks, &out});
  const int64_t hd = a.format.head_dim;
  TERN_CHECK(hd == 128 || hd == 256 || hd == 512, "no cuda kernel for op decode_attention with head_dim ", hd,
             " (built for 128, 256, 512)");
  TERN_CHECK(a.format.format != ops::KvFormat::fp8_ds || a.format.rope_dim % 4 == 0,
             "no cuda kernel for op decode_attention with FP8 rows and rope_dim ", a.format.rope_dim);
  AttentionParams p;
  p.q = a.q.data_as<const float>();
  p.n = a.q.dim(0);
  p.heads = a.q.dim(1);
  p.fmt = kv_desc(a.format);
  p.chunk_rows = a.rows.data_as<const uint8_t>();
  p.window = a.window;
  p.ratio = a.ratio;
  p.num_compressed = a.ratio > 0 ? a.max_compressed : 0;
  p.selected = a.selected.empty() ? nullptr : a.selected.data_as<const int32_t>();
  p.k_sel = a.selected.empty() ? 0 : a.selected.dim(1);
  p.sinks = a.sinks.data_as<const float>();
  p.scale = a.scale;
  p.out = out.data_as<float>();
  p.err = impl_->err();
  p.num_sms = impl_->num_sms;
  p.positions = a.positions.data_as<const int64_t>();
  p.rings = table(a.rings);
  if (a.ratio > 0) {
    p.compressed = geometry(a.compressed);
    p.pools = table(a.compressed.pools);
    p.comp_tables = table(a.compressed.tables);
  }
  const int64_t want = attention_partial_floats(p);
  if (want > 0) p.partial = static_cast<float*>(impl_->scratch(want * sizeof(float)));
  launch_sparse_attention(p, impl_->stream);
  check_launch("decode_attention");
}

void CudaBackend::decode_compressor(const ops::DecodeCompressorArgs& a) {
  require_cuda_f32("decode_compressor", {&a.kv, &a.gate, &a.ape, &a.emitted});
  CompressorParams p;
  p.kv = a.kv.data_as<const float>();
  p.gate = a.gate.data_as<const float>();
  p.ape = a.ape.data_as<const float>();
  p.width = a.width;
  p.ratio = a.ratio;
  p.overlap = a.overlap;
  p.emitted = a.emitted.data_as<float>();
  p.positions = a.positions.data_as<const int64_t>();
  p.accs = table(a.accs);
  p.slots = a.positions.dim(0);
  launch_compressor(p, impl_->stream);
  check_launch("decode_compressor");
}

void CudaBackend::decode_indexer_topk(const ops::DecodeIndexerArgs& a, int topk, const TensorView& indices) {
  require_cuda_f32("decode_indexer_topk", {&a.q, &a.weights});
  TERN_CHECK(topk <= kMaxIndexerTopk, "cuda decode_indexer_topk: topk ", topk, " exceeds the kernel's ",
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
  auto* scores = static_cast<float*>(impl_->scratch(std::max<int64_t>(1, p.n * p.num_keys) * sizeof(float)));
  launch_indexer_scores(p, scores, impl_->stream);
  check_launch("decode_indexer_scores");
  launch_indexer_topk(p, scores, topk, indices.data_as<int32_t>(), impl_->stream);
  check_launch("decode_indexer_topk");
}

namespace {
void require_device_tables(const char* op, std::initializer_list<const TensorView*> views) {
  for (const TensorView* v : views)
    TERN_CHECK(v->device() == Device::cuda && v->is_contiguous(), "cuda ", op, ": tensors must be contiguous "
               "device memory");
}
}  // namespace

void CudaBackend::store_ring_rows(const TensorView& rows, const TensorView& rings, const TensorView& positions,
                                  int64_t window) {
  require_device_tables("store_ring_rows", {&rows, &rings, &positions});
  StoreRowsParams p;
  p.src = rows.data_as<const uint8_t>();
  p.positions = positions.data_as<const int64_t>();
  p.slots = rows.dim(0);
  p.row_bytes = rows.dim(1);
  p.rings = table(rings);
  p.window = window;
  launch_store_rows(p, impl_->stream);
  check_launch("store_ring_rows");
}

void CudaBackend::store_paged_rows(const TensorView& rows, const ops::DecodePagedRows& dest,
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
