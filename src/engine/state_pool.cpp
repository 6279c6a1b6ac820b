#include "engine/state_pool.h"

#include <algorithm>

#include "core/error.h"

namespace tern::engine {

int64_t StepBatch::num_logits() const {
  int64_t n = 0;
  for (const auto& c : chunks) n += c.num_logits;
  return n;
}

int64_t PageGeometry::pages_for(int64_t tokens) const {
  const int64_t bytes = fixed_bytes + tokens * bytes_per_token;
  return (bytes + page_bytes - 1) / page_bytes;
}

PageGeometry make_geometry(const StateLayout& layout, int64_t tokens_per_page) {
  TERN_CHECK(layout.fixed_bytes >= 0 && layout.bytes_per_token >= 0, "state layout: negative sizes");
  PageGeometry g;
  g.fixed_bytes = layout.fixed_bytes;
  g.bytes_per_token = layout.bytes_per_token;
  g.page_bytes = std::max<int64_t>(4096, layout.bytes_per_token * tokens_per_page);
  return g;
}

StatePool::StatePool(PageGeometry geometry, int64_t budget_bytes) : geometry_(geometry) {
  TERN_CHECK(geometry_.page_bytes > 0, "state pool: page size must be positive");
  pages_ = static_cast<size_t>(std::max<int64_t>(0, budget_bytes / geometry_.page_bytes));
  free_.reserve(pages_);
  // Hand out low page numbers first (pop from the back).
  for (size_t i = pages_; i-- > 0;) free_.push_back(static_cast<int32_t>(i));
}

bool StatePool::reserve(uint64_t seq, int64_t tokens) {
  auto& table = tables_[seq];
  const int64_t need = geometry_.pages_for(tokens) - static_cast<int64_t>(table.size());
  if (need <= 0) return true;
  if (need > free_pages()) {
    if (table.empty()) tables_.erase(seq);
    return false;
  }
  for (int64_t i = 0; i < need; ++i) {
    table.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void StatePool::release(uint64_t seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  free_.insert(free_.end(), it->second.rbegin(), it->second.rend());
  tables_.erase(it);
}

const std::vector<int32_t>& StatePool::block_table(uint64_t seq) const {
  static const std::vector<int32_t> empty;
  auto it = tables_.find(seq);
  return it == tables_.end() ? empty : it->second;
}

int64_t StatePool::pages_held(uint64_t seq) const { return static_cast<int64_t>(block_table(seq).size()); }

}  // namespace tern::engine
