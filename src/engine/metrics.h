// The engine's counters, gauges and histograms, read by the server's /metrics (Prometheus text).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/histogram.h"
#include "engine/model_runner.h"

namespace tern::engine {

struct EngineMetrics {
  // gauges, as of the last step
  int64_t num_running = 0;
  int64_t num_waiting = 0;       // remote requests waiting for state memory included
  int64_t num_transferring = 0;  // remote requests holding reserved state memory, awaiting their state
  int64_t state_used_bytes = 0;
  int64_t state_total_bytes = 0;
  // counters
  uint64_t prompt_tokens_total = 0;
  uint64_t generation_tokens_total = 0;
  uint64_t preemptions_total = 0;
  uint64_t steps_total = 0;
  std::array<uint64_t, 6> finished_total{};  // by FinishReason
  StepPaths step_paths;  // the runner's steps: CUDA graph replays, eager steps by reason
  // speculative decoding (vLLM's spec_decode counters): verify rounds (one per sequence and step that drafted),
  // draft tokens proposed, accepted, and accepted by draft position (0 .. k - 1)
  uint64_t spec_drafts_total = 0;
  uint64_t spec_draft_tokens_total = 0;
  uint64_t spec_accepted_tokens_total = 0;
  std::vector<uint64_t> spec_accepted_per_position;
  int speculative_tokens = 0;  // k, 0: off
  // histograms
  Histogram time_to_first_token_seconds;
  Histogram inter_token_latency_seconds;
  Histogram e2e_request_latency_seconds;
  Histogram batch_size;  // sequences per step
  Histogram step_seconds;
  Histogram forward_seconds;  // the model's part of a step
  Histogram sample_seconds;   // sampling and delivery
  EngineMetrics();
};

}  // namespace tern::engine
