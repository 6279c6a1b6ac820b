// When each request is sent: offsets in seconds from the start of the run.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace tern::bench {

struct ArrivalSpec {
  double request_rate = std::numeric_limits<double>::infinity();  // requests/s; inf: all at once
  double burstiness = 1.0;  // gamma shape; 1 is Poisson, < 1 burstier, > 1 more regular (vLLM)
  std::uint64_t seed = 1;
};

// Offsets for n requests: the first at 0, then gaps drawn from a gamma distribution with shape
// `burstiness` and mean 1/request_rate (exponential gaps when burstiness is 1).
std::vector<double> arrival_offsets(const ArrivalSpec& spec, int n);

}  // namespace tern::bench
