// The HTTP/1.1 layer: Boost.Beast on one Asio thread, keep-alive, body and header limits, header
// read timeout (slow clients are closed), client disconnect detection while a request is in flight,
// chunked responses for server-sent events. Beast lives only in http.cpp; handlers see the plain
// HttpRequest and Exchange below, and every Exchange call happens on the IO thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace boost::asio {
class io_context;
}

namespace tern::server {

struct HttpLimits {
  size_t body_limit = size_t{8} << 20;
  size_t header_limit = size_t{16} << 10;
  std::chrono::milliseconds header_timeout{10000};  // to receive a whole request once it started
  std::chrono::milliseconds idle_timeout{60000};    // keep-alive connection with no request
  size_t max_connections = 4096;
};

struct HttpRequest {
  std::string method;
  std::string target;  // path and query
  std::string authorization;
  std::string content_type;
  std::string body;
  // Prefill-decode disaggregation (set by `tern route`): X-Tern-Room (the transfer's room id, hex) and
  // X-Tern-Bootstrap (decode side: the prefill server's bootstrap host:port).
  std::string tern_room, tern_bootstrap;
};

using Headers = std::vector<std::pair<std::string, std::string>>;

// One request's response, kept by the handler until it has answered.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual void reply(int status, const std::string& content_type, std::string body, const Headers& headers = {}) = 0;
  virtual void begin_stream() = 0;           // 200, text/event-stream, chunked
  virtual void send(std::string data) = 0;   // one chunk of the stream
  virtual void end_stream() = 0;
  virtual bool client_gone() const = 0;
  // Called once (on the IO thread) when the client disconnects before the response is complete.
  virtual void on_client_gone(std::function<void()> callback) = 0;
};

using Handler = std::function<void(HttpRequest&&, std::shared_ptr<Exchange>)>;

class HttpServer {
 public:
  // Binds and listens (throws tern::Error saying why, e.g. the port is in use); accepting starts
  // with run().
  HttpServer(const std::string& host, uint16_t port, HttpLimits limits, Handler handler);
  ~HttpServer();
  uint16_t port() const;
  std::string address() const;  // "http://host:port"

  void run();  // serves on the calling thread until stop()
  void stop();
  // Thread-safe: runs fn on the IO thread.
  void post(std::function<void()> fn);
  // The IO thread's context, for other asynchronous work on the same thread (transfers, the router's
  // upstream connections).
  boost::asio::io_context& io_context();
  // Runs fn on the IO thread after `delay`; the returned function (called on the IO thread) cancels it.
  std::function<void()> schedule(std::chrono::milliseconds delay, std::function<void()> fn);
  // SIGTERM / SIGINT handler, called on the IO thread.
  void on_signal(std::function<void(int)> fn);
  // Closes the listening socket and idle keep-alive connections; in-flight requests finish and then
  // their connections close.
  void stop_accepting();
  size_t connections() const;

  struct Impl;  // http.cpp's

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace tern::server
