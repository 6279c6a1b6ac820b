// The online compressor, fed in random chunks, against the batch softmax of deepseek-v4.md.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "backends/cpu/cpu_backend.h"
#include "ops/compressor.h"
#include "test_util.h"

namespace tern {
namespace {

// Batch formula: entry w pools, per channel, softmax over its candidates (gate + ape) weighting kv.
std::vector<double> batch_entry(const Tensor& kv, const Tensor& gate, const Tensor& ape, int64_t w, int ratio,
                                bool overlap, int64_t width) {
  const int64_t C = kv.dim(1);
  std::vector<double> out(width);
  for (int64_t c = 0; c < width; ++c) {
    std::vector<std::pair<double, double>> cand;  // (logit, value)
    auto add = [&](int64_t t, int64_t ch) {
      cand.emplace_back(double(gate.data<float>()[t * C + ch]) + ape.data<float>()[(t % ratio) * C + ch],
                        kv.data<float>()[t * C + ch]);
    };
    if (overlap && w > 0)
      for (int64_t t = (w - 1) * ratio; t < w * ratio; ++t) add(t, c);  // window w-1, first half
    for (int64_t t = w * ratio; t < (w + 1) * ratio; ++t) add(t, overlap ? width + c : c);
    double top = -1e300, sum = 0, acc = 0;
    for (auto& [g, v] : cand) top = std::max(top, g);
    for (auto& [g, v] : cand) sum += std::exp(g - top), acc += std::exp(g - top) * v;
    out[c] = acc / sum;
  }
  return out;
}

void check_online_matches_batch(int ratio, bool overlap, uint32_t seed) {
  test::Random rng(seed);
  const int64_t width = 24, C = overlap ? 2 * width : width, L = 45;
  Tensor kv = rng.tensor({L, C}), gate = rng.tensor({L, C}, 4.0f), ape = rng.tensor({ratio, C});
  Tensor acc(DType::f32, {overlap ? 2 : 1, 3, width});  // zeros: the empty state
  std::vector<std::vector<float>> emitted;
  for (int64_t start = 0; start < L;) {
    const int64_t n = std::min<int64_t>(L - start, rng.integer(1, 7));
    const int64_t e = ops::compressor_emit_count(start, n, ratio);
    Tensor out(DType::f32, {e, width});
    const int64_t got = ops::compressor_update(
        cpu::context(), {acc, kv.view().rows(start, start + n), gate.view().rows(start, start + n), ape,
                         start, ratio, overlap, out});
    ASSERT_EQ(got, e);
    for (int64_t i = 0; i < e; ++i)
      emitted.emplace_back(out.data<float>() + i * width, out.data<float>() + (i + 1) * width);
    start += n;
  }
  ASSERT_EQ(static_cast<int64_t>(emitted.size()), L / ratio);
  float worst = 0;
  for (int64_t w = 0; w < L / ratio; ++w) {
    const std::vector<double> want = batch_entry(kv, gate, ape, w, ratio, overlap, width);
    for (int64_t c = 0; c < width; ++c) worst = std::max(worst, float(std::fabs(want[c] - emitted[w][c])));
  }
  std::printf("compressor ratio %d overlap %d: online vs batch max|d| = %.3g\n", ratio, overlap, worst);
  EXPECT_LE(worst, 5e-6f);
}

TEST(Compressor, HcaOnlineMatchesBatchSoftmax) {
  check_online_matches_batch(8, false, 31);
}
TEST(Compressor, CsaOnlineMatchesBatchSoftmaxWithOverlap) {
  check_online_matches_batch(4, true, 32);
}
TEST(Compressor, RatioOneAndLargeRatio) {
  check_online_matches_batch(1, false, 33);
  check_online_matches_batch(16, true, 34);
}

}  // namespace
}  // namespace tern
