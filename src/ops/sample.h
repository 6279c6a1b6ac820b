// Picking the next token from a row of logits (host). Greedy is argmax with the lowest index on ties
// (torch.argmax); sampling draws from softmax(logits / temperature) with a seeded generator.
#pragma once

#include <cstdint>
#include <span>

namespace tern::ops {

int64_t argmax(std::span<const float> logits);

// A small deterministic generator (splitmix64), so a seed gives the same tokens everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  double uniform();  // [0, 1)

 private:
  uint64_t state_;
};

// temperature <= 0 means greedy.
int64_t sample(std::span<const float> logits, float temperature, Rng& rng);

}  // namespace tern::ops
