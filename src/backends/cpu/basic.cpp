// Registration and the small ops: embedding, add, swiglu, gather, RMSNorm, RoPE, kv row packing.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "core/dtype.h"
#include "core/thread_pool.h"

namespace tern::cpu {

CpuBackend& backend() {
  static CpuBackend instance;
  return instance;
}

const ops::Context& context() {
  static const ops::Context ctx(backend(), Device::cpu);
  return ctx;
}

std::vector<std::string> CpuBackend::kernel_paths() const {
  std::vector<std::string> out;
  for (const char* op : {"embedding", "rms_norm", "rope", "linear / grouped_linear (f32, bf16, fp8 block, mxfp4, nvfp4)",
                         "hc_pre / hc_post / hc_head", "kv_pack / kv_unpack", "compressor_update",
                         "indexer_scores / indexer_topk", "sparse_attention", "route_scored / route_hash",
                         "moe_experts (mxfp4 / nvfp4 / fp8 / bf16)",
                         "step_attention / step_compressor / step_indexer_topk / store_ring_rows / "
                         "store_paged_rows (per slot: the eager op)"})
    out.push_back(cat(op, ": cpu reference (fp32 accumulation, threaded loops, ", thread_count(), " threads)"));
  return out;
}

void CpuBackend::require_f32(std::string_view op, std::initializer_list<const TensorView*> views) const {
  for (const TensorView* v : views)
    if (!v->empty() && v->dtype() != DType::f32) no_kernel(op, v->dtype());
}

Tensor CpuBackend::transient(DType dtype, Shape shape, Device device) const {
  if (device == Device::cpu) return Tensor(dtype, shape);
  return stand_in_ != nullptr ? Tensor(dtype, shape, device, *stand_in_) : Tensor(dtype, shape, device);
}

void CpuBackend::embedding(const TensorView& table, const TensorView& ids, const TensorView& out) {
  require_f32("embedding", {&out});
  const int64_t vocab = table.dim(0), D = table.dim(1);
  const auto* id = ids.data_as<const int64_t>();
  float* o = out.data_as<float>();
  for (int64_t t = 0; t < ids.dim(0); ++t) {
    TERN_CHECK(id[t] >= 0 && id[t] < vocab, "embedding: token id ", id[t], " outside the vocabulary [0, ",
               vocab, ")");
    if (table.dtype() == DType::f32) {
      std::memcpy(o + t * D, table.data_as<const float>() + id[t] * D, D * sizeof(float));
    } else {
      const uint16_t* row = table.data_as<const uint16_t>() + id[t] * D;
      for (int64_t d = 0; d < D; ++d) o[t * D + d] = bf16_to_f32(row[d]);
    }
  }
}

void CpuBackend::add(const TensorView& x, const TensorView& y) {
  require_f32("add", {&x, &y});
  const float* a = x.data_as<const float>();
  float* b = y.data_as<float>();
  for (int64_t i = 0; i < x.numel(); ++i) b[i] += a[i];
}

void CpuBackend::swiglu(const TensorView& gate, const TensorView& up, float limit, const TensorView& out) {
  require_f32("swiglu", {&gate, &up, &out});
  const int64_t cols = gate.dim(-1), rows = cols > 0 ? gate.numel() / cols : 0;
  const int64_t gs = gate.row_stride(), us = up.row_stride();
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate.data_as<const float>() + r * gs;
    const float* u = up.data_as<const float>() + r * us;
    float* o = out.data_as<float>() + r * cols;
    for (int64_t i = 0; i < cols; ++i) o[i] = silu(std::min(g[i], limit)) * std::clamp(u[i], -limit, limit);
  }
}

void CpuBackend::gather_rows(const TensorView& x, const TensorView& rows, const TensorView& out) {
  require_f32("gather_rows", {&x, &out});
  const int64_t D = x.dim(1);
  const auto* r = rows.data_as<const int64_t>();
  for (int64_t i = 0; i < rows.dim(0); ++i) {
    TERN_CHECK(r[i] >= 0 && r[i] < x.dim(0), "gather_rows: row ", r[i], " out of range [0, ", x.dim(0), ")");
    std::memcpy(out.data_as<float>() + i * D, x.data_as<const float>() + r[i] * D, D * sizeof(float));
  }
}

void CpuBackend::rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) {
  require_f32("rms_norm", {&x, &out});
  const int64_t dim = x.dim(-1), rows = x.numel() / std::max<int64_t>(dim, 1);
  std::vector<float> w(dim, 1.0f);
  if (!weight.empty())
    for (int64_t i = 0; i < dim; ++i)
      w[i] = weight.dtype() == DType::f32 ? weight.data_as<const float>()[i]
                                          : bf16_to_f32(weight.data_as<const uint16_t>()[i]);
  const int64_t stride = x.row_stride();
  parallel_for(
      0, rows,
      [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          const float* src = x.data_as<const float>() + r * stride;
          float* dst = out.data_as<float>() + r * dim;
          double sum_sq = 0.0;
          for (int64_t i = 0; i < dim; ++i) sum_sq += static_cast<double>(src[i]) * src[i];
          const float inv_rms = 1.0f / std::sqrt(static_cast<float>(sum_sq / dim) + eps);
          for (int64_t i = 0; i < dim; ++i) dst[i] = w[i] * (src[i] * inv_rms);
        }
      },
      16);
}

void CpuBackend::rope(const TensorView& x, const TensorView& positions, const TensorView& inv_freq,
                      bool inverse) {
  require_f32("rope", {&x});
  const int64_t rows = x.dim(0), head_dim = x.dim(-1), heads = x.rank() == 3 ? x.dim(1) : 1;
  const int64_t half = inv_freq.dim(0), first = head_dim - 2 * half;
  const float* freq = inv_freq.data_as<const float>();
  const auto* pos = positions.data_as<const int64_t>();
  float* data = x.data_as<float>();
  parallel_for(
      0, rows,
      [&](int64_t lo, int64_t hi) {
        std::vector<float> cos_t(half), sin_t(half);
        for (int64_t r = lo; r < hi; ++r) {
          for (int64_t i = 0; i < half; ++i) {
            const float angle = freq[i] * static_cast<float>(pos[r]);  // fp32, as the reference
            cos_t[i] = std::cos(angle);
            sin_t[i] = inverse ? -std::sin(angle) : std::sin(angle);
          }
          for (int64_t h = 0; h < heads; ++h) {
            float* v = data + (r * heads + h) * head_dim + first;
            for (int64_t i = 0; i < half; ++i) {
              const float x0 = v[2 * i], x1 = v[2 * i + 1];
              v[2 * i] = x0 * cos_t[i] - x1 * sin_t[i];
              v[2 * i + 1] = x1 * cos_t[i] + x0 * sin_t[i];
            }
          }
        }
      },
      4);
}

void CpuBackend::hc_expand(const TensorView& x, const TensorView& streams) {
  require_f32("hc_expand", {&x, &streams});
  const int64_t T = x.dim(0), hc = streams.dim(1), D = x.dim(1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < hc; ++i)
      std::memcpy(streams.data_as<float>() + (t * hc + i) * D, x.data_as<const float>() + t * D,
                  D * sizeof(float));
}

void CpuBackend::kv_pack(const TensorView& x, const ops::KvRowFormat& f, const TensorView& rows) {
  require_f32("kv_pack", {&x});
  const int64_t rb = f.row_bytes();
  parallel_for(
      0, x.dim(0),
      [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r)
          ops::encode_kv_row(x.data_as<const float>() + r * f.head_dim, f,
                             rows.data_as<std::byte>() + r * rb);
      },
      8);
}

void CpuBackend::kv_unpack(const TensorView& rows, const ops::KvRowFormat& f, const TensorView& x) {
  require_f32("kv_unpack", {&x});
  const int64_t rb = f.row_bytes();
  parallel_for(
      0, x.dim(0),
      [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r)
          ops::decode_kv_row(rows.data_as<const std::byte>() + r * rb, f,
                             x.data_as<float>() + r * f.head_dim);
      },
      8);
}

}  // namespace tern::cpu
