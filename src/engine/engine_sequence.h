// One request inside the engine (internal to engine.cpp and engine_remote.cpp).
#pragma once

#include <chrono>
#include <functional>
#include <random>
#include <vector>

#include "engine/engine.h"
#include "engine/text_stream.h"

namespace tern::engine {

struct Engine::Sequence {
  uint64_t id = 0;
  GenerationRequest request;
  UpdateSink sink;
  std::vector<int32_t> tokens;  // prompt, then generated
  int64_t prompt_len = 0;
  int64_t num_computed = 0;
  int64_t generated = 0;  // completion tokens, stop tokens included
  RequestState state = RequestState::waiting;
  bool remote = false;    // submit_remote: its prompt runs on another engine
  bool reserved = false;  // remote, state memory reserved, state not yet imported
  std::function<void()> on_reserved;
  std::mt19937_64 rng;
  TokenHistory history;
  TextStream text;
  Clock::time_point arrival, last_token;

  // Past its first token with exactly that token left to consume: a decode step (which may verify drafts).
  bool decoding() const {
    return num_computed >= 1 && generated >= 1 && static_cast<int64_t>(tokens.size()) - num_computed == 1;
  }
};

}  // namespace tern::engine
