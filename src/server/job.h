// One /v1/completions or /v1/chat/completions request in flight: its choices (prompts x n) as engine
// requests, the text and logprobs they produce, and the response (one JSON body, or an SSE stream of
// chunks then usage then [DONE]). Lives on the IO thread; engine updates are posted to it.
#pragma once

#include <functional>
#include <utility>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "net/http.h"
#include "server/schemas.h"
#include "server/text_codec.h"

namespace tern::server {

struct JobContext {
  engine::Engine* engine = nullptr;
  const TextCodec* codec = nullptr;
  std::function<void(std::function<void()>)> post;  // to the IO thread
  std::function<void(int status)> on_done;           // status answered (200 for a finished stream)
  // Decode role: submits choice i's engine request in place of engine->submit (its state comes from a
  // prefill server; pd_service.cpp). Returns the engine id; throws like submit.
  std::function<uint64_t(size_t choice, engine::GenerationRequest, engine::UpdateSink)> submit;
  uint64_t client = 0;  // the engine's fair-scheduling key of the request's client (admission.h)
};

// A request in flight, as the service drives it: started once, aborted when the client goes or the
// request times out, complete when it has answered.
class Job {
 public:
  virtual ~Job() = default;
  virtual void start() = 0;  // throws net::ApiError when refused (nothing is left running then)
  virtual void abort(bool timed_out) = 0;
  virtual bool finished() const = 0;
  // Called once when the response is complete (e.g. to cancel the request's timeout).
  void on_complete(std::function<void()> fn) { on_complete_ = std::move(fn); }

 protected:
  void completed() {
    if (on_complete_) std::exchange(on_complete_, nullptr)();
  }

 private:
  std::function<void()> on_complete_;
};

class GenerationJob : public Job, public std::enable_shared_from_this<GenerationJob> {
 public:
  enum class Kind { completion, chat };
  GenerationJob(Kind kind, ResponseHead head, GenerationParams params, std::shared_ptr<net::Exchange> exchange,
                JobContext context);

  // A prompt and its n choices; `parser` makes the chat output parser of each choice.
  void add_prompt(std::vector<int32_t> prompt, const std::function<std::unique_ptr<OutputParser>()>& parser);
  // Submits every choice (throws net::ApiError when the engine refuses one; none is left running then).
  void start() override;
  // Client gone or timed out: aborts every choice; the response is then an error (or nothing).
  void abort(bool timed_out) override;
  bool finished() const override { return remaining_ == 0; }

 private:
  struct Choice {
    size_t prompt = 0;
    uint64_t engine_id = 0;
    std::unique_ptr<OutputParser> parser;
    ChoiceOut out;            // accumulated (non-stream)
    bool sent_first = false;  // stream: the role went out
    int tool_calls = 0;
    int64_t completion_tokens = 0;
    bool done = false;
  };

  void on_update(size_t index, engine::RequestUpdate&& u);
  ChoiceOut delta_of(Choice& c, engine::RequestUpdate& u);
  void send_chunk(Choice& c, ChoiceOut&& delta);
  void complete();
  Usage usage() const;
  std::string sse(const std::string& data) const { return "data: " + data + "\n\n"; }

  Kind kind_;
  ResponseHead head_;
  GenerationParams params_;
  std::shared_ptr<net::Exchange> exchange_;
  JobContext ctx_;
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<Choice> choices_;
  size_t remaining_ = 0;
  bool timed_out_ = false;
  bool failed_ = false;
  bool aborted_ = false;  // a choice ended with FinishReason::abort
  std::string error_;
};

}  // namespace tern::server
