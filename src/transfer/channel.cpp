#include "transfer/channel.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <array>
#include <cstring>
#include <deque>

#include "core/error.h"
#include "net/listen.h"

namespace tern::transfer {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

const char* frame_name(Frame f) {
  switch (f) {
    case Frame::hello: return "hello";
    case Frame::accept: return "accept";
    case Frame::reserved: return "reserved";
    case Frame::offer: return "offer";
    case Frame::ready: return "ready";
    case Frame::done: return "done";
    case Frame::ack: return "ack";
    case Frame::error: return "error";
    case Frame::ping: return "ping";
  }
  return "?";
}

namespace {

constexpr size_t kHeader = 5;

class TcpChannel : public Channel, public std::enable_shared_from_this<TcpChannel> {
 public:
  TcpChannel(tcp::socket socket, ChannelOptions o)
      : socket_(std::move(socket)), options_(o), heartbeat_(socket_.get_executor()), watchdog_(socket_.get_executor()) {
    error_code ec;
    socket_.set_option(tcp::no_delay(true), ec);
  }

  void start(OnFrame on_frame, OnClosed on_closed) override {
    on_frame_ = std::move(on_frame);
    on_closed_ = std::move(on_closed);
    last_heard_ = std::chrono::steady_clock::now();
    read_header();
    beat();
    watch();
  }

  void send(Frame type, std::string payload) override {
    if (closed_) return;
    std::string frame(kHeader, '\0');
    const auto n = static_cast<uint32_t>(payload.size());
    for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    frame[4] = static_cast<char>(type);
    frame += payload;
    queue_.push_back(std::move(frame));
    if (!writing_) write_next();
  }

  void close() override {
    if (closed_) return;
    closing_ = true;
    on_frame_ = nullptr;
    on_closed_ = nullptr;
    if (!writing_) shutdown();
  }

  bool open() const override { return !closed_ && !closing_; }

  std::string local_address() const override {
    error_code ec;
    const auto e = socket_.local_endpoint(ec);
    return ec ? std::string() : e.address().to_string();
  }

  std::chrono::steady_clock::duration silent_for() const override {
    return std::chrono::steady_clock::now() - last_heard_;
  }

  std::string peer() const override {
    error_code ec;
    const auto e = socket_.remote_endpoint(ec);
    return ec ? std::string("?") : cat(e.address().to_string(), ":", e.port());
  }

 private:
  void read_header() {
    asio::async_read(socket_, asio::buffer(header_), [self = shared_from_this()](error_code ec, size_t) {
      if (ec) return self->fail(ec);
      self->heard();
      uint32_t n = 0;
      for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(static_cast<unsigned char>(self->header_[i])) << (8 * i);
      if (n > self->options_.max_frame)
        return self->fail_with(cat("malformed frame: ", n, " bytes is over the limit of ", self->options_.max_frame), false);
      self->payload_.assign(n, '\0');
      self->read_payload();
    });
  }

  void read_payload() {
    asio::async_read(socket_, asio::buffer(payload_), [self = shared_from_this()](error_code ec, size_t) {
      if (ec) return self->fail(ec);
      self->heard();
      const auto t = static_cast<unsigned char>(self->header_[4]);
      if (t < static_cast<unsigned char>(Frame::hello) || t > static_cast<unsigned char>(Frame::ping))
        return self->fail_with(cat("malformed frame: unknown type ", int(t)), false);
      const auto type = static_cast<Frame>(t);
      if (type != Frame::ping && self->on_frame_) {
        auto handler = self->on_frame_;  // may close the channel (and drop on_frame_) inside
        handler(type, std::move(self->payload_));
      }
      if (!self->closed_ && !self->closing_) self->read_header();
    });
  }

  void write_next() {
    if (queue_.empty()) {
      if (closing_) shutdown();
      return;
    }
    writing_ = true;
    auto data = std::make_shared<std::string>(std::move(queue_.front()));
    queue_.pop_front();
    asio::async_write(socket_, asio::buffer(*data), [self = shared_from_this(), data](error_code ec, size_t) {
      self->writing_ = false;
      if (ec) return self->fail(ec);
      self->write_next();
    });
  }

  void beat() {
    heartbeat_.expires_after(options_.heartbeat);
    heartbeat_.async_wait([self = shared_from_this()](error_code ec) {
      if (ec || self->closed_ || self->closing_) return;
      if (self->queue_.empty()) self->send(Frame::ping, {});
      self->beat();
    });
  }

  void watch() {
    watchdog_.expires_after(options_.peer_timeout / 4 + std::chrono::milliseconds(1));
    watchdog_.async_wait([self = shared_from_this()](error_code ec) {
      if (ec || self->closed_ || self->closing_) return;
      const auto silent = std::chrono::steady_clock::now() - self->last_heard_;
      if (silent > self->options_.peer_timeout)
        return self->fail_with(cat("no heartbeat from the peer ", self->peer(), " for ",
                                   std::chrono::duration_cast<std::chrono::milliseconds>(silent).count(), " ms"),
                               true);
      self->watch();
    });
  }

  void heard() { last_heard_ = std::chrono::steady_clock::now(); }

  void fail(const error_code& ec) {
    if (ec == asio::error::operation_aborted && (closed_ || closing_)) return;
    const bool eof = ec == asio::error::eof || ec == asio::error::connection_reset;
    fail_with(eof ? cat("the peer ", peer_name(), " closed the connection") : cat("connection to ", peer_name(), ": ", ec.message()),
              false);
  }

  std::string peer_name() {
    if (peer_cache_.empty()) peer_cache_ = peer();
    return peer_cache_;
  }

  void fail_with(const std::string& why, bool timeout) {
    if (closed_) return;
    auto cb = std::move(on_closed_);
    on_frame_ = nullptr;
    on_closed_ = nullptr;
    shutdown();
    if (cb) cb(why, timeout);
  }

  void shutdown() {
    if (closed_) return;
    closed_ = true;
    heartbeat_.cancel();
    watchdog_.cancel();
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
  }

  tcp::socket socket_;
  ChannelOptions options_;
  asio::steady_timer heartbeat_, watchdog_;
  std::array<char, kHeader> header_{};
  std::string payload_;
  std::deque<std::string> queue_;
  OnFrame on_frame_;
  OnClosed on_closed_;
  std::chrono::steady_clock::time_point last_heard_;
  std::string peer_cache_;
  bool writing_ = false, closing_ = false, closed_ = false;
};

class TcpListener : public Listener {
 public:
  TcpListener(asio::io_context& io, const std::string& host, uint16_t port, ChannelOptions o,
              std::function<void(std::shared_ptr<Channel>)> on_channel)
      : state_(std::make_shared<State>(io)) {
    state_->options = o;
    state_->on_channel = std::move(on_channel);
    port_ = net::listen_on(state_->acceptor, host, port,
                           {"--pd-host", "the transfer port ", "pass another --pd-port"});
    accept(state_);
  }
  ~TcpListener() override { close(); }
  uint16_t port() const override { return port_; }
  void close() override {
    error_code ec;
    state_->acceptor.close(ec);
  }

 private:
  struct State {
    explicit State(asio::io_context& io) : acceptor(io) {}
    tcp::acceptor acceptor;
    ChannelOptions options;
    std::function<void(std::shared_ptr<Channel>)> on_channel;
  };
  static void accept(std::shared_ptr<State> s) {
    s->acceptor.async_accept([s](error_code ec, tcp::socket socket) {
      if (!s->acceptor.is_open()) return;
      if (!ec) s->on_channel(std::make_shared<TcpChannel>(std::move(socket), s->options));
      accept(s);
    });
  }
  std::shared_ptr<State> state_;
  uint16_t port_ = 0;
};

}  // namespace

void Channel::connect(asio::io_context& io, const std::string& host, uint16_t port, ChannelOptions options,
                      OnConnected done) {
  error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (ec) return done(nullptr, cat("the prefill bootstrap address ", host, " is not an IP address"));
  auto socket = std::make_shared<tcp::socket>(io);
  auto timer = std::make_shared<asio::steady_timer>(io, options.connect_timeout);
  auto finished = std::make_shared<bool>(false);
  timer->async_wait([socket, finished](error_code ec) {
    if (ec || *finished) return;
    error_code ignored;
    socket->close(ignored);  // the connect completes with operation_aborted
  });
  socket->async_connect(tcp::endpoint(address, port), [=, done = std::move(done)](error_code ec) {
    *finished = true;
    timer->cancel();
    if (ec) {
      const bool timed_out = ec == asio::error::operation_aborted;
      return done(nullptr, timed_out ? cat("connecting to ", host, ":", port, " timed out after ",
                                           options.connect_timeout.count(), " ms")
                                     : cat("cannot connect to ", host, ":", port, ": ", ec.message()));
    }
    done(std::make_shared<TcpChannel>(std::move(*socket), options), "");
  });
}

std::unique_ptr<Listener> Listener::listen(asio::io_context& io, const std::string& host, uint16_t port,
                                           ChannelOptions options, std::function<void(std::shared_ptr<Channel>)> on_channel) {
  return std::make_unique<TcpListener>(io, host, port, options, std::move(on_channel));
}

}  // namespace tern::transfer
