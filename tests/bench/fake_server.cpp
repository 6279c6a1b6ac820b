#include "fake_server.h"

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>
#include <thread>

namespace tern::bench::testing {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using asio::awaitable;
using asio::use_awaitable;
using Clock = std::chrono::steady_clock;

struct FakeServer::Impl {
  FakeServerOptions options;
  asio::io_context io{1};
  tcp::acceptor acceptor{io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)};
  std::thread thread;
  mutable std::mutex mutex;
  std::map<std::string, Clock::time_point> first_chunk;
  int seen = 0;

  awaitable<void> accept_loop() {
    for (;;) {
      tcp::socket s = co_await acceptor.async_accept(use_awaitable);
      asio::co_spawn(io, session(std::move(s)), asio::detached);
    }
  }

  static std::string http_chunk(const std::string& data) {
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    return size + data + "\r\n";
  }

  static std::string event(const nlohmann::json& j) { return http_chunk("data: " + j.dump() + "\n\n"); }

  static nlohmann::json content_chunk(const std::string& text) {
    return {{"object", "chat.completion.chunk"}, {"choices", {{{"index", 0}, {"delta", {{"content", text}}}}}}};
  }

  awaitable<void> write(tcp::socket& s, const std::string& data) {
    co_await asio::async_write(s, asio::buffer(data), use_awaitable);
  }

  awaitable<void> sleep(std::chrono::microseconds d) {
    asio::steady_timer t(io, d);
    co_await t.async_wait(use_awaitable);
  }

  static std::string simple_response(int status, const std::string& type, const std::string& body) {
    return "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Type: " + type +
           "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  }

  awaitable<nlohmann::json> read_request(tcp::socket& s, std::string& request_line, std::string& headers) {
    std::string buf;
    std::size_t head = co_await asio::async_read_until(s, asio::dynamic_buffer(buf), "\r\n\r\n", use_awaitable);
    request_line = buf.substr(0, buf.find("\r\n"));
    headers = buf.substr(0, head);
    std::size_t at = buf.find("Content-Length: ");
    std::size_t length = at == std::string::npos ? 0 : std::stoul(buf.substr(at + 16));
    if (buf.size() < head + length)
      co_await asio::async_read(s, asio::dynamic_buffer(buf), asio::transfer_exactly(head + length - buf.size()),
                                use_awaitable);
    co_return nlohmann::json::parse(buf.substr(head, length), nullptr, false);
  }

  // Every event is built before co_await: GCC 12 miscompiles brace-initialised JSON inside co_await.
  awaitable<void> stream(tcp::socket& s, const nlohmann::json& req, const std::string& mode) {
    co_await write(s, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n");
    int n = req.value("max_tokens", req.value("max_completion_tokens", 16));
    if (mode == "role-first") {
      std::string role = event(nlohmann::json::parse(R"({"choices":[{"delta":{"role":"assistant"}}]})"));
      co_await write(s, role);
    }
    co_await sleep(options.ttft);
    if (mode == "malformed") co_return co_await write(s, http_chunk("data: {not json\n\n"));
    if (mode == "error-chunk") {
      std::string err = event(nlohmann::json::parse(R"({"error":{"message":"engine died"}})"));
      co_return co_await write(s, err);
    }
    for (int i = 0; i < n; ++i) {
      if (i > 0) co_await sleep(options.itl);
      std::string chunk = event(content_chunk(" tok" + std::to_string(i)));
      if (i == 0) {
        std::lock_guard lock(mutex);
        first_chunk[req.value("user", "")] = Clock::now();
      }
      co_await write(s, chunk);
      if (mode == "stall") co_await sleep(std::chrono::hours(1));
      if (mode == "close" && i == 2) co_return;
    }
    if (mode != "no-usage") co_await write(s, usage_event(n));
    co_await write(s, http_chunk("data: [DONE]\n\n") + "0\r\n\r\n");
  }

  std::string usage_event(int n) const {
    nlohmann::json usage = {{"prompt_tokens", options.prompt_tokens}, {"completion_tokens", n}};
    nlohmann::json j = {{"choices", nlohmann::json::array()}, {"usage", usage}};
    return event(j);
  }

  std::string models_response() const {
    nlohmann::json list = {{"object", "list"}, {"data", nlohmann::json::array()}};
    for (const auto& m : options.models) list["data"].push_back({{"id", m}, {"object", "model"}});
    std::string error = R"({"error":{"message":"no models for you","type":"auth","param":null,"code":401}})";
    return simple_response(options.models_status, "application/json",
                           options.models_status == 200 ? list.dump() : error);
  }

  std::string metrics_response(const std::string& headers) const {
    std::string wanted = "Authorization: Bearer " + options.metrics_key + "\r\n";
    if (!options.metrics_key.empty() && headers.find(wanted) == std::string::npos)
      return simple_response(401, "text/plain", "no key");
    std::lock_guard lock(mutex);
    return simple_response(200, "text/plain; version=0.0.4", options.metrics(seen));
  }

  awaitable<void> session(tcp::socket s) {
    try {
      std::string request_line, headers;
      nlohmann::json req = co_await read_request(s, request_line, headers);
      if (request_line.rfind("GET /metrics ", 0) == 0 && options.metrics)
        co_return co_await write(s, metrics_response(headers));
      bool models_request = request_line.rfind("GET /v1/models ", 0) == 0;
      if (!models_request && request_line.rfind("POST ", 0) != 0) {
        std::string missing = R"({"error":{"message":"not found","type":"not_found","param":null,"code":404}})";
        co_return co_await write(s, simple_response(404, "application/json", missing));
      }
      if (models_request && options.models_status == 0) co_return co_await sleep(std::chrono::hours(1));
      if (models_request) co_return co_await write(s, models_response());
      {
        std::lock_guard lock(mutex);
        ++seen;
      }
      std::string mode = req.is_object() ? req.value("model", "ok") : "ok";
      std::string error = R"({"error":{"message":"boom","type":"internal","param":null,"code":500}})";
      if (mode == "http500") co_return co_await write(s, simple_response(500, "application/json", error));
      if (mode == "http429") co_return co_await write(s, simple_response(429, "application/json", error));
      if (mode == "json") co_return co_await write(s, simple_response(200, "application/json", "{}"));
      co_await stream(s, req, mode);
    } catch (const std::exception&) {
      // The client went away (it timed out or finished): nothing to do.
    }
  }
};

FakeServer::FakeServer(FakeServerOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
  impl_->acceptor.listen(4096);
  asio::co_spawn(impl_->io, impl_->accept_loop(), asio::detached);
  impl_->thread = std::thread([this] { impl_->io.run(); });
}

FakeServer::~FakeServer() {
  impl_->io.stop();
  impl_->thread.join();
}

unsigned short FakeServer::port() const { return impl_->acceptor.local_endpoint().port(); }

std::map<std::string, Clock::time_point> FakeServer::first_chunk_times() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->first_chunk;
}

int FakeServer::requests_seen() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->seen;
}

}  // namespace tern::bench::testing
