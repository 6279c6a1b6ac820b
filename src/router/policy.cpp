#include "router/policy.h"

#include "core/error.h"

namespace tern::router {

Policy parse_policy(const std::string& s) {
  if (s == "round-robin") return Policy::round_robin;
  if (s == "least-loaded") return Policy::least_loaded;
  if (s == "prefix-affinity") return Policy::prefix_affinity;
  throw Error(cat("policy: expected round-robin, least-loaded or prefix-affinity, found \"", s, "\""));
}

const char* policy_name(Policy p) {
  switch (p) {
    case Policy::round_robin: return "round-robin";
    case Policy::least_loaded: return "least-loaded";
    case Policy::prefix_affinity: return "prefix-affinity";
  }
  return "?";
}

namespace {

uint64_t fnv1a(std::string_view a, std::string_view b) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (std::string_view s : {a, std::string_view("\x1f", 1), b})
    for (unsigned char c : s) {
      h ^= c;
      h *= 0x100000001b3ull;
    }
  // Final avalanche (splitmix64) so that near-equal inputs give unrelated weights.
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

size_t least_loaded(std::span<const Candidate> c) {
  size_t best = 0;
  for (size_t i = 1; i < c.size(); ++i) {
    const auto& a = c[i];
    const auto& b = c[best];
    if (a.load_tokens < b.load_tokens || (a.load_tokens == b.load_tokens && a.in_flight < b.in_flight)) best = i;
  }
  return best;
}

}  // namespace

size_t choose(Policy policy, std::span<const Candidate> c, std::string_view key, PolicyState& state) {
  TERN_CHECK(!c.empty(), "router policy: no candidates");
  switch (policy) {
    case Policy::round_robin: {
      // The first candidate at or after the cursor, in pool order (candidates are in pool order).
      size_t pick = 0;
      for (size_t i = 0; i < c.size(); ++i)
        if (c[i].index >= state.next) {
          pick = i;
          break;
        }
      state.next = c[pick].index + 1;
      return pick;
    }
    case Policy::least_loaded: return least_loaded(c);
    case Policy::prefix_affinity: {
      size_t best = 0;
      uint64_t best_w = 0;
      for (size_t i = 0; i < c.size(); ++i) {
        const uint64_t w = fnv1a(key, c[i].url);
        if (i == 0 || w > best_w) best = i, best_w = w;
      }
      const size_t light = least_loaded(c);
      if (c[best].load_tokens > 2 * c[light].load_tokens + state.affinity_slack_tokens) return light;
      return best;
    }
  }
  return 0;
}

}  // namespace tern::router
