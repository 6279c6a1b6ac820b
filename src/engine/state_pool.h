// The engine's state memory: one cache::PagePool made at startup from the --state-memory budget (on the
// runner's device) and one cache::SequenceState per live sequence, each with its block table of pages.
// Admission and growth take whole pages, release (finish, abort, preemption) gives them back, so the budget
// never fragments; used and total are real pages. Engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "cache/page_pool.h"
#include "cache/sequence_state.h"

namespace tern::engine {

// What the scheduler needs to know of pages: a sequence of t tokens holds pages_for(t) of them.
struct PageGeometry {
  int64_t page_bytes = 0;
  int64_t fixed_pages = 0;      // per sequence: window rings, accumulators
  int64_t tokens_per_page = 0;  // one more row page per this many tokens; 0: no row pages
  int64_t pages_for(int64_t tokens) const;
};

class StatePool {
 public:
  // Allocates budget_bytes / page_bytes pages on `device`; throws, saying how much one sequence needs, when
  // that is not enough for a sequence of one token.
  StatePool(std::shared_ptr<const cache::StateLayout> layout, int64_t budget_bytes, Device device);
  const cache::StateLayout& layout() const { return pool_->layout(); }
  PageGeometry geometry() const;
  int64_t total_pages() const { return pool_->total_pages(); }
  int64_t free_pages() const { return pool_->free_pages(); }
  int64_t used_bytes() const { return pool_->used_bytes(); }
  int64_t total_bytes() const { return pool_->total_bytes(); }

  // Grows seq's state to hold `tokens` positions, making a fresh (reset) one on first use; false (and no
  // change) when pages run out.
  bool reserve(uint64_t seq, int64_t tokens);
  // Drops seq's state and gives its pages back (nothing when it holds none).
  void release(uint64_t seq);
  // seq's state; throws when it holds none.
  cache::SequenceState& state(uint64_t seq);
  const std::vector<int32_t>& block_table(uint64_t seq) const;
  int64_t pages_held(uint64_t seq) const { return static_cast<int64_t>(block_table(seq).size()); }
  size_t live() const { return states_.size(); }

 private:
  std::shared_ptr<cache::PagePool> pool_;
  std::unordered_map<uint64_t, cache::SequenceState> states_;
};

}  // namespace tern::engine
