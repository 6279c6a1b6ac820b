// The scheduler: a pure function from (running and waiting sequences, free state pages, token budget)
// to the next step's batch plan. No model, no clock, no threads: unit tests drive it with plain structs.
//
// Policy (continuous batching with chunked prefill, fair across clients):
//  1. every running sequence that is decoding gets its next token (oldest first), and the drafts it may verify
//     (SchedSeq::lookahead) while the budget lasts;
//  2. running sequences still prefilling get the next chunk of their prompt within the token budget,
//     round-robin across clients (each client's oldest first);
//  3. waiting sequences are admitted while the budget, the running cap and the free pages allow, the
//     next one always from the client with the fewest running sequences (first come first served
//     within a client, and among clients with as many); a head that does not fit blocks admission;
//  4. fair share: when that client's head finds no running slot or no pages, the youngest sequence of
//     the client with the most running sequences is preempted for it, as long as that client holds at
//     least two more than this one, so one client's large batch cannot keep the others waiting;
//  5. when a running sequence needs a page and none is free, the youngest sequence of the client with
//     the most running sequences is preempted (its pages freed, recomputed later from its tokens); a
//     sequence that cannot grow even alone is reported out of memory.
// With one client (client 0 everywhere) this is first come first served.
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
  uint64_t client = 0;  // who asked for it: sequences are shared fairly between clients
  // Speculative decoding: drafts a decoding sequence may verify in this step (0: none). A decode chunk with
  // drafts takes 1 + drafts tokens of the budget and pages for them; fewer drafts when the budget runs short.
  int64_t lookahead = 0;
};

struct SchedulerLimits {
  int64_t token_budget = 2048;  // new tokens per step, all sequences together
  int max_running = 256;        // sequences with state at once
  int64_t max_chunk = 2048;     // prefill tokens per sequence per step (vLLM: a prefill may take the whole budget)
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
  int64_t drafts = 0;   // a decode chunk's drafts to verify after its token (speculative decoding)
};

struct BatchPlan {
  std::vector<PlannedChunk> chunks;     // running sequences first, then admitted ones
  std::vector<uint64_t> admitted;       // waiting -> running, in order (fair: not always the queue's front)
  std::vector<uint64_t> preempted;      // running -> waiting (front), in the order they were chosen
  std::vector<uint64_t> out_of_memory;  // cannot grow even alone: finish them
  int64_t num_tokens() const;
  bool empty() const { return chunks.empty() && preempted.empty() && out_of_memory.empty(); }
};

BatchPlan schedule(const SchedulerInput& in);

}  // namespace tern::engine
