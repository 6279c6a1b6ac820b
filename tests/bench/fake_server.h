// A small OpenAI-style streaming server on loopback for tests: real sockets, an Asio loop on its own
// thread, and faults on demand. The request's "model" picks the behaviour:
//   ok          stream max_tokens (or max_completion_tokens) content chunks (chunked encoding), usage, [DONE]
//   no-usage    as ok without the usage chunk
//   role-first  a content-less role chunk first (must not count as the first token)
//   http500     HTTP 500 with an OpenAI error body
//   http429     HTTP 429 with an OpenAI error body
//   malformed   a data line that is not JSON
//   error-chunk an {"error": ...} event in the stream
//   stall       headers and one chunk, then silence until the client gives up
//   close       a few chunks, then the connection closes without [DONE]
//   json        HTTP 200 with a plain JSON body instead of a stream
// GET /v1/models lists `models` with `models_status` 200, answers an OpenAI error with any other
// status, and never answers with 0. GET /metrics answers `metrics(requests seen)` when it is set (401
// without "Authorization: Bearer `metrics_key`" when that is set). Any other GET is a 404.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tern::bench::testing {

struct FakeServerOptions {
  std::chrono::microseconds ttft{2000};       // request received -> first content chunk
  std::chrono::microseconds itl{1000};        // between content chunks
  int prompt_tokens = 7;                      // reported in usage
  std::vector<std::string> models{"ok"};      // GET /v1/models
  int models_status = 200;
  std::function<std::string(int requests_seen)> metrics{};  // Prometheus text; unset: GET /metrics is a 404
  std::string metrics_key{};
};

class FakeServer {
 public:
  explicit FakeServer(FakeServerOptions options = {});
  ~FakeServer();
  unsigned short port() const;
  // Steady-clock time at which the first content chunk of the request tagged `user` was written.
  std::map<std::string, std::chrono::steady_clock::time_point> first_chunk_times() const;
  int requests_seen() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tern::bench::testing
