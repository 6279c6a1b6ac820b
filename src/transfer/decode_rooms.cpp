#include "transfer/decode_rooms.h"

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <optional>

#include "core/error.h"
#include "core/log.h"

namespace tern::transfer {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

enum class DecodePhase { connecting, hello_sent, accepted, reserved_sent, ready_sent, importing };

struct DecodeRooms::Room {
  explicit Room(asio::io_context& io) : timer(io) {}
  DecodeRequest request;
  DecodePhase phase = DecodePhase::connecting;
  bool reserved = false;
  std::shared_ptr<Channel> channel;
  std::optional<Offer> offer;
  std::unique_ptr<Landing> landing;
  asio::steady_timer timer;
  Clock::time_point ready_at;
  // When each phase ended (PdPhase order), from the request's arrival at marks[0]: tern:pd_phase_seconds.
  std::array<Clock::time_point, static_cast<size_t>(PdPhase::count_) + 1> marks{};
  void mark(PdPhase p) { marks[static_cast<size_t>(p) + 1] = Clock::now(); }
};

std::pair<std::string, uint16_t> parse_host_port(const std::string& s) {
  const std::string bad = cat("bootstrap address: expected host:port, found \"", s, "\"");
  const size_t colon = s.rfind(':');
  TERN_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < s.size(), bad);
  std::string host = s.substr(0, colon);
  if (host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  unsigned long port = 0;
  try {
    size_t used = 0;
    port = std::stoul(s.substr(colon + 1), &used);
    TERN_CHECK(used == s.size() - colon - 1, bad);
  } catch (const std::logic_error&) {
    throw Error(bad);
  }
  TERN_CHECK(port > 0 && port < 65536, bad);
  return {host, static_cast<uint16_t>(port)};
}

DecodeRooms::DecodeRooms(asio::io_context& io, PdOptions options, Backend& backend, engine::Engine& engine)
    : io_(io), options_(std::move(options)), backend_(backend), engine_(engine) {}

DecodeRooms::~DecodeRooms() = default;

PdMetrics DecodeRooms::metrics() const {
  PdMetrics m = metrics_;
  m.rooms = static_cast<int64_t>(rooms_.size());
  m.landed_bytes = static_cast<int64_t>(backend_.landed_bytes());
  return m;
}

void DecodeRooms::begin(DecodeRequest request) {
  const RoomKey key = request.key;
  TERN_CHECK(!rooms_.count(key), "room ", key.name(), " is already in progress on this server");
  const auto [host, port] = parse_host_port(request.bootstrap);
  auto room = std::make_unique<Room>(io_);
  room->marks[0] = Clock::now();
  room->request = std::move(request);
  rooms_.emplace(key, std::move(room));
  Channel::connect(io_, host, port, options_.channel, [this, key](std::shared_ptr<Channel> channel, const std::string& error) {
    auto it = rooms_.find(key);
    if (it == rooms_.end()) {
      if (channel) channel->close();
      return;
    }
    if (!channel) return end(key, false, FailReason::connect, cat("prefill server: ", error), true);
    Room& room = *it->second;
    room.mark(PdPhase::connect);
    room.channel = channel;
    channel->start([this, key](Frame type, std::string payload) { on_frame(key, type, std::move(payload)); },
                   [this, key](const std::string& why, bool timeout) {
                     end(key, false, timeout ? FailReason::peer_timeout : FailReason::peer_closed,
                         cat("prefill server: ", why), true);
                   });
    Hello h;
    h.key = key;
    h.prompt_len = static_cast<int64_t>(room.request.prompt.size());
    h.prompt_hash = prompt_hash(room.request.prompt);
    h.capacity = room.request.capacity;
    h.model = options_.model;
    h.backend = backend_.name();
    room.phase = DecodePhase::hello_sent;
    channel->send(Frame::hello, encode(h));
  });
}

void DecodeRooms::reserved(const RoomKey& key) {
  auto it = rooms_.find(key);
  if (it == rooms_.end()) return;
  Room& room = *it->second;
  room.reserved = true;
  if (room.phase == DecodePhase::accepted) {
    room.phase = DecodePhase::reserved_sent;
    room.mark(PdPhase::handshake);
    room.channel->send(Frame::reserved, {});
  }
}

void DecodeRooms::on_frame(const RoomKey& key, Frame type, std::string payload) {
  auto it = rooms_.find(key);
  if (it == rooms_.end()) return;
  Room& room = *it->second;
  if (type == Frame::error) return end(key, false, FailReason::peer_error, cat("prefill server: ", payload), true);
  const auto expect = [&](DecodePhase phase) {
    if (room.phase == phase) return true;
    end(key, false, FailReason::refused, cat("protocol error: unexpected ", frame_name(type), " frame"), true);
    return false;
  };
  switch (type) {
    case Frame::accept:
      if (!expect(DecodePhase::hello_sent)) return;
      room.phase = DecodePhase::accepted;
      if (room.reserved) {
        room.phase = DecodePhase::reserved_sent;
        room.mark(PdPhase::handshake);
        room.channel->send(Frame::reserved, {});
      }
      return;
    case Frame::offer:
      if (!expect(DecodePhase::reserved_sent)) return;
      return on_offer(room, payload);
    case Frame::done:
      if (!expect(DecodePhase::ready_sent)) return;
      return on_done(room);
    default:
      end(key, false, FailReason::refused, cat("protocol error: unexpected ", frame_name(type), " frame"), true);
  }
}

void DecodeRooms::on_offer(Room& room, const std::string& payload) {
  const RoomKey key = room.request.key;
  room.mark(PdPhase::prefill);
  try {
    room.offer = decode_offer(payload);
    room.landing = backend_.land(static_cast<size_t>(room.offer->state_bytes), room.channel->local_address());
  } catch (const std::exception& e) {
    return end(key, false, FailReason::refused, e.what(), true);
  }
  room.phase = DecodePhase::ready_sent;
  room.ready_at = Clock::now();
  room.timer.expires_after(options_.transfer_timeout);
  room.timer.async_wait([this, key, t = options_.transfer_timeout](boost::system::error_code ec) {
    if (!ec) end(key, false, FailReason::transfer_timeout, cat("the state did not arrive within ", t.count(), " ms"), true);
  });
  room.channel->send(Frame::ready, room.landing->descriptor());
}

void DecodeRooms::on_done(Room& room) {
  const RoomKey key = room.request.key;
  room.mark(PdPhase::transfer);
  if (!room.landing->complete())
    return end(key, false, FailReason::refused, "the prefill server said done but the state has not fully arrived", true);
  auto h = std::make_shared<engine::Handover>();
  h->prompt = room.request.prompt;
  h->capacity = room.request.capacity;
  h->state = room.landing->bytes();  // the landing lives until imported() (the room ends there)
  h->first = room.offer->first;
  h->rng = room.offer->rng;
  metrics_.bytes += h->state.nbytes();
  room.phase = DecodePhase::importing;
  engine_.provide_state(room.request.engine_id, std::move(h), [this, key](std::string error) {
    asio::post(io_, [this, key, error = std::move(error)] { imported(key, error); });
  });
}

void DecodeRooms::imported(const RoomKey& key, const std::string& error) {
  auto it = rooms_.find(key);
  if (it == rooms_.end()) return;
  Room& room = *it->second;
  if (!error.empty()) return end(key, false, FailReason::refused, error, false);  // the engine failed the request
  metrics_.seconds.observe(std::chrono::duration<double>(Clock::now() - room.ready_at).count());
  room.mark(PdPhase::import);
  for (size_t i = 0; i < metrics_.phases.size(); ++i)
    metrics_.phases[i].observe(std::chrono::duration<double>(room.marks[i + 1] - room.marks[i]).count());
  if (room.channel) room.channel->send(Frame::ack, {});
  end(key, true, FailReason::count_, "", false);
}

void DecodeRooms::ended(const RoomKey& key) {
  auto it = rooms_.find(key);
  if (it == rooms_.end() || it->second->phase == DecodePhase::importing) return;
  end(key, false, FailReason::aborted, "the request ended on the decode server before its state arrived", false);
}

void DecodeRooms::end(const RoomKey& key, bool ok, FailReason reason, const std::string& why, bool fail_engine) {
  auto it = rooms_.find(key);
  if (it == rooms_.end()) return;
  if (!ok && it->second->phase == DecodePhase::importing && reason != FailReason::refused) {
    // The state is already with the engine: the prefill side going away now changes nothing.
    if (auto c = std::exchange(it->second->channel, nullptr)) c->close();
    return;
  }
  std::unique_ptr<Room> room = std::move(it->second);
  rooms_.erase(it);
  room->timer.cancel();
  if (room->channel) {
    if (!ok) room->channel->send(Frame::error, why);
    room->channel->close();
  }
  room->landing.reset();
  if (ok) {
    ++metrics_.transfers_ok;
    return;
  }
  ++metrics_.failed[static_cast<size_t>(reason)];
  log::warn("transfer ", key.name(), " failed (", fail_reason_name(reason), "): ", why);
  if (fail_engine) engine_.fail(room->request.engine_id, cat("state transfer failed: ", why));
}

}  // namespace tern::transfer
