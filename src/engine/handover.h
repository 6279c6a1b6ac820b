// What a prefill engine hands to a decode engine for one request (prefill-decode disaggregation): the
// sequence state after the prompt, the first token the prefill side sampled (with its logprobs) and the
// sampler's random generator after that draw. The rest of the sampling state (penalty counts, stop-string
// matching, tokens generated) follows from the request and the tokens, so the decode side rebuilds it
// and continues exactly as if it had run the prompt itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine/request.h"

namespace tern::engine {

struct Handover {
  std::vector<int32_t> prompt;   // the decode side checks that it continues the same prompt
  int64_t capacity = 0;          // state positions (prompt + max_tokens, within the context): equal layouts
  std::vector<std::byte> state;  // cache::SequenceState::serialize() after the prompt (position == prompt.size())
  GeneratedToken first;          // the first generated token
  std::string rng;               // std::mt19937_64 after drawing it (operator<< text)
};

std::string rng_text(const std::mt19937_64& rng);
// Throws tern::Error when the text is not a generator state.
std::mt19937_64 rng_from_text(const std::string& text);

}  // namespace tern::engine
