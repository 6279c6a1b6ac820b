#include "server/http.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <deque>
#include <cstring>
#include <list>
#include <optional>

#include "core/error.h"
#include "core/log.h"

namespace tern::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

class Session;

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  net::io_context io{1};
  tcp::acceptor acceptor{io};
  net::signal_set signals{io, SIGTERM, SIGINT};
  HttpLimits limits;
  Handler handler;
  std::string host;
  uint16_t port = 0;
  bool accepting = true;
  std::list<std::weak_ptr<Session>> sessions;

  void accept();
  void forget_expired();
};

namespace {

int status_code(const beast::error_code& ec) {
  if (ec == http::error::body_limit) return 413;
  if (ec == http::error::header_limit) return 431;
  return 400;
}

const char* bad_request_json(int status) {
  switch (status) {
    case 413: return R"({"error":{"message":"request body too large","type":"invalid_request_error","param":null,"code":"body_too_large"}})";
    case 431: return R"({"error":{"message":"request headers too large","type":"invalid_request_error","param":null,"code":null}})";
    default: return R"({"error":{"message":"malformed HTTP request","type":"invalid_request_error","param":null,"code":null}})";
  }
}

}  // namespace

// One TCP connection: reads requests one after another; while a request is in flight it keeps a read
// pending to notice the client leaving (and to keep any pipelined bytes for the next request).
class Session : public Exchange, public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<HttpServer::Impl> server)
      : stream_(std::move(socket)), server_(std::move(server)) {}

  void start() { read_request(); }

  void drain() {
    if (!in_exchange_) close();
  }

  void reply(int status, const std::string& content_type, std::string body, const Headers& headers) override {
    if (done_ || gone_) return;
    done_ = true;
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(status), 11);
    res->set(http::field::server, "tern");
    res->set(http::field::content_type, content_type);
    for (const auto& [k, v] : headers) res->set(k, v);
    res->keep_alive(keep_alive_ && server_->accepting);
    res->body() = std::move(body);
    res->prepare_payload();
    http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, size_t) {
      self->after_response(ec, res->keep_alive());
    });
  }

  void begin_stream() override {
    if (done_ || gone_) return;
    auto res = std::make_shared<http::response<http::empty_body>>(http::status::ok, 11);
    res->set(http::field::server, "tern");
    res->set(http::field::content_type, "text/event-stream");
    res->set(http::field::cache_control, "no-cache");
    res->keep_alive(keep_alive_);
    res->chunked(true);
    auto sr = std::make_shared<http::response_serializer<http::empty_body>>(*res);
    writing_ = true;
    http::async_write_header(stream_, *sr, [self = shared_from_this(), res, sr](beast::error_code ec, size_t) {
      self->after_write(ec);
    });
  }

  void send(std::string data) override {
    if (done_ || gone_) return;
    queue_.push_back(std::move(data));
    if (!writing_) write_next();
  }

  void end_stream() override {
    if (done_ || gone_) return;
    done_ = true;
    ending_ = true;
    if (!writing_) write_next();
  }

  bool client_gone() const override { return gone_; }
  void on_client_gone(std::function<void()> callback) override { gone_callback_ = std::move(callback); }

 private:
  void read_request() {
    in_exchange_ = false;
    if (!server_->accepting) return close();
    parser_.emplace();
    parser_->body_limit(server_->limits.body_limit);
    parser_->header_limit(static_cast<uint32_t>(server_->limits.header_limit));
    if (buffer_.size() > 0) return read_header();
    // An idle keep-alive connection waits up to idle_timeout for the first byte of its next request.
    stream_.expires_after(server_->limits.idle_timeout);
    stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      if (ec) return self->on_read_error(ec);
      self->buffer_.commit(n);
      self->read_header();
    });
  }

  // From its first byte, the whole request must arrive within header_timeout (slow clients are closed).
  void read_header() {
    stream_.expires_after(server_->limits.header_timeout);
    http::async_read_header(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->on_header(ec);
    });
  }

  void on_header(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    // curl sends "Expect: 100-continue" with bodies over 1 KiB and waits a second for the go-ahead.
    if (beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
      auto res = std::make_shared<http::response<http::empty_body>>(http::status::continue_, 11);
      return http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, size_t) {
        if (ec) return self->on_read_error(ec);
        self->read_body();
      });
    }
    read_body();
  }

  void read_body() {
    http::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->on_request(ec);
    });
  }

  void on_read_error(beast::error_code ec) {
    const bool quiet = ec == http::error::end_of_stream || ec == beast::error::timeout ||
                       ec == net::error::operation_aborted || ec == net::error::connection_reset ||
                       ec == net::error::eof;
    if (quiet) return close();
    const int status = status_code(ec);
    in_exchange_ = true;
    keep_alive_ = false;
    stream_.expires_after(std::chrono::seconds(5));
    reply(status, "application/json", bad_request_json(status), {});
  }

  void on_request(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    stream_.expires_never();
    auto req = parser_->release();
    parser_.reset();
    keep_alive_ = req.keep_alive();
    in_exchange_ = true;
    done_ = ending_ = false;
    gone_callback_ = nullptr;
    HttpRequest r;
    r.method = std::string(req.method_string());
    r.target = std::string(req.target());
    r.authorization = std::string(req[http::field::authorization]);
    r.content_type = std::string(req[http::field::content_type]);
    r.tern_room = std::string(req["X-Tern-Room"]);
    r.tern_bootstrap = std::string(req["X-Tern-Bootstrap"]);
    r.body = std::move(req.body());
    watch_client();
    server_->handler(std::move(r), shared_from_this());
  }

  // A read while the request is in flight: EOF or an error means the client left.
  void watch_client() {
    if (watching_) return;
    watching_ = true;
    stream_.socket().async_read_some(net::buffer(watch_buf_), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->on_watch(ec, n);
    });
  }

  void on_watch(beast::error_code ec, size_t n) {
    watching_ = false;
    if (!ec) {
      auto b = buffer_.prepare(n);
      std::memcpy(b.data(), watch_buf_.data(), n);
      buffer_.commit(n);
      if (!resume_after_watch_) return watch_client();
    } else if (ec != net::error::operation_aborted) {
      return client_left();
    }
    if (resume_after_watch_) {
      resume_after_watch_ = false;
      read_request();
    }
  }

  void client_left() {
    if (gone_) return;
    gone_ = true;
    if (!done_ && gone_callback_) {
      auto cb = std::move(gone_callback_);
      cb();
    }
    close();
  }

  void write_next() {
    if (gone_) return;
    if (queue_.empty()) {
      if (!ending_) return;
      ending_ = false;
      writing_ = true;
      net::async_write(stream_, http::make_chunk_last(), [self = shared_from_this()](beast::error_code ec, size_t) {
        self->after_response(ec, self->keep_alive_ && self->server_->accepting);
      });
      return;
    }
    writing_ = true;
    auto data = std::make_shared<std::string>(std::move(queue_.front()));
    queue_.pop_front();
    net::async_write(stream_, http::make_chunk(net::buffer(*data)), [self = shared_from_this(), data](beast::error_code ec, size_t) {
      self->after_write(ec);
    });
  }

  void after_write(beast::error_code ec) {
    writing_ = false;
    if (ec) return client_left();
    write_next();
  }

  void after_response(beast::error_code ec, bool keep_alive) {
    writing_ = false;
    if (ec || !keep_alive) return close();
    if (watching_) {  // let the pending watch read finish first: one read at a time
      resume_after_watch_ = true;
      stream_.socket().cancel();
      return;
    }
    read_request();
  }

  void close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
  }

  beast::tcp_stream stream_;
  std::shared_ptr<HttpServer::Impl> server_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::array<char, 4096> watch_buf_{};
  std::deque<std::string> queue_;
  std::function<void()> gone_callback_;
  bool keep_alive_ = true, in_exchange_ = false, done_ = false, ending_ = false, writing_ = false;
  bool gone_ = false, watching_ = false, resume_after_watch_ = false;
};

void HttpServer::Impl::accept() {
  acceptor.async_accept(io, [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
    if (!self->accepting || !self->acceptor.is_open()) return;
    if (!ec) {
      self->forget_expired();
      if (self->sessions.size() >= self->limits.max_connections) {
        socket.close(ec);
      } else {
        auto s = std::make_shared<Session>(std::move(socket), self);
        self->sessions.push_back(s);
        s->start();
      }
    }
    self->accept();
  });
}

void HttpServer::Impl::forget_expired() {
  sessions.remove_if([](const std::weak_ptr<Session>& w) { return w.expired(); });
}

HttpServer::HttpServer(const std::string& host, uint16_t port, HttpLimits limits, Handler handler)
    : impl_(std::make_shared<Impl>()) {
  impl_->limits = limits;
  impl_->handler = std::move(handler);
  impl_->host = host;
  beast::error_code ec;
  const auto address = net::ip::make_address(host, ec);
  TERN_CHECK(!ec, "--host ", host, " is not an IP address");
  const tcp::endpoint endpoint(address, port);
  auto& a = impl_->acceptor;
  a.open(endpoint.protocol(), ec);
  TERN_CHECK(!ec, "cannot open a socket: ", ec.message());
  a.set_option(net::socket_base::reuse_address(true), ec);
  a.bind(endpoint, ec);
  TERN_CHECK(!ec, "cannot bind ", host, ":", port, ": ", ec.message(),
             ec == net::error::address_in_use ? " (the port is in use: stop the other server or pass --port)" : "");
  a.listen(net::socket_base::max_listen_connections, ec);
  TERN_CHECK(!ec, "cannot listen on ", host, ":", port, ": ", ec.message());
  impl_->port = a.local_endpoint().port();
}

HttpServer::~HttpServer() { stop(); }

uint16_t HttpServer::port() const { return impl_->port; }

std::string HttpServer::address() const {
  const bool v6 = impl_->host.find(':') != std::string::npos;
  return cat("http://", v6 ? "[" : "", impl_->host, v6 ? "]" : "", ":", impl_->port);
}

void HttpServer::run() {
  impl_->accept();
  impl_->io.run();
}

void HttpServer::stop() { impl_->io.stop(); }

void HttpServer::post(std::function<void()> fn) { net::post(impl_->io, std::move(fn)); }

net::io_context& HttpServer::io_context() { return impl_->io; }

std::function<void()> HttpServer::schedule(std::chrono::milliseconds delay, std::function<void()> fn) {
  auto timer = std::make_shared<net::steady_timer>(impl_->io, delay);
  timer->async_wait([timer, fn = std::move(fn)](beast::error_code ec) {
    if (!ec) fn();
  });
  return [weak = std::weak_ptr<net::steady_timer>(timer)] {
    if (auto t = weak.lock()) t->cancel();
  };
}

void HttpServer::on_signal(std::function<void(int)> fn) {
  auto impl = impl_;
  auto handler = std::make_shared<std::function<void(beast::error_code, int)>>();
  *handler = [impl, fn = std::move(fn), handler](beast::error_code ec, int sig) {
    if (ec) return;
    fn(sig);
    impl->signals.async_wait(*handler);
  };
  impl_->signals.async_wait(*handler);
}

void HttpServer::stop_accepting() {
  impl_->accepting = false;
  beast::error_code ec;
  impl_->acceptor.close(ec);
  for (auto& w : impl_->sessions)
    if (auto s = w.lock()) s->drain();
}

size_t HttpServer::connections() const {
  impl_->forget_expired();
  return impl_->sessions.size();
}

}  // namespace tern::server
