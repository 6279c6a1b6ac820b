// How the router picks a server from the candidates that are up: pure functions, unit-tested.
//   round-robin:     the next candidate after the last pick, in pool order;
//   least-loaded:    the fewest in-flight tokens (estimated prompt tokens + max_tokens not yet streamed),
//                    then the fewest in-flight requests, then pool order;
//   prefix-affinity: rendezvous hashing of the prompt's first bytes with each server's URL, so the same
//                    prefix goes to the same server while it is up and moves as little as possible when
//                    servers come and go. A server loaded over twice the least-loaded one plus
//                    `affinity_slack_tokens` is passed over for the least-loaded one.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace tern::router {

enum class Policy { round_robin, least_loaded, prefix_affinity };
Policy parse_policy(const std::string& s);  // throws tern::Error naming the choices
const char* policy_name(Policy p);

struct Candidate {
  std::string_view url;
  size_t index = 0;  // position in its pool (round-robin order)
  int64_t load_tokens = 0;
  int64_t in_flight = 0;
};

struct PolicyState {
  size_t next = 0;  // round-robin cursor (a pool index)
  int64_t affinity_slack_tokens = 2048;
};

// Index into `candidates` (non-empty) of the chosen one.
size_t choose(Policy policy, std::span<const Candidate> candidates, std::string_view affinity_key, PolicyState& state);

}  // namespace tern::router
