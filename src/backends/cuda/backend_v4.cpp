// CudaBackend: the DeepSeek-V4 ops (mHC, compressor, indexer, sparse attention, routing, experts).
#include <cmath>
#include <string_view>
#include <vector>

#include "backends/cuda/backend_impl.h"
#include "backends/cuda/kernels/act_quant.cuh"
#include "backends/cuda/kernels/attention.cuh"
#include "backends/cuda/kernels/compressor.cuh"
#include "backends/cuda/kernels/indexer.cuh"
#include "backends/cuda/kernels/mhc.cuh"
#include "backends/cuda/kernels/moe_grouped.cuh"
#include "backends/cuda/kernels/moe_grouped_e4m3.cuh"
#include "backends/cuda/kernels/moe_grouped_wgmma.cuh"
#include "core/env.h"

namespace tern::cuda {

// Session 30 measured the fold at +2-3% a prefill, but each of its measurements had ~1.6 ms a layer of inlined sines
// in it (its first form's, then the FP8 epilogue's: session 31); the switch is the A/B of the fold alone in one binary.
bool q_norm_fold_enabled() {
  static const bool on = env_flag("TERN_Q_NORM_FOLD", true);
  return on;
}

namespace {

HcParams hc_params(const TensorView& streams, const TensorView& fn, const TensorView& base, const TensorView& scale,
                   const ops::HcParams& hp) {
  HcParams p;
  p.streams = streams.data_as<const float>();
  p.fn = fn.data_as<const float>();
  p.base = base.data_as<const float>();
  p.scale = scale.data_as<const float>();
  p.T = streams.dim(0);
  p.hc = streams.dim(1);
  p.D = streams.dim(2);
  TERN_CHECK(p.hc == 4, "no cuda kernel for mHC with hc_mult ", p.hc, " (the kernels are built for 4)");
  TERN_CHECK(p.D % 4 == 0 && p.D <= kHcMaxD, "no cuda kernel for mHC with hidden size ", p.D,
             " (built for multiples of 4 up to ", kHcMaxD, ")");
  p.sinkhorn_iters = hp.sinkhorn_iters;
  p.hc_eps = hp.hc_eps;
  p.norm_eps = hp.norm_eps;
  return p;
}

}  // namespace

void CudaBackend::hc_pre(const ops::HcPreArgs& a) {
  const bool apart = !a.logits.empty();  // post and comb left to hc_comb (the finish kernel stores the logits)
  require_cuda_f32("hc_pre", {&a.streams, &a.fn, &a.base, &a.scale, &a.post, &a.comb, &a.logits, &a.collapsed});
  HcParams p = hc_params(a.streams, a.fn, a.base, a.scale, a.params);
  p.early_fn = impl_->hc_early_fn;
  if (apart) {
    p.logits = a.logits.data_as<float>();
  } else {
    p.post = a.post.data_as<float>();
    p.comb = a.comb.data_as<float>();
  }
  p.collapsed = a.collapsed.data_as<float>();
  if (a.normed) {
    p.normed = true;
    p.rms_eps = a.rms_eps;
    if (!a.norm.empty()) {
      TERN_CHECK(a.norm.device() == Device::cuda, "cuda hc_pre: the norm weight is on the host");
      p.norm_weight = a.norm.data();
      p.norm_kind = a.norm.dtype() == DType::bf16 ? NormWeight::bf16 : NormWeight::f32;
    }
  }
  // The folded hc_post (ops::HcPreArgs::prev_*): inside the mix kernel, which writes the streams it reads; on
  // the library path (prefill chunks) hc_post first, with the mix's squares column where hc_post_squares
  // takes the shape (one read of the streams less: hc_squares_kernel's), else as the op.
  bool squares_done = false;
  if (a.has_prev()) {
    require_cuda_f32("hc_pre (folded hc_post)", {&a.prev_streams, &a.prev_a, &a.prev_post, &a.prev_comb});
    const bool library = library_hc_for(*impl_, p);
    if (library && impl_->hc_post_squares && hc_post_squares_supported(p.hc, p.D)) {
      const int64_t mix = (2 + p.hc) * p.hc;
      launch_hc_post_squares(a.prev_streams.data_as<const float>(), a.prev_a.data_as<const float>(),
                             a.prev_post.data_as<const float>(), a.prev_comb.data_as<const float>(), p.T, p.D,
                             a.streams.data_as<float>(), library_hc_partial(*impl_, p, false) + mix, mix + 1,
                             impl_->stream);
      check_launch("hc_post + squares");
      squares_done = true;
    } else if (library) {
      hc_post(a.prev_streams, a.prev_a, a.prev_post, a.prev_comb, a.streams);
    } else {
      p.prev_streams = a.prev_streams.data_as<const float>();
      p.prev_a = a.prev_a.data_as<const float>();
      p.prev_post = a.prev_post.data_as<const float>();
      p.prev_comb = a.prev_comb.data_as<const float>();
      p.out_streams = a.streams.data_as<float>();
    }
  }
  if (run_library_hc(*impl_, p, false, squares_done)) return;
  p.partial = static_cast<float*>(impl_->scratch(hc_partial_floats(p.T, p.hc, p.D, false) * sizeof(float)));
  launch_hc_pre(p, impl_->stream);
  check_launch(p.prev_a != nullptr ? "hc_pre (hc_post folded)" : "hc_pre");
}

void CudaBackend::hc_comb(const ops::HcCombArgs& a) {
  require_cuda_f32("hc_comb", {&a.logits, &a.base, &a.scale, &a.post, &a.comb});
  TERN_CHECK(a.post.dim(1) == 4, "no cuda kernel for hc_comb with hc_mult ", a.post.dim(1),
             " (the kernels are built for 4)");
  HcParams p;
  p.T = a.post.dim(0);
  p.hc = a.post.dim(1);
  p.base = a.base.data_as<const float>();
  p.scale = a.scale.data_as<const float>();
  p.sinkhorn_iters = a.params.sinkhorn_iters;
  p.hc_eps = a.params.hc_eps;
  p.logits = a.logits.data_as<float>();  // read only, by hc_comb_kernel
  p.post = a.post.data_as<float>();
  p.comb = a.comb.data_as<float>();
  launch_hc_comb(p, impl_->stream);
  check_launch("hc_comb");
}

void CudaBackend::hc_post(const TensorView& streams, const TensorView& a, const TensorView& post,
                          const TensorView& comb, const TensorView& out) {
  require_cuda_f32("hc_post", {&streams, &a, &post, &comb, &out});
  TERN_CHECK(streams.dim(1) == 4 && streams.dim(2) % 4 == 0, "no cuda kernel for hc_post with ", streams.dim(1),
             " streams of ", streams.dim(2), " (built for 4 streams, widths a multiple of 4)");
  launch_hc_post(streams.data_as<const float>(), a.data_as<const float>(), post.data_as<const float>(),
                 comb.data_as<const float>(), streams.dim(0), streams.dim(1), streams.dim(2), out.data_as<float>(),
                 impl_->stream);
  check_launch("hc_post");
}

void CudaBackend::hc_head(const ops::HcHeadArgs& a) {
  require_cuda_f32("hc_head", {&a.streams, &a.fn, &a.base, &a.scale, &a.out});
  HcParams p = hc_params(a.streams, a.fn, a.base, a.scale, a.params);
  p.early_fn = impl_->hc_early_fn;
  p.out = a.out.data_as<float>();
  if (run_library_hc(*impl_, p, true)) return;
  p.partial = static_cast<float*>(impl_->scratch(hc_partial_floats(p.T, p.hc, p.D, true) * sizeof(float)));
  launch_hc_head(p, impl_->stream);
  check_launch("hc_head");
}

int64_t CudaBackend::compressor_update(const ops::CompressorArgs& a) {
  require_cuda_f32("compressor_update", {&a.acc, &a.ape, &a.emitted});
  require_cuda_f32_rows("compressor_update", {&a.kv, &a.gate});
  const int64_t n = a.kv.dim(0);
  const int64_t count = ops::compressor_emit_count(a.start_pos, n, a.ratio);
  TERN_CHECK(count == 0 || (!a.emitted.empty() && a.emitted.dim(0) >= count), "cuda compressor_update: emitted ",
             a.emitted.shape().str(), " cannot hold ", count, " entries");
  CompressorParams p;
  p.acc = a.acc.data_as<float>();
  p.kv = a.kv.data_as<const float>();
  p.gate = a.gate.data_as<const float>();
  p.row_stride = a.kv.row_stride();  // gate's too (ops::compressor_update checks)
  p.ape = a.ape.data_as<const float>();
  p.n = n;
  p.width = a.acc.dim(2);
  p.start_pos = a.start_pos;
  p.ratio = a.ratio;
  p.overlap = a.overlap;
  p.emitted = a.emitted.empty() ? nullptr : a.emitted.data_as<float>();
  launch_compressor(p, impl_->stream);
  check_launch("compressor_update");
  return count;
}

namespace {

// The kernels' view of paged rows; the block table must be in device memory (the ops checked the rest).
PagedRowsDesc paged_desc(const char* op, const PagedRows& r) {
  if (r.empty()) return {};
  TERN_CHECK(r.pool.device() == Device::cuda && r.block_table.device() == Device::cuda, "cuda ", op,
             ": paged rows and their block table must be in device memory");
  return {r.pool.data_as<const uint8_t>(), r.block_table.data_as<const int32_t>(), r.page_bytes(), r.offset_in_page,
          r.rows_per_page, r.row_bytes};
}

IndexerParams indexer_params(const char* op, const ops::IndexerArgs& a) {
  IndexerParams p;
  p.q = a.q.data_as<const float>();
  p.weights = a.weights.data_as<const float>();
  p.keys = a.num_keys > 0 ? paged_desc(op, a.keys) : PagedRowsDesc{};
  p.n = a.q.dim(0);
  p.heads = a.q.dim(1);
  p.dim = a.q.dim(2);
  p.num_keys = a.num_keys;
  p.positions = a.positions.data_as<const int64_t>();
  p.ratio = a.ratio;
  check_indexer_shape(op, p);
  return p;
}

}  // namespace

void check_indexer_shape(const char* op, const IndexerParams& p) {
  TERN_CHECK(p.heads <= kMaxIndexerHeads && p.dim % 4 == 0, "no cuda kernel for op ", op, " with ", p.heads,
             " heads of ", p.dim, " dims (built for at most ", kMaxIndexerHeads, " heads, dims a multiple of 4)");
  const PagedRowsDesc& k = p.keys;
  TERN_CHECK(k.page_bytes % 16 == 0 && k.offset % 16 == 0 && k.row_bytes % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(k.pool) % 16 == 0,
             "cuda ", op, ": the key rows must be 16-byte aligned (page ", k.page_bytes, " bytes, offset ", k.offset,
             ", rows of ", k.row_bytes, ")");
}

void CudaBackend::indexer_scores(const ops::IndexerArgs& a, const TensorView& scores) {
  require_cuda_f32("indexer_scores", {&a.q, &a.weights, &scores});
  launch_indexer_scores(indexer_params("indexer_scores", a), scores.data_as<float>(), impl_->stream);
  check_launch("indexer_scores");
}

void CudaBackend::indexer_topk(const ops::IndexerArgs& a, int topk, const TensorView& indices) {
  require_cuda_f32("indexer_topk", {&a.q, &a.weights});
  TERN_CHECK(topk <= kMaxIndexerTopk, "cuda indexer_topk: topk ", topk, " exceeds the kernel's ", kMaxIndexerTopk);
  IndexerParams p = indexer_params("indexer_topk", a);
  p.fast_topk = impl_->topk_fast;
  auto* scores = static_cast<float*>(impl_->scratch(std::max<int64_t>(1, p.n * p.num_keys) * sizeof(float)));
  if (!run_library_indexer(*impl_, p, scores)) {
    launch_indexer_scores(p, scores, impl_->stream);
    check_launch("indexer_scores");
  }
  launch_indexer_topk(p, scores, topk, indices.data_as<int32_t>(), impl_->stream);
  check_launch("indexer_topk");
}

AttentionParams attention_params(const char* op, const TensorView& q, const ops::KvRowFormat& format,
                                 const TensorView& selected, const TensorView& sinks, float scale,
                                 const TensorView& out, const CudaBackend::Impl& impl) {
  require_cuda_f32(op, {&q, &sinks, &out});
  const int64_t hd = format.head_dim;
  TERN_CHECK(attention_built_for(hd) || (format.format == ops::KvFormat::f32 && hd <= kAttentionAnyMaxHeadDim),
             "no cuda kernel for op ", op, " with head_dim ", hd, " (built for 128, 256, 512; f32 rows of any head_dim "
             "up to ", kAttentionAnyMaxHeadDim, ")");
  TERN_CHECK(format.format != ops::KvFormat::fp8_ds || format.rope_dim % 4 == 0, "no cuda kernel for op ", op,
             " with FP8 rows and rope_dim ", format.rope_dim,
             " (the row decoder reads 8-byte granules: rope_dim must be a multiple of 4)");
  AttentionParams p;
  p.q = q.data_as<const float>();
  p.n = q.dim(0);
  p.heads = q.dim(1);
  p.fmt = kv_desc(format);
  p.selected = selected.empty() ? nullptr : selected.data_as<const int32_t>();
  p.k_sel = selected.empty() ? 0 : selected.dim(1);
  p.sinks = sinks.data_as<const float>();
  p.scale = scale;
  p.out = out.data_as<float>();
  p.err = impl.err();
  p.num_sms = impl.num_sms;
  p.split_keys = impl.attention_split_keys;
  return p;
}

void launch_attention(const char* op, AttentionParams& p, CudaBackend::Impl& impl) {
  const int64_t want = attention_partial_floats(p);
  if (want > 0) p.partial = static_cast<float*>(impl.scratch(want * sizeof(float)));
  check_cuda(launch_sparse_attention(p, impl.stream), op);
  check_launch(op);
}

namespace {
// sparse_attention's launch parameters but the output's.
AttentionParams chunk_attention_params(const char* op, const ops::AttentionArgs& a, const TensorView& out,
                                       CudaBackend::Impl& impl) {
  for (const TensorView* v : {&a.chunk_rows, &a.ring, &a.selected, &a.positions})
    TERN_CHECK(v->empty() || v->device() == Device::cuda, "cuda ", op, ": a tensor is on the host");
  AttentionParams p = attention_params(op, a.q, a.format, a.selected, a.sinks, a.scale, out, impl);
  p.start = a.start;
  p.chunk_rows = a.chunk_rows.data_as<const uint8_t>();
  p.ring = a.ring.data_as<const uint8_t>();
  p.window = a.window;
  const bool compressed = a.ratio > 0 && a.num_compressed > 0;
  p.compressed = compressed ? paged_desc(op, a.compressed) : PagedRowsDesc{};
  p.num_compressed = compressed ? a.num_compressed : 0;
  p.ratio = a.ratio;
  // A chunk whose products take the library GEMMs takes the prefill kernel too (attention_path): the same
  // decision, so --batch-invariant keeps every token on the decode kernel's bits.
  p.prefill = impl.library_for(p.n);
  return p;
}

// AttentionArgs::out_inv_freq handed to a kernel that rotates the output back in its epilogue.
void rotate_back_in_kernel(const ops::AttentionArgs& a, AttentionParams& p) {
  require_cuda_f32("sparse_attention", {&a.out_inv_freq});
  p.out_positions = a.positions.data_as<const int64_t>();
  p.out_inv_freq = a.out_inv_freq.data_as<const float>();
  p.out_rope_half = a.out_inv_freq.dim(0);
}

// AttentionArgs::q_inv_freq: q normed and rotated in the prefill kernels' q load, else by norm_rope into `normed`
// first (the same bits).
void take_q(CudaBackend& be, CudaBackend::Impl& impl, const ops::AttentionArgs& a, AttentionParams& p, Tensor& normed) {
  if (a.q_inv_freq.empty()) return;
  require_cuda_f32("sparse_attention", {&a.q_inv_freq});
  if (q_norm_fold_enabled() && attention_q_norm_in_kernel(p, a.q_inv_freq.dim(0))) {
    p.q_positions = a.positions.data_as<const int64_t>();
    p.q_inv_freq = a.q_inv_freq.data_as<const float>();
    p.q_rope_half = a.q_inv_freq.dim(0);
    p.q_norm_eps = a.q_norm_eps;
    return;
  }
  normed = impl.tensor(DType::f32, a.q.shape());
  be.norm_rope(a.q, TensorView(), a.q_norm_eps, a.positions, a.q_inv_freq, normed);
  p.q = normed.view().data_as<const float>();
}
}  // namespace

// AttentionArgs::q_inv_freq in the prefill kernels' q load, else norm_rope before; out_inv_freq in the prefill wgmma
// kernels' epilogue, else rope_kernel after (the same bits either way).
void CudaBackend::sparse_attention(const ops::AttentionArgs& a, const TensorView& out) {
  AttentionParams p = chunk_attention_params("sparse_attention", a, out, *impl_);
  Tensor normed;
  take_q(*this, *impl_, a, p, normed);
  const bool rope_back = !a.out_inv_freq.empty();
  const bool in_kernel = rope_back && attention_out_in_kernel(p, a.out_inv_freq.dim(0));
  if (in_kernel) rotate_back_in_kernel(a, p);
  launch_attention("sparse_attention", p, *impl_);
  if (rope_back && !in_kernel) rope(out, a.positions, a.out_inv_freq, /*inverse=*/true);
}

// The prefill wgmma kernels quantise in their epilogue (attention_out_in_kernel); elsewhere the f32 output, then
// act_quant (the same bytes: the epilogue runs act_quant's arithmetic on the same floats).
void CudaBackend::sparse_attention_fp8(const ops::AttentionArgs& a, const ops::Fp8Rows& out) {
  TERN_CHECK(out.values.device() == Device::cuda, "cuda sparse_attention: the FP8 rows are on the host");
  const int64_t n = a.q.dim(0), heads = a.q.dim(1), hd = a.format.head_dim;
  Tensor o32;
  AttentionParams p = chunk_attention_params("sparse_attention", a, a.q, *impl_);  // (out set below)
  const int64_t half = a.out_inv_freq.empty() ? 0 : a.out_inv_freq.dim(0);
  if (!attention_out_in_kernel(p, half)) {
    o32 = impl_->tensor(DType::f32, {n, heads, hd});
    sparse_attention(a, o32);
    act_quant_rows(o32.view().reshape({n, heads * hd}), out);
    return;
  }
  Tensor normed;
  take_q(*this, *impl_, a, p, normed);
  p.out = nullptr;
  p.out_q = out.values.data_as<uint8_t>();
  p.out_scales = out.scales.data_as<float>();
  p.out_scale_ld = out.scales.row_stride();
  if (half > 0) rotate_back_in_kernel(a, p);
  launch_attention("sparse_attention (FP8 rows out)", p, *impl_);
}

void CudaBackend::route_scored(const TensorView& logits, const TensorView& bias, float routed_scale,
                               const TensorView& indices, const TensorView& weights) {
  require_cuda_f32("route_scored", {&logits, &bias, &weights});
  TERN_CHECK(logits.dim(1) <= 1024 && indices.dim(1) <= 32, "cuda route_scored: at most 1024 experts and 32 picks");
  launch_route_scored(logits.data_as<const float>(), bias.data_as<const float>(), logits.dim(0), logits.dim(1),
                      static_cast<int>(indices.dim(1)), routed_scale, indices.data_as<int32_t>(),
                      weights.data_as<float>(), impl_->err(), impl_->route_regs, impl_->stream);
  check_launch("route_scored");
}

void CudaBackend::route_hash(const TensorView& logits, const TensorView& tid2eid, const TensorView& token_ids,
                             float routed_scale, const TensorView& indices, const TensorView& weights) {
  require_cuda_f32("route_hash", {&logits, &weights});
  TERN_CHECK(tid2eid.device() == Device::cuda && token_ids.device() == Device::cuda,
             "cuda route_hash: tid2eid and token_ids must be in device memory");
  TERN_CHECK(indices.dim(1) <= 32, "cuda route_hash: at most 32 picks");
  launch_route_hash(logits.data_as<const float>(), tid2eid.data(), tid2eid.dtype() == DType::i64, tid2eid.dim(0),
                    token_ids.data_as<const int64_t>(), logits.dim(0), logits.dim(1),
                    static_cast<int>(indices.dim(1)), routed_scale, indices.data_as<int32_t>(),
                    weights.data_as<float>(), impl_->err(), impl_->stream);
  check_launch("route_hash");
}

namespace {

// Field by field (a memcmp would also compare the struct's padding bytes).
bool same_descs(const std::vector<ExpertDesc>& a, const std::vector<ExpertDesc>& b) {
  if (a.size() != b.size()) return false;
  for (size_t e = 0; e < a.size(); ++e)
    for (int i = 0; i < 3; ++i)
      if (a[e].w[i] != b[e].w[i] || a[e].s[i] != b[e].s[i] || a[e].global_scale[i] != b[e].global_scale[i])
        return false;
  return true;
}

// The device table of the experts' pointers: rebuilt whenever any pointer or scale of the list differs from
// what the cached table holds (host work only, 3 descriptors an expert), never while a graph is recorded
// (the graph would keep the table it saw).
const CudaBackend::Impl::ExpertTable& expert_table(CudaBackend::Impl& impl, std::span<const ops::Expert> experts) {
  const auto key = std::make_pair(static_cast<const void*>(experts.data()), experts.size());
  std::vector<ExpertDesc> host(experts.size());
  bool aligned = true;
  for (size_t e = 0; e < experts.size(); ++e) {
    const ops::Weight* ws[3] = {&experts[e].w1, &experts[e].w2, &experts[e].w3};
    for (int i = 0; i < 3; ++i) {
      const DeviceMat m = device_mat(*ws[i]);
      host[e].w[i] = m.w;
      host[e].s[i] = m.s;
      host[e].global_scale[i] = m.global_scale;
      aligned = aligned && reinterpret_cast<uintptr_t>(m.w) % 16 == 0 && reinterpret_cast<uintptr_t>(m.s) % 16 == 0;
    }
  }
  auto it = impl.expert_tables.find(key);
  if (it != impl.expert_tables.end() && same_descs(it->second.host, host)) return it->second;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  TERN_CUDA(cudaStreamIsCapturing(impl.stream, &capturing));
  TERN_CHECK(capturing == cudaStreamCaptureStatusNone,
             "cuda moe_experts: the expert table must be built before a CUDA graph is recorded (run the layer "
             "eagerly once first)");
  DeviceBuffer buf(host.size() * sizeof(ExpertDesc));
  // On the backend's stream, so that its kernels (the fold check at once) are ordered after the copy; from pageable
  // memory the call returns once `host` is staged.
  TERN_CUDA(cudaMemcpyAsync(buf.data(), host.data(), buf.size(), cudaMemcpyHostToDevice, impl.stream));
  // The e4m3 grouped kernels fold each row's MXFP4 scales per 128 columns: whether these experts allow it, once
  // (a scan of ~200 MB and a synchronisation a V4-Flash layer, ~0.1 ms once: 4 ms for the model's first forward).
  const DeviceMat m1 = device_mat(experts[0].w1);
  const int64_t D = experts[0].w1.in, inter = experts[0].w1.out;
  const bool fold_ok = m1.kind == WeightFormat::mxfp4 && !m1.scale_f32 && D % 128 == 0 && inter % 128 == 0 &&
                       moe_e4m3_fold_ok(static_cast<const ExpertDesc*>(buf.data()), static_cast<int64_t>(host.size()),
                                        D, inter, impl.stream);
  auto& table = impl.expert_tables[key];
  table = CudaBackend::Impl::ExpertTable{std::move(buf), std::move(host), aligned, fold_ok};
  return table;
}

// The params of a moe_experts call as far as the host knows them (no device pointers needed).
MoeParams moe_shape(const ops::Weight& w1, const ops::Weight& w2, int64_t T, int64_t k) {
  const DeviceMat m1 = device_mat(w1), m2 = device_mat(w2);
  MoeParams p;
  p.T = T;
  p.D = w1.in;
  p.inter = w1.out;
  p.k = static_cast<int>(k);
  p.kind = m1.kind;
  p.scale_f32 = m1.scale_f32 || m2.scale_f32;
  return p;
}

// moe_experts' paths once its params (and the shared output's join: p.combine_waits) are set: the exact
// experts, the bulk kernels with x and h quantised as staged, the grouped kernels, the library, else
// launch_moe.
void run_moe_paths(CudaBackend::Impl& impl, const ops::MoeExpertsArgs& a, MoeParams& p) {
  const ops::Expert& e0 = a.experts[0];
  // The routing runs in launch_moe's plan kernel where that kernel can take it (fused below), else first, alone.
  const bool route_fusable = p.route.tid2eid != nullptr || (impl.route_regs && route_in_registers(p.E, p.k));
  const auto route_alone = [&] {
    launch_moe_route(p, impl.route_regs, impl.stream);
    check_launch(p.route.tid2eid != nullptr ? "route_hash" : "route_scored");
    p.route = MoeRoute{};
  };
  if (p.T == 0) {  // nothing to combine; the branch is still joined
    if (p.combine_waits != nullptr) TERN_CUDA(cudaStreamWaitEvent(impl.stream, p.combine_waits, 0));
    return;
  }
  const CudaBackend::Impl::ExpertTable& table = expert_table(impl, a.experts);
  p.experts = static_cast<const ExpertDesc*>(table.table.data());
  p.experts_aligned = table.aligned;
  p.e4m3_fold_ok = table.e4m3_fold_ok;
  p.variant = impl.moe_variant;
  p.early_down = impl.moe_early_down;
  p.resident = impl.moe_resident;
  p.claims = impl.moe_claims;
  // --activations f32: every expert exact (f32 CUDA-core products, no bf16 operand).
  for (const ops::Expert& e : a.experts)
    TERN_CHECK(e.w1.exact == e0.w1.exact && e.w2.exact == e0.w1.exact && e.w3.exact == e0.w1.exact,
               "cuda moe_experts: the experts must all be exact or all not (", e.w1.name, " differs)");
  if (e0.w1.exact) {
    route_alone();
    TERN_CHECK(!e0.w1.act_fp8,
               "cuda moe_experts: exact experts take x as it is (--activations fp8 and f32 exclude "
               "each other)");
    TERN_CHECK(moe_exact_smem_bytes(p) <= kMoeExactMaxSmem,
               "no cuda kernel for op moe_experts (exact experts of ", p.D, " -> ", p.inter,
               ": more shared memory than a block has)");
    launch_moe_exact(p, impl.scratch(moe_exact_workspace_bytes(p)), impl.stream);
    check_launch("moe_experts (exact)");
    return;
  }
  TERN_CHECK(moe_kind_supported(p.kind, p.D, p.inter), "no cuda kernel for op moe_experts (",
             ops::weight_format_name(e0.w1.format), " experts of ", p.D, " -> ", p.inter, ")");
  // TERN_MOE_FUSED_PLAN: launch_moe's plan kernel can take the routing and x's quantisation (moe_prep_kernel) at up to
  // moe_prep_max_tokens() tokens, and plans in 256 threads up to kMoeSmallPlanMaxTokens.
  const bool prep = impl.moe_fused_plan && moe_prep_supported(p.T, p.E);
  p.small_plan = impl.moe_fused_plan && p.T <= kMoeSmallPlanMaxTokens;
  // --activations fp8: x quantised before the expert kernels (by the plan kernel, x_from, or alone), h by every path
  // between its up and down products (MoeParams::act_fp8); with TERN_MOE_STAGE_QUANT a call the bulk kernels take has
  // them quantise both as they stage them (MoeParams::stage_quant), with TERN_MOE_STAGE_QUANT_H h alone
  // (stage_quant_h). Neither the grouped kernels (from moe_grouped_min_tokens) nor the library (from
  // kLibraryMinTokens, above the bulk range) take such a call.
  Tensor xq;
  if (e0.w1.act_fp8) {
    TERN_CHECK(p.D % 128 == 0 && p.inter % 128 == 0,
               "cuda moe_experts: --activations fp8 needs the hidden size (", p.D, ") and the expert width (",
               p.inter, ") to be multiples of 128");
    p.act_fp8 = true;
    if (impl.moe_stage_quant && moe_bulk_taken(p) && !impl.library_for(p.T) &&
        !(impl.moe_grouped_for(p.T) && moe_grouped_supported(p))) {
      p.stage_quant = true;
      if (!prep || !route_fusable) route_alone();
      launch_moe(p, impl.scratch(moe_workspace_bytes(p)), impl.num_sms, impl.stream);
      check_launch("moe_experts (x and h quantised as staged)");
      ++impl.moe_stage_quant_calls;
      return;
    }
    xq = impl.tensor(DType::f32, {p.T, p.D});
    p.x_from = p.x;
    p.x = xq.data<float>();
  }
  // The prep kernel takes the routing and x's quantisation unless the grouped kernels or the library take the call
  // (their own plans).
  const bool plan_path = !grouped_moe_takes(impl, p) && !library_moe_takes(impl, p);
  const bool fused = prep && plan_path;
  if (!fused || !route_fusable) route_alone();
  if (!fused && p.x_from != nullptr) {
    launch_act_fake_quant(ActRows{p.x_from, p.T, p.D, p.D}, xq.data<float>(), p.D, impl.stream);
    check_launch("act_fake_quant");
    p.x_from = nullptr;
  }
  p.stage_quant_h = plan_path && p.act_fp8 && impl.moe_stage_quant_h && moe_bulk_taken(p);
  if (run_grouped_moe(impl, p) || run_library_moe(impl, p, a.experts)) return;
  void* ws = impl.scratch(moe_workspace_bytes(p));
  launch_moe(p, ws, impl.num_sms, impl.stream);
  check_launch("moe_experts");
}

}  // namespace

void CudaBackend::moe_experts(const ops::MoeExpertsArgs& a) {
  require_cuda_f32("moe_experts", {&a.x, &a.weights, &a.out});
  TERN_CHECK(a.indices.device() == Device::cuda, "cuda moe_experts: indices are on the host");
  const ops::Expert& e0 = a.experts[0];
  for (const ops::Expert& e : a.experts)
    TERN_CHECK(e.w1.format == e0.w1.format && e.w2.format == e0.w1.format && e.w3.format == e0.w1.format &&
                   e.w1.out == e0.w1.out && e.w1.scale.dtype() == e0.w1.scale.dtype(),
               "cuda moe_experts: every expert must share one format and shape (", e.w1.name, " differs)");
  MoeParams p = moe_shape(e0.w1, e0.w2, a.x.dim(0), a.indices.dim(1));
  const ops::MoeRouting& rt = a.route;
  if (!rt.logits.empty()) {  // the routing runs here (run_moe_paths: in the plan kernel or alone)
    require_cuda_f32("moe_experts (routing)", {&rt.logits});
    TERN_CHECK(a.indices.dim(1) <= 32, "cuda moe_experts: at most 32 picks");
    p.route.logits = rt.logits.data_as<const float>();
    if (rt.hashed()) {
      TERN_CHECK(rt.tid2eid.device() == Device::cuda && rt.token_ids.device() == Device::cuda,
                 "cuda moe_experts: tid2eid and token_ids must be in device memory");
      p.route.tid2eid = rt.tid2eid.data();
      p.route.tid2eid_i64 = rt.tid2eid.dtype() == DType::i64;
      p.route.vocab = rt.tid2eid.dim(0);
      p.route.token_ids = rt.token_ids.data_as<const int64_t>();
    } else {
      require_cuda_f32("moe_experts (routing)", {&rt.bias});
      p.route.bias = rt.bias.data_as<const float>();
    }
    p.route.scale = rt.routed_scale;
    p.route.indices = a.indices.data_as<int32_t>();
    p.route.weights = a.weights.data_as<float>();
  }
  p.x = a.x.data_as<const float>();
  p.D = a.x.dim(1);
  p.indices = a.indices.data_as<const int32_t>();
  p.weights = a.weights.data_as<const float>();
  p.E = static_cast<int64_t>(a.experts.size());
  p.limit = a.limit;
  p.out = a.out.data_as<float>();
  p.err = impl_->err();
  TERN_CHECK(p.E <= 1024, "cuda moe_experts: at most 1024 experts");
  // a.shared: the combine adds it, after the side branch that writes it (the branch's join, which the model
  // issued after moe_experts and before its add, moves to just before the combine: p.combine_waits). The
  // arena's branch ends (side_join, with nothing left pending) once the path has enqueued that wait, so no
  // tensor of the routed products takes a block the branch still uses. On an error the caller's capture is
  // abandoned (abandon_branch).
  const bool shared = !a.shared.empty();
  if (shared) {
    require_cuda_f32("moe_experts", {&a.shared});
    TERN_CHECK(!impl_->in_side, "cuda moe_experts: a shared output inside the side branch itself");
    p.residual = a.shared.data_as<const float>();
    if (impl_->side_pending) p.combine_waits = impl_->join_event;
    impl_->side_pending = false;
  }
  run_moe_paths(*impl_, a, p);
  if (shared) side_join();
}

int CudaBackend::moe_variants() { return moe_variant_count(); }

std::string CudaBackend::moe_variant_name(int variant) { return cuda::moe_variant_name(variant); }

void CudaBackend::set_moe_variant(int variant) {
  TERN_CHECK(variant >= 0 && variant < moe_variant_count(), "cuda: no moe variant ", variant);
  impl_->moe_variant = variant;
}

namespace {

// The grouped kernels a prefill chunk's experts take (TERN_MOE_GROUPED may force one).
std::string grouped_moe_name(const MoeParams& p, std::string_view forced, bool act_fp8) {
  if (forced == "wgmma") return moe_grouped_wgmma_path_name(p);
  if (forced == "e4m3") {
    if (!act_fp8 || p.kind != WeightFormat::mxfp4) return moe_grouped_wgmma_path_name(p);
    return cat(moe_grouped_e4m3_path_name(p), " where the layer's MXFP4 scales fold (within 2^8 in 128 columns), else ",
               moe_grouped_wgmma_path_name(p));
  }
  if (forced == "mma") return moe_grouped_path_name(p);
  return cat("from ", kMoeWgmmaMinPairs, " mean pairs an expert ", moe_grouped_wgmma_path_name(p), "; below ",
             moe_grouped_path_name(p));
}

}  // namespace

std::string CudaBackend::moe_path(const ops::Weight& w1, int64_t T, int64_t k) const {
  if (w1.exact) return "moe_exact (f32 CUDA cores, one block a pick) + moe_combine";
  // Device allocations are 256-byte aligned: what the bulk kernels need of the expert pointers.
  MoeParams p = moe_shape(w1, w1, T, k);
  p.experts_aligned = true;
  p.variant = impl_->moe_variant;
  p.resident = impl_->moe_resident;
  p.claims = impl_->moe_claims;
  // The grouped kernels' tile depends on the pairs per expert, unknown here (E = 0: the name says both tiles).
  if (impl_->moe_grouped_for(T) && !impl_->moe_library_forced(T) && moe_grouped_supported(p)) {
    const std::string_view forced = moe_grouped_kernel_forced();
    if (moe_l2_hint() != 0)
      return cat(grouped_moe_name(p, forced, w1.act_fp8), "; weights copied with an L2 prefetch of ", moe_l2_hint(),
                 " bytes (TERN_MOE_L2_HINT)");
    return grouped_moe_name(p, forced, w1.act_fp8);
  }
  // TERN_MOE_FUSED_PLAN: moe_experts' routing (MoeExpertsArgs::route) and --activations fp8's quantisation of x in
  // the plan's launch, or the plan alone in 256 threads (run_moe_paths; either up to 256 experts).
  if (!impl_->moe_fused_plan || T > kMoeSmallPlanMaxTokens) return moe_path_name(p);
  return cat(moe_path_name(p), T <= moe_prep_max_tokens()
                                   ? "; the plan as moe_prep_kernel (routing and x's FP8 quantisation in its launch)"
                                   : "; the plan in 256 threads (moe_plan_kernel_small) up to 256 experts");
}

}  // namespace tern::cuda
