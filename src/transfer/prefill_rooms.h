// The prefill side of prefill-decode disaggregation. It listens on the bootstrap port; a room is the
// meeting of two halves: the router's request (expect(), from the HTTP handler) and the decode server's
// control connection (its `hello`). Protocol, per room, after both halves met:
//   decode: hello -> prefill: accept -> decode: reserved (state memory held) -> prefill runs the prompt
//   -> prefill: offer (state size, first token, sampler) -> decode: ready (where to write) -> prefill
//   writes the state through the backend -> prefill: done -> decode imports -> decode: ack.
// Any failure ends the room on both sides with a reason (error frame, closed connection, timeout);
// the HTTP request that registered the room then answers with it. Runs on the io_context's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include "engine/handover.h"
#include "transfer/backend.h"
#include "transfer/messages.h"
#include "transfer/pd_common.h"

namespace tern::transfer {

// The router's half of a room.
struct PrefillRequest {
  RoomKey key;
  int64_t prompt_len = 0;
  uint64_t prompt_hash = 0;
  int64_t capacity = 0;
  // Submits the prompt to the engine (called once the decode side has reserved state memory); the
  // engine's handover then comes back through prefilled(). Throwing fails the room.
  std::function<void()> start;
  // The room ended: ok, or why not (called once, on the io thread).
  std::function<void(bool ok, const std::string& why)> ended;
};

class PrefillRooms {
 public:
  PrefillRooms(boost::asio::io_context& io, const std::string& host, uint16_t port, PdOptions options, Backend& backend);
  ~PrefillRooms();
  uint16_t port() const;
  // The served model's name (known once loaded): decode servers must serve the same.
  void set_model(std::string model) { options_.model = std::move(model); }
  // Registers the router's half; throws tern::Error when the room is already registered.
  void expect(PrefillRequest request);
  // The engine ran the prompt and sampled the first token.
  void prefilled(const RoomKey& key, std::shared_ptr<const engine::Handover> handover);
  // This side gives up on the room (the router went away, the engine failed): the decode side is told.
  void fail(const RoomKey& key, const std::string& why);
  void close();  // stops accepting connections (shutdown)
  PdMetrics metrics() const;

  struct Room;

 private:
  void on_channel(std::shared_ptr<Channel> channel);
  void on_hello(const std::shared_ptr<Channel>& channel, const std::string& payload);
  void on_frame(const RoomKey& key, Frame type, std::string payload);
  void match(Room& room);
  void send_state(Room& room, const std::string& descriptor);
  void end(const RoomKey& key, bool ok, FailReason reason, const std::string& why, bool tell_peer);
  void arm(Room& room, std::chrono::milliseconds after, FailReason reason, const std::string& what);

  boost::asio::io_context& io_;
  PdOptions options_;
  Backend& backend_;
  std::unique_ptr<Listener> listener_;
  std::unordered_map<RoomKey, std::unique_ptr<Room>, RoomKeyHash> rooms_;
  PdMetrics metrics_;
};

}  // namespace tern::transfer
