#include "engine/scheduler.h"

#include <algorithm>

namespace tern::engine {

int64_t BatchPlan::num_tokens() const {
  int64_t n = 0;
  for (const auto& c : chunks) n += c.count;
  return n;
}

namespace {

// Working state of one schedule() call.
class Planner {
 public:
  explicit Planner(const SchedulerInput& in)
      : in_(in), free_(in.free_pages), budget_(in.limits.token_budget), slots_(in.running.size()) {}

  BatchPlan run() {
    for (size_t i = 0; i < slots_.size(); ++i)
      if (remaining(i) == 1) schedule_running(i);
    for (size_t i = 0; i < slots_.size(); ++i)
      if (remaining(i) > 1) schedule_running(i);
    admit_waiting();
    plan_.chunks.erase(std::remove_if(plan_.chunks.begin(), plan_.chunks.end(),
                                      [](const PlannedChunk& c) { return c.count == 0; }),
                       plan_.chunks.end());
    return std::move(plan_);
  }

 private:
  struct Slot {
    bool gone = false;  // preempted or out of memory
    int chunk = -1;     // index into plan_.chunks
    int64_t grown = 0;  // pages taken in this plan
  };

  int64_t remaining(size_t i) const { return in_.running[i].num_tokens - in_.running[i].num_computed; }

  int64_t chunk_size(int64_t left) const { return std::min({left, budget_, in_.limits.max_chunk}); }

  void schedule_running(size_t i) {
    if (slots_[i].gone) return;
    const SchedSeq& s = in_.running[i];
    const int64_t count = chunk_size(remaining(i));
    if (count <= 0) return;
    if (!make_room(i, in_.geometry.pages_for(s.num_computed + count) - s.pages_held)) return;
    slots_[i].chunk = static_cast<int>(plan_.chunks.size());
    plan_.chunks.push_back({s.id, s.num_computed, count, s.num_computed + count == s.num_tokens});
    budget_ -= count;
  }

  // Frees pages by preempting the youngest running sequences until `need` fit. False when `i`
  // itself had to go (preempted, or out of memory when it was the last one).
  bool make_room(size_t i, int64_t need) {
    while (need > free_) {
      size_t victim = slots_.size();
      for (size_t j = slots_.size(); j-- > 0;)
        if (!slots_[j].gone) { victim = j; break; }
      if (victim == i && live_count() == 1) {
        slots_[i].gone = true;
        free_ += in_.running[i].pages_held;
        plan_.out_of_memory.push_back(in_.running[i].id);
        return false;
      }
      preempt(victim);
      if (victim == i) return false;
    }
    slots_[i].grown = std::max<int64_t>(need, 0);
    free_ -= slots_[i].grown;
    return true;
  }

  void preempt(size_t j) {
    Slot& slot = slots_[j];
    slot.gone = true;
    free_ += in_.running[j].pages_held + slot.grown;
    if (slot.chunk >= 0) {
      budget_ += plan_.chunks[slot.chunk].count;
      plan_.chunks[slot.chunk].count = 0;
    }
    plan_.preempted.push_back(in_.running[j].id);
  }

  size_t live_count() const {
    return static_cast<size_t>(std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return !s.gone; }));
  }

  void admit_waiting() {
    if (!plan_.preempted.empty() || !plan_.out_of_memory.empty()) return;  // memory is tight: no admission
    size_t running = live_count();
    for (const SchedSeq& w : in_.waiting) {
      if (running >= static_cast<size_t>(in_.limits.max_running)) break;
      const int64_t count = chunk_size(w.num_tokens - w.num_computed);
      if (count <= 0) break;
      const int64_t need = in_.geometry.pages_for(w.num_computed + count) - w.pages_held;
      if (need > free_ - in_.limits.admission_reserve_pages) break;
      free_ -= need;
      budget_ -= count;
      ++running;
      plan_.admitted.push_back(w.id);
      plan_.chunks.push_back({w.id, w.num_computed, count, w.num_computed + count == w.num_tokens});
    }
  }

  const SchedulerInput& in_;
  int64_t free_;
  int64_t budget_;
  std::vector<Slot> slots_;
  BatchPlan plan_;
};

}  // namespace

BatchPlan schedule(const SchedulerInput& in) { return Planner(in).run(); }

}  // namespace tern::engine
