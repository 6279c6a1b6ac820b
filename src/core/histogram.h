// A Prometheus-style histogram: fixed upper bounds, a count per bucket (the last one +Inf), the sum and
// the count. The engine's, the transfers' and the router's latency figures; net/prometheus.h renders it.
#pragma once

#include <cstdint>
#include <vector>

namespace tern {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds = {});
  void observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  const std::vector<uint64_t>& counts() const { return counts_; }  // per bucket, last is +Inf
  double sum() const { return sum_; }
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

}  // namespace tern
