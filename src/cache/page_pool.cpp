#include "cache/page_pool.h"

#include <limits>

#include "core/error.h"

namespace tern::cache {

PagePool::PagePool(std::shared_ptr<const StateLayout> layout, int64_t num_pages, Device device)
    : layout_(std::move(layout)), total_(num_pages) {
  TERN_CHECK(layout_ != nullptr, "state pool: no layout");
  TERN_CHECK(num_pages > 0 && num_pages <= std::numeric_limits<int32_t>::max(), "state pool: ", num_pages,
             " pages (need 1 .. 2^31-1)");
  memory_ = Tensor(DType::u8, {num_pages, layout_->page_bytes()}, device);
  free_.reserve(static_cast<size_t>(num_pages));
  for (int64_t i = num_pages; i-- > 0;) free_.push_back(static_cast<int32_t>(i));
  in_use_.assign(static_cast<size_t>(num_pages), 0);
}

int64_t PagePool::pages_in(const StateLayout& layout, int64_t budget_bytes) {
  return budget_bytes > 0 ? budget_bytes / layout.page_bytes() : 0;
}

TensorView PagePool::page(int32_t id) const {
  TERN_CHECK(id >= 0 && id < total_, "state pool: page ", id, " outside [0, ", total_, ")");
  return memory_.view().rows(id, id + 1).reshape({page_bytes()});
}

bool PagePool::take(int64_t n, std::vector<int32_t>& table) {
  TERN_CHECK(n >= 0, "state pool: cannot take ", n, " pages");
  if (n > free_pages()) return false;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = free_.back();
    free_.pop_back();
    in_use_[static_cast<size_t>(id)] = 1;
    table.push_back(id);
  }
  return true;
}

void PagePool::give_back(std::span<const int32_t> pages) {
  // Mark first (2: being returned), so a page listed twice or not in use fails before anything changes.
  for (size_t i = 0; i < pages.size(); ++i) {
    const int32_t id = pages[i];
    if (id < 0 || id >= total_ || in_use_[static_cast<size_t>(id)] != 1) {
      for (size_t j = 0; j < i; ++j) in_use_[static_cast<size_t>(pages[j])] = 1;
      fail("state pool: page ", id, " returned but not in use");
    }
    in_use_[static_cast<size_t>(id)] = 2;
  }
  for (size_t i = pages.size(); i-- > 0;) {  // reversed: the next take() hands the same order out again
    in_use_[static_cast<size_t>(pages[i])] = 0;
    free_.push_back(pages[i]);
  }
}

}  // namespace tern::cache
