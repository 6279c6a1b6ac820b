#include "transfer/prefill_rooms.h"

#include <boost/asio/steady_timer.hpp>
#include <optional>

#include "core/error.h"
#include "core/log.h"

namespace tern::transfer {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

enum class PrefillPhase { matching, accepted, prefilling, offered, sending, sent };

struct PrefillRooms::Room {
  explicit Room(asio::io_context& io) : timer(io) {}
  RoomKey key;
  std::optional<PrefillRequest> request;  // the router's half
  std::shared_ptr<Channel> channel;       // the decode server's half
  std::optional<Hello> hello;
  PrefillPhase phase = PrefillPhase::matching;
  std::shared_ptr<const engine::Handover> handover;
  Tensor host_state;  // the handover's device state, copied for a backend that sends host memory
  std::function<void()> cancel_send;
  asio::steady_timer timer;
  Clock::time_point offered_at;
};

PrefillRooms::PrefillRooms(asio::io_context& io, const std::string& host, uint16_t port, PdOptions options,
                           Backend& backend)
    : io_(io), options_(std::move(options)), backend_(backend) {
  listener_ = Listener::listen(io, host, port, options_.channel, [this](std::shared_ptr<Channel> c) { on_channel(std::move(c)); });
}

PrefillRooms::~PrefillRooms() = default;

uint16_t PrefillRooms::port() const { return listener_->port(); }

void PrefillRooms::close() { listener_->close(); }

PdMetrics PrefillRooms::metrics() const {
  PdMetrics m = metrics_;
  m.rooms = static_cast<int64_t>(rooms_.size());
  return m;
}

// A new control connection: its first frame must be a hello within the rendezvous timeout.
void PrefillRooms::on_channel(std::shared_ptr<Channel> channel) {
  auto key = std::make_shared<std::optional<RoomKey>>();
  auto deadline = std::make_shared<asio::steady_timer>(io_, options_.rendezvous_timeout);
  std::weak_ptr<Channel> weak = channel;
  deadline->async_wait([weak, key](boost::system::error_code ec) {
    if (ec || key->has_value()) return;
    if (auto c = weak.lock()) {
      c->send(Frame::error, "no hello within the rendezvous timeout");
      c->close();
    }
  });
  channel->start(
      [this, weak, key, deadline](Frame type, std::string payload) {
        auto c = weak.lock();
        if (!c) return;
        if (key->has_value()) return on_frame(**key, type, std::move(payload));
        if (type != Frame::hello) {
          c->send(Frame::error, cat("protocol error: expected hello, got ", frame_name(type)));
          return c->close();
        }
        deadline->cancel();
        try {
          const Hello h = decode_hello(payload);
          *key = h.key;
          on_hello(c, payload);
        } catch (const std::exception& e) {
          c->send(Frame::error, e.what());
          c->close();
        }
      },
      [this, key, deadline](const std::string& why, bool timeout) {
        deadline->cancel();
        if (key->has_value())
          end(**key, false, timeout ? FailReason::peer_timeout : FailReason::peer_closed, cat("decode server: ", why), false);
      });
}

void PrefillRooms::on_hello(const std::shared_ptr<Channel>& channel, const std::string& payload) {
  Hello h = decode_hello(payload);
  auto& slot = rooms_[h.key];
  if (!slot) {
    slot = std::make_unique<Room>(io_);
    slot->key = h.key;
    arm(*slot, options_.rendezvous_timeout, FailReason::rendezvous_timeout,
        "the router's request for this room never reached the prefill server");
  } else if (slot->channel) {
    channel->send(Frame::error, cat("room ", h.key.name(), " already has a decode server"));
    return channel->close();
  }
  slot->channel = channel;
  slot->hello = std::move(h);
  if (slot->request) match(*slot);
}

void PrefillRooms::expect(PrefillRequest request) {
  const RoomKey key = request.key;
  auto& slot = rooms_[key];
  if (!slot) {
    slot = std::make_unique<Room>(io_);
    slot->key = key;
    arm(*slot, options_.rendezvous_timeout, FailReason::rendezvous_timeout,
        "the decode server never connected for this room");
  } else if (slot->request) {
    throw Error(cat("room ", key.name(), " is already registered"));
  }
  slot->request = std::move(request);
  if (slot->hello) match(*slot);
}

// Both halves are here: do they describe the same request?
void PrefillRooms::match(Room& room) {
  room.timer.cancel();
  const Hello& h = *room.hello;
  const PrefillRequest& r = *room.request;
  std::string why;
  if (h.model != options_.model) why = cat("the decode server serves ", h.model, ", this server ", options_.model);
  else if (h.backend != backend_.name()) why = cat("the decode server lands with ", h.backend, ", this server sends with ", backend_.name());
  else if (h.prompt_len != r.prompt_len || h.prompt_hash != r.prompt_hash)
    why = cat("the prompts differ (decode: ", h.prompt_len, " tokens, prefill: ", r.prompt_len,
              " tokens): do both servers use the same tokenizer?");
  else if (h.capacity != r.capacity)
    why = cat("the state capacities differ (decode: ", h.capacity, ", prefill: ", r.capacity,
              " positions): do both servers use the same --max-model-len?");
  if (!why.empty()) return end(room.key, false, FailReason::refused, why, true);
  room.phase = PrefillPhase::accepted;
  room.channel->send(Frame::accept, {});
}

void PrefillRooms::on_frame(const RoomKey& key, Frame type, std::string payload) {
  auto it = rooms_.find(key);
  if (it == rooms_.end()) return;
  Room& room = *it->second;
  if (type == Frame::error) return end(key, false, FailReason::peer_error, cat("decode server: ", payload), false);
  const auto expect = [&](PrefillPhase phase) {
    if (room.phase == phase) return true;
    end(key, false, FailReason::refused, cat("protocol error: unexpected ", frame_name(type), " frame"), true);
    return false;
  };
  switch (type) {
    case Frame::reserved:
      if (!expect(PrefillPhase::accepted)) return;
      room.phase = PrefillPhase::prefilling;
      try {
        room.request->start();
      } catch (const std::exception& e) {
        end(key, false, FailReason::refused, cat("the prefill engine refused the request: ", e.what()), true);
      }
      return;
    case Frame::ready:
      if (!expect(PrefillPhase::offered)) return;
      return send_state(room, payload);
    case Frame::ack: {
      if (!expect(PrefillPhase::sent)) return;
      metrics_.bytes += room.handover->state.nbytes();
      metrics_.seconds.observe(std::chrono::duration<double>(Clock::now() - room.offered_at).count());
      return end(key, true, FailReason::count_, "", false);
    }
    default:
      end(key, false, FailReason::refused, cat("protocol error: unexpected ", frame_name(type), " frame"), true);
  }
}

void PrefillRooms::prefilled(const RoomKey& key, std::shared_ptr<const engine::Handover> handover) {
  auto it = rooms_.find(key);
  if (it == rooms_.end()) return;
  Room& room = *it->second;
  if (room.phase != PrefillPhase::prefilling) return;
  room.handover = std::move(handover);
  Offer offer;
  offer.state_bytes = static_cast<int64_t>(room.handover->state.nbytes());
  offer.first = room.handover->first;
  offer.rng = room.handover->rng;
  room.phase = PrefillPhase::offered;
  room.offered_at = Clock::now();
  arm(room, options_.transfer_timeout, FailReason::transfer_timeout, "the state transfer did not finish in time");
  room.channel->send(Frame::offer, encode(offer));
}

void PrefillRooms::send_state(Room& room, const std::string& descriptor) {
  room.phase = PrefillPhase::sending;
  const RoomKey key = room.key;
  TensorView state = room.handover->state;
  if (state.device() != Device::cpu && !backend_.reads_device_memory()) {  // a device handover over tcp
    room.host_state = Tensor::copy_of(state, Device::cpu);
    state = room.host_state.view();
  }
  const Segment bytes(state.data_as<std::byte>(), state.nbytes());
  // The bytes stay alive until done is called, also when the room ends first (a cancelled send).
  room.cancel_send = backend_.send(descriptor, {bytes}, [this, key, keep = room.handover,
                                                         keep_host = room.host_state](std::string error) {
    auto it = rooms_.find(key);
    if (it == rooms_.end() || it->second->phase != PrefillPhase::sending) return;
    Room& r = *it->second;
    r.cancel_send = nullptr;
    if (!error.empty()) return end(key, false, FailReason::peer_closed, error, true);
    r.phase = PrefillPhase::sent;
    r.channel->send(Frame::done, {});
  });
}

void PrefillRooms::fail(const RoomKey& key, const std::string& why) {
  // Given up here while the decode server has been silent for most of the peer timeout (a cut link: its
  // side timed out first and the router's abort arrived before this side's watchdog fired): the cause is
  // the silence, and it is reported as such.
  auto it = rooms_.find(key);
  if (it != rooms_.end() && it->second->channel) {
    const auto silent = it->second->channel->silent_for();
    if (silent >= options_.channel.peer_timeout - options_.channel.heartbeat)
      return end(key, false, FailReason::peer_timeout,
                 cat("no heartbeat from the decode server for ",
                     std::chrono::duration_cast<std::chrono::milliseconds>(silent).count(), " ms (", why, ")"),
                 true);
  }
  end(key, false, FailReason::aborted, why, true);
}

void PrefillRooms::arm(Room& room, std::chrono::milliseconds after, FailReason reason, const std::string& what) {
  const RoomKey key = room.key;
  room.timer.expires_after(after);
  room.timer.async_wait([this, key, reason, what, after](boost::system::error_code ec) {
    if (ec) return;
    end(key, false, reason, cat(what, " (", after.count(), " ms)"), true);
  });
}

void PrefillRooms::end(const RoomKey& key, bool ok, FailReason reason, const std::string& why, bool tell_peer) {
  auto it = rooms_.find(key);
  if (it == rooms_.end()) return;
  std::unique_ptr<Room> room = std::move(it->second);
  rooms_.erase(it);
  room->timer.cancel();
  if (room->cancel_send) std::exchange(room->cancel_send, nullptr)();
  if (room->channel) {
    if (!ok && tell_peer) room->channel->send(Frame::error, why);
    room->channel->close();
  }
  if (ok) {
    ++metrics_.transfers_ok;
  } else {
    ++metrics_.failed[static_cast<size_t>(reason)];
    log::warn("transfer ", key.name(), " failed (", fail_reason_name(reason), "): ", why);
  }
  if (room->request && room->request->ended) room->request->ended(ok, why);
}

}  // namespace tern::transfer
