// Entry points of the DeepSeek-V4 specific ops: check arguments, then call the context's backend.
#include <initializer_list>
#include <utility>
#include <vector>

#include "ops/backend.h"
#include "ops/check.h"
#include "ops/context.h"

namespace tern::ops {

using detail::common_device;
using detail::expect_dtype;
using detail::expect_paged;
using detail::expect_rank;
using detail::expect_shape;

void hc_pre(const Context& ctx, const HcPreArgs& a) {
  expect_rank("hc_pre", "streams", a.streams, 3);
  const int64_t T = a.streams.dim(0), hc = a.streams.dim(1), D = a.streams.dim(2);
  expect_shape("hc_pre", "streams", a.streams, {T, hc, D});
  expect_shape("hc_pre", "fn", a.fn, {(2 + hc) * hc, hc * D});
  expect_shape("hc_pre", "base", a.base, {(2 + hc) * hc});
  expect_shape("hc_pre", "scale", a.scale, {3});
  const bool apart = !a.logits.empty();  // post and comb left to hc_comb
  if (apart) {
    expect_shape("hc_pre", "logits", a.logits, {T, (2 + hc) * hc});
    expect_dtype("hc_pre", "logits", a.logits, {DType::f32});
    TERN_CHECK(a.post.empty() && a.comb.empty(), "hc_pre: with logits, post and comb come from hc_comb (pass none)");
  } else {
    expect_shape("hc_pre", "post", a.post, {T, hc});
    expect_shape("hc_pre", "comb", a.comb, {T, hc, hc});
  }
  expect_shape("hc_pre", "collapsed", a.collapsed, {T, D});
  for (const TensorView* t : {&a.fn, &a.base, &a.scale})
    expect_dtype("hc_pre", "fn/base/scale", *t, {DType::f32});
  TERN_CHECK(a.params.sinkhorn_iters >= 1, "hc_pre: sinkhorn_iters must be >= 1");
  if (a.normed && !a.norm.empty()) {
    expect_dtype("hc_pre", "norm", a.norm, {DType::bf16, DType::f32});
    expect_shape("hc_pre", "norm", a.norm, {D});
  }
  if (a.has_prev()) {
    expect_shape("hc_pre", "prev_streams", a.prev_streams, {T, hc, D});
    expect_shape("hc_pre", "prev_a", a.prev_a, {T, D});
    expect_shape("hc_pre", "prev_post", a.prev_post, {T, hc});
    expect_shape("hc_pre", "prev_comb", a.prev_comb, {T, hc, hc});
    // streams is written while the prev_* are read (on the GPU by other blocks of the same kernel): no overlap.
    const auto overlaps = [&](const TensorView& v) {
      const auto* s0 = static_cast<const std::byte*>(a.streams.data());
      const auto* v0 = static_cast<const std::byte*>(v.data());
      return T > 0 && s0 < v0 + v.nbytes() && v0 < s0 + a.streams.nbytes();
    };
    TERN_CHECK(!overlaps(a.prev_streams) && !overlaps(a.prev_a) && !overlaps(a.prev_post) && !overlaps(a.prev_comb),
               "hc_pre: streams must not overlap prev_streams, prev_a, prev_post or prev_comb");
    ctx.backend_for(
        common_device("hc_pre", {&a.streams, &a.prev_streams, &a.prev_a, &a.prev_post, &a.prev_comb}));
  }
  ctx.backend_for(common_device("hc_pre", {&a.streams, &a.fn, &a.post, &a.comb, &a.logits, &a.collapsed})).hc_pre(a);
}

void hc_comb(const Context& ctx, const HcCombArgs& a) {
  expect_rank("hc_comb", "post", a.post, 2);
  const int64_t T = a.post.dim(0), hc = a.post.dim(1), mix = (2 + hc) * hc;
  expect_shape("hc_comb", "post", a.post, {T, hc});  // (contiguous)
  expect_shape("hc_comb", "logits", a.logits, {T, mix});
  expect_shape("hc_comb", "base", a.base, {mix});
  expect_shape("hc_comb", "scale", a.scale, {3});
  expect_shape("hc_comb", "comb", a.comb, {T, hc, hc});
  for (const TensorView* t : {&a.logits, &a.base, &a.scale, &a.post, &a.comb})
    expect_dtype("hc_comb", "logits/base/scale/post/comb", *t, {DType::f32});
  TERN_CHECK(a.params.sinkhorn_iters >= 1, "hc_comb: sinkhorn_iters must be >= 1");
  ctx.backend_for(common_device("hc_comb", {&a.logits, &a.base, &a.scale, &a.post, &a.comb})).hc_comb(a);
}

void hc_post(const Context& ctx, const TensorView& streams, const TensorView& a, const TensorView& post,
             const TensorView& comb, const TensorView& out) {
  expect_rank("hc_post", "streams", streams, 3);
  const int64_t T = streams.dim(0), hc = streams.dim(1), D = streams.dim(2);
  expect_shape("hc_post", "a", a, {T, D});
  expect_shape("hc_post", "post", post, {T, hc});
  expect_shape("hc_post", "comb", comb, {T, hc, hc});
  expect_shape("hc_post", "out", out, {T, hc, D});
  TERN_CHECK(out.data() != streams.data() || T == 0, "hc_post: out must not alias streams");
  ctx.backend_for(common_device("hc_post", {&streams, &a, &post, &comb, &out}))
      .hc_post(streams, a, post, comb, out);
}

void hc_head(const Context& ctx, const HcHeadArgs& a) {
  expect_rank("hc_head", "streams", a.streams, 3);
  const int64_t T = a.streams.dim(0), hc = a.streams.dim(1), D = a.streams.dim(2);
  expect_shape("hc_head", "fn", a.fn, {hc, hc * D});
  expect_shape("hc_head", "base", a.base, {hc});
  expect_shape("hc_head", "scale", a.scale, {1});
  expect_shape("hc_head", "out", a.out, {T, D});
  for (const TensorView* t : {&a.fn, &a.base, &a.scale})
    expect_dtype("hc_head", "fn/base/scale", *t, {DType::f32});
  ctx.backend_for(common_device("hc_head", {&a.streams, &a.fn, &a.out})).hc_head(a);
}

void hc_expand(const Context& ctx, const TensorView& x, const TensorView& streams) {
  expect_shape("hc_expand", "x", x, {-1, -1});
  expect_shape("hc_expand", "streams", streams, {x.dim(0), -1, x.dim(1)});
  ctx.backend_for(common_device("hc_expand", {&x, &streams})).hc_expand(x, streams);
}

int64_t compressor_update(const Context& ctx, const CompressorArgs& a) {
  TERN_CHECK(a.ratio > 0, "compressor_update: ratio must be positive");
  TERN_CHECK(a.start_pos >= 0, "compressor_update: negative start position");
  expect_rank("compressor_update", "acc", a.acc, 3);
  const int64_t width = a.acc.dim(2), channels = width * (a.overlap ? 2 : 1), n = a.kv.dim(0);
  expect_shape("compressor_update", "acc", a.acc, {a.overlap ? 2 : 1, 3, width});
  detail::expect_rows("compressor_update", "kv", a.kv, {-1, channels});
  detail::expect_rows("compressor_update", "gate", a.gate, {n, channels});
  TERN_CHECK(a.kv.row_stride() == a.gate.row_stride(), "compressor_update: kv and gate rows must be equally spaced");
  expect_shape("compressor_update", "ape", a.ape, {a.ratio, channels});
  expect_dtype("compressor_update", "ape", a.ape, {DType::f32});
  const int64_t emit = compressor_emit_count(a.start_pos, n, a.ratio);
  expect_rank("compressor_update", "emitted", a.emitted, 2);
  TERN_CHECK(a.emitted.dim(0) >= emit && a.emitted.dim(1) == width, "compressor_update: emitted must hold ",
             emit, " rows of ", width, ", found ", a.emitted.shape().str());
  return ctx.backend_for(common_device("compressor_update", {&a.acc, &a.kv, &a.gate, &a.ape, &a.emitted}))
      .compressor_update(a);
}

static void check_indexer(const char* op, const IndexerArgs& a) {
  expect_rank(op, "q", a.q, 3);
  const int64_t n = a.q.dim(0), heads = a.q.dim(1), dim = a.q.dim(2);
  expect_shape(op, "q", a.q, {n, heads, dim});
  expect_shape(op, "weights", a.weights, {n, heads});
  TERN_CHECK(a.num_keys >= 0, op, ": negative num_keys");
  expect_paged(op, "keys", a.keys, a.num_keys, dim * static_cast<int64_t>(sizeof(float)));
  expect_dtype(op, "positions", a.positions, {DType::i64});
  expect_shape(op, "positions", a.positions, {n});
  TERN_CHECK(a.ratio > 0, op, ": ratio must be positive");
}

void indexer_scores(const Context& ctx, const IndexerArgs& a, const TensorView& scores) {
  check_indexer("indexer_scores", a);
  expect_shape("indexer_scores", "scores", scores, {a.q.dim(0), a.num_keys});
  ctx.backend_for(common_device("indexer_scores", {&a.q, &a.weights, &a.keys.pool, &scores}))
      .indexer_scores(a, scores);
}

void indexer_topk(const Context& ctx, const IndexerArgs& a, int topk, const TensorView& indices) {
  check_indexer("indexer_topk", a);
  TERN_CHECK(topk > 0, "indexer_topk: topk must be positive");
  expect_dtype("indexer_topk", "indices", indices, {DType::i32});
  expect_shape("indexer_topk", "indices", indices, {a.q.dim(0), topk});
  ctx.backend_for(common_device("indexer_topk", {&a.q, &a.weights, &a.keys.pool, &indices}))
      .indexer_topk(a, topk, indices);
}

namespace {
// sparse_attention's arguments (n queries of `heads` heads); returns the device.
Device check_attention(const char* op, const AttentionArgs& a, std::initializer_list<const TensorView*> outs) {
  a.format.check();
  expect_rank(op, "q", a.q, 3);
  const int64_t n = a.q.dim(0), heads = a.q.dim(1), rb = a.format.row_bytes();
  expect_shape(op, "q", a.q, {n, heads, a.format.head_dim});
  expect_dtype(op, "chunk_rows", a.chunk_rows, {DType::u8});
  expect_shape(op, "chunk_rows", a.chunk_rows, {n, rb});
  TERN_CHECK(a.window > 0, op, ": window must be positive");
  expect_shape(op, "ring", a.ring, {a.window, rb});
  expect_shape(op, "sinks", a.sinks, {heads});
  expect_dtype(op, "sinks", a.sinks, {DType::f32});
  TERN_CHECK(a.start >= 0, op, ": negative start position");
  if (a.ratio > 0 && a.num_compressed > 0) {
    expect_paged(op, "compressed", a.compressed, a.num_compressed, rb);
    TERN_CHECK(a.num_compressed <= (a.start + n) / a.ratio, op, ": ", a.num_compressed,
               " compressed rows but only ", (a.start + n) / a.ratio, " windows are complete");
  }
  if (!a.selected.empty()) {
    expect_dtype(op, "selected", a.selected, {DType::i32});
    expect_shape(op, "selected", a.selected, {n, -1});
  }
  if (!a.q_inv_freq.empty() || !a.out_inv_freq.empty()) {
    expect_dtype(op, "positions", a.positions, {DType::i64});
    expect_shape(op, "positions", a.positions, {n});
  }
  for (const auto& [name, inv_freq] : {std::pair{"q_inv_freq", &a.q_inv_freq}, std::pair{"out_inv_freq", &a.out_inv_freq}}) {
    if (inv_freq->empty()) continue;
    expect_dtype(op, name, *inv_freq, {DType::f32});
    expect_shape(op, name, *inv_freq, {-1});
    TERN_CHECK(2 * inv_freq->dim(0) <= a.format.head_dim, op, ": ", inv_freq->dim(0), " rope pairs (", name,
               ") do not fit a head of ", a.format.head_dim);
  }
  std::vector<const TensorView*> all{&a.q, &a.chunk_rows, &a.ring, &a.compressed.pool, &a.sinks, &a.positions,
                                     &a.q_inv_freq, &a.out_inv_freq};
  all.insert(all.end(), outs.begin(), outs.end());
  Device dev = Device::cpu;
  bool found = false;
  for (const TensorView* v : all) {
    if (v->empty()) continue;
    TERN_CHECK(!found || v->device() == dev, op, ": tensors on different devices");
    dev = v->device(), found = true;
  }
  return dev;
}
}  // namespace

void sparse_attention(const Context& ctx, const AttentionArgs& a, const TensorView& out) {
  const char* op = "sparse_attention";
  expect_shape(op, "out", out, {a.q.dim(0), a.q.dim(1), a.format.head_dim});
  ctx.backend_for(check_attention(op, a, {&out})).sparse_attention(a, out);
}

void sparse_attention(const Context& ctx, const AttentionArgs& a, const Fp8Rows& out) {
  const char* op = "sparse_attention (FP8 rows out)";
  expect_rank(op, "q", a.q, 3);
  detail::expect_fp8_rows(op, "out", out, a.q.dim(0), a.q.dim(1) * a.format.head_dim);
  ctx.backend_for(check_attention(op, a, {&out.values, &out.scales})).sparse_attention_fp8(a, out);
}

static void check_route(const char* op, const TensorView& logits, const TensorView& indices,
                        const TensorView& weights) {
  expect_shape(op, "logits", logits, {-1, -1});
  expect_dtype(op, "indices", indices, {DType::i32});
  expect_shape(op, "indices", indices, {logits.dim(0), -1});
  TERN_CHECK(indices.dim(1) > 0 && indices.dim(1) <= logits.dim(1), op, ": cannot pick ", indices.dim(1),
             " of ", logits.dim(1), " experts");
  expect_shape(op, "weights", weights, {logits.dim(0), indices.dim(1)});
}

static void check_route_scored(const char* op, const TensorView& logits, const TensorView& bias,
                               const TensorView& indices, const TensorView& weights) {
  check_route(op, logits, indices, weights);
  expect_dtype(op, "bias", bias, {DType::f32});
  expect_shape(op, "bias", bias, {logits.dim(1)});
}

static void check_route_hash(const char* op, const TensorView& logits, const TensorView& tid2eid,
                             const TensorView& token_ids, const TensorView& indices, const TensorView& weights) {
  check_route(op, logits, indices, weights);
  expect_dtype(op, "tid2eid", tid2eid, {DType::i64, DType::i32});
  expect_shape(op, "tid2eid", tid2eid, {-1, indices.dim(1)});
  expect_dtype(op, "token_ids", token_ids, {DType::i64});
  expect_shape(op, "token_ids", token_ids, {logits.dim(0)});
}

void route_scored(const Context& ctx, const TensorView& logits, const TensorView& bias, float routed_scale,
                  const TensorView& indices, const TensorView& weights) {
  check_route_scored("route_scored", logits, bias, indices, weights);
  ctx.backend_for(common_device("route_scored", {&logits, &bias, &indices, &weights}))
      .route_scored(logits, bias, routed_scale, indices, weights);
}

void route_hash(const Context& ctx, const TensorView& logits, const TensorView& tid2eid,
                const TensorView& token_ids, float routed_scale, const TensorView& indices,
                const TensorView& weights) {
  check_route_hash("route_hash", logits, tid2eid, token_ids, indices, weights);
  ctx.backend_for(common_device("route_hash", {&logits, &tid2eid, &token_ids, &indices, &weights}))
      .route_hash(logits, tid2eid, token_ids, routed_scale, indices, weights);
}

void moe_experts(const Context& ctx, const MoeExpertsArgs& a) {
  expect_shape("moe_experts", "x", a.x, {-1, -1});
  const int64_t T = a.x.dim(0), D = a.x.dim(1);
  expect_dtype("moe_experts", "indices", a.indices, {DType::i32});
  expect_shape("moe_experts", "indices", a.indices, {T, -1});
  expect_shape("moe_experts", "weights", a.weights, {T, a.indices.dim(1)});
  expect_shape("moe_experts", "out", a.out, {T, D});
  if (!a.shared.empty()) {
    expect_dtype("moe_experts", "shared", a.shared, {DType::f32});
    expect_shape("moe_experts", "shared", a.shared, {T, D});
    detail::expect_contiguous("moe_experts", "shared", a.shared);
    TERN_CHECK(a.shared.device() == a.out.device(), "moe_experts: shared is not on out's device");
  }
  const MoeRouting& rt = a.route;
  if (!rt.logits.empty()) {  // the routing runs here: indices and weights are outputs
    if (rt.hashed())
      check_route_hash("moe_experts (hash routing)", rt.logits, rt.tid2eid, rt.token_ids, a.indices, a.weights);
    else
      check_route_scored("moe_experts (scored routing)", rt.logits, rt.bias, a.indices, a.weights);
    TERN_CHECK(rt.logits.dim(0) == T && rt.logits.dim(1) == static_cast<int64_t>(a.experts.size()),
               "moe_experts: routing logits of ", rt.logits.dim(0), " x ", rt.logits.dim(1), " for ", T, " tokens and ",
               a.experts.size(), " experts");
  }
  TERN_CHECK(!a.experts.empty(), "moe_experts: no experts");
  for (const Expert& e : a.experts) {
    check_weight(e.w1);
    check_weight(e.w2);
    check_weight(e.w3);
    TERN_CHECK(e.w1.in == D && e.w3.in == D && e.w2.out == D && e.w1.out == e.w3.out && e.w2.in == e.w1.out,
               "moe_experts: expert ", e.w1.name, " does not map ", D, " -> inter -> ", D);
  }
  Backend& backend = ctx.backend_for(
      rt.logits.empty() ? common_device("moe_experts", {&a.x, &a.indices, &a.weights, &a.out})
      : rt.hashed()     ? common_device("moe_experts", {&a.x, &a.indices, &a.weights, &a.out, &rt.logits, &rt.tid2eid,
                                                        &rt.token_ids})
                        : common_device("moe_experts", {&a.x, &a.indices, &a.weights, &a.out, &rt.logits, &rt.bias}));
  if (rt.logits.empty() || backend.moe_experts_routes()) return backend.moe_experts(a);
  // The routing as its own op, then the experts on its picks.
  if (rt.hashed())
    backend.route_hash(rt.logits, rt.tid2eid, rt.token_ids, rt.routed_scale, a.indices, a.weights);
  else
    backend.route_scored(rt.logits, rt.bias, rt.routed_scale, a.indices, a.weights);
  MoeExpertsArgs picked = a;
  picked.route = MoeRouting{};
  backend.moe_experts(picked);
}

}  // namespace tern::ops
