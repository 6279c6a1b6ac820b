#include "net/http.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstring>
#include <deque>
#include <list>
#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "net/http_head.h"
#include "net/listen.h"
#include "net/openai.h"

namespace tern::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

class Session;

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  asio::signal_set signals{io, SIGTERM, SIGINT};
  asio::steady_timer accept_pause{io};
  HttpLimits limits;
  Handler handler;
  HeadCheck head_check;
  std::string host;
  uint16_t port = 0;
  bool accepting = true;
  std::list<std::weak_ptr<Session>> sessions;  // oldest first
  HttpStats stats;
  size_t refusing = 0;  // new connections being answered 503
  std::chrono::steady_clock::time_point last_accept_warning{};

  void accept();
  void on_accept(beast::error_code ec, tcp::socket socket);
  bool evict_oldest_waiting();
  void refuse_connection(tcp::socket socket);
  void forget_expired();
};

namespace {

int status_code(const beast::error_code& ec) {
  if (ec == http::error::body_limit) return 413;
  if (ec == http::error::header_limit) return 431;
  return 400;
}

std::string error_json(const std::string& message, const char* type, const char* code) {
  return render_error(ApiError(400, message, "", type, code ? code : ""));
}

std::string bad_request_json(int status) {
  switch (status) {
    case 413: return error_json("request body too large", "invalid_request_error", "body_too_large");
    case 431: return error_json("request headers too large", "invalid_request_error", nullptr);
    default: return error_json("malformed HTTP request", "invalid_request_error", nullptr);
  }
}

// What a new connection gets when the table is full of requests in progress.
const std::string& table_full_response() {
  static const std::string body =
      error_json("the server has too many open connections (--max-connections); retry", "unavailable", "too_many_connections");
  static const std::string response = cat("HTTP/1.1 503 Service Unavailable\r\nServer: tern\r\nContent-Type: application/json\r\n"
                                          "Retry-After: 1\r\nConnection: close\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
  return response;
}

bool out_of_descriptors(const beast::error_code& ec) {
  return ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space || ec == asio::error::no_memory ||
         ec.value() == ENFILE;
}

constexpr auto kLinger = std::chrono::seconds(2);  // to let a refused client read its answer

}  // namespace

// One TCP connection: reads requests one after another; while a request is in flight it keeps a read
// pending to notice the client leaving (and to keep any pipelined bytes for the next request).
class Session : public Exchange, public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<HttpServer::Impl> server)
      : stream_(std::move(socket)), server_(std::move(server)) {
    beast::error_code ec;
    peer_ = stream_.socket().remote_endpoint(ec).address().to_string();
  }

  void start() {
    ++server_->stats.open;
    read_request();
  }

  void drain() {
    if (!in_exchange_) close();
  }

  // Waiting for the first byte of a request (new or keep-alive): closed first when the table is full.
  bool waiting() const { return waiting_ && !closed_; }
  bool closed() const { return closed_; }

  void close() {
    if (closed_) return;
    closed_ = true;
    --server_->stats.open;
    release_budget();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
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
    // A keep-alive connection waits up to idle_timeout for its next request; a new one only
    // header_timeout for its first byte (a connection that sends nothing is a slow client).
    waiting_ = true;
    stream_.expires_after(served_ ? server_->limits.idle_timeout : server_->limits.header_timeout);
    stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->waiting_ = false;
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

  HttpRequest head_of(const http::request<http::string_body>& h) const {
    HttpRequest r;
    r.method = std::string(h.method_string());
    r.target = origin_form(h.target());
    r.authorization = std::string(h[http::field::authorization]);
    r.content_type = std::string(h[http::field::content_type]);
    r.peer = peer_;
    r.forwarded_for = std::string(h["X-Forwarded-For"]);
    r.tern_room = std::string(h["X-Tern-Room"]);
    r.tern_bootstrap = std::string(h["X-Tern-Bootstrap"]);
    return r;
  }

  // The head is in: its transfer coding, the service's check (authentication), the body budget; only
  // then is the body read.
  void on_header(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    served_ = true;
    const auto& h = parser_->get();
    std::string te;
    for (const auto& f : h)
      if (f.name() == http::field::transfer_encoding) {
        if (!te.empty()) te += ',';
        te += f.value();
      }
    if (!transfer_coding_supported(te))
      return refuse({400, error_json(cat("unsupported Transfer-Encoding: ", te, " (only chunked is read)"),
                                     "invalid_request_error", nullptr), {}});
    head_ = head_of(h);
    if (server_->head_check)
      if (auto refusal = server_->head_check(head_)) return refuse(std::move(*refusal));
    if (!reserve_budget()) {
      ++server_->stats.busy_total;
      return refuse({503, error_json("the server is receiving too many request bodies (--max-buffered-mb); retry",
                                     "unavailable", "server_busy"), {{"Retry-After", "1"}}});
    }
    // curl sends "Expect: 100-continue" with bodies over 1 KiB and waits a second for the go-ahead.
    if (beast::iequals(h[http::field::expect], "100-continue")) {
      auto res = std::make_shared<http::response<http::empty_body>>(http::status::continue_, 11);
      return http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, size_t) {
        if (ec) return self->on_read_error(ec);
        self->read_body();
      });
    }
    read_body();
  }

  // A body is held from its head until its response ends: its Content-Length, or the body limit when
  // chunked (its length is unknown until it has arrived). Small bodies (most requests) are not counted:
  // the connection limit bounds them, and bodies that fill the budget never lock out a normal request.
  bool reserve_budget() {
    const auto length = parser_->content_length();
    const size_t need = length ? static_cast<size_t>(*length) : parser_->chunked() ? server_->limits.body_limit : 0;
    if (need <= HttpLimits::kSmallBody) return true;
    auto& buffered = server_->stats.buffered_bytes;
    if (buffered + need > server_->limits.max_buffered) return false;
    buffered += need;
    reserved_ = need;
    return true;
  }

  void release_budget() {
    server_->stats.buffered_bytes -= reserved_;
    reserved_ = 0;
  }

  void read_body() {
    http::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->on_request(ec);
    });
  }

  // Answers from the head (or a broken request) and closes: the rest of the request is never read as
  // a request.
  void refuse(Refusal r) {
    in_exchange_ = true;
    keep_alive_ = false;
    linger_ = true;
    done_ = false;
    stream_.expires_after(std::chrono::seconds(5));
    reply(r.status, "application/json", std::move(r.body), r.headers);
  }

  void on_read_error(beast::error_code ec) {
    const bool quiet = ec == http::error::end_of_stream || ec == beast::error::timeout ||
                       ec == asio::error::operation_aborted || ec == asio::error::connection_reset ||
                       ec == asio::error::eof;
    if (quiet || closed_) return close();
    const int status = status_code(ec);
    refuse({status, bad_request_json(status), {}});
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
    HttpRequest r = std::move(head_);
    r.body = std::move(req.body());
    watch_client();
    server_->handler(std::move(r), shared_from_this());
  }

  // A read while the request is in flight: EOF or an error means the client left.
  void watch_client() {
    if (watching_) return;
    watching_ = true;
    stream_.socket().async_read_some(asio::buffer(watch_buf_), [self = shared_from_this()](beast::error_code ec, size_t n) {
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
    } else if (ec != asio::error::operation_aborted) {
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
      asio::async_write(stream_, http::make_chunk_last(), [self = shared_from_this()](beast::error_code ec, size_t) {
        self->after_response(ec, self->keep_alive_ && self->server_->accepting);
      });
      return;
    }
    writing_ = true;
    auto data = std::make_shared<std::string>(std::move(queue_.front()));
    queue_.pop_front();
    asio::async_write(stream_, http::make_chunk(asio::buffer(*data)), [self = shared_from_this(), data](beast::error_code ec, size_t) {
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
    release_budget();
    if (ec) return close();
    if (!keep_alive) return linger_ && !watching_ ? linger() : close();
    if (watching_) {  // let the pending watch read finish first: one read at a time
      resume_after_watch_ = true;
      stream_.socket().cancel();
      return;
    }
    read_request();
  }

  // After refusing a request whose body may still be coming: stop sending, read and drop what arrives
  // for a moment, then close. Closing with unread bytes would reset the connection and could destroy
  // the answer before the client reads it (nginx's lingering close).
  void linger() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (!lingering_) {
      lingering_ = true;
      stream_.expires_after(kLinger);
    }
    stream_.async_read_some(asio::buffer(watch_buf_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec || self->closed_) return self->close();
      self->linger();
    });
  }

  beast::tcp_stream stream_;
  std::shared_ptr<HttpServer::Impl> server_;
  std::string peer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  HttpRequest head_;  // the request being read, without its body
  std::array<char, 4096> watch_buf_{};
  std::deque<std::string> queue_;
  std::function<void()> gone_callback_;
  size_t reserved_ = 0;  // request-body budget held
  bool keep_alive_ = true, in_exchange_ = false, done_ = false, ending_ = false, writing_ = false;
  bool gone_ = false, watching_ = false, resume_after_watch_ = false;
  // waiting_: for the first byte of a request (evictable); served_: a request head has arrived (the idle
  // timeout applies from then on); linger_: the answer refuses a request whose body may still come.
  bool waiting_ = false, served_ = false, closed_ = false, linger_ = false, lingering_ = false;
};

void HttpServer::Impl::accept() {
  acceptor.async_accept(io, [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
    self->on_accept(ec, std::move(socket));
  });
}

void HttpServer::Impl::on_accept(beast::error_code ec, tcp::socket socket) {
  if (!accepting || !acceptor.is_open()) return;
  if (out_of_descriptors(ec)) {
    // The connection stays in the listen backlog; retrying at once would spin at 100% CPU.
    const auto now = std::chrono::steady_clock::now();
    if (now - last_accept_warning > std::chrono::seconds(10)) {
      last_accept_warning = now;
      log::warn("accept: ", ec.message(), " (", stats.open, " connections open); pausing accepts for 100 ms");
    }
    accept_pause.expires_after(std::chrono::milliseconds(100));
    accept_pause.async_wait([self = shared_from_this()](beast::error_code e) {
      if (!e) self->accept();
    });
    return;
  }
  if (!ec) {
    forget_expired();
    if (stats.open >= limits.max_connections && !evict_oldest_waiting()) {
      refuse_connection(std::move(socket));
    } else {
      auto s = std::make_shared<Session>(std::move(socket), shared_from_this());
      sessions.push_back(s);
      s->start();
    }
  }
  accept();
}

bool HttpServer::Impl::evict_oldest_waiting() {
  for (auto& w : sessions)
    if (auto s = w.lock(); s && s->waiting()) {
      s->close();
      ++stats.evicted_total;
      return true;
    }
  return false;
}

// A new connection the table has no room for: 503, then a lingering close (see Session::linger).
class RefusedConnection : public std::enable_shared_from_this<RefusedConnection> {
 public:
  RefusedConnection(tcp::socket socket, std::shared_ptr<HttpServer::Impl> server)
      : socket_(std::move(socket)), timer_(socket_.get_executor(), kLinger), server_(std::move(server)) {}
  ~RefusedConnection() { --server_->refusing; }

  void start() {
    ++server_->refusing;
    asio::async_write(socket_, asio::buffer(table_full_response()), [self = shared_from_this()](beast::error_code ec, size_t) {
      beast::error_code e;
      if (ec) {
        self->socket_.close(e);
        return;
      }
      self->socket_.shutdown(tcp::socket::shutdown_send, e);
      self->timer_.async_wait([self](beast::error_code) {
        beast::error_code e2;
        self->socket_.close(e2);
      });
      self->drop();
    });
  }

 private:
  void drop() {
    socket_.async_read_some(asio::buffer(sink_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (!ec) return self->drop();
      self->timer_.cancel();
      beast::error_code e;
      self->socket_.close(e);
    });
  }

  tcp::socket socket_;
  asio::steady_timer timer_;
  std::shared_ptr<HttpServer::Impl> server_;
  std::array<char, 4096> sink_{};
};

void HttpServer::Impl::refuse_connection(tcp::socket socket) {
  ++stats.refused_total;
  if (refusing >= 64) return;  // beyond a few at once the connection is just closed
  std::make_shared<RefusedConnection>(std::move(socket), shared_from_this())->start();
}

// Closed sessions may live on while a request holds them; the list is swept when it has grown.
void HttpServer::Impl::forget_expired() {
  if (sessions.size() < 2 * stats.open + 64) return;
  sessions.remove_if([](const std::weak_ptr<Session>& w) {
    auto s = w.lock();
    return !s || s->closed();
  });
}

HttpServer::HttpServer(const std::string& host, uint16_t port, HttpLimits limits, Handler handler, HeadCheck head_check)
    : impl_(std::make_shared<Impl>()) {
  impl_->limits = limits;
  impl_->handler = std::move(handler);
  impl_->head_check = std::move(head_check);
  impl_->host = host;
  impl_->port = listen_on(impl_->acceptor, host, port, {"--host", "", "stop the other server or pass --port"});
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

void HttpServer::post(std::function<void()> fn) { asio::post(impl_->io, std::move(fn)); }

asio::io_context& HttpServer::io_context() { return impl_->io; }

std::function<void()> HttpServer::schedule(std::chrono::milliseconds delay, std::function<void()> fn) {
  auto timer = std::make_shared<asio::steady_timer>(impl_->io, delay);
  timer->async_wait([timer, fn = std::move(fn)](beast::error_code ec) {
    if (!ec) fn();
  });
  return [weak = std::weak_ptr<asio::steady_timer>(timer)] {
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
  impl_->accept_pause.cancel();
  for (auto& w : impl_->sessions)
    if (auto s = w.lock()) s->drain();
}

size_t HttpServer::connections() const { return impl_->stats.open; }

HttpStats HttpServer::stats() const { return impl_->stats; }

}  // namespace tern::net
