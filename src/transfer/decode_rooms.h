// The decode side of prefill-decode disaggregation (protocol in prefill_rooms.h). For each remote
// request (Engine::submit_remote) it connects to the prefill server's bootstrap port, says what it
// expects, tells the prefill side when the engine has reserved state memory, lands the state through
// the backend and hands it to the engine. Any failure fails the engine request with the reason, which
// frees its reserved memory. Runs on the io_context's thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "transfer/backend.h"
#include "transfer/messages.h"
#include "transfer/pd_common.h"

namespace tern::transfer {

struct DecodeRequest {
  RoomKey key;
  std::string bootstrap;  // the prefill server's "host:port"
  std::vector<int32_t> prompt;
  int64_t capacity = 0;
  uint64_t engine_id = 0;  // from Engine::submit_remote
};

// "host:port" or "[v6]:port"; throws tern::Error naming the problem.
std::pair<std::string, uint16_t> parse_host_port(const std::string& s);

class DecodeRooms {
 public:
  DecodeRooms(boost::asio::io_context& io, PdOptions options, Backend& backend, engine::Engine& engine);
  ~DecodeRooms();
  // Starts the transfer of a request already submitted with submit_remote (call before its
  // on_reserved can run, i.e. on the io thread right after submitting).
  void begin(DecodeRequest request);
  // The engine reserved the request's state memory (its on_reserved, posted to the io thread).
  void reserved(const RoomKey& key);
  // The engine request finished (aborted, failed): the transfer, if still going, is abandoned.
  void ended(const RoomKey& key);
  PdMetrics metrics() const;

  struct Room;

 private:
  void on_frame(const RoomKey& key, Frame type, std::string payload);
  void on_offer(Room& room, const std::string& payload);
  void on_done(Room& room);
  void imported(const RoomKey& key, const std::string& error);
  void end(const RoomKey& key, bool ok, FailReason reason, const std::string& why, bool fail_engine);

  boost::asio::io_context& io_;
  PdOptions options_;
  Backend& backend_;
  engine::Engine& engine_;
  std::unordered_map<RoomKey, std::unique_ptr<Room>, RoomKeyHash> rooms_;
  PdMetrics metrics_;
};

}  // namespace tern::transfer
