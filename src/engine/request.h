// What a client asks the engine for and what it gets back. The server fills GenerationRequest from the
// OpenAI fields; the engine calls the request's sink from its own thread with each step's output.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tern::engine {

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float presence_penalty = 0.0f;   // output tokens only (OpenAI)
  float frequency_penalty = 0.0f;  // output tokens only (OpenAI)
  float repetition_penalty = 1.0f; // prompt and output tokens (CTRL / HF)
  std::optional<uint64_t> seed;    // same seed, same output; unset: drawn per request
  int top_logprobs = -1;           // -1: no logprobs; 0..20: the chosen token's and this many more

  bool greedy() const { return temperature <= 0.0f || top_k == 1; }
  // Whether any penalty reads the history (the sampler's penalties; the engine keeps the history only then).
  bool penalised() const { return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f; }
};

struct StopParams {
  int64_t max_tokens = 16;
  std::vector<std::string> stop;         // matched on the output bytes, across tokens; not returned
  std::vector<int32_t> stop_token_ids;   // generated but not returned as text
  bool ignore_eos = false;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  StopParams stop;
  // Prefill role: after the prompt, sample the first token, export the state (RequestUpdate::handover)
  // and finish with FinishReason::handover; a decode engine continues it (engine/handover.h).
  bool handover = false;
  // Who asked (a key of the client, 0: unknown): the scheduler shares running slots fairly between
  // clients (scheduler.h).
  uint64_t client = 0;
};

// handover: the request's state and first token moved to another engine (prefill role).
enum class FinishReason : uint8_t { none, stop, length, abort, error, handover };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort", "error", "handover"

// Lifecycle: waiting -> prefilling -> decoding -> finished | aborted. A preempted request goes back to
// waiting with its generated tokens kept and its state recomputed from them. A request prefilled by
// another engine (Engine::submit_remote) starts transferring (state memory reserved, state on its way)
// and goes to decoding when its state has been imported.
enum class RequestState : uint8_t { waiting, transferring, prefilling, decoding, finished, aborted };
const char* request_state_name(RequestState s);

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct GeneratedToken {
  int32_t token = 0;
  float logprob = 0.0f;             // log-softmax of the raw logits
  std::vector<TokenLogprob> top;    // top_logprobs alternatives, best first
};

// One step's news for a request. `text` is valid UTF-8 with stop strings removed; bytes held back
// while a stop string might still match (or a UTF-8 character is incomplete) come with a later update.
// A stop token or EOS counts in completion_tokens but is not in `tokens` or `text`.
struct Handover;  // engine/handover.h

struct RequestUpdate {
  std::vector<GeneratedToken> tokens;
  std::string text;
  FinishReason finish = FinishReason::none;
  std::string error;  // when finish == error
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  std::shared_ptr<const Handover> handover;  // with FinishReason::handover
};

using UpdateSink = std::function<void(RequestUpdate&&)>;

}  // namespace tern::engine
