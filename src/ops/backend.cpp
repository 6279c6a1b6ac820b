#include "ops/backend.h"

namespace tern::ops {

std::vector<std::string> Backend::kernel_paths() const {
  return {cat("all ops: backend ", name(), " (it lists no kernel paths)")};
}

void Backend::no_kernel(std::string_view op, DType dtype) const {
  no_kernel(op, dtype_name(dtype));
}

void Backend::no_kernel(std::string_view op, std::string_view what) const {
  fail("no ", name(), " kernel for op ", op, " (", what, ")");
}

void Backend::step_attention(const StepAttentionArgs&, const TensorView&) {
  no_kernel("step_attention", "batched steps");
}
void Backend::step_compressor(const StepCompressorArgs&) {
  no_kernel("step_compressor", "batched steps");
}
void Backend::step_compress_emit(const StepCompressEmitArgs&) {
  no_kernel("step_compress_emit", "batched steps");
}
void Backend::step_indexer_topk(const StepIndexerArgs&, int, const TensorView&) {
  no_kernel("step_indexer_topk", "batched steps");
}
void Backend::store_ring_rows(const TensorView&, const TensorView&, const TensorView&, const TensorView&, int64_t) {
  no_kernel("store_ring_rows", "batched steps");
}
void Backend::store_paged_rows(const TensorView&, const StepPagedRows&, const TensorView&, int) {
  no_kernel("store_paged_rows", "batched steps");
}

void Backend::sample_rows(const TensorView& logits, std::span<const SampleRowSpec>, std::span<SampledRow>) {
  no_kernel("sample_rows", logits.dtype());
}

void Backend::synth_fill(const SynthFillArgs& a) { no_kernel("synth_fill", a.out.dtype()); }

void Backend::embedding(const TensorView& table, const TensorView&, const TensorView&) {
  no_kernel("embedding", table.dtype());
}
void Backend::add(const TensorView& x, const TensorView&) {
  no_kernel("add", x.dtype());
}
void Backend::swiglu(const TensorView& gate, const TensorView&, float, const TensorView&) {
  no_kernel("swiglu", gate.dtype());
}
void Backend::gather_rows(const TensorView& x, const TensorView&, const TensorView&) {
  no_kernel("gather_rows", x.dtype());
}
void Backend::rms_norm(const TensorView& x, const TensorView&, float, const TensorView&) {
  no_kernel("rms_norm", x.dtype());
}
void Backend::rope(const TensorView& x, const TensorView&, const TensorView&, bool) {
  no_kernel("rope", x.dtype());
}
void Backend::norm_rope(const TensorView& x, const TensorView& weight, float eps, const TensorView& positions,
                        const TensorView& inv_freq, const TensorView& out) {
  rms_norm(x, weight, eps, out);
  rope(out, positions, inv_freq, false);
}
void Backend::linear(const TensorView&, const Weight& w, const TensorView&) {
  no_kernel("linear", weight_format_name(w.format));
}
void Backend::act_quant_rows(const TensorView& x, const Fp8Rows&) { no_kernel("act_quant", x.dtype()); }
void Backend::grouped_linear_fp8(const Fp8Rows&, int64_t, const Weight& w, const TensorView&) {
  no_kernel("grouped_linear (FP8 rows in)", weight_format_name(w.format));
}
void Backend::grouped_linear(const TensorView&, const Weight& w, const TensorView&) {
  no_kernel("grouped_linear", weight_format_name(w.format));
}
void Backend::prefetch(const Weight&) {}  // a hint: a backend without a cache to fill does nothing
void Backend::dequantize(const Weight& w, const TensorView&) {
  no_kernel("dequantize", weight_format_name(w.format));
}
void Backend::hc_pre(const HcPreArgs& a) {
  no_kernel("hc_pre", a.streams.dtype());
}
void Backend::hc_comb(const HcCombArgs& a) {
  no_kernel("hc_comb", a.logits.dtype());
}
void Backend::hc_post(const TensorView& s, const TensorView&, const TensorView&, const TensorView&,
                      const TensorView&) {
  no_kernel("hc_post", s.dtype());
}
void Backend::hc_head(const HcHeadArgs& a) {
  no_kernel("hc_head", a.streams.dtype());
}
void Backend::hc_expand(const TensorView& x, const TensorView&) {
  no_kernel("hc_expand", x.dtype());
}
void Backend::kv_pack(const TensorView&, const KvRowFormat& f, const TensorView&) {
  no_kernel("kv_pack", kv_format_name(f.format));
}
void Backend::kv_unpack(const TensorView&, const KvRowFormat& f, const TensorView&) {
  no_kernel("kv_unpack", kv_format_name(f.format));
}
int64_t Backend::compressor_update(const CompressorArgs& a) {
  no_kernel("compressor_update", a.kv.dtype());
}
void Backend::indexer_scores(const IndexerArgs& a, const TensorView&) {
  no_kernel("indexer_scores", a.q.dtype());
}
void Backend::indexer_topk(const IndexerArgs& a, int, const TensorView&) {
  no_kernel("indexer_topk", a.q.dtype());
}
void Backend::sparse_attention(const AttentionArgs& a, const TensorView&) {
  no_kernel("sparse_attention", kv_format_name(a.format.format));
}
void Backend::sparse_attention_fp8(const AttentionArgs& a, const Fp8Rows&) {
  no_kernel("sparse_attention (FP8 rows out)", kv_format_name(a.format.format));
}
void Backend::route_scored(const TensorView& logits, const TensorView&, float, const TensorView&,
                           const TensorView&) {
  no_kernel("route_scored", logits.dtype());
}
void Backend::route_hash(const TensorView& logits, const TensorView&, const TensorView&, float,
                         const TensorView&, const TensorView&) {
  no_kernel("route_hash", logits.dtype());
}
void Backend::moe_experts(const MoeExpertsArgs& a) {
  no_kernel("moe_experts", a.x.dtype());
}

}  // namespace tern::ops
