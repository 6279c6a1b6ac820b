#include "server/pd_jobs.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "net/room.h"

namespace tern::server {

Role parse_role(const std::string& s) {
  if (s == "both") return Role::both;
  if (s == "prefill") return Role::prefill;
  if (s == "decode") return Role::decode;
  throw Error(cat("--role: expected both, prefill or decode, found \"", s, "\""));
}

const char* role_name(Role r) {
  switch (r) {
    case Role::both: return "both";
    case Role::prefill: return "prefill";
    case Role::decode: return "decode";
  }
  return "?";
}

std::function<uint64_t(size_t, engine::GenerationRequest, engine::UpdateSink)> remote_submit(
    engine::Engine& engine, transfer::DecodeRooms& rooms, std::function<void(std::function<void()>)> post, uint64_t room,
    std::string bootstrap) {
  return [&engine, &rooms, post, room, bootstrap](size_t i, engine::GenerationRequest r, engine::UpdateSink sink) {
    const transfer::RoomKey key{room, static_cast<uint32_t>(i)};
    transfer::DecodeRequest d;
    d.key = key;
    d.bootstrap = bootstrap;
    d.prompt = r.prompt;
    d.capacity = engine.capacity_for(static_cast<int64_t>(r.prompt.size()), r.stop.max_tokens);
    auto* rooms_ptr = &rooms;
    d.engine_id = engine.submit_remote(
        std::move(r),
        [sink = std::move(sink), rooms_ptr, key, post](engine::RequestUpdate&& u) {
          if (u.finish != engine::FinishReason::none) post([rooms_ptr, key] { rooms_ptr->ended(key); });
          sink(std::move(u));
        },
        [rooms_ptr, key, post] { post([rooms_ptr, key] { rooms_ptr->reserved(key); }); });
    const uint64_t id = d.engine_id;
    try {
      rooms.begin(std::move(d));
    } catch (...) {
      engine.abort(id);
      throw;
    }
    return id;
  };
}

PrefillJob::PrefillJob(uint64_t room, GenerationParams params, std::shared_ptr<net::Exchange> exchange, JobContext context,
                       transfer::PrefillRooms& rooms)
    : room_(room), params_(std::move(params)), exchange_(std::move(exchange)), ctx_(std::move(context)), rooms_(rooms) {}

void PrefillJob::add_prompt(std::vector<int32_t> prompt) {
  prompts_.push_back(std::move(prompt));
  for (int i = 0; i < params_.n; ++i) {
    Choice c;
    c.prompt = prompts_.size() - 1;
    c.key = {room_, static_cast<uint32_t>(choices_.size())};
    choices_.push_back(c);
  }
}

void PrefillJob::start() {
  remaining_ = choices_.size();
  auto self = shared_from_this();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const auto& prompt = prompts_[choices_[i].prompt];
    transfer::PrefillRequest r;
    r.key = choices_[i].key;
    r.prompt_len = static_cast<int64_t>(prompt.size());
    r.prompt_hash = transfer::prompt_hash(prompt);
    r.capacity = ctx_.engine->capacity_for(r.prompt_len, params_.stop.max_tokens);
    r.start = [self, i] { self->submit(i); };
    r.ended = [self, i](bool ok, const std::string& why) { self->on_end(i, ok, why); };
    try {
      rooms_.expect(std::move(r));
    } catch (const Error& e) {
      for (size_t j = 0; j < i; ++j) {
        choices_[j].done = true;  // their end callbacks are ignored; the caller answers
        rooms_.fail(choices_[j].key, "the request was refused");
      }
      remaining_ = 0;
      throw net::ApiError(400, e.what(), "", "invalid_request_error");
    }
  }
}

// The decode server has reserved memory: run the prompt; the handover comes back in on_engine.
void PrefillJob::submit(size_t i) {
  engine::GenerationRequest r;
  r.prompt = prompts_[choices_[i].prompt];
  r.sampling = params_.sampling;
  if (r.sampling.seed && i > 0) r.sampling.seed = *r.sampling.seed + i;  // as GenerationJob: choice i, seed + i
  r.stop = params_.stop;
  r.handover = true;
  r.client = ctx_.client;
  auto self = shared_from_this();
  choices_[i].engine_id = ctx_.engine->submit(std::move(r), [self, i](engine::RequestUpdate&& u) {
    if (u.finish == engine::FinishReason::none) return;
    self->ctx_.post([self, i, u = std::move(u)]() mutable { self->on_engine(i, std::move(u)); });
  });
  choices_[i].running = true;
}

void PrefillJob::on_engine(size_t i, engine::RequestUpdate&& u) {
  Choice& c = choices_[i];
  c.running = false;
  if (c.done) return;
  if (u.finish == engine::FinishReason::handover && u.handover) return rooms_.prefilled(c.key, std::move(u.handover));
  rooms_.fail(c.key, u.finish == engine::FinishReason::error ? cat("prefill engine: ", u.error)
                                                             : std::string("the prefill request was aborted"));
}

void PrefillJob::on_end(size_t i, bool ok, const std::string& why) {
  Choice& c = choices_[i];
  if (c.done) return;
  c.done = true;
  c.ok = ok;
  c.error = why;
  if (c.running) ctx_.engine->abort(c.engine_id);
  if (--remaining_ == 0) complete();
}

void PrefillJob::abort(bool timed_out) {
  timed_out_ = timed_out_ || timed_out;
  for (auto& c : choices_)
    if (!c.done) rooms_.fail(c.key, timed_out ? "the prefill request timed out (--request-timeout)"
                                              : "the router closed the prefill request");
}

void PrefillJob::complete() {
  int status = 200;
  const Choice* failed = nullptr;
  for (const auto& c : choices_)
    if (!c.ok && !failed) failed = &c;
  if (failed) {
    const net::ApiError e =
        timed_out_ ? net::ApiError(504, failed->error, "", "timeout_error")
                   : net::ApiError(502, cat("state transfer of room ", failed->key.name(), " failed: ", failed->error), "",
                                   "transfer_error");
    status = e.status;
    exchange_->reply(e.status, "application/json", net::render_error(e));
  } else {
    nlohmann::json j = {{"object", "tern.prefill"}, {"room", net::room_hex(room_)},
                        {"transfers", choices_.size()}};
    exchange_->reply(200, "application/json", j.dump());
  }
  completed();
  if (ctx_.on_done) ctx_.on_done(status);
}

}  // namespace tern::server
