// The attention sub-layer of a V4 layer (SWA, CSA or HCA), its compressors and the lightning indexer.
#include <cmath>

#include "model/v4_batch.h"
#include "ops/attention.h"
#include "ops/branch.h"
#include "ops/compressor.h"
#include "ops/indexer.h"
#include "ops/kv_row.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/step.h"

namespace tern::model {

void Model::attention_block(int l, const Batch& b, const TensorView& h, const TensorView& out) {
  const ModelConfig& c = w_.config;
  const AttentionWeights& A = layer(l).attn;
  const int64_t N = b.tokens, H = c.num_heads, hd = c.head_dim, G = c.o_groups;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  const TensorView inv_freq = layer(l).attn_kind == AttnKind::sliding ? inv_freq_main_ : inv_freq_compress_;

  // The rows on the step tables (rows 0 .. Ns - 1: decode tokens, verify and short chunks; every row in a step
  // wholly on them) and the sequences that run per sequence (prefill chunks: rows Ns .. N - 1), both in one step.
  // On the tables the indexer (its compressor, then each slot's top-k), or else the compressor, is a side branch
  // (ops/branch.h; its own stream inside decode graphs) beside the query and KV projections, joined before the
  // attention. Its compressor and the indexer's head weights need only h, so they are forked first, before wq_a; the
  // top-k needs cq and follows on the same branch (forked after q_norm below). The branch is the longer one in CSA layers: at batch 1 the
  // attention waited ~16 us a CSA layer for it (H100 trace, results.md session 26).
  const int64_t Ns = b.table_tokens;
  const TensorView h_t = h.rows(0, Ns);
  const bool branch = Ns > 0 && (A.indexer || A.compressor);
  Tensor index_weights;  // the indexer's head weights (weights_proj h), computed on the branch
  if (branch)
    ops::run_side(
        ctx_, h.device(),
        [&] {
          compress_step(l, b, h_t, /*indexer=*/bool(A.indexer));
          if (A.indexer) index_weights = indexer_weights(l, h_t);
        },
        A.indexer ? ops::BranchLength::longer : ops::BranchLength::shorter);

  // cq = RMSNorm(wq_a h); q = wq_b cq, each head / rms(head), RoPE on the last rope_dim dims at p.
  // wq_a h and wkv h come from one product (stacked weights); the norms read its column ranges.
  const Projections qkv = project(h, A.wq_a_wkv, A.wq_a, A.wkv);
  Tensor cq = tensor(DType::f32, {N, c.q_lora_rank});  // [N, q_lora_rank]
  ops::rms_norm(ctx_, qkv.a, A.q_norm, eps, cq);

  Tensor selected;  // the tables' rows: the indexer's picks
  if (branch && A.indexer)
    ops::run_side(
        ctx_, h.device(), [&] { selected = indexer_step(l, b, h_t, cq.view().rows(0, Ns), index_weights); },
        ops::BranchLength::longer);
  Tensor q = tensor(DType::f32, {N, H, hd});  // [N, heads, head_dim], written as [N, heads * head_dim]
  ops::linear(ctx_, cq, A.wq_b, q.view().reshape({N, H * hd}));
  if (N <= kPrefetchMaxTokens) {  // (Paths::l2_prefetch)
    if ((paths_.l2_prefetch & kPrefetchWoA) != 0) ops::prefetch(ctx_, A.wo_a);
    if ((paths_.l2_prefetch & kPrefetchWoB) != 0) ops::prefetch(ctx_, A.wo_b);
  }
  // The tables' rows here; the chunk path's by sparse_attention itself (AttentionArgs::q_inv_freq: the CUDA prefill
  // kernels in their q load, without q's own pass over memory).
  if (Ns > 0)
    ops::norm_rope(ctx_, q.view().rows(0, Ns), {}, eps, b.positions.rows(0, Ns), inv_freq, q.view().rows(0, Ns));

  // kv = RMSNorm(wkv h), RoPE at p; stored in the KV format (FP8 mode: the reference's rounding)
  Tensor kv = tensor(DType::f32, {N, hd});  // [N, head_dim]: K = V
  ops::norm_rope(ctx_, qkv.b, A.kv_norm, eps, b.positions, inv_freq, kv);
  observe("kv", l, kv);
  const ops::KvRowFormat format = kv_format();
  Tensor kv_rows = tensor(DType::u8, {N, format.row_bytes()});  // [N, row_bytes]
  ops::kv_pack(ctx_, kv, format, kv_rows);
  if (b.record != nullptr) b.record->layers[static_cast<size_t>(l)].rows = kv_rows;

  // The compressed rows (and indexer keys) first take in every window this chunk completes.
  // o_h = softmax-with-sink over window + compressed rows; then inverse RoPE at p. With FP8 activations a step with
  // prefill chunks hands wo_a its heads quantised (ops::Fp8Rows): the chunks' rows come out of sparse_attention so
  // (on the GPU rotated back and quantised in the prefill kernel's epilogue), the tables' rows are quantised after
  // attend_step. The chunks' heads are then never stored in f32 (1 GiB a layer at 8K tokens) and read back.
  const int64_t width = H * hd;
  const bool fp8_heads = Ns < N && A.wo_a.act_fp8 && !A.wo_a.exact && (width / G) % ops::kActBlock == 0;
  Tensor heads = tensor(DType::f32, {fp8_heads ? Ns : N, H, hd});  // [N, heads, head_dim] (fp8_heads: the tables' rows)
  Tensor heads_values, heads_scales;
  ops::Fp8Rows heads8;  // fp8_heads: every row's, values [P, width] and scales [width / 128, P]
  if (fp8_heads) {
    const int64_t P = ops::Fp8Rows::padded_rows(N);
    heads_values = tensor(DType::u8, {P, width});
    heads_scales = tensor(DType::f32, {width / ops::kActBlock, P});
    heads8 = ops::Fp8Rows{heads_values, heads_scales, N};
  }
  if (Ns < N) {  // per sequence (the chunk path below), for the sequences not on the tables
    std::vector<Tensor> picked(b.seqs.size());
    if (A.compressor) compress(l, b, h, /*indexer=*/false);
    if (A.indexer) {
      compress(l, b, h, /*indexer=*/true);
      indexer_select(l, b, h, cq, picked);
    }
    attend(l, b, q, kv_rows, picked, heads, fp8_heads ? &heads8 : nullptr, inv_freq);
  }
  if (Ns > 0) {  // one launch per op for every slot (model/v4_decode.cpp)
    if (A.indexer && A.compressor) compress_step(l, b, h_t, /*indexer=*/false);
    ops::join_side(ctx_, h.device());
    // (hc_comb of this sub-layer's hc_pre: ahead of the indexer's branch it would delay the join above)
    if (auto task = take_side_task()) ops::run_side(ctx_, h.device(), task);
    attend_step(l, b, q.view().rows(0, Ns), kv_rows.view().rows(0, Ns), selected, heads.view().rows(0, Ns),
                paths_.fused_rope ? inv_freq : TensorView());
  }
  // (the tables' rows rotated back in attend_step when paths_.fused_rope; the chunks' rows by sparse_attention)
  const int64_t roped = Ns > 0 && paths_.fused_rope ? Ns : 0;
  if (roped < Ns)
    ops::rope(ctx_, heads.view().rows(roped, Ns), b.positions.rows(roped, Ns), inv_freq, /*inverse=*/true);
  if (fp8_heads && Ns > 0) ops::act_quant(ctx_, heads.view().reshape({Ns, width}), heads8.slice(0, Ns));

  // out = wo_b . concat_g(wo_a[g] . heads of group g)
  Tensor grouped = tensor(
      DType::f32, {N, G, c.o_lora_rank});  // heads as [N, G, heads/G * head_dim] -> [N, G, o_lora_rank]
  if (fp8_heads)
    ops::grouped_linear(ctx_, heads8, G, A.wo_a, grouped);
  else
    ops::grouped_linear(ctx_, heads.view().reshape({N, G, width / G}), A.wo_a, grouped);
  ops::linear(ctx_, grouped.view().reshape({N, G * c.o_lora_rank}), A.wo_b, out);
  if (Ns > 0) ops::join_side(ctx_, h.device());  // the ring store (attend_step)
}

// Each sequence's queries against its window (ring + this chunk's rows) and compressed rows; the chunk's
// rows then enter the ring.
void Model::attend(int l, const Batch& b, const Tensor& q, const Tensor& kv_rows,
                   const std::vector<Tensor>& selected, const Tensor& heads, const ops::Fp8Rows* heads8,
                   const TensorView& inv_freq) {
  const ModelConfig& c = w_.config;
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    const Batch::Seq& s = b.seqs[i];
    if (s.on_tables) continue;
    ops::AttentionArgs args;
    args.q = b.rows(q, s);
    args.start = s.start;
    args.format = kv_format();
    args.chunk_rows = b.rows(kv_rows, s);
    args.ring = s.state->ring(l);
    args.window = c.sliding_window;
    args.ratio = layer_specs_[l].ratio;
    if (args.ratio > 0) {
      args.compressed = s.state->compressed_rows(l);
      args.num_compressed = s.state->layout().entries(l, s.start + s.n);
    }
    args.selected = selected[i].empty() ? TensorView() : selected[i].view();
    args.sinks = layer(l).attn.attn_sink;
    args.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    args.positions = b.rows(b.positions, s);  // q as wq_b wrote it: normed, RoPE at p; the output rotated back
    args.q_inv_freq = inv_freq;
    args.q_norm_eps = static_cast<float>(c.rms_norm_eps);
    args.out_inv_freq = inv_freq;
    if (heads8 != nullptr) {  // and quantised for wo_a
      ops::sparse_attention(ctx_, args, heads8->slice(s.begin, s.begin + s.n));
    } else {
      ops::sparse_attention(ctx_, args, b.rows(heads, s));
    }
    s.state->store_window_rows(l, s.start, b.rows(kv_rows, s));
  }
}

// Runs the attention compressor (or the indexer's) over the batch and appends the completed entries,
// RMSNorm'ed and RoPE'd at position w * ratio, to each sequence's compressed rows (or indexer keys).
Model::CompressorInputs Model::compressor_inputs(int l, const TensorView& h, bool indexer) {
  const AttentionWeights& A = layer(l).attn;
  CompressorInputs in;
  in.weights = indexer ? &A.indexer->compressor : &*A.compressor;
  in.kv_gate = project(h, in.weights->wkv_wgate, in.weights->wkv, in.weights->wgate);
  in.format = entry_format(*in.weights, indexer);
  return in;
}

void Model::compress(int l, const Batch& b, const TensorView& h, bool indexer) {
  const ModelConfig& c = w_.config;
  const int64_t first = b.table_tokens;  // the chunk path's rows: first .. N - 1
  const CompressorInputs in = compressor_inputs(l, h.rows(first, b.tokens), indexer);
  const CompressorWeights& cw = *in.weights;
  const TensorView &kv = in.kv_gate.a, &gate = in.kv_gate.b;  // rows strided when stacked
  const ops::KvRowFormat& format = in.format;
  const int ratio = c.compress_ratio(l);
  const int64_t width = cw.width;
  for (const Batch::Seq& s : b.seqs) {
    if (s.on_tables) continue;
    const int64_t emit = ops::compressor_emit_count(s.start, s.n, ratio);
    Tensor emitted = tensor(DType::f32, {emit, width});
    const TensorView acc = (indexer ? s.state->indexer_acc(l) : s.state->compressor_acc(l))
                               .reshape({cw.overlap ? 2 : 1, 3, width});
    ops::compressor_update(ctx_, {acc, b.rows(kv, s, first), b.rows(gate, s, first), cw.ape, s.start, ratio,
                                  cw.overlap, emitted});
    if (emit == 0) continue;
    ops::rms_norm(ctx_, emitted, cw.norm, static_cast<float>(c.rms_norm_eps), emitted);
    const int64_t entry = s.start / ratio;  // entry index of the first emitted row
    // One host table, one copy: row 0 the entries' RoPE positions; rows 1-3 store_paged_rows' slots (one an
    // entry: the state's pool and row table, and a position closing the entry's window).
    const PagedRows dest = indexer ? s.state->index_keys(l) : s.state->compressed_rows(l);
    TERN_CHECK(dest.capacity() >= entry + emit, "compress: the state holds ", dest.capacity(), " rows, not ",
               entry + emit);
    Tensor words(DType::i64, {4, emit});
    int64_t* w = words.data<int64_t>();
    for (int64_t e = 0; e < emit; ++e) {
      w[e] = (entry + e) * ratio;
      w[emit + e] = table_address(dest.pool);
      w[2 * emit + e] = table_address(dest.block_table);
      w[3 * emit + e] = (entry + e) * ratio + ratio - 1;
    }
    words = on_device(std::move(words));
    auto word_row = [&](int64_t k) { return words.view().rows(k, k + 1).reshape({emit}); };
    ops::rope(ctx_, emitted, word_row(0), inv_freq_compress_);
    observe(indexer ? "index_keys" : "compressed_kv", l, emitted);
    // Packed in one launch, then stored into the pages in one (a pack a run of rows sharing a page was 4 011
    // launches, 10.8 ms, in an 8K prefill on the H100; session 35: 1.4 ms now, the prefill -0.9%).
    Tensor packed = tensor(DType::u8, {emit, format.row_bytes()});
    ops::kv_pack(ctx_, emitted, format, packed);
    ops::StepPagedRows paged;
    paged.pools = word_row(1);
    paged.tables = word_row(2);
    paged.page_bytes = dest.page_bytes();
    paged.offset_in_page = dest.offset_in_page;
    paged.rows_per_page = dest.rows_per_page;
    paged.row_bytes = dest.row_bytes;
    ops::store_paged_rows(ctx_, packed, paged, word_row(3), ratio);
  }
}

// CSA: qI = indexer.wq_b cq (RoPE at p), w = weights_proj h; each query keeps its top-k visible entries.
void Model::indexer_select(int l, const Batch& b, const TensorView& h, const TensorView& cq,
                           std::vector<Tensor>& selected) {
  const ModelConfig& c = w_.config;
  const IndexerWeights& x = *layer(l).attn.indexer;
  const int64_t first = b.table_tokens;  // the chunk path's rows: first .. N - 1
  const int64_t N = b.tokens - first, Hi = c.index_n_heads, di = c.index_head_dim;
  const TensorView positions = b.positions.rows(first, b.tokens);
  Tensor qi = tensor(DType::f32, {N, Hi, di});  // [N, index_heads, index_head_dim]
  ops::linear(ctx_, cq.rows(first, b.tokens), x.wq_b, qi.view().reshape({N, Hi * di}));
  ops::rope(ctx_, qi, positions, inv_freq_compress_);
  Tensor weights = tensor(DType::f32, {N, Hi});
  ops::linear(ctx_, h.rows(first, b.tokens), x.weights_proj, weights);
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    const Batch::Seq& s = b.seqs[i];
    if (s.on_tables) continue;
    ops::IndexerArgs args;
    args.q = b.rows(qi, s, first);
    args.weights = b.rows(weights, s, first);
    args.keys = s.state->index_keys(l);
    args.num_keys = s.state->layout().entries(l, s.start + s.n);
    args.positions = b.rows(b.positions, s);
    args.ratio = c.compress_ratio(l);
    selected[i] = tensor(DType::i32, {s.n, c.index_topk});
    ops::indexer_topk(ctx_, args, c.index_topk, selected[i]);
    observe("indexer_topk", l, selected[i]);
  }
}

}  // namespace tern::model
