// The scheduler: a pure function from (running and waiting sequences, free state pages, token budget)
// to the next step's batch plan. No model, no clock, no threads: unit tests drive it with plain structs.
//
// Policy (continuous batching with chunked prefill):
//  1. every running sequence that is decoding gets its next token (oldest first);
//  2. running sequences still prefilling get the next chunk of their prompt, within the token budget;
//  3. waiting sequences are admitted first come first served while the budget, the running cap and the
//     free pages allow (admission never preempts; a head that does not fit blocks the queue);
//  4. when a running sequence needs a page and none is free, the youngest running sequence is preempted
//     (its pages freed, recomputed later from its tokens); a sequence that cannot grow even alone is
//     reported out of memory.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/state_pool.h"

namespace tern::engine {

struct SchedSeq {
  uint64_t id = 0;
  int64_t num_tokens = 0;    // known tokens: prompt + generated so far
  int64_t num_computed = 0;  // tokens already folded into the state
  int64_t pages_held = 0;
};

struct SchedulerLimits {
  int64_t token_budget = 2048;  // new tokens per step, all sequences together
  int max_running = 256;        // sequences with state at once
  int64_t max_chunk = 512;      // prefill tokens per sequence per step
  int64_t admission_reserve_pages = 0;  // admission leaves this many pages free for growth
};

struct SchedulerInput {
  std::span<const SchedSeq> running;  // oldest first
  std::span<const SchedSeq> waiting;  // first come first served (preempted ones first)
  int64_t free_pages = 0;
  PageGeometry geometry;
  SchedulerLimits limits;
};

struct PlannedChunk {
  uint64_t id = 0;
  int64_t start = 0;  // == num_computed
  int64_t count = 0;
  bool sample = false;  // the chunk reaches num_tokens: a new token is sampled after it
};

struct BatchPlan {
  std::vector<PlannedChunk> chunks;     // running sequences first, then admitted ones
  std::vector<uint64_t> admitted;       // waiting -> running, in order
  std::vector<uint64_t> preempted;      // running -> waiting (front), youngest first
  std::vector<uint64_t> out_of_memory;  // cannot grow even alone: finish them
  int64_t num_tokens() const;
  bool empty() const { return chunks.empty() && preempted.empty() && out_of_memory.empty(); }
};

BatchPlan schedule(const SchedulerInput& in);

}  // namespace tern::engine
