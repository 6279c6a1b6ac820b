// sparse_attention against softmax-with-sink over explicit key lists; the indexer's scores and top-k
// against brute force, with its causality rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "backends/cpu/cpu_backend.h"
#include "ops/act_quant.h"
#include "ops/attention.h"
#include "ops/indexer.h"
#include "ops/kv_row.h"
#include "ops/rope.h"
#include "test_util.h"

namespace tern {
namespace {

constexpr int64_t kHeads = 3, kHd = 128, kRope = 64, kWindow = 8, kRatio = 4;

struct Scene {
  ops::KvRowFormat fmt;
  int64_t start = 0, n = 0;
  Tensor q, sinks;
  Tensor all_rows;    // packed rows of positions 0 .. start+n-1
  Tensor ring;        // packed rows of positions start-window .. start-1 at slot p % window
  Tensor compressed;  // packed compressed rows
  int64_t num_compressed = 0;
  test::PagedCopy paged;  // the same rows in shuffled pages, as the state pool holds them
};

Scene make_scene(ops::KvFormat f, int64_t start, int64_t n, test::Random& rng) {
  Scene s;
  s.fmt = {f, kHd, kRope};
  s.start = start, s.n = n;
  s.q = rng.tensor({n, kHeads, kHd});
  s.sinks = rng.tensor({kHeads});
  const int64_t rb = s.fmt.row_bytes(), total = start + n;
  Tensor rows = rng.tensor({total, kHd}, 2.0f);
  s.all_rows = Tensor(DType::u8, {total, rb});
  ops::kv_pack(cpu::context(), rows, s.fmt, s.all_rows);
  s.ring = Tensor(DType::u8, {kWindow, rb});
  for (int64_t p = std::max<int64_t>(0, start - kWindow); p < start; ++p)
    std::copy_n(s.all_rows.data<uint8_t>() + p * rb, rb, s.ring.data<uint8_t>() + (p % kWindow) * rb);
  s.num_compressed = total / kRatio;
  Tensor comp = rng.tensor({std::max<int64_t>(s.num_compressed, 1), kHd}, 2.0f);
  s.compressed = Tensor(DType::u8, {std::max<int64_t>(s.num_compressed, 1), rb});
  ops::kv_pack(cpu::context(), comp, s.fmt, s.compressed);
  s.paged = test::paged_copy(s.compressed, 3, rng);
  return s;
}

std::vector<float> decoded(const Tensor& rows, const ops::KvRowFormat& f, int64_t r) {
  std::vector<float> x(f.head_dim);
  ops::decode_kv_row(rows.data<std::byte>() + r * f.row_bytes(), f, x.data());
  return x;
}

// o = sum_j softmax_with_sink(q.K_j * scale) K_j over the given key rows.
float check_against_formula(const Scene& s, const Tensor& selected, const Tensor& out) {
  float worst = 0;
  for (int64_t i = 0; i < s.n; ++i) {
    const int64_t p = s.start + i;
    std::vector<std::vector<float>> keys;
    for (int64_t j = std::max<int64_t>(0, p - kWindow + 1); j <= p; ++j)
      keys.push_back(decoded(s.all_rows, s.fmt, j));
    const int64_t visible = (p + 1) / kRatio;
    if (selected.empty()) {
      for (int64_t w = 0; w < visible; ++w) keys.push_back(decoded(s.compressed, s.fmt, w));
    } else {
      for (int64_t j = 0; j < selected.dim(1); ++j)
        if (int32_t w = selected.data<int32_t>()[i * selected.dim(1) + j]; w >= 0)
          keys.push_back(decoded(s.compressed, s.fmt, w));
    }
    for (int64_t h = 0; h < kHeads; ++h) {
      const float* q = s.q.data<float>() + (i * kHeads + h) * kHd;
      std::vector<double> e;
      double denom = std::exp(double(s.sinks.data<float>()[h]));
      for (auto& k : keys) {
        double d = 0;
        for (int64_t x = 0; x < kHd; ++x) d += double(q[x]) * k[x];
        e.push_back(std::exp(d / std::sqrt(double(kHd))));
        denom += e.back();
      }
      for (int64_t x = 0; x < kHd; ++x) {
        double want = 0;
        for (size_t j = 0; j < keys.size(); ++j) want += e[j] / denom * keys[j][x];
        worst = std::max(worst, float(std::fabs(want - out.data<float>()[(i * kHeads + h) * kHd + x])));
      }
    }
  }
  return worst;
}

// The scene's arguments (its compressed rows in shuffled pages, every visible one attended).
ops::AttentionArgs args_of(const Scene& s) {
  ops::AttentionArgs a;
  a.q = s.q;
  a.start = s.start;
  a.format = s.fmt;
  a.chunk_rows = s.all_rows.view().rows(s.start, s.start + s.n);
  a.ring = s.ring;
  a.window = kWindow;
  a.compressed = s.paged.view;
  a.num_compressed = s.num_compressed;
  a.ratio = kRatio;
  a.sinks = s.sinks;
  a.scale = 1.0f / std::sqrt(float(kHd));
  return a;
}

// With the compressed rows in shuffled pages, or (contiguous) all in one page.
Tensor run(const Scene& s, const Tensor& selected, bool contiguous = false) {
  const test::PagedCopy one = contiguous ? test::one_page(s.compressed) : test::PagedCopy{};
  ops::AttentionArgs a = args_of(s);
  if (contiguous) a.compressed = one.view;
  if (!selected.empty()) a.selected = selected;
  Tensor out(DType::f32, {s.n, kHeads, kHd});
  ops::sparse_attention(cpu::context(), a, out);
  return out;
}

TEST(SparseAttention, WindowRingAndAllCompressedRows) {
  for (ops::KvFormat f : {ops::KvFormat::f32, ops::KvFormat::fp8_ds})
    for (auto [start, n] : {std::pair<int64_t, int64_t>{0, 11}, {13, 1}, {21, 6}, {5, 20}}) {
      test::Random rng(static_cast<uint32_t>(100 + start * 7 + n));
      const Scene s = make_scene(f, start, n, rng);
      const float worst = check_against_formula(s, Tensor(), run(s, Tensor()));
      std::printf("attention %s start %ld n %ld: max|d| %.3g\n", std::string(ops::kv_format_name(f)).c_str(),
                  long(start), long(n), worst);
      EXPECT_LE(worst, 2e-5f);
    }
}

TEST(SparseAttention, SelectedCompressedRowsOnly) {
  test::Random rng(7);
  const Scene s = make_scene(ops::KvFormat::fp8_ds, 17, 9, rng);
  const int64_t k = 3;
  Tensor selected(DType::i32, {s.n, k});
  for (int64_t i = 0; i < s.n; ++i) {
    const int64_t visible = (s.start + i + 1) / kRatio;
    for (int64_t j = 0; j < k; ++j)
      selected.data<int32_t>()[i * k + j] = j < visible ? static_cast<int32_t>(visible - 1 - j) : -1;
  }
  EXPECT_LE(check_against_formula(s, selected, run(s, selected)), 2e-5f);
  selected.data<int32_t>()[0] = static_cast<int32_t>((s.start + 1) / kRatio);  // one past the visible ones
  EXPECT_THROW(run(s, selected), Error);
}

// The paged rows are read exactly as contiguous ones: same keys, same order, same bits.
TEST(SparseAttention, PagedRowsEqualContiguousBitForBit) {
  for (ops::KvFormat f : {ops::KvFormat::f32, ops::KvFormat::fp8_ds})
    for (bool select : {false, true}) {
      test::Random rng(static_cast<uint32_t>(31 + select));
      const Scene s = make_scene(f, 29, 7, rng);
      Tensor selected;
      if (select) {
        selected = Tensor(DType::i32, {s.n, 4});
        for (int64_t i = 0; i < s.n; ++i)
          for (int64_t j = 0; j < 4; ++j)
            selected.data<int32_t>()[i * 4 + j] = static_cast<int32_t>((i * 3 + j * 5) % ((s.start + i + 1) / kRatio));
      }
      const Tensor paged = run(s, selected), contiguous = run(s, selected, true);
      EXPECT_EQ(std::memcmp(paged.data<float>(), contiguous.data<float>(), paged.nbytes()), 0)
          << ops::kv_format_name(f) << " select " << select;
    }
}

// AttentionArgs::out_inv_freq: the output rotated back at `positions`, the bits of the op then ops::rope (inverse);
// the FP8 rows out (ops::Fp8Rows): act_quant's rows of that output. Bad positions are refused.
TEST(SparseAttention, RotatesBackAndQuantisesWhenAsked) {
  test::Random rng(43);
  const Scene s = make_scene(ops::KvFormat::fp8_ds, 21, 6, rng);
  const int64_t half = kRope / 2, width = kHeads * kHd, P = ops::Fp8Rows::padded_rows(s.n);
  Tensor inv_freq(DType::f32, {half}), positions(DType::i64, {s.n});
  for (int64_t j = 0; j < half; ++j) inv_freq.data<float>()[j] = std::pow(10000.0f, -2.0f * float(j) / float(kRope));
  for (int64_t i = 0; i < s.n; ++i) positions.data<int64_t>()[i] = s.start + i;
  ops::AttentionArgs a = args_of(s);
  Tensor want(DType::f32, {s.n, kHeads, kHd}), got(DType::f32, {s.n, kHeads, kHd});
  ops::sparse_attention(cpu::context(), a, want);
  ops::rope(cpu::context(), want, positions, inv_freq, /*inverse=*/true);
  a.positions = positions;
  a.out_inv_freq = inv_freq;
  ops::sparse_attention(cpu::context(), a, got);
  EXPECT_EQ(std::memcmp(want.data<float>(), got.data<float>(), want.nbytes()), 0);
  Tensor values(DType::u8, {P, width}), scales(DType::f32, {width / 128, P});
  ops::sparse_attention(cpu::context(), a, ops::Fp8Rows{values, scales, s.n});
  std::vector<uint8_t> q(width);
  std::vector<float> sc(width / 128);
  for (int64_t i = 0; i < s.n; ++i) {
    ops::act_quant_fp8(want.data<float>() + i * width, width, q.data(), sc.data());
    EXPECT_EQ(std::memcmp(q.data(), values.data<uint8_t>() + i * width, width), 0) << "row " << i;
    for (int64_t b = 0; b < width / 128; ++b) EXPECT_EQ(scales.data<float>()[b * P + i], sc[b]) << "row " << i;
  }
  a.positions = positions.view().rows(0, s.n - 1);
  EXPECT_THROW(ops::sparse_attention(cpu::context(), a, got), Error);
  a.positions = positions;
  EXPECT_THROW(ops::sparse_attention(cpu::context(), a, ops::Fp8Rows{values, scales, s.n - 1}), Error);
}

// q as wq_b wrote it (AttentionArgs::q_inv_freq): the op first norms each head and rotates its last 2 * half dims at
// positions. Checked against the formula on a q normed and rotated here by hand (in double); a wrong positions
// length and too many pairs are refused.
TEST(SparseAttention, NormsAndRotatesQWhenAsked) {
  test::Random rng(41);
  Scene s = make_scene(ops::KvFormat::fp8_ds, 21, 6, rng);
  const Tensor raw = rng.tensor({s.n, kHeads, kHd}, 3.0f);
  const int64_t half = kRope / 2, first = kHd - kRope;
  const float eps = 1e-6f;
  Tensor inv_freq(DType::f32, {half}), positions(DType::i64, {s.n});
  for (int64_t j = 0; j < half; ++j) inv_freq.data<float>()[j] = std::pow(10000.0f, -2.0f * float(j) / float(kRope));
  for (int64_t i = 0; i < s.n; ++i) positions.data<int64_t>()[i] = s.start + i;
  for (int64_t i = 0; i < s.n; ++i)
    for (int64_t h = 0; h < kHeads; ++h) {
      const float* x = raw.data<float>() + (i * kHeads + h) * kHd;
      float* y = s.q.data<float>() + (i * kHeads + h) * kHd;
      double ss = 0;
      for (int64_t d = 0; d < kHd; ++d) ss += double(x[d]) * x[d];
      const double inv = 1.0 / std::sqrt(ss / kHd + eps);
      for (int64_t d = 0; d < kHd; ++d) y[d] = float(x[d] * inv);
      for (int64_t j = 0; j < half; ++j) {
        const double a = double(inv_freq.data<float>()[j]) * double(s.start + i);
        const double x0 = y[first + 2 * j], x1 = y[first + 2 * j + 1];
        y[first + 2 * j] = float(x0 * std::cos(a) - x1 * std::sin(a));
        y[first + 2 * j + 1] = float(x0 * std::sin(a) + x1 * std::cos(a));
      }
    }
  ops::AttentionArgs a = args_of(s);
  a.q = raw;
  a.positions = positions;
  a.q_inv_freq = inv_freq;
  a.q_norm_eps = eps;
  Tensor out(DType::f32, {s.n, kHeads, kHd});
  ops::sparse_attention(cpu::context(), a, out);
  EXPECT_LE(check_against_formula(s, Tensor(), out), 1e-4f);  // s.q: the hand-normed q
  a.positions = positions.view().rows(0, s.n - 1);
  EXPECT_THROW(ops::sparse_attention(cpu::context(), a, out), Error);
  a.positions = positions;
  Tensor too_many(DType::f32, {kHd / 2 + 1});
  a.q_inv_freq = too_many;
  EXPECT_THROW(ops::sparse_attention(cpu::context(), a, out), Error);
}

TEST(SparseAttention, RejectsBadPagedRows) {
  test::Random rng(8);
  const Scene s = make_scene(ops::KvFormat::f32, 21, 6, rng);
  ops::AttentionArgs a;
  a.q = s.q;
  a.start = s.start;
  a.format = s.fmt;
  a.chunk_rows = s.all_rows.view().rows(s.start, s.start + s.n);
  a.ring = s.ring;
  a.window = kWindow;
  a.num_compressed = s.num_compressed;
  a.ratio = kRatio;
  a.sinks = s.sinks;
  Tensor out(DType::f32, {s.n, kHeads, kHd});
  test::PagedCopy p = test::paged_copy(s.compressed, 3, rng);
  a.compressed = p.view;
  EXPECT_NO_THROW(ops::sparse_attention(cpu::context(), a, out));
  a.compressed.block_table = p.table.view().rows(0, p.view.block_table.numel() - 1);  // one page short
  EXPECT_THROW(ops::sparse_attention(cpu::context(), a, out), Error);
  a.compressed = p.view;
  p.table.data<int32_t>()[1] = static_cast<int32_t>(p.pool.dim(0));  // a page outside the pool
  EXPECT_THROW(ops::sparse_attention(cpu::context(), a, out), Error);
  p.table.data<int32_t>()[1] = 0;
  a.compressed.rows_per_page = 1000;  // rows beyond the page
  EXPECT_THROW(ops::sparse_attention(cpu::context(), a, out), Error);
  a.compressed = p.view;
  a.compressed.row_bytes = 8;
  EXPECT_THROW(ops::sparse_attention(cpu::context(), a, out), Error);
}

TEST(Indexer, ScoresAndCausalTopK) {
  test::Random rng(9);
  const int64_t n = 30, heads = 4, dim = 32, S = 9, start = 10;
  const int topk = 4;
  Tensor q = rng.tensor({n, heads, dim}), w = rng.tensor({n, heads}), keys = rng.tensor({S, dim});
  std::vector<int64_t> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = start + i;
  const Tensor pos = test::positions_tensor(p);
  const test::PagedCopy paged = test::paged_copy(keys, 2, rng), one = test::one_page(keys);
  ops::IndexerArgs a{q, w, paged.view, S, pos, kRatio};
  Tensor scores(DType::f32, {n, S});
  ops::indexer_scores(cpu::context(), a, scores);
  Tensor idx(DType::i32, {n, topk});
  ops::indexer_topk(cpu::context(), a, topk, idx);
  // Keys in shuffled pages give the bits of contiguous keys.
  ops::IndexerArgs c = a;
  c.keys = one.view;
  Tensor scores_c(DType::f32, {n, S}), idx_c(DType::i32, {n, topk});
  ops::indexer_scores(cpu::context(), c, scores_c);
  ops::indexer_topk(cpu::context(), c, topk, idx_c);
  EXPECT_EQ(std::memcmp(scores.data<float>(), scores_c.data<float>(), scores.nbytes()), 0);
  EXPECT_EQ(std::memcmp(idx.data<int32_t>(), idx_c.data<int32_t>(), idx.nbytes()), 0);
  float worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t visible = std::min<int64_t>(S, (p[i] + 1) / kRatio);
    std::vector<std::pair<double, int>> want;
    for (int64_t s = 0; s < S; ++s) {
      double score = 0;
      for (int64_t h = 0; h < heads; ++h) {
        double d = 0;
        for (int64_t x = 0; x < dim; ++x)
          d += double(q.data<float>()[(i * heads + h) * dim + x]) * keys.data<float>()[s * dim + x];
        score += w.data<float>()[i * heads + h] / std::sqrt(double(heads)) * std::max(0.0, d) /
                 std::sqrt(double(dim));
      }
      const float got = scores.data<float>()[i * S + s];
      if (s >= visible) {
        EXPECT_EQ(got, -std::numeric_limits<float>::infinity());
        continue;
      }
      worst = std::max(worst, float(std::fabs(score - got)));
      want.emplace_back(-score, static_cast<int>(s));
    }
    std::sort(want.begin(), want.end());
    for (int j = 0; j < topk; ++j) {
      const int32_t got = idx.data<int32_t>()[i * topk + j];
      if (j < visible) {
        EXPECT_EQ(got, want[j].second) << "query " << i << " rank " << j;
        EXPECT_LT(got, (p[i] + 1) / kRatio);  // causality
      } else {
        EXPECT_EQ(got, -1);
      }
    }
  }
  EXPECT_LE(worst, 1e-5f);
}

}  // namespace
}  // namespace tern
