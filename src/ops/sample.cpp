#include "ops/sample.h"

#include <cmath>
#include <vector>

#include "core/error.h"

namespace tern::ops {

int64_t argmax(std::span<const float> logits) {
  TERN_CHECK(!logits.empty(), "argmax of an empty row");
  int64_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = static_cast<int64_t>(i);
  return best;
}

uint64_t Rng::next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Rng::uniform() {
  return static_cast<double>(next() >> 11) * 0x1.0p-53;
}

int64_t sample(std::span<const float> logits, float temperature, Rng& rng) {
  if (temperature <= 0.0f) return argmax(logits);
  const float top = logits[argmax(logits)];
  std::vector<double> p(logits.size());
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) total += p[i] = std::exp((logits[i] - top) / temperature);
  double u = rng.uniform() * total;
  for (size_t i = 0; i < p.size(); ++i) {
    u -= p[i];
    if (u < 0.0) return static_cast<int64_t>(i);
  }
  return argmax(logits);  // u landed on the rounding slack at the end
}

}  // namespace tern::ops
