// The HTTP/1.1 layer: Boost.Beast on one Asio thread, keep-alive, body and header limits, header
// read timeout (slow clients are closed), a bounded connection table and request-body budget, checks of
// a request's head before its body is read (authentication), client disconnect detection while a
// request is in flight, chunked responses for server-sent events. Beast lives only in http.cpp; handlers see the plain
// HttpRequest and Exchange below, and every Exchange call happens on the IO thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace boost::asio {
class io_context;
}

namespace tern::net {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpLimits {
  size_t body_limit = size_t{8} << 20;
  size_t header_limit = size_t{16} << 10;
  // A request's head and body must arrive within header_timeout from its first byte; a new connection
  // must send its first byte within it too (a connection that sends nothing is not idle, it is slow).
  std::chrono::milliseconds header_timeout{10000};
  std::chrono::milliseconds idle_timeout{60000};  // keep-alive connection between two requests
  // Open connections. When the table is full, the oldest connection waiting for a request (new or
  // keep-alive) is closed to make room, as nginx does; when every connection is inside a request, the
  // new one is answered 503 and closed. Keep it below the file limit (connections_within()).
  size_t max_connections = 4096;
  // Request bodies held, all connections together: each request over kSmallBody reserves its
  // Content-Length (a chunked one: body_limit) from its head until its response ends; one that does not
  // fit is answered 503 from its head, before any of its body is read. Resident memory for requests is
  // then at most max_buffered + max_connections x (header_limit + kSmallBody).
  size_t max_buffered = size_t{256} << 20;
  static constexpr size_t kSmallBody = size_t{64} << 10;
};

struct HttpRequest {
  std::string method;
  std::string target;  // path and query (an absolute-form target is reduced to them)
  std::string authorization;
  std::string content_type;
  std::string body;
  std::string peer;           // the client's IP address
  std::string forwarded_for;  // X-Forwarded-For, as sent (trusted only from --forwarded-allow-ips)
  // Prefill-decode disaggregation (set by `tern route`): X-Tern-Room (the transfer's room id, hex) and
  // X-Tern-Bootstrap (decode side: the prefill server's bootstrap host:port).
  std::string tern_room, tern_bootstrap;
};

// An answer given from a request's head: the body is never read, the connection closes after it.
struct Refusal {
  int status = 400;
  std::string body;  // JSON
  Headers headers;
};

// Looks at a request's head (HttpRequest without its body) before the body is read: authentication,
// unknown routes, readiness. Returns the refusal, or nothing to read the body and call the handler.
using HeadCheck = std::function<std::optional<Refusal>(const HttpRequest& head)>;

// The process's file limit, raised at startup from the soft to the hard limit.
struct FileLimit {
  uint64_t soft = 0;  // now
  uint64_t hard = 0;
  uint64_t was = 0;   // the soft limit before
};
FileLimit raise_file_limit();
// The connections that fit under the file limit: `reserved` descriptors kept for everything else (model
// files, logs, the transfer listener), and `per_connection` descriptors each (the router opens upstream
// connections for each client one).
size_t connections_within(const FileLimit& f, size_t wanted, size_t per_connection, size_t reserved = 64);

// Counters of the connection table for /metrics.
struct HttpStats {
  size_t open = 0;
  uint64_t evicted_total = 0;   // waiting connections closed to make room for new ones
  uint64_t refused_total = 0;   // new connections answered 503 (table full of requests in progress)
  uint64_t busy_total = 0;      // requests answered 503 from their head (request-body budget spent)
  size_t buffered_bytes = 0;    // reserved for request bodies now
};


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
  HttpServer(const std::string& host, uint16_t port, HttpLimits limits, Handler handler, HeadCheck head_check = nullptr);
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
  HttpStats stats() const;

  struct Impl;  // http.cpp's

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace tern::net
