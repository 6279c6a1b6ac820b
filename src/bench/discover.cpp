#include "bench/discover.h"

#include <nlohmann/json.hpp>

#include "bench/http_get.h"
#include "core/error.h"

namespace tern::bench {
namespace {

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
  std::string url = cat("http://", authority_of(target), kPath);
  auto failed = [&](const std::string& why) -> Error {
    return Error(cat("tern bench: no --model given and GET ", url, " ", why, "; give --model NAME"));
  };

  HttpGetResult res = http_get(target, kPath, "application/json", timeout_s);
  if (res.timed_out) throw failed(res.error);
  if (!res.ok()) throw failed(cat("failed: ", res.error));
  if (res.status != 200) throw failed(cat("answered HTTP ", res.status, ": ", error_message(res.body)));

  nlohmann::json j = nlohmann::json::parse(res.body, nullptr, false);
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array())
    throw failed(cat("did not return a model list ({\"data\": [...]}): ", res.body.substr(0, 200)));
  if (j["data"].empty()) throw failed("returned an empty model list (the server serves no model)");
  const auto& first = j["data"][0];
  if (!first.is_object() || !first.contains("id") || !first["id"].is_string())
    throw failed(cat("returned a model entry without a string \"id\": ", first.dump()));
  return first["id"].get<std::string>();
}

}  // namespace tern::bench
