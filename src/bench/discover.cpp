#include "bench/discover.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tern::bench {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

constexpr const char* kPath = "/v1/models";

// The OpenAI error message of a body, else its start.
std::string error_message(const std::string& body) {
  nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message"))
    return j["error"]["message"].dump();
  return body.substr(0, 200);
}

}  // namespace

std::string discover_model(const Target& target, double timeout_s) {
  bool v6 = target.host.find(':') != std::string::npos;
  std::string authority = cat(v6 ? "[" + target.host + "]" : target.host, ":", target.port);
  std::string url = cat("http://", authority, kPath);
  auto failed = [&](const std::string& why) -> Error {
    return Error(cat("tern bench: no --model given and GET ", url, " ", why, "; give --model NAME"));
  };

  asio::io_context io;
  error_code ec;
  auto endpoints = tcp::resolver(io).resolve(target.host, target.port, ec);
  if (ec) throw failed(cat("failed: cannot resolve ", target.host, ": ", ec.message()));

  beast::tcp_stream stream(io);
  http::request<http::empty_body> req{http::verb::get, kPath, 11};
  req.set(http::field::host, authority);
  req.set(http::field::accept, "application/json");
  if (!target.api_key.empty()) req.set(http::field::authorization, "Bearer " + target.api_key);
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  error_code failure;
  const char* stage = "";
  // One deadline for the whole exchange: a server that accepts and never answers cannot hang the run.
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
  if (failure == beast::error::timeout) throw failed(cat("got no answer within ", timeout_s, " s"));
  if (failure) throw failed(cat("failed: ", stage, ": ", failure.message()));
  if (res.result_int() != 200) throw failed(cat("answered HTTP ", res.result_int(), ": ", error_message(res.body())));

  nlohmann::json j = nlohmann::json::parse(res.body(), nullptr, false);
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array())
    throw failed(cat("did not return a model list ({\"data\": [...]}): ", res.body().substr(0, 200)));
  if (j["data"].empty()) throw failed("returned an empty model list (the server serves no model)");
  const auto& first = j["data"][0];
  if (!first.is_object() || !first.contains("id") || !first["id"].is_string())
    throw failed(cat("returned a model entry without a string \"id\": ", first.dump()));
  return first["id"].get<std::string>();
}

}  // namespace tern::bench
