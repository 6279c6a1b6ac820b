#include "bench/http_get.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>

#include "core/error.h"

namespace tern::bench {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

std::string authority_of(const Target& target) {
  bool v6 = target.host.find(':') != std::string::npos;
  return cat(v6 ? "[" + target.host + "]" : target.host, ":", target.port);
}

HttpGetResult http_get(const Target& target, const std::string& path, const std::string& accept,
                       double timeout_s) {
  HttpGetResult result;
  asio::io_context io;
  error_code ec;
  auto endpoints = tcp::resolver(io).resolve(target.host, target.port, ec);
  if (ec) {
    result.error = cat("cannot resolve ", target.host, ": ", ec.message());
    return result;
  }

  beast::tcp_stream stream(io);
  http::request<http::empty_body> req{http::verb::get, path, 11};
  req.set(http::field::host, authority_of(target));
  req.set(http::field::accept, accept);
  if (!target.api_key.empty()) req.set(http::field::authorization, "Bearer " + target.api_key);
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  error_code failure;
  const char* stage = "";
  stream.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(timeout_s)));
  auto on_read = [&](error_code e, std::size_t) {
    if (e) failure = e, stage = "reading the answer";
  };
  auto on_write = [&](error_code e, std::size_t) {
    if (e) return void((failure = e, stage = "sending the request"));
    http::async_read(stream, buffer, res, on_read);
  };
  stream.async_connect(endpoints, [&](error_code e, const tcp::endpoint&) {
    if (e) return void((failure = e, stage = "cannot connect"));
    http::async_write(stream, req, on_write);
  });
  io.run();
  if (failure == beast::error::timeout) {
    result.timed_out = true;
    result.error = cat("got no answer within ", timeout_s, " s");
    return result;
  }
  if (failure) {
    result.error = cat(stage, ": ", failure.message());
    return result;
  }
  result.status = static_cast<int>(res.result_int());
  result.body = std::move(res.body());
  return result;
}

}  // namespace tern::bench
