// The control connection of one prefill-decode transfer ("room"): framed messages over TCP with
// heartbeats. A frame is [u32 payload length, little endian][u8 type][payload]. Both ends send a ping
// every `heartbeat` and give up on a peer silent for `peer_timeout`, so a dead process or a cut link is
// noticed even while nothing else is being said. Everything runs on the io_context's thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace boost::asio {
class io_context;
}

namespace tern::transfer {

enum class Frame : uint8_t {
  hello = 1,  // decode -> prefill: which room, what it expects (messages.h)
  accept,     // prefill -> decode: the room matches
  reserved,   // decode -> prefill: state memory reserved, run the prompt
  offer,      // prefill -> decode: the prompt ran; state size, first token, sampler
  ready,      // decode -> prefill: where to write the state (backend descriptor)
  done,       // prefill -> decode: the state is written
  ack,        // decode -> prefill: the state is imported, the request decodes
  error,      // either way: the room failed (message), the connection closes
  ping,       // heartbeat
};
const char* frame_name(Frame f);

struct ChannelOptions {
  std::chrono::milliseconds heartbeat{1000};
  std::chrono::milliseconds peer_timeout{10000};
  std::chrono::milliseconds connect_timeout{5000};
  size_t max_frame = size_t{1} << 20;
};

class Channel {
 public:
  using OnFrame = std::function<void(Frame, std::string payload)>;
  // Why the channel ended without close() being called: the peer closed, a read or write failed, the
  // peer was silent too long (`timeout`), or a frame was malformed.
  using OnClosed = std::function<void(const std::string& why, bool timeout)>;
  using OnConnected = std::function<void(std::shared_ptr<Channel>, const std::string& error)>;

  // Connects to host:port (numeric address) within options.connect_timeout.
  static void connect(boost::asio::io_context& io, const std::string& host, uint16_t port, ChannelOptions options,
                      OnConnected done);
  virtual ~Channel() = default;
  // Starts reading and heartbeats. Handlers are called on the io thread until the channel closes.
  virtual void start(OnFrame on_frame, OnClosed on_closed) = 0;
  virtual void send(Frame type, std::string payload) = 0;
  // Sends what is queued, then closes. No handler is called afterwards.
  virtual void close() = 0;
  virtual bool open() const = 0;
  virtual std::string local_address() const = 0;  // this end's IP address (as the peer reaches it)
  virtual std::string peer() const = 0;           // "ip:port"
  // Time since the last frame (heartbeats included) came from the peer.
  virtual std::chrono::steady_clock::duration silent_for() const = 0;

  struct Impl;
};

// Accepts control connections: each becomes a Channel handed to `on_channel` (not yet started).
class Listener {
 public:
  // Binds and listens (throws tern::Error saying why, e.g. the port is in use).
  static std::unique_ptr<Listener> listen(boost::asio::io_context& io, const std::string& host, uint16_t port,
                                          ChannelOptions options, std::function<void(std::shared_ptr<Channel>)> on_channel);
  virtual ~Listener() = default;
  virtual uint16_t port() const = 0;
  virtual void close() = 0;
};

}  // namespace tern::transfer
