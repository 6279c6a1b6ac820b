#include "transfer/tcp_backend.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <array>
#include <cstring>
#include <random>
#include <unordered_map>

#include "core/error.h"
#include "net/room.h"
#include "transfer/messages.h"

namespace tern::transfer {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

constexpr size_t kHeader = 24;
constexpr char kMagic[4] = {'T', 'P', 'D', '1'};

void put64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint64_t get64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

struct LandingState {
  std::vector<std::byte> data;
  bool complete = false;
  bool writing = false;    // a data connection is filling it
  bool cancelled = false;  // the landing was dropped
};

struct Registry {
  std::unordered_map<uint64_t, std::shared_ptr<LandingState>> landings;
  size_t bytes = 0;
};

class TcpLanding : public Landing {
 public:
  TcpLanding(std::shared_ptr<Registry> registry, uint64_t key, std::shared_ptr<LandingState> state, std::string descriptor)
      : registry_(std::move(registry)), key_(key), state_(std::move(state)), descriptor_(std::move(descriptor)),
        size_(state_->data.size()) {}
  ~TcpLanding() override {
    state_->cancelled = true;
    registry_->landings.erase(key_);
    registry_->bytes -= size_;
  }
  std::string descriptor() const override { return descriptor_; }
  size_t size() const override { return size_; }
  bool complete() const override { return state_->complete; }
  TensorView bytes() override {
    TERN_CHECK(state_->complete, "tcp landing: the state has not fully arrived");
    return TensorView(state_->data.data(), DType::u8, {static_cast<int64_t>(state_->data.size())});
  }

 private:
  std::shared_ptr<Registry> registry_;
  uint64_t key_;
  std::shared_ptr<LandingState> state_;
  std::string descriptor_;
  size_t size_;
};

// Decode side: one incoming data connection.
class Receiver : public std::enable_shared_from_this<Receiver> {
 public:
  Receiver(tcp::socket socket, std::shared_ptr<Registry> registry, std::chrono::milliseconds stall)
      : socket_(std::move(socket)), registry_(std::move(registry)), stall_(stall), timer_(socket_.get_executor()) {}

  void start() {
    arm();
    asio::async_read(socket_, asio::buffer(header_), [self = shared_from_this()](error_code ec, size_t) {
      if (ec) return self->stop();
      self->on_header();
    });
  }

 private:
  void arm() {
    timer_.expires_after(stall_);
    timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (!ec) self->stop();
    });
  }

  void on_header() {
    const uint64_t key = get64(header_.data() + 8), size = get64(header_.data() + 16);
    auto it = registry_->landings.find(key);
    if (std::memcmp(header_.data(), kMagic, 4) != 0 || it == registry_->landings.end() ||
        it->second->data.size() != size || it->second->writing || it->second->complete)
      return reply(1);
    landing_ = it->second;
    landing_->writing = true;
    arm();
    read_some(0);
  }

  // Reads in pieces so that the stall timer restarts while bytes keep coming.
  void read_some(size_t at) {
    const size_t n = std::min<size_t>(landing_->data.size() - at, size_t{4} << 20);
    if (n == 0) return finish();
    asio::async_read(socket_, asio::buffer(landing_->data.data() + at, n), [self = shared_from_this(), at, n](error_code ec, size_t) {
      if (ec) {
        self->landing_->writing = false;
        return self->stop();
      }
      self->arm();
      self->read_some(at + n);
    });
  }

  void finish() {
    landing_->writing = false;
    if (landing_->cancelled) return reply(1);
    landing_->complete = true;
    reply(0);
  }

  void reply(uint8_t status) {
    status_ = static_cast<char>(status);
    asio::async_write(socket_, asio::buffer(&status_, 1), [self = shared_from_this()](error_code, size_t) { self->stop(); });
  }

  void stop() {
    timer_.cancel();
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
  }

  tcp::socket socket_;
  std::shared_ptr<Registry> registry_;
  std::chrono::milliseconds stall_;
  asio::steady_timer timer_;
  std::array<char, kHeader> header_{};
  std::shared_ptr<LandingState> landing_;
  char status_ = 0;
};

// Prefill side: one outgoing write.
class Sender : public std::enable_shared_from_this<Sender> {
 public:
  Sender(asio::io_context& io, std::vector<Segment> segments, std::function<void(std::string)> done)
      : socket_(io), timer_(io), segments_(std::move(segments)), done_(std::move(done)) {}

  void start(const std::string& host, uint16_t port, uint64_t key, uint64_t size, std::chrono::milliseconds connect_timeout) {
    error_code ec;
    const auto address = asio::ip::make_address(host, ec);
    if (ec) return finish(cat("tcp transfer: bad host \"", host, "\" in the descriptor"));
    std::memcpy(header_.data(), kMagic, 4);
    put64(header_.data() + 8, key);
    put64(header_.data() + 16, size);
    where_ = cat(host, ":", port);
    timer_.expires_after(connect_timeout);
    timer_.async_wait([self = shared_from_this(), connect_timeout](error_code ec) {
      if (!ec && !self->connected_) self->finish(cat("tcp transfer: connecting to ", self->where_, " timed out after ", connect_timeout.count(), " ms"));
    });
    socket_.async_connect(tcp::endpoint(address, port), [self = shared_from_this()](error_code ec) {
      self->connected_ = true;
      self->timer_.cancel();
      if (ec) return self->finish(cat("tcp transfer: cannot connect to ", self->where_, ": ", ec.message()));
      self->write();
    });
  }

  void cancel() { finish("tcp transfer: cancelled"); }

 private:
  void write() {
    std::vector<asio::const_buffer> buffers{asio::buffer(header_)};
    for (const auto& s : segments_) buffers.push_back(asio::buffer(s.data(), s.size()));
    asio::async_write(socket_, buffers, [self = shared_from_this()](error_code ec, size_t) {
      if (ec) return self->finish(cat("tcp transfer to ", self->where_, ": ", ec.message()));
      asio::async_read(self->socket_, asio::buffer(&self->status_, 1), [self](error_code ec, size_t) {
        if (ec) return self->finish(cat("tcp transfer to ", self->where_, ": no confirmation (", ec.message(), ")"));
        self->finish(self->status_ == 0 ? "" : "tcp transfer: the decode side refused the data (unknown, cancelled or resized landing)");
      });
    });
  }

  void finish(const std::string& error) {
    if (!done_) return;
    auto done = std::move(done_);
    done_ = nullptr;
    timer_.cancel();
    error_code ec;
    socket_.close(ec);
    done(error);
  }

  tcp::socket socket_;
  asio::steady_timer timer_;
  std::vector<Segment> segments_;
  std::function<void(std::string)> done_;
  std::array<char, kHeader> header_{};
  std::string where_;
  char status_ = 1;
  bool connected_ = false;
};

// "tcp://host:port/key/size" (IPv6 hosts in brackets).
struct Descriptor {
  std::string host;
  uint16_t port = 0;
  uint64_t key = 0, size = 0;
};

std::string format(const Descriptor& d) {
  const bool v6 = d.host.find(':') != std::string::npos;
  return cat("tcp://", v6 ? "[" : "", d.host, v6 ? "]" : "", ":", d.port, "/", net::room_hex(d.key), "/", d.size);
}

Descriptor parse(const std::string& s) {
  const std::string bad = cat("tcp transfer: malformed descriptor \"", s, "\"");
  TERN_CHECK(s.rfind("tcp://", 0) == 0, bad);
  std::string rest = s.substr(6);
  Descriptor d;
  size_t host_end;
  if (!rest.empty() && rest[0] == '[') {
    host_end = rest.find(']');
    TERN_CHECK(host_end != std::string::npos, bad);
    d.host = rest.substr(1, host_end - 1);
    ++host_end;
  } else {
    host_end = rest.find(':');
    TERN_CHECK(host_end != std::string::npos, bad);
    d.host = rest.substr(0, host_end);
  }
  TERN_CHECK(host_end < rest.size() && rest[host_end] == ':', bad);
  rest = rest.substr(host_end + 1);
  const size_t a = rest.find('/'), b = rest.find('/', a + 1);
  TERN_CHECK(a != std::string::npos && b != std::string::npos, bad);
  try {
    const unsigned long port = std::stoul(rest.substr(0, a));
    TERN_CHECK(port > 0 && port < 65536, bad);
    d.port = static_cast<uint16_t>(port);
    d.key = net::parse_room(rest.substr(a + 1, b - a - 1));
    d.size = std::stoull(rest.substr(b + 1));
  } catch (const std::exception&) {  // bad numbers, a bad key
    throw Error(bad);
  }
  return d;
}

class TcpBackend : public Backend {
 public:
  TcpBackend(asio::io_context& io, const TcpBackendOptions& o)
      : io_(io), options_(o), registry_(std::make_shared<Registry>()), rng_(std::random_device{}()) {
    if (!o.listen) return;
    acceptor_ = std::make_shared<tcp::acceptor>(io);
    error_code ec;
    const auto address = asio::ip::make_address(o.bind_host, ec);
    TERN_CHECK(!ec, "tcp transfer: ", o.bind_host, " is not an IP address");
    const tcp::endpoint endpoint(address, o.port);
    acceptor_->open(endpoint.protocol(), ec);
    if (!ec) acceptor_->set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_->bind(endpoint, ec);
    if (!ec) acceptor_->listen(asio::socket_base::max_listen_connections, ec);
    TERN_CHECK(!ec, "tcp transfer: cannot listen on ", o.bind_host, ":", o.port, ": ", ec.message());
    port_ = acceptor_->local_endpoint().port();
    accept(acceptor_, registry_, options_.stall_timeout);
  }
  ~TcpBackend() override {
    error_code ec;
    if (acceptor_) acceptor_->close(ec);
  }

  std::string name() const override { return "tcp"; }

  std::unique_ptr<Landing> land(size_t bytes, const std::string& host) override {
    TERN_CHECK(options_.listen, "tcp transfer: this side does not accept data (not a decode server)");
    uint64_t key;
    do key = rng_(); while (key == 0 || registry_->landings.count(key));
    auto state = std::make_shared<LandingState>();
    state->data.resize(bytes);
    registry_->landings.emplace(key, state);
    registry_->bytes += bytes;
    return std::make_unique<TcpLanding>(registry_, key, std::move(state), format({host, port_, key, bytes}));
  }

  std::function<void()> send(const std::string& descriptor, std::vector<Segment> segments,
                             std::function<void(std::string)> done) override {
    Descriptor d;
    try {
      d = parse(descriptor);
    } catch (const Error& e) {
      asio::post(io_, [done, why = std::string(e.what())] { done(why); });
      return [] {};
    }
    size_t total = 0;
    for (const auto& s : segments) total += s.size();
    if (total != d.size) {
      asio::post(io_, [done, why = cat("tcp transfer: ", total, " bytes to send, the landing holds ", d.size)] { done(why); });
      return [] {};
    }
    auto sender = std::make_shared<Sender>(io_, std::move(segments), std::move(done));
    sender->start(d.host, d.port, d.key, d.size, options_.connect_timeout);
    return [weak = std::weak_ptr<Sender>(sender)] {
      if (auto s = weak.lock()) s->cancel();
    };
  }

  size_t landed_bytes() const override { return registry_->bytes; }

 private:
  static void accept(std::shared_ptr<tcp::acceptor> a, std::shared_ptr<Registry> registry, std::chrono::milliseconds stall) {
    a->async_accept([a, registry, stall](error_code ec, tcp::socket socket) {
      if (!a->is_open()) return;
      if (!ec) std::make_shared<Receiver>(std::move(socket), registry, stall)->start();
      accept(a, registry, stall);
    });
  }

  asio::io_context& io_;
  TcpBackendOptions options_;
  std::shared_ptr<Registry> registry_;
  std::shared_ptr<tcp::acceptor> acceptor_;
  uint16_t port_ = 0;
  std::mt19937_64 rng_;
};

}  // namespace

std::unique_ptr<Backend> make_tcp_backend(asio::io_context& io, const TcpBackendOptions& options) {
  return std::make_unique<TcpBackend>(io, options);
}

}  // namespace tern::transfer
