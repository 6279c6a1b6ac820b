#include "server/job.h"

#include <utility>

#include "core/error.h"

namespace tern::server {

GenerationJob::GenerationJob(Kind kind, ResponseHead head, GenerationParams params, std::shared_ptr<net::Exchange> exchange,
                             JobContext context)
    : kind_(kind), head_(std::move(head)), params_(std::move(params)), exchange_(std::move(exchange)),
      ctx_(std::move(context)) {}

void GenerationJob::add_prompt(std::vector<int32_t> prompt, const std::function<std::unique_ptr<OutputParser>()>& parser) {
  prompts_.push_back(std::move(prompt));
  for (int i = 0; i < params_.n; ++i) {
    Choice c;
    c.prompt = prompts_.size() - 1;
    c.out.index = static_cast<int>(choices_.size());
    c.out.logprobs = params_.logprobs;
    if (parser) c.parser = parser();
    choices_.push_back(std::move(c));
  }
}

void GenerationJob::start() {
  remaining_ = choices_.size();
  auto self = shared_from_this();
  for (size_t i = 0; i < choices_.size(); ++i) {
    engine::GenerationRequest r;
    r.prompt = prompts_[choices_[i].prompt];
    r.sampling = params_.sampling;
    // n > 1: each choice its own stream of random numbers, reproducible from the request's seed.
    if (r.sampling.seed && i > 0) r.sampling.seed = *r.sampling.seed + i;
    r.stop = params_.stop;
    r.client = ctx_.client;
    try {
      engine::UpdateSink sink = [self, i](engine::RequestUpdate&& u) {
        self->ctx_.post([self, i, u = std::move(u)]() mutable { self->on_update(i, std::move(u)); });
      };
      choices_[i].engine_id = ctx_.submit ? ctx_.submit(i, std::move(r), std::move(sink))
                                          : ctx_.engine->submit(std::move(r), std::move(sink));
    } catch (const Error& e) {
      for (size_t j = 0; j < i; ++j) ctx_.engine->abort(choices_[j].engine_id);
      for (auto& c : choices_) c.done = true;  // their abort updates are ignored; the caller answers
      remaining_ = 0;
      throw net::ApiError(400, e.what(), "prompt");
    }
  }
  // Updates are posted to this (the IO) thread, so none is handled before the stream has begun.
  if (params_.stream) exchange_->begin_stream();
}

void GenerationJob::abort(bool timed_out) {
  if (remaining_ == 0) return;
  timed_out_ = timed_out_ || timed_out;
  for (const auto& c : choices_)
    if (!c.done) ctx_.engine->abort(c.engine_id);
}

// The client-facing part of an engine update: text (through the chat parser), logprobs, finish reason.
ChoiceOut GenerationJob::delta_of(Choice& c, engine::RequestUpdate& u) {
  ChoiceOut d;
  d.index = c.out.index;
  d.logprobs = params_.logprobs;
  d.tokens = std::move(u.tokens);
  if (c.parser) {
    ParsedDelta p = c.parser->push(u.text);
    if (u.finish != engine::FinishReason::none) {
      ParsedDelta rest = c.parser->finish();
      p.content += rest.content;
      p.reasoning += rest.reasoning;
      for (auto& t : rest.tool_calls) p.tool_calls.push_back(std::move(t));
    }
    d.text = std::move(p.content);
    d.reasoning = std::move(p.reasoning);
    d.tool_calls = std::move(p.tool_calls);
  } else {
    d.text = std::move(u.text);
  }
  d.tool_call_base = c.tool_calls;
  c.tool_calls += static_cast<int>(d.tool_calls.size());
  // An aborted choice has no finish_reason ("abort" is not an OpenAI value): the response ends with an
  // error instead (complete()).
  if (u.finish == engine::FinishReason::stop || u.finish == engine::FinishReason::length) {
    const bool tools = c.tool_calls > 0 && u.finish == engine::FinishReason::stop;
    d.finish = tools ? "tool_calls" : engine::finish_reason_name(u.finish);
  }
  return d;
}

void GenerationJob::on_update(size_t index, engine::RequestUpdate&& u) {
  Choice& c = choices_[index];
  if (c.done) return;
  c.completion_tokens = u.completion_tokens;
  if (u.finish == engine::FinishReason::error) {
    failed_ = true;
    error_ = u.error;
  }
  if (u.finish == engine::FinishReason::abort) aborted_ = true;
  ChoiceOut d = delta_of(c, u);
  if (params_.stream) {
    send_chunk(c, std::move(d));
  } else {
    c.out.text += d.text;
    c.out.reasoning += d.reasoning;
    for (auto& t : d.tool_calls) c.out.tool_calls.push_back(std::move(t));
    for (auto& t : d.tokens) c.out.tokens.push_back(std::move(t));
    c.out.finish = d.finish;
  }
  if (u.finish != engine::FinishReason::none) {
    c.done = true;
    if (--remaining_ == 0) complete();
  }
}

void GenerationJob::send_chunk(Choice& c, ChoiceOut&& d) {
  const bool has_content = !d.text.empty() || !d.reasoning.empty() || !d.tool_calls.empty();
  // No content-less chunk before the first token; logprobs of held-back tokens ride with later text.
  if (!has_content && !d.finish && (d.tokens.empty() || !c.sent_first)) {
    for (auto& t : d.tokens) c.out.tokens.push_back(std::move(t));
    return;
  }
  if (!c.out.tokens.empty()) {
    d.tokens.insert(d.tokens.begin(), std::make_move_iterator(c.out.tokens.begin()),
                    std::make_move_iterator(c.out.tokens.end()));
    c.out.tokens.clear();
  }
  const TokenBytes bytes = [codec = ctx_.codec](int32_t t) { return codec->token_bytes(t); };
  const bool first = !c.sent_first;
  c.sent_first = true;
  exchange_->send(sse(kind_ == Kind::chat ? render_chat_chunk(head_, d, first, bytes)
                                          : render_completion_chunk(head_, d, bytes)));
}

Usage GenerationJob::usage() const {
  Usage u;
  for (const auto& p : prompts_) u.prompt_tokens += static_cast<int64_t>(p.size());
  for (const auto& c : choices_) u.completion_tokens += c.completion_tokens;
  return u;
}

void GenerationJob::complete() {
  int status = 200;
  if (timed_out_ || failed_ || aborted_) {
    // A choice aborted without a timeout was cut by shutdown (a client that left reads nothing).
    const net::ApiError e =
        failed_      ? net::ApiError(500, cat("generation failed: ", error_), "", "internal_server_error")
        : timed_out_ ? net::ApiError(504, "the request timed out (--request-timeout)", "", "timeout_error")
                     : net::ApiError(503, "the server is shutting down: the request was cut short", "", "unavailable");
    status = e.status;
    if (params_.stream) {
      exchange_->send(sse(net::render_error(e)));
      exchange_->send(sse("[DONE]"));
      exchange_->end_stream();
    } else {
      exchange_->reply(e.status, "application/json", net::render_error(e));
    }
  } else if (params_.stream) {
    if (params_.include_usage)
      exchange_->send(sse(render_usage_chunk(head_, kind_ == Kind::chat ? "chat.completion.chunk" : "text_completion",
                                             usage())));
    exchange_->send(sse("[DONE]"));
    exchange_->end_stream();
  } else {
    std::vector<ChoiceOut> outs;
    for (auto& c : choices_) outs.push_back(std::move(c.out));
    const TokenBytes bytes = [codec = ctx_.codec](int32_t t) { return codec->token_bytes(t); };
    exchange_->reply(200, "application/json",
                     kind_ == Kind::chat ? render_chat(head_, outs, usage(), bytes)
                                         : render_completion(head_, outs, usage(), bytes));
  }
  completed();
  if (ctx_.on_done) ctx_.on_done(status);
}

}  // namespace tern::server
