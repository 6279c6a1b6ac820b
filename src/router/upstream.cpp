#include "router/upstream.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <array>
#include <optional>

#include "core/error.h"

namespace tern::router {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

class Call : public UpstreamCall, public std::enable_shared_from_this<Call> {
 public:
  Call(asio::io_context& io, UpstreamRequest r, UpstreamHandlers h)
      : stream_(io), request_(std::move(r)), handlers_(std::move(h)) {}

  void start() {
    error_code ec;
    const auto address = asio::ip::make_address(request_.host, ec);
    if (ec) {
      asio::post(stream_.get_executor(), [self = shared_from_this()] { self->finish(cat("bad server address ", self->request_.host), true); });
      return;
    }
    req_.method_string(request_.method);
    req_.target(request_.target);
    req_.version(11);
    req_.set(http::field::host, cat(request_.host, ":", request_.port));
    req_.set(http::field::user_agent, "tern-route");
    req_.keep_alive(false);
    for (const auto& [k, v] : request_.headers) req_.set(k, v);
    if (request_.method != "GET") {
      req_.body() = std::move(request_.body);
      req_.prepare_payload();
    }
    deadline_ = std::chrono::steady_clock::now() + request_.timeout;
    stream_.expires_after(request_.connect_timeout);
    stream_.async_connect(tcp::endpoint(address, request_.port), [self = shared_from_this()](error_code ec) {
      if (ec) return self->finish(self->describe(ec, "connect"), true);
      self->stream_.socket().set_option(tcp::no_delay(true), ec);
      self->stream_.expires_at(self->deadline_);
      http::async_write(self->stream_, self->req_, [self](error_code ec, size_t) {
        if (ec) return self->finish(self->describe(ec, "send"), false);
        self->read_head();
      });
    });
  }

  void cancel() override {
    if (done_) return;
    done_ = true;
    handlers_ = {};
    error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

 private:
  void read_head() {
    parser_.emplace();
    parser_->body_limit(boost::none);
    http::async_read_header(stream_, buffer_, *parser_, [self = shared_from_this()](error_code ec, size_t) {
      if (ec) return self->finish(self->describe(ec, "response"), false);
      const auto& res = self->parser_->get();
      if (self->handlers_.on_head)
        self->handlers_.on_head(static_cast<int>(res.result_int()), std::string(res[http::field::content_type]));
      if (self->done_) return;
      self->read_body();
    });
  }

  void read_body() {
    if (parser_->is_done()) return finish("", false);
    parser_->get().body().data = piece_.data();
    parser_->get().body().size = piece_.size();
    http::async_read_some(stream_, buffer_, *parser_, [self = shared_from_this()](error_code ec, size_t) {
      if (ec == http::error::need_buffer) ec = {};
      if (ec) return self->finish(self->describe(ec, "response body"), false);
      const size_t n = self->piece_.size() - self->parser_->get().body().size;
      if (n > 0 && self->handlers_.on_body) self->handlers_.on_body(std::string_view(self->piece_.data(), n));
      if (self->done_) return;
      self->read_body();
    });
  }

  std::string describe(const error_code& ec, const char* stage) const {
    if (ec == beast::error::timeout)
      return cat(stage, " to ", request_.host, ":", request_.port, " timed out");
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == http::error::partial_message)
      return cat("the server ", request_.host, ":", request_.port, " closed the connection (", stage, ")");
    return cat(stage, " to ", request_.host, ":", request_.port, ": ", ec.message());
  }

  void finish(const std::string& error, bool connect_failed) {
    if (done_) return;
    done_ = true;
    auto on_end = std::move(handlers_.on_end);
    handlers_ = {};
    error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
    if (on_end) on_end(error, connect_failed);
  }

  beast::tcp_stream stream_;
  UpstreamRequest request_;
  UpstreamHandlers handlers_;
  http::request<http::string_body> req_;
  std::optional<http::response_parser<http::buffer_body>> parser_;
  beast::flat_buffer buffer_;
  std::array<char, 16384> piece_{};
  std::chrono::steady_clock::time_point deadline_;
  bool done_ = false;
};

}  // namespace

std::shared_ptr<UpstreamCall> start_upstream(asio::io_context& io, UpstreamRequest request, UpstreamHandlers handlers) {
  auto call = std::make_shared<Call>(io, std::move(request), std::move(handlers));
  call->start();
  return call;
}

}  // namespace tern::router
