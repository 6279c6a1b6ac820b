// Sparse attention over window + compressed rows, and the lightning indexer.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "core/thread_pool.h"

namespace tern::cpu {
namespace {

// f32 views of the kv rows the chunk can reach: the chunk's rows, the ring, and the compressed rows.
// f32 rows are used in place; FP8 rows are decoded once here, not once per head.
class KeyRows {
 public:
  explicit KeyRows(const ops::AttentionArgs& a) : a_(a), rb_(a.format.row_bytes()) {
    decode_all([&](int64_t r) { return contiguous(a.chunk_rows, r); }, a.q.dim(0), chunk_);
    decode_all([&](int64_t r) { return contiguous(a.ring, r); }, a.window, ring_);
    if (a.ratio > 0) decode_all([&](int64_t r) { return paged(r); }, a.num_compressed, compressed_);
  }
  // Row of the window key at position j (start - window <= j < start + n).
  const float* window_row(int64_t j) const {
    return j >= a_.start ? row(contiguous(a_.chunk_rows, j - a_.start), chunk_, j - a_.start)
                         : row(contiguous(a_.ring, j % a_.window), ring_, j % a_.window);
  }
  const float* compressed_row(int64_t w) const { return row(paged(w), compressed_, w); }

 private:
  const std::byte* contiguous(const TensorView& rows, int64_t r) const {
    return rows.data_as<const std::byte>() + r * rb_;
  }
  const std::byte* paged(int64_t w) const { return a_.compressed.row(w); }
  template <typename RowAt>
  void decode_all(RowAt&& row_at, int64_t count, std::vector<float>& out) {
    if (a_.format.format == ops::KvFormat::f32 || count == 0) return;
    const int64_t hd = a_.format.head_dim;
    out.resize(count * hd);
    parallel_for(
        0, count,
        [&](int64_t lo, int64_t hi) {
          for (int64_t r = lo; r < hi; ++r) ops::decode_kv_row(row_at(r), a_.format, out.data() + r * hd);
        },
        16);
  }
  // f32 rows are used in place; FP8 rows from their decoded copy.
  const float* row(const std::byte* bytes, const std::vector<float>& decoded, int64_t r) const {
    if (a_.format.format == ops::KvFormat::f32) return reinterpret_cast<const float*>(bytes);
    return decoded.data() + r * a_.format.head_dim;
  }

  const ops::AttentionArgs& a_;
  int64_t rb_;
  std::vector<float> chunk_, ring_, compressed_;
};

// The keys of query i: its window, then its compressed entries.
std::vector<const float*> keys_of(const ops::AttentionArgs& a, const KeyRows& rows, int64_t i) {
  const int64_t p = a.start + i;
  std::vector<const float*> keys;
  for (int64_t j = std::max<int64_t>(0, p - a.window + 1); j <= p; ++j) keys.push_back(rows.window_row(j));
  if (a.ratio == 0) return keys;
  const int64_t visible = std::min(a.num_compressed, (p + 1) / a.ratio);
  if (a.selected.empty()) {
    for (int64_t w = 0; w < visible; ++w) keys.push_back(rows.compressed_row(w));
    return keys;
  }
  const int64_t k = a.selected.dim(1);
  const int32_t* picks = a.selected.data_as<const int32_t>() + i * k;
  for (int64_t j = 0; j < k; ++j) {
    if (picks[j] < 0) continue;
    TERN_CHECK(picks[j] < visible, "sparse_attention: query at position ", p, " selected compressed entry ",
               picks[j], " but only ", visible, " are visible");
    keys.push_back(rows.compressed_row(picks[j]));
  }
  return keys;
}

}  // namespace

void CpuBackend::sparse_attention(const ops::AttentionArgs& args, const TensorView& out) {
  ops::AttentionArgs a = args;
  Tensor normed;
  if (!a.q_inv_freq.empty()) {  // q as wq_b wrote it (AttentionArgs::q_inv_freq): norm_rope first
    normed = Tensor(DType::f32, a.q.shape());
    norm_rope(a.q, TensorView(), a.q_norm_eps, a.positions, a.q_inv_freq, normed);
    a.q = normed;
  }
  require_f32("sparse_attention", {&a.q, &a.sinks, &out});
  const int64_t n = a.q.dim(0), heads = a.q.dim(1), hd = a.format.head_dim;
  const KeyRows rows(a);
  parallel_for(0, n * heads, [&](int64_t lo, int64_t hi) {
    std::vector<const float*> keys;
    std::vector<float> logits;
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t i = item / heads, h = item % heads;
      if (item == lo || h == 0) keys = keys_of(a, rows, i);
      const float* q = a.q.data_as<const float>() + item * hd;
      const float sink = a.sinks.data_as<const float>()[h];
      logits.resize(keys.size());
      float top = sink;
      for (size_t j = 0; j < keys.size(); ++j) top = std::max(top, logits[j] = dot(q, keys[j], hd) * a.scale);
      float denom = std::exp(sink - top);  // the sink only enlarges the denominator
      for (float& l : logits) denom += l = std::exp(l - top);
      float* o = out.data_as<float>() + item * hd;
      std::fill(o, o + hd, 0.0f);
      for (size_t j = 0; j < keys.size(); ++j) {
        const float p = logits[j] / denom;
        for (int64_t d = 0; d < hd; ++d) o[d] += p * keys[j][d];
      }
    }
  });
  if (!a.out_inv_freq.empty()) rope(out, a.positions, a.out_inv_freq, /*inverse=*/true);
}

void CpuBackend::sparse_attention_fp8(const ops::AttentionArgs& a, const ops::Fp8Rows& out) {
  const int64_t n = a.q.dim(0), heads = a.q.dim(1), hd = a.format.head_dim;
  Tensor o(DType::f32, {n, heads, hd});
  sparse_attention(a, o);
  act_quant_rows(o.view().reshape({n, heads * hd}), out);
}

void CpuBackend::indexer_scores(const ops::IndexerArgs& a, const TensorView& scores) {
  require_f32("indexer_scores", {&a.q, &a.weights, &scores});
  const int64_t n = a.q.dim(0), heads = a.q.dim(1), dim = a.q.dim(2), S = a.num_keys;
  const float head_scale = 1.0f / std::sqrt(static_cast<float>(heads));
  const float dot_scale = 1.0f / std::sqrt(static_cast<float>(dim));
  parallel_for(0, n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t visible = (a.positions.data_as<const int64_t>()[i] + 1) / a.ratio;
      const float* w = a.weights.data_as<const float>() + i * heads;
      float* out = scores.data_as<float>() + i * S;
      for (int64_t s = 0; s < S; ++s) {
        if (s >= visible) {
          out[s] = -std::numeric_limits<float>::infinity();
          continue;
        }
        const auto* key = reinterpret_cast<const float*>(a.keys.row(s));
        float score = 0.0f;
        for (int64_t h = 0; h < heads; ++h) {
          const float relu =
              std::max(0.0f, dot(a.q.data_as<const float>() + (i * heads + h) * dim, key, dim));
          score += (relu * dot_scale) * (w[h] * head_scale);
        }
        out[s] = score;
      }
    }
  });
}

void CpuBackend::indexer_topk(const ops::IndexerArgs& a, int topk, const TensorView& indices) {
  const int64_t n = a.q.dim(0), S = a.num_keys;
  Tensor scores(DType::f32, {n, S});
  indexer_scores(a, scores);
  for (int64_t i = 0; i < n; ++i) {
    const float* sc = scores.data<float>() + i * S;
    const int64_t visible = std::min(S, (a.positions.data_as<const int64_t>()[i] + 1) / a.ratio);
    std::vector<int32_t> order(visible);
    std::iota(order.begin(), order.end(), 0);
    const int64_t keep = std::min<int64_t>(topk, visible);
    std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                      [&](int32_t x, int32_t y) { return sc[x] > sc[y] || (sc[x] == sc[y] && x < y); });
    int32_t* out = indices.data_as<int32_t>() + i * topk;
    for (int64_t j = 0; j < topk; ++j) out[j] = j < keep ? order[j] : -1;
  }
}

}  // namespace tern::cpu
