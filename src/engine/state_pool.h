// State memory as a pool of fixed-size pages with a block table per sequence: admission and growth
// take whole pages from a free list, so the budget never fragments, and a sequence's pages are a
// plain list that can later be copied to another process.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "engine/model_runner.h"

namespace tern::engine {

struct PageGeometry {
  int64_t page_bytes = 0;
  int64_t fixed_bytes = 0;       // per sequence
  int64_t bytes_per_token = 0;
  // Pages a sequence holding `tokens` positions of state needs.
  int64_t pages_for(int64_t tokens) const;
};

// Picks a page size for a layout: 64 tokens' worth of per-token state, at least 4 KiB.
PageGeometry make_geometry(const StateLayout& layout, int64_t tokens_per_page = 64);

class StatePool {
 public:
  StatePool(PageGeometry geometry, int64_t budget_bytes);
  const PageGeometry& geometry() const { return geometry_; }
  int64_t total_pages() const { return static_cast<int64_t>(pages_); }
  int64_t free_pages() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_bytes() const { return (total_pages() - free_pages()) * geometry_.page_bytes; }
  int64_t total_bytes() const { return total_pages() * geometry_.page_bytes; }

  // Grows seq's block table to cover `tokens` positions; false (and no change) when pages run out.
  bool reserve(uint64_t seq, int64_t tokens);
  void release(uint64_t seq);
  const std::vector<int32_t>& block_table(uint64_t seq) const;
  int64_t pages_held(uint64_t seq) const;

 private:
  PageGeometry geometry_;
  size_t pages_ = 0;
  std::vector<int32_t> free_;
  std::unordered_map<uint64_t, std::vector<int32_t>> tables_;
};

}  // namespace tern::engine
