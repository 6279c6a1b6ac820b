#include "engine/state_pool.h"

#include "core/error.h"
#include "engine/model_runner.h"

namespace tern::engine {

int64_t StepBatch::num_logits() const {
  int64_t n = 0;
  for (const auto& c : chunks) n += c.num_logits;
  return n;
}

void ModelRunner::forward_sample(const StepBatch&, std::span<const SampleRequest>, std::span<SampleResult>,
                                 std::span<float>) {
  TERN_CHECK(false, "runner ", name(), " does not sample on its device (samples_on_device() is false)");
}

std::vector<std::vector<int32_t>> ModelRunner::draft(std::span<const DraftRequest>, const DraftChooser&) {
  TERN_CHECK(false, "runner ", name(), " does not speculate (speculative_tokens() is 0)");
  return {};
}

void ModelRunner::settle(std::span<const int32_t>) {
  TERN_CHECK(false, "runner ", name(), " does not speculate (speculative_tokens() is 0)");
}

int64_t PageGeometry::pages_for(int64_t tokens) const {
  const int64_t rows = tokens_per_page > 0 && tokens > 0 ? (tokens + tokens_per_page - 1) / tokens_per_page : 0;
  return fixed_pages + rows;
}

namespace {

std::shared_ptr<cache::PagePool> make_pool(std::shared_ptr<const cache::StateLayout> layout, int64_t budget,
                                           Device device) {
  TERN_CHECK(layout != nullptr, "state pool: no layout");
  const int64_t pages = cache::PagePool::pages_in(*layout, budget), need = layout->pages_for(1);
  TERN_CHECK(pages >= need, "state memory of ", budget, " bytes cannot hold one sequence (", need, " pages of ",
             layout->page_bytes(), " B = ", need * layout->page_bytes(), " bytes needed): raise --state-memory");
  return std::make_shared<cache::PagePool>(std::move(layout), pages, device);
}

}  // namespace

StatePool::StatePool(std::shared_ptr<const cache::StateLayout> layout, int64_t budget_bytes, Device device)
    : pool_(make_pool(std::move(layout), budget_bytes, device)) {}

PageGeometry StatePool::geometry() const {
  const cache::StateLayout& l = layout();
  return {l.page_bytes(), l.fixed_pages(), l.row_page_used_bytes() > 0 ? l.tokens_per_page() : 0};
}

bool StatePool::reserve(uint64_t seq, int64_t tokens) {
  auto it = states_.find(seq);
  if (it != states_.end()) return it->second.reserve(tokens);
  if (layout().pages_for(tokens) > free_pages()) return false;
  states_.emplace(seq, cache::SequenceState(pool_, tokens));
  return true;
}

void StatePool::release(uint64_t seq) { states_.erase(seq); }

cache::SequenceState& StatePool::state(uint64_t seq) {
  auto it = states_.find(seq);
  TERN_CHECK(it != states_.end(), "state pool: sequence ", seq, " holds no state");
  return it->second;
}

const std::vector<int32_t>& StatePool::block_table(uint64_t seq) const {
  static const std::vector<int32_t> empty;
  auto it = states_.find(seq);
  return it == states_.end() ? empty : it->second.block_table();
}

}  // namespace tern::engine
