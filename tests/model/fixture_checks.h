// The bf16-activation checks of a whole model against a fixture prompt set, shared by the GPU model test
// (tests/gpu/test_gpu_model.cpp) and the CPU with the GPU's rounding (Bf16Activations in test_device.cpp):
// teacher-forced logits within kBf16Tolerance * max|ref| per prompt and top-1 >= kBf16Top1 over the
// positions; greedy continuations (prefill, then one forward per token) equal to the reference's, and at
// least kBf16Top1 of their steps with logits within kBf16Tolerance * max|that step's ref| (a near-tie routing
// or indexer flip that keeps the token moves one step's logits further). Asserted (gtest) when `judge`,
// printed always.
#pragma once

#include <string>

#include "fixture.h"
#include "model/v4_model.h"

namespace tern::test {

constexpr float kBf16Tolerance = 2e-2f;
constexpr double kBf16Top1 = 0.99;
// The prompt set the bounds are judged on (prompts kept only where the reference's bf16 runs keep every
// decision: make_fixtures.py); "prompt", the main set, is reported only.
constexpr const char* kBf16Set = "bf16.prompt";

// `who` labels the printed lines ("gpu", "cpu bf16-x"); the sequence states must live on `device`.
void check_teacher_forced(model::Model& m, Device device, const Fixture& f, const std::string& set, bool judge,
                          const std::string& who);
void check_greedy(model::Model& m, Device device, const Fixture& f, const std::string& set, bool judge,
                  const std::string& who);

// The bf16 set's smallest router / indexer top-k gaps in the reference's bf16 runs (bf16.min_*_gap).
void print_bf16_set_gaps(const Fixture& f, const std::string& who);

// Prompt p of `f` prefilled, then decoded token by token greedily as long as the reference's continuation
// (prompt.<p>.greedy): the tokens must be the reference's, and where the fixture stores every step's logits
// (prompt.<p>.greedy_logits) each within tolerance * max|that step's ref|. Returns the worst step's max|d|/max|ref|
// (0 without step logits). The states live on the model's device.
float check_greedy_exact(model::Model& m, const Fixture& f, int p, float tolerance);

// One code path for every step shape (issue #17): three sequences through 24 steps of 1..kMaxStepQueries tokens
// each (mixed in a step; long enough that CSA and HCA windows close inside them) on `tables` (the step tables)
// and on `chunks` (set_step_tables(false): per sequence), the same models on the same device: every step's logits
// of every token, and the final states, must be the same bits. `what` names the run in failures.
void check_step_tables_match_chunks(model::Model& tables, model::Model& chunks, const std::string& what);

// Mixed steps (issue #15 item 5): four sequences through 16 steps in which one brings prefill-sized chunks (and
// another now and then 5..7 tokens) beside the others' 1..kMaxStepQueries: the chunks run per sequence and the
// rest on the step tables in the same step. Every token's logits and the final states must be the bits of
// `chunks` (every step per sequence), and `tables`' step_paths() must show the mixed steps.
void check_mixed_steps_match_chunks(model::Model& tables, model::Model& chunks, const std::string& what);

}  // namespace tern::test
