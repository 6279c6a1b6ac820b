// One sequence's part of a forward step: its state and the new tokens it brings (a prefill chunk, a decode token,
// or k + 1 tokens to verify), and which of their rows' logits the step returns. What Model::forward takes, and what
// the step tables (model/step_tables.h) are built from.
#pragma once

#include <cstdint>
#include <span>

#include "cache/sequence_state.h"

namespace tern::model {

enum class LogitsFor : uint8_t { none, last, all };

struct StepSequence {
  cache::SequenceState* state = nullptr;  // advanced by forward()
  std::span<const int64_t> tokens;        // the new tokens, at positions state->position() + i
  LogitsFor logits = LogitsFor::last;
};

}  // namespace tern::model
