// The state memory: ONE allocation of fixed-size pages, made once (at startup for the server), on the
// model's device (host memory for the CPU, device memory through core's DeviceMemory otherwise), and a free
// list. Sequences (sequence_state.h) take whole pages and give them back, so the memory never fragments:
// any free page serves any sequence. Not thread-safe: one thread (the engine's) takes and returns pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cache/state_layout.h"
#include "core/tensor.h"

namespace tern::cache {

class PagePool {
 public:
  // num_pages pages of layout->page_bytes() (zeroed) on `device`.
  PagePool(std::shared_ptr<const StateLayout> layout, int64_t num_pages, Device device = Device::cpu);
  // Whole pages a budget of `budget_bytes` buys.
  static int64_t pages_in(const StateLayout& layout, int64_t budget_bytes);

  const StateLayout& layout() const { return *layout_; }
  const std::shared_ptr<const StateLayout>& layout_ptr() const { return layout_; }
  Device device() const { return memory_.device(); }
  int64_t page_bytes() const { return layout_->page_bytes(); }
  int64_t total_pages() const { return total_; }
  int64_t free_pages() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_pages() const { return total_ - free_pages(); }
  int64_t used_bytes() const { return used_pages() * page_bytes(); }
  int64_t total_bytes() const { return total_ * page_bytes(); }

  // u8 [total_pages, page_bytes]: the whole allocation.
  const TensorView& memory() const { return memory_.view(); }
  // u8 [page_bytes] of page `id` (on the pool's device).
  TensorView page(int32_t id) const;

  // Appends n free pages to `table`; false (and nothing taken) when fewer than n are free.
  bool take(int64_t n, std::vector<int32_t>& table);
  // Returns pages taken earlier; throws (returning none of them) on a page that is not in use.
  void give_back(std::span<const int32_t> pages);

 private:
  std::shared_ptr<const StateLayout> layout_;
  int64_t total_ = 0;
  Tensor memory_;
  std::vector<int32_t> free_;    // a stack: the lowest ids are handed out first
  std::vector<uint8_t> in_use_;  // per page
};

}  // namespace tern::cache
