#include "engine/metrics.h"

namespace tern::engine {

EngineMetrics::EngineMetrics()
    : time_to_first_token_seconds({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                                   7.5, 10.0, 20.0, 40.0, 80.0}),
      inter_token_latency_seconds({0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4,
                                   0.5, 0.75, 1.0, 2.5}),
      e2e_request_latency_seconds({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                                   60.0, 120.0, 240.0}),
      batch_size({1, 2, 4, 8, 16, 32, 64, 128, 256, 512}),
      step_seconds({0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12}),
      forward_seconds(step_seconds.bounds()),
      sample_seconds(step_seconds.bounds()) {}

}  // namespace tern::engine
