// Entry points of the batched step ops (ops/step.h): check arguments, then call the context's backend.
#include "ops/backend.h"
#include "ops/check.h"
#include "ops/context.h"
#include "ops/step.h"

namespace tern::ops {

using detail::common_device;
using detail::expect_dtype;
using detail::expect_shape;

namespace {
void expect_table(std::string_view op, std::string_view arg, const TensorView& t, int64_t slots) {
  expect_shape(op, arg, t, {slots});
  expect_dtype(op, arg, t, {DType::i64});
}
// firsts (when given): i64 [slots], each slot's first slot of its sequence (not after it). The values stay on the
// device; the backends treat a bad one as the other tables' bad addresses.
void expect_firsts(std::string_view op, const TensorView& firsts, int64_t slots) {
  if (!firsts.empty()) expect_table(op, "firsts", firsts, slots);
}
void expect_paged_tables(std::string_view op, std::string_view arg, const StepPagedRows& r, int64_t slots) {
  expect_table(op, arg, r.pools, slots);
  expect_table(op, arg, r.tables, slots);
  TERN_CHECK(r.page_bytes > 0 && r.rows_per_page > 0 && r.row_bytes > 0 && r.offset_in_page >= 0 &&
                 r.offset_in_page + r.rows_per_page * r.row_bytes <= r.page_bytes,
             op, ": ", arg, " page geometry (", r.rows_per_page, " rows of ", r.row_bytes, " bytes at ",
             r.offset_in_page, ") does not fit a page of ", r.page_bytes, " bytes");
}
}  // namespace

void step_attention(const Context& ctx, const StepAttentionArgs& a, const TensorView& out) {
  const int64_t S = a.q.dim(0);
  expect_table("step_attention", "positions", a.positions, S);
  expect_table("step_attention", "rings", a.rings, S);
  expect_firsts("step_attention", a.firsts, S);
  if (a.ratio > 0) {
    expect_paged_tables("step_attention", "compressed", a.compressed, S);
    TERN_CHECK(a.compressed.row_bytes == a.format.row_bytes(), "step_attention: compressed rows of ",
               a.compressed.row_bytes, " bytes, KV rows of ", a.format.row_bytes());
  }
  expect_shape("step_attention", "rows", a.rows, {S, a.format.row_bytes()});
  TERN_CHECK(a.q.rank() == 3 && out.shape() == a.q.shape(), "step_attention: out ", out.shape().str(),
             " must match q ", a.q.shape().str());
  TERN_CHECK(a.window > 0, "step_attention: window must be > 0");
  if (!a.selected.empty()) {
    TERN_CHECK(a.selected.rank() == 2 && a.selected.dim(0) == S, "step_attention: selected ",
               a.selected.shape().str(), " must be [", S, ", k]");
    expect_dtype("step_attention", "selected", a.selected, {DType::i32});
  }
  if (!a.inv_freq.empty()) {
    expect_dtype("step_attention", "inv_freq", a.inv_freq, {DType::f32});
    expect_shape("step_attention", "inv_freq", a.inv_freq, {-1});
    TERN_CHECK(2 * a.inv_freq.dim(0) <= a.q.dim(-1), "step_attention: rope dim ", 2 * a.inv_freq.dim(0),
               " exceeds head_dim ", a.q.dim(-1));
  }
  ctx.backend_for(common_device("step_attention", {&a.q, &a.positions, &a.rows, &out, &a.inv_freq}))
      .step_attention(a, out);
}

namespace {
// What step_compressor and step_compress_emit both take: the accumulator update's arguments.
void expect_compressor_args(std::string_view op, const StepCompressorArgs& a) {
  const int64_t S = a.positions.dim(0), C = a.width * (a.overlap ? 2 : 1);
  expect_table(op, "positions", a.positions, S);
  expect_table(op, "accs", a.accs, S);
  expect_firsts(op, a.firsts, S);
  TERN_CHECK(a.max_queries >= 1 && (a.max_queries == 1 || !a.firsts.empty()), op, ": max_queries ", a.max_queries,
             " needs firsts (one token a sequence without them)");
  detail::expect_rows(op, "kv", a.kv, {S, C});
  detail::expect_rows(op, "gate", a.gate, {S, C});
  TERN_CHECK(a.kv.row_stride() == a.gate.row_stride(), op, ": kv and gate rows must be equally spaced");
  expect_shape(op, "ape", a.ape, {a.ratio, C});
  TERN_CHECK(a.ratio > 0, op, ": ratio must be > 0");
}
}  // namespace

void step_compressor(const Context& ctx, const StepCompressorArgs& a) {
  expect_compressor_args("step_compressor", a);
  expect_shape("step_compressor", "emitted", a.emitted, {a.positions.dim(0), a.width});
  ctx.backend_for(common_device("step_compressor", {&a.kv, &a.gate, &a.positions, &a.emitted}))
      .step_compressor(a);
}

bool step_compress_emit_supported(const Context& ctx, Device device, int64_t width) {
  return ctx.backend_for(device).step_compress_emit_supported(width);
}

void step_compress_emit(const Context& ctx, const StepCompressEmitArgs& a) {
  const char* op = "step_compress_emit";
  const StepCompressorArgs& c = a.compressor;
  expect_compressor_args(op, c);
  const int64_t S = c.positions.dim(0);
  TERN_CHECK(c.emitted.empty(), op, ": the compressor's emitted rows are not used (leave them empty)");
  expect_shape(op, "norm", a.norm, {c.width});
  expect_dtype(op, "norm", a.norm, {DType::f32, DType::bf16});
  a.format.check();
  TERN_CHECK(a.format.head_dim == c.width, op, ": rows of ", a.format.head_dim, " dims for entries of ", c.width);
  expect_shape(op, "inv_freq", a.inv_freq, {a.format.rope_dim / 2});
  expect_dtype(op, "inv_freq", a.inv_freq, {DType::f32});
  expect_paged_tables(op, "dest", a.dest, S);
  TERN_CHECK(a.dest.row_bytes == a.format.row_bytes(), op, ": destination rows of ", a.dest.row_bytes,
             " bytes, the format's of ", a.format.row_bytes());
  ctx.backend_for(common_device(op, {&c.kv, &c.gate, &c.positions, &c.accs, &a.norm, &a.inv_freq,
                                     &a.dest.pools, &a.dest.tables}))
      .step_compress_emit(a);
}

void step_indexer_topk(const Context& ctx, const StepIndexerArgs& a, int topk, const TensorView& indices) {
  const int64_t S = a.q.dim(0);
  expect_table("step_indexer_topk", "positions", a.positions, S);
  expect_paged_tables("step_indexer_topk", "keys", a.keys, S);
  TERN_CHECK(a.keys.row_bytes == a.q.dim(2) * 4, "step_indexer_topk: keys of ", a.keys.row_bytes,
             " bytes for queries of ", a.q.dim(2), " f32");
  expect_shape("step_indexer_topk", "weights", a.weights, {S, a.q.dim(1)});
  expect_shape("step_indexer_topk", "indices", indices, {S, topk});
  expect_dtype("step_indexer_topk", "indices", indices, {DType::i32});
  TERN_CHECK(a.ratio > 0 && topk > 0, "step_indexer_topk: ratio and topk must be > 0");
  ctx.backend_for(common_device("step_indexer_topk", {&a.q, &a.weights, &a.positions, &indices}))
      .step_indexer_topk(a, topk, indices);
}

void store_ring_rows(const Context& ctx, const TensorView& rows, const TensorView& rings,
                     const TensorView& positions, const TensorView& firsts, int64_t window) {
  const int64_t S = rows.dim(0);
  expect_table("store_ring_rows", "rings", rings, S);
  expect_table("store_ring_rows", "positions", positions, S);
  expect_firsts("store_ring_rows", firsts, S);
  expect_dtype("store_ring_rows", "rows", rows, {DType::u8});
  TERN_CHECK(window > 0, "store_ring_rows: a ring needs window > 0");
  ctx.backend_for(common_device("store_ring_rows", {&rows, &rings, &positions}))
      .store_ring_rows(rows, rings, positions, firsts, window);
}

void store_paged_rows(const Context& ctx, const TensorView& rows, const StepPagedRows& dest,
                      const TensorView& positions, int ratio) {
  const int64_t S = rows.dim(0);
  expect_paged_tables("store_paged_rows", "dest", dest, S);
  expect_table("store_paged_rows", "positions", positions, S);
  expect_dtype("store_paged_rows", "rows", rows, {DType::u8});
  TERN_CHECK(rows.rank() == 2 && rows.dim(1) == dest.row_bytes, "store_paged_rows: rows ", rows.shape().str(),
             " for destination rows of ", dest.row_bytes, " bytes");
  TERN_CHECK(ratio > 0, "store_paged_rows: ratio must be > 0");
  ctx.backend_for(common_device("store_paged_rows", {&rows, &dest.pools, &dest.tables, &positions}))
      .store_paged_rows(rows, dest, positions, ratio);
}

}  // namespace tern::ops
