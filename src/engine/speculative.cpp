#include "engine/speculative.h"

#include <algorithm>

#include "core/error.h"

namespace tern::engine {
namespace {

// The index whose cumulative weight first exceeds u * total, in index order; the last index of positive weight
// when rounding leaves u * total beyond the sum. `weight(i)` >= 0.
template <class Weight>
int32_t draw_index(int64_t vocab, double u, double total, Weight&& weight) {
  const double target = u * total;
  double cum = 0.0;
  int32_t last = -1;
  for (int64_t i = 0; i < vocab; ++i) {
    const double w = weight(i);
    if (w <= 0.0) continue;
    cum += w;
    last = static_cast<int32_t>(i);
    if (target < cum) return last;
  }
  TERN_CHECK(last >= 0, "speculative acceptance: a distribution with no positive probability");
  return last;
}

// A token drawn from `row`'s weights (a distribution; sums need not be exactly 1) with the uniform u.
int32_t draw_row(const float* row, int64_t vocab, double u) {
  double total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) total += row[i];
  return draw_index(vocab, u, total, [&](int64_t i) { return static_cast<double>(row[i]); });
}

}  // namespace

SpecVerdict accept_sampled(std::span<const float> p, std::span<const float> q, int64_t vocab,
                           std::span<const int32_t> drafts, std::mt19937_64& rng) {
  const auto k = static_cast<int64_t>(drafts.size());
  TERN_CHECK(vocab > 0 && static_cast<int64_t>(p.size()) == (k + 1) * vocab &&
                 static_cast<int64_t>(q.size()) == k * vocab,
             "speculative acceptance: ", k, " drafts need target rows [", k + 1, "][", vocab, "] and draft rows [", k,
             "][", vocab, "], got ", p.size(), " and ", q.size(), " values");
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  SpecVerdict v;
  for (int64_t j = 0; j < k; ++j) {
    const int32_t d = drafts[j];
    TERN_CHECK(d >= 0 && d < vocab, "speculative acceptance: draft ", j, " is token ", d, ", outside the vocabulary of ",
               vocab);
    const float* pj = p.data() + j * vocab;
    const float* qj = q.data() + j * vocab;
    const double pd = pj[d], qd = qj[d];
    const double u = uniform(rng);
    // min(1, p / q) > u, without the division (q = 0: the draft could not have been drawn; keep it where p > 0)
    if (pd > 0.0 && (u * qd < pd)) {
      ++v.accepted;
      continue;
    }
    double residual = 0.0;
    for (int64_t i = 0; i < vocab; ++i) residual += std::max(0.0, static_cast<double>(pj[i]) - qj[i]);
    const double un = uniform(rng);
    if (residual > 0.0) {
      v.next = draw_index(vocab, un, residual,
                          [&](int64_t i) { return std::max(0.0, static_cast<double>(pj[i]) - qj[i]); });
    } else {  // p == q (where rejection has probability 0): the target's own row
      v.next = draw_row(pj, vocab, un);
    }
    return v;
  }
  v.next = draw_row(p.data() + k * vocab, vocab, uniform(rng));
  return v;
}

int32_t draw_from(std::span<const float> dist, double u) {
  return draw_row(dist.data(), static_cast<int64_t>(dist.size()), u);
}

SpecVerdict accept_greedy(std::span<const int32_t> target_argmax, std::span<const int32_t> drafts) {
  TERN_CHECK(target_argmax.size() == drafts.size() + 1, "speculative acceptance: ", drafts.size(),
             " drafts need the target's choice at ", drafts.size() + 1, " positions, got ", target_argmax.size());
  SpecVerdict v;
  while (v.accepted < static_cast<int>(drafts.size()) && drafts[v.accepted] == target_argmax[v.accepted]) ++v.accepted;
  v.next = target_argmax[v.accepted];
  return v;
}

}  // namespace tern::engine
