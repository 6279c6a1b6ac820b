#include "core/arena_plan.h"

#include "core/error.h"

namespace tern {

void ArenaPlan::reset() {
  free_.clear();
  live_.clear();
  deferred_.clear();
  top_ = peak_ = 0;
  pending_ = last_fresh_ = false;
}

size_t ArenaPlan::allocate(size_t bytes) {
  const size_t b = ((bytes == 0 ? 1 : bytes) + kAlign - 1) / kAlign * kAlign;
  // First fit: the lowest free block that holds it; else at the top (no free block touches the top: free_block lowers
  // the top instead, so a freed block there is reused by growing from it).
  size_t at = top_;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second >= b) {
      at = it->first;
      const size_t rest = it->second - b;
      free_.erase(it);
      if (rest > 0) free_[at + b] = rest;
      break;
    }
  }
  last_fresh_ = at >= peak_;
  live_[at] = b;
  top_ = std::max(top_, at + b);
  peak_ = std::max(peak_, top_);
  return at;
}

void ArenaPlan::release(size_t offset) {
  TERN_CHECK(live_.count(offset) == 1, "arena plan: no live block at offset ", offset);
  if (pending_) {
    deferred_.push_back(offset);
    return;
  }
  const size_t b = live_.at(offset);
  live_.erase(offset);
  free_block(offset, b);
}

void ArenaPlan::free_block(size_t offset, size_t bytes) {
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + bytes == next->first) {  // merge with the block after it
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {  // and the block before it
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += bytes;
      offset = prev->first;
      bytes = prev->second;
      free_.erase(prev);
    }
  }
  if (offset + bytes == top_) {  // the block at the top: the top comes down (peak_ keeps the high water)
    top_ = offset;
    return;
  }
  free_[offset] = bytes;
}

void ArenaPlan::branch_begin() { pending_ = true; }

void ArenaPlan::branch_join() {
  pending_ = false;
  std::vector<size_t> d;
  d.swap(deferred_);
  for (size_t offset : d) release(offset);
}

}  // namespace tern
