// The HTTP side of prefill-decode disaggregation (docs/disaggregation.md). `tern serve --role`:
// both (prompt and decoding here; requests from clients), prefill (runs the prompts of requests the
// router sends, hands their state to a decode server and answers the router with how that went), decode
// (continues requests whose prompt ran on a prefill server and streams them to the client). The router
// marks a request with X-Tern-Room (and, for the decode server, X-Tern-Bootstrap).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "server/job.h"
#include "transfer/decode_rooms.h"
#include "transfer/prefill_rooms.h"

namespace tern::server {

enum class Role { both, prefill, decode };
Role parse_role(const std::string& s);  // throws tern::Error for anything else
const char* role_name(Role r);

struct PdContext {
  Role role = Role::both;
  transfer::PrefillRooms* prefill = nullptr;  // role prefill
  transfer::DecodeRooms* decode = nullptr;    // role decode
  std::string bootstrap;                      // role prefill: "host:port" decode servers connect to
};

// Decode role: the JobContext::submit of a GenerationJob whose choices' states come from the prefill
// server at `bootstrap` through room `room`.
std::function<uint64_t(size_t, engine::GenerationRequest, engine::UpdateSink)> remote_submit(
    engine::Engine& engine, transfer::DecodeRooms& rooms, std::function<void(std::function<void()>)> post, uint64_t room,
    std::string bootstrap);

// Prefill role: one request from the router. Each choice (prompts x n) becomes a room; its prompt runs
// once the decode server has reserved memory, and its state goes there. The answer (JSON) says which
// rooms succeeded; any failure makes it an error naming the first reason.
class PrefillJob : public Job, public std::enable_shared_from_this<PrefillJob> {
 public:
  PrefillJob(uint64_t room, GenerationParams params, std::shared_ptr<net::Exchange> exchange, JobContext context,
             transfer::PrefillRooms& rooms);
  void add_prompt(std::vector<int32_t> prompt);
  void start() override;
  void abort(bool timed_out) override;
  bool finished() const override { return remaining_ == 0; }

 private:
  struct Choice {
    size_t prompt = 0;
    transfer::RoomKey key;
    uint64_t engine_id = 0;
    bool running = false;  // in the engine
    bool done = false;
    bool ok = false;
    std::string error;
  };
  void submit(size_t i);
  void on_engine(size_t i, engine::RequestUpdate&& u);
  void on_end(size_t i, bool ok, const std::string& why);
  void complete();

  uint64_t room_;
  GenerationParams params_;
  std::shared_ptr<net::Exchange> exchange_;
  JobContext ctx_;
  transfer::PrefillRooms& rooms_;
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<Choice> choices_;
  size_t remaining_ = 0;
  bool timed_out_ = false;
};

}  // namespace tern::server
