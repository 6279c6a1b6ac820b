// What a prefill engine hands to a decode engine for one request (prefill-decode disaggregation): the
// sequence state after the prompt, the first token the prefill side sampled (with its logprobs) and the
// sampler's random generator after that draw. The rest of the sampling state (penalty counts, stop-string
// matching, tokens generated) follows from the request and the tokens, so the decode side rebuilds it
// and continues exactly as if it had run the prompt itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "engine/request.h"

namespace tern::engine {

struct Handover {
  std::vector<int32_t> prompt;   // the decode side checks that it continues the same prompt
  int64_t capacity = 0;          // state positions (prompt + max_tokens, within the context): equal layouts
  // cache::SequenceState::export_to() after the prompt (position == prompt.size()): u8, on the host or the
  // state's device. `state_owner` keeps it alive where the handover owns it (the prefill side); the
  // decode side's view into a transfer's landing is valid until provide_state()'s done callback.
  TensorView state;
  std::shared_ptr<const void> state_owner;
  GeneratedToken first;          // the first generated token
  std::string rng;               // std::mt19937_64 after drawing it (operator<< text)
};

std::string rng_text(const std::mt19937_64& rng);
// Throws tern::Error when the text is not a generator state.
std::mt19937_64 rng_from_text(const std::string& text);

}  // namespace tern::engine
