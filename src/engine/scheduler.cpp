#include "engine/scheduler.h"

#include <algorithm>
#include <map>

namespace tern::engine {

int64_t BatchPlan::num_tokens() const {
  int64_t n = 0;
  for (const auto& c : chunks) n += c.count + c.drafts;
  return n;
}

namespace {

// Interleaves `items` (in their order) so that each client's first comes before anyone's second:
// round r holds the r-th item of every client, clients in the order of their first item.
template <class ClientOf>
std::vector<size_t> round_robin(const std::vector<size_t>& items, ClientOf client_of) {
  std::vector<std::vector<size_t>> by_client;
  std::map<uint64_t, size_t> slot;
  for (size_t i : items) {
    auto [it, fresh] = slot.try_emplace(client_of(i), by_client.size());
    if (fresh) by_client.emplace_back();
    by_client[it->second].push_back(i);
  }
  std::vector<size_t> out;
  for (size_t round = 0; out.size() < items.size(); ++round)
    for (const auto& list : by_client)
      if (round < list.size()) out.push_back(list[round]);
  return out;
}

// Working state of one schedule() call.
class Planner {
 public:
  explicit Planner(const SchedulerInput& in)
      : in_(in), free_(in.free_pages), budget_(in.limits.token_budget), slots_(in.running.size()) {
    for (const auto& s : in.running) ++running_of_[s.client];
  }

  BatchPlan run() {
    std::vector<size_t> prefilling;
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (remaining(i) == 1) schedule_running(i);
      else if (remaining(i) > 1) prefilling.push_back(i);
    }
    for (size_t i : round_robin(prefilling, [&](size_t j) { return in_.running[j].client; })) schedule_running(i);
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
    const int64_t drafts = remaining(i) == 1 ? std::clamp<int64_t>(budget_ - count, 0, s.lookahead) : 0;
    if (!make_room(i, in_.geometry.pages_for(s.num_computed + count + drafts) - s.pages_held)) return;
    slots_[i].chunk = static_cast<int>(plan_.chunks.size());
    plan_.chunks.push_back({s.id, s.num_computed, count, s.num_computed + count == s.num_tokens, drafts});
    budget_ -= count + drafts;
  }

  // The client with the most running sequences now (ties: the one whose youngest is youngest).
  uint64_t busiest_client() const {
    uint64_t best = 0;
    int64_t most = -1;
    for (size_t j = slots_.size(); j-- > 0;) {
      if (slots_[j].gone) continue;
      const uint64_t c = in_.running[j].client;
      if (running_of_.at(c) > most) {
        most = running_of_.at(c);
        best = c;
      }
    }
    return best;
  }

  // The youngest live running sequence of the busiest client (slots_.size() when none is live).
  size_t victim() const {
    const uint64_t c = busiest_client();
    for (size_t j = slots_.size(); j-- > 0;)
      if (!slots_[j].gone && in_.running[j].client == c) return j;
    return slots_.size();
  }

  // Frees pages by preempting running sequences (victim()) until `need` fit. False when `i` itself
  // had to go (preempted, or out of memory when it was the last one).
  bool make_room(size_t i, int64_t need) {
    while (need > free_) {
      const size_t v = victim();
      if (v == i && live_count() == 1) {
        slots_[i].gone = true;
        --running_of_[in_.running[i].client];
        free_ += in_.running[i].pages_held;
        plan_.out_of_memory.push_back(in_.running[i].id);
        return false;
      }
      preempt(v);
      if (v == i) return false;
    }
    slots_[i].grown = std::max<int64_t>(need, 0);
    free_ -= slots_[i].grown;
    return true;
  }

  void preempt(size_t j) {
    Slot& slot = slots_[j];
    slot.gone = true;
    --running_of_[in_.running[j].client];
    free_ += in_.running[j].pages_held + slot.grown;
    if (slot.chunk >= 0) {
      budget_ += plan_.chunks[slot.chunk].count + plan_.chunks[slot.chunk].drafts;
      plan_.chunks[slot.chunk].count = 0;
      plan_.chunks[slot.chunk].drafts = 0;
    }
    plan_.preempted.push_back(in_.running[j].id);
  }

  size_t live_count() const {
    return static_cast<size_t>(std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return !s.gone; }));
  }

  bool fits(int64_t need, size_t running) const {
    return running < static_cast<size_t>(in_.limits.max_running) && need <= free_ - in_.limits.admission_reserve_pages;
  }

  // Fair share for `client`'s next sequence: preempts the busiest client's youngest sequences while it
  // holds at least two more running sequences than `client`, until `need` pages and a slot are free.
  bool claim_share(uint64_t client, int64_t need, size_t& running) {
    while (!fits(need, running)) {
      const size_t v = victim();
      if (v == slots_.size()) return false;
      const uint64_t busiest = in_.running[v].client;
      if (busiest == client || running_of_[busiest] < running_of_[client] + 2) return false;
      preempt(v);
      --running;
    }
    return true;
  }

  void admit_waiting() {
    if (!plan_.preempted.empty() || !plan_.out_of_memory.empty()) return;  // memory is tight: no admission
    size_t running = live_count();
    // Each client's waiting sequences in queue order; the next admitted always comes from the client
    // with the fewest running sequences (ties: the one that has waited longest).
    std::map<uint64_t, std::vector<size_t>> queue;
    for (size_t w = 0; w < in_.waiting.size(); ++w) queue[in_.waiting[w].client].push_back(w);
    std::map<uint64_t, size_t> next;
    for (;;) {
      const SchedSeq* w = nullptr;
      for (const auto& [client, list] : queue) {
        const size_t k = next[client];
        if (k == list.size()) continue;
        const SchedSeq* head = &in_.waiting[list[k]];
        if (!w || running_of_[client] < running_of_[w->client] ||
            (running_of_[client] == running_of_[w->client] && list[k] < static_cast<size_t>(w - in_.waiting.data())))
          w = head;
      }
      if (!w) return;
      const int64_t count = chunk_size(w->num_tokens - w->num_computed);
      if (count <= 0) return;
      const int64_t need = in_.geometry.pages_for(w->num_computed + count) - w->pages_held;
      if (!claim_share(w->client, need, running)) return;
      free_ -= need;
      budget_ -= count;
      ++running;
      ++running_of_[w->client];
      ++next[w->client];
      plan_.admitted.push_back(w->id);
      plan_.chunks.push_back({w->id, w->num_computed, count, w->num_computed + count == w->num_tokens});
    }
  }

  const SchedulerInput& in_;
  int64_t free_;
  int64_t budget_;
  std::vector<Slot> slots_;
  std::map<uint64_t, int64_t> running_of_;  // live running sequences per client, admissions included
  BatchPlan plan_;
};

}  // namespace

BatchPlan schedule(const SchedulerInput& in) { return Planner(in).run(); }

}  // namespace tern::engine
