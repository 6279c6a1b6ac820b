#include "bench/arrivals.h"

#include <cmath>
#include <random>

#include "core/error.h"

namespace tern::bench {

std::vector<double> arrival_offsets(const ArrivalSpec& spec, int n) {
  TERN_CHECK(spec.request_rate > 0, "tern bench: --request-rate must be positive or inf");
  TERN_CHECK(spec.burstiness > 0, "tern bench: --burstiness must be positive");
  std::vector<double> offsets(static_cast<std::size_t>(std::max(n, 0)), 0.0);
  if (std::isinf(spec.request_rate)) return offsets;
  // A seed of its own so the arrival pattern does not change when the dataset does.
  std::mt19937_64 rng(spec.seed ^ 0x9e3779b97f4a7c15ULL);
  std::gamma_distribution<double> gap(spec.burstiness, 1.0 / (spec.request_rate * spec.burstiness));
  for (std::size_t i = 1; i < offsets.size(); ++i) offsets[i] = offsets[i - 1] + gap(rng);
  return offsets;
}

}  // namespace tern::bench
