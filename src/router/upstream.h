// One HTTP/1.1 request from the router to a server, on the router's IO thread: connect, send, then the
// response head and its body piece by piece as it arrives (SSE streams are relayed as they come). One
// connection per request (closed at the end), as a client would. Beast lives in upstream.cpp only.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace boost::asio {
class io_context;
}

namespace tern::router {

struct UpstreamRequest {
  std::string host;
  uint16_t port = 0;
  std::string method = "POST";
  std::string target;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::chrono::milliseconds connect_timeout{3000};
  std::chrono::milliseconds timeout{600000};  // the whole exchange
};

struct UpstreamHandlers {
  std::function<void(int status, const std::string& content_type)> on_head;
  std::function<void(std::string_view bytes)> on_body;  // decoded (chunked framing removed)
  // Called once at the end: "" when the whole response arrived, else why not. `connect_failed`: the
  // server could not be reached at all (refused, unreachable, connect timeout).
  std::function<void(const std::string& error, bool connect_failed)> on_end;
};

class UpstreamCall {
 public:
  virtual ~UpstreamCall() = default;
  // Closes the connection; on_end is not called afterwards.
  virtual void cancel() = 0;
};

std::shared_ptr<UpstreamCall> start_upstream(boost::asio::io_context& io, UpstreamRequest request,
                                             UpstreamHandlers handlers);

}  // namespace tern::router
