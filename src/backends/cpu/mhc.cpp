// mHC: the mixing logits, Sinkhorn, stream collapse and expansion, and the final hc_head collapse.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "core/thread_pool.h"

namespace tern::cpu {
namespace {

// m[j] = (fn[j] . flat) * rsqrt(mean(flat^2) + eps) for the rows of fn.
void mixing_logits(const float* flat, int64_t n, const float* fn, int64_t mix, float eps, float* m) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < n; ++i) sum_sq += static_cast<double>(flat[i]) * flat[i];
  const float inv_rms = 1.0f / std::sqrt(static_cast<float>(sum_sq / n) + eps);
  for (int64_t j = 0; j < mix; ++j) m[j] = dot(fn + j * n, flat, n) * inv_rms;
}

// C (hc x hc, row-major, C[j][k]) from its logits: softmax over each row, + eps, then Sinkhorn: columns
// first, then (iters - 1) x (rows, columns).
void sinkhorn(float* c, int64_t hc, int iters, float eps) {
  for (int64_t j = 0; j < hc; ++j) {
    float top = c[j * hc];
    for (int64_t k = 1; k < hc; ++k) top = std::max(top, c[j * hc + k]);
    float sum = 0.0f;
    for (int64_t k = 0; k < hc; ++k) sum += c[j * hc + k] = std::exp(c[j * hc + k] - top);
    for (int64_t k = 0; k < hc; ++k) c[j * hc + k] = c[j * hc + k] / sum + eps;
  }
  auto normalize_columns = [&] {
    for (int64_t k = 0; k < hc; ++k) {
      float sum = 0.0f;
      for (int64_t j = 0; j < hc; ++j) sum += c[j * hc + k];
      for (int64_t j = 0; j < hc; ++j) c[j * hc + k] /= sum + eps;
    }
  };
  auto normalize_rows = [&] {
    for (int64_t j = 0; j < hc; ++j) {
      float sum = 0.0f;
      for (int64_t k = 0; k < hc; ++k) sum += c[j * hc + k];
      for (int64_t k = 0; k < hc; ++k) c[j * hc + k] /= sum + eps;
    }
  };
  normalize_columns();
  for (int i = 1; i < iters; ++i) {
    normalize_rows();
    normalize_columns();
  }
}

// post [hc] and comb [hc, hc] of one token from its mixing logits m [(2+hc)*hc].
void post_and_comb(const float* m, int64_t hc, const float* base, const float* scale, const ops::HcParams& p,
                   float* post, float* comb) {
  for (int64_t i = 0; i < hc; ++i) post[i] = 2.0f * sigmoid(m[hc + i] * scale[1] + base[hc + i]);
  for (int64_t i = 0; i < hc * hc; ++i) comb[i] = m[2 * hc + i] * scale[2] + base[2 * hc + i];
  sinkhorn(comb, hc, p.sinkhorn_iters, p.hc_eps);
}

}  // namespace

void CpuBackend::hc_comb(const ops::HcCombArgs& a) {
  require_f32("hc_comb", {&a.logits, &a.base, &a.scale, &a.post, &a.comb});
  const int64_t T = a.post.dim(0), hc = a.post.dim(1), mix = (2 + hc) * hc;
  parallel_for(0, T, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t)
      post_and_comb(a.logits.data_as<const float>() + t * mix, hc, a.base.data_as<const float>(),
                    a.scale.data_as<const float>(), a.params, a.post.data_as<float>() + t * hc,
                    a.comb.data_as<float>() + t * hc * hc);
  });
}

void CpuBackend::hc_pre(const ops::HcPreArgs& a) {
  const bool apart = !a.logits.empty();  // post and comb left to hc_comb (the dispatcher allows one form)
  require_f32("hc_pre", {&a.streams, &a.post, &a.comb, &a.logits, &a.collapsed});  // (empty views are skipped)
  // The folded hc_post first: the reference is the two ops in sequence.
  if (a.has_prev()) hc_post(a.prev_streams, a.prev_a, a.prev_post, a.prev_comb, a.streams);
  const int64_t T = a.streams.dim(0), hc = a.streams.dim(1), D = a.streams.dim(2), mix = (2 + hc) * hc;
  const float* fn = a.fn.data_as<const float>();
  const float* base = a.base.data_as<const float>();
  const float* scale = a.scale.data_as<const float>();
  const ops::HcParams& p = a.params;
  parallel_for(0, T, [&](int64_t lo, int64_t hi) {
    std::vector<float> m(mix), pre(hc);
    for (int64_t t = lo; t < hi; ++t) {
      const float* X = a.streams.data_as<const float>() + t * hc * D;  // [hc, D]
      mixing_logits(X, hc * D, fn, mix, p.norm_eps, m.data());
      for (int64_t i = 0; i < hc; ++i) pre[i] = sigmoid(m[i] * scale[0] + base[i]) + p.hc_eps;
      if (apart)
        std::copy(m.begin(), m.end(), a.logits.data_as<float>() + t * mix);
      else
        post_and_comb(m.data(), hc, base, scale, p, a.post.data_as<float>() + t * hc,
                      a.comb.data_as<float>() + t * hc * hc);
      float* out = a.collapsed.data_as<float>() + t * D;  // sum_i pre_i X_i
      for (int64_t d = 0; d < D; ++d) {
        float acc = 0.0f;
        for (int64_t i = 0; i < hc; ++i) acc += pre[i] * X[i * D + d];
        out[d] = acc;
      }
    }
  });
  if (a.normed) rms_norm(a.collapsed, a.norm, a.rms_eps, a.collapsed);
}

void CpuBackend::hc_post(const TensorView& streams, const TensorView& a, const TensorView& post,
                         const TensorView& comb, const TensorView& out) {
  require_f32("hc_post", {&streams, &a, &post, &comb, &out});
  const int64_t T = streams.dim(0), hc = streams.dim(1), D = streams.dim(2);
  parallel_for(0, T, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const float* X = streams.data_as<const float>() + t * hc * D;
      const float* y = a.data_as<const float>() + t * D;
      const float* pw = post.data_as<const float>() + t * hc;
      const float* C = comb.data_as<const float>() + t * hc * hc;
      float* o = out.data_as<float>() + t * hc * D;
      for (int64_t k = 0; k < hc; ++k)  // X'_k = post_k a + sum_j C[j][k] X_j
        for (int64_t d = 0; d < D; ++d) {
          float mixed = 0.0f;
          for (int64_t j = 0; j < hc; ++j) mixed += C[j * hc + k] * X[j * D + d];
          o[k * D + d] = pw[k] * y[d] + mixed;
        }
    }
  });
}

void CpuBackend::hc_head(const ops::HcHeadArgs& a) {
  require_f32("hc_head", {&a.streams, &a.out});
  const int64_t T = a.streams.dim(0), hc = a.streams.dim(1), D = a.streams.dim(2);
  const float scale = a.scale.data_as<const float>()[0];
  const float* base = a.base.data_as<const float>();
  parallel_for(0, T, [&](int64_t lo, int64_t hi) {
    std::vector<float> m(hc);
    for (int64_t t = lo; t < hi; ++t) {
      const float* X = a.streams.data_as<const float>() + t * hc * D;
      mixing_logits(X, hc * D, a.fn.data_as<const float>(), hc, a.params.norm_eps, m.data());
      for (int64_t i = 0; i < hc; ++i) m[i] = sigmoid(m[i] * scale + base[i]) + a.params.hc_eps;
      float* o = a.out.data_as<float>() + t * D;
      for (int64_t d = 0; d < D; ++d) {
        float acc = 0.0f;
        for (int64_t i = 0; i < hc; ++i) acc += m[i] * X[i * D + d];
        o[d] = acc;
      }
    }
  });
}

}  // namespace tern::cpu
